//! Wire protocols: detect by method + path, parse what routing needs, write native errors.
//!
//! One file per protocol family (openai.rs, ollama.rs, anthropic.rs); this file holds the
//! shared types and dispatch. Everything here is pure: no I/O, no clocks, no panics on
//! client data.

mod anthropic;
mod detect;
mod errors;
mod estimate;
mod fields;
mod local;
mod ollama;
mod openai;
mod prefix;
mod rewrite;
pub mod translate;

pub use crate::routing::Family;
pub use detect::{detect, detect_local};
pub use errors::{error_body, stream_error_chunk};
pub use estimate::{DEFAULT_CHARS_PER_TOKEN, IMAGE_TOKENS, MESSAGE_OVERHEAD};
pub use local::{
    count_tokens_body, ollama_ps, ollama_show, ollama_tags, ollama_version, openai_models,
    ModelInfo,
};
pub use prefix::{Prefix, LEADING_BLOCK_CHARS};
pub use rewrite::rewrite_model;

/// Why a Responses request that points at stored state is refused (the gateway keeps none).
pub const STATELESS: &str = "`previous_response_id` and `conversation` are not supported: \
fleetgate is stateless and keeps no responses; send the whole conversation in `input`";

/// A proxied inference endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    OpenAIChat,
    OpenAICompletions,
    OpenAIEmbeddings,
    OpenAIResponses,
    OllamaChat,
    OllamaGenerate,
    OllamaEmbed,
    OllamaEmbeddings,
    AnthropicMessages,
}

/// An endpoint the gateway answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// GET /v1/models
    OpenAIModels,
    /// GET /api/tags
    OllamaTags,
    /// GET /api/ps
    OllamaPs,
    /// GET /api/version
    OllamaVersion,
    /// POST /api/show
    OllamaShow,
    /// GET or HEAD /
    Root,
    /// POST /v1/messages/count_tokens
    AnthropicCountTokens,
}

/// What routing needs from a request body.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedRequest {
    pub model: String,
    /// Characters of all text the model reads (messages, system, prompt, serialized tools).
    pub prompt_chars: usize,
    /// Number of messages/items the chat template wraps (1 for prompt-style endpoints).
    pub messages: u32,
    pub images: u32,
    /// Any tools/functions declared.
    pub tools: bool,
    pub max_tokens: Option<u32>,
    pub stream: bool,
    pub fallback_models: Vec<String>,
    /// Pre-tokenized input (OpenAI `prompt`/`input` as token ids, Ollama `context`):
    /// counted one token each by the estimate, independent of chars-per-token.
    pub token_ids: u32,
    /// The stable prefix later turns share (system prompt + first user turn), see `prefix.rs`.
    pub prefix: Option<Prefix>,
}

/// Stable client-visible error codes (DESIGN.md, Errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    ModelNotFound,
    ContextLengthExceeded,
    NoProviderAvailable,
    QueueFull,
    RequestTooLarge,
    InvalidRequest,
    Unauthorized,
    UpstreamError,
    /// No such endpoint (method + path): 404, as OpenAI and Ollama answer an unknown URL.
    NotFound,
    /// The request head or body did not arrive in time (`clients.*_timeout_ms`): 408.
    RequestTimeout,
    /// The gateway itself is at a limit (connections, buffered body bytes): 503 + Retry-After.
    Overloaded,
}

/// A request body the gateway cannot route; `message` names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    pub message: String,
}

impl ParseError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl Endpoint {
    pub const ALL: [Endpoint; 9] = [
        Endpoint::OpenAIChat,
        Endpoint::OpenAICompletions,
        Endpoint::OpenAIEmbeddings,
        Endpoint::OpenAIResponses,
        Endpoint::OllamaChat,
        Endpoint::OllamaGenerate,
        Endpoint::OllamaEmbed,
        Endpoint::OllamaEmbeddings,
        Endpoint::AnthropicMessages,
    ];

    pub fn family(self) -> Family {
        match self {
            Endpoint::OpenAIChat
            | Endpoint::OpenAICompletions
            | Endpoint::OpenAIEmbeddings
            | Endpoint::OpenAIResponses => Family::OpenAI,
            Endpoint::OllamaChat
            | Endpoint::OllamaGenerate
            | Endpoint::OllamaEmbed
            | Endpoint::OllamaEmbeddings => Family::Ollama,
            Endpoint::AnthropicMessages => Family::Anthropic,
        }
    }

