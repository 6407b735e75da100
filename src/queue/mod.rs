//! Stage 3: per node:model queues. A request takes a seat at once when its node:model has one
//! free (and the node is under its hard cap); otherwise it waits, in the gateway, where
//! rebalance can still move it: in fair order between tenants and, within a tenant, the one
//! due first goes first (`fair`: arrival plus predicted run; arrival alone without a
//! prediction). Seats are `Lease`s: dropping one frees the seat and hands it to the next
//! waiter of that node.

pub mod admission;
mod board;
pub mod decoding;
pub mod fair;
pub mod prefill;
pub mod seats;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

pub use board::{Board, Waiting, WaitingGuard};
pub use fair::{Share, WaitQueue};

use crate::fleet::{ModelCounters, NodeState};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A process-unique id for a waiting request.
pub fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A request waiting for a seat.
#[derive(Debug)]
pub struct Waiter {
    pub id: u64,
    pub since: Instant,
    /// Pinned to this node: rebalance leaves it where it is.
    pub pinned: bool,
    tx: oneshot::Sender<Lease>,
}

/// A seat on node:model, held while the request runs; dropping it releases the seat.
#[derive(Debug)]
pub struct Lease {
    pub node: usize,
    node_state: Arc<NodeState>,
    pub counters: Arc<ModelCounters>,
    /// Its place in the node's prefill queue, from its send to its first byte.
    prefill: Option<prefill::Place>,
    /// Its predicted end is in `counters.ends` under this id, with its answer's progress.
    end: Option<(u64, Arc<crate::fleet::Progress>)>,
    /// Decoding (streamed) since its first byte, on the node's clock and the pair's.
    decoding: Option<(decoding::Mark, decoding::Mark)>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some((id, _)) = &self.end {
            self.counters.ends.clear(*id);
        }
        let now_ms = crate::services::now_ms();
        self.first_byte(now_ms);
        self.end_decoding(now_ms);
        self.node_state.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.counters.lease_ended();
        pump(self.node, &self.node_state);
    }
}

/// Take a seat if node:model has one free and the node is under its ceiling (its hard cap, or
/// its seats when its models share them, `NodeState::ceiling`; learned seats are probed past
/// now and then). Called with
/// node:model's waiters lock held, which serialises the per-model check; the node count is
/// shared by all its models, so it is claimed with a compare-and-swap: never over the cap.
fn reserve(node_state: &NodeState, counters: &ModelCounters) -> bool {
    if counters.in_flight.load(Ordering::Relaxed) >= counters.seats() {
        return false;
    }
    let cap = node_state.ceiling();
    // At learned seats, one past them now and then (`NodeState::probe_due`), under the hard cap.
    let claimed = node_state
        .in_flight
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            let past = n == cap
                && n < node_state.hard_cap()
                && node_state.probe_due(crate::services::now_ms());
            (n < cap || past).then_some(n + 1)
        })
        .is_ok();
    if claimed {
        counters.in_flight.fetch_add(1, Ordering::Relaxed);
    }
    claimed
}

impl Lease {
    /// A seat already counted by `reserve`.
    fn reserved(node: usize, node_state: &Arc<NodeState>, counters: Arc<ModelCounters>) -> Lease {
        Lease {
            node,
            node_state: node_state.clone(),
            counters,
            prefill: None,
            end: None,
            decoding: None,
        }
    }

    /// The request is predicted to end at `end_ms` (completion mode, at its send): its seat is
    /// counted free from then on by routing (`Loads::seat_ends`) until the lease drops.
    pub fn expect_end(&mut self, end_ms: u64) {
        let id = self.end.as_ref().map_or_else(next_id, |(id, _)| *id);
        let progress = self.counters.ends.set(id, end_ms);
        self.end = Some((id, progress));
    }

    /// The streamed request sent at `sent_ms` is predicted to have its first token at
    /// `due_ms` (after `expect_end`), `miss_ms` later if the prefix taken as cached is not:
    /// routing sees it stalled or overdue if it is much later (`fleet::STALL_LATE`,
    /// `fleet::OVERDUE_MIN_MS`; overdue only if `measured`, `Choice::first_measured`).
    pub fn expect_first(&self, sent_ms: u64, due_ms: u64, miss_ms: u64, measured: bool) {
        if let Some((_, p)) = &self.end {
            p.expect_first(sent_ms, due_ms, miss_ms, measured);
        }
    }

