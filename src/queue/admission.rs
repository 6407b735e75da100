//! Admission: may a request wait in a node:model queue? Pure: queue counts, seats and the
//! observed service time in; a verdict with the predicted wait, or a refusal with the
//! `Retry-After` the queue's drain rate gives.

use crate::config::AdmissionFile;

/// One node:model queue as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueueState {
    /// Requests waiting ahead of this one.
    pub ahead: u32,
    /// Seats of the node:model (requests it runs at once).
    pub seats: u32,
    /// Expected service time of one request (seat held -> response done), ms; None: unknown.
    pub service_ms: Option<f64>,
}

/// Why a request may not wait.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub message: String,
    /// Seconds until the queue has drained enough to admit a request like this one.
    pub retry_after_s: u32,
}

/// Longest `Retry-After` ever advised.
pub const MAX_RETRY_AFTER_S: u32 = 3_600;

/// Predicted wait for a seat: the request leaves the queue after `ahead + 1` seats free up, and
/// seats free up at `seats / service_ms` (the queue's drain rate).
pub fn predicted_wait_ms(q: &QueueState) -> Option<f64> {
    let service = q.service_ms.filter(|s| s.is_finite() && *s > 0.0)?;
    Some(f64::from(q.ahead + 1) * service / f64::from(q.seats.max(1)))
}

/// The wait limit for this queue: the configured bound, and the service-time ratio when set.
pub fn wait_limit_ms(q: &QueueState, limits: &AdmissionFile) -> f64 {
    let fixed = limits.max_predicted_wait_ms as f64;
    match q.service_ms {
        Some(s) if limits.max_wait_service_ratio > 0.0 && s > 0.0 => {
            fixed.min(limits.max_wait_service_ratio * s)
        }
        _ => fixed,
    }
}

/// The predicted wait in service times, `(ahead + 1) / seats`: known without any history, so
/// the service-time ratio bounds a queue from its first request on (a burst that arrives
/// before the first response would otherwise be admitted whole).
pub fn wait_in_services(q: &QueueState) -> f64 {
    f64::from(q.ahead + 1) / f64::from(q.seats.max(1))
}

fn secs(ms: f64) -> u32 {
    let s = (ms / 1000.0).ceil();
    if s.is_finite() {
        (s as u32).clamp(1, MAX_RETRY_AFTER_S)
    } else {
        MAX_RETRY_AFTER_S
    }
}

/// May a request join this queue? `Err` says why not and when to come back.
pub fn admit(q: &QueueState, limits: &AdmissionFile) -> Result<Option<f64>, Refusal> {
    let drain_ms_per_request = q
        .service_ms
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| s / f64::from(q.seats.max(1)));
    if q.ahead >= limits.max_queue {
        // Admitted again once the queue is one shorter than its bound.
        let over = f64::from(q.ahead + 1 - limits.max_queue);
        return Err(Refusal {
            message: format!(
                "the queue is full ({} requests waiting, limit {})",
                q.ahead, limits.max_queue
            ),
            retry_after_s: drain_ms_per_request.map_or(1, |d| secs(over * d)),
        });
    }
    let ratio = limits.max_wait_service_ratio;
    if ratio > 0.0 && wait_in_services(q) > ratio {
        // Admitted again once enough seats free up: the excess over the ratio, in requests.
        let over = f64::from(q.ahead + 1) - ratio * f64::from(q.seats.max(1));
        return Err(Refusal {
            message: format!(
                "predicted wait {:.1} service times ({} waiting, {} seats) exceeds the limit of {ratio}",
                wait_in_services(q),
                q.ahead,
                q.seats,
            ),
            retry_after_s: drain_ms_per_request.map_or(1, |d| secs(over.ceil() * d)),
        });
    }
    let predicted = predicted_wait_ms(q);
    let limit = wait_limit_ms(q, limits);
    match predicted {
        Some(p) if p > limit => Err(Refusal {
            message: format!(
                "predicted wait {:.1} s ({} waiting, {} seats) exceeds the limit of {:.1} s",
                p / 1000.0,
                q.ahead,
                q.seats,
                limit / 1000.0
            ),
            // The predicted wait falls by the time passed: admitted after `p - limit`.
            retry_after_s: secs(p - limit),
        }),
        _ => Ok(predicted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_queue: u32, wait_ms: u64, ratio: f64) -> AdmissionFile {
        AdmissionFile {
            max_queue,
            max_predicted_wait_ms: wait_ms,
            max_wait_service_ratio: ratio,
            ..AdmissionFile::default()
        }
    }

    fn q(ahead: u32, seats: u32, service_ms: Option<f64>) -> QueueState {
        QueueState {
            ahead,
            seats,
            service_ms,
        }
    }

    #[test]
    fn predicted_wait_is_position_over_drain_rate() {
        assert_eq!(predicted_wait_ms(&q(0, 2, Some(1000.0))), Some(500.0));
        assert_eq!(predicted_wait_ms(&q(3, 2, Some(1000.0))), Some(2000.0));
        assert_eq!(predicted_wait_ms(&q(3, 2, None)), None);
        assert_eq!(predicted_wait_ms(&q(3, 0, Some(100.0))), Some(400.0));
    }

    #[test]
    fn refused_past_the_predicted_wait_with_retry_after_from_the_excess() {
        let l = limits(100, 10_000, 0.0);
        assert_eq!(admit(&q(18, 2, Some(1000.0)), &l), Ok(Some(9500.0)));
        assert_eq!(admit(&q(19, 2, Some(1000.0)), &l), Ok(Some(10_000.0)));
        let r = admit(&q(29, 2, Some(1000.0)), &l).unwrap_err();
        assert_eq!(
            r.retry_after_s, 5,
            "15 s predicted, 10 s allowed: back in 5 s"
        );
        assert!(r.message.contains("15.0 s"), "{}", r.message);
    }

    #[test]
    fn ratio_bounds_wait_by_service_time() {
        let l = limits(100, 60_000, 1.0);
        assert!(admit(&q(1, 2, Some(400.0)), &l).is_ok(), "400 ms = 1x");
        let r = admit(&q(2, 2, Some(400.0)), &l).unwrap_err();
        assert_eq!(
            r.retry_after_s, 1,
            "a fraction of a second rounds up to 1 s"
        );
    }

    #[test]
    fn ratio_bounds_wait_without_history() {
        // 2 seats, ratio 1: one request may wait (ahead 0 -> 0.5, ahead 1 -> 1 service).
        let l = limits(100, 60_000, 1.0);
        assert_eq!(admit(&q(1, 2, None), &l), Ok(None));
        let r = admit(&q(2, 2, None), &l).unwrap_err();
        assert_eq!(r.retry_after_s, 1);
        assert!(r.message.contains("1.5 service times"), "{}", r.message);
        // With history the Retry-After is the excess at the drain rate: 3 over at 2 per s.
        let r = admit(&q(4, 2, Some(1000.0)), &l).unwrap_err();
        assert_eq!(r.retry_after_s, 2);
    }

    #[test]
    fn count_bound_applies_without_history() {
        let l = limits(4, 60_000, 0.0);
        assert_eq!(admit(&q(3, 1, None), &l), Ok(None));
        let r = admit(&q(4, 1, None), &l).unwrap_err();
        assert_eq!(r.retry_after_s, 1);
        let r = admit(&q(13, 2, Some(1000.0)), &limits(4, 600_000, 0.0)).unwrap_err();
        assert_eq!(r.retry_after_s, 5, "10 over the bound at 2 per second");
    }
}
