//! One-at-a-time locks for background actions on nodes (a pre-warm or pull per node:model).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// An action that failed is not started again for this long: a load the node refuses is not
/// asked for again by every request that would have it done (spare loads run per request).
pub const RETRY_AFTER: Duration = Duration::from_secs(30);

/// Keys of actions in progress, plus keys done once that must not repeat, and when each
/// action that failed last did.
#[derive(Debug, Default)]
pub struct Ops {
    running: Mutex<HashSet<String>>,
    done: Mutex<HashSet<String>>,
    failed: Mutex<HashMap<String, Instant>>,
}

impl Ops {
    /// Claim `key`; false when the same action is already running, or failed less than
    /// [`RETRY_AFTER`] ago.
    pub fn start(&self, key: &str) -> bool {
        let recent = self
            .failed
            .lock()
            .get(key)
            .is_some_and(|t| t.elapsed() < RETRY_AFTER);
        !recent && self.running.lock().insert(key.to_string())
    }

    /// The action `key` failed (before its `finish`): it waits [`RETRY_AFTER`] to start again.
    pub fn failed(&self, key: &str) {
        self.failed.lock().insert(key.to_string(), Instant::now());
    }

    pub fn finish(&self, key: &str, once: bool) {
        self.running.lock().remove(key);
        if once {
            self.done.lock().insert(key.to_string());
        }
    }

    pub fn is_running(&self, key: &str) -> bool {
        self.running.lock().contains(key)
    }

    pub fn was_done(&self, key: &str) -> bool {
        self.done.lock().contains(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_that_failed_waits_before_it_starts_again() {
        let ops = Ops::default();
        assert!(ops.start("load:a"));
        assert!(!ops.start("load:a"), "running");
        ops.failed("load:a");
        ops.finish("load:a", false);
        assert!(!ops.start("load:a"), "failed just now");
        assert!(ops.start("load:b"), "another action is not held back");
        ops.failed
            .lock()
            .insert("load:a".into(), Instant::now() - RETRY_AFTER);
        assert!(ops.start("load:a"), "retried once the wait is over");
    }
}
