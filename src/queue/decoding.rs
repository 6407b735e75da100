//! The streams a node is decoding as the gateway sees them: a request counts from its first
//! streamed byte to its end. Each request learns how many streams decoded beside it on average
//! over its own decode (the time integral of the count over its decode, over its length): what
//! its seconds per token were paid at (`fleet::rates`).
//!
//! The count at the send or the end is a poor stand-in: requests still prefilling a long
//! prompt are in flight but not decoding, and the count changes many times during one answer.
//! Learned against in-flight counts, the sim's 5 % per stream came out near zero and completion
//! mode piled streams on one node as if they were free.

use parking_lot::Mutex;

/// Per node (`NodeState::decoding`) and per node:model (`ModelCounters::decoding`).
#[derive(Debug, Default)]
pub struct DecodeClock(Mutex<Clock>);

#[derive(Debug, Default)]
struct Clock {
    streams: u32,
    /// The most streams that ever decoded at once: as many seats as the node surely has.
    most: u32,
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
        c.advance(now_ms);
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
        c.advance(now_ms);
        c.streams = c.streams.saturating_sub(1);
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
}

/// Decodes shorter than this teach nothing about concurrency (the clock reads milliseconds).
const MIN_MS: u64 = 5;

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
}
