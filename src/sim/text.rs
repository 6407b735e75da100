//! Deterministic text, embeddings, token estimates, hashes and timestamps.

use std::time::{SystemTime, UNIX_EPOCH};

const WORDS: [&str; 64] = [
    "the", "model", "answers", "with", "a", "short", "and", "plain", "reply", "about", "every",
    "question", "it", "gets", "from", "users", "on", "local", "network", "nodes", "while",
    "tokens", "flow", "steadily", "through", "gateway", "queues", "that", "balance", "load",
    "across", "machines", "in", "lab", "so", "each", "request", "finds", "free", "seat", "soon",
    "river", "stone", "light", "green", "quiet", "morning", "paper", "window", "garden", "signal",
    "number", "simple", "honest", "clear", "bright", "calm", "north", "south", "east", "west",
    "small", "large", "warm",
];

/// Embedding vector length served by the sim.
pub const EMBED_DIM: usize = 384;

/// SplitMix64: a tiny, stable PRNG (independent of any crate's algorithm choice).
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// FNV-1a, used to derive a per-request seed from its content.
pub fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Estimated tokens of a text: chars / 4, rounded up.
pub fn est_tokens(text: &str) -> u32 {
    let chars = text.chars().count();
    u32::try_from(chars.div_ceil(4)).unwrap_or(u32::MAX)
}

/// The `n` output tokens for a request seed; one word per token, words after the
/// first carry a leading space, so concatenating them gives the text.
pub fn tokens(seed: u64, n: u32) -> Vec<String> {
    let mut rng = SplitMix::new(seed);
    (0..n)
        .map(|i| {
            let w = WORDS[(rng.next_u64() % WORDS.len() as u64) as usize];
            if i == 0 {
                w.to_string()
            } else {
                format!(" {w}")
            }
        })
        .collect()
}

/// A unit-length embedding derived from the seed.
pub fn embedding(seed: u64) -> Vec<f32> {
    let mut rng = SplitMix::new(seed);
    let mut v: Vec<f32> = (0..EMBED_DIM)
        .map(|_| ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32)
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// `sha256:<hex>` style digest of a name (Ollama shows the hex part only in /api/tags).
pub fn digest(name: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(name.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// RFC 3339 UTC timestamp with nanoseconds, as Go's time.Time marshals.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (y, m, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// Days since 1970-01-01 to (year, month, day), H. Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn tokens_are_deterministic_and_counted() {
        let a = tokens(42, 10);
        assert_eq!(a, tokens(42, 10));
        assert_ne!(a, tokens(43, 10));
        assert_eq!(a.len(), 10);
        assert!(!a[0].starts_with(' ') && a[1..].iter().all(|t| t.starts_with(' ')));
        assert!(tokens(1, 0).is_empty());
    }

    #[test]
    fn estimates_round_up() {
        assert_eq!(est_tokens(""), 0);
        assert_eq!(est_tokens("abc"), 1);
        assert_eq!(est_tokens("abcdefgh"), 2);
        assert_eq!(est_tokens("ééééé"), 2);
    }

    #[test]
    fn embedding_is_unit_length() {
        let v = embedding(7);
        assert_eq!(v.len(), EMBED_DIM);
        let n: f32 = v.iter().map(|x| x * x).sum();
        assert!((n - 1.0).abs() < 1e-4);
        assert_eq!(v, embedding(7));
    }

    #[test]
    fn timestamps_format() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        let t = UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.000000005Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert!(rfc3339(leap).starts_with("2000-02-29T"));
    }

    #[test]
    fn fnv_separates_parts() {
        assert_ne!(fnv1a(&["ab", "c"]), fnv1a(&["a", "bc"]));
    }
}
