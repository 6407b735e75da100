//! Stage 1: binary elimination of (node, candidate model) pairs, one reason code each.
//!
//! Node-level checks run once per node ([`node_reason`]), model-level checks once per pair
//! ([`model_reason`]). The provisional pool cap needs the whole fleet and is applied by
//! `decide` after the first pass.

use super::policy::Policy;
use super::types::{Health, ModelView, NodeView, Pressure, Reason, RouteRequest, Tier};

/// Why `node` cannot serve `req` whatever the model, checked in the order of the explain
/// table: hints first (pin, tried), then health, then hardware, then capacity.
pub(super) fn node_reason(
    req: &RouteRequest,
    node: &NodeView,
    policy: &Policy,
    node_in_flight: u32,
) -> Option<Reason> {
    if req.pin.as_ref().is_some_and(|pin| *pin != node.id) {
        return Some(Reason::PinnedElsewhere);
    }
    if req.tried.contains(&node.id) {
        return Some(Reason::Tried);
    }
    match node.health {
        Health::Online => {}
        Health::Offline => return Some(Reason::Offline),
        Health::Draining => return Some(Reason::Draining),
        Health::Paused => return Some(Reason::Paused),
        Health::Warmup => return Some(Reason::Warmup),
    }
    if node.breaker_open {
        return Some(Reason::BreakerOpen);
    }
    if node.thermal_throttled {
        return Some(Reason::Thermal);
    }
    if node.pressure == Pressure::Critical {
        return Some(Reason::MemoryPressure);
    }
    if let Some(learning) = &node.learning {
        if learning.cpu_high_for_s >= policy.learning_cpu_high_s {
            return Some(Reason::CpuHigh);
        }
        if below(learning.availability, policy.learning_min_availability) {
            return Some(Reason::LowAvailability);
        }
        if below(learning.days_observed, policy.learning_min_days) {
            return Some(Reason::Learning);
        }
    }
    if !speaks(req, node) && !req.translatable.iter().any(|f| node.families.contains(f)) {
        return Some(Reason::Protocol);
    }
    if !req.required_tags.iter().all(|t| node.tags.contains(t)) {
        return Some(Reason::Capability);
    }
    // hard_cap 0 means "not configured": no cap.
    if node.hard_cap > 0 && node_in_flight >= node.hard_cap.max(node.seats) {
        return Some(Reason::HardCap);
    }
    None
}

/// The node speaks the request's protocol natively (no translation needed).
pub(super) fn speaks(req: &RouteRequest, node: &NodeView) -> bool {
    req.family.is_none_or(|f| node.families.contains(&f))
}

/// `value < min`, and a NaN is below everything (bad telemetry never passes a threshold).
fn below(value: f64, min: f64) -> bool {
    value.is_nan() || value < min
}

/// Tokens the request needs on `node` (spec 003): prompt + output reserve + node overhead.
pub(super) fn needed_tokens(req: &RouteRequest, node: &NodeView) -> u64 {
    u64::from(req.prompt_tokens)
        + u64::from(req.max_output_tokens.unwrap_or(node.output_reserve))
        + u64::from(node.overhead_tokens)
}

/// Whether the largest window the node can give the model fits `needed` (0: unknown, fits).
pub(super) fn window_fits(model: &ModelView, needed: u64) -> bool {
    model.max_context == 0 || needed <= u64::from(model.max_context)
}

/// Memory available for a model on `node`, GB: free RAM (else total minus what its loaded
/// models hold), capped by the capacity learner's ceiling. A node whose memory is unknown
/// (no `memory_gb`, no agent report) is not held to a fit it cannot be judged on.
pub(super) fn available_gb(node: &NodeView) -> f64 {
    available_with(node, 0.0, model_gb)
}

/// Completion mode: the memory a cold load gets once the backend evicts idle models (Ollama
/// unloads the least recently used idle model to make room): [`available_gb`] plus what the
/// loaded models with no request running or waiting (`busy` false) hold.
pub(super) fn available_gb_evicting(node: &NodeView, busy: impl Fn(&str) -> bool) -> f64 {
    let idle: f64 = node
        .models
        .iter()
        .filter(|m| m.loaded && !busy(&m.name))
        .map(model_gb)
        .sum();
    available_with(node, idle, model_gb)
}

