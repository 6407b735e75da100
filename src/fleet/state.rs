//! State changes that come from outside the poller: agent heartbeats, request outcomes
//! (breakers), admin controls, learner persistence; and the view signature `tick` compares.

use std::path::Path;

use super::{BreakerPolicy, BreakerState, Fleet, Heartbeat, LearnerStore, Outcome, Sample};
use crate::metrics::METRICS;
use crate::routing::{FleetView, Health};

/// One node's part of a [`signature`]: health, breaker, per model (breaker, seats seen), seats
/// seen, the learner's CPU-high seconds and days observed. Seats seen only where the seats
/// are assumed (routing reads them there alone).
pub(super) type NodeSignature = (Health, bool, Vec<(bool, u32)>, u32, u64, u64);

/// What time alone can change in a view: health, breakers, learning hard-pause inputs, the
/// seats seen (streams that have decoded together long enough, `queue::decoding`).
pub(super) fn signature(v: &FleetView) -> Vec<NodeSignature> {
    v.nodes
        .iter()
        .map(|n| {
            let seen = |s: u32| if n.seats_assumed { s } else { 0 };
            (
                n.health,
                n.breaker_open,
                n.models
                    .iter()
                    .map(|m| (m.breaker_open, seen(m.seats_seen)))
                    .collect(),
                seen(n.seats_seen),
                n.learning.as_ref().map_or(0, |l| l.cpu_high_for_s),
                n.learning.as_ref().map_or(0, |l| l.days_observed as u64),
            )
        })
        .collect()
}

/// A node-level admin action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Pause,
    Resume,
    Drain,
}

impl Fleet {
    fn breaker_policy(&self) -> BreakerPolicy {
        BreakerPolicy {
            failure_threshold: self.config().breaker.failure_threshold,
            cooldown_ms: self.config().breaker.cooldown.as_millis() as u64,
        }
    }

    /// Feed a request outcome. `model: None` is a node-level fault (connect refused, connect
    /// timeout); a model's faults (5xx, broken stream, read timeout) go to node:model. A
    /// success closes both.
    pub fn record_outcome(&self, idx: usize, model: Option<&str>, outcome: Outcome, now: u64) {
        let node = self.node(idx);
        let id = self.node_config(idx).id.clone();
        let p = self.breaker_policy();
        let mut changed = Vec::new();
        let node_level = model.is_none() || outcome == Outcome::Success;
        if node_level {
            if let Some(to) = node.breaker.lock().record(outcome, now, p) {
                changed.push(("-".to_string(), to));
            }
        }
        if let Some(m) = model {
            if let Some(to) = node.counters(m).breaker.lock().record(outcome, now, p) {
                changed.push((m.to_string(), to));
            }
        }
        if changed.is_empty() {
            return;
        }
        for (m, to) in &changed {
            let to_s = match to {
                BreakerState::Closed => "closed",
                BreakerState::Open => "open",
                BreakerState::HalfOpen => "half_open",
            };
            log::info!("breaker {id}:{m} -> {to_s}");
            METRICS
                .breaker_transitions
                .with_label_values(&[&id, m, to_s])
                .inc();
        }
        self.publish();
    }

    /// Take a heartbeat for a known node `idx`; feeds the learner on learning nodes.
    pub fn apply_heartbeat(&self, idx: usize, hb: Heartbeat, now: u64) {
        let node = self.node(idx);
        let miss_ms = self.config().health.heartbeat_miss.as_millis() as u64;
        // `live` is read and let go before `learner` is taken: the view (`node_view`) holds
        // `live` while it takes `learner`, so holding them the other way round here could
        // deadlock a learning node's heartbeat against a publish.
        let sample = learning_sample(&hb, &node.live.lock());
        if let Some(sample) = sample {
            if let Some(learner) = node.learner.lock().as_mut() {
                learner.observe(now, sample);
            }
        }
        node.agent.lock().apply(hb, now, miss_ms);
        self.publish();
    }

    /// Drop what node `idx`'s agent said (operator action): the node is judged by its polls
    /// alone until the next heartbeat. Returns how many heartbeats were forgotten.
    pub fn forget_agent(&self, idx: usize) -> u64 {
        let had = std::mem::take(&mut *self.node(idx).agent.lock()).received;
        self.publish();
        had
    }

    /// Pause, resume or drain node `idx` (admin API); effective at once.
    pub fn control(&self, idx: usize, c: Control) {
        let node = self.node(idx);
        {
            let mut ctl = node.control.lock();
            match c {
                Control::Pause => ctl.paused = true,
                Control::Drain => ctl.draining = true,
                Control::Resume => {
                    ctl.paused = false;
                    ctl.draining = false;
                }
            }
        }
        self.publish();
    }

    /// The learners of every learning node, for the state file.
    pub fn learner_store(&self) -> LearnerStore {
        let mut store = LearnerStore {
            version: 1,
            ..LearnerStore::default()
        };
        let configs = self.configs.load();
        for (cfg, st) in configs.iter().zip(self.nodes.load().iter()) {
            if let Some(l) = st.learner.lock().as_ref() {
                store.nodes.insert(cfg.id.clone(), l.clone());
            }
        }
        store
    }

    /// Restore learned baselines (nodes by id; nodes no longer learning are skipped).
    pub fn restore_learners(&self, store: LearnerStore) -> usize {
        let mut n = 0;
        for (id, learner) in store.nodes {
            let Some(i) = self.index_of(&id) else {
                continue;
            };
            let node = self.node(i);
            let mut slot = node.learner.lock();
            if slot.is_some() {
                *slot = Some(learner);
                n += 1;
            }
        }
        self.publish();
        n
    }

