//! `/fleet/status` JSON and the gauges refreshed before each scrape.

use serde::Serialize;
use std::sync::atomic::Ordering;

use crate::fleet::Fleet;
use crate::metrics::METRICS;
use crate::routing::{Health, Loads};

#[derive(Serialize)]
pub struct FleetStatus {
    pub nodes: Vec<NodeStatus>,
}

#[derive(Serialize)]
pub struct NodeStatus {
    pub id: String,
    pub url: String,
    pub backend: crate::config::Backend,
    pub health: Health,
    pub last_error: Option<String>,
    pub seats: u32,
    pub hard_cap: u32,
    pub in_flight: u32,
    pub models: Vec<ModelStatus>,
}

#[derive(Serialize)]
pub struct ModelStatus {
    pub name: String,
    pub loaded: bool,
    pub on_disk: bool,
    pub size_gb: f64,
    pub max_context: u32,
    pub in_flight: u32,
    pub pending: u32,
    pub seats: u32,
    pub p75_ms: Option<f64>,
    pub observed_tps: Option<f64>,
}

pub fn fleet_status(fleet: &Fleet) -> FleetStatus {
    let view = fleet.view();
    let nodes = view
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let cfg = fleet.node_config(i);
            let live = fleet.nodes()[i].live.lock();
            NodeStatus {
                id: n.id.clone(),
                url: cfg.url.clone(),
                backend: cfg.backend,
                health: n.health,
                last_error: live.last_error.clone(),
                seats: n.seats,
                hard_cap: n.hard_cap,
                in_flight: fleet.nodes()[i].in_flight.load(Ordering::Relaxed),
                models: n
                    .models
                    .iter()
                    .map(|m| {
                        let load = fleet.model(i, &m.name);
                        ModelStatus {
                            name: m.name.clone(),
                            loaded: m.loaded,
                            on_disk: m.on_disk,
                            size_gb: m.size_gb,
                            max_context: m.max_context,
                            in_flight: load.in_flight,
                            pending: load.pending,
                            seats: fleet.nodes()[i].counters(&m.name).seats(),
                            p75_ms: load.p75_ms,
                            observed_tps: load.observed_tps,
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    FleetStatus { nodes }
}

/// Set the state gauges from the live fleet (called before each scrape).
pub fn refresh_gauges(fleet: &Fleet) {
    METRICS.holding_depth.set(fleet.board.holding() as i64);
    let view = fleet.view();
    for (i, n) in view.nodes.iter().enumerate() {
        let up = i64::from(n.health != Health::Offline);
        METRICS.node_up.with_label_values(&[&n.id]).set(up);
        for m in &n.models {
            METRICS
                .model_loaded
                .with_label_values(&[&n.id, &m.name])
                .set(i64::from(m.loaded));
        }
        for (model, c) in fleet.nodes()[i].all_counters() {
            METRICS
                .in_flight
                .with_label_values(&[&n.id, &model])
                .set(i64::from(c.in_flight.load(Ordering::Relaxed)));
            METRICS
                .pending
                .with_label_values(&[&n.id, &model])
                .set(i64::from(c.pending.load(Ordering::Relaxed)));
        }
    }
}