/// Free memory plus `evictable_gb`, capped as [`available_gb`]: the node's reported free
/// memory, else its total less what each loaded model holds (`held`).
pub(super) fn available_with(
    node: &NodeView,
    evictable_gb: f64,
    held: impl Fn(&ModelView) -> f64,
) -> f64 {
    if node.free_memory_gb.is_none() && node.memory_gb <= 0.0 && node.learning.is_none() {
        return f64::INFINITY;
    }
    let free = evictable_gb
        + node.free_memory_gb.unwrap_or_else(|| {
            let held: f64 = node.models.iter().filter(|m| m.loaded).map(held).sum();
            node.memory_gb - held
        });
    let ceiling = node
        .learning
        .as_ref()
        .and_then(|l| l.ceiling_gb)
        .unwrap_or(f64::INFINITY);
    free.min(ceiling).max(0.0)
}

/// Memory the model takes: measured resident size when seen loaded, else its weights.
pub(super) fn model_gb(model: &ModelView) -> f64 {
    model.resident_gb.unwrap_or(model.size_gb)
}

/// Spec 000 fit ratio; a loaded model always fits (infinite ratio).
pub(super) fn fit_ratio(model: &ModelView, available_gb: f64) -> f64 {
    ratio_of(model, available_gb, model_gb(model))
}

/// `available_gb` over the `gb` the model takes; infinite when it is loaded.
fn ratio_of(model: &ModelView, available_gb: f64, gb: f64) -> f64 {
    if model.loaded || gb <= 0.0 {
        f64::INFINITY
    } else {
        available_gb / gb
    }
}

