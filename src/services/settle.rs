//! Start-up settling: a node that answers with an empty model list (a server still loading)
//! is re-polled quickly, backing off from 100 ms to the poll interval,
//! so its models are routable moments after they appear instead of at the next regular poll.
//! While such a node exists, a request for an unknown model waits briefly (`SETTLE_WAIT`) in
//! the holding queue instead of getting a 404 (see `proxy::place`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::health::poll_and_apply;
use crate::fleet::Fleet;
use crate::routing::Health;

/// First re-poll delay for an empty node; doubles up to `health.poll_interval`.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// How long a request for a model no node reports may wait for an empty node to report it.
pub const SETTLE_WAIT: Duration = Duration::from_secs(3);

/// A node that answers but has reported no model yet (re-polled quickly).
pub fn answered_empty(fleet: &Fleet, idx: usize) -> bool {
    let node = fleet.node(idx);
    let live = node.live.lock();
    live.polled && live.health != Health::Offline && live.models.is_empty()
}

/// Some node may still report models: one answered empty, or one has not answered yet and
/// is not offline (so "model not found" may not be final yet).
pub fn any_settling(fleet: &Fleet) -> bool {
    (0..fleet.len()).any(|i| {
        let node = fleet.node(i);
        let live = node.live.lock();
        live.health != Health::Offline && live.models.is_empty()
    })
}

pub struct Settle {
    fleet: Arc<Fleet>,
    client: reqwest::Client,
}

impl Settle {
    pub fn new(fleet: Arc<Fleet>) -> Settle {
        let client = super::health::poll_client(fleet.config().health.poll_timeout);
        Settle { fleet, client }
    }
}

/// Per node: when to poll next and the delay after that.
#[derive(Clone, Copy)]
struct Backoff {
    due: Instant,
    delay: Duration,
}

#[async_trait]
impl BackgroundService for Settle {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let max = self.fleet.config().health.poll_interval.max(FIRST_BACKOFF);
        let mut backoff: Vec<Option<Backoff>> = Vec::new();
        loop {
            // Registered before the scan, so a change during it is not missed.
            let changed = self.fleet.changed.notified();
            let now = Instant::now();
            backoff.resize(self.fleet.len(), None);
            let mut next: Option<Instant> = None;
            for (idx, slot) in backoff.iter_mut().enumerate() {
                if !answered_empty(&self.fleet, idx) {
                    *slot = None;
                    continue;
                }
                let b = slot.get_or_insert(Backoff {
                    due: now + FIRST_BACKOFF,
                    delay: FIRST_BACKOFF,
                });
                if b.due <= now {
                    poll_and_apply(&self.fleet, &self.client, idx).await;
                    b.delay = (b.delay * 2).min(max);
                    b.due = Instant::now() + b.delay;
                }
                next = Some(next.map_or(b.due, |n| n.min(b.due)));
            }
            // Nothing settling: sleep until the fleet changes (no idle wake-ups).
            let sleep = async {
                match next {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = changed => {}
                _ = sleep => {}
            }
        }
    }
}
