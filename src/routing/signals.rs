//! Stage 2 signals: the 8 of spec 000 plus the tier weight (spec 004) and a load tie-breaker.
//!
//! Each signal is a small pure function of the pair's facts, so the spec's worked numbers are
//! tested one by one. Queue depth everywhere is `(in_flight + pending) / seats` (spec 003's
//! capacity normalisation; with one seat the spec 000 numbers hold exactly).
//!
//! The `load` term is deliberately small (at most `load_inflight_weight` down and
//! `load_tps_weight` up, 1 point each by default) so it only separates otherwise-equal nodes
//! (spec 004: "spread by inflight count and observed TPS"). It counts the node's in-flight
//! requests of *other* models (this model's own queue is already Signal 3) per seat, capped at
//! 1, and rewards the model's observed output TPS on the node as tps / (tps + ref).

use super::policy::Policy;
use super::types::{ModelLoad, ModelView, NodeView, RouteRequest, Signals, Tier};

/// Everything the signals read about one surviving (node, model) pair.
pub(super) struct Pair<'a> {
    pub req: &'a RouteRequest,
    pub node: &'a NodeView,
    pub model: &'a ModelView,
    pub load: ModelLoad,
    pub node_in_flight: u32,
    pub fit_ratio: f64,
    pub needed_tokens: u64,
    pub now_ms: u64,
}

/// Requests running or waiting for the model on the node, per seat (Signals 3, 4 and 8).
pub(super) fn depth(load: &ModelLoad, node: &NodeView) -> f64 {
    f64::from(load.depth()) / f64::from(node.seats.max(1))
}

pub(super) fn score(p: &Policy, pair: &Pair<'_>) -> Signals {
    let depth = depth(&pair.load, pair.node);
    Signals {
        warmth: warmth(p, pair.model, pair.now_ms),
        memory_fit: memory_fit(p, pair.fit_ratio),
        queue_depth: queue_depth(p, depth),
        wait_time: wait_time(p, depth, per_request_s(p, pair)),
        role_affinity: role_affinity(p, pair.node, pair.model.size_gb),
        availability: availability(p, pair.node),
        context_fit: context_fit(p, pair.model, pair.needed_tokens),
        // Signal 8 is added by `decide` once the pass has found the rendezvous node.
        session_affinity: 0.0,
        tier: tier(p, pair.node.tier),
        load: load(p, pair),
    }
}

/// Signal 1: loaded +50; unloaded within the last 30 min +30; on disk +10; pullable 0.
pub(super) fn warmth(p: &Policy, model: &ModelView, now_ms: u64) -> f64 {
    if model.loaded {
        return p.warmth_loaded;
    }
    if !model.on_disk {
        return p.warmth_pullable;
    }
    let window_ms = p.warmth_recent_window_s.saturating_mul(1000);
    match model.unloaded_at_ms {
        Some(at) if now_ms.saturating_sub(at) <= window_ms => p.warmth_recent,
        _ => p.warmth_on_disk,
    }
}

/// Signal 2: the fit-ratio bands (a loaded model's ratio is infinite: the full +20).
pub(super) fn memory_fit(p: &Policy, ratio: f64) -> f64 {
    if ratio.is_infinite() {
        p.fit_loaded
    } else if ratio > p.fit_comfortable_ratio {
        p.fit_comfortable
    } else if ratio >= p.fit_good_ratio {
        p.fit_good
    } else if ratio >= p.fit_ok_ratio {
        p.fit_ok
    } else {
        p.fit_tight
    }
}

/// Signal 3: -min(30, 6 x depth).
pub(super) fn queue_depth(p: &Policy, depth: f64) -> f64 {
    -(p.queue_per_request * depth).min(p.queue_max)
}

/// Seconds one request takes on the pair: p75 when known, else the heuristic
/// (expected output tokens x seconds per token, from observed TPS or model GB / bandwidth).
pub(super) fn per_request_s(p: &Policy, pair: &Pair<'_>) -> f64 {
    if let Some(ms) = pair.load.p75_ms.filter(|ms| ms.is_finite() && *ms >= 0.0) {
        return ms / 1000.0;
    }
    let tokens = pair
        .req
        .max_output_tokens
        .map_or(p.wait_heuristic_output_tokens, |m| {
            m.min(p.wait_heuristic_output_tokens)
        });
    let per_token_s = match pair.load.observed_tps {
        Some(tps) if tps > 0.0 => 1.0 / tps,
        _ => {
            let bw = pair
                .node
                .bandwidth_gbps
                .filter(|bw| *bw > 0.0)
                .unwrap_or(p.wait_heuristic_bandwidth_gbps);
            pair.model.size_gb.max(0.0) / bw
        }
    };
    f64::from(tokens) * per_token_s
}

