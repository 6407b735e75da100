//! The streams a node is decoding as the gateway sees them: a request counts from its first
//! streamed byte to its end. Each request learns how many streams decoded beside it on average
//! over its own decode (the time integral of the count over its decode, over its length): what
//! its seconds per token were paid at (`fleet::rates`).
//!
//! The count at the send or the end is a poor stand-in: requests still prefilling a long
//! prompt are in flight but not decoding, and the count changes many times during one answer.
//! Learned against in-flight counts, the sim's 5 % per stream came out near zero and completion
//! mode piled streams on one node as if they were free.
//!
//! The most streams seen decoding at once (as many seats as the node surely has) is kept from a
//! stream's mean count over its decode, when it ends (`most`); while streams run, a count that
//! has held `HELD_MS` counts too (`held`, until streams end below it). A 70B's answers run for
//! many seconds: waiting for the first of them to end left an 8-seat server priced at two seats
//! while it streamed four. Only the mean is kept: a count held through a late read of a
//! stream's end (a gateway slow to be scheduled) is gone with that stream.

use parking_lot::Mutex;

/// Per node (`NodeState::decoding`) and per node:model (`ModelCounters::decoding`).
#[derive(Debug, Default)]
pub struct DecodeClock(Mutex<Clock>);

#[derive(Debug, Default)]
struct Clock {
    streams: u32,
    /// The most streams that ever decoded at once, as a stream's mean count over its decode.
    most: u32,
    /// The most streams decoding now that held `HELD_MS` together (no more than `streams`).
    held: u32,
    /// When `streams` last changed.
    since_ms: u64,
    /// When a stream last ended.
    last_end_ms: u64,
    /// Stream-milliseconds decoded since the clock began.
    area: u64,
    at_ms: u64,
}

impl Clock {
    fn advance(&mut self, now_ms: u64) {
        let dt = now_ms.saturating_sub(self.at_ms);
        self.area = self.area.saturating_add(u64::from(self.streams) * dt);
        self.at_ms = self.at_ms.max(now_ms);
    }

    /// Count the streams decoding now as seats once they have decoded together `HELD_MS`.
    fn credit(&mut self, now_ms: u64) {
        if self.streams > self.held && now_ms.saturating_sub(self.since_ms) >= HELD_MS {
            self.held = self.streams;
        }
    }

    /// The count changes now.
    fn change(&mut self, now_ms: u64) {
        self.credit(now_ms);
        self.advance(now_ms);
        self.since_ms = self.since_ms.max(now_ms);
    }
}

/// One request's decode, held with its seat (`Lease`).
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    area: u64,
    at_ms: u64,
}

impl DecodeClock {
    /// A request's first byte: it decodes from now.
    pub fn enter(&self, now_ms: u64) -> Mark {
        let mut c = self.0.lock();
        c.change(now_ms);
        c.streams += 1;
        Mark {
            area: c.area,
            at_ms: c.at_ms,
        }
    }

    /// The request ended. Returns the mean number of streams that decoded while it did, itself
    /// included; `None` when it decoded for under `MIN_MS` (a reply in one piece: no decode
    /// seen).
    pub fn leave(&self, m: Mark, now_ms: u64) -> Option<f64> {
        let mut c = self.0.lock();
        c.change(now_ms);
        c.streams = c.streams.saturating_sub(1);
        c.held = c.held.min(c.streams);
        c.last_end_ms = c.last_end_ms.max(now_ms);
        let dt = c.at_ms.saturating_sub(m.at_ms);
        let mean = (dt >= MIN_MS).then(|| c.area.saturating_sub(m.area) as f64 / dt as f64);
        if let Some(n) = mean {
            // Rounded: a stream that came in a moment before another's end was seen (the
            // node freed that seat, the gateway had not read its last bytes yet) is not a
            // seat more.
            c.most = c.most.max(n.round() as u32);
        }
        mean
    }

    /// When a stream on the node last ended (ms; 0: none yet).
    pub fn last_end_ms(&self) -> u64 {
        self.0.lock().last_end_ms
    }

    /// Streams decoding now.
    pub fn streams(&self) -> u32 {
        self.0.lock().streams
    }

