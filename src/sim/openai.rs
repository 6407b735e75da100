//! OpenAI-compatible API: /v1/chat/completions and /v1/completions (SSE streams), shared error shapes.

use super::control::{Fault, SimControl};
use super::engine::{plan, Ask, Finish, Reject, Summary};
use super::http::{content_hash, execute, intake, json, text_of, typed, Intake, SSE};
use super::prefix::{chain_tokens, message_chain, raw_chain, tools_text};
use super::stream::Framer;
use super::text::{est_tokens, unix_now};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// OpenAI's error body.
pub(crate) fn err(
    status: StatusCode,
    kind: &str,
    msg: &str,
    param: Option<&str>,
    code: Option<&str>,
) -> Response {
    json(
        status,
        json!({"error": {"message": msg, "type": kind, "param": param, "code": code}}),
    )
}

pub(crate) fn bad(msg: &str) -> Response {
    err(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        msg,
        None,
        None,
    )
}

pub(crate) fn server_error() -> Response {
    err(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "The server had an error while processing your request. Sorry about that!",
        None,
        None,
    )
}

pub(crate) fn reject(r: Reject, param: &str) -> Response {
    match r {
        Reject::UnknownModel(m) => err(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            &format!("The model `{m}` does not exist or you do not have access to it."),
            None,
            Some("model_not_found"),
        ),
        Reject::Context { context, prompt, completion } => err(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &format!(
                "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt} in the messages, {completion} in the completion). Please reduce the length of the messages or completion.",
                u64::from(prompt) + u64::from(completion)
            ),
            Some(param),
            Some("context_length_exceeded"),
        ),
        Reject::NotSupported(m) => bad(&format!("\"{m}\" does not support {param}")),
    }
}

pub(crate) fn parse_error(e: &str) -> Response {
    bad(&format!(
        "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.) {e}"
    ))
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct Msg {
    #[serde(default)]
    role: String,
    #[serde(default)]
    content: Value,
}

#[derive(Deserialize)]
struct ChatReq {
    #[serde(default)]
    model: String,
    messages: Option<Vec<Msg>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    tools: Option<Value>,
}

#[derive(Deserialize)]
struct CompReq {
    #[serde(default)]
    model: String,
    #[serde(default)]
    prompt: Value,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u32>,
}

fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

fn usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": u64::from(s.prompt_tokens) + u64::from(s.completion_tokens),
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
    })
}

/// SSE framing for both chat (`chat.completion.chunk`) and legacy completions (`text_completion`).
struct OaFramer {
    id: String,
    model: String,
    created: u64,
    chat: bool,
    include_usage: bool,
}

impl OaFramer {
    fn chunk(&self, choice: Value) -> Value {
        let mut c = json!({
            "id": self.id,
            "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_sim",
            "choices": [choice],
        });
        if self.include_usage {
            c["usage"] = Value::Null;
        }
        c
    }
    fn choice(&self, text: Option<&str>, finish: Option<&str>, role: bool) -> Value {
        if self.chat {
            let delta = match (role, text) {
                (true, _) => json!({"role": "assistant", "content": ""}),
                (false, Some(t)) => json!({"content": t}),
                (false, None) => json!({}),
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish})
        }
    }
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

impl Framer for OaFramer {
    fn head(&mut self, _cached: u32) -> String {
        if self.chat {
            sse(&self.chunk(self.choice(None, None, true)))
        } else {
            String::new()
        }
    }
    fn token(&mut self, _index: usize, text: &str) -> String {
        sse(&self.chunk(self.choice(Some(text), None, false)))
    }
    fn tail(&mut self, s: &Summary) -> String {
        let mut out = sse(&self.chunk(self.choice(None, Some(finish_reason(s.finish)), false)));
        if self.include_usage {
            let mut u = self.chunk(Value::Null);
            u["choices"] = json!([]);
            u["usage"] = usage(s);
            out.push_str(&sse(&u));
        }
        out.push_str("data: [DONE]\n\n");
        out
    }
}

/// What every OpenAI endpoint does first: count the request, apply a 500 fault, parse the
/// body into `T` and require a model. An error comes back as the response to send.
pub(crate) async fn openai_request<T: serde::de::DeserializeOwned>(
    ctl: &Arc<SimControl>,
    path: &str,
    body: &[u8],
    model: fn(&T) -> &str,
) -> Result<(T, tokio::time::Instant), Response> {
    let Intake { json: v, started } = intake(ctl, path, body).await?;
    if ctl.fault() == Fault::Status500 {
        return Err(server_error());
    }
    if let Err(e) = &v {
        return Err(parse_error(e));
    }
    let req: T = typed(&v).map_err(|e| bad(&e))?;
    if model(&req).is_empty() {
        return Err(bad("you must provide a model parameter"));
    }
    Ok((req, started))
}

