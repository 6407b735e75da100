//! Watches a response body go by (synchronously, never buffering the stream): counts stream
//! chunks (SSE `data:` lines, NDJSON lines) and keeps a small head and tail to read `usage`
//! from (OpenAI `usage`, Ollama `eval_count`/`prompt_eval_count`/`eval_duration`, llama.cpp
//! `timings`, Anthropic `message_start`/`message_delta` usage).

use std::collections::VecDeque;

const HEAD: usize = 2048;
const TAIL: usize = 4096;
const PREFIX: usize = 16;

/// What a body said about tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Observed {
    /// Data chunks seen (SSE `data:` lines other than `[DONE]`, NDJSON object lines).
    pub chunks: u32,
    pub prompt_tokens: Option<u32>,
    pub completion_tokens: Option<u32>,
    /// The node's own generation time (Ollama `eval_duration`, llama.cpp `predicted_ms`).
    pub eval_duration_ns: Option<u64>,
    /// Ollama's prompt evaluation (llama.cpp `prompt_ms`) and model load times.
    pub prompt_eval_duration_ns: Option<u64>,
    pub load_duration_ns: Option<u64>,
    /// Prompt tokens the node took from its prefix cache (OpenAI `cached_tokens`, Ollama
    /// `prompt_eval_cached_count`), counted in `prompt_tokens`.
    pub cached_tokens: Option<u32>,
}

impl Observed {
    /// Output tokens: the node's count, else the chunks of a stream (one token each).
    pub fn output_tokens(&self) -> Option<u32> {
        self.completion_tokens
            .or((self.chunks >= 2).then_some(self.chunks))
    }

    /// The node's count of the cached tokens, beside its count of the whole prompt (OpenAI
    /// usage counts the cached tokens in `prompt_tokens`, newer Ollama in
    /// `prompt_eval_count`). None: a prompt count, if any, may be only what was prefilled
    /// (`fleet::calibrate`).
    pub fn cached_of_whole(&self) -> Option<u32> {
        self.cached_tokens.filter(|_| self.prompt_tokens.is_some())
    }

    /// The node counted its output and left its prompt count out, as Ollama does when its
    /// cache held the whole prompt.
    pub fn prompt_left_out(&self) -> bool {
        self.prompt_tokens.is_none() && self.completion_tokens.is_some()
    }
}

#[derive(Debug, Default)]
pub struct StreamObserver {
    head: Vec<u8>,
    /// The last `TAIL` bytes: a ring, so a token stream's every chunk does not move the
    /// 4 KiB kept before it (a `Vec` drained at its front did).
    tail: VecDeque<u8>,
    /// First bytes of the line being read.
    line: Vec<u8>,
    line_len: usize,
    chunks: u32,
    /// What `finish` read, kept: the outcome and the tenant's usage both ask.
    finished: Option<Observed>,
}

