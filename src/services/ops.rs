//! One-at-a-time locks for background actions on nodes (a pre-warm or pull per node:model).

use std::collections::HashSet;

use parking_lot::Mutex;

/// Keys of actions in progress, plus keys done once that must not repeat.
#[derive(Debug, Default)]
pub struct Ops {
    running: Mutex<HashSet<String>>,
    done: Mutex<HashSet<String>>,
}

impl Ops {
    /// Claim `key`; false when the same action is already running.
    pub fn start(&self, key: &str) -> bool {
        self.running.lock().insert(key.to_string())
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
