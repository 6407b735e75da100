//! Pure routing decisions: Stage 1 elimination and Stage 2 scoring. No I/O, no clocks.

mod policy;
mod types;

pub use policy::Policy;
pub use types::*;

/// Decide where `req` goes in `fleet` given the live `loads`, at time `now_ms`.
///
/// Walking-gateway version: eliminates nodes that cannot serve (offline, model absent,
/// protocol, pin, tried) and ranks the rest by in-flight/seats (lowest first).
pub fn decide(
    req: &RouteRequest,
    fleet: &FleetView,
    policy: &Policy,
    loads: &dyn Loads,
    _now_ms: u64,
) -> Decision {
    let _ = policy;
    let mut table = Vec::new();
    let mut ranked = Vec::new();
    let mut model_known = false;
    for (idx, node) in fleet.nodes.iter().enumerate() {
        for (pos, model) in req.models.iter().enumerate() {
            let reason = eliminate(req, node, model);
            if node.model(model).is_some() {
                model_known = true;
            }
            match reason {
                Some(reason) => table.push(Row {
                    node: node.id.clone(),
                    model: model.clone(),
                    verdict: Verdict::Eliminated { reason },
                }),
                None => {
                    let load = loads.node_in_flight(idx) as f64 / node.seats.max(1) as f64;
                    let signals = Signals {
                        load: -load,
                        ..Signals::default()
                    };
                    let total = signals.total();
                    table.push(Row {
                        node: node.id.clone(),
                        model: model.clone(),
                        verdict: Verdict::Scored { signals, total },
                    });
                    let cold = !node.model(model).is_some_and(|m| m.loaded);
                    ranked.push(Choice {
                        node: idx,
                        node_id: node.id.clone(),
                        model: model.clone(),
                        score: total,
                        fallback: pos > 0,
                        cold,
                    });
                }
            }
        }
    }
    ranked.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.node.cmp(&b.node)));
    let no_route = if !ranked.is_empty() {
        None
    } else if req.pin.is_some() {
        Some(NoRoute::PinUnavailable)
    } else if !model_known {
        Some(NoRoute::ModelNotFound)
    } else {
        Some(NoRoute::NoProvider)
    };
    Decision {
        ranked,
        no_route,
        affinity: AffinityKind::None,
        table,
    }
}

fn eliminate(req: &RouteRequest, node: &NodeView, model: &str) -> Option<Reason> {
    if let Some(pin) = &req.pin {
        if pin != &node.id {
            return Some(Reason::PinnedElsewhere);
        }
    }
    if req.tried.iter().any(|t| t == &node.id) {
        return Some(Reason::Tried);
    }
    match node.health {
        Health::Online => {}
        Health::Offline => return Some(Reason::Offline),
        Health::Warmup => return Some(Reason::Warmup),
        Health::Draining => return Some(Reason::Draining),
        Health::Paused => return Some(Reason::Paused),
    }
    if let Some(family) = req.family {
        if !node.families.contains(&family) {
            return Some(Reason::Protocol);
        }
    }
    if node.model(model).is_none() {
        return Some(Reason::ModelAbsent);
    }
    None
}