impl StreamObserver {
    pub fn feed(&mut self, bytes: &[u8]) {
        self.finished = None;
        if self.head.len() < HEAD {
            let n = (HEAD - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
        }
        if bytes.len() >= TAIL {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - TAIL..]);
        } else {
            let over = (self.tail.len() + bytes.len()).saturating_sub(TAIL);
            self.tail.drain(..over);
            self.tail.extend(bytes);
        }
        let mut rest = bytes;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            self.line_part(&rest[..i]);
            self.end_line();
            rest = &rest[i + 1..];
        }
        self.line_part(rest);
    }

    /// Bytes of the line being read (no newline among them): its first `PREFIX` kept.
    fn line_part(&mut self, part: &[u8]) {
        if self.line.len() < PREFIX {
            let n = (PREFIX - self.line.len()).min(part.len());
            self.line.extend_from_slice(&part[..n]);
        }
        self.line_len += part.len();
    }

    fn end_line(&mut self) {
        let l = &self.line;
        let data = l.starts_with(b"data:") && !is_done(l);
        if data || l.first() == Some(&b'{') {
            self.chunks += 1;
        }
        self.line.clear();
        self.line_len = 0;
    }

    /// Chunks (lines) seen whole so far.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    /// What the body said (the last line counts even without a trailing newline).
    /// The first bytes of the body (an error answer fits whole).
    pub fn head(&self) -> &[u8] {
        &self.head
    }

    /// Read once: later calls return the same figures without re-scanning.
    pub fn finish(&mut self) -> Observed {
        if let Some(o) = self.finished {
            return o;
        }
        if self.line_len > 0 {
            self.end_line();
        }
        // One pass over each buffer for every key (the tail first: the last value counts).
        let (tail, head) = (
            last_numbers(self.tail.make_contiguous()),
            last_numbers(&self.head),
        );
        let find = |keys: &[Key]| {
            keys.iter()
                .find_map(|k| tail[*k as usize])
                .or_else(|| keys.iter().find_map(|k| head[*k as usize]))
        };
        let u32_of = |v: Option<u64>| v.and_then(|n| u32::try_from(n).ok());
        // Anthropic's `input_tokens` leaves out what was read from or written to its cache:
        // the whole prompt is the three, the cache read beside it (0 when only a write is
        // said, as servers that leave zero fields out send it).
        let anthropic = find(&[Key::PromptTokens, Key::PromptEvalCount]).is_none();
        let (read, written) = (
            find(&[Key::CacheReadInputTokens]),
            find(&[Key::CacheCreationInputTokens]),
        );
        let cache_read =
            (anthropic && (read.is_some() || written.is_some())).then(|| read.unwrap_or(0));
        let prompt = match (
            find(&[Key::PromptTokens, Key::PromptEvalCount, Key::InputTokens]),
            cache_read,
        ) {
            (Some(input), Some(read)) => input
                .checked_add(read)
                .and_then(|n| n.checked_add(written.unwrap_or(0))),
            (prompt, _) => prompt,
        };
        let o = Observed {
            chunks: self.chunks,
            prompt_tokens: u32_of(prompt),
            completion_tokens: u32_of(find(&[
                Key::CompletionTokens,
                Key::EvalCount,
                Key::OutputTokens,
            ])),
            eval_duration_ns: find(&[Key::EvalDuration, Key::PredictedMs]),
            prompt_eval_duration_ns: find(&[Key::PromptEvalDuration, Key::PromptMs]),
            load_duration_ns: find(&[Key::LoadDuration]),
            cached_tokens: u32_of(
                find(&[Key::CachedTokens, Key::PromptEvalCachedCount]).or(cache_read),
            ),
        };
        self.finished = Some(o);
        o
    }
}

/// A backend's nanoseconds (`eval_duration` ...) as seconds; none when absent or zero.
pub fn secs(ns: Option<u64>) -> Option<f64> {
    ns.filter(|n| *n > 0).map(|n| n as f64 / 1e9)
}

fn is_done(prefix: &[u8]) -> bool {
    let rest = prefix.strip_prefix(b"data:").unwrap_or(prefix);
    let rest = rest.strip_prefix(b" ").unwrap_or(rest);
    rest.starts_with(b"[DON")
}

/// The usage and timing fields read off a body (OpenAI, Ollama and Anthropic spellings).
#[derive(Debug, Clone, Copy)]
enum Key {
    PromptTokens,
    PromptEvalCount,
    InputTokens,
    CompletionTokens,
    EvalCount,
    OutputTokens,
    EvalDuration,
    PromptEvalDuration,
    LoadDuration,
    CachedTokens,
    /// Ollama (releases since August 2026): the prompt tokens read from its cache, counted in
    /// `prompt_eval_count`.
    PromptEvalCachedCount,
    /// Anthropic: prompt tokens read from the cache / written to it, not counted in
    /// `input_tokens`.
    CacheReadInputTokens,
    CacheCreationInputTokens,
    /// llama.cpp `timings`: milliseconds with a fraction, read as nanoseconds.
    PromptMs,
    PredictedMs,
}

/// The JSON names of [`Key`], in its order.
const KEYS: [&[u8]; 15] = [
    b"prompt_tokens",
    b"prompt_eval_count",
    b"input_tokens",
    b"completion_tokens",
    b"eval_count",
    b"output_tokens",
    b"eval_duration",
    b"prompt_eval_duration",
    b"load_duration",
    b"cached_tokens",
    b"prompt_eval_cached_count",
    b"cache_read_input_tokens",
    b"cache_creation_input_tokens",
    b"prompt_ms",
    b"predicted_ms",
];

/// Keys whose value is milliseconds with a fraction (llama.cpp's `timings`), kept as ns.
const MS_FROM: usize = Key::PromptMs as usize;

/// For each of [`KEYS`], the number after its last `"key":` in `buf` (JSON, optional spaces;
/// an occurrence not followed by a number does not count). One pass over the quotes.
fn last_numbers(buf: &[u8]) -> [Option<u64>; KEYS.len()] {
    let mut out = [None; KEYS.len()];
    for q in memchr::memchr_iter(b'"', buf) {
        let rest = &buf[q + 1..];
        for (k, key) in KEYS.iter().enumerate() {
            if rest.len() > key.len() && rest.starts_with(key) && rest[key.len()] == b'"' {
                let after = &rest[key.len() + 1..];
                let n = if k >= MS_FROM {
                    ms_as_ns(after)
                } else {
                    number_after(after)
                };
                if let Some(n) = n {
                    out[k] = Some(n);
                }
                break;
            }
        }
    }
    out
}

