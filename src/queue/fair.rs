//! Weighted fair order among the requests waiting in one node:model queue (start-time fair
//! queueing): a waiter's tag is `max(clock, its tenant's last tag) + 1 / weight`, the smallest
//! tag is served next and the clock moves to it. A tenant with a deep backlog therefore
//! cannot hold back another tenant's request by more than about one service time; with one
//! tenant (or equal tags) the order is FIFO.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::Waiter;

/// Who a waiting request belongs to, and that tenant's weight (> 0); `pinned`: the request
/// was pinned to this node (`X-Fleet-Pin-Node`), so rebalance never moves it elsewhere.
#[derive(Debug, Clone)]
pub struct Share {
    pub tenant: Arc<str>,
    pub weight: f64,
    pub pinned: bool,
}

impl Default for Share {
    fn default() -> Self {
        Share {
            tenant: Arc::from(crate::config::tenants::DEFAULT_TENANT),
            weight: 1.0,
            pinned: false,
        }
    }
}

#[derive(Debug, Default)]
pub struct WaitQueue {
    items: VecDeque<(f64, Waiter)>,
    clock: f64,
    last: HashMap<Arc<str>, f64>,
}

impl WaitQueue {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn push(&mut self, w: Waiter, share: &Share) {
        let weight = if share.weight.is_finite() && share.weight > 0.0 {
            share.weight
        } else {
            1.0
        };
        let start = self
            .last
            .get(&share.tenant)
            .copied()
            .unwrap_or(0.0)
            .max(self.clock);
        let tag = start + 1.0 / weight;
        self.last.insert(share.tenant.clone(), tag);
        self.items.push_back((tag, w));
    }

    /// Since when the waiter [`WaitQueue::pop_next`] would serve has waited.
    pub fn next_since(&self) -> Option<std::time::Instant> {
        let mut best: Option<(f64, std::time::Instant)> = None;
        for (tag, w) in &self.items {
            if best.is_none_or(|(b, _)| *tag < b) {
                best = Some((*tag, w.since));
            }
        }
        best.map(|(_, since)| since)
    }

    /// The waiter to serve next: smallest tag, oldest first among equals.
    pub fn pop_next(&mut self) -> Option<Waiter> {
        self.pop_best(|_| true)
    }

    /// The next waiter that may be moved to another node (rebalance): not a pinned one.
    pub fn pop_movable(&mut self) -> Option<Waiter> {
        self.pop_best(|w| !w.pinned)
    }

    fn pop_best(&mut self, eligible: impl Fn(&Waiter) -> bool) -> Option<Waiter> {
        let mut best: Option<(usize, f64)> = None;
        for (i, (tag, w)) in self.items.iter().enumerate() {
            if eligible(w) && best.is_none_or(|(_, b)| *tag < b) {
                best = Some((i, *tag));
            }
        }
        let (i, tag) = best?;
        let (_, w) = self.items.remove(i)?;
        self.clock = self.clock.max(tag - 1e-9);
        // Tenants whose last tag the clock has passed start afresh: nothing to remember.
        let clock = self.clock;
        self.last.retain(|_, t| *t > clock);
        Some(w)
    }

    /// Remove the waiter with `id` (it left); true when it was there.
    pub fn remove(&mut self, id: u64) -> bool {
        match self.items.iter().position(|(_, w)| w.id == id) {
            Some(pos) => {
                self.items.remove(pos);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn waiter(id: u64) -> Waiter {
        let (tx, _rx) = tokio::sync::oneshot::channel();
        Waiter {
            id,
            since: Instant::now(),
            pinned: false,
            tx,
        }
    }

    fn share(t: &str, weight: f64) -> Share {
        Share {
            tenant: Arc::from(t),
            weight,
            pinned: false,
        }
    }

    #[test]
    fn rebalance_takes_the_next_waiter_that_is_not_pinned() {
        let mut q = WaitQueue::default();
        let pinned = Share {
            pinned: true,
            ..Share::default()
        };
        q.push(
            Waiter {
                pinned: true,
                ..waiter(1)
            },
            &pinned,
        );
        q.push(waiter(2), &Share::default());
        assert_eq!(
            q.pop_movable().map(|w| w.id),
            Some(2),
            "the pinned one stays"
        );
        assert!(q.pop_movable().is_none());
        assert_eq!(
            q.pop_next().map(|w| w.id),
            Some(1),
            "its own node still serves it"
        );
    }

    #[test]
    fn one_tenant_is_fifo() {
        let mut q = WaitQueue::default();
        for id in 1..=5 {
            q.push(waiter(id), &Share::default());
        }
        let order: Vec<u64> = std::iter::from_fn(|| q.pop_next().map(|w| w.id)).collect();
        assert_eq!(order, vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_late_single_request_goes_ahead_of_a_backlog() {
        let mut q = WaitQueue::default();
        let a = share("a", 1.0);
        for id in 1..=50 {
            q.push(waiter(id), &a);
        }
        assert_eq!(q.pop_next().map(|w| w.id), Some(1));
        q.push(waiter(100), &share("b", 1.0));
        // b's first request is next (or right after the one a request already tagged level).
        let next: Vec<u64> = (0..2).filter_map(|_| q.pop_next().map(|w| w.id)).collect();
        assert!(next.contains(&100), "{next:?}");
    }

    #[test]
    fn weights_split_the_seats() {
        let mut q = WaitQueue::default();
        for id in 0..30 {
            q.push(waiter(id), &share("heavy", 2.0));
            q.push(waiter(1000 + id), &share("light", 1.0));
        }
        let first: Vec<u64> = (0..30).filter_map(|_| q.pop_next().map(|w| w.id)).collect();
        let heavy = first.iter().filter(|id| **id < 1000).count();
        assert_eq!(heavy, 20, "2:1 by weight: {first:?}");
        assert!(q.remove(1029));
        assert!(!q.remove(1029));
    }
}
