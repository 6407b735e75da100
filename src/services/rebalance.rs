//! Stage 5, rebalance: every `queue.rebalance_interval_ms`, queues with
//! `queue.rebalance_threshold` or more waiting give up to `queue.rebalance_max_moves` of their
//! next waiting requests (the oldest; in completion mode the one due first, `queue::fair`) to
//! nodes where the model is already hot and a seat is free. Never a cold load; requests in
//! flight never move.
//!
//! In completion mode a queue moves its next waiting request when a hot node with a free
//! seat is predicted to finish it sooner than its own node (its wait there: the requests in
//! flight ahead of it, per seat, times the seat time), whatever the depth; the check interval
//! follows observed load times (`services::completion_period`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::fleet::Fleet;
use crate::metrics::METRICS;
use crate::queue;
use crate::routing::{FleetView, Mode};

pub struct Rebalance {
    fleet: Arc<Fleet>,
}

impl Rebalance {
    pub fn new(fleet: Arc<Fleet>) -> Rebalance {
        Rebalance { fleet }
    }

    /// One pass; returns the requests moved.
    pub fn cycle(&self) -> u32 {
        let fleet = &self.fleet;
        let q = &fleet.config().queue;
        let completion = fleet.config().routing.policy.mode == Mode::Completion;
        let view = fleet.view();
        let mut moved = 0;
        for (idx, node) in fleet.nodes().iter().enumerate() {
            for (model, c) in node.all_counters() {
                let threshold = if completion { 1 } else { q.rebalance_threshold };
                if moved >= q.rebalance_max_moves || c.pending.load(Ordering::Relaxed) < threshold {
                    continue;
                }
                let decision = super::decide_elsewhere(fleet, &view, idx, &model);
                let stay = completion.then(|| oldest_waiter_finish(fleet, &view, idx, &model));
                for target in decision
                    .ranked
                    .iter()
                    .filter(|t| !t.cold && t.model == model)
                    .filter(|t| match stay {
                        Some(stay) => super::prediction_of(&decision, t.node)
                            .is_some_and(|p| p.ahead == 0 && p.total_s < stay),
                        None => true,
                    })
                {
                    let dest = &fleet.nodes()[target.node];
                    let counters = dest.counters(&model);
                    while moved < q.rebalance_max_moves {
                        let Some(lease) = queue::try_take(target.node, dest, &counters) else {
                            break;
                        };
                        let Some(waiter) = queue::take_waiter(&c) else {
                            break;
                        };
                        if waiter.grant(lease) {
                            moved += 1;
                            METRICS
                                .rebalance_moves
                                .with_label_values(&[&view.nodes[idx].id, &target.node_id, &model])
                                .inc();
                        }
                    }
                }
            }
        }
        if moved > 0 {
            log::info!("rebalance: moved {moved} waiting requests to hot nodes with free seats");
        }
        moved
    }
}

/// Completion mode: when the oldest request waiting on node `idx` is predicted to finish
/// there (a new request's prediction, with only the requests in flight ahead of it).
fn oldest_waiter_finish(fleet: &Fleet, view: &FleetView, idx: usize, model: &str) -> f64 {
    let d = super::decide_model(fleet, view, model);
    let Some(p) = super::prediction_of(&d, idx) else {
        return f64::INFINITY;
    };
    let seats = f64::from(view.nodes[idx].seats.max(1));
    let counters = fleet.node(idx).counters(model);
    let in_flight = f64::from(counters.in_flight.load(Ordering::Relaxed));
    let ahead = (in_flight + 1.0 - seats).max(0.0);
    p.total_s - p.wait_s + ahead / seats * p.service_s
}

#[async_trait]
impl BackgroundService for Rebalance {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let configured = self.fleet.config().queue.rebalance_interval_ms;
        loop {
            let period = match self.fleet.config().routing.policy.mode {
                Mode::Completion => super::completion_period(&self.fleet, configured),
                Mode::Spec | Mode::LeastBusy | Mode::RoundRobin => {
                    Duration::from_millis(configured)
                }
            };
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tokio::time::sleep(period) => { self.cycle(); }
            }
        }
    }
}