/// The number in ` : 123` (spaces optional), without allocating.
fn number_after(rest: &[u8]) -> Option<u64> {
    digits(value_at(rest)?).0
}

/// What follows ` : ` (spaces optional) in `rest`.
fn value_at(rest: &[u8]) -> Option<&[u8]> {
    let mut i = rest.iter().take_while(|b| **b == b' ').count();
    if rest.get(i) != Some(&b':') {
        return None;
    }
    i += 1;
    i += rest[i..].iter().take_while(|b| **b == b' ').count();
    Some(&rest[i..])
}

/// The leading decimal digits of `s` as a number (`None`: none, or past u64) and how many.
fn digits(s: &[u8]) -> (Option<u64>, usize) {
    let mut n: Option<u64> = None;
    let mut len = 0;
    for d in s.iter().take_while(|b| b.is_ascii_digit()) {
        len += 1;
        n = n
            .unwrap_or(0)
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(d - b'0')));
        if n.is_none() {
            return (None, len);
        }
    }
    (n, len)
}

/// The milliseconds in ` : 378.503` as nanoseconds (to the ns; further digits dropped).
fn ms_as_ns(rest: &[u8]) -> Option<u64> {
    let v = value_at(rest)?;
    let (whole, len) = digits(v);
    let mut ns = whole?.checked_mul(1_000_000)?;
    if v.get(len) == Some(&b'.') {
        let frac = &v[len + 1..];
        let kept = frac.iter().take_while(|b| b.is_ascii_digit()).take(6);
        let mut scale = 100_000;
        for d in kept {
            ns = ns.checked_add(u64::from(d - b'0') * scale)?;
            scale /= 10;
        }
    }
    Some(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observe(chunks: &[&str]) -> Observed {
        let mut o = StreamObserver::default();
        for c in chunks {
            o.feed(c.as_bytes());
        }
        o.finish()
    }

    #[test]
    fn the_last_numeric_value_of_each_key_counts() {
        let n = last_numbers(
            br#"{"prompt_tokens": 7,"x":"\"prompt_tokens\": 9","prompt_tokens_details":{"cached_tokens":3},"prompt_tokens":null,"eval_count" :  12,"eval_count":99999999999999999999}"#,
        );
        assert_eq!(n[Key::PromptTokens as usize], Some(7));
        assert_eq!(n[Key::CachedTokens as usize], Some(3));
        assert_eq!(
            n[Key::EvalCount as usize],
            Some(12),
            "an overflowing value does not count"
        );
        assert_eq!(n[Key::InputTokens as usize], None);
    }

    #[test]
    fn openai_sse_with_usage_split_across_chunks() {
        let o = observe(&[
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\nda",
            "ta: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_",
            "tokens\": 2,\"total_tokens\":14}}\n\ndata: [DONE]\n\n",
        ]);
        assert_eq!(o.chunks, 3);
        assert_eq!(o.prompt_tokens, Some(12));
        assert_eq!(o.completion_tokens, Some(2));
        assert_eq!(o.output_tokens(), Some(2));
    }

    #[test]
    fn sse_without_usage_counts_chunks() {
        let o =
            observe(&["data: {\"x\":1}\n\ndata: {\"x\":2}\n\ndata: {\"x\":3}\n\ndata: [DONE]\n\n"]);
        assert_eq!(o.completion_tokens, None);
        assert_eq!(o.output_tokens(), Some(3));
    }

    #[test]
    fn ollama_ndjson_and_non_stream() {
        let o = observe(&[
            "{\"message\":{\"content\":\"a\"},\"done\":false}\n",
            "{\"message\":{\"content\":\"b\"},\"done\":false}\n",
            "{\"done\":true,\"prompt_eval_count\":30,\"eval_count\":2,\"eval_duration\":40000000}\n",
        ]);
        assert_eq!(o.chunks, 3);
        assert_eq!(o.prompt_tokens, Some(30));
        assert_eq!(o.completion_tokens, Some(2));
        assert_eq!(o.eval_duration_ns, Some(40_000_000));
        assert_eq!(
            o.cached_tokens, None,
            "an older Ollama says nothing of its cache"
        );
        let o = observe(&[
            "{\"done\":true,\"prompt_eval_count\":2400,\"prompt_eval_cached_count\":2300,\"eval_count\":2}\n",
        ]);
        assert_eq!((o.prompt_tokens, o.cached_tokens), (Some(2400), Some(2300)));
        let one = observe(&["{\"response\":\"hi\",\"done\":true,\"eval_count\":9}"]);
        assert_eq!(one.output_tokens(), Some(9));
        let plain = observe(&["{\"choices\":[]}"]);
        assert_eq!(plain.output_tokens(), None, "one object is not a stream");
    }

    /// A real llama.cpp server's last stream chunk (llama-server via xllamacpp): its
    /// `timings` give the prompt and generation times, milliseconds with a fraction.
    #[test]
    fn llamacpp_timings_give_the_nodes_own_prompt_and_generation_times() {
        let o = observe(&[
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"completion_tokens\":4,\"prompt_tokens\":37,\"total_tokens\":41,\"prompt_tokens_details\":{\"cached_tokens\":36}},\"timings\":{\"cache_n\":36,\"prompt_n\":1,\"prompt_ms\":19.187,\"prompt_per_token_ms\":19.187,\"prompt_per_second\":52.1186,\"predicted_n\":4,\"predicted_ms\":53.12,\"predicted_per_token_ms\":17.7066,\"predicted_per_second\":56.4759}}\n\n",
            "data: [DONE]\n\n",
        ]);
        assert_eq!(o.prompt_tokens, Some(37));
        assert_eq!(o.cached_tokens, Some(36));
        assert_eq!(o.prompt_eval_duration_ns, Some(19_187_000));
        assert_eq!(o.eval_duration_ns, Some(53_120_000));
        let whole = observe(&[
            r#"{"usage":{"completion_tokens":8},"timings":{"prompt_ms":378,"predicted_ms":0.0000009}}"#,
        ]);
        assert_eq!(whole.prompt_eval_duration_ns, Some(378_000_000));
        assert_eq!(whole.eval_duration_ns, Some(0), "past the ns: dropped");
        assert_eq!(last_numbers(br#""prompt_ms":-1.5"#)[MS_FROM], None);
    }

    #[test]
    fn anthropic_start_and_delta_usage() {
        let mut body = String::from("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n");
        for _ in 0..2000 {
            body.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"w \"}}\n\n");
        }
        body.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":2000}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
        let o = observe(&[&body]);
        assert_eq!(o.prompt_tokens, Some(25), "from the head");
        assert_eq!(o.completion_tokens, Some(2000), "from the tail");
    }

    /// Anthropic counts what its cache read and wrote apart from `input_tokens`: the whole
    /// prompt is the three, and the cache read is its cached part, as OpenAI's usage says it.
    /// Beside OpenAI's own count (a proxy that adds Anthropic's fields), OpenAI's counts stand.
    #[test]
    fn anthropic_cache_counts_make_the_whole_prompt() {
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":40,\"cache_creation_input_tokens\":10,\"cache_read_input_tokens\":2300,\"output_tokens\":1}}}\n\n";
        let o = observe(&[start, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n"]);
        assert_eq!((o.prompt_tokens, o.cached_tokens), (Some(2350), Some(2300)));
        assert_eq!(o.cached_of_whole(), Some(2300));
        let plain = observe(&[r#"{"usage":{"input_tokens":40,"output_tokens":7}}"#]);
        assert_eq!((plain.prompt_tokens, plain.cached_tokens), (Some(40), None));
        let written = observe(&[
            r#"{"usage":{"input_tokens":40,"cache_creation_input_tokens":2300,"output_tokens":7}}"#,
        ]);
        assert_eq!(
            (written.prompt_tokens, written.cached_tokens),
            (Some(2340), Some(0))
        );
        let proxied = observe(&[
            r#"{"usage":{"prompt_tokens":2350,"completion_tokens":7,"cache_read_input_tokens":2300,"prompt_tokens_details":{"cached_tokens":2300}}}"#,
        ]);
        assert_eq!(
            (proxied.prompt_tokens, proxied.cached_tokens),
            (Some(2350), Some(2300))
        );
    }

    #[test]
    fn memory_stays_bounded() {
        let mut o = StreamObserver::default();
        let line = "data: {\"choices\":[{\"delta\":{\"content\":\"word\"}}]}\n\n".repeat(100);
        for _ in 0..1000 {
            o.feed(line.as_bytes());
        }
        assert!(o.head.len() <= HEAD && o.tail.len() <= TAIL && o.line.len() <= PREFIX);
        assert_eq!(o.finish().chunks, 100_000);
    }
}