    /// The most streams seen decoding at once since the gateway started, as one stream's
    /// mean over its decode (rounded): a node runs at least that many requests at once
    /// (`fleet::sharing`, a node whose seats nobody said).
    pub fn most(&self) -> u32 {
        self.0.lock().most
    }

    /// [`most`](Self::most), or at `now_ms` more: the streams decoding now once they have held
    /// `HELD_MS` together (the routing view is built with it: `fleet::view`).
    pub fn seen(&self, now_ms: u64) -> u32 {
        let mut c = self.0.lock();
        c.credit(now_ms);
        c.most.max(c.held)
    }
}

/// Decodes shorter than this teach nothing about concurrency (the clock reads milliseconds).
const MIN_MS: u64 = 5;

/// Streams that decoded together this long hold that many seats at once. A one-seat server
/// starts its next answer only after it has sent the last token of the one before; the
/// gateway reads that end a moment later (a LAN round trip, a scheduling delay), so a stream
/// that came in a moment before another's end is not a seat more. Nor is one past its first
/// byte for less than this.
pub const HELD_MS: u64 = 100;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_learns_the_mean_count_over_its_own_decode() {
        let c = DecodeClock::default();
        let a = c.enter(1_000);
        // b decodes beside a from 1,100 to 1,200; x from 1,200 to 1,400.
        let b = c.enter(1_100);
        assert_eq!(c.streams(), 2);
        let x = c.enter(1_200);
        assert_eq!(c.streams(), 3);
        assert_eq!(c.leave(b, 1_200), Some(2.0), "b: its 100 ms beside a");
        assert_eq!(c.leave(x, 1_400), Some(2.0));
        // a: 100 ms alone, 100 beside b, 200 beside x: 700 stream-ms over 400.
        assert_eq!(c.leave(a, 1_400), Some(1.75));
        assert_eq!(c.streams(), 0);
        assert_eq!(c.most(), 2, "x decoded beside one other (a) all its decode");
    }

    #[test]
    fn a_reply_in_one_piece_teaches_no_count_and_a_clock_going_back_does_not_underflow() {
        let c = DecodeClock::default();
        let a = c.enter(5_000);
        assert_eq!(c.leave(a, 5_002), None);
        let b = c.enter(6_000);
        let late = c.enter(5_900);
        assert_eq!(c.leave(late, 5_950), None);
        assert_eq!(c.leave(b, 6_100), Some(1.0));
    }

    #[test]
    fn streams_that_decode_together_long_enough_are_seats_before_any_ends() {
        let c = DecodeClock::default();
        c.enter(1_000);
        c.enter(1_050);
        assert_eq!(
            c.seen(1_100),
            0,
            "a alone held 50 ms, the pair 50 ms: nothing yet"
        );
        assert_eq!(c.seen(1_150), 2, "a and b held 100 ms together: two seats");
        c.enter(1_160);
        c.enter(1_170);
        assert_eq!(c.seen(1_269), 2, "four for 99 ms");
        assert_eq!(c.seen(1_270), 4, "four held 100 ms, none ended yet");
        assert_eq!(c.most(), 0, "no stream ended");
    }

    #[test]
    fn a_stream_that_came_in_a_moment_before_another_ended_is_no_seat_more() {
        let c = DecodeClock::default();
        let a = c.enter(1_000);
        // A one-seat server: b's first byte is read 20 ms before a's end is.
        let b = c.enter(3_000);
        let mean = c.leave(a, 3_020).expect("a decoded 2 s");
        assert_eq!(mean.round(), 1.0, "{mean}");
        assert_eq!(c.seen(3_500), 1);
        let third = c.enter(3_600);
        c.leave(b, 3_630);
        assert_eq!(c.seen(9_000), 1, "one at a time, however long");
        // The gateway read d's first byte 150 ms before the third's end (it was not scheduled):
        // two for as long, then d alone for 2 s. Its mean says one; the two are gone with it.
        let d = c.enter(9_000);
        assert_eq!(c.seen(9_150), 2, "while both run");
        c.leave(third, 9_150);
        assert_eq!(c.seen(9_200), 1);
        let mean = c.leave(d, 11_150).expect("d decoded 2 s");
        assert_eq!(mean.round(), 1.0, "{mean}");
        assert_eq!(c.seen(20_000), 1);
    }
}
