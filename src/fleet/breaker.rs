//! Outcome-fed circuit breaker (spec 003): consecutive faults open it for a cooldown, then one
//! half-open trial request decides. Pure: the clock is an argument.

use serde::Serialize;

/// What one request's outcome means for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The node answered properly (2xx, 3xx, and 4xx: a client error is not the node's fault).
    Success,
    /// Connect refused, timeout, 5xx, a stream cut before its end.
    Fault,
}

impl Outcome {
    /// Classify an HTTP status the node sent.
    pub fn of_status(status: u16) -> Outcome {
        if status >= 500 {
            Outcome::Fault
        } else {
            Outcome::Success
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    #[default]
    Closed,
    Open,
    /// Cooldown over: the next request is the trial (or it is in flight).
    HalfOpen,
}

impl BreakerState {
    /// Gauge value: 0 closed, 1 open, 2 half-open.
    pub fn gauge(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::Open => 1,
            BreakerState::HalfOpen => 2,
        }
    }
}

/// The thresholds (from `breaker:` in the config).
#[derive(Debug, Clone, Copy)]
pub struct BreakerPolicy {
    pub failure_threshold: u32,
    pub cooldown_ms: u64,
}

/// One breaker (per node, or per node:model).
#[derive(Debug, Clone, Default)]
pub struct Breaker {
    consecutive_faults: u32,
    /// Set while open: when the cooldown ends.
    open_until_ms: Option<u64>,
    /// The half-open trial request has been dispatched and has not finished.
    trial_in_flight: bool,
}

impl Breaker {
    pub fn state(&self, now_ms: u64) -> BreakerState {
        match self.open_until_ms {
            None => BreakerState::Closed,
            Some(until) if now_ms < until => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        }
    }

    /// Whether routing may send a request here now: closed, or half-open with no trial out.
    pub fn admits(&self, now_ms: u64) -> bool {
        match self.state(now_ms) {
            BreakerState::Closed => true,
            BreakerState::Open => false,
            BreakerState::HalfOpen => !self.trial_in_flight,
        }
    }

    /// A request was dispatched here; in half-open it becomes the one trial.
    /// Returns true when that changed what routing sees.
    pub fn on_dispatch(&mut self, now_ms: u64) -> bool {
        if self.state(now_ms) == BreakerState::HalfOpen && !self.trial_in_flight {
            self.trial_in_flight = true;
            return true;
        }
        false
    }

    /// Feed an outcome; returns the new state when it changed.
    pub fn record(
        &mut self,
        outcome: Outcome,
        now_ms: u64,
        p: BreakerPolicy,
    ) -> Option<BreakerState> {
        let before = self.state(now_ms);
        match outcome {
            Outcome::Success => {
                self.consecutive_faults = 0;
                self.open_until_ms = None;
                self.trial_in_flight = false;
            }
            Outcome::Fault => {
                self.consecutive_faults = self.consecutive_faults.saturating_add(1);
                let trial_failed = before == BreakerState::HalfOpen;
                if trial_failed || self.consecutive_faults >= p.failure_threshold.max(1) {
                    self.open_until_ms = Some(now_ms.saturating_add(p.cooldown_ms));
                    self.trial_in_flight = false;
                }
            }
        }
        let after = self.state(now_ms);
        (after != before).then_some(after)
    }

    pub fn consecutive_faults(&self) -> u32 {
        self.consecutive_faults
    }

    /// When an open breaker's cooldown ends.
    pub fn open_until_ms(&self) -> Option<u64> {
        self.open_until_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: BreakerPolicy = BreakerPolicy {
        failure_threshold: 3,
        cooldown_ms: 1_000,
    };

    #[test]
    fn opens_after_threshold_consecutive_faults() {
        let mut b = Breaker::default();
        assert_eq!(b.record(Outcome::Fault, 0, P), None);
        assert_eq!(b.record(Outcome::Fault, 1, P), None);
        assert!(b.admits(2));
        assert_eq!(b.record(Outcome::Fault, 2, P), Some(BreakerState::Open));
        assert!(!b.admits(3));
        assert!(!b.admits(1_001));
        assert_eq!(b.state(1_002), BreakerState::HalfOpen);
    }

    #[test]
    fn success_resets_the_run() {
        let mut b = Breaker::default();
        b.record(Outcome::Fault, 0, P);
        b.record(Outcome::Fault, 0, P);
        b.record(Outcome::Success, 0, P);
        b.record(Outcome::Fault, 0, P);
        b.record(Outcome::Fault, 0, P);
        assert_eq!(b.state(0), BreakerState::Closed, "not 3 in a row");
    }

    #[test]
    fn one_half_open_trial_then_success_closes() {
        let mut b = Breaker::default();
        for _ in 0..3 {
            b.record(Outcome::Fault, 0, P);
        }
        let t = 1_000;
        assert!(b.admits(t));
        assert!(
            b.on_dispatch(t),
            "first request after cooldown is the trial"
        );
        assert!(!b.admits(t), "only one trial at a time");
        assert!(!b.on_dispatch(t));
        assert_eq!(
            b.record(Outcome::Success, t + 5, P),
            Some(BreakerState::Closed)
        );
        assert!(b.admits(t + 5));
        assert_eq!(b.consecutive_faults(), 0);
    }

    #[test]
    fn failed_trial_reopens_for_another_cooldown() {
        let mut b = Breaker::default();
        for _ in 0..3 {
            b.record(Outcome::Fault, 0, P);
        }
        b.on_dispatch(1_500);
        assert_eq!(b.record(Outcome::Fault, 1_600, P), Some(BreakerState::Open));
        assert!(!b.admits(2_599));
        assert_eq!(b.state(2_600), BreakerState::HalfOpen);
    }

    #[test]
    fn statuses() {
        assert_eq!(Outcome::of_status(200), Outcome::Success);
        assert_eq!(Outcome::of_status(404), Outcome::Success);
        assert_eq!(Outcome::of_status(429), Outcome::Success);
        assert_eq!(Outcome::of_status(500), Outcome::Fault);
        assert_eq!(Outcome::of_status(503), Outcome::Fault);
    }
}
