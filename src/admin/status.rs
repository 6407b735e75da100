//! `/fleet/status` JSON and the gauges refreshed before each scrape.

use serde::Serialize;
use std::sync::atomic::Ordering;

use crate::fleet::{AdminControl, BreakerState, Fleet, Heartbeat};
use crate::metrics::METRICS;
use crate::routing::{Health, Learning, Loads, Pressure};
use crate::services::now_ms;

#[derive(Serialize)]
pub struct FleetStatus {
    pub nodes: Vec<NodeStatus>,
    /// Calibrated chars-per-token per model (from `usage`), when any.
    pub chars_per_token: Vec<(String, f64)>,
    /// Fitted per-request prompt overhead (chat template tokens) per model, when any.
    pub prompt_overhead_tokens: Vec<(String, f64)>,
    /// Per tenant: limits, what is in flight and queued, usage since start.
    pub tenants: Vec<crate::tenant::TenantStatus>,
}

#[derive(Serialize)]
pub struct NodeStatus {
    pub id: String,
    pub url: String,
    pub backend: crate::config::Backend,
    /// Registered by a heartbeat rather than from the config file.
    pub dynamic: bool,
    pub tier: crate::routing::Tier,
    pub health: Health,
    pub last_error: Option<String>,
    /// Warmup ends at (ms since the epoch) when the node came back recently.
    pub warmup_until_ms: Option<u64>,
    pub control: AdminControl,
    pub breaker: BreakerStatus,
    pub seats: u32,
    /// Where `seats` came from: `config`, `backend` (llama.cpp `/props` total_slots; behind
    /// `backend: openai`, what the server said when asked, `services::health::probe::seats`:
    /// SGLang's `--max-running-requests` when it was given, llama.cpp's `total_slots`),
    /// `default_batching` (an OpenAI-compatible / vLLM server that reports none), `memory`
    /// (derived from free memory), `one_at_a_time` (nothing known), `learned` (nobody said;
    /// answers showed it runs no more than `seats_seen` at once).
    pub seats_from: &'static str,
    /// The most streams seen decoding on the node at once.
    pub seats_seen: u32,
    /// The node's models share its seats (learned from answers sent while they were all
    /// taken): no more than `seats` are sent to it at once, across its models.
    pub seats_shared: bool,
    pub hard_cap: u32,
    pub in_flight: u32,
    pub free_memory_gb: Option<f64>,
    pub pressure: Pressure,
    pub thermal_throttled: bool,
    pub agent: Option<AgentStatus>,
    pub learning: Option<Learning>,
    pub models: Vec<ModelStatus>,
}

#[derive(Serialize)]
pub struct BreakerStatus {
    pub state: BreakerState,
    pub consecutive_faults: u32,
    pub open_until_ms: Option<u64>,
}

#[derive(Serialize)]
pub struct AgentStatus {
    pub last_heartbeat_age_ms: u64,
    pub heartbeats: u64,
    pub last: Heartbeat,
}

#[derive(Serialize)]
pub struct ModelStatus {
    pub name: String,
    pub loaded: bool,
    pub on_disk: bool,
    /// hot (loaded), recent (unloaded recently: page-cache warm), cold.
    pub warmth: &'static str,
    pub unloaded_at_ms: Option<u64>,
    pub size_gb: f64,
    pub resident_gb: Option<f64>,
    pub max_context: u32,
    pub in_flight: u32,
    pub pending: u32,
    pub seats: u32,
    /// The most streams of this model seen decoding on the node at once.
    pub seats_seen: u32,
    /// On a node whose seats nobody said that serves several models: the model was found to
    /// run no more than `seats_seen` at once (its own seats, as Ollama keeps per model);
    /// routing prices it at those. `null`: not found.
    pub seats_learned: Option<u32>,
    pub p75_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub observed_tps: Option<f64>,
    pub breaker: BreakerStatus,
}

fn breaker_status(b: &crate::fleet::Breaker, now: u64) -> BreakerStatus {
    BreakerStatus {
        state: b.state(now),
        consecutive_faults: b.consecutive_faults(),
        open_until_ms: b.open_until_ms(),
    }
}

