//! Per node:model state: seats in use, waiting requests, latency window (p75), tokens/s.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::Breaker;
use crate::routing::{LiveDecode, ModelLoad};

const WINDOW: usize = 128;

/// One node:model pair: its seats, its queue of waiting requests, and what was observed.
#[derive(Debug, Default)]
pub struct ModelCounters {
    pub in_flight: AtomicU32,
    /// Requests waiting in this node:model queue (Stage 3).
    pub pending: AtomicU32,
    /// Seats: most requests in flight at once for this node:model (0 until known; 1 is used).
    pub limit: AtomicU32,
    /// Waiting requests, oldest first.
    pub(crate) waiters: Mutex<crate::queue::WaitQueue>,
    /// p75 of the latency window in ms, as f64 bits (0 = no history).
    p75_bits: AtomicU64,
    /// EWMA of output tokens/s, as f64 bits (0 = unknown).
    tps_bits: AtomicU64,
    window: Mutex<Vec<f64>>,
    next: AtomicU64,
    /// EWMA of time to first token in ms, as f64 bits (0 = unknown).
    ttft_bits: AtomicU64,
    /// EWMA of output tokens per streamed chunk (the node's count over the chunks seen), as
    /// f64 bits (0 = unknown: one each).
    per_chunk_bits: AtomicU64,
    /// What the backend itself reports running / waiting (vLLM `/metrics`, llama.cpp `/slots`).
    reported_running: AtomicU32,
    reported_waiting: AtomicU32,
    /// The node:model circuit breaker (model-specific faults: 5xx, broken streams).
    pub breaker: Mutex<Breaker>,
    /// Endpoints this node:model answered "not here" for (no fault, not the breaker's).
    pub not_capable: super::capable::NotCapable,
    /// Rates learned from this pair's responses (completion mode).
    pub rates: Mutex<super::PairRates>,
    /// When the requests holding its seats are predicted to end (completion mode).
    pub ends: SeatEnds,
    /// The pair's streams, from first byte to end (its node's are `NodeState::decoding`): the
    /// most it was seen to run at once.
    pub decoding: crate::queue::decoding::DecodeClock,
    /// On a node whose seats nobody said and that serves several models: whether this model
    /// runs no more at once than it was seen to (`fleet::sharing::SeatBound`), its own seats
    /// (Ollama's per-model `OLLAMA_NUM_PARALLEL` behind a URL).
    pub seat_bound: Mutex<super::SeatBound>,
    /// When the first request of the cold load now in progress was sent, ms (0: none known;
    /// [`LOADED`]: the model is known to be in, so a request still marked cold from before
    /// it came in starts nothing).
    load_since_ms: AtomicU64,
    /// On a node that hides its loads (`backend: openai`): when the spell's request went out
    /// (sent to the pair idle past the keep-alive or displaced by another model, or a stalled
    /// one's send), ms, until the pair's first byte (0: none under way). A request sent
    /// meanwhile waits for the same unseen load.
    hidden_load_since_ms: AtomicU64,
    /// That spell began with a swap (`ModelLoad::displaced`) or a stall, not an idle past the
    /// keep-alive.
    hidden_load_switch: AtomicBool,
    /// When the pair last sent a first byte (ms; 0: never).
    first_byte_ms: AtomicU64,
    /// First bytes the pair sent, and the last [`FIRST_BYTES_KEPT`] of them (ms), by count.
    first_bytes: AtomicU64,
    first_byte_ring: [AtomicU64; FIRST_BYTES_KEPT],
}

/// First-byte times a pair keeps (`ModelCounters::first_byte_after`).
const FIRST_BYTES_KEPT: usize = 8;

/// Per running request (a `Lease` id), the ms its seat is predicted to be free again: when a
/// full pair's next seat frees is the soonest of these, not an average (`routing::completion`);
/// and how far its answer has streamed (`Progress`).
#[derive(Debug, Default)]
pub struct SeatEnds(Mutex<Vec<(u64, u64, Arc<Progress>)>>);

/// How far one running request's streamed answer has come: its first and latest chunk (ms)
/// and the chunks between. Written by the request's own task, read by routing.
#[derive(Debug, Default)]
pub struct Progress {
    first_ms: AtomicU64,
    last_ms: AtomicU64,
    chunks: AtomicU32,
    /// A streamed request's send and when its first token is due (ms; 0: not predicted).
    sent_ms: AtomicU64,
    due_ms: AtomicU64,
    /// How much later a miss of the prefix it was credited as cached would make it (ms).
    miss_ms: AtomicU64,
    /// `due_ms` came from rates the pair measured: only then can it be overdue (`overdue`).
    due_measured: AtomicBool,
    /// Of one whose end is not known (`END_UNKNOWN`): the answer's length it was priced at
    /// (0: none).
    tokens: AtomicU32,
}

