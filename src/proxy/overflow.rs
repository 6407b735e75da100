//! A node's "prompt too long for my window" answer, in the wordings servers use (llama.cpp
//! `exceed_context_size_error` with `n_prompt_tokens`/`n_ctx`; vLLM "maximum context length is
//! N tokens ... you requested M tokens (P in the messages ..."; OpenAI
//! `context_length_exceeded`; Ollama "input length exceeds the context length"). The real
//! prompt-token count it gives feeds the calibration, so the next estimate is right.

use serde_json::Value;

/// What an overflow answer said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Overflow {
    /// Prompt tokens the node counted, when it said.
    pub prompt_tokens: Option<u32>,
    /// The node's window, when it said.
    pub window: Option<u32>,
}

/// Parse an error body (its head); None when it is not a context overflow.
pub fn parse(body: &[u8]) -> Option<Overflow> {
    let text = std::str::from_utf8(body).ok()?;
    let v: Value = serde_json::from_str(text).ok()?;
    // OpenAI, llama.cpp, Ollama: under "error"; vLLM: at the top level.
    let err = v.get("error").unwrap_or(&v);
    let field = |k: &str| err.get(k).and_then(Value::as_str).unwrap_or("");
    let msg = match err {
        Value::String(s) => s.as_str(),
        _ => field("message"),
    };
    let lower = msg.to_ascii_lowercase();
    let num = |k: &str| {
        err.get(k)
            .and_then(Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    if field("type") == "exceed_context_size_error" {
        return Some(Overflow {
            prompt_tokens: num("n_prompt_tokens"),
            window: num("n_ctx"),
        });
    }
    let overflow = field("code") == "context_length_exceeded"
        || lower.contains("maximum context length")
        || lower.contains("exceeds the available context size")
        || lower.contains("exceeds the context length")
        || lower.contains("context length exceeded");
    if !overflow {
        return None;
    }
    // vLLM: "... maximum context length is 2048 tokens. However, you requested 2100 tokens
    // (2000 in the messages, 100 in the completion)."
    Some(Overflow {
        prompt_tokens: number_before(&lower, " in the messages")
            .or_else(|| number_after(&lower, "request (")),
        window: number_after(&lower, "maximum context length is ")
            .or_else(|| number_after(&lower, "context size (")),
    })
}

fn number_after(s: &str, marker: &str) -> Option<u32> {
    let rest = &s[s.find(marker)? + marker.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

fn number_before(s: &str, marker: &str) -> Option<u32> {
    let head = &s[..s.find(marker)?];
    let digits: String = head
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wordings_of_four_servers() {
        // llama.cpp (xllamacpp 2026.10), as received.
        let llama = br#"{"error":{"code":400,"message":"request (1231 tokens) exceeds the available context size (1024 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":1231,"n_ctx":1024}}"#;
        assert_eq!(
            parse(llama),
            Some(Overflow {
                prompt_tokens: Some(1231),
                window: Some(1024)
            })
        );
        let vllm = br#"{"object":"error","message":"This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2000 in the messages, 100 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#;
        assert_eq!(
            parse(vllm),
            Some(Overflow {
                prompt_tokens: Some(2000),
                window: Some(2048)
            })
        );
        let openai = br#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
        assert_eq!(parse(openai).unwrap().window, Some(8192));
        let ollama = br#"{"error":"the input length exceeds the context length"}"#;
        assert_eq!(parse(ollama), Some(Overflow::default()));
        assert_eq!(parse(br#"{"error":{"message":"model not found"}}"#), None);
        assert_eq!(parse(b"not json"), None);
    }
}
