//! The `models.resolve:` section: coding-agent model ids by tier (see `routing::resolve`).

use serde::Deserialize;

use crate::routing::{ModelTier, Resolve, TierRule};

/// `models.resolve`: one entry per tier, each optional.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ResolveFile {
    pub fast: Option<TierFile>,
    pub balanced: Option<TierFile>,
    pub strongest: Option<TierFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierFile {
    /// Globs over the model id the client sends.
    #[serde(rename = "match")]
    pub patterns: Vec<String>,
    /// Globs over fleet model names, best first (absent: by size).
    #[serde(default)]
    pub prefer: Vec<String>,
}

/// Validate and convert; rules in match order fast, balanced, strongest.
pub fn validate_resolve(errors: &mut Vec<String>, f: ResolveFile) -> Resolve {
    let mut rules = Vec::new();
    for (name, tier, t) in [
        ("fast", ModelTier::Fast, f.fast),
        ("balanced", ModelTier::Balanced, f.balanced),
        ("strongest", ModelTier::Strongest, f.strongest),
    ] {
        let Some(t) = t else { continue };
        if t.patterns.is_empty() {
            errors.push(format!(
                "field `models.resolve.{name}.match`: empty: expected at least one glob such as \"claude-*sonnet*\""
            ));
        }
        for (key, list) in [("match", &t.patterns), ("prefer", &t.prefer)] {
            if let Some(i) = list.iter().position(|p| p.trim().is_empty()) {
                errors.push(format!(
                    "field `models.resolve.{name}.{key}[{i}]`: empty: expected a glob"
                ));
            }
        }
        rules.push(TierRule {
            tier,
            patterns: t.patterns,
            prefer: t.prefer,
        });
    }
    Resolve { rules }
}