    /// Load the state file from `learning.state_dir` (when configured).
    pub fn load_learners(&self) -> Result<usize, super::StoreError> {
        match &self.config().learning.state_dir {
            Some(dir) => Ok(self.restore_learners(LearnerStore::load(dir)?)),
            None => Ok(0),
        }
    }

    /// Write the state file atomically (when configured and some node learns).
    pub fn save_learners(&self, dir: &Path) -> Result<usize, super::StoreError> {
        let store = self.learner_store();
        if store.nodes.is_empty() {
            return Ok(0);
        }
        store.save(dir)?;
        Ok(store.nodes.len())
    }
}

/// CPU and the owner's share of memory: used memory beyond what the backend's loaded models
/// hold (their resident size when polled, else their weights).
fn learning_sample(hb: &Heartbeat, live: &super::NodeLive) -> Option<Sample> {
    let total = hb.total_memory_gb.filter(|t| t.is_finite() && *t > 0.0)?;
    let free = hb.free_memory_gb.unwrap_or(total).clamp(0.0, total);
    let backend: f64 = live
        .models
        .iter()
        .filter(|m| m.loaded)
        .map(|m| m.resident_gb.unwrap_or(m.size_gb))
        .sum();
    let owner = (total - free - backend).max(0.0) / total;
    Some(Sample {
        cpu_percent: hb.cpu_percent.unwrap_or(0.0),
        owner_mem_fraction: owner,
        total_gb: total,
    })
}

impl Fleet {
    /// Every node:model pair's learned rates, for `rates.json`.
    pub fn rates_store(&self) -> super::RatesStore {
        let mut store = super::RatesStore {
            version: 1,
            ..super::RatesStore::default()
        };
        let configs = self.configs.load();
        for (cfg, st) in configs.iter().zip(self.nodes.load().iter()) {
            let sharing = *st.seat_sharing.lock();
            if sharing != super::SeatSharing::default() {
                store.seats.insert(cfg.id.clone(), sharing);
            }
            let bound = *st.seat_bound.lock();
            if bound != super::SeatBound::default() {
                store.seat_bounds.insert(cfg.id.clone(), bound);
            }
            for (model, c) in st.all_counters() {
                let own = *c.seat_bound.lock();
                if own != super::SeatBound::default() {
                    store
                        .own_seat_bounds
                        .insert(super::RatesStore::key(&cfg.id, &model), own);
                }
                let rates = c.rates.lock().clone();
                if rates != super::PairRates::default() {
                    store
                        .pairs
                        .insert(super::RatesStore::key(&cfg.id, &model), rates);
                }
            }
        }
        for (i, model, reach) in self.prefixes.reaches() {
            if let Some(cfg) = configs.get(i) {
                store
                    .prefix_reach
                    .insert(super::RatesStore::key(&cfg.id, &model), reach);
            }
        }
        store.calibration = self.calibration.samples();
        store.keep_from(&self.unplaced.lock());
        store
    }

    /// Write `rates.json` atomically (when some pair has been observed).
    pub fn save_rates(&self, dir: &Path) -> Result<usize, super::StoreError> {
        let store = self.rates_store();
        if store.pairs.is_empty()
            && store.seats.is_empty()
            && store.seat_bounds.is_empty()
            && store.own_seat_bounds.is_empty()
            && store.prefix_reach.is_empty()
            && store.calibration.is_empty()
        {
            return Ok(0);
        }
        store.save(dir)?;
        Ok(store.pairs.len())
    }

    /// Restore learned rates from `learning.state_dir`. What was saved of nodes not in the
    /// config is kept aside: a node that joins by heartbeat gets its own back when it registers
    /// ([`Fleet::restore_registered`]), and saves keep it meanwhile.
    pub fn load_rates(&self) -> Result<usize, super::StoreError> {
        let Some(dir) = self.config().learning.state_dir.clone() else {
            return Ok(0);
        };
        let mut store = super::RatesStore::load(&dir)?;
        let default = self.config().routing.chars_per_token;
        for (model, samples) in std::mem::take(&mut store.calibration) {
            self.calibration.restore(&model, &samples, default);
        }
        let mut n = 0;
        for id in self.configs.load().iter().map(|c| c.id.clone()) {
            n += self.apply_rates(store.take_node(&id));
        }
        *self.unplaced.lock() = store;
        Ok(n)
    }

    /// Node `id` just registered: give it what was saved of it before a restart.
    pub(super) fn restore_registered(&self, id: &str) {
        let mine = self.unplaced.lock().take_node(id);
        self.apply_rates(mine);
    }

    /// Apply a store's per-node entries (of nodes known now); returns the pairs restored.
    fn apply_rates(&self, store: super::RatesStore) -> usize {
        // A `node/model` key of a node known now: its index and the model.
        let pair = |key: &str| -> Option<(usize, String)> {
            let (id, model) = key.split_once('/')?;
            Some((self.index_of(id)?, model.to_string()))
        };
        let mut n = 0;
        for (key, rates) in store.pairs {
            if let Some((i, model)) = pair(&key) {
                *self.node(i).counters(&model).rates.lock() = rates;
                n += 1;
            }
        }
        for (id, sharing) in store.seats {
            if let Some(i) = self.index_of(&id) {
                *self.node(i).seat_sharing.lock() = sharing;
            }
        }
        for (id, bound) in store.seat_bounds {
            if let Some(i) = self.index_of(&id) {
                *self.node(i).seat_bound.lock() = bound;
            }
        }
        for (key, bound) in store.own_seat_bounds {
            if let Some((i, model)) = pair(&key) {
                *self.node(i).counters(&model).seat_bound.lock() = bound;
            }
        }
        for (key, reach) in store.prefix_reach {
            if let Some((i, model)) = pair(&key) {
                self.prefixes.restore_reach(i, &model, reach);
            }
        }
        n
    }
}