    /// The request was predicted from priors only (completion mode, at its send): no end is
    /// recorded for its seat, but its answer's pace is published like one with an end — right
    /// after a start those answers are all there is to tell how fast a node streams — and,
    /// with the answer's length it was priced at (`tokens`), turns into an end once it streams
    /// (`fleet::SeatEnds::read`).
    pub fn expect_unknown_end(&mut self, tokens: Option<f64>) {
        if self.end.is_none() {
            self.expect_end(crate::fleet::END_UNKNOWN);
        }
        if let (Some((_, p)), Some(t)) = (&self.end, tokens) {
            p.expect_tokens(t);
        }
    }

    /// The answer's `chunks`-th chunk streamed (completion mode reads its pace,
    /// `fleet::Progress`).
    pub fn streamed(&self, chunks: u32, now_ms: u64) {
        if let Some((_, p)) = &self.end {
            p.chunk(chunks, now_ms);
        }
    }

    /// The request holding the seat is sent (`NodeState::sent`).
    pub fn sent(&self) {
        self.node_state.sent(&self.counters);
    }

    /// The request is sent with `tokens` to prefill: they are in the node's prefill queue
    /// until [`Lease::first_byte`] (or the end).
    pub fn start_prefill(&mut self, tokens: u32, now_ms: u64) {
        self.first_byte(now_ms);
        self.prefill = Some(self.node_state.prefill.enter(tokens, now_ms));
    }

    /// The node answered: the prompt is no longer ahead of anyone. Returns the seconds it
    /// waited for the request sent before it on the node (see `prefill`).
    pub fn first_byte(&mut self, now_ms: u64) -> Option<f64> {
        let t = self.prefill.take()?;
        self.node_state.prefill.leave(t, now_ms)
    }

    /// When a stream on its node last ended (`DecodeClock::last_end_ms`).
    pub fn node_last_end_ms(&self) -> u64 {
        self.node_state.decoding.last_end_ms()
    }

    /// When a stream of its node:model last ended.
    pub fn pair_last_end_ms(&self) -> u64 {
        self.counters.decoding.last_end_ms()
    }

    /// The first byte of a streamed answer: the request decodes from now (`decoding`), on its
    /// node's clock and its pair's.
    pub fn start_decoding(&mut self, now_ms: u64) {
        if self.decoding.is_none() {
            self.decoding = Some((
                self.node_state.decoding.enter(now_ms),
                self.counters.decoding.enter(now_ms),
            ));
        }
    }

    /// The answer ended: the mean number of streams that decoded on the node while it did,
    /// itself included (`None`: not streamed, or too short to tell).
    pub fn end_decoding(&mut self, now_ms: u64) -> Option<f64> {
        let (node, pair) = self.decoding.take()?;
        self.counters.decoding.leave(pair, now_ms);
        self.node_state.decoding.leave(node, now_ms)
    }
}

/// Take a seat if one is free and nobody is waiting ahead.
pub fn try_take(
    node: usize,
    node_state: &Arc<NodeState>,
    counters: &Arc<ModelCounters>,
) -> Option<Lease> {
    let waiters = counters.waiters.lock();
    if !waiters.is_empty() || !reserve(node_state, counters) {
        return None;
    }
    drop(waiters);
    Some(Lease::reserved(node, node_state, counters.clone()))
}

/// Take a seat if one is free, ahead of any waiters (failover of a request already placed).
pub fn take_now(
    node: usize,
    node_state: &Arc<NodeState>,
    counters: &Arc<ModelCounters>,
) -> Option<Lease> {
    let waiters = counters.waiters.lock();
    let taken = reserve(node_state, counters);
    drop(waiters);
    taken.then(|| Lease::reserved(node, node_state, counters.clone()))
}

