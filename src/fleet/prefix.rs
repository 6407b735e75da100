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
    /// Requests seen that start a conversation / continue one / continue one this gateway did
    /// not remember placing (halved together past [`TURNS_WINDOW`], so the shares follow the
    /// workload).
    turns: Mutex<Turns>,
}

#[derive(Debug, Default)]
struct Turns {
    first: f64,
    later: f64,
    unrecalled: f64,
}

/// First turns counted before both counts are halved.
const TURNS_WINDOW: f64 = 1024.0;

impl PrefixMemory {
    /// Count a request with a stable prefix: a first turn, or one that continues (see
    /// `protocol::prefix::Prefix::continues`), and then whether this gateway remembered where
    /// its conversation was (`recalled`).
    pub fn note_turn(&self, continues: bool, recalled: bool) {
        let mut t = self.turns.lock();
        if continues {
            t.later += 1.0;
            if !recalled {
                t.unrecalled += 1.0;
            }
        } else {
            t.first += 1.0;
        }
        if t.first > TURNS_WINDOW || t.later > TURNS_WINDOW {
            t.first /= 2.0;
            t.later /= 2.0;
            t.unrecalled /= 2.0;
        }
    }

    /// How much of a first turn's stable prefix to count as cached on its rendezvous node:
    /// what a first turn placed there is worth to its later turns that reach the node through
    /// another gateway (a replica, or this one after a restart), which credit the rendezvous
    /// node. Later turns per first turn (how likely a conversation comes back; one-shot
    /// traffic drives it towards 0), times the share of later turns this gateway did not
    /// remember placing (turns placed elsewhere; towards 0 when one gateway serves every
    /// turn, which finds its conversations by memory and gains nothing from the credit). To
    /// start, one first turn and one later turn counted, and of two later turns one placed
    /// elsewhere: 0.5 before any traffic.
    pub fn first_turn_share(&self) -> f64 {
        let t = self.turns.lock();
        let returns = ((t.later + 1.0) / (t.first + 1.0)).min(1.0);
        let elsewhere = (t.unrecalled + 1.0) / (t.later + 2.0);
        returns * elsewhere
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
    fn the_first_turn_share_follows_the_workload() {
        let m = PrefixMemory::default();
        assert_eq!(m.first_turn_share(), 0.5, "no traffic yet");
        for _ in 0..99 {
            m.note_turn(false, false);
        }
        assert!(
            (m.first_turn_share() - 0.005).abs() < 1e-9,
            "one-shot traffic"
        );
        // Chats of six turns, every later turn placed by another gateway: five later turns
        // per first one, the share capped at 1.
        for _ in 0..200 {
            m.note_turn(false, false);
            for _ in 0..5 {
                m.note_turn(true, false);
            }
        }
        assert!(m.first_turn_share() > 0.99, "{}", m.first_turn_share());
        // Back to one-shot traffic: the old counts are halved away.
        for _ in 0..10_000 {
            m.note_turn(false, false);
        }
        assert!(m.first_turn_share() < 0.01, "{}", m.first_turn_share());
    }

    /// One gateway that finds every later turn by memory gains nothing from crediting a
    /// first turn on its rendezvous node; with a replica placing half the turns, half.
    #[test]
    fn the_first_turn_share_falls_when_this_gateway_placed_every_later_turn() {
        let alone = PrefixMemory::default();
        let shared = PrefixMemory::default();
        for i in 0..200 {
            alone.note_turn(false, false);
            shared.note_turn(false, false);
            for j in 0..5 {
                alone.note_turn(true, true);
                shared.note_turn(true, (i + j) % 2 == 0);
            }
        }
        assert!(
            alone.first_turn_share() < 0.01,
            "{}",
            alone.first_turn_share()
        );
        let half = shared.first_turn_share();
        assert!((0.4..=0.6).contains(&half), "{half}");
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
