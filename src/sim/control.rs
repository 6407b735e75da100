//! Test-facing control of a sim node: faults, gates, stats, explicit model load/unload.

use super::models::Registry;
use super::net::{killed, ListenSlot};
use super::prefix::PrefixCache;
use super::spec::SimSpec;
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// A failure mode the node can be put in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Normal operation.
    #[default]
    None,
    /// Listening socket closed (ECONNREFUSED), open connections cut; re-bound on `None`.
    Refuse,
    /// Every inference request answers 500 with a JSON error in its protocol's shape.
    Status500,
    /// Requests are read and never answered (until the connection is cut or the node stops).
    Hang,
    /// Streams send their first chunk, then the connection is cut without the terminator.
    DieMidStream,
    /// Non-streaming replies are sent chunked; half the JSON arrives, then the connection is cut.
    CutChunked,
    /// Non-streaming replies declare their full Content-Length; half arrives, then the cut.
    CutLength,
    /// Inference requests wait this many ms before any work (and before response headers).
    SlowFirstByte(u64),
    /// The listener goes away and comes back every this many ms (Refuse, None, Refuse, ...),
    /// until another fault is set.
    Flap(u64),
}

/// Snapshot of a node's counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SimStats {
    /// Every HTTP request received (any path).
    pub requests: u64,
    /// Requests per `model` field of the body, as the client spelt it.
    pub by_model: BTreeMap<String, u64>,
    /// Requests holding a seat (loading, waiting for the first token, or generating).
    pub in_flight: u32,
    pub max_in_flight: u32,
    /// Model names, in order, of each cold load or explicit load.
    pub loads: Vec<String>,
    pub last_body_len: usize,
    pub last_path: String,
    pub last_model: String,
    /// Extension: requests waiting in the node's own backlog for a seat.
    pub queued: u32,
    /// Requests whose prompt began with a prefix found in the prefix cache.
    pub prefix_hits: u64,
    /// Prompt tokens taken from the prefix cache instead of being prefilled.
    pub prefix_tokens_reused: u64,
    /// Prompt tokens prefilled (not found in the cache).
    pub prompt_tokens_prefilled: u64,
    /// Seconds of seat time used (sum over requests of load + prefill + decode); divided by
    /// seats x wall time it gives the node's utilisation.
    pub seat_seconds: f64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Gates {
    hold_first: bool,
    hold_after: bool,
    epoch: u64,
}

/// Which gate a request parks at.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Gate {
    FirstToken,
    AfterFirstChunk,
}

/// The request was cut off (connection killed or node stopped) while waiting.
#[derive(Debug)]
pub(crate) struct Killed;

/// How long the tests' waits on the sim ([`SimControl::wait_parked`]) wait before failing.
pub const TEST_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Control handle of one node; all methods take `&self` and are thread-safe.
pub struct SimControl {
    pub(crate) spec: SimSpec,
    pub(crate) models: Mutex<Registry>,
    pub(crate) seats: Arc<Semaphore>,
    /// Per model (registry index), with `seats_per_model`.
    model_seats: Mutex<std::collections::HashMap<usize, Arc<Semaphore>>>,
    /// `prefill_parallel` permits (None: no limit).
    pub(crate) prefill: Option<Arc<Semaphore>>,
    pub(crate) slot: Arc<ListenSlot>,
    pub(crate) prefix: Mutex<PrefixCache>,
    stats: Mutex<SimStats>,
    /// Run-time slowdown factor (f64 bits): 1 normal, 2 everything computes at half speed.
    slowdown: AtomicU64,
    decoding: AtomicU32,
    fault: Arc<Mutex<Fault>>,
    gates: watch::Sender<Gates>,
    parked: watch::Sender<usize>,
    requests: watch::Sender<u64>,
    counter: AtomicU64,
}

impl SimControl {
    pub(crate) fn new(spec: SimSpec, slot: Arc<ListenSlot>) -> Self {
        let models = Registry::new(&spec);
        let seats = Arc::new(Semaphore::new(spec.seats as usize));
        let prefix = Mutex::new(PrefixCache::new(spec.prefix_cache_entries));
        let prefill = (spec.prefill_parallel > 0)
            .then(|| Arc::new(Semaphore::new(spec.prefill_parallel as usize)));
        SimControl {
            spec,
            models: Mutex::new(models),
            seats,
            model_seats: Mutex::new(std::collections::HashMap::new()),
            prefill,
            slot,
            prefix,
            stats: Mutex::new(SimStats::default()),
            slowdown: AtomicU64::new(1.0f64.to_bits()),
            decoding: AtomicU32::new(0),
            fault: Arc::new(Mutex::new(Fault::None)),
            gates: watch::channel(Gates::default()).0,
            parked: watch::channel(0).0,
            requests: watch::channel(0).0,
            counter: AtomicU64::new(0),
        }
    }