pub(crate) async fn chat(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    let (req, started) =
        match openai_request(&ctl, "/v1/chat/completions", &body, |r: &ChatReq| &r.model).await {
            Ok(x) => x,
            Err(r) => return r,
        };
    let msgs = match req.messages {
        Some(m) if !m.is_empty() => m,
        Some(_) => return bad("[] is too short - 'messages'"),
        None => return bad("Missing required parameter: 'messages'."),
    };
    let texts: Vec<(String, String)> = msgs
        .iter()
        .map(|m| (m.role.clone(), text_of(&m.content)))
        .collect();
    let parts: Vec<&str> = texts
        .iter()
        .flat_map(|(r, t)| [r.as_str(), t.as_str()])
        .collect();
    let tools = tools_text(req.tools.as_ref());
    let chain = message_chain(&req.model, None, &texts, tools.as_deref());
    let ask = Ask {
        model: req.model.clone(),
        prompt_tokens: chain_tokens(&chain),
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        hash: content_hash(&req.model, &parts),
        embed: false,
        keep_alive: super::models::KeepAlive::Default,
        chain,
    };
    let include_usage = req.stream_options.unwrap_or_default().include_usage;
    run(
        &ctl,
        ask,
        started,
        req.stream.unwrap_or(false),
        include_usage,
        true,
    )
    .await
}

pub(crate) async fn completions(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    let (req, started) =
        match openai_request(&ctl, "/v1/completions", &body, |r: &CompReq| &r.model).await {
            Ok(x) => x,
            Err(r) => return r,
        };
    let (prompt_tokens, text) = match prompt_of(&req.prompt) {
        Some(x) => x,
        None => return bad("Invalid type for 'prompt'"),
    };
    let ask = Ask {
        model: req.model.clone(),
        prompt_tokens,
        max_tokens: req.max_tokens,
        hash: content_hash(&req.model, &[&text]),
        embed: false,
        keep_alive: super::models::KeepAlive::Default,
        chain: match &req.prompt {
            Value::String(s) => raw_chain(&req.model, "", s),
            _ => Vec::new(),
        },
    };
    let include_usage = req.stream_options.unwrap_or_default().include_usage;
    run(
        &ctl,
        ask,
        started,
        req.stream.unwrap_or(false),
        include_usage,
        false,
    )
    .await
}

/// Prompt (or embedding input): a string, strings, token ids, or arrays of token ids.
/// Returns (estimated tokens, text used for seeding).
pub(crate) fn prompt_of(v: &Value) -> Option<(u32, String)> {
    match v {
        Value::String(s) => Some((est_tokens(s), s.clone())),
        Value::Array(a) if a.iter().all(Value::is_u64) => Some((a.len() as u32, v.to_string())),
        Value::Array(a) => {
            let mut n = 0u32;
            for x in a {
                n = n.saturating_add(prompt_of(x)?.0);
            }
            Some((n, v.to_string()))
        }
        _ => None,
    }
}

async fn run(
    ctl: &Arc<SimControl>,
    ask: Ask,
    started: tokio::time::Instant,
    stream: bool,
    include_usage: bool,
    chat: bool,
) -> Response {
    let p = match plan(ctl, &ask) {
        Ok(p) => p,
        Err(r) => return reject(r, if chat { "messages" } else { "prompt" }),
    };
    let id = format!(
        "{}-sim{:08x}",
        if chat { "chatcmpl" } else { "cmpl" },
        ctl.next_id()
    );
    let created = unix_now();
    let framer = OaFramer {
        id: id.clone(),
        model: ask.model.clone(),
        created,
        chat,
        include_usage,
    };
    let model = ask.model.clone();
    let whole = move |text: String, s: &Summary| {
        let choice = if chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish_reason(s.finish)})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason(s.finish)})
        };
        json!({
            "id": id,
            "object": if chat { "chat.completion" } else { "text_completion" },
            "created": created,
            "model": model,
            "system_fingerprint": "fp_sim",
            "choices": [choice],
            "usage": usage(s),
        })
    };
    execute(ctl, p, started, stream.then_some((framer, SSE)), whole).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_shapes() {
        assert_eq!(prompt_of(&json!("abcdefgh")).map(|x| x.0), Some(2));
        assert_eq!(prompt_of(&json!([1, 2, 3])).map(|x| x.0), Some(3));
        assert_eq!(prompt_of(&json!(["abcd", "abcd"])).map(|x| x.0), Some(2));
        assert_eq!(prompt_of(&json!([[1, 2], [3]])).map(|x| x.0), Some(3));
        assert_eq!(prompt_of(&json!({"a": 1})), None);
        assert_eq!(prompt_of(&json!([null])), None);
    }
}
