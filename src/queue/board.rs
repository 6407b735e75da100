//! Who is waiting, and where: the list behind `/fleet/queue` and the holding-queue bound.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::Serialize;

/// One waiting request as `/fleet/queue` shows it (no prompt, no key).
#[derive(Debug, Clone, Serialize)]
pub struct Waiting {
    pub id: u64,
    pub protocol: &'static str,
    pub model: String,
    /// The node whose queue it is in; None while in the holding queue.
    pub node: Option<String>,
    #[serde(skip)]
    pub since: Instant,
    /// The client's address (its share of the holding queue is bounded); never shown.
    #[serde(skip)]
    pub client: Option<std::net::IpAddr>,
    pub waited_ms: u64,
}

/// Every waiting request of this gateway.
#[derive(Debug, Default)]
pub struct Board {
    entries: Mutex<BTreeMap<u64, Waiting>>,
}

impl Board {
    /// Register a waiting request; it leaves the board when the guard drops.
    pub fn enter(self: &Arc<Self>, w: Waiting) -> WaitingGuard {
        let id = w.id;
        self.entries.lock().insert(id, w);
        WaitingGuard {
            board: self.clone(),
            id,
        }
    }

    /// Requests in the holding queue (no node yet).
    pub fn holding(&self) -> usize {
        self.entries
            .lock()
            .values()
            .filter(|w| w.node.is_none())
            .count()
    }

    /// Requests of `client` in the holding queue.
    pub fn holding_for(&self, client: Option<std::net::IpAddr>) -> usize {
        self.entries
            .lock()
            .values()
            .filter(|w| w.node.is_none() && w.client == client)
            .count()
    }

    /// Every waiting request (holding queue and node:model queues).
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.lock().is_empty()
    }

    pub fn snapshot(&self) -> Vec<Waiting> {
        let now = Instant::now();
        self.entries
            .lock()
            .values()
            .map(|w| Waiting {
                waited_ms: now.duration_since(w.since).as_millis() as u64,
                ..w.clone()
            })
            .collect()
    }
}

/// Keeps a request on the board; updates where it waits.
#[derive(Debug)]
pub struct WaitingGuard {
    board: Arc<Board>,
    id: u64,
}

impl WaitingGuard {
    pub fn set_node(&self, node: Option<String>) {
        if let Some(w) = self.board.entries.lock().get_mut(&self.id) {
            w.node = node;
        }
    }
}

impl Drop for WaitingGuard {
    fn drop(&mut self) {
        self.board.entries.lock().remove(&self.id);
    }
}
