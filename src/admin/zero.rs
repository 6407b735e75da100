//! Zero-valued series from the first scrape: every counter and histogram family exists for
//! every node in the fleet and every model a node reports (config or polls), so a dashboard
//! shows 0, not "No data", until the first event. Each node and node:model is primed once.

use std::collections::HashSet;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use crate::metrics::METRICS;
use crate::protocol::{Endpoint, ErrorCode};
use crate::routing::{FleetView, Reason};

/// Keys already primed: (node, "-") for a node, (node, model) for a node:model.
static PRIMED: Lazy<Mutex<HashSet<(String, String)>>> = Lazy::new(Default::default);

/// Breaker states a transition can go to (`fleet::state` labels).
const BREAKER_TO: [&str; 3] = ["closed", "open", "half_open"];
/// Decision kinds `metrics::record_decision` counts.
const DECISION_KINDS: [&str; 7] = [
    "direct",
    "fallback",
    "cold_load",
    "pin",
    "affinity_matched",
    "affinity_spilled",
    "affinity_new",
];
/// Rebalance moves are labelled by (from, to, model): pairs are primed only among at most this
/// many nodes holding a model, so the series count stays bounded on a large fleet.
const REBALANCE_PAIR_NODES: usize = 32;

/// Create, at zero, the series of every family for each node and node:model in `view` not
/// primed before, and the fleet-wide label sets (reasons, kinds, error codes) once.
pub fn prime(view: &FleetView) {
    let mut primed = PRIMED.lock();
    if primed.insert(("-".into(), "-".into())) {
        prime_fleet_wide();
    }
    for (i, n) in view.nodes.iter().enumerate() {
        let id = n.id.as_str();
        if primed.insert((id.to_string(), "-".into())) {
            prime_node(id, n.learning.is_some());
        }
        for m in &n.models {
            if !primed.insert((id.to_string(), m.name.clone())) {
                continue;
            }
            prime_model(id, &m.name);
            let peers: Vec<&str> = view
                .nodes
                .iter()
                .enumerate()
                .filter(|(j, p)| *j != i && p.model(&m.name).is_some())
                .map(|(_, p)| p.id.as_str())
                .collect();
            if peers.len() < REBALANCE_PAIR_NODES {
                for peer in peers {
                    for (from, to) in [(id, peer), (peer, id)] {
                        METRICS
                            .rebalance_moves
                            .with_label_values(&[from, to, &m.name]);
                    }
                }
            }
        }
    }
}

fn prime_fleet_wide() {
    for reason in Reason::ALL {
        METRICS.eliminations.with_label_values(&[reason.as_str()]);
    }
    for kind in DECISION_KINDS {
        METRICS.decisions.with_label_values(&[kind]);
    }
    for ep in Endpoint::ALL {
        for code in ErrorCode::ALL {
            METRICS
                .errors
                .with_label_values(&[ep.label(), code.as_str()]);
        }
    }
    for result in ["unauthorized", "unknown", "invalid"] {
        METRICS.heartbeats.with_label_values(&["-", result]);
    }
}

fn prime_node(id: &str, learning: bool) {
    METRICS.retries.with_label_values(&[id]);
    METRICS.heartbeats.with_label_values(&[id, "ok"]);
    for outcome in ["ok", "failed"] {
        METRICS.pulls.with_label_values(&[id, outcome]);
    }
    METRICS.breaker_state.with_label_values(&[id, "-"]);
    for to in BREAKER_TO {
        METRICS
            .breaker_transitions
            .with_label_values(&[id, "-", to]);
    }
    if learning {
        METRICS.node_availability.with_label_values(&[id]);
    }
}

fn prime_model(id: &str, model: &str) {
    let nm = [id, model];
    for ep in Endpoint::ALL {
        METRICS
            .requests
            .with_label_values(&[id, model, ep.label(), "200"]);
    }
    METRICS.duration.with_label_values(&nm);
    METRICS.ttft.with_label_values(&nm);
    METRICS.tpot.with_label_values(&nm);
    METRICS.queue_wait.with_label_values(&nm);
    METRICS.in_flight.with_label_values(&nm);
    METRICS.pending.with_label_values(&nm);
    METRICS.model_loaded.with_label_values(&nm);
    METRICS.queue_aborts.with_label_values(&nm);
    METRICS.queue_timeouts.with_label_values(&nm);
    METRICS.prewarms.with_label_values(&nm);
    METRICS.evictions.with_label_values(&nm);
    for outcome in crate::services::measure::OUTCOMES {
        METRICS
            .measurements
            .with_label_values(&[id, model, outcome]);
    }
    METRICS.breaker_state.with_label_values(&nm);
    for to in BREAKER_TO {
        METRICS
            .breaker_transitions
            .with_label_values(&[id, model, to]);
    }
    for direction in ["in", "out"] {
        METRICS.tokens.with_label_values(&[id, model, direction]);
    }
}
