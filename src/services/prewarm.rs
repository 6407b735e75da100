//! Stage 4, pre-warm: every `queue.prewarm_interval_ms`, a node:model queue at
//! `queue.prewarm_threshold` or more (running + waiting) gets its model loaded on the
//! runner-up node, so overflow finds it hot. One load per node:model at a time.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::node_api;
use crate::fleet::Fleet;
use crate::metrics::METRICS;

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
        let view = fleet.view();
        let mut started = 0;
        for (idx, node) in fleet.nodes().iter().enumerate() {
            for (model, c) in node.all_counters() {
                let depth = c.in_flight.load(Ordering::Relaxed) + c.pending.load(Ordering::Relaxed);
                if depth < threshold {
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

#[async_trait]
impl BackgroundService for Prewarm {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let period = Duration::from_millis(self.fleet.config().queue.prewarm_interval_ms);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {
                    let n = self.cycle();
                    log::debug!("pre-warm cycle: {n} loads started");
                }
            }
        }
    }
}
