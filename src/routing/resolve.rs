//! `models.resolve`: model ids coding agents send (`claude-sonnet-4-5`, `gpt-5-codex` ...)
//! mapped by tier (fast / balanced / strongest, matched by glob) to the best model the fleet
//! has loaded for that tier, else the best on disk. Pure: the fleet view comes in.

use serde::{Deserialize, Serialize};

use super::types::{FleetView, Health};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelTier {
    Fast,
    Balanced,
    Strongest,
}

/// One tier: which client ids belong to it and which fleet models serve it.
#[derive(Debug, Clone, PartialEq)]
pub struct TierRule {
    pub tier: ModelTier,
    /// Globs (`*`, `?`) over the client's model id.
    pub patterns: Vec<String>,
    /// Globs over fleet model names, best first. Empty: the fleet's models by size (fast:
    /// the smallest, strongest: the largest, balanced: the middle one).
    pub prefer: Vec<String>,
}

/// The rules in match order (fast, balanced, strongest: the first tier whose glob matches).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resolve {
    pub rules: Vec<TierRule>,
}

/// `*` matches any run of characters, `?` one character; everything else itself.
pub fn glob(pattern: &str, s: &str) -> bool {
    let (p, s): (Vec<char>, Vec<char>) = (pattern.chars().collect(), s.chars().collect());
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// A model as the whole fleet has it.
#[derive(Debug, Clone)]
struct Have {
    name: String,
    size_gb: f64,
    loaded: bool,
}

/// Billions of parameters a model name states (`qwen2.5:32b`, `llama3.1-8B`, `mixtral:8x7b`).
fn params_b(name: &str) -> Option<f64> {
    let lower = name.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let mut best = None;
    for (i, &c) in bytes.iter().enumerate() {
        let at_end = bytes.get(i + 1).is_none_or(|n| !n.is_ascii_alphanumeric());
        if c != b'b' || !at_end || i == 0 || !bytes[i - 1].is_ascii_digit() {
            continue;
        }
        let start = lower[..i]
            .rfind(|ch: char| !(ch.is_ascii_digit() || ch == '.' || ch == 'x'))
            .map_or(0, |p| p + 1);
        let parts: Option<Vec<f64>> = lower[start..i]
            .split('x')
            .map(|p| p.parse::<f64>().ok())
            .collect();
        if let Some(parts) = parts {
            best = Some(parts.iter().product());
        }
    }
    best
}

/// An embedding model, as its name says (`nomic-embed-text`, `mxbai-embed-large`): it does
/// not chat.
pub fn embedding_name(name: &str) -> bool {
    name.contains("embed")
}

/// Size for ranking: weights on disk, else what the name says (a q4 weight is ~0.6 GB per
/// billion parameters); OpenAI-compatible servers report no sizes.
pub fn rank_size(name: &str, size_gb: f64) -> f64 {
    if size_gb > 0.0 {
        size_gb
    } else {
        params_b(name).map_or(0.0, |b| b * 0.6)
    }
}

/// Generation models on online nodes, by name (embedding models never serve a chat tier).
fn fleet_models(fleet: &FleetView) -> Vec<Have> {
    let mut out: Vec<Have> = Vec::new();
    for n in fleet.nodes.iter().filter(|n| n.health == Health::Online) {
        for m in n.models.iter().filter(|m| m.loaded || m.on_disk) {
            if embedding_name(&m.name) {
                continue;
            }
            match out.iter_mut().find(|h| h.name == m.name) {
                Some(h) => {
                    h.loaded |= m.loaded;
                    h.size_gb = h.size_gb.max(rank_size(&m.name, m.size_gb));
                }
                None => out.push(Have {
                    name: m.name.clone(),
                    size_gb: rank_size(&m.name, m.size_gb),
                    loaded: m.loaded,
                }),
            }
        }
    }
    out.sort_by(|a, b| a.size_gb.total_cmp(&b.size_gb).then(a.name.cmp(&b.name)));
    out
}

impl Resolve {
    /// The tier rule `id` falls under, if any.
    pub fn tier_of(&self, id: &str) -> Option<&TierRule> {
        self.rules
            .iter()
            .find(|r| r.patterns.iter().any(|p| glob(p, id)))
    }

    /// The fleet model that serves `id`, when a tier matches it and the fleet has a model.
    pub fn resolve(&self, id: &str, fleet: &FleetView) -> Option<String> {
        let rule = self.tier_of(id)?;
        let have = fleet_models(fleet);
        if !rule.prefer.is_empty() {
            let ordered: Vec<&Have> = rule
                .prefer
                .iter()
                .flat_map(|p| have.iter().rev().filter(move |h| glob(p, &h.name)))
                .collect();
            let best = ordered.iter().find(|h| h.loaded).or(ordered.first());
            return best.map(|h| h.name.clone());
        }
        let loaded: Vec<&Have> = have.iter().filter(|h| h.loaded).collect();
        let pool: Vec<&Have> = if loaded.is_empty() {
            have.iter().collect()
        } else {
            loaded
        };
        let pick = match rule.tier {
            ModelTier::Fast => pool.first(),
            ModelTier::Balanced => pool.get(pool.len() / 2),
            ModelTier::Strongest => pool.last(),
        };
        pick.map(|h| h.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::testkit::{fleet, loaded, model, node};

    fn rules(prefer_strongest: &[&str]) -> Resolve {
        let rule = |tier, pats: &[&str], prefer: &[&str]| TierRule {
            tier,
            patterns: pats.iter().map(|s| s.to_string()).collect(),
            prefer: prefer.iter().map(|s| s.to_string()).collect(),
        };
        Resolve {
            rules: vec![
                rule(ModelTier::Fast, &["claude-*haiku*", "gpt-*-mini"], &[]),
                rule(
                    ModelTier::Balanced,
                    &["claude-*sonnet*", "gpt-5-codex"],
                    &[],
                ),
                rule(
                    ModelTier::Strongest,
                    &["claude-*opus*", "gpt-5*"],
                    prefer_strongest,
                ),
            ],
        }
    }

    #[test]
    fn sizes_from_names_when_the_node_reports_none() {
        for (name, want) in [
            ("qwen2.5:32b", Some(32.0)),
            ("llama3.1-8B-instruct", Some(8.0)),
            ("mixtral:8x7b", Some(56.0)),
            ("qwen2.5:1.5b", Some(1.5)),
            ("phi3:mini", None),
            ("bge-m3", None),
        ] {
            assert_eq!(params_b(name), want, "{name}");
        }
        assert_eq!(rank_size("qwen2.5:32b", 19.0), 19.0, "a reported size wins");
    }

    #[test]
    fn globs() {
        for (p, s, want) in [
            ("claude-*haiku*", "claude-3-5-haiku-latest", true),
            ("claude-*haiku*", "claude-haiku-4-5", true),
            ("claude-*haiku*", "claude-sonnet-4-5", false),
            ("gpt-5*", "gpt-5-codex", true),
            ("gpt-5", "gpt-5-codex", false),
            ("gpt-?o", "gpt-4o", true),
            ("*", "", true),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
        ] {
            assert_eq!(glob(p, s), want, "{p} {s}");
        }
    }

    #[test]
    fn tiers_pick_by_size_among_loaded_then_on_disk() {
        let f = fleet(vec![
            node(
                "a",
                vec![loaded("llama3.2:3b", 2.0), model("qwen2.5:72b", 47.0)],
            ),
            node(
                "b",
                vec![loaded("qwen2.5:32b", 20.0), loaded("qwen2.5:7b", 4.7)],
            ),
            node("c", vec![loaded("nomic-embed-text", 0.3)]),
        ]);
        let r = rules(&[]);
        let res = |id| r.resolve(id, &f);
        assert_eq!(
            res("claude-3-5-haiku-latest").as_deref(),
            Some("llama3.2:3b")
        );
        assert_eq!(res("claude-sonnet-4-5").as_deref(), Some("qwen2.5:7b"));
        // The 72b is only on disk: the strongest loaded model serves.
        assert_eq!(res("claude-opus-4-1").as_deref(), Some("qwen2.5:32b"));
        // First tier wins: gpt-5-codex is balanced, not strongest.
        assert_eq!(res("gpt-5-codex").as_deref(), Some("qwen2.5:7b"));
        assert_eq!(res("gpt-5").as_deref(), Some("qwen2.5:32b"));
        assert_eq!(res("mistral"), None, "no tier: not resolved");
        // Nothing loaded: the best on disk.
        let cold = fleet(vec![node(
            "a",
            vec![model("small", 2.0), model("big", 40.0)],
        )]);
        assert_eq!(r.resolve("claude-opus-4-1", &cold).as_deref(), Some("big"));
        // An offline node's models do not count.
        let mut off = f.clone();
        off.nodes[1].health = Health::Offline;
        assert_eq!(
            r.resolve("claude-opus-4-1", &off).as_deref(),
            Some("llama3.2:3b")
        );
    }

    #[test]
    fn preferred_models_in_order_loaded_first() {
        let f = fleet(vec![
            node(
                "a",
                vec![
                    model("qwen3-coder:480b", 250.0),
                    loaded("qwen2.5-coder:32b", 20.0),
                ],
            ),
            node("b", vec![loaded("llama3.3:70b", 42.0)]),
        ]);
        let r = rules(&["qwen3-coder:*", "qwen2.5-coder:*", "llama3.3:*"]);
        // The first preference is only on disk; the first loaded one serves.
        assert_eq!(
            r.resolve("claude-opus-4-1", &f).as_deref(),
            Some("qwen2.5-coder:32b")
        );
        let cold = fleet(vec![node(
            "a",
            vec![
                model("qwen3-coder:480b", 250.0),
                model("llama3.3:70b", 42.0),
            ],
        )]);
        assert_eq!(
            r.resolve("claude-opus-4-1", &cold).as_deref(),
            Some("qwen3-coder:480b")
        );
        let none = fleet(vec![node("a", vec![loaded("phi3", 2.0)])]);
        assert_eq!(
            r.resolve("claude-opus-4-1", &none),
            None,
            "no preferred model: not resolved"
        );
    }
}
