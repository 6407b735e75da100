//! Stage 5, rebalance: every `queue.rebalance_interval_ms`, queues with
//! `queue.rebalance_threshold` or more waiting give up to `queue.rebalance_max_moves` of their
//! oldest waiting requests to nodes where the model is already hot and a seat is free. Never a
//! cold load; requests in flight never move.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::fleet::Fleet;
use crate::metrics::METRICS;
use crate::queue;

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
        let view = fleet.view();
        let mut moved = 0;
        for (idx, node) in fleet.nodes().iter().enumerate() {
            for (model, c) in node.all_counters() {
                if moved >= q.rebalance_max_moves
                    || c.pending.load(Ordering::Relaxed) < q.rebalance_threshold
                {
                    continue;
                }
                let decision = super::decide_elsewhere(fleet, &view, idx, &model);
                for target in decision
                    .ranked
                    .iter()
                    .filter(|t| !t.cold && t.model == model)
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

#[async_trait]
impl BackgroundService for Rebalance {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let period = Duration::from_millis(self.fleet.config().queue.rebalance_interval_ms);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => { self.cycle(); }
            }
        }
    }
}
