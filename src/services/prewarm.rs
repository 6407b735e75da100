//! Stage 4, pre-warm: every `queue.prewarm_interval_ms`, a node:model queue at
//! `queue.prewarm_threshold` or more (running + waiting) gets its model loaded on the
//! runner-up node, so overflow finds it hot. One load per node:model at a time.
//!
//! In completion mode the trigger is the model's own: a queue whose predicted seat wait for the
//! next request exceeds the runner-up's predicted load time, and the check interval follows
//! observed load times (`services::completion_period`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::node_api;
use crate::fleet::Fleet;
use crate::metrics::METRICS;
use crate::routing::{Choice, Decision, FleetView, Mode};

pub struct Prewarm {
    fleet: Arc<Fleet>,
}

impl Prewarm {
    pub fn new(fleet: Arc<Fleet>) -> Prewarm {
        Prewarm { fleet }
    }

    /// One pass; returns the loads started.
    pub fn cycle(&self) -> usize {
        let fleet = &self.fleet;
        let threshold = fleet.config().queue.prewarm_threshold;
        let completion = fleet.config().routing.policy.mode == Mode::Completion;
        let view = fleet.view();
        let mut started = 0;
        for (idx, node) in fleet.nodes().iter().enumerate() {
            for (model, c) in node.all_counters() {
                let depth = c.in_flight.load(Ordering::Relaxed) + c.pending.load(Ordering::Relaxed);
                if depth < if completion { 1 } else { threshold } {
                    continue;
                }
                // The runner-up: the best node for this model other than the busy one.
                let decision = super::decide_elsewhere(fleet, &view, idx, &model);
                let Some(runner_up) = decision.winner() else {
                    continue;
                };
                if !runner_up.cold || !node_api::can_manage(fleet, runner_up.node) {
                    continue;
                }
                if completion && !worth_loading(fleet, &view, idx, &model, &decision, runner_up) {
                    continue;
                }
                let key = format!("load:{}:{model}", runner_up.node);
                if !fleet.ops.start(&key) {
                    continue;
                }
                started += 1;
                let (fleet, target, model) = (fleet.clone(), runner_up.node, model.clone());
                let node_id = runner_up.node_id.clone();
                METRICS
                    .prewarms
                    .with_label_values(&[&node_id, &model])
                    .inc();
                log::info!(
                    "pre-warm: {model} queue on {} at {depth}, loading on {node_id}",
                    view.nodes[idx].id
                );
                tokio::spawn(async move {
                    // What the load throws out is chosen as for a request's cold load.
                    node_api::make_room(&fleet, target, &model).await;
                    if let Err(e) = node_api::load(&fleet, target, &model).await {
                        log::warn!("pre-warm {model} on {node_id}: {e}");
                    }
                    node_api::refresh(&fleet, target).await;
                    fleet.ops.finish(&key, false);
                });
            }
        }
        started
    }
}

/// Completion mode: the next request's predicted seat wait on the busy node exceeds the
/// runner-up's predicted load time.
fn worth_loading(
    fleet: &Fleet,
    view: &FleetView,
    busy: usize,
    model: &str,
    elsewhere: &Decision,
    runner_up: &Choice,
) -> bool {
    let here = super::prediction_of(&super::decide_model(fleet, view, model), busy);
    let there = super::prediction_of(elsewhere, runner_up.node);
    matches!((here, there), (Some(h), Some(t)) if h.wait_s > t.load_s)
}

#[async_trait]
impl BackgroundService for Prewarm {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let configured = self.fleet.config().queue.prewarm_interval_ms;
        loop {
            let period = match self.fleet.config().routing.policy.mode {
                Mode::Completion => super::completion_period(&self.fleet, configured),
                Mode::Spec => Duration::from_millis(configured),
            };
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tokio::time::sleep(period) => {
                    let n = self.cycle();
                    log::debug!("pre-warm cycle: {n} loads started");
                }
            }
        }
    }
}
