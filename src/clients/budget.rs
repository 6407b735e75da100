//! Bytes of request bodies held in memory at once, across all requests: a shared budget a
//! body takes from as its buffer grows and gives back when the last copy of it is dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;

#[derive(Debug, Default)]
pub struct BodyBudget {
    used: AtomicUsize,
}

impl BodyBudget {
    /// Bytes held by buffered bodies now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Take `n` bytes if the total stays within `max`.
    fn take(&self, n: usize, max: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|t| *t <= max)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// A body buffer that grows with what arrives (never pre-sized from what a client declares),
/// every byte of its capacity covered by the budget.
#[derive(Debug)]
pub struct BodyBuf {
    budget: Arc<BodyBudget>,
    data: Vec<u8>,
    held: usize,
}

/// Why a chunk was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The body would exceed `limit` bytes (413).
    TooLarge,
    /// Buffering it would pass the gateway-wide budget (503).
    Budget,
}

impl BodyBuf {
    pub fn new(budget: Arc<BodyBudget>) -> BodyBuf {
        BodyBuf {
            budget,
            data: Vec::new(),
            held: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Append `chunk`, refusing a body past `limit` bytes or a total past `budget_max`.
    /// Capacity at most doubles per growth, and never passes `limit`.
    pub fn push(&mut self, chunk: &[u8], limit: usize, budget_max: usize) -> Result<(), Refused> {
        let want = self.data.len() + chunk.len();
        if want > limit {
            return Err(Refused::TooLarge);
        }
        if want > self.data.capacity() {
            let cap = want.max(self.data.capacity() * 2).min(limit);
            let extra = cap.saturating_sub(self.held);
            if !self.budget.take(extra, budget_max) {
                return Err(Refused::Budget);
            }
            self.held += extra;
            self.data.reserve_exact(cap - self.data.len());
        }
        self.data.extend_from_slice(chunk);
        Ok(())
    }

    /// The body as `Bytes`; its bytes stay counted until the last clone is dropped.
    pub fn freeze(self) -> Bytes {
        if self.data.is_empty() {
            return Bytes::new();
        }
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for BodyBuf {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for BodyBuf {
    fn drop(&mut self) {
        self.budget.give(self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_what_arrives_and_gives_back_on_last_drop() {
        let budget = Arc::new(BodyBudget::default());
        let mut a = BodyBuf::new(budget.clone());
        a.push(b"hello", 1 << 20, 10_000).unwrap();
        assert_eq!(budget.used(), 5, "a first chunk takes what it is");
        let mut b = BodyBuf::new(budget.clone());
        assert_eq!(
            b.push(&[0u8; 9996], 1 << 20, 10_000),
            Err(Refused::Budget),
            "the total would pass the budget"
        );
        assert_eq!(budget.used(), 5, "a refused chunk takes nothing");
        assert_eq!(a.push(&[1u8; 5000], 5000, 1 << 20), Err(Refused::TooLarge));
        let body = a.freeze();
        let copy = body.clone();
        drop(body);
        assert_eq!(budget.used(), 5, "a copy still holds it");
        assert_eq!(&copy[..], b"hello");
        drop(copy);
        assert_eq!(budget.used(), 0);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn capacity_never_passes_the_limit() {
        let budget = Arc::new(BodyBudget::default());
        let mut a = BodyBuf::new(budget.clone());
        for _ in 0..10 {
            a.push(&[7u8; 1000], 10_000, usize::MAX).unwrap();
        }
        assert_eq!(a.len(), 10_000);
        assert!(budget.used() <= 10_000, "{}", budget.used());
    }
}
