//! Every metric name and family in one place: `fleetgate_<layer>_<what>_<unit>`.
//!
//! Labels are bounded: node ids and model names come from config or the backends, never from
//! client input (an unknown model is recorded as "-").

use once_cell::sync::Lazy;
use prometheus::{
    histogram_opts, opts, Encoder, GaugeVec, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec,
    Registry, TextEncoder,
};

pub const REQUESTS_TOTAL: &str = "fleetgate_proxy_requests_total";
pub const REQUEST_DURATION_SECONDS: &str = "fleetgate_proxy_request_duration_seconds";
pub const TTFT_SECONDS: &str = "fleetgate_proxy_time_to_first_token_seconds";
pub const IN_FLIGHT_REQUESTS: &str = "fleetgate_fleet_in_flight_requests";
pub const NODE_UP: &str = "fleetgate_fleet_node_up";
pub const MODEL_LOADED: &str = "fleetgate_fleet_model_loaded";
pub const RETRIES_TOTAL: &str = "fleetgate_proxy_retries_total";
pub const BUILD_INFO: &str = "fleetgate_build_info";
pub const NODE_WARMUP: &str = "fleetgate_fleet_node_warmup";
pub const NODE_DRAINING: &str = "fleetgate_fleet_node_draining";
pub const NODE_PAUSED: &str = "fleetgate_fleet_node_paused";
pub const NODE_AVAILABILITY: &str = "fleetgate_fleet_node_availability_ratio";
pub const BREAKER_STATE: &str = "fleetgate_fleet_breaker_state";
pub const BREAKER_TRANSITIONS_TOTAL: &str = "fleetgate_fleet_breaker_transitions_total";
pub const HEARTBEATS_TOTAL: &str = "fleetgate_admin_heartbeats_total";
pub const OUTPUT_TPS: &str = "fleetgate_fleet_output_tokens_per_second";
pub const CHARS_PER_TOKEN: &str = "fleetgate_fleet_chars_per_token_ratio";
pub const ERRORS_TOTAL: &str = "fleetgate_proxy_errors_total";
pub const ACCESS_LOG_DROPPED_TOTAL: &str = "fleetgate_access_log_dropped_total";
pub const QUEUE_WAIT_SECONDS: &str = "fleetgate_queue_wait_seconds";
pub const QUEUE_PENDING_REQUESTS: &str = "fleetgate_queue_pending_requests";
pub const QUEUE_ABORTS_TOTAL: &str = "fleetgate_queue_client_aborts_total";
pub const HOLDING_REQUESTS: &str = "fleetgate_queue_holding_requests";
pub const HOLDING_OUTCOMES_TOTAL: &str = "fleetgate_queue_holding_outcomes_total";
pub const PREWARMS_TOTAL: &str = "fleetgate_queue_prewarms_total";
pub const REBALANCE_MOVES_TOTAL: &str = "fleetgate_queue_rebalance_moves_total";
pub const PULLS_TOTAL: &str = "fleetgate_queue_pulls_total";
pub const ELIMINATIONS_TOTAL: &str = "fleetgate_routing_eliminations_total";
pub const EVICTIONS_TOTAL: &str = "fleetgate_routing_evictions_total";
pub const MEASUREMENTS_TOTAL: &str = "fleetgate_routing_measurements_total";
pub const DECISIONS_TOTAL: &str = "fleetgate_routing_decisions_total";
pub const TOKENS_TOTAL: &str = "fleetgate_proxy_tokens_total";
pub const TIME_PER_OUTPUT_TOKEN_SECONDS: &str = "fleetgate_proxy_time_per_output_token_seconds";
pub const CONFIG_RELOADS_TOTAL: &str = "fleetgate_config_reloads_total";
pub const QUEUE_TIMEOUTS_TOTAL: &str = "fleetgate_queue_timeouts_total";
/// Client connections open on the proxy listener (defined in `clients`).
pub const CLIENT_CONNECTIONS: &str = "fleetgate_client_connections";
/// Clients turned away before routing: connections, body_budget, head_timeout, body_timeout.
pub const CLIENT_REFUSALS_TOTAL: &str = "fleetgate_client_refusals_total";

/// Buckets for whole-request latency: LLM requests run from milliseconds to minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];
/// Time per output token: 1 ms (fast GPU) to 1 s (a 70B model on a laptop).
const TPOT_BUCKETS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

