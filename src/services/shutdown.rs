//! Graceful shutdown (SIGTERM): once Pingora stops accepting, wait for the requests in flight,
//! at most `server.grace_period_s`; then end what is still running with the protocol's error
//! event (`ClientGuards::end_grace`), and — in the `fleetgate` binary — exit as soon as
//! nothing is in flight instead of sleeping out Pingora's whole grace period.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::fleet::Fleet;

/// How often in-flight requests are counted while draining.
const CHECK: Duration = Duration::from_millis(20);
/// After the grace period: time for cut streams to write their error event.
const CUT_SETTLE: Duration = Duration::from_secs(1);

pub struct Drain {
    fleet: Arc<Fleet>,
    /// Exit the process when drained (the binary); false: only cut streams (embedding, tests).
    exit: bool,
}

impl Drain {
    pub fn new(fleet: Arc<Fleet>, exit: bool) -> Drain {
        Drain { fleet, exit }
    }

    async fn drained_within(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        // Connections count too: one accepted but not yet read would be reset by the exit.
        while self.fleet.clients.in_flight() > 0 || self.fleet.clients.open() > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(CHECK).await;
        }
        true
    }

    fn exit(&self) {
        if !self.exit {
            return;
        }
        if let Some(dir) = self.fleet.config().learning.state_dir.clone() {
            if let Err(e) = self.fleet.save_learners(&dir) {
                log::warn!("capacity learner: {e}");
            }
        }
        log::info!("shutdown: nothing in flight, exiting");
        std::process::exit(0);
    }
}

#[async_trait]
impl BackgroundService for Drain {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        while !*shutdown.borrow() {
            if shutdown.changed().await.is_err() {
                return;
            }
        }
        let grace = Duration::from_secs(self.fleet.config().grace_period_s);
        let n = self.fleet.clients.in_flight();
        log::info!("shutdown: {n} request(s) in flight, grace period {grace:?}");
        if !self.drained_within(grace).await {
            let n = self.fleet.clients.in_flight();
            log::warn!("shutdown: grace period over, ending {n} request(s) with an error");
            self.fleet.clients.end_grace();
            self.drained_within(CUT_SETTLE).await;
        }
        self.exit();
    }
}
