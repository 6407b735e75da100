//! Which node last served a conversation's prefix key, and how many tokens (prompt + output)
//! it then held: the prefix cache the completion model credits on that node. Bounded; entries
//! older than [`TTL_MS`] are forgotten (a node's cache does not hold a prefix forever).
//!
//! Beside it, per system prompt (model + the hash of a request's system part, shared by
//! every conversation an agent or app starts), the last [`SHARED_NODES`] nodes that served
//! one, and when in each node's own count of prompts prefilled (a request's first byte: its
//! prompt is in the cache from then): the completion model credits the system part as cached
//! on those that prefilled it within their last `reach` prompts, so requests that share a
//! system prompt gather where it is cached, as a cache-aware router's prefix tree does, at
//! the grain of whole messages. A node's prefix cache holds its last few prompts (Ollama its
//! seats' last, the sim its LRU entries, vLLM many more): `reach` is learned per node from
//! what its answers say of their cache (a hit `d` prompts back says it holds at least
//! `d + 1`; a miss moves it halfway down to `d`: a miss can also be a prompt the node took
//! in after the decision), from [`INITIAL_REACH`].

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

/// Nodes remembered per system prompt, the most recent first.
pub const SHARED_NODES: usize = 4;
/// Prompts back a node's cache is taken to reach before anything is learned of it.
pub const INITIAL_REACH: u64 = 8;
/// The most a reach is taken to be (a node's counts wrap no sooner).
pub const MAX_REACH: u64 = 1 << 32;

/// The last nodes that served a system prompt (node, ms, the node's prompt count then), the
/// most recent first.
type Servers = [Option<(usize, u64, u64)>; SHARED_NODES];

/// Per node and model: prompts prefilled, and how many prompts back its prefix cache reaches.
#[derive(Debug, Clone, Copy)]
struct NodeCache {
    prompts: u64,
    reach: u64,
}

impl Default for NodeCache {
    fn default() -> Self {
        NodeCache {
            prompts: 0,
            reach: INITIAL_REACH,
        }
    }
}

/// A node that served a system prompt: which, and how many prompts it prefilled since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    pub node: usize,
    pub since: u64,
    /// Within what its cache is learned to reach.
    pub cached: bool,
}

#[derive(Debug, Default)]
pub struct PrefixMemory {
    map: Mutex<HashMap<u64, Entry>>,
    shared: Mutex<HashMap<u64, Servers>>,
    /// Per (node, hash of the model's name): a prefix cache is the model's (Ollama's runner,
    /// the sim's LRU), so another model's prompts do not push this one's out.
    caches: Mutex<HashMap<(usize, u64), NodeCache>>,
    /// The names behind the model hashes whose reach was learned (what `rates.json` keeps).
    names: Mutex<HashMap<u64, Box<str>>>,
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
        make_room(&mut map, key, now_ms, |e| e.at_ms);
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

    /// Node `node` prefilled a prompt of `model` (an answer's first byte came): one more in
    /// that cache's count (what pushes older prompts out). `system`: the request's system
    /// prompt key, remembered as cached there.
    pub fn prefilled(&self, node: usize, model: &str, system: Option<u64>, now_ms: u64) {
        let prompts = {
            let mut caches = self.caches.lock();
            let n = caches.entry((node, model_hash(model))).or_default();
            n.prompts += 1;
            n.prompts
        };
        let Some(key) = system else { return };
        let mut map = self.shared.lock();
        make_room(&mut map, key, now_ms, |s| s[0].map_or(0, |e| e.1));
        let servers = map.entry(key).or_default();
        // Move `node` to the front; the least recent falls off when it was not there.
        let i = servers
            .iter()
            .position(|s| s.is_some_and(|e| e.0 == node))
            .unwrap_or(SHARED_NODES - 1);
        servers[..=i].rotate_right(1);
        servers[0] = Some((node, now_ms, prompts));
    }

    /// The nodes that served system prompt `key` (of `model`) while fresh, the most recent
    /// first.
    pub fn shared_on(&self, key: u64, model: &str, now_ms: u64) -> Vec<Served> {
        let Some(servers) = self.shared.lock().get(&key).copied() else {
            return Vec::new();
        };
        let model = model_hash(model);
        let caches = self.caches.lock();
        servers
            .into_iter()
            .flatten()
            .filter(|e| now_ms.saturating_sub(e.1) < TTL_MS)
            .map(|(node, _, at)| {
                let n = caches.get(&(node, model)).copied().unwrap_or_default();
                let since = n.prompts.saturating_sub(at);
                Served {
                    node,
                    since,
                    cached: since < n.reach,
                }
            })
            .collect()
    }