    /// Stable metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::OpenAIChat => "openai_chat",
            Endpoint::OpenAICompletions => "openai_completions",
            Endpoint::OpenAIEmbeddings => "openai_embeddings",
            Endpoint::OpenAIResponses => "openai_responses",
            Endpoint::OllamaChat => "ollama_chat",
            Endpoint::OllamaGenerate => "ollama_generate",
            Endpoint::OllamaEmbed => "ollama_embed",
            Endpoint::OllamaEmbeddings => "ollama_embeddings",
            Endpoint::AnthropicMessages => "anthropic_messages",
        }
    }

    pub fn is_embedding(self) -> bool {
        matches!(
            self,
            Endpoint::OpenAIEmbeddings | Endpoint::OllamaEmbed | Endpoint::OllamaEmbeddings
        )
    }

    /// The request path, as sent upstream.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::OpenAIChat => "/v1/chat/completions",
            Endpoint::OpenAICompletions => "/v1/completions",
            Endpoint::OpenAIEmbeddings => "/v1/embeddings",
            Endpoint::OpenAIResponses => "/v1/responses",
            Endpoint::OllamaChat => "/api/chat",
            Endpoint::OllamaGenerate => "/api/generate",
            Endpoint::OllamaEmbed => "/api/embed",
            Endpoint::OllamaEmbeddings => "/api/embeddings",
            Endpoint::AnthropicMessages => "/v1/messages",
        }
    }
}

impl Local {
    /// Stable metrics label.
    pub fn label(self) -> &'static str {
        match self {
            Local::OpenAIModels => "openai_models",
            Local::OllamaTags => "ollama_tags",
            Local::OllamaPs => "ollama_ps",
            Local::OllamaVersion => "ollama_version",
            Local::OllamaShow => "ollama_show",
            Local::Root => "root",
            Local::AnthropicCountTokens => "anthropic_count_tokens",
        }
    }

    /// The family whose error shape a failure on this endpoint should use.
    pub fn family(self) -> Family {
        match self {
            Local::OpenAIModels => Family::OpenAI,
            Local::AnthropicCountTokens => Family::Anthropic,
            _ => Family::Ollama,
        }
    }
}

