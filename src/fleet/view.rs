//! The routing snapshot of one node: static config merged with what polls, heartbeats,
//! admin controls and breakers say now; and when time alone will change it next.

use super::*;

pub(super) struct ViewParams {
    pub(super) warmup_ms: u64,
    pub(super) miss_ms: u64,
    /// `completion_seats_shared_prior`.
    pub(super) shared_prior: f64,
}

/// The earliest future moment at which time alone changes this node's view.
pub(super) fn next_due(st: &NodeState, now: u64, p: &ViewParams) -> Option<u64> {
    let live_back = st.live.lock().back_since_ms;
    let agent = st.agent.lock();
    let mut times = vec![
        live_back.map(|t| t + p.warmup_ms),
        agent.back_since_ms.map(|t| t + p.warmup_ms),
        agent.last_ms.map(|t| t + p.miss_ms + 1),
        st.breaker.lock().open_until_ms(),
    ];
    for (_, c) in st.all_counters() {
        times.push(c.breaker.lock().open_until_ms());
        times.push(c.not_capable.next_expiry(now));
    }
    times.into_iter().flatten().filter(|t| *t > now).min()
}

/// `peer_load_gbps` of each node that has loaded nothing: the harmonic mean of the read
/// speeds the nodes that did showed (their mean seconds per GB). A disk is a machine's own,
/// but a LAN fleet's are of one era; a measured neighbour is a better first guess than a
/// constant (`completion_load_gbps`), and the node's own first load replaces it.
pub(super) fn peer_load_speeds(nodes: &mut [NodeView]) {
    let learned = |n: &NodeView| n.learned_load_gbps.filter(|g| g.is_finite() && *g > 0.0);
    let (count, per_gb) = nodes
        .iter()
        .filter_map(learned)
        .fold((0usize, 0.0), |(c, s), g| (c + 1, s + 1.0 / g));
    let mean = (count > 0).then(|| count as f64 / per_gb);
    for n in nodes.iter_mut().filter(|n| learned(n).is_none()) {
        n.peer_load_gbps = mean;
    }
}

/// Merge static facts with what the backend last reported, the agent's last heartbeat, the
/// breakers, the admin controls and the learner, as of `now`.
pub(super) fn node_view(cfg: &NodeConfig, st: &NodeState, now: u64, p: &ViewParams) -> NodeView {
    let live = st.live.lock();
    let mut view = models_view(cfg, &live);
    let agent = st.agent.lock();
    let inputs = HealthInputs {
        poll_offline: live.health == Health::Offline,
        poll_back_since_ms: live.back_since_ms,
        heartbeat_missed: agent.missed(now, p.miss_ms),
        heartbeat_back_since_ms: agent.back_since_ms,
        agent_draining: agent.fresh(now, p.miss_ms).is_some_and(|h| h.draining),
        admin: *st.control.lock(),
    };
    view.health = effective_health(&inputs, now, p.warmup_ms);
    view.breaker_open = !st.breaker.lock().admits(now);
    view.seats_assumed = seats_assumed(cfg, &live);
    let assumed = view.seats_assumed;
    let (mut read_gb, mut read_s) = (0.0, 0.0);
    for m in &mut view.models {
        let counters = st.peek(&m.name);
        let gb = m.resident_gb.unwrap_or(m.size_gb);
        let took = counters.as_ref().and_then(|c| c.rates.lock().load_s());
        if let Some(t) = took.filter(|t| t.is_finite() && *t > 0.0 && gb > 0.0) {
            read_gb += gb;
            read_s += t;
        }
        m.breaker_open = counters
            .as_ref()
            .is_some_and(|c| !c.breaker.lock().admits(now));
        if let Some(c) = &counters {
            m.seats_seen = c.decoding.seen(now);
            // Learned of this model alone, on a node whose seats nobody said, until it is seen
            // to run more at once.
            m.seats_learned = c
                .seat_bound
                .lock()
                .seats()
                .filter(|s| assumed && m.seats_seen <= *s);
        }
        m.not_capable = counters.map_or_else(Vec::new, |c| c.not_capable.active(now));
    }
    view.learned_load_gbps = (read_s > 0.0).then(|| read_gb / read_s);
    view.seats_shared = st.seat_sharing.lock().shared();
    view.seats_seen = st.decoding.seen(now);
    // A node whose seats nobody said is tested against the count it was seen to run at once
    // (`SeatBound`), one with known seats against them (`SeatSharing`).
    view.seats_shared_p = if view.seats_assumed {
        st.seat_bound.lock().belief(p.shared_prior, view.seats_seen)
    } else {
        st.seat_sharing.lock().belief(p.shared_prior)
    };
    view.hides_loads = cfg.backend == crate::config::Backend::Openai;
    // A node whose seats nobody said, found to run no more than it was seen to at once: those
    // are its seats, the node's (the count is across its models), until it is seen to run
    // more (a request let past them, `NodeState::probe_due`): then they are tested afresh.
    let bound = st
        .seat_bound
        .lock()
        .seats()
        .filter(|s| view.seats_assumed && view.seats_seen <= *s);
    if let Some(seats) = bound {
        view.seats = seats.min(view.seats);
        view.hard_cap = cfg.hard_cap.unwrap_or(view.seats * 4).max(view.seats);
        view.seats_shared = true;
        view.seats_shared_p = 1.0;
    }
    // Found to share its seats, the node's count is what binds: a model's own verdict, from
    // answers that could not tell the two apart, no longer prices it.
    if view.seats_shared {
        for m in &mut view.models {
            m.seats_learned = None;
        }
    }
    if let Some(hb) = agent.fresh(now, p.miss_ms) {
        view.free_memory_gb = hb.free_memory_gb.or(view.free_memory_gb);
        view.pressure = hb.pressure;
        view.thermal_throttled = hb.thermal_throttled;
        view.bandwidth_gbps = view.bandwidth_gbps.or(hb.bandwidth_gbps);
        if view.memory_gb <= 0.0 {
            view.memory_gb = hb.total_memory_gb.unwrap_or(0.0);
        }
    }
    view.learning = cfg.learning.then(|| {
        st.learner
            .lock()
            .as_ref()
            .map_or_else(|| Learner::default().output(now), |l| l.output(now))
    });
    view
}