/// A streamed answer is stalled when its first token is late by more than this many times its
/// predicted wait for it, and by at least `STALL_MIN_MS` (`SeatEnds::read`): a load is
/// seconds, many prefills long.
pub const STALL_LATE: u64 = 4;
pub const STALL_MIN_MS: u64 = 250;

/// A streamed answer is overdue when its first token, due at rates the pair measured
/// (`Progress::expect_first`), is late by more than its whole predicted wait for it (twice as
/// long in all), by more than a miss of the prefix credited as cached would make it, and by at
/// least `OVERDUE_MIN_MS`: beside streams of its model already running, a node whose seats
/// nobody said keeps it waiting for one of theirs (`routing::completion`, the seats a pair is
/// priced at).
pub const OVERDUE_MIN_MS: u64 = 100;

/// Whether a first token `late_ms` past its due time, which was `wait_ms` after the send, is
/// a stall (see `STALL_LATE`).
pub fn is_stall(late_ms: u64, wait_ms: u64) -> bool {
    late_ms >= STALL_MIN_MS && late_ms > STALL_LATE.saturating_mul(wait_ms)
}

impl Progress {
    /// The streamed request was sent at `sent_ms`, its first token predicted at `due_ms`, or
    /// `miss_ms` later should the prefix credited as cached miss; `measured`: from rates the
    /// pair measured (it answered before), not a never-observed pair's estimate.
    pub fn expect_first(&self, sent_ms: u64, due_ms: u64, miss_ms: u64, measured: bool) {
        self.sent_ms.store(sent_ms, Ordering::Relaxed);
        self.due_ms.store(due_ms.max(sent_ms), Ordering::Relaxed);
        self.miss_ms.store(miss_ms, Ordering::Relaxed);
        self.due_measured.store(measured, Ordering::Relaxed);
    }

    /// Its end is not known; its answer was priced at `tokens` tokens.
    pub fn expect_tokens(&self, tokens: f64) {
        self.tokens.store(
            tokens.round().clamp(0.0, f64::from(u32::MAX)) as u32,
            Ordering::Relaxed,
        );
    }

    /// Of an answer whose end is not known, when it ends (ms) at the pace it streams, once
    /// `LIVE_MIN_TOKENS` have streamed past its first: the rest of the tokens it was priced at,
    /// and once past half of them as long again as it has streamed (nobody knows its length;
    /// the longer it has run, the longer it is likely to). A 70b model's first answers, from
    /// priors, held a node's seats for 10 s more while routing counted them free in 1.
    fn paced_end_ms(&self, per_chunk: f64) -> Option<u64> {
        let priced = f64::from(self.tokens.load(Ordering::Relaxed));
        let (secs, chunks) = self.streamed().filter(|(_, t)| *t >= LIVE_MIN_TOKENS)?;
        if priced <= 0.0 {
            return None;
        }
        let done = f64::from(chunks) * per_chunk.max(f64::MIN_POSITIVE);
        let left_s = (priced - done).max(done) * secs / done;
        left_s
            .is_finite()
            .then(|| self.last_ms.load(Ordering::Relaxed) + (left_s * 1000.0) as u64)
    }

    /// Still waiting for a predicted first token at `now_ms`: how late it is, how long its
    /// wait for it was predicted, and when it was sent (ms); `None` once it came or with none
    /// predicted.
    fn awaited(&self, now_ms: u64) -> Option<(u64, u64, u64)> {
        let due = self.due_ms.load(Ordering::Relaxed);
        if due == 0 || self.first_ms.load(Ordering::Relaxed) != 0 {
            return None;
        }
        let sent = self.sent_ms.load(Ordering::Relaxed);
        Some((now_ms.saturating_sub(due), due.saturating_sub(sent), sent))
    }

    /// When it was sent, if it is stalled at `now_ms` (see `STALL_LATE`).
    fn stalled(&self, now_ms: u64) -> Option<u64> {
        let (late, wait, sent) = self.awaited(now_ms)?;
        is_stall(late, wait).then_some(sent)
    }

