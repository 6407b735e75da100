//! Background services: node health/state polling, the fleet clock (time-driven state),
//! capacity-learner persistence, first measurements, pre-warm, rebalance, auto-pull, start-up settling.

pub mod autopull;
pub mod clock;
pub mod health;
pub mod learning;
pub mod measure;
pub mod node_api;
pub mod ops;
pub mod prewarm;
pub mod rebalance;
pub mod reload;
pub mod settle;
pub mod shutdown;

/// Milliseconds since the Unix epoch: the clock every `*_ms` timestamp in fleet state uses.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Routing's ranking for `model` with node `idx` left out: the runner-up to a busy node (the
/// pre-warm target, the rebalance destinations).
pub fn decide_elsewhere(
    fleet: &crate::fleet::Fleet,
    view: &crate::routing::FleetView,
    idx: usize,
    model: &str,
) -> crate::routing::Decision {
    let req = crate::routing::RouteRequest {
        models: vec![model.to_string()],
        tried: vec![view.nodes[idx].id.clone()],
        ..Default::default()
    };
    crate::routing::decide(&req, view, &fleet.config().routing.policy, fleet, now_ms())
}

/// Routing's decision for one request of `model` with nothing excluded: the busy node's own
/// prediction (completion-mode pre-warm and rebalance compare against it).
pub fn decide_model(
    fleet: &crate::fleet::Fleet,
    view: &crate::routing::FleetView,
    model: &str,
) -> crate::routing::Decision {
    let req = crate::routing::RouteRequest {
        models: vec![model.to_string()],
        ..Default::default()
    };
    crate::routing::decide(&req, view, &fleet.config().routing.policy, fleet, now_ms())
}

/// The completion-mode prediction for node `idx` in a single-model decision.
pub fn prediction_of(
    d: &crate::routing::Decision,
    idx: usize,
) -> Option<crate::routing::Prediction> {
    prediction_of_model(d, idx, 0)
}

/// The completion-mode prediction for node `idx` and the request's model at `pos`.
pub fn prediction_of_model(
    d: &crate::routing::Decision,
    idx: usize,
    pos: usize,
) -> Option<crate::routing::Prediction> {
    d.table.iter().find_map(|row| match row.verdict {
        crate::routing::Verdict::Predicted { prediction }
            if row.node == idx && row.model == pos =>
        {
            Some(prediction)
        }
        _ => None,
    })
}

/// Completion mode: how often pre-warm and rebalance look, following observed model load
/// times. A quarter of the shortest cold load seen on any pair (a deep queue is noticed well
/// before a load would have finished), between 500 ms and the configured interval.
pub fn completion_period(fleet: &crate::fleet::Fleet, configured_ms: u64) -> std::time::Duration {
    use crate::routing::Loads;
    let mut shortest = f64::INFINITY;
    let view = fleet.view();
    for (idx, node) in view.nodes.iter().enumerate() {
        for m in &node.models {
            if let Some(l) = fleet.rates(idx, &m.name).load_s {
                shortest = shortest.min(l);
            }
        }
    }
    let ms = if shortest.is_finite() {
        ((shortest * 1000.0 / 4.0) as u64).clamp(500, configured_ms.max(500))
    } else {
        configured_ms
    };
    std::time::Duration::from_millis(ms)
}
