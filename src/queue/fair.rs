//! Weighted fair order among the requests waiting in one node:model queue (start-time fair
//! queueing): a waiter's tag is `max(clock, its tenant's last tag) + 1 / weight`, the smallest
//! tag is served next and the clock moves to it. A tenant with a deep backlog therefore
//! cannot hold back another tenant's request by more than about one service time.
//!
//! Within a tenant, the turn its smallest tag gives goes to its request due first: arrived
//! plus its predicted run on the pair (`Share::run_s`, completion mode; 0 elsewhere, where the
//! order is FIFO). A short request that came a little after a long one goes first, one that
//! came later than the long one's run would take does not: the mean wait falls as under
//! shortest-job-first, and a request is overtaken only by ones that came less than its own
//! run after it, counted at most half of `queue.max_wait_s` (`Share::with_run`): however
//! loaded the pair, by a bounded number, and a long request is not passed until it times out.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::Waiter;

/// Who a waiting request belongs to, and that tenant's weight (> 0); `pinned`: the request
/// was pinned to this node (`X-Fleet-Pin-Node`), so rebalance never moves it elsewhere;
/// `run_s`: seconds it is predicted to hold its seat (0: unknown, or not completion mode).
#[derive(Debug, Clone)]
pub struct Share {
    pub tenant: Arc<str>,
    pub weight: f64,
    pub pinned: bool,
    pub run_s: f64,
}

impl Default for Share {
    fn default() -> Self {
        Share {
            tenant: Arc::from(crate::config::tenants::DEFAULT_TENANT),
            weight: 1.0,
            pinned: false,
            run_s: 0.0,
        }
    }
}

impl Share {
    /// This share for a request predicted to hold its seat `run_s` seconds, counted at most
    /// half of `max_wait_s` (`queue.max_wait_s`, the longest a request waits for a seat): a
    /// request is overtaken only by ones that came less than its run after it, so a long one
    /// is not passed by a stream of short ones until it times out.
    pub fn with_run(&self, run_s: f64, max_wait_s: u64) -> Share {
        Share {
            run_s: run_s.min(max_wait_s as f64 / 2.0),
            ..self.clone()
        }
    }

    /// When a request waiting since `since` is due: that plus its predicted run.
    pub fn due(&self, since: std::time::Instant) -> std::time::Instant {
        let run = if self.run_s.is_finite() && self.run_s > 0.0 {
            // At most a day: a prediction that large is no order to keep.
            std::time::Duration::from_secs_f64(self.run_s.min(86_400.0))
        } else {
            std::time::Duration::ZERO
        };
        since + run
    }
}

/// One waiting request: its fair-queueing tag, its tenant, its due time ([`Share::due`]).
#[derive(Debug)]
struct Item {
    tag: f64,
    tenant: Arc<str>,
    due: std::time::Instant,
    waiter: Waiter,
}