    /// When it was sent, if its first token is overdue at `now_ms` (see `OVERDUE_MIN_MS`).
    /// Never where its due time was a never-observed pair's estimate: an untried 70b priced at
    /// its node's 3b speed (sizes unknown) had its first token of a 4,464-token prompt 2.7 s
    /// after the 0.27 s predicted, behind its own prefill, and the node (2 seats) was priced at
    /// the one stream sent before it while its twin took nine requests and waited up to 23 s.
    fn overdue(&self, now_ms: u64) -> Option<u64> {
        if !self.due_measured.load(Ordering::Relaxed) {
            return None;
        }
        let (late, wait, sent) = self.awaited(now_ms)?;
        let miss = self.miss_ms.load(Ordering::Relaxed);
        (late >= OVERDUE_MIN_MS && late > wait.max(miss)).then_some(sent)
    }

    /// The answer's `chunks`-th chunk came at `now_ms` (the first one starts the clock).
    pub fn chunk(&self, chunks: u32, now_ms: u64) {
        if self.first_ms.load(Ordering::Relaxed) == 0 {
            self.first_ms.store(now_ms.max(1), Ordering::Relaxed);
        }
        self.last_ms.store(now_ms, Ordering::Relaxed);
        self.chunks.store(chunks, Ordering::Relaxed);
    }

    /// How late (ms) its first token is at `now_ms`, or came: its seat frees that much later
    /// than predicted at its send (0: on time, not streamed, or not predicted).
    fn first_late_ms(&self, now_ms: u64) -> u64 {
        let due = self.due_ms.load(Ordering::Relaxed);
        if due == 0 {
            return 0;
        }
        match self.first_ms.load(Ordering::Relaxed) {
            0 => now_ms.saturating_sub(due),
            first => first.saturating_sub(due),
        }
    }

    /// Seconds and tokens streamed after the first chunk (`None` before a second one).
    fn streamed(&self) -> Option<(f64, u32)> {
        let first = self.first_ms.load(Ordering::Relaxed);
        let last = self.last_ms.load(Ordering::Relaxed);
        let tokens = self.chunks.load(Ordering::Relaxed).saturating_sub(1);
        (first > 0 && last > first && tokens > 0).then(|| ((last - first) as f64 / 1000.0, tokens))
    }
}

impl SeatEnds {
    /// Lease `id` is predicted to end at `end_ms` (replacing what it was predicted before);
    /// returns where its answer's progress goes.
    pub fn set(&self, id: u64, end_ms: u64) -> Arc<Progress> {
        let mut v = self.0.lock();
        match v.iter_mut().find(|(i, _, _)| *i == id) {
            Some(e) => {
                e.1 = end_ms;
                e.2.clone()
            }
            None => {
                let p = Arc::new(Progress::default());
                v.push((id, end_ms, p.clone()));
                p
            }
        }
    }

    /// Lease `id` ended.
    pub fn clear(&self, id: u64) {
        let mut v = self.0.lock();
        if let Some(k) = v.iter().position(|(i, _, _)| *i == id) {
            v.swap_remove(k);
        }
    }

    /// Seconds from `now_ms` to each end (0 for one past it; one predicted from priors only
    /// once it streams, at its pace: `Progress::paced_end_ms`), pushed to `out`, each as late as
    /// its first token is or came (a request still waiting for its first token past its due
    /// time holds its seat for its whole decode after it: a seat behind a slow prefill or a
    /// queue inside the node is not counted free at the end predicted before); and what the
    /// running answers have streamed so far, summed over those with at least
    /// `LIVE_MIN_TOKENS` chunks past their first, tokens being chunks times `per_chunk` (a
    /// server that sends several tokens per chunk is not read as slow), with the first send
    /// of those stalled before their first token, and, when one is overdue for it beside one
    /// that began (`OVERDUE_MIN_MS`), how many were sent before the first such one (`None`:
    /// none has streamed enough, none is stalled or overdue). One lock for all: routing reads
    /// them together for every pair with requests running.
    pub fn read(&self, now_ms: u64, per_chunk: f64, out: &mut Vec<f64>) -> Option<LiveDecode> {
        let mut live = LiveDecode::default();
        let mut overdue = None;
        let v = self.0.lock();
        for (_, end, p) in v.iter() {
            let end = match *end {
                END_UNKNOWN => p.paced_end_ms(per_chunk),
                end => Some(end.saturating_add(p.first_late_ms(now_ms))),
            };
            if let Some(end) = end {
                out.push(end.saturating_sub(now_ms) as f64 / 1000.0);
            }
            if let Some((secs, chunks)) = p.streamed().filter(|(_, t)| *t >= LIVE_MIN_TOKENS) {
                live.secs += secs;
                live.tokens += f64::from(chunks) * per_chunk;
                live.streams += 1;
            }
            if let Some(sent) = p.stalled(now_ms) {
                live.stalled_since_ms = Some(live.stalled_since_ms.map_or(sent, |s| s.min(sent)));
            }
            if let Some(sent) = p.overdue(now_ms) {
                overdue = Some(overdue.map_or(sent, |o: u64| o.min(sent)));
            }
        }
        if let Some(first) = overdue {
            live.seated = seated_before(&v, first);
        }
        (live.streams > 0 || live.stalled_since_ms.is_some() || live.seated.is_some())
            .then_some(live)
    }
}

