//! A node's prefill queue as the gateway sees it: the uncached prompt tokens it was sent and has
//! not answered yet, and when the oldest of them could have started. On a node that prefills one
//! prompt at a time (learned by `fleet::rates`, nothing to configure) a request waits for these
//! before its own; elsewhere they cost it nothing.
//!
//! Each request also learns how long it waited for the one sent just before it on the node:
//! from its dispatch to that one's first byte. On a node that prefills one prompt at a time its
//! time to first token is that wait plus its own prefill; on one that prefills every seat on its
//! own, the wait explains nothing. `fleet::rates` keeps both lines and believes the one that fits.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::routing::PrefillLoad;

/// Per node (in `NodeState`).
#[derive(Debug, Default)]
pub struct PrefillQueue {
    tokens: AtomicU64,
    /// When the request now first in line could start: the last first byte, or the send that
    /// found the queue empty (ms).
    head_ms: AtomicU64,
    /// The request sent last, to be waited for by the next one.
    last: Mutex<Option<Arc<Mark>>>,
}

/// When one request's prefill ended (its first byte, or its end without one); 0 until then.
#[derive(Debug, Default)]
struct Mark {
    done_ms: AtomicU64,
}

/// One request's place in its node's queue, held with its seat (`Lease`).
#[derive(Debug)]
pub struct Place {
    tokens: u32,
    sent_ms: u64,
    mark: Arc<Mark>,
    /// The request sent just before on the node, still before its first byte when this was sent.
    ahead: Option<Arc<Mark>>,
}

impl PrefillQueue {
    /// A request is sent with `tokens` to prefill.
    pub fn enter(&self, tokens: u32, now_ms: u64) -> Place {
        let mark = Arc::new(Mark::default());
        let ahead = self
            .last
            .lock()
            .replace(mark.clone())
            .filter(|m| m.done_ms.load(Ordering::Relaxed) == 0);
        if self.tokens.fetch_add(u64::from(tokens), Ordering::Relaxed) == 0 {
            self.head_ms.store(now_ms, Ordering::Relaxed);
        }
        Place {
            tokens,
            sent_ms: now_ms,
            mark,
            ahead,
        }
    }

    /// What routing reads.
    pub fn load(&self) -> PrefillLoad {
        PrefillLoad {
            tokens: self.tokens.load(Ordering::Relaxed),
            head_ms: self.head_ms.load(Ordering::Relaxed),
        }
    }

    /// The request answered (or ended): its prompt is no longer ahead of anyone. Returns the
    /// seconds it waited for the one sent before it (`None`: nobody was ahead); a request still
    /// before its first byte when this one got its own counts the whole wait, which fits a node
    /// that prefills one at a time only if it never happens.
    pub fn leave(&self, t: Place, now_ms: u64) -> Option<f64> {
        t.mark.done_ms.store(now_ms.max(1), Ordering::Relaxed);
        self.tokens
            .fetch_sub(u64::from(t.tokens), Ordering::Relaxed);
        // The next in line starts now only if this one was first (nobody ahead still
        // waiting): one behind that leaves (an error, a client gone) takes nothing from it.
        let first = t
            .ahead
            .as_ref()
            .is_none_or(|m| m.done_ms.load(Ordering::Relaxed) != 0);
        if first {
            self.head_ms.store(now_ms, Ordering::Relaxed);
        }
        let ahead = t.ahead?;
        let done = match ahead.done_ms.load(Ordering::Relaxed) {
            0 => now_ms,
            d => d.min(now_ms),
        };
        Some(done.saturating_sub(t.sent_ms) as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_tokens_until_the_first_byte_and_the_wait_for_the_one_ahead() {
        let q = PrefillQueue::default();
        let a = q.enter(1_000, 10_000);
        assert_eq!(
            q.load(),
            PrefillLoad {
                tokens: 1_000,
                head_ms: 10_000
            }
        );
        let b = q.enter(500, 10_100);
        assert_eq!(q.load().tokens, 1_500);
        assert_eq!(q.leave(a, 10_400), None, "nobody ahead of the first");
        assert_eq!(
            q.load(),
            PrefillLoad {
                tokens: 500,
                head_ms: 10_400
            }
        );
        // b waited from 10,100 to a's first byte at 10,400.
        assert_eq!(q.leave(b, 10_650), Some(0.3));
        assert_eq!(q.load().tokens, 0);
        // Sent after b answered: nobody ahead; the queue was empty, so it starts at once.
        let c = q.enter(200, 11_000);
        assert_eq!(q.load().head_ms, 11_000);
        // d's first byte came before c's (a node that does not queue): the whole wait counts.
        let d = q.enter(200, 11_010);
        assert_eq!(q.leave(d, 11_100), Some(0.09));
        assert_eq!(
            q.load().head_ms,
            11_000,
            "c, still first in line, keeps its start"
        );
        assert_eq!(q.leave(c, 11_200), None);
    }
}
