//! Native error bodies per family, and the trailer for a stream that broke mid-way.

use bytes::Bytes;
use serde_json::{json, Value};

use super::{Endpoint, ErrorCode, Family};

/// OpenAI's `error.type` for `code`.
fn openai_type(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::ModelNotFound
        | ErrorCode::NotFound
        | ErrorCode::ContextLengthExceeded
        | ErrorCode::RequestTooLarge
        | ErrorCode::InvalidRequest
        | ErrorCode::RequestTimeout
        // OpenAI answers a bad key with 401 + invalid_request_error / invalid_api_key.
        | ErrorCode::Unauthorized => "invalid_request_error",
        ErrorCode::QueueFull => "rate_limit_error",
        ErrorCode::NoProviderAvailable | ErrorCode::UpstreamError | ErrorCode::Overloaded => {
            "server_error"
        }
    }
}

/// Anthropic's `error.type` for `code`.
fn anthropic_type(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::ModelNotFound | ErrorCode::NotFound => "not_found_error",
        ErrorCode::ContextLengthExceeded
        | ErrorCode::InvalidRequest
        | ErrorCode::RequestTimeout => "invalid_request_error",
        ErrorCode::NoProviderAvailable | ErrorCode::Overloaded => "overloaded_error",
        ErrorCode::QueueFull => "rate_limit_error",
        ErrorCode::RequestTooLarge => "request_too_large",
        ErrorCode::Unauthorized => "authentication_error",
        ErrorCode::UpstreamError => "api_error",
    }
}

fn error_value(family: Family, code: ErrorCode, message: &str) -> Value {
    match family {
        Family::OpenAI => json!({"error": {
            "message": message,
            "type": openai_type(code),
            "param": null,
            "code": code.as_str(),
        }}),
        Family::Ollama => json!({"error": message}),
        Family::Anthropic => json!({"type": "error", "error": {
            "type": anthropic_type(code),
            "message": message,
        }}),
    }
}

fn to_vec(v: &Value) -> Vec<u8> {
    // Serializing a `Value` with string keys cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

/// A complete error response body in `family`'s native shape (status: `code.status()`).
pub fn error_body(family: Family, code: ErrorCode, message: &str) -> Bytes {
    Bytes::from(to_vec(&error_value(family, code, message)))
}

/// What to append to a response stream that broke mid-way, framed for `ep`'s family:
/// OpenAI SSE `data:` event, Ollama NDJSON line, Anthropic SSE `event: error`.
pub fn stream_error_chunk(ep: Endpoint, code: ErrorCode, message: &str) -> Bytes {
    let family = ep.family();
    let body = to_vec(&error_value(family, code, message));
    let (prefix, suffix): (&[u8], &[u8]) = match family {
        Family::OpenAI => (b"data: ", b"\n\n"),
        Family::Ollama => (b"", b"\n"),
        Family::Anthropic => (b"event: error\ndata: ", b"\n\n"),
    };
    let mut out = Vec::with_capacity(prefix.len() + body.len() + suffix.len());
    out.extend_from_slice(prefix);
    out.extend_from_slice(&body);
    out.extend_from_slice(suffix);
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(b: &[u8]) -> Value {
        serde_json::from_slice(b).expect("valid JSON")
    }

    #[test]
    fn openai_shape() {
        let cases = [
            (ErrorCode::ModelNotFound, "invalid_request_error"),
            (ErrorCode::QueueFull, "rate_limit_error"),
            (ErrorCode::NoProviderAvailable, "server_error"),
            (ErrorCode::UpstreamError, "server_error"),
            (ErrorCode::Unauthorized, "invalid_request_error"),
        ];
        for (code, ty) in cases {
            let v = parse(&error_body(Family::OpenAI, code, "boom \"quoted\"\n"));
            assert_eq!(
                v,
                json!({"error":{"message":"boom \"quoted\"\n","type":ty,"param":null,"code":code.as_str()}})
            );
        }
    }

    #[test]
    fn ollama_shape() {
        for code in ErrorCode::ALL {
            let v = parse(&error_body(Family::Ollama, code, "model 'x' not found"));
            assert_eq!(v, json!({"error":"model 'x' not found"}));
        }
    }

    #[test]
    fn anthropic_shape() {
        let want = [
            "not_found_error",
            "invalid_request_error",
            "overloaded_error",
            "rate_limit_error",
            "request_too_large",
            "invalid_request_error",
            "authentication_error",
            "api_error",
            "not_found_error",
            "invalid_request_error",
            "overloaded_error",
        ];
        assert_eq!(want.len(), ErrorCode::ALL.len());
        for (code, ty) in ErrorCode::ALL.into_iter().zip(want) {
            let v = parse(&error_body(Family::Anthropic, code, "m"));
            assert_eq!(
                v,
                json!({"type":"error","error":{"type":ty,"message":"m"}}),
                "{code:?}"
            );
        }
    }

    #[test]
    fn stream_chunks() {
        let c = stream_error_chunk(Endpoint::OpenAIChat, ErrorCode::UpstreamError, "lost");
        let s = std::str::from_utf8(&c).unwrap();
        let data = s
            .strip_prefix("data: ")
            .unwrap()
            .strip_suffix("\n\n")
            .unwrap();
        assert!(!data.contains('\n'));
        assert_eq!(parse(data.as_bytes())["error"]["code"], "upstream_error");

        let c = stream_error_chunk(Endpoint::OllamaGenerate, ErrorCode::UpstreamError, "a\nb");
        let s = std::str::from_utf8(&c).unwrap();
        assert_eq!(s.matches('\n').count(), 1, "one NDJSON line: {s:?}");
        assert_eq!(parse(s.trim_end().as_bytes()), json!({"error":"a\nb"}));

        let c = stream_error_chunk(
            Endpoint::AnthropicMessages,
            ErrorCode::NoProviderAvailable,
            "x",
        );
        let s = std::str::from_utf8(&c).unwrap();
        let data = s
            .strip_prefix("event: error\ndata: ")
            .unwrap()
            .strip_suffix("\n\n")
            .unwrap();
        assert_eq!(
            parse(data.as_bytes()),
            json!({"type":"error","error":{"type":"overloaded_error","message":"x"}})
        );
    }
}
