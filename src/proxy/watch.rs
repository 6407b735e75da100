//! The watchdog of one attempt: a first-byte timeout (fixed, or derived from the node:model's
//! observed time to first byte), an idle timeout between body chunks, and the node going
//! offline. Resolves with the reason when the attempt should be given up.

use std::time::{Duration, Instant};

use super::dispatch::Dispatch;
use crate::config::TimeoutsFile;
use crate::fleet::Fleet;

/// Longest sleep between checks (fleet changes wake it sooner).
const TICK: Duration = Duration::from_millis(500);

/// How long the node may take to send its response headers; None: no limit beyond the
/// per-read timeout. `expected_ms`: the observed time to first byte of node:model (time to
/// first token for streams, the whole reply otherwise); `cold`: a model load is expected.
pub fn first_byte_timeout(
    t: &TimeoutsFile,
    expected_ms: Option<f64>,
    cold: bool,
) -> Option<Duration> {
    if let Some(ms) = t.first_byte_ms {
        return Some(Duration::from_millis(ms));
    }
    if cold {
        return None;
    }
    let expected = expected_ms.filter(|e| e.is_finite() && *e > 0.0)?;
    let ms = (expected * t.first_byte_factor).max(t.first_byte_min_ms as f64);
    Some(Duration::from_millis(ms as u64))
}

/// Resolves when the attempt started at `since` should be given up, with the reason.
pub async fn stalled(fleet: &Fleet, d: &Dispatch, since: Instant) -> String {
    let cfg = fleet.config();
    let t = &cfg.timeouts;
    let idle = Duration::from_secs(t.idle_stream_s);
    loop {
        let changed = fleet.changed.notified();
        let c = d.choice().clone();
        let counters = fleet.node(c.node).counters(&c.model);
        let expected = if d.stream {
            counters.ttft_ms()
        } else {
            counters.load().p75_ms
        };
        // Placed cold but sent once the model was in (`Dispatch::cold`): timed as a warm one.
        let (header, last, hidden, sent_cold) = {
            let st = d.state.lock();
            (
                st.status.is_some(),
                st.last_activity,
                d.hidden_load(&st),
                d.cold(&st),
            )
        };
        // A pair idle on a node that hides its loads may be loading unseen: the timeout
        // allows for the load its earlier answers showed; none known, as cold (no timeout).
        let (expected, cold) = match hidden.map(|h| h.load_s) {
            Some(None) => (expected, true),
            Some(Some(load)) => (expected.map(|ms| ms + load * 1000.0), sent_cold),
            None => (expected, sent_cold),
        };
        let first_byte = first_byte_timeout(t, expected, cold);
        let now = Instant::now();
        let (deadline, what) = if header {
            (Some(last.unwrap_or(since) + idle), "idle stream")
        } else {
            (first_byte.map(|fb| since + fb), "first byte")
        };
        if deadline.is_some_and(|dl| now >= dl) {
            let limit = if header {
                idle
            } else {
                first_byte.unwrap_or_default()
            };
            return format!(
                "node {} sent nothing for {} ms ({what} timeout)",
                c.node_id,
                limit.as_millis()
            );
        }
        if !fleet.is_up(c.node) {
            return format!("node {} went offline", c.node_id);
        }
        let wait = deadline.map_or(TICK, |dl| (dl - now).min(TICK));
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_from_observed_time_to_first_byte() {
        let t = TimeoutsFile::default();
        assert_eq!(
            first_byte_timeout(&t, None, false),
            None,
            "no history: no limit"
        );
        assert_eq!(
            first_byte_timeout(&t, Some(100.0), false),
            Some(Duration::from_millis(15_000)),
            "at least first_byte_min_ms"
        );
        assert_eq!(
            first_byte_timeout(&t, Some(10_000.0), false),
            Some(Duration::from_millis(40_000)),
            "factor x expected"
        );
        assert_eq!(
            first_byte_timeout(&t, Some(10_000.0), true),
            None,
            "cold load"
        );
        let fixed = TimeoutsFile {
            first_byte_ms: Some(250),
            ..TimeoutsFile::default()
        };
        assert_eq!(
            first_byte_timeout(&fixed, None, true),
            Some(Duration::from_millis(250))
        );
    }
}
