//! Node registry and live state: a `FleetView` snapshot published with ArcSwap, per node and
//! node:model counters (atomics), latency windows, leases, breakers, heartbeats, admin
//! controls and capacity learning. Nodes are only ever added (registration), so an index into
//! the fleet stays valid for the life of the process.

mod breaker;
mod calibrate;
pub mod capable;
mod counters;
mod decay;
mod heartbeat;
mod learning;
mod live;
mod prefix;
mod presence;
mod rates;
pub mod recent;
mod reload;
mod sharing;
mod state;
mod statefile;
mod view;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};

pub use crate::queue::Lease;
pub use breaker::{Breaker, BreakerPolicy, BreakerState, Outcome};
pub use calibrate::Calibration;
pub use counters::{is_stall, ModelCounters, Progress, END_UNKNOWN};
pub use heartbeat::{AgentState, BackendReport, Heartbeat};
pub use learning::{Learner, LearnerStore, Sample};
pub use live::{LiveModel, NodeLive, PollReport, SeatsAsked, MAX_SEATS_ASKS};
pub use prefix::PrefixMemory;
pub use presence::{effective_health, AdminControl, HealthInputs};
pub use rates::{Observation, PairRates, RatesStore, FLOOR_TTFT_S};
pub use reload::ReloadReport;
pub use sharing::{SeatBound, SeatSharing};
pub use state::Control;
pub use statefile::StoreError;
use view::{next_due, node_view, ViewParams};

/// How often a node whose seats were learned is sent one request past them
/// (`NodeState::probe_due`).
pub const PROBE_EVERY_MS: u64 = 30_000;

use crate::config::{Config, NodeConfig};
use crate::routing::{
    FleetView, Health, LiveDecode, Loads, ModelLoad, ModelView, NodeView, PrefillLoad, Rates,
};
use crate::services::now_ms;

/// Live state of one node.
#[derive(Debug, Default)]
pub struct NodeState {
    pub in_flight: AtomicU32,
    /// What was sent to the node and is still before its first byte.
    pub prefill: crate::queue::prefill::PrefillQueue,
    /// The streams it is decoding (from their first byte to their end).
    pub decoding: crate::queue::decoding::DecodeClock,
    /// Most requests in flight on the node across its models (spec 003 hard cap).
    hard_cap: AtomicU32,
    /// Its seats, when its models share them (learned; 0: each model has its own): no more
    /// are sent at once, the rest wait in the gateway (where they can still go elsewhere),
    /// not inside the node. Unlike the hard cap, a node at this ceiling is queued for, not
    /// passed over.
    shared_seats: AtomicU32,
    /// Its seats were learned (nobody said how many: `fleet::sharing::SeatBound`): one request
    /// past them is let through every `PROBE_EVERY_MS`, so a wrong verdict, or a server
    /// restarted with more, shows (more decode at once and the count is tested afresh).
    seats_learned: std::sync::atomic::AtomicBool,
    probed_ms: std::sync::atomic::AtomicU64,
    models: RwLock<HashMap<String, Arc<ModelCounters>>>,
    pub live: Mutex<NodeLive>,
    pub agent: Mutex<AgentState>,
    pub breaker: Mutex<Breaker>,
    pub control: Mutex<AdminControl>,
    /// Some on nodes with `learning: true`.
    pub learner: Mutex<Option<Learner>>,
    /// Whether its models share its seats (learned from answers).
    pub seat_sharing: Mutex<SeatSharing>,
    /// A node whose seats nobody said: whether it runs no more than the most streams seen
    /// decoding on it at once (`decoding.most()`), learned from answers the same way.
    pub seat_bound: Mutex<SeatBound>,
    /// The model the node was last sent a request for (its counters' address; 0: none yet):
    /// every other model's pair is `ModelLoad::displaced`.
    last_sent: std::sync::atomic::AtomicUsize,
}

impl NodeState {
    /// A request for the model whose counters are `c` is sent to the node.
    pub fn sent(&self, c: &Arc<ModelCounters>) {
        self.last_sent
            .store(Arc::as_ptr(c) as usize, Ordering::Relaxed);
    }

    /// Another model was sent to the node after the last request for `c`'s.
    fn displaced(&self, c: &Arc<ModelCounters>) -> bool {
        let last = self.last_sent.load(Ordering::Relaxed);
        last != 0 && last != Arc::as_ptr(c) as usize
    }

    /// Counters for `model` on this node, created on first use.
    pub fn counters(&self, model: &str) -> Arc<ModelCounters> {
        if let Some(c) = self.models.read().get(model) {
            return c.clone();
        }
        self.models
            .write()
            .entry(model.to_string())
            .or_default()
            .clone()
    }