/// Why this model cannot run on this (otherwise eligible) node; else its fit ratio.
/// `grown`: a model not yet loaded is fitted at what it will hold, its weights grown as much
/// as the node's loaded models hold over theirs (`evict::held_gb`; completion mode), not at
/// its weights.
pub(super) fn model_reason(
    req: &RouteRequest,
    policy: &Policy,
    node: &NodeView,
    model: &ModelView,
    needed: u64,
    available_gb: f64,
    grown: bool,
) -> Result<f64, Reason> {
    let warm_required =
        req.require_warm || (policy.require_warm_provisional && node.tier == Tier::Provisional);
    if model.breaker_open {
        return Err(Reason::BreakerOpen);
    }
    if req.endpoint.is_some_and(|e| model.not_capable.contains(&e)) {
        return Err(Reason::NotCapable);
    }
    if warm_required && !model.loaded {
        return Err(Reason::NotWarm);
    }
    if !window_fits(model, needed) {
        return Err(Reason::Context);
    }
    let ratio = match grown && !model.loaded {
        true => {
            let gb = super::evict::held_gb(model, super::evict::growth(node));
            ratio_of(model, available_gb, gb)
        }
        false => fit_ratio(model, available_gb),
    };
    if below(ratio, 1.0) {
        return Err(Reason::MemoryFit);
    }
    Ok(ratio)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::types::Learning;

    fn node() -> NodeView {
        NodeView {
            id: "n".into(),
            seats: 1,
            memory_gb: 64.0,
            ..NodeView::default()
        }
    }

    #[test]
    fn node_reasons_table() {
        let p = Policy::default();
        let req = RouteRequest::default();
        let learning = |cpu, avail, days| {
            Some(Learning {
                availability: avail,
                ceiling_gb: None,
                cpu_high_for_s: cpu,
                days_observed: days,
            })
        };
        let cases: Vec<(NodeView, u32, Option<Reason>)> = vec![
            (node(), 0, None),
            (
                NodeView {
                    health: Health::Offline,
                    ..node()
                },
                0,
                Some(Reason::Offline),
            ),
            (
                NodeView {
                    health: Health::Draining,
                    ..node()
                },
                0,
                Some(Reason::Draining),
            ),
            (
                NodeView {
                    health: Health::Paused,
                    ..node()
                },
                0,
                Some(Reason::Paused),
            ),
            (
                NodeView {
                    health: Health::Warmup,
                    ..node()
                },
                0,
                Some(Reason::Warmup),
            ),
            (
                NodeView {
                    breaker_open: true,
                    ..node()
                },
                0,
                Some(Reason::BreakerOpen),
            ),
            (
                NodeView {
                    thermal_throttled: true,
                    ..node()
                },
                0,
                Some(Reason::Thermal),
            ),
            (
                NodeView {
                    pressure: Pressure::Warn,
                    ..node()
                },
                0,
                None,
            ),
            (
                NodeView {
                    pressure: Pressure::Critical,
                    ..node()
                },
                0,
                Some(Reason::MemoryPressure),
            ),
            (
                NodeView {
                    learning: learning(119, 0.5, 7.0),
                    ..node()
                },
                0,
                None,
            ),
            (
                NodeView {
                    learning: learning(120, 0.5, 9.0),
                    ..node()
                },
                0,
                Some(Reason::CpuHigh),
            ),
            (
                NodeView {
                    learning: learning(0, 0.19, 9.0),
                    ..node()
                },
                0,
                Some(Reason::LowAvailability),
            ),
            (
                NodeView {
                    learning: learning(0, 0.20, 9.0),
                    ..node()
                },
                0,
                None,
            ),
            (
                NodeView {
                    learning: learning(0, 0.9, 6.9),
                    ..node()
                },
                0,
                Some(Reason::Learning),
            ),
            (
                NodeView {
                    hard_cap: 4,
                    seats: 2,
                    ..node()
                },
                3,
                None,
            ),
            (
                NodeView {
                    hard_cap: 4,
                    seats: 2,
                    ..node()
                },
                4,
                Some(Reason::HardCap),
            ),
            (
                NodeView {
                    hard_cap: 0,
                    ..node()
                },
                1000,
                None,
            ),
        ];
        for (i, (n, in_flight, want)) in cases.into_iter().enumerate() {
            assert_eq!(node_reason(&req, &n, &p, in_flight), want, "case {i}");
        }
    }

    #[test]
    fn open_model_breaker_eliminates_only_that_model() {
        let p = Policy::default();
        let req = RouteRequest::default();
        let n = node();
        let ok = ModelView {
            name: "a".into(),
            size_gb: 1.0,
            loaded: true,
            ..ModelView::default()
        };
        let broken = ModelView {
            breaker_open: true,
            ..ok.clone()
        };
        assert!(model_reason(&req, &p, &n, &ok, 0, 64.0, false).is_ok());
        assert_eq!(
            model_reason(&req, &p, &n, &broken, 0, 64.0, false),
            Err(Reason::BreakerOpen)
        );
    }

    #[test]
    fn hints_protocol_and_tags() {
        let p = Policy::default();
        let n = NodeView {
            tags: vec!["vision".into()],
            families: vec![crate::routing::Family::Ollama],
            ..node()
        };
        let pinned = RouteRequest {
            pin: Some("other".into()),
            ..Default::default()
        };
        assert_eq!(
            node_reason(&pinned, &n, &p, 0),
            Some(Reason::PinnedElsewhere)
        );
        let tried = RouteRequest {
            tried: vec!["n".into()],
            ..Default::default()
        };
        assert_eq!(node_reason(&tried, &n, &p, 0), Some(Reason::Tried));
        let openai = RouteRequest {
            family: Some(crate::routing::Family::OpenAI),
            ..Default::default()
        };
        assert_eq!(node_reason(&openai, &n, &p, 0), Some(Reason::Protocol));
        let tags = RouteRequest {
            required_tags: vec!["vision".into()],
            ..Default::default()
        };
        assert_eq!(node_reason(&tags, &n, &p, 0), None);
        let tags = RouteRequest {
            required_tags: vec!["tools".into()],
            ..Default::default()
        };
        assert_eq!(node_reason(&tags, &n, &p, 0), Some(Reason::Capability));
    }

    #[test]
    fn context_is_prompt_plus_reserve_plus_overhead() {
        // Spec 003's small card: 49k window, 8k reserve, 19k overhead.
        let n = NodeView {
            output_reserve: 8_192,
            overhead_tokens: 19_000,
            ..node()
        };
        let m = ModelView {
            max_context: 49_152,
            on_disk: true,
            size_gb: 1.0,
            ..Default::default()
        };
        let p = Policy::default();
        let fits = RouteRequest {
            prompt_tokens: 21_960,
            ..Default::default()
        };
        assert_eq!(needed_tokens(&fits, &n), 49_152);
        assert!(model_reason(&fits, &p, &n, &m, needed_tokens(&fits, &n), 64.0, false).is_ok());
        let over = RouteRequest {
            prompt_tokens: 21_961,
            ..Default::default()
        };
        assert_eq!(
            model_reason(&over, &p, &n, &m, needed_tokens(&over, &n), 64.0, false),
            Err(Reason::Context)
        );
        // max_tokens replaces the node's reserve.
        let small_out = RouteRequest {
            prompt_tokens: 21_961,
            max_output_tokens: Some(1_000),
            ..Default::default()
        };
        assert!(model_reason(
            &small_out,
            &p,
            &n,
            &m,
            needed_tokens(&small_out, &n),
            64.0,
            false
        )
        .is_ok());
    }

    #[test]
    fn memory_fit_and_warm_requirements() {
        let p = Policy::default();
        let req = RouteRequest::default();
        let n = node();
        let cold = ModelView {
            size_gb: 10.0,
            on_disk: true,
            ..Default::default()
        };
        assert_eq!(
            model_reason(&req, &p, &n, &cold, 0, 9.9, false),
            Err(Reason::MemoryFit)
        );
        assert_eq!(model_reason(&req, &p, &n, &cold, 0, 10.0, false), Ok(1.0));
        let seen = ModelView {
            resident_gb: Some(20.0),
            ..cold.clone()
        };
        assert_eq!(
            model_reason(&req, &p, &n, &seen, 0, 15.0, false),
            Err(Reason::MemoryFit)
        );
        let loaded = ModelView {
            loaded: true,
            ..cold.clone()
        };
        assert!(model_reason(&req, &p, &n, &loaded, 0, 0.0, false).is_ok());
        let warm = RouteRequest {
            require_warm: true,
            ..Default::default()
        };
        assert_eq!(
            model_reason(&warm, &p, &n, &cold, 0, 64.0, false),
            Err(Reason::NotWarm)
        );
        assert!(model_reason(&warm, &p, &n, &loaded, 0, 64.0, false).is_ok());
        let tiered = Policy {
            require_warm_provisional: true,
            ..Policy::default()
        };
        let prov = NodeView {
            tier: Tier::Provisional,
            ..node()
        };
        assert_eq!(
            model_reason(&req, &tiered, &prov, &cold, 0, 64.0, false),
            Err(Reason::NotWarm)
        );
        assert!(model_reason(&req, &tiered, &n, &cold, 0, 64.0, false).is_ok());
    }

    #[test]
    fn unknown_memory_is_not_a_reason_to_eliminate() {
        let mut n = node();
        n.memory_gb = 0.0;
        n.free_memory_gb = None;
        assert_eq!(available_gb(&n), f64::INFINITY);
        n.free_memory_gb = Some(3.0);
        assert_eq!(available_gb(&n), 3.0, "a reported figure always counts");
    }

    #[test]
    fn available_memory() {
        let mut n = node();
        n.free_memory_gb = Some(40.0);
        assert_eq!(available_gb(&n), 40.0);
        n.learning = Some(Learning {
            ceiling_gb: Some(16.0),
            ..Learning::default()
        });
        assert_eq!(available_gb(&n), 16.0);
        let mut n = node();
        n.models = vec![
            ModelView {
                loaded: true,
                size_gb: 10.0,
                resident_gb: Some(14.0),
                ..Default::default()
            },
            ModelView {
                loaded: false,
                size_gb: 30.0,
                ..Default::default()
            },
        ];
        assert_eq!(available_gb(&n), 50.0);
    }
}
