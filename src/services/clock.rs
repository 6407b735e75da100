//! Fleet clock: republishes the routing view when time alone changes it (a warmup ends, a
//! heartbeat goes stale, a breaker's cooldown ends). Checks every `TICK`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::now_ms;
use crate::fleet::Fleet;

/// How often time-driven state is re-evaluated.
pub const TICK: Duration = Duration::from_millis(250);

pub struct FleetClock {
    fleet: Arc<Fleet>,
}

impl FleetClock {
    pub fn new(fleet: Arc<Fleet>) -> FleetClock {
        FleetClock { fleet }
    }
}

#[async_trait]
impl BackgroundService for FleetClock {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {
                    if self.fleet.tick(now_ms()) {
                        log::debug!("fleet clock: view republished ({} nodes)", self.fleet.len());
                    }
                }
            }
        }
    }
}
