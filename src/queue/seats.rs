//! How many requests a node:model runs at once: configured or backend-reported seats, else
//! derived from memory (each extra parallel sequence costs KV cache, ~10 % of the weights).

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
