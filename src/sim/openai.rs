//! OpenAI-compatible API: /v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings.

use super::control::{Fault, SimControl};
use super::engine::{admit, plan, Ask, Finish, Reject, Summary};
use super::http::{
    content_hash, execute, gone, hang_if_faulted, intake, json, text_of, typed, Intake, SSE,
};
use super::stream::Framer;
use super::text::{embedding, est_tokens, unix_now};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

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

fn bad(msg: &str) -> Response {
    err(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        msg,
        None,
        None,
    )
}

fn server_error() -> Response {
    err(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "The server had an error while processing your request. Sorry about that!",
        None,
        None,
    )
}

fn reject(r: Reject, param: &str) -> Response {
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

fn parse_error(e: &str) -> Response {
    bad(&format!(
        "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.) {e}"
    ))
}

fn model_obj(name: &str, modified: std::time::SystemTime, context: u32) -> Value {
    let created = modified
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json!({"id": name, "object": "model", "created": created, "owned_by": "library", "max_model_len": context})
}

pub(crate) async fn models(State(ctl): State<Arc<SimControl>>) -> Response {
    ctl.record("/v1/models", 0, "");
    if let Err(r) = hang_if_faulted(&ctl).await {
        return r;
    }
    let reg = ctl.models.lock();
    let data: Vec<Value> = reg
        .entries
        .iter()
        .map(|e| model_obj(&e.spec.name, e.modified_at, e.spec.context))
        .collect();
    json(StatusCode::OK, json!({"object": "list", "data": data}))
}

pub(crate) async fn model(State(ctl): State<Arc<SimControl>>, Path(id): Path<String>) -> Response {
    ctl.record("/v1/models/{model}", 0, &id);
    if let Err(r) = hang_if_faulted(&ctl).await {
        return r;
    }
    let reg = ctl.models.lock();
    match reg.find(&id) {
        Some(i) => {
            let e = &reg.entries[i];
            json(
                StatusCode::OK,
                model_obj(&e.spec.name, e.modified_at, e.spec.context),
            )
        }
        None => reject(Reject::UnknownModel(id), "model"),
    }
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
    fn head(&mut self) -> String {
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

pub(crate) async fn chat(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    let Intake { json: v, started } = match intake(&ctl, "/v1/chat/completions", &body).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    if ctl.fault() == Fault::Status500 {
        return server_error();
    }
    if let Err(e) = &v {
        return parse_error(e);
    }
    let req: ChatReq = match typed(&v) {
        Ok(r) => r,
        Err(e) => return bad(&e),
    };
    if req.model.is_empty() {
        return bad("you must provide a model parameter");
    }
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
    let ask = Ask {
        model: req.model.clone(),
        prompt_tokens: texts
            .iter()
            .map(|(_, t)| est_tokens(t).saturating_add(4))
            .fold(0, u32::saturating_add),
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        hash: content_hash(&req.model, &parts),
        embed: false,
        keep_alive: super::models::KeepAlive::Default,
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
    let Intake { json: v, started } = match intake(&ctl, "/v1/completions", &body).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    if ctl.fault() == Fault::Status500 {
        return server_error();
    }
    if let Err(e) = &v {
        return parse_error(e);
    }
    let req: CompReq = match typed(&v) {
        Ok(r) => r,
        Err(e) => return bad(&e),
    };
    if req.model.is_empty() {
        return bad("you must provide a model parameter");
    }
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
fn prompt_of(v: &Value) -> Option<(u32, String)> {
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

#[derive(Deserialize)]
struct EmbReq {
    #[serde(default)]
    model: String,
    input: Option<Value>,
}

pub(crate) async fn embeddings(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    let Intake { json: v, started } = match intake(&ctl, "/v1/embeddings", &body).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    if ctl.fault() == Fault::Status500 {
        return server_error();
    }
    if let Err(e) = &v {
        return parse_error(e);
    }
    let req: EmbReq = match typed(&v) {
        Ok(r) => r,
        Err(e) => return bad(&e),
    };
    if req.model.is_empty() {
        return bad("you must provide a model parameter");
    }
    // One entry per input: a string, a token array, or a list of either.
    let items: Vec<Value> = match req.input {
        Some(Value::String(s)) => vec![Value::String(s)],
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            vec![Value::Array(a)]
        }
        Some(Value::Array(a)) if !a.is_empty() => a,
        _ => return bad("'input' is a required property"),
    };
    let mut total = 0u32;
    let mut keys = Vec::with_capacity(items.len());
    for it in &items {
        let flat = match it {
            Value::String(_) => true,
            Value::Array(x) => x.iter().all(Value::is_u64),
            _ => false,
        };
        match prompt_of(it) {
            Some((n, key)) if flat => {
                total = total.saturating_add(n);
                keys.push(key);
            }
            _ => return bad("Invalid type for 'input'"),
        }
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let ask = Ask {
        model: req.model.clone(),
        prompt_tokens: total,
        max_tokens: None,
        hash: content_hash(&req.model, &refs),
        embed: true,
        keep_alive: super::models::KeepAlive::Default,
    };
    let p = match plan(&ctl, &ask) {
        Ok(p) => p,
        Err(r) => return reject(r, "input"),
    };
    let Ok(mut gen) = admit(ctl.clone(), p, started).await else {
        return gone();
    };
    let s = gen.finish();
    let seed = ctl.spec.seed;
    let data: Vec<Value> = refs
        .iter()
        .enumerate()
        .map(|(i, k)| json!({"object": "embedding", "index": i, "embedding": embedding(seed ^ content_hash(&req.model, &[k]))}))
        .collect();
    json(
        StatusCode::OK,
        json!({
            "object": "list",
            "data": data,
            "model": req.model,
            "usage": {"prompt_tokens": s.prompt_tokens, "total_tokens": s.prompt_tokens},
        }),
    )
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
