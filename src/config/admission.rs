//! Admission control and upstream timeouts: the `admission` and `timeouts` sections.

use serde::Deserialize;

/// Bounds on waiting (issue 10, item 1 and 7): every wait is bounded by count and by
/// predicted wait; past a bound the client is refused at once with 429 + `Retry-After`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionFile {
    /// Most requests waiting in one node:model queue.
    pub max_queue: u32,
    /// Most requests waiting in this gateway at once (node:model queues and holding queue).
    pub max_waiting: usize,
    /// A request whose predicted seat wait exceeds this is refused at once.
    pub max_predicted_wait_ms: u64,
    /// Also refuse when the predicted wait exceeds this many times the node:model's observed
    /// service time (0: off). 1.0 keeps an admitted request's latency under about twice its
    /// service time.
    pub max_wait_service_ratio: f64,
    /// Share of `queue.holding_max` one client (by IP) may hold, in (0, 1].
    pub holding_client_share: f64,
}

impl Default for AdmissionFile {
    fn default() -> Self {
        AdmissionFile {
            max_queue: 256,
            max_waiting: 1024,
            max_predicted_wait_ms: 120_000,
            max_wait_service_ratio: 0.0,
            holding_client_share: 0.25,
        }
    }
}

/// Per-phase upstream timeouts (issue 10, item 8): a hung node gives its requests back.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutsFile {
    /// Fixed first-byte timeout (response headers); unset: derived per node:model as
    /// `first_byte_factor` x its observed time to first byte (the whole reply for
    /// non-streaming requests), at least `first_byte_min_ms`.
    pub first_byte_ms: Option<u64>,
    pub first_byte_factor: f64,
    pub first_byte_min_ms: u64,
    /// Longest pause between two body chunks of a response once it started.
    pub idle_stream_s: u64,
}

impl Default for TimeoutsFile {
    fn default() -> Self {
        TimeoutsFile {
            first_byte_ms: None,
            first_byte_factor: 4.0,
            first_byte_min_ms: 15_000,
            idle_stream_s: 120,
        }
    }
}

/// Check both sections; every problem names the field, the value and what was expected.
pub fn validate(errors: &mut Vec<String>, a: &AdmissionFile, t: &TimeoutsFile) {
    if a.max_queue == 0 {
        errors.push("field `admission.max_queue`: value 0: expected at least 1".into());
    }
    if a.max_waiting == 0 {
        errors.push("field `admission.max_waiting`: value 0: expected at least 1".into());
    }
    if a.max_predicted_wait_ms == 0 {
        errors.push("field `admission.max_predicted_wait_ms`: value 0: expected at least 1".into());
    }
    if !(a.max_wait_service_ratio.is_finite() && a.max_wait_service_ratio >= 0.0) {
        errors.push(format!(
            "field `admission.max_wait_service_ratio`: value {}: expected a number >= 0 (0: off)",
            a.max_wait_service_ratio
        ));
    }
    if !(a.holding_client_share > 0.0 && a.holding_client_share <= 1.0) {
        errors.push(format!(
            "field `admission.holding_client_share`: value {}: expected a number in (0, 1]",
            a.holding_client_share
        ));
    }
    if t.first_byte_ms == Some(0) {
        errors.push("field `timeouts.first_byte_ms`: value 0: expected at least 1".into());
    }
    if !(t.first_byte_factor.is_finite() && t.first_byte_factor >= 1.0) {
        errors.push(format!(
            "field `timeouts.first_byte_factor`: value {}: expected a number >= 1",
            t.first_byte_factor
        ));
    }
    if t.idle_stream_s == 0 {
        errors.push("field `timeouts.idle_stream_s`: value 0: expected at least 1".into());
    }
}
