//! Protocol translation for a node that does not speak the client's protocol: the request
//! body once before dispatch, the response event by event as it streams (never buffered).
//!
//! One file per direction: `ollama_openai` (Ollama client, OpenAI node), `openai_ollama`
//! (OpenAI client, Ollama node), `anthropic_openai` (Anthropic messages on OpenAI chat),
//! `responses_openai` (OpenAI Responses on OpenAI chat, stateless). Pure: time and id seeds
//! come in as arguments.

mod anthropic_openai;
mod frame;
mod ollama_openai;
mod openai_ollama;
mod responses_openai;
#[cfg(test)]
mod tests;

use bytes::Bytes;
use serde_json::Value;

use super::{error_body, Endpoint, ErrorCode, Family};
use frame::Lines;

/// The endpoint a node speaking `families` is sent for a client request on `ep`: `ep` itself
/// when the node speaks it natively, a translated endpoint otherwise, None when neither.
/// Responses always goes out as chat (the gateway is stateless; chat is what every
/// OpenAI-compatible server has).
pub fn upstream_for(ep: Endpoint, families: &[Family]) -> Option<Endpoint> {
    use Endpoint::*;
    let speaks = |f| families.contains(&f);
    if ep == OpenAIResponses {
        return speaks(Family::OpenAI).then_some(OpenAIChat);
    }
    if speaks(ep.family()) {
        return Some(ep);
    }
    let (to, family) = match ep {
        OllamaChat => (OpenAIChat, Family::OpenAI),
        OllamaGenerate => (OpenAICompletions, Family::OpenAI),
        OllamaEmbed | OllamaEmbeddings => (OpenAIEmbeddings, Family::OpenAI),
        AnthropicMessages => (OpenAIChat, Family::OpenAI),
        OpenAIChat => (OllamaChat, Family::Ollama),
        OpenAICompletions => (OllamaGenerate, Family::Ollama),
        OpenAIEmbeddings => (OllamaEmbed, Family::Ollama),
        OpenAIResponses => return None,
    };
    speaks(family).then_some(to)
}

/// Families a request on `ep` can be translated into (besides its own), for Stage 1.
pub fn translatable(ep: Endpoint) -> &'static [Family] {
    match ep.family() {
        Family::OpenAI if ep == Endpoint::OpenAIResponses => &[],
        Family::OpenAI => &[Family::Ollama],
        Family::Ollama | Family::Anthropic => &[Family::OpenAI],
    }
}

/// A client endpoint and the endpoint the node is sent instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    pub client: Endpoint,
    pub upstream: Endpoint,
}

/// What the response translator needs to know besides the bytes.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// Unix seconds, for `created` / `created_at`.
    pub now_s: u64,
    /// Seed for response ids (`chatcmpl-…`, `msg_…`, `resp_…`).
    pub id_seed: u64,
    /// The model that serves the request (written where the client expects a model).
    pub model: String,
}

impl Context {
    fn id(&self, prefix: &str) -> String {
        format!("{prefix}{:016x}", self.id_seed)
    }
}

/// The translated request body; the error is a client's 400 (what cannot be translated).
pub fn request(t: Translation, body: &[u8]) -> Result<Bytes, String> {
    use Endpoint::*;
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?;
    let Value::Object(obj) = v else {
        return Err("request body must be a JSON object".into());
    };
    let out = match (t.client, t.upstream) {
        (OllamaChat, OpenAIChat) => ollama_openai::chat_request(&obj)?,
        (OllamaGenerate, OpenAICompletions) => ollama_openai::generate_request(&obj)?,
        (OllamaEmbed | OllamaEmbeddings, OpenAIEmbeddings) => ollama_openai::embed_request(&obj)?,
        (OpenAIChat, OllamaChat) => openai_ollama::chat_request(&obj)?,
        (OpenAICompletions, OllamaGenerate) => openai_ollama::completions_request(&obj)?,
        (OpenAIEmbeddings, OllamaEmbed) => openai_ollama::embeddings_request(&obj)?,
        (AnthropicMessages, OpenAIChat) => anthropic_openai::request(&obj)?,
        (OpenAIResponses, OpenAIChat) => responses_openai::request(&obj)?,
        (c, u) => {
            return Err(format!(
                "no translation from {} to {}",
                c.label(),
                u.label()
            ))
        }
    };
    Ok(Bytes::from(serde_json::to_vec(&out).unwrap_or_default()))
}