pub struct Metrics {
    pub registry: Registry,
    pub requests: IntCounterVec,
    pub duration: HistogramVec,
    pub ttft: HistogramVec,
    pub in_flight: IntGaugeVec,
    pub node_up: IntGaugeVec,
    pub model_loaded: IntGaugeVec,
    pub retries: IntCounterVec,
    pub build_info: GaugeVec,
    pub node_warmup: IntGaugeVec,
    pub node_draining: IntGaugeVec,
    pub node_paused: IntGaugeVec,
    pub node_availability: GaugeVec,
    pub breaker_state: IntGaugeVec,
    pub breaker_transitions: IntCounterVec,
    pub heartbeats: IntCounterVec,
    pub output_tps: GaugeVec,
    pub chars_per_token: GaugeVec,
    /// Errors the gateway answered itself, by protocol and stable code (`ErrorCode::as_str`).
    pub errors: IntCounterVec,
    /// Access-log lines not written: `full` (writer behind) or `write_error`.
    pub access_log_dropped: IntCounterVec,
    pub queue_wait: HistogramVec,
    pub pending: IntGaugeVec,
    pub queue_aborts: IntCounterVec,
    pub holding_depth: IntGauge,
    pub holding: IntCounterVec,
    pub prewarms: IntCounterVec,
    pub rebalance_moves: IntCounterVec,
    pub pulls: IntCounterVec,
    pub eliminations: IntCounterVec,
    /// Idle models the gateway unloaded to make room for a cold load (completion mode).
    pub evictions: IntCounterVec,
    /// First measurements the gateway sent (completion mode, `services::measure`).
    pub measurements: IntCounterVec,
    pub decisions: IntCounterVec,
    pub tokens: IntCounterVec,
    pub tpot: HistogramVec,
    pub config_reloads: IntCounterVec,
    pub queue_timeouts: IntCounterVec,
}