#[derive(Debug, Default)]
pub struct WaitQueue {
    items: VecDeque<Item>,
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
        self.items.push_back(Item {
            tag,
            tenant: share.tenant.clone(),
            due: share.due(w.since),
            waiter: w,
        });
    }

    /// When the waiter [`WaitQueue::pop_next`] would serve is due ([`Share::due`]): what a
    /// node's models take turns by.
    pub fn next_due(&self) -> Option<std::time::Instant> {
        let (_, i) = self.next_index(|_| true)?;
        Some(self.items[i].due)
    }

    /// The waiter to serve next: of the tenant with the smallest tag, the one due first.
    pub fn pop_next(&mut self) -> Option<Waiter> {
        self.pop_best(|_| true)
    }

    /// The next waiter that may be moved to another node (rebalance): not a pinned one.
    pub fn pop_movable(&mut self) -> Option<Waiter> {
        self.pop_best(|w| !w.pinned)
    }

    /// The eligible waiter to serve next: the tenant of the smallest tag (the oldest among
    /// equal tags), and of its eligible waiters the one due first (the oldest among equals).
    /// Returns (the index holding that turn's tag, the index of the waiter served).
    fn next_index(&self, eligible: impl Fn(&Waiter) -> bool) -> Option<(usize, usize)> {
        let mut first: Option<usize> = None;
        for (i, it) in self.items.iter().enumerate() {
            if eligible(&it.waiter) && first.is_none_or(|f| it.tag < self.items[f].tag) {
                first = Some(i);
            }
        }
        let turn = first?;
        let tenant = &self.items[turn].tenant;
        let mut best = turn;
        for (i, it) in self.items.iter().enumerate() {
            if eligible(&it.waiter) && it.tenant == *tenant && it.due < self.items[best].due {
                best = i;
            }
        }
        Some((turn, best))
    }

    fn pop_best(&mut self, eligible: impl Fn(&Waiter) -> bool) -> Option<Waiter> {
        // The turn is its tenant's smallest tag: the one served takes it, the waiter that
        // held it keeps the served one's (the tenant's sequence of tags is unchanged).
        let (i, j) = self.next_index(&eligible)?;
        let (tag_i, tag_j) = (self.items[i].tag, self.items[j].tag);
        self.items[i].tag = tag_j;
        self.items[j].tag = tag_i;
        let it = self.items.remove(j)?;
        self.clock = self.clock.max(it.tag - 1e-9);
        // Tenants whose last tag the clock has passed start afresh: nothing to remember.
        let clock = self.clock;
        self.last.retain(|_, t| *t > clock);
        Some(it.waiter)
    }

    /// Remove the waiter with `id` (it left); true when it was there.
    pub fn remove(&mut self, id: u64) -> bool {
        match self.items.iter().position(|it| it.waiter.id == id) {
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
            ..Share::default()
        }
    }

    fn waiter_at(id: u64, since: Instant) -> Waiter {
        Waiter {
            since,
            ..waiter(id)
        }
    }

    /// A run of `s` seconds for tenant `t`.
    fn runs(t: &str, s: f64) -> Share {
        Share {
            run_s: s,
            ..share(t, 1.0)
        }
    }

    /// Within a tenant the request due first (arrival plus predicted run) goes first: a 1 s
    /// request that came 2 s after a 10 s one goes ahead of it, one that came 12 s after does
    /// not; without predictions (other modes) the order is arrival's. Between tenants the
    /// turns stay fair: the tenant's turns are the same, only who of it takes them changes.
    #[test]
    fn within_a_tenant_the_request_due_first_goes_first() {
        use std::time::Duration;
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut q = WaitQueue::default();
        q.push(waiter_at(1, at(0)), &runs("a", 10.0));
        q.push(waiter_at(2, at(2)), &runs("a", 1.0));
        q.push(waiter_at(3, at(12)), &runs("a", 1.0));
        assert_eq!(q.next_due(), Some(at(3)));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop_next().map(|w| w.id)).collect();
        assert_eq!(order, vec![2, 1, 3]);

        let mut q = WaitQueue::default();
        q.push(waiter_at(1, at(0)), &runs("a", 0.0));
        q.push(waiter_at(2, at(1)), &runs("a", 0.0));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop_next().map(|w| w.id)).collect();
        assert_eq!(order, vec![1, 2], "no predictions: arrival order");

        // a: a long request then two short ones; b: one. a's first turn goes to a short one,
        // b's turn is where it was.
        let mut q = WaitQueue::default();
        q.push(waiter_at(1, at(0)), &runs("a", 30.0));
        q.push(waiter_at(2, at(0)), &runs("a", 1.0));
        q.push(waiter_at(3, at(0)), &runs("a", 1.0));
        q.push(waiter_at(10, at(0)), &runs("b", 30.0));
        let order: Vec<u64> = std::iter::from_fn(|| q.pop_next().map(|w| w.id)).collect();
        assert_eq!(order, vec![2, 10, 3, 1]);
    }

    /// A 100-s run waiting where requests time out after 20 s is due 10 s after it came: a
    /// 1-s one that comes 8 s later passes it (due at 9 s), one that comes 11 s later does not.
    #[test]
    fn a_long_run_is_due_within_half_the_longest_wait() {
        use std::time::Duration;
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let long = runs("a", 0.0).with_run(100.0, 20);
        assert_eq!(long.run_s, 10.0);
        assert_eq!(
            runs("a", 0.0).with_run(3.0, 20).run_s,
            3.0,
            "a short run as it is"
        );
        for (later, first) in [(8, 2), (11, 1)] {
            let mut q = WaitQueue::default();
            q.push(waiter_at(1, at(0)), &long);
            q.push(waiter_at(2, at(later)), &runs("a", 0.0).with_run(1.0, 20));
            assert_eq!(
                q.pop_next().map(|w| w.id),
                Some(first),
                "came {later} s later"
            );
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

    /// Rebalance takes the movable waiter due first, leaving a pinned one (due earlier) for its
    /// own node; with weights, a tenant's share of the turns is as before, whoever of it is
    /// due first takes them.
    #[test]
    fn the_due_order_holds_for_moves_and_weights() {
        use std::time::Duration;
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut q = WaitQueue::default();
        let pinned = Share {
            pinned: true,
            ..runs("a", 1.0)
        };
        q.push(
            Waiter {
                pinned: true,
                ..waiter_at(1, at(0))
            },
            &pinned,
        );
        q.push(waiter_at(2, at(0)), &runs("a", 20.0));
        q.push(waiter_at(3, at(1)), &runs("a", 5.0));
        assert_eq!(
            q.pop_movable().map(|w| w.id),
            Some(3),
            "due at 6 s, before 20 s"
        );
        assert_eq!(q.pop_next().map(|w| w.id), Some(1));
        assert_eq!(q.pop_next().map(|w| w.id), Some(2));

        let mut q = WaitQueue::default();
        for i in 0..30 {
            // The heavy tenant's later requests are its short ones.
            let run = if i < 15 { 30.0 } else { 1.0 };
            let heavy = Share {
                weight: 2.0,
                ..runs("heavy", run)
            };
            q.push(waiter_at(i, at(i)), &heavy);
            q.push(waiter_at(1000 + i, at(i)), &runs("light", 1.0));
        }
        let first: Vec<u64> = (0..30).filter_map(|_| q.pop_next().map(|w| w.id)).collect();
        let served_heavy = first.iter().filter(|id| **id < 1000).count();
        assert_eq!(served_heavy, 20, "2:1 by weight: {first:?}");
        assert_eq!(
            first.iter().find(|id| **id < 1000),
            Some(&15),
            "heavy's first turn goes to its first short request: {first:?}"
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
