//! Learned-state persistence: writes the capacity learner's baselines (`capacity.json`) and the
//! node:model rates (`rates.json`) to `learning.state_dir` every `learning.save_interval` and
//! on shutdown (atomically), so they survive a restart.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::fleet::Fleet;

pub struct LearnerSaver {
    fleet: Arc<Fleet>,
    dir: PathBuf,
}

impl LearnerSaver {
    pub fn new(fleet: Arc<Fleet>, dir: PathBuf) -> LearnerSaver {
        LearnerSaver { fleet, dir }
    }

    fn save(&self) {
        match self.fleet.save_learners(&self.dir) {
            Ok(n) => log::debug!(
                "capacity learner: saved {n} node(s) to {}",
                self.dir.display()
            ),
            Err(e) => log::warn!("capacity learner: {e}"),
        }
        match self.fleet.save_rates(&self.dir) {
            Ok(n) => log::debug!("learned rates: saved {n} pair(s) to {}", self.dir.display()),
            Err(e) => log::warn!("learned rates: {e}"),
        }
    }
}

#[async_trait]
impl BackgroundService for LearnerSaver {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.fleet.config().learning.save_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => self.save(),
            }
        }
        self.save();
    }
}