/// Nobody said how many seats the node has: neither its config nor its backend (a batching
/// server's default is assumed, `queue::seats::DEFAULT_BATCHING_SEATS`).
pub(super) fn seats_assumed(cfg: &NodeConfig, live: &NodeLive) -> bool {
    crate::queue::seats::known(cfg.seats, live.seats, cfg.backend)
        .is_some_and(|(_, from)| from == "default_batching")
}

/// What the user wrote of the machine: its memory, seats and ceiling, the speeds given, the
/// backend. Two nodes with the same key are taken as the same machine, the laptops of a home
/// lab or a fleet's racks of one build, until each answers for itself. Config only (a
/// heartbeat's figures or a backend's slot count would make different machines alike), and
/// only with `memory_gb` written: nodes given by URL only are nobody's twins.
pub fn twin_key(cfg: &NodeConfig) -> Option<[u64; 8]> {
    let bits = |x: Option<f64>| x.map_or(0, f64::to_bits);
    // A node that registered itself by heartbeat took its memory from its agent.
    cfg.memory_gb.filter(|_| !cfg.dynamic).map(|gb| {
        [
            gb.to_bits(),
            u64::from(cfg.seats.unwrap_or(0)),
            u64::from(cfg.hard_cap.unwrap_or(0)),
            bits(cfg.bandwidth_gbps),
            bits(cfg.prefill_tps),
            bits(cfg.decode_tps),
            bits(cfg.load_gbps),
            cfg.backend as u64,
        ]
    })
}

/// The model list and static facts (config + last poll).
pub(super) fn models_view(cfg: &NodeConfig, live: &NodeLive) -> NodeView {
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
    let seats = crate::queue::seats::known(cfg.seats, live.seats, cfg.backend)
        .map_or(1, |k| k.0)
        .max(1);
    NodeView {
        id: cfg.id.clone(),
        health: live.health,
        memory_gb: cfg.memory_gb.unwrap_or(0.0),
        free_memory_gb: live.free_memory_gb,
        bandwidth_gbps: cfg.bandwidth_gbps,
        prefill_tps: cfg.prefill_tps,
        decode_tps: cfg.decode_tps,
        load_gbps: cfg.load_gbps,
        twin_key: twin_key(cfg),
        seats,
        hard_cap: cfg.hard_cap.unwrap_or(seats * 4).max(seats),
        tier: cfg.tier,
        tags: cfg.tags.clone(),
        families: live
            .probed_families
            .clone()
            .unwrap_or_else(|| cfg.families.clone()),
        models,
        output_reserve: cfg.output_reserve,
        overhead_tokens: cfg.overhead_tokens,
        ..NodeView::default()
    }
}

#[cfg(test)]
mod tests {
    use super::twin_key;
    use crate::config::Config;

    /// Nodes are twins when the user wrote the same memory (and the same seats, speeds and
    /// backend); without `memory_gb` nobody is, whatever else matches.
    #[test]
    fn twins_are_the_machines_the_config_describes_alike() {
        let c = Config::from_yaml(
            r#"
fleet:
  nodes:
    - { id: laptop-1, url: "http://127.0.0.1:1", backend: ollama, capacity: 2, memory_gb: 16 }
    - { id: laptop-2, url: "http://127.0.0.1:2", backend: ollama, capacity: 2, memory_gb: 16 }
    - { id: laptop-3, url: "http://127.0.0.1:3", backend: ollama, capacity: 4, memory_gb: 16 }
    - { id: mini, url: "http://127.0.0.1:4", backend: openai, capacity: 2, memory_gb: 16 }
    - { id: by-url-1, url: "http://127.0.0.1:5", backend: ollama, capacity: 2 }
    - { id: by-url-2, url: "http://127.0.0.1:6", backend: ollama, capacity: 2 }
"#,
        )
        .expect("valid");
        let keys: Vec<_> = c.nodes.iter().map(twin_key).collect();
        assert!(keys[0].is_some());
        assert_eq!(keys[0], keys[1]);
        assert_ne!(keys[0], keys[2], "other seats");
        assert_ne!(keys[0], keys[3], "other backend");
        assert_eq!((keys[4], keys[5]), (None, None), "no memory written");
        let registered = crate::config::NodeConfig::dynamic(
            "agent-box",
            "http://127.0.0.1:7",
            crate::config::Backend::Ollama,
            Some(16.0),
            None,
            1_024,
        )
        .expect("valid");
        assert_eq!(twin_key(&registered), None, "memory from its agent");
    }
}
