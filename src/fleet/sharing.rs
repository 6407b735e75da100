//! Whether a node's models share its seats: one count for the node (a server with a single
//! queue, the simulated nodes) or each model its own (Ollama's `OLLAMA_NUM_PARALLEL` is per
//! loaded model). Learned from the answers of warm requests sent while every seat of the node
//! was taken (`routing::SeatTest`): with shared seats each waited inside the node about as
//! long as routing predicted a node-wide seat would take to free, with its own it started at
//! once. Until the answers say so, the seats are each model's own.

use serde::{Deserialize, Serialize};

use super::decay::alpha;

/// Answers that must have tested the node before it is taken to share its seats.
const MIN_TESTS: u32 = 3;
/// Share of the predicted node-wide waits the answers must show (a line through the origin):
/// halfway between the two explanations.
const SHARED_AT: f64 = 0.5;

/// Time-decayed sums of a line through the origin: what the answers waited past their own
/// prediction against the node-wide wait predicted for them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeatSharing {
    sxy: f64,
    sxx: f64,
    tests: u32,
    at_ms: u64,
}

impl SeatSharing {
    /// The node's models share its seats.
    pub fn shared(&self) -> bool {
        self.tests >= MIN_TESTS && self.sxx > 0.0 && self.sxy >= SHARED_AT * self.sxx
    }

    /// How likely the node's models share its seats: 1 or 0 once the answers decided it
    /// (`MIN_TESTS`), before that the share of the node-wide waits its answers showed so far
    /// (the line's slope, at most 1), with the `prior` (`completion_seats_shared_prior`)
    /// weighed as one answer more. What routing weighs the wait for a node-wide seat by while
    /// it does not know (`completion::Prediction::risk_s`).
    pub fn belief(&self, prior: f64) -> f64 {
        if self.tests >= MIN_TESTS {
            return if self.shared() { 1.0 } else { 0.0 };
        }
        let n = f64::from(self.tests);
        let slope = if self.sxx > 0.0 {
            (self.sxy / self.sxx).clamp(0.0, 1.0)
        } else {
            prior
        };
        (n * slope + prior) / (n + 1.0)
    }

    /// One answer of a request sent to the full node: `shared_wait_s` the wait for a
    /// node-wide seat routing predicted, `waited_s` how much later than its own prediction it
    /// came (first token, else its end). Taken between 0 and twice the prediction, so one
    /// hiccup does not outweigh the rest. Returns whether the verdict changed.
    pub fn observe(&mut self, shared_wait_s: f64, waited_s: f64, now_ms: u64) -> bool {
        if !(shared_wait_s.is_finite() && shared_wait_s > 0.0 && waited_s.is_finite()) {
            return false;
        }
        let before = self.shared();
        let a = if self.tests == 0 {
            1.0
        } else {
            alpha(now_ms.saturating_sub(self.at_ms))
        };
        let (x, y) = (shared_wait_s, waited_s.clamp(0.0, 2.0 * shared_wait_s));
        self.sxy = (1.0 - a) * self.sxy + a * x * y;
        self.sxx = (1.0 - a) * self.sxx + a * x * x;
        self.tests = self.tests.saturating_add(1);
        self.at_ms = now_ms;
        self.shared() != before
    }
}

/// A node whose seats nobody said (no `capacity`, none reported: a batching server's default
/// is assumed): whether it runs no more requests at once than the most it was seen to, from
/// the answers of requests sent while it ran that many (`routing::SeatTest::bound`), the same
/// line as [`SeatSharing`]. Answers tested against fewer than the count now seen say nothing
/// of it (it ran more since): a higher count starts the line afresh.
#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeatBound {
    /// The count the answers on the line were tested against.
    seats: u32,
    line: SeatSharing,
}

impl SeatBound {
    /// The node's seats, when answers showed it runs no more at once.
    pub fn seats(&self) -> Option<u32> {
        (self.seats > 0 && self.line.shared()).then_some(self.seats)
    }

    /// How likely it runs no more at once than the count its answers are tested against, as
    /// [`SeatSharing::belief`]: on a node whose seats nobody said, what "its models share its
    /// seats" means (they are then that count, the node's). Seen to run more at once (`seen`)
    /// than that count, the line says nothing any more: the prior, until answers at the new
    /// count start one.
    pub fn belief(&self, prior: f64, seen: u32) -> f64 {
        if seen > self.seats {
            prior
        } else {
            self.line.belief(prior)
        }
    }

