//! Scoring and elimination parameters: every weight and threshold routing uses, spec defaults.

use serde::{Deserialize, Serialize};

/// Tunables of Stage 1 and Stage 2. `Default` holds the numbers of spec 000 / 003 / 004.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Points for a node whose tier is `pinned` over a `provisional` one (spec 004).
    pub tier_pinned_bonus: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            tier_pinned_bonus: 5.0,
        }
    }
}