    /// Set the most requests in flight on the node (0: no cap).
    pub fn set_hard_cap(&self, cap: u32) {
        self.hard_cap.store(cap, Ordering::Relaxed);
    }

    pub fn hard_cap(&self) -> u32 {
        match self.hard_cap.load(Ordering::Relaxed) {
            0 => u32::MAX,
            n => n,
        }
    }

    /// The node's models share `seats` (0: they do not).
    pub fn set_shared_seats(&self, seats: u32) {
        self.shared_seats.store(seats, Ordering::Relaxed);
    }

    /// Its seats are learned ones (`seats_learned`).
    pub fn set_seats_learned(&self, learned: bool) {
        let was = self.seats_learned.swap(learned, Ordering::Relaxed);
        if learned && !was {
            // The first probe a whole period after the verdict.
            self.probed_ms
                .store(crate::services::now_ms(), Ordering::Relaxed);
        }
    }

    /// A request may go past the learned seats now (one every `PROBE_EVERY_MS`): claims the
    /// turn when it does.
    pub fn probe_due(&self, now_ms: u64) -> bool {
        if !self.seats_learned.load(Ordering::Relaxed) {
            return false;
        }
        let last = self.probed_ms.load(Ordering::Relaxed);
        now_ms.saturating_sub(last) >= PROBE_EVERY_MS
            && self
                .probed_ms
                .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Tests: a probe is due now.
    #[cfg(test)]
    pub fn probe_now(&self) {
        self.probed_ms.store(0, Ordering::Relaxed);
    }

    /// Most requests sent to the node at once: its hard cap, and its seats when its models
    /// share them.
    pub fn ceiling(&self) -> u32 {
        match self.shared_seats.load(Ordering::Relaxed) {
            0 => self.hard_cap(),
            n => n.min(self.hard_cap()),
        }
    }

    pub(crate) fn peek(&self, model: &str) -> Option<Arc<ModelCounters>> {
        self.models.read().get(model).cloned()
    }

    /// All node:model counters (for metrics and status).
    pub fn all_counters(&self) -> Vec<(String, Arc<ModelCounters>)> {
        let mut v: Vec<_> = self
            .models
            .read()
            .iter()
            .map(|(k, c)| (k.clone(), c.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// The fleet: node config, live state per node, and the current routing snapshot.
pub struct Fleet {
    /// The configuration in force; `reload` swaps it.
    config: ArcSwap<Config>,
    /// The configuration the process started with: its listeners and threads are the ones
    /// running, whatever reloads came since.
    started: Arc<Config>,
    /// The file it came from, for reloads (None: built from text, e.g. in tests).
    config_path: Mutex<Option<std::path::PathBuf>>,
    configs: ArcSwap<Vec<Arc<NodeConfig>>>,
    nodes: ArcSwap<Vec<Arc<NodeState>>>,
    /// Serialises registrations (the only writer of `configs`/`nodes`).
    registering: Mutex<()>,
    view: ArcSwap<FleetView>,
    /// When time alone next changes the view (a warmup or cooldown ends, a heartbeat goes
    /// stale), ms; `view()` republishes once it has passed.
    next_due_ms: AtomicU64,
    /// Per-model chars-per-token, from the `usage` nodes report.
    pub calibration: Calibration,
    /// Woken whenever the snapshot changes (the holding queue rescans then).
    pub changed: tokio::sync::Notify,
    /// Requests waiting in this gateway (node:model queues and the holding queue).
    pub board: Arc<crate::queue::Board>,
    /// Background actions in progress (pre-warm loads, pulls), one per key.
    pub ops: crate::services::ops::Ops,
    /// The last decisions and per node:model traffic, for the fleet page.
    pub recent: recent::Recent,
    /// Per-tenant limits state and usage.
    pub tenants: crate::tenant::Book,
    /// Which node holds each conversation's prefix (completion mode's cache credit).
    pub prefixes: PrefixMemory,
    /// Client connections and buffered request bodies (`clients:`).
    pub clients: Arc<crate::clients::ClientGuards>,
    /// When this process began watching the fleet, ms: a model it saw asked for at most once
    /// has been asked for about once in the time since.
    pub watching_since_ms: u64,
    /// (node id, model) pairs the gateway unloaded to make room for a request's cold load:
    /// completion mode reads one back once that pays (`services::prewarm`).
    pub evicted: Mutex<std::collections::HashSet<(String, String)>>,
    /// What `rates.json` held of nodes not registered (yet): kept for when they join by
    /// heartbeat, and in every save until then.
    unplaced: Mutex<RatesStore>,
}

impl Fleet {
    pub fn new(config: Arc<Config>) -> Arc<Fleet> {
        let configs: Vec<_> = config.nodes.iter().cloned().map(Arc::new).collect();
        let nodes = configs.iter().map(|c| Arc::new(new_state(c))).collect();
        let fleet = Fleet {
            started: config.clone(),
            config: ArcSwap::new(config),
            config_path: Mutex::new(None),
            configs: ArcSwap::from_pointee(configs),
            nodes: ArcSwap::from_pointee(nodes),
            registering: Mutex::new(()),
            view: ArcSwap::from_pointee(FleetView::default()),
            next_due_ms: AtomicU64::new(u64::MAX),
            calibration: Calibration::default(),
            changed: tokio::sync::Notify::new(),
            board: Arc::default(),
            tenants: crate::tenant::Book::default(),
            ops: Default::default(),
            recent: Default::default(),
            prefixes: PrefixMemory::default(),
            clients: Arc::default(),
            watching_since_ms: now_ms(),
            evicted: Mutex::default(),
            unplaced: Mutex::default(),
        };
        fleet.publish();
        Arc::new(fleet)
    }

    /// The configuration the process started with (what is bound and running).
    pub fn started_config(&self) -> &Config {
        &self.started
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Remember the file the configuration came from, for reloads.
    pub fn set_config_path(&self, path: std::path::PathBuf) {
        *self.config_path.lock() = Some(path);
    }

    pub fn config_path(&self) -> Option<std::path::PathBuf> {
        self.config_path.lock().clone()
    }

    /// Every node's live state, by index (same order as the view).
    pub fn nodes(&self) -> Arc<Vec<Arc<NodeState>>> {
        self.nodes.load_full()
    }

    /// Node `idx`'s live state. Indices come from a published view: always valid.
    pub fn node(&self, idx: usize) -> Arc<NodeState> {
        self.nodes.load()[idx].clone()
    }

    pub fn node_config(&self, idx: usize) -> Arc<NodeConfig> {
        self.configs.load()[idx].clone()
    }

    pub fn len(&self) -> usize {
        self.configs.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many times faster than it decodes a node prefills (prompt tokens/s over output
    /// tokens/s of one stream) and the TTFT no prompt explains: the medians over every pair
    /// that measured both; else `prior` and 0. What a first answer's own decode speed says
    /// its prefill took, when nothing was measured for its pair (`routing::IdleExpect`).
    pub fn prefill_per_decode(&self, prior: f64) -> (f64, f64) {
        let (mut ratios, mut overheads) = (Vec::new(), Vec::new());
        for node in self.nodes().iter() {
            for (_, c) in node.all_counters() {
                let r = c.rates.lock().rates();
                if let (Some(tps), Some(spt), false) =
                    (r.prefill_tps, r.decode_spt, r.prefill_floor)
                {
                    ratios.push(tps * spt);
                    overheads.push(r.prefill_overhead_s.max(0.0));
                }
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.retain(|x| x.is_finite());
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied()
        };
        match (median(&mut ratios), median(&mut overheads)) {
            (Some(r), Some(o)) if r > 0.0 => (r, o),
            _ => (prior, 0.0),
        }
    }

    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.configs.load().iter().position(|n| n.id == id)
    }

    /// Add a node (a heartbeat from an unknown node with registration on); returns its index.
    /// An id that is already known returns the existing index.
    pub fn register(&self, cfg: NodeConfig) -> usize {
        let _guard = self.registering.lock();
        if let Some(i) = self.index_of(&cfg.id) {
            return i;
        }
        crate::metrics::register_nodes([cfg.id.as_str()]);
        let id = cfg.id.clone();
        let cfg = Arc::new(cfg);
        let mut nodes = Vec::clone(&self.nodes.load());
        nodes.push(Arc::new(new_state(&cfg)));
        let mut configs = Vec::clone(&self.configs.load());
        configs.push(cfg);
        // Nodes first: a reader that sees the new config always finds its state.
        self.nodes.store(Arc::new(nodes));
        self.configs.store(Arc::new(configs));
        self.restore_registered(&id);
        self.publish();
        self.len() - 1
    }

    /// Replace node `idx`'s settings (a reload); its live state stays.
    fn replace_node_config(&self, idx: usize, cfg: NodeConfig) {
        let _guard = self.registering.lock();
        let mut configs = Vec::clone(&self.configs.load());
        configs[idx] = Arc::new(cfg);
        self.configs.store(Arc::new(configs));
        // Its URL or backend may have changed: what the server said of its seats is asked anew.
        self.node(idx).live.lock().seats_asked = live::SeatsAsked::Unasked;
    }

    fn store_config(&self, config: Arc<Config>) {
        self.config.store(config);
        self.publish();
    }

    /// Routing's priors for node `idx`'s `model` (prompt tokens/s, seconds per output token;
    /// 0: none): what splits the time of an answer that was neither streamed nor timed.
    pub fn rate_priors(&self, idx: usize, model: &str) -> (f64, f64) {
        self.view()
            .nodes
            .get(idx)
            .and_then(|n| Some((n, n.model(model)?)))
            .map_or((0.0, 0.0), |(n, m)| {
                crate::routing::priors(&self.config().routing.policy, n, m)
            })
    }

    /// The current routing snapshot.
    pub fn view(&self) -> Arc<FleetView> {
        if now_ms() >= self.next_due_ms.load(Ordering::Relaxed) {
            self.publish();
        }
        self.view.load_full()
    }

    /// Failover: a seat on node:model now, without queueing (the request has waited its
    /// turn already), or None when its breaker turns it away or it has no free seat. Seats
    /// and the hard cap hold as for any request.
    pub fn try_lease(&self, idx: usize, model: &str) -> Option<Lease> {
        if !self.on_dispatch(idx, model) {
            return None;
        }
        let node = self.node(idx);
        crate::queue::take_now(idx, &node, &node.counters(model))
    }

    /// Ask for a seat on node:model: at once or a place in its queue (Stage 3).
    pub fn acquire(&self, idx: usize, model: &str) -> crate::queue::Acquire {
        if !self.on_dispatch(idx, model) {
            return crate::queue::Acquire::Refused;
        }
        crate::queue::acquire(idx, &self.node(idx), model)
    }

    /// `acquire` for a tenant's request: seats go to waiting tenants in weighted fair order.
    pub fn acquire_as(
        &self,
        idx: usize,
        model: &str,
        share: &crate::queue::Share,
    ) -> crate::queue::Acquire {
        if !self.on_dispatch(idx, model) {
            return crate::queue::Acquire::Refused;
        }
        crate::queue::acquire_as(idx, &self.node(idx), model, share)
    }

    /// A request is being sent to node:model: false when a breaker turns it away (open, or
    /// half-open with the trial already out); otherwise a half-open breaker makes it the one
    /// trial. Both breakers are checked and marked under their locks, so two requests decided
    /// at the same moment cannot both be the trial.
    fn on_dispatch(&self, idx: usize, model: &str) -> bool {
        let node = self.node(idx);
        let now = now_ms();
        let counters = node.peek(model);
        let mut node_breaker = node.breaker.lock();
        let mut model_breaker = counters.as_ref().map(|c| c.breaker.lock());
        let admitted =
            node_breaker.admits(now) && model_breaker.as_ref().is_none_or(|b| b.admits(now));
        let mut changed = !admitted;
        if admitted {
            changed |= node_breaker.on_dispatch(now);
            changed |= model_breaker.as_mut().is_some_and(|b| b.on_dispatch(now));
        }
        drop((node_breaker, model_breaker));
        if changed {
            self.publish();
        }
        admitted
    }

    /// Apply one poll result for node `idx`; returns true when routing-relevant state changed.
    pub fn apply_poll(&self, idx: usize, report: PollReport, failures_before_offline: u32) -> bool {
        let node = self.node(idx);
        if let PollReport::Ok { models, .. } = &report {
            for m in models {
                if m.running.is_some() || m.waiting.is_some() {
                    node.counters(&m.name)
                        .set_reported(m.running.unwrap_or(0), m.waiting.unwrap_or(0));
                }
                if let Some(c) = node.peek(&m.name) {
                    if m.loaded {
                        c.load_done();
                    } else if !c.load().busy() {
                        // Out, and no request waits for it (one that does is waiting for a
                        // load the poll does not show yet).
                        c.unloaded();
                    }
                }
            }
        }
        let (changed, before, after) = {
            let mut live = node.live.lock();
            let before = live::Seen::of(&live);
            let changed = live.apply(report, failures_before_offline);
            (changed, before, live::Seen::of(&live))
        };
        if changed {
            for line in before.changes(&after) {
                log::info!("node {}: {line}", self.node_config(idx).id);
            }
            self.publish();
        }
        changed
    }

    /// The node answered a request for `model` with success: it is loaded there now, whatever
    /// the last poll said (a cold load just happened). Routing sees it at once, not at the
    /// next poll, so a burst for a cold model queues at the node that loaded it.
    /// Node `idx` answered `status` ("not here") for `endpoint` on `model`: routing leaves
    /// that pair out for it until the recheck ([`capable::RECHECK_MS`]).
    pub fn mark_not_capable(
        &self,
        idx: usize,
        model: &str,
        endpoint: &'static str,
        status: u16,
        now: u64,
    ) {
        if self
            .node(idx)
            .counters(model)
            .not_capable
            .mark(endpoint, now)
        {
            log::info!(
                "node {}: {model} not capable of {endpoint} (answered {status}); rechecked in {} s",
                self.node_config(idx).id,
                capable::RECHECK_MS / 1000
            );
            self.publish();
        }
    }

    pub fn mark_loaded(&self, idx: usize, model: &str) {
        if let Some(c) = self.node(idx).peek(model) {
            c.load_done();
        }
        {
            let node = self.node(idx);
            let mut live = node.live.lock();
            if !live.polled {
                return;
            }
            match live.models.iter_mut().find(|m| m.name == model) {
                Some(m) if m.loaded => return,
                Some(m) => {
                    m.loaded = true;
                    m.unloaded_at_ms = None;
                }
                None => live.models.push(LiveModel {
                    name: model.to_string(),
                    loaded: true,
                    on_disk: true,
                    ..LiveModel::default()
                }),
            }
        }
        self.publish();
    }

    /// The gateway is about to unload `model` from node `idx` (to make room for a cold load):
    /// routing sees it unloaded at once, its memory free, instead of at the next poll. False
    /// (nothing changed) when it is not loaded as far as the gateway knows, or a request is
    /// running or waiting for it: another request unloaded it first, or it is in use again.
    pub fn claim_unload(&self, idx: usize, model: &str, now_ms: u64) -> bool {
        {
            let node = self.node(idx);
            if node.peek(model).is_some_and(|c| c.load().busy()) {
                return false;
            }
            let mut live = node.live.lock();
            let Some(m) = live.models.iter_mut().find(|m| m.name == model && m.loaded) else {
                return false;
            };
            m.loaded = false;
            m.unloaded_at_ms = Some(now_ms);
            if let Some(c) = node.peek(model) {
                c.unloaded();
            }
            let freed = m.resident_gb.unwrap_or(m.size_gb);
            if let Some(free) = live.free_memory_gb.as_mut() {
                *free += freed;
            }
        }
        self.publish();
        true
    }

    /// Republish when the streams node `idx` (or its pair of `model`) is seen to run at once
    /// (`DecodeClock::seen`) differ from what the view shows, on a node whose seats nobody
    /// said: routing tests it against that count (`NodeView::seats_seen`), and a model's own
    /// count on such a node that serves several (`ModelView::seats_seen`). Where the seats are
    /// known nothing routes by it (nor wakes the holding queue for it).
    pub fn publish_seats_seen(&self, idx: usize, model: &str, now_ms: u64) {
        let view = self.view();
        let Some(shown) = view.nodes.get(idx).filter(|n| n.seats_assumed) else {
            return;
        };
        let node = self.node(idx);
        let pair = node.peek(model).map(|p| p.decoding.seen(now_ms));
        let differs = shown.seats_seen != node.decoding.seen(now_ms)
            || pair
                .zip(shown.model(model))
                .is_some_and(|(seen, m)| m.seats_seen != seen);
        drop(view);
        if differs {
            self.publish();
        }
    }

    /// Rebuild the routing snapshot from config + live state.
    pub fn publish(&self) {
        self.store_view(self.build_view(now_ms()));
    }

    /// Make `view` current: seats follow it, waiters are woken.
    fn store_view(&self, view: FleetView) {
        let states = self.nodes.load();
        for (idx, (v, st)) in view.nodes.iter().zip(states.iter()).enumerate() {
            self.set_seats(idx, v, st);
        }
        self.view.store(Arc::new(view));
        self.changed.notify_waiters();
    }

    /// Seats per node:model and the node's hard cap, from the new snapshot; frees waiters
    /// when seats grew.
    fn set_seats(&self, idx: usize, view: &NodeView, st: &Arc<NodeState>) {
        let cfg = self.node_config(idx);
        let reported = st.live.lock().seats;
        let known = crate::queue::seats::known(cfg.seats, reported, cfg.backend).map(|k| k.0);
        let held: f64 = view
            .models
            .iter()
            .filter(|m| m.loaded)
            .map(|m| m.resident_gb.unwrap_or(m.size_gb))
            .sum();
        let available = view
            .free_memory_gb
            .or((view.memory_gb > 0.0).then_some(view.memory_gb - held));
        st.set_hard_cap(view.hard_cap);
        st.set_shared_seats(if view.seats_shared { view.seats } else { 0 });
        st.set_seats_learned(view.seats_assumed && view.seats_shared);
        for m in &view.models {
            let model_gb = m.resident_gb.unwrap_or(m.size_gb);
            let extra = if m.loaded { model_gb } else { 0.0 };
            let seats = crate::queue::seats::derive(known, available.map(|a| a + extra), model_gb);
            st.counters(&m.name).limit.store(seats, Ordering::Relaxed);
        }
        crate::queue::pump(idx, st);
    }

    /// The view as of `now`; also records when time alone will next change it.
    fn build_view(&self, now: u64) -> FleetView {
        let params = self.view_params();
        let configs = self.configs.load();
        let nodes = self.nodes.load();
        let mut due = u64::MAX;
        let mut nodes: Vec<_> = configs
            .iter()
            .zip(nodes.iter())
            .map(|(cfg, st)| {
                due = due.min(next_due(st, now, &params).unwrap_or(u64::MAX));
                node_view(cfg, st, now, &params)
            })
            .collect();
        view::peer_load_speeds(&mut nodes);
        self.next_due_ms.store(due, Ordering::Relaxed);
        FleetView { nodes }
    }

    fn view_params(&self) -> ViewParams {
        ViewParams {
            warmup_ms: self.config().health.warmup.as_millis() as u64,
            miss_ms: self.config().health.heartbeat_miss.as_millis() as u64,
            shared_prior: self.config().routing.policy.completion_seats_shared_prior,
        }
    }

    /// Republish when time alone changed what routing sees (warmup over, heartbeat missed,
    /// breaker cooldown over). Returns true when it did.
    pub fn tick(&self, now: u64) -> bool {
        let fresh = self.build_view(now);
        let old = self.view.load();
        if state::signature(&fresh) == state::signature(&old) {
            return false;
        }
        self.store_view(fresh);
        true
    }
}

/// The live state a node starts with (a learner when learning is on).
fn new_state(cfg: &NodeConfig) -> NodeState {
    let st = NodeState::default();
    if cfg.learning {
        *st.learner.lock() = Some(Learner::default());
    }
    st
}

impl Loads for Fleet {
    fn watching_since_ms(&self) -> u64 {
        self.watching_since_ms
    }

    fn node_in_flight(&self, node: usize) -> u32 {
        self.nodes
            .load()
            .get(node)
            .map_or(0, |n| n.in_flight.load(Ordering::Relaxed))
    }

    fn node_decoding(&self, node: usize) -> u32 {
        self.nodes
            .load()
            .get(node)
            .map_or(0, |n| n.decoding.streams())
    }

    fn node_prefilling(&self, node: usize) -> PrefillLoad {
        self.nodes
            .load()
            .get(node)
            .map_or_else(PrefillLoad::default, |n| n.prefill.load())
    }

    fn model(&self, node: usize, model: &str) -> ModelLoad {
        self.nodes
            .load()
            .get(node)
            .and_then(|n| {
                let c = n.peek(model)?;
                Some(ModelLoad {
                    displaced: n.displaced(&c),
                    ..c.load()
                })
            })
            .unwrap_or_default()
    }

    fn rates(&self, node: usize, model: &str) -> Rates {
        self.nodes
            .load()
            .get(node)
            .and_then(|n| n.peek(model))
            .map_or_else(Rates::default, |c| c.rates.lock().rates())
    }

    fn loading(&self, node: usize, model: &str) -> bool {
        self.ops
            .is_running(&crate::services::prewarm::load_key(node, model))
    }

    fn seat_ends(
        &self,
        node: usize,
        model: &str,
        now_ms: u64,
        out: &mut Vec<f64>,
    ) -> Option<LiveDecode> {
        let nodes = self.nodes.load();
        let n = nodes.get(node)?;
        let c = n.peek(model)?;
        let live = c.ends.read(now_ms, c.tokens_per_chunk(), out)?;
        Some(LiveDecode {
            node_decoding: n.decoding.streams(),
            ..live
        })
    }
}

impl Fleet {
    /// True when the node answered its last poll(s).
    pub fn is_up(&self, idx: usize) -> bool {
        self.node(idx).live.lock().health != Health::Offline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polled(models: &[(&str, bool)]) -> Arc<Fleet> {
        let yaml = "fleet:\n  nodes:\n    - id: a\n      url: http://127.0.0.1:9\n      backend: ollama\n      capacity: 4\n";
        let fleet = Fleet::new(Arc::new(crate::config::Config::from_yaml(yaml).unwrap()));
        let models = models
            .iter()
            .map(|(name, loaded)| LiveModel {
                name: name.to_string(),
                size_gb: 10.0,
                resident_gb: loaded.then_some(11.0),
                loaded: *loaded,
                on_disk: true,
                ..LiveModel::default()
            })
            .collect();
        let report = PollReport::Ok {
            models,
            seats: None,
            now_ms: 1_000,
        };
        fleet.apply_poll(0, report, 1);
        fleet
    }

    /// A fresh state directory (`name` and this process's id) and a one-node fleet's config
    /// that keeps its learned state there.
    fn state_dir_fleet(name: &str) -> (std::path::PathBuf, String) {
        let dir = std::env::temp_dir().join(format!("fleetgate-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let yaml = format!(
            "learning:\n  state_dir: {}\nfleet:\n  nodes:\n    - id: a\n      url: http://127.0.0.1:9\n      backend: ollama\n",
            dir.display()
        );
        (dir, yaml)
    }

    /// What the gateway learned of its prompts' sizes and of a node's prefix cache survives a
    /// restart: a gateway started on the same state directory estimates a prompt as the first
    /// had learned to (not at the configured chars per token), and credits the node's cache as
    /// many prompts back.
    #[test]
    fn prompt_calibration_and_cache_reach_survive_a_restart() {
        let (dir, yaml) = state_dir_fleet("calib");
        let start = || Fleet::new(Arc::new(crate::config::Config::from_yaml(&yaml).unwrap()));
        let first = start();
        let default = first.config().routing.chars_per_token;
        // Dense text: 3 characters a token, the default reads 4.
        for i in 0..10u32 {
            let chars = 3_000 + 300 * i as usize;
            first
                .calibration
                .observe("m", chars, 1_000 + 100 * i, 0, default, true);
        }
        first.prefixes.cache_seen(0, "m", 20, true);
        let learned = first.calibration.text_tokens("m", 6_000, default);
        assert_eq!(learned, 2_000);
        assert!(first.save_rates(&dir).is_ok());

        let second = start();
        assert_eq!(second.calibration.text_tokens("m", 6_000, default), 1_500);
        assert!(second.load_rates().is_ok());
        assert_eq!(second.calibration.text_tokens("m", 6_000, default), learned);
        assert_eq!(second.prefixes.reach(0, "m"), 21);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// What was learned of a node that joined by heartbeat (not in the config file) waits for
    /// it after a restart: saves keep it meanwhile, and it is the node's again once it
    /// registers.
    #[test]
    fn what_was_learned_of_a_registered_node_waits_for_it_after_a_restart() {
        let (dir, yaml) = state_dir_fleet("joined");
        let start = || Fleet::new(Arc::new(crate::config::Config::from_yaml(&yaml).unwrap()));
        let joined = || {
            crate::config::NodeConfig::dynamic(
                "b",
                "http://127.0.0.1:10",
                crate::config::Backend::Ollama,
                None,
                None,
                512,
            )
            .unwrap()
        };
        let first = start();
        let b = first.register(joined());
        first
            .node(b)
            .counters("m")
            .rates
            .lock()
            .observe(&rates::Observation {
                now_ms: 1_000,
                prompt_tokens: 500,
                output_tokens: Some(100),
                ttft_s: Some(0.1),
                service_s: 1.1,
                concurrency: 1,
                ..rates::Observation::default()
            });
        first.prefixes.cache_seen(b, "m", 20, true);
        assert!(first.save_rates(&dir).is_ok());

        let second = start();
        assert!(second.load_rates().is_ok());
        // Saved again before the node is back: still there.
        assert!(second.save_rates(&dir).is_ok());
        let third = start();
        assert!(third.load_rates().is_ok());
        let b = third.register(joined());
        assert_eq!(third.node(b).counters("m").rates.lock().rates().observed, 1);
        assert_eq!(third.prefixes.reach(b, "m"), 21);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An unload the gateway is about to send shows in routing's view at once, once: a second
    /// claim (another cold load choosing the same victim), a model not loaded and a model a
    /// request has taken up since are refused.
    #[test]
    fn a_claimed_unload_shows_at_once_and_only_for_an_idle_loaded_model() {
        let fleet = polled(&[("idle", true), ("busy", true), ("cold", false)]);
        let seat = fleet.try_lease(0, "busy").expect("a free seat");
        assert!(fleet.claim_unload(0, "idle", 2_000));
        let m = fleet.view().nodes[0].model("idle").cloned().unwrap();
        assert!(!m.loaded);
        assert_eq!(m.unloaded_at_ms, Some(2_000));
        assert!(!fleet.claim_unload(0, "idle", 2_001), "already claimed");
        assert!(!fleet.claim_unload(0, "cold", 2_001), "not loaded");
        assert!(!fleet.claim_unload(0, "busy", 2_001), "a request holds it");
        assert!(fleet.view().nodes[0].model("busy").unwrap().loaded);
        drop(seat);
        assert!(fleet.claim_unload(0, "busy", 2_002), "idle again");
    }

    /// Once a request for another model is sent to the node, every model but that one reads
    /// as displaced (a server that swaps may have pushed it out), until it is sent one itself.
    #[test]
    fn a_model_reads_as_displaced_once_another_is_sent_to_its_node() {
        let fleet = polled(&[("x", true), ("y", true)]);
        let (x, y) = (fleet.node(0).counters("x"), fleet.node(0).counters("y"));
        let displaced = |m: &str| Loads::model(&*fleet, 0, m).displaced;
        assert!(!displaced("x") && !displaced("y"), "nothing sent yet");
        fleet.node(0).sent(&x);
        assert!(!displaced("x") && displaced("y"));
        fleet.node(0).sent(&y);
        assert!(displaced("x") && !displaced("y"));
    }

    /// A cold load observed on the node (11 GB resident in 2 s) shows in the view as the
    /// node's read speed, for the models it has not loaded.
    #[test]
    fn the_view_carries_the_read_speed_the_nodes_loads_showed() {
        let fleet = polled(&[("seen", true), ("cold", false)]);
        assert_eq!(fleet.view().nodes[0].learned_load_gbps, None);
        let o = crate::fleet::Observation {
            now_ms: 2_000,
            cold: true,
            service_s: 2.5,
            load_s: Some(2.0),
            ..Default::default()
        };
        fleet.node(0).counters("seen").rates.lock().observe(&o);
        fleet.publish();
        let gbps = fleet.view().nodes[0].learned_load_gbps.expect("learned");
        assert!((gbps - 5.5).abs() < 1e-9, "{gbps}");
    }

    /// A node that has loaded nothing is expected to read at the speed the nodes that did showed
    /// (their harmonic mean: seconds per GB averaged); none loaded anything: no guess.
    #[test]
    fn a_node_that_loaded_nothing_reads_at_its_peers_speed() {
        let node = |gbps: Option<f64>| crate::routing::NodeView {
            learned_load_gbps: gbps,
            ..Default::default()
        };
        let mut nodes = vec![node(Some(4.0)), node(Some(12.0)), node(None)];
        view::peer_load_speeds(&mut nodes);
        assert_eq!(
            (nodes[0].peer_load_gbps, nodes[1].peer_load_gbps),
            (None, None)
        );
        let peers = nodes[2].peer_load_gbps.expect("peers loaded");
        assert!((peers - 6.0).abs() < 1e-9, "{peers}");
        let mut none = vec![node(None), node(None)];
        view::peer_load_speeds(&mut none);
        assert!(none.iter().all(|n| n.peer_load_gbps.is_none()));
    }

    /// A learning node's heartbeats and the view being published at once finish: the
    /// heartbeat took the learner, then the node's live state, while the publish holds the
    /// live state and takes the learner (it deadlocked within 3,000 rounds each, every run).
    #[test]
    fn heartbeats_and_publishes_at_once_do_not_deadlock() {
        let yaml = "fleet:\n  nodes:\n    - id: a\n      url: http://127.0.0.1:9\n      backend: ollama\n      learning: true\n";
        let fleet = Fleet::new(Arc::new(crate::config::Config::from_yaml(yaml).unwrap()));
        let hb: Heartbeat = serde_json::from_value(serde_json::json!({
            "node_id": "a", "backend_url": "http://127.0.0.1:9",
            "free_memory_gb": 20.0, "total_memory_gb": 64.0
        }))
        .unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        let beats = {
            let (fleet, done) = (fleet.clone(), done.clone());
            std::thread::spawn(move || {
                for i in 0..3_000 {
                    fleet.apply_heartbeat(0, hb.clone(), 1_000 + i);
                }
                let _ = done.send(());
            })
        };
        let views = std::thread::spawn(move || {
            for _ in 0..3_000 {
                fleet.publish();
            }
            let _ = done.send(());
        });
        for _ in 0..2 {
            finished
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("heartbeats and publishes deadlocked");
        }
        beats.join().unwrap();
        views.join().unwrap();
    }
}