/// Turns one upstream event (an SSE `data:` payload or an NDJSON line) into client bytes.
trait StreamXlate: Send + Sync {
    /// One parsed upstream event.
    fn event(&mut self, v: &Value, out: &mut Vec<u8>);
    /// The upstream stream ended (`[DONE]`, Ollama's `done`, or the end of the body); called once.
    fn end(&mut self, out: &mut Vec<u8>);
}

enum Mode {
    /// A complete JSON body (non-streaming success), converted at the end.
    Whole(Vec<u8>),
    /// A non-2xx answer: its message is re-shaped into the client's error at the end.
    Error(Vec<u8>, u16),
    Stream(Box<dyn StreamXlate>, Lines),
}

/// Whole (non-streamed) bodies are capped: past this the answer is an upstream error.
const MAX_WHOLE: usize = 64 << 20;

/// Translates one response, chunk by chunk, inside the synchronous body filter.
pub struct ResponseTranslator {
    t: Translation,
    ctx: Context,
    mode: Mode,
    ended: bool,
}

impl ResponseTranslator {
    /// For a response with `status`; `stream`: the client asked for a stream.
    pub fn new(t: Translation, status: u16, stream: bool, ctx: Context) -> ResponseTranslator {
        let mode = if !(200..300).contains(&status) {
            Mode::Error(Vec::new(), status)
        } else if stream {
            Mode::Stream(stream_for(t, &ctx), Lines::default())
        } else {
            Mode::Whole(Vec::new())
        };
        ResponseTranslator {
            t,
            ctx,
            mode,
            ended: false,
        }
    }

    /// The client-facing `content-type`.
    pub fn content_type(&self) -> &'static str {
        match (&self.mode, self.t.client.family()) {
            (Mode::Stream(..), Family::Ollama) => "application/x-ndjson",
            (Mode::Stream(..), _) => "text/event-stream",
            _ => "application/json",
        }
    }

    /// Client bytes for an upstream chunk (possibly empty: a partial line, a whole body).
    pub fn feed(&mut self, chunk: &[u8]) -> Bytes {
        let mut out = Vec::new();
        match &mut self.mode {
            Mode::Whole(buf) | Mode::Error(buf, _) => {
                if buf.len() + chunk.len() <= MAX_WHOLE {
                    buf.extend_from_slice(chunk);
                }
            }
            Mode::Stream(s, lines) => {
                let sse = self.t.upstream.family() != Family::Ollama;
                lines.push(chunk, |line| {
                    if !self.ended {
                        self.ended = line_event(s.as_mut(), line, sse, &mut out);
                    }
                });
            }
        }
        Bytes::from(out)
    }

    /// Client bytes once the upstream body is complete.
    pub fn finish(&mut self) -> Bytes {
        let mut out = Vec::new();
        match &mut self.mode {
            Mode::Whole(buf) => {
                let converted = serde_json::from_slice::<Value>(buf)
                    .map_err(|e| format!("node answered invalid JSON: {e}"))
                    .and_then(|v| whole(self.t, &v, &self.ctx));
                match converted {
                    Ok(v) => out = serde_json::to_vec(&v).unwrap_or_default(),
                    Err(msg) => {
                        let code = ErrorCode::UpstreamError;
                        out = error_body(self.t.client.family(), code, &msg).to_vec();
                    }
                }
            }
            Mode::Error(buf, status) => {
                let (code, msg) = upstream_error(*status, buf);
                out = error_body(self.t.client.family(), code, &msg).to_vec();
            }
            Mode::Stream(s, lines) => {
                let sse = self.t.upstream.family() != Family::Ollama;
                if let Some(line) = lines.rest() {
                    if !self.ended {
                        self.ended = line_event(s.as_mut(), &line, sse, &mut out);
                    }
                }
                if !self.ended {
                    s.end(&mut out);
                    self.ended = true;
                }
            }
        }
        Bytes::from(out)
    }
}