fn build() -> Result<Metrics, prometheus::Error> {
    let registry = Registry::new();
    let nm = &["node", "model"];
    let m = Metrics {
        requests: IntCounterVec::new(
            opts!(
                REQUESTS_TOTAL,
                "Requests by serving node, model, protocol and status"
            ),
            &["node", "model", "protocol", "status"],
        )?,
        duration: HistogramVec::new(
            histogram_opts!(
                REQUEST_DURATION_SECONDS,
                "Total request latency",
                LATENCY_BUCKETS.to_vec()
            ),
            nm,
        )?,
        ttft: HistogramVec::new(
            histogram_opts!(
                TTFT_SECONDS,
                "Time to the first response body byte",
                TTFT_BUCKETS.to_vec()
            ),
            nm,
        )?,
        in_flight: IntGaugeVec::new(
            opts!(IN_FLIGHT_REQUESTS, "Requests in flight per node:model"),
            nm,
        )?,
        node_up: IntGaugeVec::new(
            opts!(NODE_UP, "1 when the node answers its polls"),
            &["node"],
        )?,
        model_loaded: IntGaugeVec::new(
            opts!(MODEL_LOADED, "1 when the model is loaded on the node"),
            nm,
        )?,
        retries: IntCounterVec::new(
            opts!(RETRIES_TOTAL, "Attempts moved to another node"),
            &["node"],
        )?,
        build_info: GaugeVec::new(opts!(BUILD_INFO, "Build information"), &["version"])?,
        node_warmup: IntGaugeVec::new(
            opts!(NODE_WARMUP, "1 while the node is in warmup after a reconnect"),
            &["node"],
        )?,
        node_draining: IntGaugeVec::new(
            opts!(NODE_DRAINING, "1 while the node is draining (admin or agent)"),
            &["node"],
        )?,
        node_paused: IntGaugeVec::new(
            opts!(NODE_PAUSED, "1 while the node is paused by an operator"),
            &["node"],
        )?,
        node_availability: GaugeVec::new(
            opts!(
                NODE_AVAILABILITY,
                "Capacity learner's availability score 0..1 (learning nodes)"
            ),
            &["node"],
        )?,
        breaker_state: IntGaugeVec::new(
            opts!(
                BREAKER_STATE,
                "Circuit breaker per node (model=\"-\") and node:model: 0 closed, 1 open, 2 half-open"
            ),
            nm,
        )?,
        breaker_transitions: IntCounterVec::new(
            opts!(BREAKER_TRANSITIONS_TOTAL, "Circuit breaker state changes"),
            &["node", "model", "to"],
        )?,
        heartbeats: IntCounterVec::new(
            opts!(
                HEARTBEATS_TOTAL,
                "Agent heartbeats by node (\"-\" when rejected) and result"
            ),
            &["node", "result"],
        )?,
        output_tps: GaugeVec::new(
            opts!(OUTPUT_TPS, "Observed output tokens per second (EWMA) per node:model"),
            nm,
        )?,
        chars_per_token: GaugeVec::new(
            opts!(CHARS_PER_TOKEN, "Calibrated prompt characters per token per model"),
            &["model"],
        )?,
        errors: IntCounterVec::new(
            opts!(
                ERRORS_TOTAL,
                "Errors the gateway answered itself, by protocol and error code"
            ),
            &["protocol", "code"],
        )?,
        access_log_dropped: IntCounterVec::new(
            opts!(
                ACCESS_LOG_DROPPED_TOTAL,
                "Access-log lines dropped: writer behind (full) or failed (write_error)"
            ),
            &["reason"],
        )?,
        queue_wait: HistogramVec::new(
            histogram_opts!(
                QUEUE_WAIT_SECONDS,
                "Time waiting in the gateway before dispatch",
                LATENCY_BUCKETS.to_vec()
            ),
            nm,
        )?,
        pending: IntGaugeVec::new(
            opts!(
                QUEUE_PENDING_REQUESTS,
                "Requests waiting per node:model queue"
            ),
            nm,
        )?,
        queue_aborts: IntCounterVec::new(
            opts!(
                QUEUE_ABORTS_TOTAL,
                "Clients that left while waiting for a seat"
            ),
            nm,
        )?,
        holding_depth: IntGauge::with_opts(opts!(
            HOLDING_REQUESTS,
            "Requests in the holding queue"
        ))?,
        holding: IntCounterVec::new(
            opts!(
                HOLDING_OUTCOMES_TOTAL,
                "Holding-queue outcomes: served, timeout, full, aborted"
            ),
            &["outcome"],
        )?,
        prewarms: IntCounterVec::new(opts!(PREWARMS_TOTAL, "Pre-warm loads sent (Stage 4)"), nm)?,
        evictions: IntCounterVec::new(
            opts!(
                EVICTIONS_TOTAL,
                "Idle models unloaded to make room for a cold load (completion mode)"
            ),
            nm,
        )?,
        measurements: IntCounterVec::new(
            opts!(
                MEASUREMENTS_TOTAL,
                "First measurements: a short request of the gateway's own to a loaded model no answer had measured (completion mode)"
            ),
            &["node", "model", "outcome"],
        )?,
        rebalance_moves: IntCounterVec::new(
            opts!(
                REBALANCE_MOVES_TOTAL,
                "Waiting requests moved to another node (Stage 5)"
            ),
            &["from", "to", "model"],
        )?,
        pulls: IntCounterVec::new(
            opts!(PULLS_TOTAL, "Auto-pulls by outcome"),
            &["node", "outcome"],
        )?,
        eliminations: IntCounterVec::new(
            opts!(ELIMINATIONS_TOTAL, "Stage 1 eliminations of (node, model) pairs by reason"),
            &["reason"],
        )?,
        decisions: IntCounterVec::new(
            opts!(
                DECISIONS_TOTAL,
                "Routed requests by kind: direct, fallback, pin, cold_load, affinity_matched/spilled/new"
            ),
            &["kind"],
        )?,
        tokens: IntCounterVec::new(
            opts!(TOKENS_TOTAL, "Tokens by node:model and direction (in: prompt, out: generated), from usage or counted chunks"),
            &["node", "model", "direction"],
        )?,
        tpot: HistogramVec::new(
            histogram_opts!(
                TIME_PER_OUTPUT_TOKEN_SECONDS,
                "Decode time per output token after the first",
                TPOT_BUCKETS.to_vec()
            ),
            &["node", "model"],
        )?,
        config_reloads: IntCounterVec::new(
            opts!(CONFIG_RELOADS_TOTAL, "Config reloads by result (ok, error)"),
            &["result"],
        )?,
        queue_timeouts: IntCounterVec::new(
            opts!(QUEUE_TIMEOUTS_TOTAL, "Requests that found no seat within queue.max_wait_s (503)"),
            &["node", "model"],
        )?,
        registry,
    };
    m.registry.register(Box::new(m.requests.clone()))?;
    m.registry.register(Box::new(m.duration.clone()))?;
    m.registry.register(Box::new(m.ttft.clone()))?;
    m.registry.register(Box::new(m.in_flight.clone()))?;
    m.registry.register(Box::new(m.node_up.clone()))?;
    m.registry.register(Box::new(m.model_loaded.clone()))?;
    m.registry.register(Box::new(m.retries.clone()))?;
    m.registry.register(Box::new(m.build_info.clone()))?;
    m.registry.register(Box::new(m.node_warmup.clone()))?;
    m.registry.register(Box::new(m.node_draining.clone()))?;
    m.registry.register(Box::new(m.node_paused.clone()))?;
    m.registry.register(Box::new(m.node_availability.clone()))?;
    m.registry.register(Box::new(m.breaker_state.clone()))?;
    m.registry
        .register(Box::new(m.breaker_transitions.clone()))?;
    m.registry.register(Box::new(m.heartbeats.clone()))?;
    m.registry.register(Box::new(m.output_tps.clone()))?;
    m.registry.register(Box::new(m.chars_per_token.clone()))?;
    m.registry.register(Box::new(m.errors.clone()))?;
    m.registry
        .register(Box::new(m.access_log_dropped.clone()))?;
    m.registry.register(Box::new(m.queue_wait.clone()))?;
    m.registry.register(Box::new(m.pending.clone()))?;
    m.registry.register(Box::new(m.queue_aborts.clone()))?;
    m.registry.register(Box::new(m.holding_depth.clone()))?;
    m.registry.register(Box::new(m.holding.clone()))?;
    m.registry.register(Box::new(m.prewarms.clone()))?;
    m.registry.register(Box::new(m.rebalance_moves.clone()))?;
    m.registry.register(Box::new(m.pulls.clone()))?;
    m.registry.register(Box::new(m.eliminations.clone()))?;
    m.registry.register(Box::new(m.evictions.clone()))?;
    m.registry.register(Box::new(m.measurements.clone()))?;
    m.registry.register(Box::new(m.decisions.clone()))?;
    m.registry.register(Box::new(m.tokens.clone()))?;
    m.registry.register(Box::new(m.tpot.clone()))?;
    m.registry.register(Box::new(m.config_reloads.clone()))?;
    m.registry.register(Box::new(m.queue_timeouts.clone()))?;
    for result in ["ok", "error"] {
        m.config_reloads.with_label_values(&[result]).inc_by(0);
    }
    m.build_info
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1.0);
    // Counters with a fixed label set start as zero-valued series: a dashboard shows 0, not
    // "No data", until the first event.
    for reason in ["full", "write_error"] {
        m.access_log_dropped.with_label_values(&[reason]);
    }
    for outcome in ["served", "timeout", "full", "aborted"] {
        m.holding.with_label_values(&[outcome]);
    }
    Ok(m)
}

