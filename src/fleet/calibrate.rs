//! Per-model prompt-token calibration from the `usage` counts nodes report: a fixed overhead per
//! request (the chat template: ~25 tokens on llama.cpp even for "hi") fitted apart from the
//! per-character rate, so short chats cannot drag the rate down and make long prompts look
//! impossible.
//!
//! Model, per model over the last [`WINDOW`] samples (x = prompt text characters, y = reported
//! prompt tokens minus the per-message/image tokens the estimate charges anyway):
//! `y = overhead + x / chars_per_token`.
//! - rate: ratio of sums over the samples with at least [`RATE_MIN_CHARS`] characters
//!   (size-weighted: long prompts decide it), `Σ(y - overhead) / Σx`, bounded to
//!   [`MIN_CPT`]..=[`MAX_CPT`] chars per token; the configured default until such a sample;
//! - overhead: the median of `y - x / cpt` over all samples, bounded to 0..=[`MAX_OVERHEAD`];
//!   two rounds (rate, overhead, rate, overhead);
//! - never above what was served: the estimate for `x` characters is at most the smallest `y`
//!   of a whole sample with at least `x` characters, so a prompt as long as one a node served
//!   is never estimated bigger than that one really was.
//!
//! Whole and lower-bound samples: a count next to a reported cache count (OpenAI
//! `cached_tokens`, Ollama `prompt_eval_cached_count`, Anthropic `cache_read_input_tokens`
//! added to its `input_tokens`: `proxy::observe`) is the whole prompt. Without one it may
//! be only what the node prefilled: Ollama's `prompt_eval_count` (native and `/v1`) left the
//! cached tokens out before 0.30 and omits them in some versions still. A conversation's
//! later turns, whose history the node holds, then report a few hundred tokens for thousands
//! of characters: taken whole, they drove the rate to its bound and capped every estimate at
//! their count (a 2,300-token turn estimated at 140, its prefill priced at nothing). So a
//! lower-bound sample never caps the estimate, and one that reads sparser than any tokenizer
//! writes text ([`LOWER_MAX_CPT`]), or much sparser than the rate fitted so far
//! ([`LOWER_MARGIN`] times it: dense text half cached still reads under 6), is not kept.
//!
//! Before any sample the estimate is exactly `ceil(chars / default)` (spec 000's formula).

use std::collections::{BTreeMap, HashMap, VecDeque};

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

/// Samples kept per model.
pub const WINDOW: usize = 64;
/// Samples shorter than this say little about the rate (mostly template): overhead only.
pub const RATE_MIN_CHARS: usize = 256;
pub const MIN_CPT: f64 = 1.0;
pub const MAX_CPT: f64 = 12.0;
pub const MAX_OVERHEAD: f64 = 512.0;
/// A lower-bound sample of at least [`RATE_MIN_CHARS`] reading more characters per token than
/// this was partly cached: tokenizers write natural text and code at ~2.5-5.
pub const LOWER_MAX_CPT: f64 = 6.0;
/// Nor one reading more than this times the rate fitted so far (the default before any).
pub const LOWER_MARGIN: f64 = 1.5;

/// One answer's prompt: its text's characters and the tokens the node counted for it (less
/// the per-message/image tokens); kept in `rates.json` so a restart starts calibrated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    chars: f64,
    tokens: f64,
    /// The node counted the whole prompt (else it may have left its cached part out).
    whole: bool,
}

impl Sample {
    /// Finite, non-negative, and some tokens: what `observe` keeps (a hand-edited state file
    /// can hold anything).
    fn sane(&self) -> bool {
        self.chars.is_finite() && self.chars >= 0.0 && self.tokens.is_finite() && self.tokens >= 0.0
    }
}

#[derive(Debug, Default)]
struct ModelCal {
    samples: VecDeque<Sample>,
    /// Fitted (chars per token, overhead tokens); None before a rate sample.
    cpt: Option<f64>,
    overhead: f64,
}

