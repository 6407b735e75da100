//! Node description (`sim:` block of a node's YAML config) with defaults and validation.

use serde::{Deserialize, Serialize};

/// Description of one simulated inference node.
///
/// Memory accounting uses the *resident* size of a model, `size_gb * 1.1`
/// (the same figure `/api/ps` reports as `size`): loading a model whose resident
/// size would push the total of loaded models past `memory_gb` evicts the
/// least-recently-used loaded models first.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SimSpec {
    /// Seed for the generated text and embeddings.
    #[serde(default)]
    pub seed: u64,
    /// Parallel generation slots; further requests wait in the node's FIFO backlog.
    #[serde(default = "default_seats")]
    pub seats: u32,
    /// Decode speed of one request, tokens per second.
    #[serde(default = "default_tokens_per_sec")]
    pub tokens_per_sec: f64,
    /// Time to first token once the model is loaded, in milliseconds.
    #[serde(default = "default_ttft_ms")]
    pub ttft_ms: u64,
    /// Total memory of the node (decimal GB).
    #[serde(default = "default_memory_gb")]
    pub memory_gb: f64,
    /// Output tokens when the request sets no limit; capped by the request's max tokens.
    #[serde(default = "default_reply_tokens")]
    pub reply_tokens: u32,
    /// Tokens a chat template adds to every request's prompt count (llama.cpp with SmolLM2:
    /// ~25), reported in `usage` and counted against the context window.
    #[serde(default)]
    pub template_tokens: u32,
    /// Answer `/v1/embeddings` with llama.cpp's 501 `not_supported_error` (a server started
    /// without `--embeddings`).
    #[serde(default)]
    pub embeddings_501: bool,
    /// Prompt processing speed, tokens per second: time to first token becomes
    /// `ttft_ms` + uncached prompt tokens / this rate. Unset: prefill costs nothing extra.
    #[serde(default)]
    pub prefill_tokens_per_sec: Option<f64>,
    /// Prompt prefixes the node keeps (an LRU of processed prompts, per model): a request whose
    /// leading messages match a kept prompt prefills only the rest. 0 (default): no cache.
    #[serde(default)]
    pub prefix_cache_entries: u32,
    /// Decode contention: with `n` requests decoding at once, each runs at
    /// `tokens_per_sec / (1 + decode_contention * (n - 1))`. 0 (default): no slowdown.
    #[serde(default)]
    pub decode_contention: f64,
    /// Prompts the node prefills at once, each at the full `prefill_tokens_per_sec`; the next
    /// waits its turn (FIFO) with its seat held, as on a GPU whose compute a long prefill
    /// takes whole (vLLM's chunked prefill, llama.cpp's shared batch). 0 (default): no limit,
    /// every seat prefills independently.
    #[serde(default)]
    pub prefill_parallel: u32,
    /// Each model has `seats` of its own (Ollama: `OLLAMA_NUM_PARALLEL` is per loaded model),
    /// instead of the node's `seats` shared by all its models (default: one backlog for the
    /// node, as a server with a single queue keeps).
    #[serde(default)]
    pub seats_per_model: bool,
    /// Ollama's counts as its releases since August 2026 give them: `prompt_eval_count` the
    /// whole prompt and `prompt_eval_cached_count` the part read from the cache (default: the
    /// older count of only the tokens prefilled, and no cached count).
    #[serde(default)]
    pub ollama_cached_count: bool,
    /// Says its seats as llama.cpp's server does: `GET /props` answers `total_slots` (what a
    /// gateway given only its URL asks; Ollama and vLLM say none). Default off.
    #[serde(default)]
    pub says_seats: bool,
    /// Models on disk.
    pub models: Vec<SimModel>,
}

/// One model on the node's disk.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SimModel {
    /// Model name as served, e.g. `llama3.2:3b`.
    pub name: String,
    /// Size of the weights on disk (decimal GB).
    pub size_gb: f64,
    /// Context window in tokens.
    #[serde(default = "default_context")]
    pub context: u32,
    /// Loaded at start.
    #[serde(default)]
    pub loaded: bool,
    /// Delay paid by the first request on an unloaded model, in milliseconds.
    #[serde(default = "default_cold_load_ms")]
    pub cold_load_ms: u64,
    /// An embedding model (chat/generate on it answer 400).
    #[serde(default)]
    pub embedding: bool,
    /// Its decode and prefill rates relative to the node's (`tokens_per_sec`,
    /// `prefill_tokens_per_sec`): a token reads every weight once, so on the node that runs
    /// its 8b at the node's rates a 70b might run at 0.12. Default 1: every model at the
    /// node's rates.
    #[serde(default = "default_speed")]
    pub speed: f64,
}

fn default_speed() -> f64 {
    1.0
}

