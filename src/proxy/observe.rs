//! Watches a response body go by (synchronously, never buffering the stream): counts stream
//! chunks (SSE `data:` lines, NDJSON lines) and keeps a small head and tail to read `usage`
//! from (OpenAI `usage`, Ollama `eval_count`/`prompt_eval_count`/`eval_duration`, Anthropic
//! `message_start`/`message_delta` usage).

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
    /// Ollama's own generation time.
    pub eval_duration_ns: Option<u64>,
    /// Ollama's prompt evaluation and model load times.
    pub prompt_eval_duration_ns: Option<u64>,
    pub load_duration_ns: Option<u64>,
    /// Prompt tokens the node took from its prefix cache (OpenAI `cached_tokens`).
    pub cached_tokens: Option<u32>,
}

impl Observed {
    /// Output tokens: the node's count, else the chunks of a stream (one token each).
    pub fn output_tokens(&self) -> Option<u32> {
        self.completion_tokens
            .or((self.chunks >= 2).then_some(self.chunks))
    }
}

#[derive(Debug, Default)]
pub struct StreamObserver {
    head: Vec<u8>,
    tail: Vec<u8>,
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
            self.tail.extend_from_slice(&bytes[bytes.len() - TAIL..]);
        } else {
            let over = (self.tail.len() + bytes.len()).saturating_sub(TAIL);
            self.tail.drain(..over);
            self.tail.extend_from_slice(bytes);
        }
        for &b in bytes {
            if b == b'\n' {
                self.end_line();
            } else {
                if self.line.len() < PREFIX {
                    self.line.push(b);
                }
                self.line_len += 1;
            }
        }
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
        let find = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| last_number(&self.tail, k))
                .or_else(|| keys.iter().find_map(|k| last_number(&self.head, k)))
        };
        let u32_of = |v: Option<u64>| v.and_then(|n| u32::try_from(n).ok());
        let o = Observed {
            chunks: self.chunks,
            prompt_tokens: u32_of(find(&[
                "prompt_tokens",
                "prompt_eval_count",
                "input_tokens",
            ])),
            completion_tokens: u32_of(find(&["completion_tokens", "eval_count", "output_tokens"])),
            eval_duration_ns: find(&["eval_duration"]),
            prompt_eval_duration_ns: find(&["prompt_eval_duration"]),
            load_duration_ns: find(&["load_duration"]),
            cached_tokens: u32_of(find(&["cached_tokens"])),
        };
        self.finished = Some(o);
        o
    }
}

fn is_done(prefix: &[u8]) -> bool {
    let rest = prefix.strip_prefix(b"data:").unwrap_or(prefix);
    let rest = rest.strip_prefix(b" ").unwrap_or(rest);
    rest.starts_with(b"[DON")
}

/// The number after the last `"key":` in `buf` (JSON, optional spaces).
fn last_number(buf: &[u8], key: &str) -> Option<u64> {
    let pat = format!("\"{key}\"");
    let pat = pat.as_bytes();
    let mut end = buf.len();
    while let Some(pos) = rfind(&buf[..end], pat) {
        let mut i = pos + pat.len();
        while buf.get(i).is_some_and(|b| *b == b' ') {
            i += 1;
        }
        if buf.get(i) == Some(&b':') {
            i += 1;
            while buf.get(i).is_some_and(|b| *b == b' ') {
                i += 1;
            }
            let digits: Vec<u8> = buf[i..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .copied()
                .collect();
            if let Some(n) = std::str::from_utf8(&digits)
                .ok()
                .and_then(|s| s.parse().ok())
            {
                return Some(n);
            }
        }
        end = pos;
    }
    None
}

fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.len() > hay.len() {
        return None;
    }
    (0..=hay.len() - needle.len())
        .rev()
        .find(|&i| &hay[i..i + needle.len()] == needle)
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
        let one = observe(&["{\"response\":\"hi\",\"done\":true,\"eval_count\":9}"]);
        assert_eq!(one.output_tokens(), Some(9));
        let plain = observe(&["{\"choices\":[]}"]);
        assert_eq!(plain.output_tokens(), None, "one object is not a stream");
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
