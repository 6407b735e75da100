//! Prompt-prefix cache of a node: per-message cumulative hashes of processed prompts, kept in
//! an LRU, so a request whose leading messages were processed before prefills only the rest.

use super::text::{est_tokens, fnv1a};
use std::collections::VecDeque;

/// Block length (chars) a raw prompt is cut into for prefix matching.
const RAW_BLOCK_CHARS: usize = 1024;

/// One step of a prompt: the hash of everything up to and including it, and its token count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    pub hash: u64,
    pub tokens: u32,
}

/// A prompt as cumulative steps (one per chat message, or per block of raw text).
pub(crate) type Chain = Vec<Step>;

/// FNV-1a continued from `prev` over `parts` (each followed by a 0xff separator).
fn step(prev: u64, parts: &[&str]) -> u64 {
    let mut h = prev;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Chain of a chat prompt: `system` (its tokens counted as given, no per-message overhead) then
/// each (role, text, tokens) message; the last step's tokens equal the prompt's.
pub(crate) fn chat_chain(
    model: &str,
    system: Option<(&str, u32)>,
    msgs: &[(&str, &str, u32)],
) -> Chain {
    let mut h = fnv1a(&[model]);
    let mut tokens = 0u32;
    let mut out = Vec::with_capacity(msgs.len() + 1);
    if let Some((text, t)) = system {
        h = step(h, &["system-field", text]);
        tokens = tokens.saturating_add(t);
        out.push(Step { hash: h, tokens });
    }
    for (role, text, t) in msgs {
        h = step(h, &[role, text]);
        tokens = tokens.saturating_add(*t);
        out.push(Step { hash: h, tokens });
    }
    out
}

/// Chain of chat messages counted as the sim counts them (a `system` field: its tokens; each
/// message: its tokens + 4; the `tools` declared, as JSON text: its tokens, right after the
/// leading system messages, where chat templates render them). Its last step's tokens are the
/// prompt's.
pub(crate) fn message_chain(
    model: &str,
    system: Option<&str>,
    texts: &[(String, String)],
    tools: Option<&str>,
) -> Chain {
    let system = system.filter(|s| !s.is_empty()).map(|s| (s, est_tokens(s)));
    let mut msgs: Vec<(&str, &str, u32)> = texts
        .iter()
        .map(|(r, t)| (r.as_str(), t.as_str(), est_tokens(t).saturating_add(4)))
        .collect();
    if let Some(tools) = tools.filter(|t| !t.is_empty()) {
        let at = msgs
            .iter()
            .position(|(r, _, _)| !matches!(*r, "system" | "developer"))
            .unwrap_or(msgs.len());
        msgs.insert(at, ("tools", tools, est_tokens(tools)));
    }
    chat_chain(model, system, &msgs)
}

/// The `tools` a chat request declares, as the JSON text the sim's chain and counts take
/// (None when absent or empty).
pub(crate) fn tools_text(tools: Option<&serde_json::Value>) -> Option<String> {
    tools
        .filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
        .map(|t| t.to_string())
}

/// The prompt tokens of a chain (its last step's).
pub(crate) fn chain_tokens(chain: &[Step]) -> u32 {
    chain.last().map_or(0, |s| s.tokens)
}

/// Chain of a raw prompt (`system` first, if any): blocks of [`RAW_BLOCK_CHARS`] chars, with
/// token counts as `est_tokens` counts them (chars / 4, rounded up, per text).
pub(crate) fn raw_chain(model: &str, system: &str, prompt: &str) -> Chain {
    let mut h = fnv1a(&[model]);
    let mut out = Vec::new();
    let mut base = 0u32;
    for text in [system, prompt] {
        if text.is_empty() {
            continue;
        }
        let chars: Vec<char> = text.chars().collect();
        let mut done = 0usize;
        for block in chars.chunks(RAW_BLOCK_CHARS) {
            let s: String = block.iter().collect();
            h = step(h, &["raw", &s]);
            done += block.len();
            let t = u32::try_from(done.div_ceil(4)).unwrap_or(u32::MAX);
            out.push(Step {
                hash: h,
                tokens: base.saturating_add(t),
            });
        }
        base = out.last().map_or(base, |s| s.tokens);
    }
    out
}

struct Kept {
    model: usize,
    chain: Chain,
}

/// LRU of processed prompts; capacity 0 keeps nothing.
pub(crate) struct PrefixCache {
    cap: usize,
    kept: VecDeque<Kept>,
}

impl PrefixCache {
    pub fn new(cap: u32) -> Self {
        PrefixCache {
            cap: cap as usize,
            kept: VecDeque::new(),
        }
    }

    /// Tokens of the longest kept prefix of `chain` for `model` (refreshing that entry's LRU
    /// position); 0 when nothing matches.
    pub fn lookup(&mut self, model: usize, chain: &[Step]) -> u32 {
        let mut best: Option<(usize, usize)> = None; // (entry, matched steps)
        for (i, k) in self.kept.iter().enumerate() {
            if k.model != model {
                continue;
            }
            let n = k
                .chain
                .iter()
                .zip(chain)
                .take_while(|(a, b)| a.hash == b.hash)
                .count();
            if n > 0 && best.is_none_or(|(_, m)| n > m) {
                best = Some((i, n));
            }
        }
        let Some((i, n)) = best else {
            return 0;
        };
        if let Some(k) = self.kept.remove(i) {
            self.kept.push_back(k);
        }
        chain[n - 1].tokens
    }

    /// Keep `chain` as the most recently used prompt, evicting the least recently used.
    pub fn insert(&mut self, model: usize, chain: Chain) {
        if self.cap == 0 || chain.is_empty() {
            return;
        }
        // A kept prompt that is a prefix of this one adds nothing once this one is kept.
        self.kept.retain(|k| {
            !(k.model == model
                && k.chain.len() <= chain.len()
                && k.chain.iter().zip(&chain).all(|(a, b)| a.hash == b.hash))
        });
        self.kept.push_back(Kept { model, chain });
        while self.kept.len() > self.cap {
            self.kept.pop_front();
        }
    }

    /// A model was (re)loaded: the prompts processed by an earlier load are gone.
    pub fn forget_model(&mut self, model: usize) {
        self.kept.retain(|k| k.model != model);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_turns_reuse_their_history() {
        let turn1 = chat_chain("m", None, &[("system", "be brief", 6), ("user", "hi", 5)]);
        let turn2 = chat_chain(
            "m",
            None,
            &[
                ("system", "be brief", 6),
                ("user", "hi", 5),
                ("assistant", "hello", 6),
                ("user", "more", 5),
            ],
        );
        assert_eq!(turn2.last().map(|s| s.tokens), Some(22));
        let mut c = PrefixCache::new(4);
        assert_eq!(c.lookup(0, &turn1), 0);
        c.insert(0, turn1.clone());
        assert_eq!(c.lookup(0, &turn2), 11);
        assert_eq!(c.lookup(1, &turn2), 0, "another model's cache");
        c.insert(0, turn2.clone());
        assert_eq!(c.kept.len(), 1, "turn 1 is a prefix of turn 2");
        assert_eq!(c.lookup(0, &turn2), 22);
        let other = chat_chain("m", None, &[("system", "be long", 6), ("user", "hi", 5)]);
        assert_eq!(
            c.lookup(0, &other),
            0,
            "a different first message matches nothing"
        );
        assert_ne!(
            chat_chain("n", None, &[("user", "hi", 5)])[0].hash,
            turn1[1].hash
        );
        c.forget_model(0);
        assert_eq!(c.lookup(0, &turn2), 0);
    }

    /// Tools go after the leading system messages, before the first other one, as chat
    /// templates render them: two requests with the same system prompt and tools share both,
    /// and the tools count in the prompt.
    #[test]
    fn tools_follow_the_system_messages_and_count() {
        let msgs = |q: &str| {
            vec![
                ("system".to_string(), "be brief".to_string()),
                ("user".to_string(), q.to_string()),
            ]
        };
        let tools = "[{\"name\":\"read_file\"}]";
        let a = message_chain("m", None, &msgs("fix it"), Some(tools));
        let b = message_chain("m", None, &msgs("why?"), Some(tools));
        let bare = message_chain("m", None, &msgs("fix it"), None);
        assert_eq!(a.len(), 3);
        assert_eq!(a[..2], b[..2], "system and tools shared");
        assert_eq!(a[0], bare[0]);
        assert_eq!(chain_tokens(&a), chain_tokens(&bare) + est_tokens(tools));
        let mut c = PrefixCache::new(4);
        c.insert(0, a);
        assert_eq!(c.lookup(0, &b), b[1].tokens);
    }

    #[test]
    fn lru_keeps_the_most_recent() {
        let mut c = PrefixCache::new(2);
        let a = chat_chain("m", None, &[("user", "a", 5)]);
        let b = chat_chain("m", None, &[("user", "b", 5)]);
        let d = chat_chain("m", None, &[("user", "d", 5)]);
        c.insert(0, a.clone());
        c.insert(0, b.clone());
        assert_eq!(c.lookup(0, &a), 5); // a is now the most recent
        c.insert(0, d.clone());
        assert_eq!(
            (c.lookup(0, &a), c.lookup(0, &b), c.lookup(0, &d)),
            (5, 0, 5)
        );
        let mut off = PrefixCache::new(0);
        off.insert(0, a.clone());
        assert_eq!(off.lookup(0, &a), 0);
    }

    #[test]
    fn raw_blocks_count_tokens_like_the_estimate() {
        let long = "x".repeat(2500);
        let c = raw_chain("m", "sys", &long);
        assert_eq!(c.len(), 4);
        assert_eq!(c[0].tokens, 1);
        assert_eq!(c.last().map(|s| s.tokens), Some(1 + 625));
        let longer = format!("{long}yyyy");
        let c2 = raw_chain("m", "sys", &longer);
        let mut cache = PrefixCache::new(1);
        cache.insert(0, c);
        assert_eq!(cache.lookup(0, &c2), 1 + 512, "two whole blocks match");
    }
}