/// Signal 4: -min(25, depth x per-request seconds / 10).
pub(super) fn wait_time(p: &Policy, depth: f64, per_request_s: f64) -> f64 {
    -(depth * per_request_s / p.wait_divisor_s).min(p.wait_max)
}

/// Signal 5: bandwidth bonus by model size class; memory-tier table when bandwidth is unknown.
pub(super) fn role_affinity(p: &Policy, node: &NodeView, model_size_gb: f64) -> f64 {
    let large = model_size_gb > p.role_large_threshold_gb;
    let small = model_size_gb < p.role_small_threshold_gb;
    match node.bandwidth_gbps.filter(|bw| *bw > 0.0) {
        Some(bw) => {
            let bonus = (p.role_bw_base + bw / p.role_bw_divisor).min(p.role_bw_cap);
            if large {
                bonus
            } else if small {
                (p.role_small_base - p.role_small_factor * bonus).max(p.role_small_min)
            } else {
                p.role_medium_factor * bonus
            }
        }
        None => {
            let mem = node.memory_gb;
            if large {
                if mem >= p.role_mem_large_node_gb {
                    p.role_mem_large_model_on_large
                } else if mem >= p.role_mem_mid_node_gb {
                    p.role_mem_large_model_on_mid
                } else {
                    p.role_mem_large_model_on_small
                }
            } else if small {
                if mem <= p.role_mem_mid_node_gb {
                    p.role_mem_small_model_on_small
                } else if mem <= p.role_mem_large_node_gb {
                    p.role_mem_small_model_on_mid
                } else {
                    p.role_mem_small_model_on_large
                }
            } else {
                p.role_mem_medium_model
            }
        }
    }
}

/// Signal 6: availability x 10, only for nodes with capacity learning.
pub(super) fn availability(p: &Policy, node: &NodeView) -> f64 {
    node.learning.as_ref().map_or(0.0, |l| {
        l.availability.clamp(0.0, 1.0) * p.availability_weight
    })
}

/// Signal 7: how comfortably the loaded window (else the largest) holds the request;
/// a loaded window too small means a resize, i.e. a reload: -15. Unknown window: 0.
pub(super) fn context_fit(p: &Policy, model: &ModelView, needed: u64) -> f64 {
    let window = match model.loaded_context {
        Some(ctx) if model.loaded => ctx,
        _ => model.max_context,
    };
    if window == 0 {
        return 0.0;
    }
    if needed > u64::from(window) {
        return -p.ctx_resize_penalty;
    }
    let ratio = if needed == 0 {
        f64::INFINITY
    } else {
        window as f64 / needed as f64
    };
    if ratio >= p.ctx_roomy_ratio {
        p.ctx_roomy
    } else if ratio >= p.ctx_good_ratio {
        p.ctx_good
    } else if ratio >= p.ctx_ok_ratio {
        p.ctx_ok
    } else {
        p.ctx_tight
    }
}

/// Signal 8: 20 / (1 + depth / 2) on the conversation's rendezvous node (depth as above).
pub(super) fn session_affinity(p: &Policy, depth: f64) -> f64 {
    p.session_max / (1.0 + depth / p.session_depth_divisor)
}

/// Tier weight (spec 004): pinned nodes ahead of provisional ones.
pub(super) fn tier(p: &Policy, tier: Tier) -> f64 {
    match tier {
        Tier::Pinned => p.tier_pinned_bonus,
        Tier::Provisional => 0.0,
    }
}

/// Tie-breaker (see the module doc): other models' in-flight per seat, observed TPS.
pub(super) fn load(p: &Policy, pair: &Pair<'_>) -> f64 {
    let seats = f64::from(pair.node.seats.max(1));
    let others = f64::from(pair.node_in_flight.saturating_sub(pair.load.in_flight));
    let busy = -p.load_inflight_weight * (others / seats).min(1.0);
    let speed = match pair.load.observed_tps {
        Some(tps) if tps > 0.0 && tps.is_finite() => {
            p.load_tps_weight * tps / (tps + p.load_tps_ref)
        }
        _ => 0.0,
    };
    busy + speed
}
