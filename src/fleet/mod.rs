//! Node registry and live state: a `FleetView` snapshot published with ArcSwap, per node and
//! node:model counters (atomics), latency windows, leases.

mod counters;
mod live;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};

pub use crate::queue::Lease;
pub use counters::ModelCounters;
pub use live::{LiveModel, NodeLive, PollReport};

use crate::config::{Config, NodeConfig};
use crate::routing::{FleetView, Health, Loads, ModelLoad, ModelView, NodeView};

/// Live state of one node.
#[derive(Debug, Default)]
pub struct NodeState {
    pub in_flight: AtomicU32,
    /// Most requests in flight on the node across its models (spec 003 hard cap).
    hard_cap: AtomicU32,
    models: RwLock<HashMap<String, Arc<ModelCounters>>>,
    pub live: Mutex<NodeLive>,
}

impl NodeState {
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

    pub fn hard_cap(&self) -> u32 {
        match self.hard_cap.load(Ordering::Relaxed) {
            0 => u32::MAX,
            n => n,
        }
    }

    fn peek(&self, model: &str) -> Option<Arc<ModelCounters>> {
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

/// The fleet: static node config, live state per node, and the current routing snapshot.
pub struct Fleet {
    pub config: Arc<Config>,
    nodes: Vec<Arc<NodeState>>,
    view: ArcSwap<FleetView>,
    /// Woken whenever the snapshot changes (the holding queue rescans then).
    pub changed: tokio::sync::Notify,
    /// Requests waiting in this gateway (node:model queues and the holding queue).
    pub board: Arc<crate::queue::Board>,
    /// Background actions in progress (pre-warm loads, pulls), one per key.
    pub ops: crate::services::ops::Ops,
}

impl Fleet {
    pub fn new(config: Arc<Config>) -> Arc<Fleet> {
        let nodes = config
            .nodes
            .iter()
            .map(|_| Arc::new(NodeState::default()))
            .collect();
        let fleet = Fleet {
            config,
            nodes,
            view: ArcSwap::from_pointee(FleetView::default()),
            changed: tokio::sync::Notify::new(),
            board: Arc::default(),
            ops: Default::default(),
        };
        fleet.publish();
        Arc::new(fleet)
    }

    pub fn nodes(&self) -> &[Arc<NodeState>] {
        &self.nodes
    }

    pub fn node_config(&self, idx: usize) -> &NodeConfig {
        &self.config.nodes[idx]
    }

    pub fn index_of(&self, id: &str) -> Option<usize> {
        self.config.nodes.iter().position(|n| n.id == id)
    }

    /// The current routing snapshot.
    pub fn view(&self) -> Arc<FleetView> {
        self.view.load_full()
    }

    /// Take a seat on node:model without queueing (failover); released when the lease drops.
    pub fn lease(&self, idx: usize, model: &str) -> Lease {
        Lease::force(idx, &self.nodes[idx], self.nodes[idx].counters(model))
    }

    /// Ask for a seat on node:model: at once or a place in its queue (Stage 3).
    pub fn acquire(&self, idx: usize, model: &str) -> crate::queue::Acquire {
        crate::queue::acquire(idx, &self.nodes[idx], model)
    }

    /// Apply one poll result for node `idx`; returns true when routing-relevant state changed.
    pub fn apply_poll(&self, idx: usize, report: PollReport, failures_before_offline: u32) -> bool {
        let changed = self.nodes[idx]
            .live
            .lock()
            .apply(report, failures_before_offline);
        if changed {
            self.publish();
        }
        changed
    }

    /// The node answered a request for `model` with success: it is loaded there now, whatever
    /// the last poll said (a cold load just happened). Routing sees it at once, not at the
    /// next poll, so a burst for a cold model queues at the node that loaded it.
    pub fn mark_loaded(&self, idx: usize, model: &str) {
        {
            let mut live = self.nodes[idx].live.lock();
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

    /// Rebuild the routing snapshot from config + live state.
    pub fn publish(&self) {
        let nodes = self
            .config
            .nodes
            .iter()
            .zip(&self.nodes)
            .map(|(cfg, st)| node_view(cfg, &st.live.lock()))
            .collect::<Vec<_>>();
        for (idx, (view, st)) in nodes.iter().zip(&self.nodes).enumerate() {
            self.set_seats(idx, view, st);
        }
        self.view.store(Arc::new(FleetView { nodes }));
        self.changed.notify_waiters();
    }

    /// Seats per node:model and the node's hard cap, from the new snapshot; frees waiters
    /// when seats grew.
    fn set_seats(&self, idx: usize, view: &NodeView, st: &Arc<NodeState>) {
        let cfg = &self.config.nodes[idx];
        let known = cfg.seats.or(st.live.lock().seats);
        let held: f64 = view
            .models
            .iter()
            .filter(|m| m.loaded)
            .map(|m| m.resident_gb.unwrap_or(m.size_gb))
            .sum();
        let available = view
            .free_memory_gb
            .or((view.memory_gb > 0.0).then_some(view.memory_gb - held));
        st.hard_cap.store(view.hard_cap, Ordering::Relaxed);
        for m in &view.models {
            let model_gb = m.resident_gb.unwrap_or(m.size_gb);
            let extra = if m.loaded { model_gb } else { 0.0 };
            let seats = crate::queue::seats::derive(known, available.map(|a| a + extra), model_gb);
            st.counters(&m.name).limit.store(seats, Ordering::Relaxed);
        }
        crate::queue::pump(idx, st);
    }
}

/// Merge static facts with what the backend last reported.
fn node_view(cfg: &NodeConfig, live: &NodeLive) -> NodeView {
    let mut models: Vec<ModelView> = Vec::new();
    let cap = |ctx: u32| cfg.max_context.map_or(ctx, |m| m.min(ctx));
    // Static facts: the sim block and the `models:` list.
    if let Some(sim) = &cfg.sim {
        for m in &sim.models {
            models.push(ModelView {
                name: m.name.clone(),
                size_gb: m.size_gb,
                max_context: cap(m.context),
                on_disk: true,
                loaded: m.loaded && !live.polled,
                loaded_context: (m.loaded && !live.polled).then(|| cap(m.context)),
                ..ModelView::default()
            });
        }
    }
    for m in &cfg.models {
        let view = match models.iter_mut().find(|v| v.name == m.name) {
            Some(v) => v,
            None => {
                models.push(ModelView {
                    name: m.name.clone(),
                    on_disk: true,
                    max_context: cap(8192),
                    ..ModelView::default()
                });
                models.last_mut().expect("just pushed")
            }
        };
        if let Some(s) = m.size_gb {
            view.size_gb = s;
        }
        if let Some(c) = m.context {
            view.max_context = cap(c);
        }
        view.loaded |= m.loaded && !live.polled;
    }
    // What the backend reports wins for presence, load state and sizes.
    if live.polled {
        for lm in &live.models {
            let view = match models.iter_mut().find(|v| v.name == lm.name) {
                Some(v) => v,
                None => {
                    models.push(ModelView {
                        name: lm.name.clone(),
                        max_context: lm.context.map_or(0, cap),
                        ..ModelView::default()
                    });
                    models.last_mut().expect("just pushed")
                }
            };
            view.on_disk = lm.on_disk;
            view.loaded = lm.loaded;
            if lm.size_gb > 0.0 {
                view.size_gb = lm.size_gb;
            }
            view.resident_gb = lm.resident_gb.or(view.resident_gb);
            view.loaded_context = lm.context.filter(|_| lm.loaded);
            view.unloaded_at_ms = lm.unloaded_at_ms;
        }
        models.retain(|m| m.on_disk || m.loaded || live.models.iter().any(|l| l.name == m.name));
    }
    let seats = cfg.seats.or(live.seats).unwrap_or(1).max(1);
    NodeView {
        id: cfg.id.clone(),
        health: live.health,
        memory_gb: cfg.memory_gb.unwrap_or(0.0),
        free_memory_gb: live.free_memory_gb,
        bandwidth_gbps: cfg.bandwidth_gbps,
        seats,
        hard_cap: cfg.hard_cap.unwrap_or(seats * 4).max(seats),
        tier: cfg.tier,
        tags: cfg.tags.clone(),
        families: cfg.families.clone(),
        models,
        output_reserve: cfg.output_reserve,
        overhead_tokens: cfg.overhead_tokens,
        ..NodeView::default()
    }
}

impl Loads for Fleet {
    fn node_in_flight(&self, node: usize) -> u32 {
        self.nodes
            .get(node)
            .map_or(0, |n| n.in_flight.load(Ordering::Relaxed))
    }

    fn model(&self, node: usize, model: &str) -> ModelLoad {
        self.nodes
            .get(node)
            .and_then(|n| n.peek(model))
            .map_or_else(ModelLoad::default, |c| c.load())
    }
}

impl Fleet {
    /// True when the node answered its last poll(s).
    pub fn is_up(&self, idx: usize) -> bool {
        self.nodes[idx].live.lock().health != Health::Offline
    }
}