/// Feed one upstream line; true when the stream ended with it.
fn line_event(s: &mut dyn StreamXlate, line: &[u8], sse: bool, out: &mut Vec<u8>) -> bool {
    let payload = if sse {
        match line.strip_prefix(b"data:") {
            Some(p) => p.trim_ascii(),
            None => return false,
        }
    } else {
        line.trim_ascii()
    };
    if sse && payload == b"[DONE]" {
        s.end(out);
        return true;
    }
    let Ok(v) = serde_json::from_slice::<Value>(payload) else {
        return false;
    };
    s.event(&v, out);
    if !sse && v.get("done").and_then(Value::as_bool) == Some(true) {
        s.end(out);
        return true;
    }
    false
}

fn stream_for(t: Translation, ctx: &Context) -> Box<dyn StreamXlate> {
    use Endpoint::*;
    match t.client {
        OllamaChat | OllamaGenerate => Box::new(ollama_openai::Stream::new(t.client, ctx.clone())),
        OpenAIChat | OpenAICompletions => {
            Box::new(openai_ollama::Stream::new(t.client, ctx.clone()))
        }
        AnthropicMessages => Box::new(anthropic_openai::Stream::new(ctx.clone())),
        OpenAIResponses => Box::new(responses_openai::Stream::new(ctx.clone())),
        // Embeddings never stream; the end of the body is all there is.
        OpenAIEmbeddings | OllamaEmbed | OllamaEmbeddings => Box::new(NoStream),
    }
}

struct NoStream;

impl StreamXlate for NoStream {
    fn event(&mut self, _v: &Value, _out: &mut Vec<u8>) {}
    fn end(&mut self, _out: &mut Vec<u8>) {}
}

/// A complete upstream body in the client's shape.
fn whole(t: Translation, v: &Value, ctx: &Context) -> Result<Value, String> {
    use Endpoint::*;
    match t.client {
        OllamaChat => ollama_openai::chat_response(v, ctx),
        OllamaGenerate => ollama_openai::generate_response(v, ctx),
        OllamaEmbed => ollama_openai::embed_response(v, ctx),
        OllamaEmbeddings => ollama_openai::embeddings_response(v),
        OpenAIChat => openai_ollama::chat_response(v, ctx),
        OpenAICompletions => openai_ollama::completions_response(v, ctx),
        OpenAIEmbeddings => openai_ollama::embeddings_response(v, ctx),
        AnthropicMessages => anthropic_openai::response(v, ctx),
        OpenAIResponses => responses_openai::response(v, ctx),
    }
}

/// The code and message of a node's error answer (OpenAI, Ollama or Anthropic shape).
pub fn upstream_error(status: u16, body: &[u8]) -> (ErrorCode, String) {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let err = v.get("error");
    let msg = err
        .and_then(|e| e.get("message").and_then(Value::as_str).or(e.as_str()))
        .map(str::to_string)
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]);
            format!("node answered {status}: {}", text.trim())
        });
    let code_str = err
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let code = match status {
        _ if code_str == "context_length_exceeded" => ErrorCode::ContextLengthExceeded,
        400 | 422 => ErrorCode::InvalidRequest,
        401 | 403 => ErrorCode::Unauthorized,
        404 => ErrorCode::ModelNotFound,
        413 => ErrorCode::RequestTooLarge,
        429 => ErrorCode::QueueFull,
        503 => ErrorCode::NoProviderAvailable,
        _ => ErrorCode::UpstreamError,
    };
    (code, msg)
}

/// A streamed error event in the client's framing.
fn stream_error(client: Endpoint, v: &Value, out: &mut Vec<u8>) {
    let (code, msg) = upstream_error(500, v.to_string().as_bytes());
    out.extend_from_slice(&super::stream_error_chunk(client, code, &msg));
}

/// `YYYY-MM-DDTHH:MM:SSZ` for unix seconds (Ollama's `created_at`).
fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// One SSE event: `event: NAME` (when given) and `data: JSON`.
fn sse(out: &mut Vec<u8>, event: Option<&str>, data: &Value) {
    if let Some(e) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(e.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(&serde_json::to_vec(data).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
}

/// One NDJSON line.
fn ndjson(out: &mut Vec<u8>, v: &Value) {
    out.extend_from_slice(&serde_json::to_vec(v).unwrap_or_default());
    out.push(b'\n');
}