impl ModelCal {
    fn refit(&mut self, default: f64) {
        let mut overhead = 0.0;
        let mut cpt = None;
        for _ in 0..2 {
            let (sx, sy) = self
                .samples
                .iter()
                .filter(|s| s.chars >= RATE_MIN_CHARS as f64)
                .fold((0.0, 0.0), |(sx, sy), s| {
                    (sx + s.chars, sy + (s.tokens - overhead).max(1.0))
                });
            cpt = (sx > 0.0).then(|| (sx / sy).clamp(MIN_CPT, MAX_CPT));
            let rate = 1.0 / cpt.unwrap_or(default);
            let mut rest: Vec<f64> = self
                .samples
                .iter()
                .map(|s| s.tokens - s.chars * rate)
                .collect();
            let mid = rest.len() / 2;
            overhead = if rest.is_empty() {
                0.0
            } else {
                *rest.select_nth_unstable_by(mid, f64::total_cmp).1
            }
            .clamp(0.0, MAX_OVERHEAD);
        }
        self.cpt = cpt;
        self.overhead = overhead;
    }

    fn estimate(&self, chars: usize, default: f64) -> u64 {
        let cpt = self.cpt.unwrap_or(default);
        let fit = (self.overhead + chars as f64 / cpt).ceil();
        let served = self
            .samples
            .iter()
            .filter(|s| s.whole && s.chars >= chars as f64)
            .map(|s| s.tokens)
            .fold(f64::INFINITY, f64::min);
        fit.min(served.ceil()).max(0.0) as u64
    }
}

/// Prompt-token calibration, per model.
#[derive(Debug, Default)]
pub struct Calibration {
    by_model: RwLock<HashMap<String, ModelCal>>,
}

impl Calibration {
    /// The fitted chars-per-token rate for `model`, or `default` before a rate sample.
    pub fn chars_per_token(&self, model: &str, default: f64) -> f64 {
        self.by_model
            .read()
            .get(model)
            .and_then(|c| c.cpt)
            .unwrap_or(default)
    }

    /// Estimated tokens for `chars` characters of prompt text on `model` (the overhead
    /// included; the per-message/image tokens are not).
    pub fn text_tokens(&self, model: &str, chars: usize, default: f64) -> u64 {
        let default = sane(default);
        match self.by_model.read().get(model) {
            Some(c) => c.estimate(chars, default),
            None => (chars as f64 / default).ceil() as u64,
        }
    }

    /// One sample: the prompt had `prompt_chars` characters of text and the node counted
    /// `prompt_tokens`, of which `fixed_tokens` are per-message/per-image tokens the estimate
    /// charges anyway; `whole` when that count is the whole prompt, not only its uncached part
    /// (module doc). Returns the chars-per-token rate after it, None when not kept.
    pub fn observe(
        &self,
        model: &str,
        prompt_chars: usize,
        prompt_tokens: u32,
        fixed_tokens: u32,
        default: f64,
        whole: bool,
    ) -> Option<f64> {
        if prompt_tokens == 0 {
            return None;
        }
        let default = sane(default);
        let tokens = f64::from(prompt_tokens.saturating_sub(fixed_tokens));
        let mut map = self.by_model.write();
        if !map.contains_key(model) {
            map.insert(model.to_string(), ModelCal::default());
        }
        let c = map.get_mut(model)?;
        let sparsest = LOWER_MAX_CPT.min(LOWER_MARGIN * c.cpt.unwrap_or(default));
        if !whole
            && prompt_chars >= RATE_MIN_CHARS
            && prompt_chars as f64 > sparsest * tokens.max(1.0)
        {
            return None;
        }
        if c.samples.len() == WINDOW {
            c.samples.pop_front();
        }
        c.samples.push_back(Sample {
            chars: prompt_chars as f64,
            tokens,
            whole,
        });
        c.refit(default);
        Some(c.cpt.unwrap_or(default))
    }

    /// Every model's samples, oldest first (what `restore` takes back after a restart).
    pub fn samples(&self) -> BTreeMap<String, Vec<Sample>> {
        self.by_model
            .read()
            .iter()
            .filter(|(_, c)| !c.samples.is_empty())
            .map(|(k, c)| (k.clone(), c.samples.iter().copied().collect()))
            .collect()
    }