    /// Put the node in a failure mode (see [`Fault`]).
    /// The seats a request for model `idx` waits for: the node's, or the model's own
    /// (`seats_per_model`).
    pub(crate) fn seats_for(&self, idx: usize) -> Arc<Semaphore> {
        if !self.spec.seats_per_model {
            return self.seats.clone();
        }
        self.model_seats
            .lock()
            .entry(idx)
            .or_insert_with(|| Arc::new(Semaphore::new(self.spec.seats as usize)))
            .clone()
    }

    pub fn set_fault(&self, f: Fault) {
        let prev = std::mem::replace(&mut *self.fault.lock(), f);
        let was_closed = matches!(prev, Fault::Refuse | Fault::Flap(_));
        match f {
            Fault::Refuse if prev != Fault::Refuse => self.slot.close_and_kill(),
            Fault::Flap(ms) if !matches!(prev, Fault::Flap(_)) => self.spawn_flapper(ms),
            Fault::Refuse | Fault::Flap(_) => {}
            _ if was_closed => {
                if let Err(e) = self.slot.reopen() {
                    log::warn!("sim: cannot re-bind {}: {e}", self.slot.addr());
                }
            }
            _ => {}
        }
    }

    /// Toggle the listener every `ms` on a thread of its own while the fault stays `Flap`
    /// (whoever sets the next fault re-opens it).
    fn spawn_flapper(&self, ms: u64) {
        let (slot, fault) = (self.slot.clone(), self.fault.clone());
        std::thread::spawn(move || {
            let mut open = true;
            loop {
                std::thread::sleep(std::time::Duration::from_millis(ms.max(1)));
                let f = fault.lock();
                if !matches!(*f, Fault::Flap(_)) {
                    return;
                }
                if open {
                    slot.close_and_kill();
                } else if let Err(e) = slot.reopen() {
                    log::warn!("sim: flap: cannot re-bind {}: {e}", slot.addr());
                }
                open = !open;
            }
        });
    }

    /// Slow the node's compute (time to first token, prefill, decode; not cold loads) by
    /// `factor` from now on, e.g. 3.0 for a node that runs at a third of its speed (thermal
    /// throttling, another user); 1.0 restores it. Requests already decoding slow down too.
    /// A factor that is not a positive number is ignored (logged).
    pub fn set_slowdown(&self, factor: f64) {
        if !(factor.is_finite() && factor > 0.0) {
            log::warn!("sim: set_slowdown({factor}) ignored: not a positive number");
            return;
        }
        self.slowdown.store(factor.to_bits(), Ordering::Relaxed);
    }

    /// The current slowdown factor (1.0 unless [`Self::set_slowdown`] changed it).
    pub fn slowdown(&self) -> f64 {
        f64::from_bits(self.slowdown.load(Ordering::Relaxed))
    }

    /// Whether model `name` is loaded, and whether a cold load of it is in progress; `None`
    /// when the node does not have it (the placement bench's `ct-oracle` reads it).
    pub fn model_state(&self, name: &str) -> Option<(bool, bool)> {
        let reg = self.models.lock();
        let e = &reg.entries[reg.find(name)?];
        Some((e.loaded.is_some(), e.loading.is_some()))
    }

    pub(crate) fn decoding(&self) -> u32 {
        self.decoding.load(Ordering::Relaxed)
    }