pub fn fleet_status(fleet: &Fleet) -> FleetStatus {
    let view = fleet.view();
    let now = now_ms();
    let warmup_ms = fleet.config().health.warmup.as_millis() as u64;
    let recent_ms = fleet.config().routing.policy.warmth_recent_window_s * 1000;
    let states = fleet.nodes();
    let nodes = view
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let cfg = fleet.node_config(i);
            let st = &states[i];
            let live = st.live.lock();
            let agent = st.agent.lock();
            let back = live.back_since_ms.max(agent.back_since_ms);
            NodeStatus {
                id: n.id.clone(),
                url: cfg.url.clone(),
                backend: cfg.backend,
                dynamic: cfg.dynamic,
                tier: n.tier,
                health: n.health,
                last_error: live.last_error.clone(),
                warmup_until_ms: back.map(|t| t + warmup_ms).filter(|until| *until > now),
                control: *st.control.lock(),
                breaker: breaker_status(&st.breaker.lock(), now),
                seats: n.seats,
                seats_from: if n.seats_assumed && n.seats_shared {
                    "learned"
                } else {
                    crate::queue::seats::known(cfg.seats, live.seats, cfg.backend).map_or_else(
                        || {
                            let mem = (n.memory_gb > 0.0).then_some(n.memory_gb);
                            crate::queue::seats::derived_source(n.free_memory_gb.or(mem))
                        },
                        |k| k.1,
                    )
                },
                seats_seen: n.seats_seen,
                seats_shared: n.seats_shared,
                hard_cap: n.hard_cap,
                in_flight: st.in_flight.load(Ordering::Relaxed),
                free_memory_gb: n.free_memory_gb,
                pressure: n.pressure,
                thermal_throttled: n.thermal_throttled,
                agent: agent.last.clone().map(|last| AgentStatus {
                    last_heartbeat_age_ms: agent.last_ms.map_or(0, |t| now.saturating_sub(t)),
                    heartbeats: agent.received,
                    last,
                }),
                learning: n.learning.clone(),
                models: n
                    .models
                    .iter()
                    .map(|m| {
                        let load = fleet.model(i, &m.name);
                        let c = st.counters(&m.name);
                        let breaker = breaker_status(&c.breaker.lock(), now);
                        let recent = m
                            .unloaded_at_ms
                            .is_some_and(|t| now.saturating_sub(t) <= recent_ms);
                        ModelStatus {
                            name: m.name.clone(),
                            loaded: m.loaded,
                            on_disk: m.on_disk,
                            warmth: if m.loaded {
                                "hot"
                            } else if recent {
                                "recent"
                            } else {
                                "cold"
                            },
                            unloaded_at_ms: m.unloaded_at_ms,
                            size_gb: m.size_gb,
                            resident_gb: m.resident_gb,
                            max_context: m.max_context,
                            in_flight: load.in_flight,
                            pending: load.pending,
                            seats: c.seats(),
                            seats_seen: m.seats_seen,
                            seats_learned: m.seats_learned,
                            p75_ms: load.p75_ms,
                            ttft_ms: c.ttft_ms(),
                            observed_tps: load.observed_tps,
                            breaker,
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    FleetStatus {
        nodes,
        chars_per_token: fleet.calibration.snapshot(),
        prompt_overhead_tokens: fleet.calibration.overheads(),
        tenants: fleet.tenants.status(&fleet.config().tenancy, now_ms()),
    }
}

/// Set the state gauges from the live fleet (called before each scrape).
pub fn refresh_gauges(fleet: &Fleet) {
    METRICS.holding_depth.set(fleet.board.holding() as i64);
    let view = fleet.view();
    super::zero::prime(&view);
    let now = now_ms();
    let states = fleet.nodes();
    for (i, n) in view.nodes.iter().enumerate() {
        let id = n.id.as_str();
        let is = |h: Health| i64::from(n.health == h);
        METRICS
            .node_up
            .with_label_values(&[id])
            .set(i64::from(n.health != Health::Offline));
        METRICS
            .node_warmup
            .with_label_values(&[id])
            .set(is(Health::Warmup));
        METRICS
            .node_draining
            .with_label_values(&[id])
            .set(is(Health::Draining));
        METRICS
            .node_paused
            .with_label_values(&[id])
            .set(is(Health::Paused));
        if let Some(l) = &n.learning {
            METRICS
                .node_availability
                .with_label_values(&[id])
                .set(l.availability);
        }
        let Some(st) = states.get(i) else { continue };
        METRICS
            .breaker_state
            .with_label_values(&[id, "-"])
            .set(st.breaker.lock().state(now).gauge());
        for m in &n.models {
            METRICS
                .model_loaded
                .with_label_values(&[id, &m.name])
                .set(i64::from(m.loaded));
        }
        for (model, c) in st.all_counters() {
            METRICS
                .in_flight
                .with_label_values(&[id, &model])
                .set(i64::from(c.in_flight.load(Ordering::Relaxed)));
            METRICS
                .pending
                .with_label_values(&[id, &model])
                .set(i64::from(c.pending.load(Ordering::Relaxed)));
            METRICS
                .breaker_state
                .with_label_values(&[id, &model])
                .set(c.breaker.lock().state(now).gauge());
            if let Some(tps) = c.load().observed_tps {
                METRICS.output_tps.with_label_values(&[id, &model]).set(tps);
            }
        }
    }
    for (model, cpt) in fleet.calibration.snapshot() {
        METRICS
            .chars_per_token
            .with_label_values(&[&model])
            .set(cpt);
    }
}
