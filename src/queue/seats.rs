//! How many requests a node:model runs at once: configured or backend-reported seats, else a
//! batching server's default, else derived from memory (each extra parallel sequence costs KV
//! cache, ~10 % of the weights).

use crate::config::Backend;

/// Seats of a batching server (`backend: openai` or `vllm`: vLLM, SGLang, TGI ...) that reports
/// no seat count: such a server takes hundreds of sequences at once and queues the rest itself,
/// so the gateway must not hold requests back below that (vLLM's own default batch is 256;
/// the hard cap is 4x seats). Set `capacity` on the node to change it.
pub const DEFAULT_BATCHING_SEATS: u32 = 64;

/// Seats known without memory arithmetic: the config's, the backend's report, or the default
/// of a batching server; with where they came from (for `/fleet/status`).
pub fn known(
    configured: Option<u32>,
    reported: Option<u32>,
    backend: Backend,
) -> Option<(u32, &'static str)> {
    if let Some(s) = configured {
        return Some((s, "config"));
    }
    if let Some(s) = reported {
        return Some((s, "backend"));
    }
    matches!(backend, Backend::Openai | Backend::Vllm)
        .then_some((DEFAULT_BATCHING_SEATS, "default_batching"))
}

/// Where the seats of a node with no known count come from: its memory, or nothing (1 seat).
pub fn derived_source(available_gb: Option<f64>) -> &'static str {
    if available_gb.is_some() {
        "memory"
    } else {
        "one_at_a_time"
    }
}

/// Seats for a model of `model_gb` on a node with `available_gb` free beyond what is loaded.
/// `known`: seats from config or the backend (Ollama num_parallel, llama.cpp slots) win.
pub fn derive(known: Option<u32>, available_gb: Option<f64>, model_gb: f64) -> u32 {
    if let Some(s) = known {
        return s.max(1);
    }
    let (Some(avail), true) = (available_gb, model_gb > 0.0) else {
        return 1;
    };
    let per_seat = (model_gb * 0.1).max(0.5);
    let extra = ((avail - model_gb).max(0.0) / per_seat).floor() as u32;
    (1 + extra).clamp(1, MAX_DERIVED)
}

/// Derived seats stop here: beyond it, throughput per request falls on consumer hardware.
pub const MAX_DERIVED: u32 = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batching_servers_are_not_held_to_one_seat() {
        assert_eq!(
            known(None, None, Backend::Openai),
            Some((DEFAULT_BATCHING_SEATS, "default_batching"))
        );
        assert_eq!(known(None, None, Backend::Vllm).map(|k| k.0), Some(64));
        assert_eq!(
            known(None, Some(4), Backend::Llamacpp),
            Some((4, "backend"))
        );
        assert_eq!(
            known(Some(2), Some(4), Backend::Openai),
            Some((2, "config"))
        );
        assert_eq!(
            known(None, None, Backend::Ollama),
            None,
            "Ollama: from memory"
        );
        assert_eq!(known(None, None, Backend::Llamacpp), None);
    }

    #[test]
    fn configured_seats_win() {
        assert_eq!(derive(Some(16), Some(1.0), 40.0), 16);
        assert_eq!(derive(Some(0), None, 1.0), 1);
    }

    #[test]
    fn derived_from_memory_headroom() {
        assert_eq!(derive(None, None, 8.0), 1, "unknown memory: one at a time");
        assert_eq!(derive(None, Some(8.5), 8.0), 1, "barely fits");
        assert_eq!(
            derive(None, Some(10.0), 8.0),
            3,
            "2 GB headroom / 0.8 GB per seat"
        );
        assert_eq!(derive(None, Some(500.0), 8.0), MAX_DERIVED);
    }
}