    pub(crate) fn decoding_delta(&self, up: bool) {
        if up {
            self.decoding.fetch_add(1, Ordering::Relaxed);
        } else {
            let _ = self
                .decoding
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    pub(crate) fn record_prefill(&self, cached: u32, prefilled: u32) {
        let mut s = self.stats.lock();
        s.prefix_hits += u64::from(cached > 0);
        s.prefix_tokens_reused += u64::from(cached);
        s.prompt_tokens_prefilled += u64::from(prefilled);
    }

    pub(crate) fn seat_time(&self, d: Duration) {
        self.stats.lock().seat_seconds += d.as_secs_f64();
    }

    pub(crate) fn fault(&self) -> Fault {
        *self.fault.lock()
    }

    /// When on, requests park after their time-to-first-token, before their first token.
    pub fn hold_first_token(&self, on: bool) {
        self.gates.send_modify(|g| g.hold_first = on);
    }

    /// When on, streaming responses send their first chunk, then park.
    pub fn hold_after_first_chunk(&self, on: bool) {
        self.gates.send_modify(|g| g.hold_after = on);
    }

    /// Release every parked request and turn both holds off.
    pub fn release(&self) {
        self.gates.send_modify(|g| {
            g.hold_first = false;
            g.hold_after = false;
            g.epoch += 1;
        });
    }

    pub fn stats(&self) -> SimStats {
        self.stats.lock().clone()
    }

    /// Resolves once at least `n` requests are parked at a gate.
    ///
    /// # Panics
    /// After [`TEST_WAIT`] with fewer parked: this is for tests, and a request that never
    /// arrives (refused, sent elsewhere) must fail the test by name, not hang it.
    pub async fn wait_parked(&self, n: usize) {
        let mut rx = self.parked.subscribe();
        let waited = tokio::time::timeout(TEST_WAIT, rx.wait_for(|c| *c >= n)).await;
        assert!(
            waited.is_ok(),
            "sim: {} of {n} requests parked after {TEST_WAIT:?}",
            *self.parked.borrow()
        );
    }

    /// Extension: resolves once at least `n` requests have been received in total.
    /// On a current-thread runtime the counted requests have also reached their first wait
    /// (e.g. the backlog) by then; on a multi-thread runtime they may still be a step behind.
    ///
    /// # Panics
    /// After [`TEST_WAIT`] with fewer received (as [`SimControl::wait_parked`]).
    pub async fn wait_requests(&self, n: u64) {
        let mut rx = self.requests.subscribe();
        let waited = tokio::time::timeout(TEST_WAIT, rx.wait_for(|c| *c >= n)).await;
        assert!(
            waited.is_ok(),
            "sim: {} of {n} requests received after {TEST_WAIT:?}",
            *self.requests.borrow()
        );
    }

    /// Load a model now (as `ollama run` would), evicting LRU models if memory is short.
    pub fn load_model(&self, name: &str) {
        let mut reg = self.models.lock();
        let Some(i) = reg.find(name) else {
            log::warn!("sim: load_model: no model '{name}'");
            return;
        };
        let (fresh, _) = reg.mark_loaded(i);
        let canonical = reg.entries[i].spec.name.clone();
        drop(reg);
        if fresh {
            self.prefix.lock().forget_model(i);
            self.stats.lock().loads.push(canonical);
        }
    }

    /// Unload a model (as `keep_alive: 0` would).
    pub fn unload_model(&self, name: &str) {
        let mut reg = self.models.lock();
        if let Some(i) = reg.find(name) {
            reg.unload(i);
        }
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn record(&self, path: &str, body_len: usize, model: &str) {
        let n = {
            let mut s = self.stats.lock();
            s.requests += 1;
            if !model.is_empty() {
                *s.by_model.entry(model.to_string()).or_insert(0) += 1;
            }
            s.last_body_len = body_len;
            s.last_path = path.to_string();
            s.last_model = model.to_string();
            s.requests
        };
        self.requests.send_replace(n);
    }

    pub(crate) fn record_load(&self, name: &str) {
        self.stats.lock().loads.push(name.to_string());
    }

    pub(crate) fn queued_delta(&self, up: bool) {
        let mut s = self.stats.lock();
        s.queued = if up {
            s.queued + 1
        } else {
            s.queued.saturating_sub(1)
        };
    }

    pub(crate) fn in_flight_delta(&self, up: bool) {
        let mut s = self.stats.lock();
        if up {
            s.in_flight += 1;
            s.max_in_flight = s.max_in_flight.max(s.in_flight);
        } else {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
    }

    /// Park at `gate` if it is held; returns when released, or `Killed` if the node cuts connections.
    pub(crate) async fn park(&self, gate: Gate) -> Result<(), Killed> {
        let held = move |g: &Gates| match gate {
            Gate::FirstToken => g.hold_first,
            Gate::AfterFirstChunk => g.hold_after,
        };
        let mut rx = self.gates.subscribe();
        let epoch = {
            let g = rx.borrow_and_update();
            if !held(&g) {
                return Ok(());
            }
            g.epoch
        };
        let _parked = ParkedGuard::new(&self.parked);
        let release = async {
            let _ = rx.wait_for(|g| g.epoch != epoch || !held(g)).await;
        };
        self.until_killed(release).await
    }

    /// Run `fut` unless the node cuts connections first.
    pub(crate) async fn until_killed<F: std::future::Future>(
        &self,
        fut: F,
    ) -> Result<F::Output, Killed> {
        let rx = self.slot.kill_watch();
        let seen = *rx.borrow();
        tokio::select! {
            out = fut => Ok(out),
            _ = killed(rx, seen) => Err(Killed),
        }
    }
}

struct ParkedGuard<'a>(&'a watch::Sender<usize>);

impl<'a> ParkedGuard<'a> {
    fn new(tx: &'a watch::Sender<usize>) -> Self {
        tx.send_modify(|c| *c += 1);
        ParkedGuard(tx)
    }
}

impl Drop for ParkedGuard<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|c| *c = c.saturating_sub(1));
    }
}