/// The outcome of asking for a seat.
pub enum Acquire {
    Ready(Lease),
    Wait(Ticket),
    /// A breaker turned it away: open, or half-open with its one trial already out (another
    /// request decided at the same moment took it). Decide again.
    Refused,
}

/// Ask for a seat on node:model: at once, or a place in its queue (default tenant).
pub fn acquire(node: usize, node_state: &Arc<NodeState>, model: &str) -> Acquire {
    acquire_as(node, node_state, model, &Share::default())
}

/// Ask for a seat on node:model for a tenant's request: at once, or a place in its queue,
/// where seats go in weighted fair order between tenants (see `fair`).
pub fn acquire_as(node: usize, node_state: &Arc<NodeState>, model: &str, share: &Share) -> Acquire {
    let counters = node_state.counters(model);
    let mut waiters = counters.waiters.lock();
    if waiters.is_empty() && reserve(node_state, &counters) {
        drop(waiters);
        return Acquire::Ready(Lease::reserved(node, node_state, counters));
    }
    let (tx, rx) = oneshot::channel();
    let id = next_id();
    waiters.push(
        Waiter {
            id,
            since: Instant::now(),
            pinned: share.pinned,
            tx,
        },
        share,
    );
    counters.pending.fetch_add(1, Ordering::Relaxed);
    drop(waiters);
    Acquire::Wait(Ticket {
        id,
        rx,
        counters: counters.clone(),
    })
}

/// A place in a node:model queue. Await `granted()`; dropping it leaves the queue.
#[derive(Debug)]
pub struct Ticket {
    pub id: u64,
    rx: oneshot::Receiver<Lease>,
    counters: Arc<ModelCounters>,
}

impl Ticket {
    /// Resolves with a seat: on this node, or on another one if rebalance moved the request.
    pub async fn granted(&mut self) -> Option<Lease> {
        (&mut self.rx).await.ok()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut waiters = self.counters.waiters.lock();
        if waiters.remove(self.id) {
            self.counters.pending.fetch_sub(1, Ordering::Relaxed);
        }
        // A seat already sent but never received is dropped with `rx` and released.
    }
}

/// Hand free seats of a node to its waiters: within a model in fair order (within a tenant
/// the one due first, `fair`), across its models the one whose next waiter is due first (when
/// the node's ceiling binds, its models take turns by arrival and run, not by name).
pub fn pump(node: usize, node_state: &Arc<NodeState>) {
    let all = node_state.all_counters();
    loop {
        let mut first: Option<(Instant, &Arc<ModelCounters>)> = None;
        for (_, c) in &all {
            if c.in_flight.load(Ordering::Relaxed) >= c.seats() {
                continue;
            }
            if let Some(due) = c.waiters.lock().next_due() {
                if first.is_none_or(|(f, _)| due < f) {
                    first = Some((due, c));
                }
            }
        }
        let Some((_, counters)) = first else { break };
        let mut waiters = counters.waiters.lock();
        if waiters.is_empty() {
            // It left meanwhile: the next one due.
            continue;
        }
        // Full (the node at its ceiling, or the pair raced to its seats): the next lease to
        // end pumps again.
        if !reserve(node_state, counters) {
            break;
        }
        let Some(w) = waiters.pop_next() else { break };
        counters.pending.fetch_sub(1, Ordering::Relaxed);
        drop(waiters);
        let lease = Lease::reserved(node, node_state, counters.clone());
        if let Err(lease) = w.tx.send(lease) {
            // The client left: dropping the seat hands it to the next waiter.
            drop(lease);
        }
    }
}

/// Take the next waiter (fair order) off node:model's queue that may move (rebalance moves it
/// elsewhere); pinned waiters stay.
pub fn take_waiter(counters: &ModelCounters) -> Option<Waiter> {
    let w = counters.waiters.lock().pop_movable()?;
    counters.pending.fetch_sub(1, Ordering::Relaxed);
    Some(w)
}

impl Waiter {
    /// Give the waiter a seat (possibly on another node); false when it already left.
    pub fn grant(self, lease: Lease) -> bool {
        self.tx.send(lease).is_ok()
    }
}

#[cfg(test)]
mod tests;
