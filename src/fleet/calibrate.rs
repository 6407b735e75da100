//! Per-model chars-per-token calibration: the `usage` token counts nodes report sharpen the
//! prompt estimate that context eligibility uses (EWMA, alpha 0.2).

use std::collections::HashMap;

use parking_lot::RwLock;

const ALPHA: f64 = 0.2;
/// Samples from prompts this small are mostly template overhead: not used.
const MIN_TEXT_TOKENS: u32 = 16;
const MIN_CPT: f64 = 1.0;
const MAX_CPT: f64 = 12.0;

/// Chars per token, per model.
#[derive(Debug, Default)]
pub struct Calibration {
    by_model: RwLock<HashMap<String, f64>>,
}

impl Calibration {
    /// The calibrated ratio for `model`, or `default` before any sample.
    pub fn chars_per_token(&self, model: &str, default: f64) -> f64 {
        self.by_model.read().get(model).copied().unwrap_or(default)
    }

    /// One sample: the prompt had `prompt_chars` characters of text and the node counted
    /// `prompt_tokens`, of which `fixed_tokens` are per-message/per-image overhead.
    /// Returns the new ratio when the sample was used.
    pub fn observe(
        &self,
        model: &str,
        prompt_chars: usize,
        prompt_tokens: u32,
        fixed_tokens: u32,
        default: f64,
    ) -> Option<f64> {
        let text_tokens = prompt_tokens.saturating_sub(fixed_tokens);
        if text_tokens < MIN_TEXT_TOKENS || prompt_chars == 0 {
            return None;
        }
        let sample = (prompt_chars as f64 / f64::from(text_tokens)).clamp(MIN_CPT, MAX_CPT);
        let mut map = self.by_model.write();
        let slot = map.entry(model.to_string()).or_insert(default);
        *slot = *slot * (1.0 - ALPHA) + sample * ALPHA;
        Some(*slot)
    }

    pub fn snapshot(&self) -> Vec<(String, f64)> {
        let mut v: Vec<_> = self
            .by_model
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converges_on_the_observed_ratio_and_ignores_tiny_prompts() {
        let c = Calibration::default();
        assert_eq!(c.chars_per_token("m", 4.0), 4.0);
        assert_eq!(
            c.observe("m", 40, 14, 4, 4.0),
            None,
            "10 text tokens: too few"
        );
        for _ in 0..40 {
            // 3000 chars, 1004 tokens of which 4 are the message overhead: 3 chars/token.
            c.observe("m", 3000, 1004, 4, 4.0);
        }
        assert!((c.chars_per_token("m", 4.0) - 3.0).abs() < 0.01);
        assert_eq!(c.chars_per_token("other", 4.0), 4.0, "per model");
        c.observe("x", 100_000, 20, 0, 4.0);
        assert!(c.chars_per_token("x", 4.0) <= MAX_CPT);
    }
}
