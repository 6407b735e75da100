//! Prompt-token estimate from a parsed body: chars / chars-per-token plus fixed overheads.

use super::ParsedRequest;

/// Template tokens per message (role markers, separators).
pub const MESSAGE_OVERHEAD: u32 = 4;
/// Tokens charged per image.
pub const IMAGE_TOKENS: u32 = 768;
/// Used when the caller's calibration is not a positive finite number.
pub const DEFAULT_CHARS_PER_TOKEN: f64 = 4.0;

impl ParsedRequest {
    /// `ceil(prompt_chars / chars_per_token) + MESSAGE_OVERHEAD * messages
    /// + IMAGE_TOKENS * images + token_ids`, saturating at `u32::MAX`.
    pub fn estimated_prompt_tokens(&self, chars_per_token: f64) -> u32 {
        let cpt = if chars_per_token.is_finite() && chars_per_token > 0.0 {
            chars_per_token
        } else {
            DEFAULT_CHARS_PER_TOKEN
        };
        // Float-to-int `as` saturates (and maps NaN to 0), so this cannot overflow.
        let text = (self.prompt_chars as f64 / cpt).ceil() as u64;
        let total = text
            .saturating_add(u64::from(MESSAGE_OVERHEAD) * u64::from(self.messages))
            .saturating_add(u64::from(IMAGE_TOKENS) * u64::from(self.images))
            .saturating_add(u64::from(self.token_ids));
        u32::try_from(total).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(prompt_chars: usize, messages: u32, images: u32) -> ParsedRequest {
        ParsedRequest {
            prompt_chars,
            messages,
            images,
            ..ParsedRequest::default()
        }
    }

    #[test]
    fn formula() {
        assert_eq!(MESSAGE_OVERHEAD, 4);
        assert_eq!(IMAGE_TOKENS, 768);
        let cases = [
            // (chars, messages, images, cpt, want)
            (0, 0, 0, 4.0, 0),
            (1, 0, 0, 4.0, 1),
            (4, 0, 0, 4.0, 1),
            (5, 0, 0, 4.0, 2),
            (400, 3, 0, 4.0, 100 + 12),
            (400, 1, 2, 4.0, 100 + 4 + 1536),
            (10, 1, 0, 2.5, 4 + 4),
            (10, 1, 0, 3.0, 4 + 4),
            (10, 0, 0, 0.0, 3),
            (10, 0, 0, -1.0, 3),
            (10, 0, 0, f64::NAN, 3),
            (10, 0, 0, f64::INFINITY, 3),
        ];
        for (chars, m, i, cpt, want) in cases {
            assert_eq!(
                req(chars, m, i).estimated_prompt_tokens(cpt),
                want,
                "{chars} {m} {i} {cpt}"
            );
        }
    }

    #[test]
    fn token_ids_count_one_each() {
        let r = ParsedRequest {
            prompt_chars: 8,
            messages: 1,
            token_ids: 100,
            ..ParsedRequest::default()
        };
        assert_eq!(r.estimated_prompt_tokens(4.0), 2 + 4 + 100);
    }

    #[test]
    fn saturates() {
        let r = req(usize::MAX, u32::MAX, u32::MAX);
        assert_eq!(r.estimated_prompt_tokens(1e-300), u32::MAX);
    }
}