/// Extract what routing needs from a request body for `ep`.
///
/// For `Local::AnthropicCountTokens`, parse the body as `Endpoint::AnthropicMessages`.
pub fn parse(ep: Endpoint, body: &[u8]) -> Result<ParsedRequest, ParseError> {
    let obj = fields::object(body)?;
    let parsed = match ep {
        Endpoint::OpenAIChat => openai::chat(&obj),
        Endpoint::OpenAICompletions => openai::completions(&obj),
        Endpoint::OpenAIEmbeddings => openai::embeddings(&obj),
        Endpoint::OpenAIResponses => openai::responses(&obj),
        Endpoint::OllamaChat => ollama::chat(&obj),
        Endpoint::OllamaGenerate => ollama::generate(&obj),
        Endpoint::OllamaEmbed => ollama::embed(&obj),
        Endpoint::OllamaEmbeddings => ollama::embeddings(&obj),
        Endpoint::AnthropicMessages => anthropic::messages(&obj),
    };
    parsed.map(|p| ParsedRequest {
        prefix: prefix::stable_prefix(ep, &obj),
        ..p
    })
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 11] = [
        ErrorCode::ModelNotFound,
        ErrorCode::ContextLengthExceeded,
        ErrorCode::NoProviderAvailable,
        ErrorCode::QueueFull,
        ErrorCode::RequestTooLarge,
        ErrorCode::InvalidRequest,
        ErrorCode::Unauthorized,
        ErrorCode::UpstreamError,
        ErrorCode::NotFound,
        ErrorCode::RequestTimeout,
        ErrorCode::Overloaded,
    ];

    /// HTTP status for this error.
    pub fn status(self) -> u16 {
        match self {
            ErrorCode::ModelNotFound => 404,
            ErrorCode::ContextLengthExceeded => 400,
            ErrorCode::NoProviderAvailable => 503,
            ErrorCode::QueueFull => 429,
            ErrorCode::RequestTooLarge => 413,
            ErrorCode::InvalidRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::UpstreamError => 502,
            ErrorCode::NotFound => 404,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::Overloaded => 503,
        }
    }

    /// Stable machine-readable code.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::ModelNotFound => "model_not_found",
            ErrorCode::ContextLengthExceeded => "context_length_exceeded",
            ErrorCode::NoProviderAvailable => "no_provider_available",
            ErrorCode::QueueFull => "queue_full",
            ErrorCode::RequestTooLarge => "request_too_large",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::UpstreamError => "upstream_error",
            ErrorCode::NotFound => "not_found",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::Overloaded => "overloaded",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_metadata() {
        let mut labels: Vec<_> = Endpoint::ALL.iter().map(|e| e.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Endpoint::ALL.len());
        for ep in Endpoint::ALL {
            // detect(path()) round-trips, and the label prefix matches the family.
            assert_eq!(detect("POST", ep.path()), Some(ep));
            let prefix = match ep.family() {
                Family::OpenAI => "openai_",
                Family::Ollama => "ollama_",
                Family::Anthropic => "anthropic_",
            };
            assert!(ep.label().starts_with(prefix), "{}", ep.label());
        }
        let emb: Vec<_> = Endpoint::ALL
            .into_iter()
            .filter(|e| e.is_embedding())
            .collect();
        assert_eq!(
            emb,
            [
                Endpoint::OpenAIEmbeddings,
                Endpoint::OllamaEmbed,
                Endpoint::OllamaEmbeddings
            ]
        );
        assert_eq!(Endpoint::OpenAIChat.label(), "openai_chat");
        assert_eq!(Endpoint::OllamaGenerate.label(), "ollama_generate");
    }

    #[test]
    fn error_code_status_and_str() {
        let want = [
            ("model_not_found", 404),
            ("context_length_exceeded", 400),
            ("no_provider_available", 503),
            ("queue_full", 429),
            ("request_too_large", 413),
            ("invalid_request", 400),
            ("unauthorized", 401),
            ("upstream_error", 502),
            ("not_found", 404),
            ("request_timeout", 408),
            ("overloaded", 503),
        ];
        assert_eq!(want.len(), ErrorCode::ALL.len());
        for (code, (s, status)) in ErrorCode::ALL.into_iter().zip(want) {
            assert_eq!(code.as_str(), s);
            assert_eq!(code.status(), status, "{s}");
        }
    }

    #[test]
    fn parse_rejects_non_objects_and_bad_json() {
        for ep in Endpoint::ALL {
            for body in [&b"[]"[..], b"\"x\"", b"null", b"42"] {
                let e = parse(ep, body).unwrap_err();
                assert!(e.message.contains("JSON object"), "{}", e.message);
            }
            for body in [&b""[..], b"{", b"{\"model\":}", b"\xff\xfe"] {
                let e = parse(ep, body).unwrap_err();
                assert!(e.message.starts_with("invalid JSON: "), "{}", e.message);
            }
            let e = parse(ep, b"{}").unwrap_err();
            assert_eq!(e.message, "missing field `model`");
            let e = parse(ep, br#"{"model":""}"#).unwrap_err();
            assert!(e.message.contains("`model`"), "{}", e.message);
            let e = parse(ep, br#"{"model":7}"#).unwrap_err();
            assert_eq!(e.message, "`model` must be a string");
        }
    }

    #[test]
    fn parse_one_mebibyte_bodies() {
        const MIB: usize = 1 << 20;
        let text = "lorem ipsum ".repeat(MIB / 12);
        let body = serde_json::json!({
            "model": "qwen2.5:32b",
            "messages": [{"role": "user", "content": text}],
        })
        .to_string();
        assert!(body.len() >= MIB - 64, "{}", body.len());
        let r = parse(Endpoint::OpenAIChat, body.as_bytes()).unwrap();
        assert_eq!(r.prompt_chars, text.len());
        assert_eq!(
            r.estimated_prompt_tokens(4.0),
            (text.len() as u32).div_ceil(4) + 4
        );

        // A base64 image of ~1 MiB counts as one image, not as prompt text.
        let image = "A".repeat(MIB);
        let body = serde_json::json!({
            "model": "llava:13b",
            "messages": [{"role": "user", "content": "what is this?", "images": [image]}],
            "stream": false,
        })
        .to_string();
        let r = parse(Endpoint::OllamaChat, body.as_bytes()).unwrap();
        assert_eq!((r.prompt_chars, r.images, r.stream), (13, 1, false));
        assert_eq!(r.estimated_prompt_tokens(4.0), 4 + 4 + IMAGE_TOKENS);
    }

    #[test]
    fn parse_survives_deep_nesting() {
        let mut body = String::from(r#"{"model":"m","messages":"#);
        body.push_str(&"[".repeat(100_000));
        for ep in Endpoint::ALL {
            assert!(parse(ep, body.as_bytes()).is_err());
        }
    }
}