fn default_seats() -> u32 {
    1
}
fn default_tokens_per_sec() -> f64 {
    50.0
}
fn default_ttft_ms() -> u64 {
    100
}
fn default_memory_gb() -> f64 {
    16.0
}
fn default_reply_tokens() -> u32 {
    16
}
fn default_context() -> u32 {
    8192
}
fn default_cold_load_ms() -> u64 {
    1000
}

impl Default for SimSpec {
    fn default() -> Self {
        SimSpec {
            seed: 0,
            seats: default_seats(),
            tokens_per_sec: default_tokens_per_sec(),
            ttft_ms: default_ttft_ms(),
            memory_gb: default_memory_gb(),
            reply_tokens: default_reply_tokens(),
            template_tokens: 0,
            embeddings_501: false,
            prefill_tokens_per_sec: None,
            prefix_cache_entries: 0,
            decode_contention: 0.0,
            prefill_parallel: 0,
            seats_per_model: false,
            ollama_cached_count: false,
            says_seats: false,
            models: Vec::new(),
        }
    }
}

impl SimModel {
    /// A model with the default context, cold load time, not loaded, not embedding.
    pub fn new(name: &str, size_gb: f64) -> Self {
        SimModel {
            name: name.to_string(),
            size_gb,
            context: default_context(),
            loaded: false,
            cold_load_ms: default_cold_load_ms(),
            embedding: false,
            speed: default_speed(),
        }
    }
}

impl SimSpec {
    /// Check the values a YAML file could get wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.seats == 0 {
            return Err("sim: seats must be at least 1".into());
        }
        if !(self.tokens_per_sec.is_finite() && self.tokens_per_sec > 0.0) {
            return Err("sim: tokens_per_sec must be a positive number".into());
        }
        if !(self.memory_gb.is_finite() && self.memory_gb > 0.0) {
            return Err("sim: memory_gb must be a positive number".into());
        }
        if let Some(r) = self.prefill_tokens_per_sec {
            if !(r.is_finite() && r > 0.0) {
                return Err(format!(
                    "sim: prefill_tokens_per_sec: {r} is not a positive number"
                ));
            }
        }
        if !(self.decode_contention.is_finite() && self.decode_contention >= 0.0) {
            return Err(format!(
                "sim: decode_contention: {} must be a number >= 0",
                self.decode_contention
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for m in &self.models {
            if m.name.trim().is_empty() {
                return Err("sim: a model has an empty name".into());
            }
            if !seen.insert(m.name.as_str()) {
                return Err(format!("sim: model '{}' listed twice", m.name));
            }
            if !(m.size_gb.is_finite() && m.size_gb >= 0.0) {
                return Err(format!("sim: model '{}': size_gb must be >= 0", m.name));
            }
            if m.context == 0 {
                return Err(format!("sim: model '{}': context must be >= 1", m.name));
            }
            if !(m.speed.is_finite() && m.speed > 0.0) {
                return Err(format!(
                    "sim: model '{}': speed must be a positive number",
                    m.name
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_defaults_apply() {
        let s: SimSpec =
            serde_yaml::from_str("models:\n  - name: a:1b\n    size_gb: 1.5\n").expect("yaml");
        assert_eq!(s.seats, 1);
        assert_eq!(s.tokens_per_sec, 50.0);
        assert_eq!(s.ttft_ms, 100);
        assert_eq!(s.memory_gb, 16.0);
        assert_eq!(s.reply_tokens, 16);
        assert_eq!(s.models[0].context, 8192);
        assert_eq!(s.models[0].cold_load_ms, 1000);
        assert!(!s.models[0].loaded && !s.models[0].embedding);
        assert_eq!(s.prefill_tokens_per_sec, None);
        assert_eq!(s.prefix_cache_entries, 0);
        assert_eq!(s.decode_contention, 0.0);
        assert!(s.validate().is_ok());
    }

    #[test]
    fn unknown_fields_and_bad_values_rejected() {
        assert!(serde_yaml::from_str::<SimSpec>("models: []\nseatz: 2\n").is_err());
        let bad = [
            SimSpec {
                seats: 0,
                ..SimSpec::default()
            },
            SimSpec {
                tokens_per_sec: f64::NAN,
                ..SimSpec::default()
            },
            SimSpec {
                memory_gb: -1.0,
                ..SimSpec::default()
            },
            SimSpec {
                prefill_tokens_per_sec: Some(0.0),
                ..SimSpec::default()
            },
            SimSpec {
                decode_contention: -0.5,
                ..SimSpec::default()
            },
            SimSpec {
                models: vec![SimModel::new("a", 1.0), SimModel::new("a", 2.0)],
                ..SimSpec::default()
            },
        ];
        for s in bad {
            assert!(s.validate().is_err(), "{s:?}");
        }
        assert!(SimSpec::default().validate().is_ok());
    }
}
