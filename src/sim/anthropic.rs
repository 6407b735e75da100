//! Anthropic Messages API: `/v1/messages`, non-streaming and SSE event streams.

use super::control::{Fault, SimControl};
use super::engine::{plan, Ask, Finish, Reject, Summary};
use super::http::{content_hash, execute, intake, json, text_of, typed, Intake, SSE};
use super::models::KeepAlive;
use super::prefix::{chain_tokens, message_chain, tools_text};
use super::stream::Framer;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

fn err(status: StatusCode, kind: &str, msg: &str) -> Response {
    json(
        status,
        json!({"type": "error", "error": {"type": kind, "message": msg}}),
    )
}

fn bad(msg: &str) -> Response {
    err(StatusCode::BAD_REQUEST, "invalid_request_error", msg)
}

fn reject(r: Reject) -> Response {
    match r {
        Reject::UnknownModel(m) => err(StatusCode::NOT_FOUND, "not_found_error", &format!("model: {m}")),
        Reject::Context { context, prompt, completion } => bad(&format!(
            "input length and `max_tokens` exceed context limit: {prompt} + {completion} > {context}, decrease input length or `max_tokens` and try again"
        )),
        Reject::NotSupported(m) => bad(&format!("model: {m} does not support messages")),
    }
}

#[derive(Deserialize)]
struct Msg {
    #[serde(default)]
    role: String,
    #[serde(default)]
    content: Value,
}

#[derive(Deserialize)]
struct MessagesReq {
    #[serde(default)]
    model: String,
    messages: Option<Vec<Msg>>,
    max_tokens: Option<u32>,
    #[serde(default)]
    system: Value,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    tools: Option<Value>,
}

fn stop_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "end_turn",
        Finish::Length => "max_tokens",
    }
}

fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

struct AnFramer {
    id: String,
    model: String,
    prompt_tokens: u32,
}

impl Framer for AnFramer {
    fn head(&mut self, cached: u32) -> String {
        // As Anthropic counts: `input_tokens` without what the cache read.
        let start = json!({"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "content": [],
            "model": self.model, "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens.saturating_sub(cached),
                "cache_read_input_tokens": cached, "output_tokens": 1}}});
        let block = json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}});
        let mut out = event("message_start", &start);
        out.push_str(&event("content_block_start", &block));
        out.push_str(&event("ping", &json!({"type": "ping"})));
        out
    }
    fn token(&mut self, _index: usize, text: &str) -> String {
        event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        )
    }
    fn tail(&mut self, s: &Summary) -> String {
        let mut out = event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        );
        out.push_str(&event(
            "message_delta",
            &json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason(s.finish), "stop_sequence": null},
                "usage": {"output_tokens": s.completion_tokens}}),
        ));
        out.push_str(&event("message_stop", &json!({"type": "message_stop"})));
        out
    }
}

pub(crate) async fn messages(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    let Intake { json: v, started } = match intake(&ctl, "/v1/messages", &body).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    if ctl.fault() == Fault::Status500 {
        return err(
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            "Internal server error",
        );
    }
    let req: MessagesReq = match typed(&v) {
        Ok(r) => r,
        Err(e) => return bad(&e),
    };
    if req.model.is_empty() {
        return bad("model: Field required");
    }
    let Some(msgs) = req.messages.filter(|m| !m.is_empty()) else {
        return bad("messages: Field required");
    };
    let Some(max_tokens) = req.max_tokens else {
        return bad("max_tokens: Field required");
    };
    let system = text_of(&req.system);
    let texts: Vec<(String, String)> = msgs
        .iter()
        .map(|m| (m.role.clone(), text_of(&m.content)))
        .collect();
    let mut parts: Vec<&str> = vec![&system];
    parts.extend(texts.iter().flat_map(|(r, t)| [r.as_str(), t.as_str()]));
    let tools = tools_text(req.tools.as_ref());
    let chain = message_chain(&req.model, Some(&system), &texts, tools.as_deref());
    let ask = Ask {
        model: req.model.clone(),
        prompt_tokens: chain_tokens(&chain),
        max_tokens: Some(max_tokens),
        hash: content_hash(&req.model, &parts),
        embed: false,
        keep_alive: KeepAlive::Default,
        chain,
    };
    let p = match plan(&ctl, &ask) {
        Ok(p) => p,
        Err(r) => return reject(r),
    };
    let id = format!("msg_sim{:016x}", ctl.next_id());
    let framer = AnFramer {
        id: id.clone(),
        model: req.model.clone(),
        prompt_tokens: ask.prompt_tokens,
    };
    let model = req.model.clone();
    let whole = move |text: String, s: &Summary| {
        json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason(s.finish), "stop_sequence": null,
            "usage": {
                "input_tokens": s.prompt_tokens - s.cached_tokens,
                "cache_read_input_tokens": s.cached_tokens,
                "output_tokens": s.completion_tokens,
            },
        })
    };
    execute(
        &ctl,
        p,
        started,
        req.stream.unwrap_or(false).then_some((framer, SSE)),
        whole,
    )
    .await
}