/// Of the running requests, how many were sent before `first` (ms), the first one overdue
/// for its first token (`LiveDecode::seated`): it waits for one of their seats, so long as
/// one of them has begun and none sent after it has (that one's prefill was done before it:
/// it is late behind its own prefill, not a seat). Those sent without a first token predicted
/// (not streamed, seat tests, from priors: no send time kept, 0) count as before it: more
/// seats, the safe side.
fn seated_before(v: &[(u64, u64, Arc<Progress>)], first: u64) -> Option<u32> {
    let (mut before, mut begun) = (0u32, false);
    for (_, _, p) in v {
        let began = p.first_ms.load(Ordering::Relaxed) != 0;
        if p.sent_ms.load(Ordering::Relaxed) < first {
            before += 1;
            begun |= began;
        } else if began {
            return None;
        }
    }
    (begun && before > 0).then_some(before)
}

/// The end of a request predicted from priors only (they can be tens of times off): its seat
/// is not counted free at any time, but its answer's pace is read like any other.
pub const END_UNKNOWN: u64 = u64::MAX;

/// [`ModelCounters`]'s load start when the model is known to be in.
const LOADED: u64 = u64::MAX;

/// A running answer's pace is read once this many tokens have streamed after its first (fewer
/// arrive in bursts a network or a batching server makes).
pub const LIVE_MIN_TOKENS: u32 = 16;

impl ModelCounters {
    pub fn load(&self) -> ModelLoad {
        let p75 = f64::from_bits(self.p75_bits.load(Ordering::Relaxed));
        let tps = f64::from_bits(self.tps_bits.load(Ordering::Relaxed));
        // Node-reported load covers other gateways and direct clients: take the larger.
        ModelLoad {
            in_flight: self
                .in_flight
                .load(Ordering::Relaxed)
                .max(self.reported_running.load(Ordering::Relaxed)),
            pending: self
                .pending
                .load(Ordering::Relaxed)
                .max(self.reported_waiting.load(Ordering::Relaxed)),
            p75_ms: (p75 > 0.0).then_some(p75),
            observed_tps: (tps > 0.0).then_some(tps),
            loading_since_ms: match self.load_since_ms.load(Ordering::Relaxed) {
                0 | LOADED => None,
                t => Some(t),
            },
            hidden_load_since_ms: match self.hidden_load_since_ms.load(Ordering::Relaxed) {
                0 => None,
                t => Some(t),
            },
            // Only with a spell under way (the flag is left from the last one otherwise).
            hidden_load_switch: self.hidden_load_switch.load(Ordering::Relaxed)
                && self.hidden_load_since_ms.load(Ordering::Relaxed) != 0,
            displaced: false,
        }
    }

    /// A request to the pair idle past the keep-alive or displaced, on a node that hides its
    /// loads, is sent at `now_ms`: it starts a spell in which later requests wait for the same
    /// unseen load (or joins one under way). Returns how long that has been under way, seconds
    /// (0 for the one that starts it). `switch`: the spell is a swap, not an idle
    /// (`ModelLoad::hidden_load_switch`).
    pub fn hidden_load_sent(&self, now_ms: u64, switch: bool) -> f64 {
        let now = now_ms.max(1);
        now.saturating_sub(self.start_hidden_load(now, switch)) as f64 / 1000.0
    }