    /// What an answer of `node` said of its cache for a system prompt it prefilled `since`
    /// prompts before the request was placed: held (`hit`) or not.
    pub fn cache_seen(&self, node: usize, model: &str, since: u64, hit: bool) {
        let hash = self.named(model);
        let mut caches = self.caches.lock();
        let n = caches.entry((node, hash)).or_default();
        n.reach = if hit {
            n.reach.max(since.saturating_add(1)).min(MAX_REACH)
        } else if since < n.reach {
            (since + (n.reach - since) / 2).max(1)
        } else {
            n.reach
        };
    }

    /// How many prompts back `node`'s prefix cache of `model` is taken to reach.
    pub fn reach(&self, node: usize, model: &str) -> u64 {
        self.caches
            .lock()
            .get(&(node, model_hash(model)))
            .map_or(INITIAL_REACH, |n| n.reach)
    }

    /// Every (node, model, reach) learned to differ from [`INITIAL_REACH`], for `rates.json`.
    pub fn reaches(&self) -> Vec<(usize, String, u64)> {
        let names = self.names.lock();
        self.caches
            .lock()
            .iter()
            .filter(|(_, n)| n.reach != INITIAL_REACH)
            .filter_map(|(&(node, hash), n)| Some((node, names.get(&hash)?.to_string(), n.reach)))
            .collect()
    }

    /// Take back a reach learned before a restart (`rates.json`), within 1..=[`MAX_REACH`].
    pub fn restore_reach(&self, node: usize, model: &str, reach: u64) {
        let hash = self.named(model);
        self.caches.lock().entry((node, hash)).or_default().reach = reach.clamp(1, MAX_REACH);
    }

    /// `model`'s hash, its name remembered.
    fn named(&self, model: &str) -> u64 {
        let hash = model_hash(model);
        self.names
            .lock()
            .entry(hash)
            .or_insert_with(|| model.into());
        hash
    }
}

fn model_hash(model: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(model.as_bytes())
}

/// Before `key` joins a full map: drop what is stale, then, if still full, the older half
/// (by `at`, ms).
fn make_room<V>(map: &mut HashMap<u64, V>, key: u64, now_ms: u64, at: impl Fn(&V) -> u64) {
    if map.len() < MAX_KEYS || map.contains_key(&key) {
        return;
    }
    map.retain(|_, v| now_ms.saturating_sub(at(v)) < TTL_MS);
    if map.len() >= MAX_KEYS {
        let mut ages: Vec<u64> = map.values().map(&at).collect();
        ages.sort_unstable();
        let cut = ages[ages.len() / 2];
        map.retain(|_, v| at(v) > cut);
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
    fn a_system_prompt_is_cached_where_it_was_served_within_the_reach_learned() {
        let m = PrefixMemory::default();
        assert!(m.shared_on(7, "m", 0).is_empty());
        for (node, at) in [(0, 1), (1, 2), (0, 3), (2, 4), (3, 5), (4, 6)] {
            m.prefilled(node, "m", Some(7), at);
        }
        let nodes = |m: &PrefixMemory, now| -> Vec<usize> {
            m.shared_on(7, "m", now).iter().map(|s| s.node).collect()
        };
        assert_eq!(
            nodes(&m, 10),
            [4, 3, 2, 0],
            "the most recent first, node 1 fell off"
        );
        assert!(m.shared_on(8, "m", 10).is_empty(), "per system prompt");
        assert_eq!(nodes(&m, 5 + TTL_MS), [4], "stale servers forgotten");
        // Node 0 prefills others: the prompt moves back in its cache, and out past its reach.
        let on_0 = |m: &PrefixMemory| {
            m.shared_on(7, "m", 10)
                .into_iter()
                .find(|s| s.node == 0)
                .map(|s| (s.since, s.cached))
        };
        assert_eq!(on_0(&m), Some((0, true)));
        // Another model's prompts push nothing out of this one's cache.
        for t in 0..INITIAL_REACH {
            m.prefilled(0, "other", None, 7 + t);
        }
        assert_eq!(on_0(&m), Some((0, true)));
        for t in 0..INITIAL_REACH {
            m.prefilled(0, "m", None, 7 + t);
        }
        assert_eq!(on_0(&m), Some((INITIAL_REACH, false)));
        // Its answer says the cache still held it: the reach grows past it. Misses move it
        // halfway down to where they were seen; one past the reach moves nothing.
        m.cache_seen(0, "m", INITIAL_REACH, true);
        assert_eq!(m.reach(0, "m"), INITIAL_REACH + 1);
        assert_eq!(on_0(&m), Some((INITIAL_REACH, true)));
        m.cache_seen(0, "m", 20, false);
        assert_eq!(m.reach(0, "m"), INITIAL_REACH + 1);
        m.cache_seen(0, "m", 3, false);
        assert_eq!(m.reach(0, "m"), (INITIAL_REACH + 1 + 3) / 2);
        m.cache_seen(0, "m", 0, false);
        m.cache_seen(0, "m", 0, false);
        m.cache_seen(0, "m", 0, false);
        assert_eq!(m.reach(0, "m"), 1, "never below one prompt");
        assert_eq!(on_0(&m), Some((INITIAL_REACH, false)));
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
