//! Wire protocols: detect by method + path, parse what routing needs, write native errors.
//!
//! One file per protocol family (openai.rs, ollama.rs, anthropic.rs); this file holds the
//! shared types and dispatch.

use bytes::Bytes;

pub use crate::routing::Family;

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
    pub prompt_chars: usize,
    pub messages: u32,
    pub images: u32,
    pub tools: bool,
    pub max_tokens: Option<u32>,
    pub stream: bool,
    pub fallback_models: Vec<String>,
}

/// Stable client-visible error codes (DESIGN.md, Errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    ModelNotFound,
    ContextLengthExceeded,
    NoProviderAvailable,
    QueueFull,
    RequestTooLarge,
    InvalidRequest,
    Unauthorized,
    UpstreamError,
}
