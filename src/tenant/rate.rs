//! Requests and tokens per minute: a sliding one-minute window of one-second buckets. Pure:
//! time is an argument (whole seconds).

const SLOTS: usize = 60;

/// What was admitted during the last minute.
#[derive(Debug, Clone)]
pub struct Window {
    /// Per slot: the second it holds and the amount admitted in it.
    slots: [(u64, u64); SLOTS],
}

impl Default for Window {
    fn default() -> Self {
        Window {
            slots: [(0, 0); SLOTS],
        }
    }
}

impl Window {
    /// Admitted during the minute ending at `now_s` (inclusive).
    pub fn total(&self, now_s: u64) -> u64 {
        self.slots
            .iter()
            .filter(|(s, _)| live(*s, now_s))
            .map(|(_, n)| n)
            .sum()
    }

    pub fn add(&mut self, now_s: u64, n: u64) {
        let slot = &mut self.slots[(now_s % SLOTS as u64) as usize];
        if slot.0 != now_s || slot.1 == 0 {
            *slot = (now_s, 0);
        }
        slot.1 = slot.1.saturating_add(n);
    }

    /// Seconds until `n` more fit under `limit`: `None` when they fit now. A request larger
    /// than the whole limit fits once the window is empty (else it could never pass).
    pub fn wait_for(&self, now_s: u64, n: u64, limit: u64) -> Option<u64> {
        let mut total = self.total(now_s);
        if total.saturating_add(n) <= limit || total == 0 {
            return None;
        }
        let mut live_slots: Vec<(u64, u64)> = self
            .slots
            .iter()
            .copied()
            .filter(|(s, amount)| live(*s, now_s) && *amount > 0)
            .collect();
        live_slots.sort_unstable();
        for (second, amount) in live_slots {
            total -= amount;
            if total.saturating_add(n) <= limit || total == 0 {
                // That slot leaves the window one minute after its second.
                return Some((second + SLOTS as u64).saturating_sub(now_s).max(1));
            }
        }
        Some(SLOTS as u64)
    }
}

fn live(second: u64, now_s: u64) -> bool {
    second <= now_s && now_s - second < SLOTS as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_last_minute_only() {
        let mut w = Window::default();
        w.add(100, 5);
        w.add(130, 7);
        assert_eq!(w.total(130), 12);
        assert_eq!(w.total(159), 12);
        assert_eq!(w.total(160), 7, "second 100 left the window");
        assert_eq!(w.total(190), 0);
        w.add(220, 1); // same slot as 160 and 100: reused, not summed
        assert_eq!(w.total(220), 1);
    }

    #[test]
    fn wait_is_until_enough_of_the_window_expires() {
        let mut w = Window::default();
        w.add(10, 3);
        w.add(20, 3);
        assert_eq!(w.wait_for(25, 4, 10), None);
        assert_eq!(w.wait_for(25, 5, 10), Some(45), "second 10 leaves at 70");
        assert_eq!(
            w.wait_for(25, 8, 10),
            Some(55),
            "both must leave: second 20 at 80"
        );
        assert_eq!(
            w.wait_for(25, 50, 10),
            Some(55),
            "oversized: once the window is empty"
        );
        assert_eq!(Window::default().wait_for(0, 50, 10), None);
    }
}