/// The process-wide metrics. Construction only fails on a duplicate name: a broken invariant.
pub static METRICS: Lazy<Metrics> = Lazy::new(|| build().expect("metric families are unique"));

/// Create the zero-valued per-node series of counters that only move on trouble, so a
/// dashboard shows 0 for every configured node rather than "No data".
pub fn register_nodes<'a>(ids: impl IntoIterator<Item = &'a str>) {
    for id in ids {
        METRICS.retries.with_label_values(&[id]);
    }
}

/// Prometheus text exposition of every family.
pub fn encode() -> String {
    let mut buf = Vec::new();
    Lazy::force(&TENANT_METRICS);
    let _ = TextEncoder::new().encode(&METRICS.registry.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}

/// Count one decision: eliminations by reason (tallied first: one increment per reason) and
/// the kinds of the routed outcome.
pub fn record_decision(d: &crate::routing::Decision, pinned: bool) {
    use crate::routing::{AffinityKind, Reason, Verdict};
    let mut tally = [0u64; Reason::ALL.len()];
    for row in &d.table {
        if let Verdict::Eliminated { reason } = row.verdict {
            tally[reason as usize] += 1;
        }
    }
    for (reason, n) in Reason::ALL.iter().zip(tally) {
        if n > 0 {
            METRICS
                .eliminations
                .with_label_values(&[reason.as_str()])
                .inc_by(n);
        }
    }
    let Some(w) = d.winner() else { return };
    let mut kinds = Vec::with_capacity(3);
    kinds.push(if w.fallback { "fallback" } else { "direct" });
    if w.cold {
        kinds.push("cold_load");
    }
    if pinned {
        kinds.push("pin");
    }
    match d.affinity {
        AffinityKind::Matched => kinds.push("affinity_matched"),
        AffinityKind::Spilled => kinds.push("affinity_spilled"),
        AffinityKind::New => kinds.push("affinity_new"),
        AffinityKind::None => {}
    }
    for k in kinds {
        METRICS.decisions.with_label_values(&[k]).inc();
    }
}

pub const TENANT_REQUESTS_TOTAL: &str = "fleetgate_tenant_requests_total";
pub const TENANT_TOKENS_TOTAL: &str = "fleetgate_tenant_tokens_total";
pub const TENANT_ERRORS_TOTAL: &str = "fleetgate_tenant_errors_total";
pub const TENANT_REJECTIONS_TOTAL: &str = "fleetgate_tenant_rejections_total";
pub const TENANT_IN_FLIGHT: &str = "fleetgate_tenant_in_flight_requests";

/// Per-tenant usage. The tenant label is a tenant id from config (`auth:` / `tenants:`) or
/// `default` when auth is off: bounded, never a key.
pub struct TenantMetrics {
    /// Requests by tenant and HTTP status.
    pub requests: IntCounterVec,
    /// Prompt and completion tokens by tenant (`kind`): the node's usage when it reports one,
    /// else the gateway's estimate.
    pub tokens: IntCounterVec,
    /// Error answers by tenant and stable code.
    pub errors: IntCounterVec,
    /// Requests refused by a tenant limit (`in_flight`, `queued`, `requests_per_min`,
    /// `tokens_per_min`).
    pub rejections: IntCounterVec,
    pub in_flight: IntGaugeVec,
}

fn build_tenant() -> Result<TenantMetrics, prometheus::Error> {
    let t = TenantMetrics {
        requests: IntCounterVec::new(
            opts!(TENANT_REQUESTS_TOTAL, "Requests by tenant and HTTP status"),
            &["tenant", "status"],
        )?,
        tokens: IntCounterVec::new(
            opts!(
                TENANT_TOKENS_TOTAL,
                "Tokens by tenant and kind (prompt, completion); node usage, else estimates"
            ),
            &["tenant", "kind"],
        )?,
        errors: IntCounterVec::new(
            opts!(
                TENANT_ERRORS_TOTAL,
                "Error answers by tenant and stable code"
            ),
            &["tenant", "code"],
        )?,
        rejections: IntCounterVec::new(
            opts!(
                TENANT_REJECTIONS_TOTAL,
                "Requests refused by a tenant limit (429)"
            ),
            &["tenant", "limit"],
        )?,
        in_flight: IntGaugeVec::new(
            opts!(
                TENANT_IN_FLIGHT,
                "Requests of the tenant running or waiting"
            ),
            &["tenant"],
        )?,
    };
    METRICS.registry.register(Box::new(t.requests.clone()))?;
    METRICS.registry.register(Box::new(t.tokens.clone()))?;
    METRICS.registry.register(Box::new(t.errors.clone()))?;
    METRICS.registry.register(Box::new(t.rejections.clone()))?;
    METRICS.registry.register(Box::new(t.in_flight.clone()))?;
    Ok(t)
}

/// Per-tenant families, registered in [`METRICS`]'s registry on first use (and by `encode`).
pub static TENANT_METRICS: Lazy<TenantMetrics> =
    Lazy::new(|| build_tenant().expect("tenant metric families are unique"));

/// Zero-valued series for a tenant, so dashboards show 0 from the first scrape.
pub fn register_tenant(tenant: &str) {
    let t = &*TENANT_METRICS;
    for kind in ["prompt", "completion"] {
        t.tokens.with_label_values(&[tenant, kind]);
    }
    for limit in ["in_flight", "queued", "requests_per_min", "tokens_per_min"] {
        t.rejections.with_label_values(&[tenant, limit]);
    }
    t.in_flight.with_label_values(&[tenant]);
}

#[cfg(test)]
mod tests {
    use crate::routing::Reason;

    #[test]
    fn reason_table_matches_discriminants() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{}", r.as_str());
        }
    }
}
