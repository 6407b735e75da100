//! Which node last served a conversation's prefix key, and how many tokens (prompt + output)
//! it then held: the prefix cache the completion model credits on that node. Bounded; entries
//! older than [`TTL_MS`] are forgotten (a node's cache does not hold a prefix forever).

use std::collections::HashMap;

use parking_lot::Mutex;

/// Most keys remembered.
pub const MAX_KEYS: usize = 16_384;
/// A prefix unused this long is taken as evicted from the node's cache.
pub const TTL_MS: u64 = 10 * 60 * 1000;

#[derive(Debug, Clone, Copy)]
struct Entry {
    node: usize,
    tokens: u32,
    at_ms: u64,
}

#[derive(Debug, Default)]
pub struct PrefixMemory {
    map: Mutex<HashMap<u64, Entry>>,
    /// Requests seen that start a conversation / continue one (halved together past
    /// [`TURNS_WINDOW`], so the share follows the workload).
    turns: Mutex<(f64, f64)>,
}

/// First turns counted before both counts are halved.
const TURNS_WINDOW: f64 = 1024.0;

impl PrefixMemory {
    /// Count a request with a stable prefix: a first turn, or one that continues (see
    /// `protocol::prefix::Prefix::continues`).
    pub fn note_turn(&self, continues: bool) {
        let mut t = self.turns.lock();
        if continues {
            t.1 += 1.0;
        } else {
            t.0 += 1.0;
        }
        if t.0 > TURNS_WINDOW {
            t.0 /= 2.0;
            t.1 /= 2.0;
        }
    }

    /// How likely a first turn is to come back for more: later turns per first turn, at most
    /// 1, with one of each counted to start (1 before any traffic). Single-request traffic
    /// (batch jobs, one-shot prompts) drives it towards 0, chat traffic keeps it at 1.
    pub fn return_share(&self) -> f64 {
        let t = self.turns.lock();
        ((t.1 + 1.0) / (t.0 + 1.0)).min(1.0)
    }

    /// Node `node` just served `key` and holds `tokens` of its conversation.
    pub fn remember(&self, key: u64, node: usize, tokens: u32, now_ms: u64) {
        let mut map = self.map.lock();
        if map.len() >= MAX_KEYS && !map.contains_key(&key) {
            map.retain(|_, e| now_ms.saturating_sub(e.at_ms) < TTL_MS);
            if map.len() >= MAX_KEYS {
                let mut ages: Vec<u64> = map.values().map(|e| e.at_ms).collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                map.retain(|_, e| e.at_ms > cut);
            }
        }
        map.insert(
            key,
            Entry {
                node,
                tokens,
                at_ms: now_ms,
            },
        );
    }

    /// The node holding `key`'s prefix and its tokens, while fresh.
    pub fn recall(&self, key: u64, now_ms: u64) -> Option<(usize, u32)> {
        let map = self.map.lock();
        let e = map.get(&key)?;
        (now_ms.saturating_sub(e.at_ms) < TTL_MS).then_some((e.node, e.tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_return_share_follows_the_workload() {
        let m = PrefixMemory::default();
        assert_eq!(m.return_share(), 1.0, "no traffic yet");
        for _ in 0..99 {
            m.note_turn(false);
        }
        assert!((m.return_share() - 0.01).abs() < 1e-9, "one-shot traffic");
        // Chats of six turns: five later turns per first one, the share capped at 1.
        for _ in 0..200 {
            m.note_turn(false);
            for _ in 0..5 {
                m.note_turn(true);
            }
        }
        assert_eq!(m.return_share(), 1.0);
        // Back to one-shot traffic: the old counts are halved away.
        for _ in 0..10_000 {
            m.note_turn(false);
        }
        assert!(m.return_share() < 0.01, "{}", m.return_share());
    }

    #[test]
    fn remembers_the_last_server_and_forgets_stale_or_excess_keys() {
        let m = PrefixMemory::default();
        m.remember(7, 2, 900, 1_000);
        m.remember(7, 1, 1_500, 2_000);
        assert_eq!(m.recall(7, 3_000), Some((1, 1_500)));
        assert_eq!(m.recall(7, 2_000 + TTL_MS), None);
        for k in 0..(MAX_KEYS as u64 + 10) {
            m.remember(100 + k, 0, 1, 10_000 + k);
        }
        assert!(m.map.lock().len() <= MAX_KEYS);
        assert!(m.recall(100 + MAX_KEYS as u64 + 9, 20_000).is_some());
    }
}