    /// A spell begun at `since` (`switch`: a swap or a stall), unless one is under way: when
    /// the spell under way began, ms.
    fn start_hidden_load(&self, since: u64, switch: bool) -> u64 {
        match self.hidden_load_since_ms.compare_exchange(
            0,
            since,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                self.hidden_load_switch.store(switch, Ordering::Relaxed);
                since
            }
            Err(current) => current,
        }
    }

    /// A request to the pair sent at `since_ms` was stalled before its first token when a
    /// request was placed to join it (`LiveDecode::stalled_since_ms`): a swap is taken to be
    /// under way since then (unless a spell already is), and the one sent at `now_ms` joins
    /// it. Returns how long it has been under way, seconds; `None` when the pair has sent a
    /// first byte since `since_ms` (the stall was over by the send: the request waited for a
    /// seat meanwhile), which starts nothing.
    pub fn hidden_load_stalled(&self, since_ms: u64, now_ms: u64) -> Option<f64> {
        if self.first_byte_ms.load(Ordering::Relaxed) >= since_ms {
            return None;
        }
        let start = self.start_hidden_load(since_ms.max(1), true);
        Some(now_ms.saturating_sub(start) as f64 / 1000.0)
    }

    /// A request placed to join a hidden load is sent at `now_ms`: how long the load has been
    /// under way, seconds; `None` when it is over (the request waited for a seat meanwhile).
    pub fn hidden_load_join(&self, now_ms: u64) -> Option<f64> {
        match self.hidden_load_since_ms.load(Ordering::Relaxed) {
            0 => None,
            since => Some(now_ms.saturating_sub(since) as f64 / 1000.0),
        }
    }

    /// A first byte came from the pair at `now_ms`: whatever it loaded is in. `answer`: of a
    /// successful answer (not an error's body), which is counted and kept.
    pub fn first_byte(&self, now_ms: u64, answer: bool) {
        let now = now_ms.max(1);
        self.first_byte_ms.store(now, Ordering::Relaxed);
        if answer {
            let n = self.first_bytes.fetch_add(1, Ordering::Relaxed) + 1;
            self.first_byte_ring[n as usize % FIRST_BYTES_KEPT].store(now, Ordering::Relaxed);
        }
        self.end_hidden_load(self.hidden_load_since_ms.load(Ordering::Relaxed));
    }

    /// First bytes the pair has sent so far (a request reads it at its send).
    pub fn first_bytes(&self) -> u64 {
        self.first_bytes.load(Ordering::Relaxed)
    }

    /// When the first of the pair's first bytes after the `seen`-th came (ms); `None` while
    /// there was none. Past [`FIRST_BYTES_KEPT`] since, the oldest kept (later than the first:
    /// a bound, not the time).
    pub fn first_byte_after(&self, seen: u64) -> Option<u64> {
        let now = self.first_bytes.load(Ordering::Relaxed);
        if now <= seen {
            return None;
        }
        let n = (seen + 1).max(now.saturating_sub(FIRST_BYTES_KEPT as u64 - 1));
        Some(self.first_byte_ring[n as usize % FIRST_BYTES_KEPT].load(Ordering::Relaxed))
    }

    /// The hidden-load spell that started at `since` is over (not one another request started
    /// since).
    fn end_hidden_load(&self, since: u64) {
        if since != 0 {
            let _ = self.hidden_load_since_ms.compare_exchange(
                since,
                0,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// A request that needs the model loaded is sent at `now_ms`: the first one sent while
    /// no other request holds the pair starts a load (the later ones wait for it). Returns
    /// how long that load has been under way, seconds (0 for the one that starts it).
    ///
    /// A request placed while the model was cold and sent after it came in (it waited for a
    /// seat) starts nothing and joins nothing: `None`, it goes as a warm one (its answer
    /// teaches no load: Ollama reports the few milliseconds it took to find the model in).
    pub fn load_sent(&self, now_ms: u64) -> Option<f64> {
        let now = now_ms.clamp(1, LOADED - 1);
        let current = self.load_since_ms.load(Ordering::Relaxed);
        if current == LOADED {
            return None;
        }
        // Alone on the pair it starts a load whatever start is left; beside others it starts
        // one only if none is under way.
        let alone = self.in_flight.load(Ordering::Relaxed) <= 1;
        let expected = if alone { current } else { 0 };
        match self.load_since_ms.compare_exchange(
            expected,
            now,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => Some(0.0),
            Err(LOADED) => None,
            Err(since) => Some(now.saturating_sub(since) as f64 / 1000.0),
        }
    }

    /// The model is in (a request was answered, a poll shows it loaded): no load is under way.
    pub fn load_done(&self) {
        self.load_since_ms.store(LOADED, Ordering::Relaxed);
    }

    /// The model is out (a poll shows it not loaded, the gateway unloads it): the next request
    /// for it starts a load.
    pub fn unloaded(&self) {
        self.load_since_ms.store(0, Ordering::Relaxed);
    }

    /// One request holding the pair ended. The last one to end forgets a load it started that
    /// has not come in (a request that failed before the model did leaves no start behind);
    /// `since` is what the start was before this one let go, so a load a new request started
    /// meanwhile is kept.
    pub fn lease_ended(&self) {
        let since = self.load_since_ms.load(Ordering::Relaxed);
        let hidden = self.hidden_load_since_ms.load(Ordering::Relaxed);
        if self.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            // Nobody left to wait for a hidden load: over, or failed.
            self.end_hidden_load(hidden);
            if since != LOADED {
                let _ = self.load_since_ms.compare_exchange(
                    since,
                    0,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
        }
    }

    /// Seats for this node:model (at least 1).
    pub fn seats(&self) -> u32 {
        self.limit.load(Ordering::Relaxed).max(1)
    }

    /// Record one completed request's total latency.
    pub fn observe_latency(&self, ms: f64) {
        let mut w = self.window.lock();
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        if w.len() < WINDOW {
            w.push(ms);
        } else {
            w[i % WINDOW] = ms;
        }
        // The 75th percentile by selection on a copy on the stack: no sort, no allocation
        // (this runs once per answered request).
        let mut copy = [0.0f64; WINDOW];
        let copy = &mut copy[..w.len()];
        copy.copy_from_slice(&w);
        drop(w);
        let k = (copy.len() * 3 / 4).min(copy.len() - 1);
        let (_, p75, _) = copy.select_nth_unstable_by(k, f64::total_cmp);
        self.p75_bits.store(p75.to_bits(), Ordering::Relaxed);
    }

    /// What the backend reports running and waiting for this model.
    pub fn set_reported(&self, running: u32, waiting: u32) {
        self.reported_running.store(running, Ordering::Relaxed);
        self.reported_waiting.store(waiting, Ordering::Relaxed);
    }

    /// Record one time to first token (EWMA, alpha 0.2).
    pub fn observe_ttft(&self, ms: f64) {
        ewma(&self.ttft_bits, ms);
    }

    /// EWMA of time to first token, ms.
    pub fn ttft_ms(&self) -> Option<f64> {
        let v = f64::from_bits(self.ttft_bits.load(Ordering::Relaxed));
        (v > 0.0).then_some(v)
    }

    /// Record observed output tokens/s (EWMA, alpha 0.2).
    pub fn observe_tps(&self, tps: f64) {
        ewma(&self.tps_bits, tps);
    }

    /// A streamed answer of `tokens` (the node's count) came in `chunks` chunks.
    pub fn observe_chunks(&self, tokens: u32, chunks: u32) {
        if tokens > 0 && chunks >= 2 {
            ewma(&self.per_chunk_bits, f64::from(tokens) / f64::from(chunks));
        }
    }

    /// Output tokens per streamed chunk (1 until a node's count was seen beside its chunks).
    pub fn tokens_per_chunk(&self) -> f64 {
        let v = f64::from_bits(self.per_chunk_bits.load(Ordering::Relaxed));
        if v > 0.0 {
            v
        } else {
            1.0
        }
    }
}

/// Fold `x` into an f64-bits EWMA (alpha 0.2); the first sample is taken as is.
fn ewma(slot: &AtomicU64, x: f64) {
    if !(x.is_finite() && x > 0.0) {
        return;
    }
    let old = f64::from_bits(slot.load(Ordering::Relaxed));
    let new = if old > 0.0 { old * 0.8 + x * 0.2 } else { x };
    slot.store(new.to_bits(), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hidden load: the idle pair's request starts it, one sent 300 ms later joins it, the
    /// pair's first byte ends it; a spell whose requests all ended unanswered is forgotten.
    #[test]
    fn a_hidden_load_is_started_joined_and_ended_by_a_first_byte() {
        let c = ModelCounters::default();
        assert_eq!(c.hidden_load_sent(10_000, false), 0.0);
        assert_eq!(c.load().hidden_load_since_ms, Some(10_000));
        assert_eq!(c.hidden_load_sent(10_300, false), 0.3);
        assert_eq!(c.hidden_load_join(10_500), Some(0.5));
        c.first_byte(10_600, true);
        assert_eq!(c.load().hidden_load_since_ms, None);
        assert_eq!(
            c.hidden_load_join(11_000),
            None,
            "over: a joiner starts nothing"
        );
        assert_eq!(c.load().hidden_load_since_ms, None);
        c.in_flight.store(1, Ordering::Relaxed);
        assert_eq!(c.hidden_load_sent(20_000, false), 0.0);
        c.lease_ended();
        assert_eq!(c.load().hidden_load_since_ms, None);
    }

    /// A streamed request due to start answering 50 ms after its send is stalled once it is
    /// both 250 ms and four times its 50 ms late with no first token; its first token ends
    /// the stall. The stall, seen, starts a swap spell at its send that a later request joins;
    /// one placed while it was stalled and sent after its first byte starts none.
    #[test]
    fn a_first_token_far_past_its_time_is_a_stall_and_starts_a_swap_spell() {
        let c = ModelCounters::default();
        let p = c.ends.set(1, 20_000);
        p.expect_first(10_000, 10_050, 0, true);
        let read = |now| {
            c.ends
                .read(now, 1.0, &mut Vec::new())
                .and_then(|l| l.stalled_since_ms)
        };
        assert_eq!(read(10_200), None, "150 ms late");
        assert_eq!(read(10_400), Some(10_000));
        c.in_flight.store(1, Ordering::Relaxed);
        assert_eq!(c.hidden_load_stalled(10_000, 10_500), Some(0.5));
        let l = c.load();
        assert_eq!(
            (l.hidden_load_since_ms, l.hidden_load_switch),
            (Some(10_000), true)
        );
        p.chunk(1, 10_600);
        c.first_byte(10_600, true);
        assert_eq!(read(10_700), None, "answering");
        let l = c.load();
        assert_eq!(
            (l.hidden_load_since_ms, l.hidden_load_switch),
            (None, false)
        );
        // Placed while it was stalled, sent after its first byte: over, nothing starts.
        assert_eq!(c.hidden_load_stalled(10_000, 10_800), None);
        assert_eq!(c.load().hidden_load_since_ms, None);
        // One predicted to wait long for its first token is stalled only past four times that.
        let slow = c.ends.set(2, 90_000);
        slow.expect_first(10_000, 12_000, 0, true);
        assert_eq!(read(19_000), None);
        assert_eq!(read(20_500), Some(10_000));
    }

    /// A request predicted to start answering 1 s after its send and to end 2 s after that
    /// holds its seat that long past its first token: still waiting for it 3 s late, its seat
    /// frees 2 s from now, not now; its first token 1 s late puts its end 1 s later for good.
    /// One on time, or not predicted, ends when predicted.
    #[test]
    fn a_seat_behind_a_late_first_token_frees_as_late() {
        let c = ModelCounters::default();
        let p = c.ends.set(1, 13_000);
        p.expect_first(10_000, 11_000, 0, true);
        c.ends.set(2, 15_000);
        let ends = |now| {
            let mut out = Vec::new();
            c.ends.read(now, 1.0, &mut out);
            out
        };
        assert_eq!(ends(10_500), vec![2.5, 4.5], "on time so far");
        assert_eq!(ends(14_000), vec![2.0, 1.0], "3 s late, still waiting");
        p.chunk(1, 12_000);
        assert_eq!(
            ends(14_000),
            vec![0.0, 1.0],
            "its first token came 1 s late"
        );
        assert_eq!(ends(13_500), vec![0.5, 1.5]);
    }

    /// A first token more than twice as late as predicted, beside a stream of the pair that
    /// has begun, waits for a seat: the pair runs no more at once than the requests sent
    /// before it (the last one, sent after it, queues behind it). Late with none begun (the
    /// model may be loading), by less than `OVERDUE_MIN_MS`, by no more than a miss of the
    /// prefix it was credited as cached would make it, or with one sent after it begun, it
    /// says nothing.
    #[test]
    fn a_first_token_overdue_beside_a_running_stream_says_how_many_hold_seats() {
        let c = ModelCounters::default();
        let seated = |now| {
            let mut out = Vec::new();
            c.ends.read(now, 1.0, &mut out).and_then(|l| l.seated)
        };
        let running = c.ends.set(1, 20_000);
        running.expect_first(10_000, 10_100, 0, true);
        let waiting = c.ends.set(2, 20_000);
        waiting.expect_first(10_050, 10_150, 0, true);
        let after = c.ends.set(3, 20_000);
        after.expect_first(10_060, 12_000, 0, true);
        assert_eq!(seated(10_400), None, "late, and nothing of the model began");
        running.chunk(1, 10_100);
        assert_eq!(seated(10_240), None, "90 ms late: under the floor");
        assert_eq!(seated(10_260), Some(1), "110 ms late on a 100 ms wait");
        // Credited with a cached prefix whose miss would cost 300 ms: not until it is later.
        waiting.expect_first(10_050, 10_150, 300, true);
        assert_eq!(seated(10_400), None, "250 ms late: a cache miss would be");
        assert_eq!(seated(10_460), Some(1));
        after.chunk(1, 10_470);
        assert_eq!(
            seated(10_480),
            None,
            "one sent after it began first: it is late behind its own prefill"
        );
    }

    /// A first token due at a never-observed pair's estimate is never overdue for a seat: late,
    /// it says the estimate was wrong (a prefill slower than guessed) as often as that it
    /// waits inside. It can still be stalled (a load nobody saw).
    #[test]
    fn a_first_token_late_on_an_estimate_says_nothing_of_seats() {
        let c = ModelCounters::default();
        let read = |now| {
            let mut out = Vec::new();
            c.ends.read(now, 1.0, &mut out)
        };
        let running = c.ends.set(1, 20_000);
        running.expect_first(10_000, 10_100, 0, false);
        running.chunk(1, 10_100);
        let waiting = c.ends.set(2, 20_000);
        waiting.expect_first(10_050, 10_150, 0, false);
        assert_eq!(read(10_400).and_then(|l| l.seated), None);
        assert_eq!(read(10_800).and_then(|l| l.stalled_since_ms), Some(10_050));
        // The same, due at measured rates: one seat held.
        waiting.expect_first(10_050, 10_150, 0, true);
        assert_eq!(read(10_400).and_then(|l| l.seated), Some(1));
    }

    /// An answer whose end nobody knows (priced from priors at 200 tokens) is counted by the
    /// pace it streams at once 16 tokens have come past its first: 40 tokens in 2 s, the 160
    /// left take 8 s more; past half of them it is taken to run as long again as it has
    /// (120 tokens in 6 s: 6 s more). One priced at no length, or before 16 tokens, is not
    /// counted.
    #[test]
    fn an_answer_whose_end_is_unknown_ends_at_the_pace_it_streams() {
        let c = ModelCounters::default();
        let p = c.ends.set(1, END_UNKNOWN);
        p.expect_tokens(200.0);
        let unpriced = c.ends.set(2, END_UNKNOWN);
        unpriced.chunk(1, 10_000);
        unpriced.chunk(41, 12_000);
        let ends = |now| {
            let mut out = Vec::new();
            c.ends.read(now, 1.0, &mut out);
            out
        };
        p.chunk(1, 10_000);
        p.chunk(10, 10_500);
        assert!(ends(10_500).is_empty(), "9 tokens: too few to tell");
        p.chunk(41, 12_000);
        assert_eq!(ends(12_000), vec![8.0]);
        assert_eq!(ends(13_000), vec![7.0]);
        p.chunk(121, 16_000);
        assert_eq!(ends(16_000), vec![6.0]);
    }

    /// The first cold request starts a load, a second one joins it 3 s in; once the model is in
    /// a request still marked cold from before starts nothing; out again, the next one starts
    /// a load; the last request to end forgets a load that never came in.
    #[test]
    fn a_cold_load_is_started_joined_and_forgotten() {
        let c = ModelCounters::default();
        c.in_flight.store(1, Ordering::Relaxed);
        assert_eq!(c.load_sent(10_000), Some(0.0));
        assert_eq!(c.load().loading_since_ms, Some(10_000));
        c.in_flight.store(2, Ordering::Relaxed);
        assert_eq!(c.load_sent(13_000), Some(3.0));
        c.load_done();
        assert_eq!(c.load().loading_since_ms, None);
        c.in_flight.store(3, Ordering::Relaxed);
        assert_eq!(
            c.load_sent(14_000),
            None,
            "placed cold, sent once it was in"
        );
        assert_eq!(c.load().loading_since_ms, None);
        c.unloaded();
        c.in_flight.store(1, Ordering::Relaxed);
        assert_eq!(c.load_sent(20_000), Some(0.0));
        assert_eq!(c.load().loading_since_ms, Some(20_000));
        c.lease_ended();
        assert_eq!(c.load().in_flight, 0);
        assert_eq!(
            c.load().loading_since_ms,
            None,
            "it failed before the model came in"
        );
    }

    #[test]
    fn p75_of_window() {
        let c = ModelCounters::default();
        assert_eq!(c.load().p75_ms, None);
        for ms in [100.0, 200.0, 300.0, 400.0] {
            c.observe_latency(ms);
        }
        assert_eq!(c.load().p75_ms, Some(400.0));
        for _ in 0..200 {
            c.observe_latency(50.0);
        }
        assert_eq!(
            c.load().p75_ms,
            Some(50.0),
            "old samples age out of the window"
        );
    }
}