    /// Take back `model`'s samples saved before a restart (the last [`WINDOW`] that are
    /// sane) and fit them, unless the model has samples of its own already.
    pub fn restore(&self, model: &str, samples: &[Sample], default: f64) {
        let default = sane(default);
        let mut map = self.by_model.write();
        if map.get(model).is_some_and(|c| !c.samples.is_empty()) {
            return;
        }
        let mut kept: VecDeque<Sample> = samples.iter().copied().filter(Sample::sane).collect();
        if kept.is_empty() {
            return;
        }
        kept.drain(..kept.len().saturating_sub(WINDOW));
        let mut c = ModelCal {
            samples: kept,
            ..ModelCal::default()
        };
        c.refit(default);
        map.insert(model.to_string(), c);
    }

    /// (model, fitted chars per token) for every model with a rate sample.
    pub fn snapshot(&self) -> Vec<(String, f64)> {
        let mut v: Vec<_> = self
            .by_model
            .read()
            .iter()
            .filter_map(|(k, c)| Some((k.clone(), c.cpt?)))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// (model, fitted overhead tokens) for every model with samples.
    pub fn overheads(&self) -> Vec<(String, f64)> {
        let mut v: Vec<_> = self
            .by_model
            .read()
            .iter()
            .map(|(k, c)| (k.clone(), c.overhead))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The fitted per-request overhead of `model` (0 before any sample).
    pub fn overhead_tokens(&self, model: &str) -> f64 {
        self.by_model.read().get(model).map_or(0.0, |c| c.overhead)
    }
}

fn sane(default: f64) -> f64 {
    if default.is_finite() && default > 0.0 {
        default
    } else {
        crate::protocol::DEFAULT_CHARS_PER_TOKEN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converges_on_the_observed_ratio() {
        let c = Calibration::default();
        assert_eq!(c.chars_per_token("m", 4.0), 4.0);
        assert_eq!(
            c.text_tokens("m", 400, 4.0),
            100,
            "no sample: chars / default"
        );
        for _ in 0..40 {
            // 3000 chars, 1004 tokens of which 4 are the message overhead: 3 chars/token.
            c.observe("m", 3000, 1004, 4, 4.0, true);
        }
        assert!((c.chars_per_token("m", 4.0) - 3.0).abs() < 0.01);
        assert_eq!(c.chars_per_token("other", 4.0), 4.0, "per model");
        c.observe("x", 100_000, 20, 0, 4.0, true);
        assert!(c.chars_per_token("x", 4.0) <= MAX_CPT);
    }

    /// Issue 15 item 1, as seen on llama.cpp with SmolLM2: "hi N" chats report ~34 prompt
    /// tokens (the chat template adds ~25). They used to pull chars-per-token 4.0 -> 1.0 and
    /// then a 13,847-char prompt node B had served (2,972 tokens) was refused.
    #[test]
    fn short_chats_fit_the_overhead_not_the_rate() {
        let c = Calibration::default();
        for n in 0..60 {
            let prompt = format!("hi {n}");
            c.observe("smol", prompt.len(), 34, 4, 4.0, true);
        }
        assert_eq!(
            c.chars_per_token("smol", 4.0),
            4.0,
            "no long sample: rate untouched"
        );
        assert!((c.overhead_tokens("smol") - 29.0).abs() < 1.5);
        let long = c.text_tokens("smol", 13_847, 4.0);
        assert!(long < 3_600, "13,847 chars estimated at {long}");
        c.observe("smol", 13_847, 2_972, 4, 4.0, true);
        let cpt = c.chars_per_token("smol", 4.0);
        assert!((4.5..5.0).contains(&cpt), "{cpt}");
        assert!(
            c.text_tokens("smol", 13_847, 4.0) <= 2_968,
            "never more than what was served"
        );
        assert!(c.text_tokens("smol", 13_000, 4.0) <= 2_968);
        // More short chats afterwards do not move the rate.
        for n in 0..60 {
            c.observe("smol", format!("hi {n}").len(), 34, 4, 4.0, true);
        }
        assert!((c.chars_per_token("smol", 4.0) - cpt).abs() < 0.05);
        assert!(c.text_tokens("smol", 13_847, 4.0) <= 2_968);
    }

    /// Ollama's `prompt_eval_count` without `prompt_eval_cached_count`: a chat's later turns
    /// report only what the node prefilled. Seen on the multi-turn bench: taken whole, ~9,300
    /// chars counted ~250 tokens, and every prompt up to that size was estimated at 140-260.
    #[test]
    fn counts_that_may_leave_the_cache_out_neither_cap_nor_thin_the_estimate() {
        let c = Calibration::default();
        // First turns, nothing cached: 8,000 chars, 2,004 tokens (4 chars/token).
        for _ in 0..4 {
            assert!(c.observe("chat", 8_000, 2_004, 4, 4.0, false).is_some());
        }
        // Later turns: 9,300 chars, the node prefilled the last 254 tokens.
        for _ in 0..20 {
            assert_eq!(c.observe("chat", 9_300, 254, 4, 4.0, false), None);
        }
        assert!((c.chars_per_token("chat", 4.0) - 4.0).abs() < 0.01);
        let est = c.text_tokens("chat", 9_300, 4.0);
        assert!((2_300..2_400).contains(&est), "{est}");
        // 4,000 chars counted as 600 (6.7 chars/token): not kept.
        assert_eq!(c.observe("chat", 4_000, 604, 4, 4.0, false), None);
        // A kept lower bound caps nothing: 8,000 chars counted as 1,800 (4.4 chars/token:
        // kept, the rate moves a little), and 7,600 chars are still estimated above 1,800.
        assert!(c.observe("chat", 8_000, 1_804, 4, 4.0, false).is_some());
        let est = c.text_tokens("chat", 7_600, 4.0);
        assert!(est > 1_800, "{est}");
        // A whole count (a cache count beside it) still caps what was served.
        c.observe("chat", 8_000, 1_804, 4, 4.0, true);
        assert!(c.text_tokens("chat", 7_600, 4.0) <= 1_800);
        // Dense text (code at 3 chars/token) half cached reads 5.7: under 6, but over 1.5
        // times its fitted rate: not kept.
        for _ in 0..4 {
            c.observe("code", 8_000, 2_671, 4, 4.0, false);
        }
        assert_eq!(c.observe("code", 8_000, 1_404, 4, 4.0, false), None);
    }

    /// Samples taken back after a restart fit as they did; a state file's nonsense is
    /// dropped, only the last window is kept, and a model that has answered since keeps its own.
    #[test]
    fn restored_samples_fit_as_before_and_nonsense_is_dropped() {
        let before = Calibration::default();
        for i in 0..80u32 {
            before.observe("m", 1_000 + 10 * i as usize, 300 + 3 * i, 0, 4.0, true);
        }
        let saved = before.samples();
        assert_eq!(saved["m"].len(), WINDOW);
        // Last, where the window would keep it.
        let mut kept = saved["m"].clone();
        kept.push(Sample {
            chars: f64::NAN,
            tokens: 1.0,
            whole: true,
        });
        let after = Calibration::default();
        after.restore("m", &kept, 4.0);
        for chars in [500, 1_500, 5_000] {
            assert_eq!(
                after.text_tokens("m", chars, 4.0),
                before.text_tokens("m", chars, 4.0)
            );
        }
        after.restore("m", &[], 4.0);
        assert_eq!(after.samples()["m"].len(), WINDOW, "its own kept");
        after.restore("n", &kept[WINDOW..], 4.0);
        assert_eq!(
            after.text_tokens("n", 400, 4.0),
            100,
            "nothing sane: the default"
        );
    }

    #[test]
    fn rate_is_bounded_and_dense_text_is_learned() {
        let c = Calibration::default();
        // Dense text: 8,000 chars -> 5,408 tokens (1.48 chars/token).
        c.observe("d", 8_000, 5_412, 4, 4.0, true);
        let cpt = c.chars_per_token("d", 4.0);
        assert!((1.4..1.6).contains(&cpt), "{cpt}");
        assert!(c.text_tokens("d", 16_000, 4.0) > 10_000);
        c.observe("e", 10_000, 1, 0, 4.0, true);
        assert_eq!(c.chars_per_token("e", 4.0), MAX_CPT);
    }
}