    /// One answer of a request sent while the node ran `seats` at once; as
    /// [`SeatSharing::observe`]. Returns whether the verdict changed.
    pub fn observe(&mut self, seats: u32, wait_s: f64, waited_s: f64, now_ms: u64) -> bool {
        if seats == 0 || seats < self.seats {
            return false;
        }
        let before = self.seats();
        if seats > self.seats {
            *self = SeatBound {
                seats,
                line: SeatSharing::default(),
            };
        }
        self.line.observe(wait_s, waited_s, now_ms);
        self.seats() != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sent while the node ran one at once, answers that waited less than a single seat would
    /// have made them (it has more) say nothing once it runs four: four answers that waited as
    /// four seats predict make those its seats, whatever the earlier count's line said.
    #[test]
    fn a_node_runs_no_more_than_seen_once_answers_at_that_count_say_so() {
        let mut b = SeatBound::default();
        let mut t = 1_000;
        for _ in 0..6 {
            assert!(!b.observe(1, 2.0, 0.4, t));
            t += 50;
        }
        assert_eq!(b.seats(), None, "one seat: refuted");
        for (i, (predicted, waited)) in [(0.5, 0.45), (0.3, 0.35), (0.8, 0.7)]
            .into_iter()
            .enumerate()
        {
            let flipped = b.observe(4, predicted, waited, t);
            assert_eq!(flipped, i == 2, "its seats from the third answer at four");
            t += 50;
        }
        assert_eq!(b.seats(), Some(4));
        assert!(!b.observe(3, 0.5, 0.0, t), "a count since surpassed");
        assert_eq!(b.seats(), Some(4));
    }

    /// Before any answer, the prior; each answer moves the odds towards what it showed, the
    /// prior weighed as one answer; from the third the verdict is all there is.
    #[test]
    fn the_odds_of_shared_seats_follow_the_answers_until_they_decide() {
        let near = |got: f64, want: f64| assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        let mut s = SeatSharing::default();
        near(s.belief(0.2), 0.2);
        s.observe(1.0, 1.0, 1_000);
        near(s.belief(0.2), 0.6);
        s.observe(1.0, 1.0, 1_100);
        near(s.belief(0.2), 2.2 / 3.0);
        s.observe(1.0, 0.9, 1_200);
        near(s.belief(0.2), 1.0);

        let mut own = SeatSharing::default();
        own.observe(2.0, 0.0, 1_000);
        near(own.belief(0.5), 0.25);
        own.observe(2.0, 0.1, 1_100);
        own.observe(2.0, 0.0, 1_200);
        near(own.belief(0.5), 0.0);

        // Tested at two at once, it ran no more: 1. Seen to run three since, that says
        // nothing of three: the prior again.
        let mut bound = SeatBound::default();
        for t in [1_000, 1_100, 1_200] {
            bound.observe(2, 1.0, 1.0, t);
        }
        near(bound.belief(0.2, 2), 1.0);
        near(bound.belief(0.2, 3), 0.2);
    }

    /// Answers that waited about as long as the node-wide seat was predicted to take: shared,
    /// from the third on. Answers that came when their own prediction said: each model's own.
    /// A node that stops making them wait (its server restarted with more parallel slots) is
    /// taken back within a few answers.
    #[test]
    fn answers_that_waited_for_a_node_wide_seat_say_the_seats_are_shared() {
        let mut s = SeatSharing::default();
        let mut t = 1_000;
        let waits = [(0.30, 0.27), (0.10, 0.13), (0.50, 0.41), (0.20, 0.22)];
        let mut flips = Vec::new();
        for (i, (predicted, waited)) in waits.into_iter().enumerate() {
            if s.observe(predicted, waited, t) {
                flips.push(i);
            }
            t += 200;
        }
        assert!(s.shared());
        assert_eq!(flips, vec![2], "shared once three answers said so");

        let mut own = SeatSharing::default();
        for (predicted, waited) in [(0.30, 0.02), (0.10, -0.01), (0.50, 0.06), (0.20, 0.0)] {
            own.observe(predicted, waited, t);
            t += 200;
        }
        assert!(!own.shared(), "{own:?}");

        let mut n = 0;
        while s.shared() {
            s.observe(0.3, 0.01, t);
            t += 200;
            n += 1;
            assert!(
                n <= 8,
                "still shared after {n} answers that did not wait: {s:?}"
            );
        }
    }

    /// Nonsense (no wait predicted, a NaN) teaches nothing.
    #[test]
    fn answers_without_a_predicted_wait_teach_nothing() {
        let mut s = SeatSharing::default();
        for t in 0..10 {
            assert!(!s.observe(0.0, 1.0, t * 100));
            assert!(!s.observe(f64::NAN, 1.0, t * 100));
            assert!(!s.observe(0.2, f64::NAN, t * 100));
        }
        assert_eq!(s, SeatSharing::default());
    }
}
