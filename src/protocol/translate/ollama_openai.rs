//! Ollama client, OpenAI node: /api/chat -> /v1/chat/completions, /api/generate ->
//! /v1/completions, /api/embed and /api/embeddings -> /v1/embeddings; SSE back to NDJSON.

use serde_json::{json, Map, Value};

use super::frame::{self, field, ToolCalls};
use super::{ndjson, rfc3339, stream_error, Context, StreamXlate};
use crate::protocol::Endpoint;

type Obj = Map<String, Value>;

/// Ollama `options` and top-level knobs that OpenAI has under other names.
fn options(obj: &Obj, out: &mut Obj) {
    if let Some(Value::Object(o)) = field(obj, "options") {
        frame::copy(
            o,
            out,
            &[
                ("temperature", "temperature"),
                ("top_p", "top_p"),
                ("seed", "seed"),
                ("presence_penalty", "presence_penalty"),
                ("frequency_penalty", "frequency_penalty"),
            ],
        );
        if let Some(n) = field(o, "num_predict").and_then(Value::as_i64) {
            if n >= 0 {
                out.insert("max_tokens".into(), json!(n));
            }
        }
        if let Some(s) = field(o, "stop") {
            out.insert("stop".into(), frame::stop_list(s));
        }
    }
    match field(obj, "format") {
        Some(Value::String(s)) if s == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(schema @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}),
            );
        }
        _ => {}
    }
}

fn model(obj: &Obj) -> Value {
    field(obj, "model").cloned().unwrap_or(json!(""))
}

/// One Ollama chat message as OpenAI messages.
fn message(m: &Obj, calls_seen: &mut usize) -> Value {
    let role = field(m, "role").and_then(Value::as_str).unwrap_or("user");
    let text = field(m, "content")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let images: Vec<&str> = field(m, "images")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut out = Obj::new();
    out.insert("role".into(), json!(role));
    if images.is_empty() {
        out.insert("content".into(), json!(text));
    } else {
        let mut parts = vec![json!({"type": "text", "text": text})];
        parts.extend(images.iter().map(|b| frame::image_part(b, None)));
        out.insert("content".into(), Value::Array(parts));
    }
    if let Some(calls) = field(m, "tool_calls").and_then(Value::as_array) {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                *calls_seen += 1;
                let f = c.get("function");
                json!({
                    "id": format!("call_{}", *calls_seen - 1),
                    "type": "function",
                    "function": {
                        "name": f.and_then(|f| f.get("name")).cloned().unwrap_or(json!("")),
                        "arguments": frame::arguments_string(f.and_then(|f| f.get("arguments"))),
                    }
                })
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if role == "tool" {
        // Ollama names the tool, not the call: answer the latest call.
        out.insert(
            "tool_call_id".into(),
            json!(format!("call_{}", calls_seen.saturating_sub(1))),
        );
        if let Some(n) = field(m, "tool_name") {
            out.insert("name".into(), n.clone());
        }
    }
    Value::Object(out)
}

pub(super) fn chat_request(obj: &Obj) -> Result<Value, String> {
    let mut out = Obj::new();
    out.insert("model".into(), model(obj));
    let mut seen = 0;
    let messages: Vec<Value> = field(obj, "messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
        .map(|m| message(m, &mut seen))
        .collect();
    out.insert("messages".into(), Value::Array(messages));
    if let Some(t) = field(obj, "tools") {
        out.insert("tools".into(), t.clone());
    }
    options(obj, &mut out);
    frame::openai_stream(obj, &mut out, true);
    Ok(Value::Object(out))
}

pub(super) fn generate_request(obj: &Obj) -> Result<Value, String> {
    if field(obj, "images").is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty())) {
        return Err(
            "`images` on /api/generate cannot be sent to an OpenAI-compatible node \
                    (/v1/completions takes no images): use /api/chat"
                .into(),
        );
    }
    let mut prompt = String::new();
    if let Some(s) = field(obj, "system").and_then(Value::as_str) {
        prompt.push_str(s);
        prompt.push_str("\n\n");
    }
    prompt.push_str(
        field(obj, "prompt")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    );
    let mut out = Obj::new();
    out.insert("model".into(), model(obj));
    out.insert("prompt".into(), json!(prompt));
    frame::copy(obj, &mut out, &[("suffix", "suffix")]);
    options(obj, &mut out);
    frame::openai_stream(obj, &mut out, true);
    Ok(Value::Object(out))
}

/// /api/embed (`input`) and the legacy /api/embeddings (`prompt`).
pub(super) fn embed_request(obj: &Obj) -> Result<Value, String> {
    let input = field(obj, "input")
        .or_else(|| field(obj, "prompt"))
        .cloned()
        .ok_or("missing field `input`")?;
    let mut out = Obj::new();
    out.insert("model".into(), model(obj));
    out.insert("input".into(), input);
    frame::copy(obj, &mut out, &[("dimensions", "dimensions")]);
    Ok(Value::Object(out))
}

fn done_reason(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "length",
        _ => "stop",
    }
}

fn usage(v: &Value, out: &mut Obj) {
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        if let Some(p) = u.get("prompt_tokens") {
            out.insert("prompt_eval_count".into(), p.clone());
        }
        if let Some(c) = u.get("completion_tokens") {
            out.insert("eval_count".into(), c.clone());
        }
    }
}

fn ollama_calls(calls: &Value) -> Value {
    let list: Vec<Value> = calls
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let f = c.get("function");
            json!({"function": {
                "name": f.and_then(|f| f.get("name")).cloned().unwrap_or(json!("")),
                "arguments": frame::arguments_object(f.and_then(|f| f.get("arguments"))),
            }})
        })
        .collect();
    Value::Array(list)
}

fn head(ctx: &Context) -> Obj {
    let mut o = Obj::new();
    o.insert("model".into(), json!(ctx.model));
    o.insert("created_at".into(), json!(rfc3339(ctx.now_s)));
    o
}

pub(super) fn chat_response(v: &Value, ctx: &Context) -> Result<Value, String> {
    let choice = &v["choices"][0];
    let msg = &choice["message"];
    let mut message = Obj::new();
    message.insert("role".into(), json!("assistant"));
    message.insert(
        "content".into(),
        json!(frame::content_text(msg.get("content"))),
    );
    if msg.get("tool_calls").is_some_and(|c| c.is_array()) {
        message.insert("tool_calls".into(), ollama_calls(&msg["tool_calls"]));
    }
    let mut o = head(ctx);
    o.insert("message".into(), Value::Object(message));
    o.insert("done".into(), json!(true));
    let reason = done_reason(choice["finish_reason"].as_str());
    o.insert("done_reason".into(), json!(reason));
    usage(v, &mut o);
    Ok(Value::Object(o))
}

pub(super) fn generate_response(v: &Value, ctx: &Context) -> Result<Value, String> {
    let choice = &v["choices"][0];
    let mut o = head(ctx);
    o.insert(
        "response".into(),
        json!(choice["text"].as_str().unwrap_or_default()),
    );
    o.insert("done".into(), json!(true));
    let reason = done_reason(choice["finish_reason"].as_str());
    o.insert("done_reason".into(), json!(reason));
    usage(v, &mut o);
    Ok(Value::Object(o))
}

fn vectors(v: &Value) -> Vec<Value> {
    let mut data: Vec<&Value> = v["data"].as_array().into_iter().flatten().collect();
    data.sort_by_key(|d| d["index"].as_u64().unwrap_or(0));
    data.iter().map(|d| d["embedding"].clone()).collect()
}

pub(super) fn embed_response(v: &Value, ctx: &Context) -> Result<Value, String> {
    let mut o = Obj::new();
    o.insert("model".into(), json!(ctx.model));
    o.insert("embeddings".into(), Value::Array(vectors(v)));
    if let Some(p) = v["usage"].get("prompt_tokens") {
        o.insert("prompt_eval_count".into(), p.clone());
    }
    Ok(Value::Object(o))
}

/// Legacy /api/embeddings: one vector.
pub(super) fn embeddings_response(v: &Value) -> Result<Value, String> {
    let first = vectors(v).into_iter().next().unwrap_or(json!([]));
    Ok(json!({ "embedding": first }))
}

/// OpenAI SSE chunks as Ollama NDJSON lines, one line per content delta.
pub(super) struct Stream {
    chat: bool,
    client: Endpoint,
    ctx: Context,
    finish: Option<String>,
    usage: Obj,
    calls: ToolCalls,
}

impl Stream {
    pub fn new(client: Endpoint, ctx: Context) -> Stream {
        Stream {
            chat: client == Endpoint::OllamaChat,
            client,
            ctx,
            finish: None,
            usage: Obj::new(),
            calls: ToolCalls::default(),
        }
    }

    fn line(&self, text: &str, done: bool) -> Obj {
        let mut o = head(&self.ctx);
        if self.chat {
            o.insert(
                "message".into(),
                json!({"role": "assistant", "content": text}),
            );
        } else {
            o.insert("response".into(), json!(text));
        }
        o.insert("done".into(), json!(done));
        o
    }
}

impl StreamXlate for Stream {
    fn event(&mut self, v: &Value, out: &mut Vec<u8>) {
        if v.get("error").is_some() {
            return stream_error(self.client, v, out);
        }
        usage(v, &mut self.usage);
        let Some(choice) = v["choices"].get(0) else {
            return;
        };
        if let Some(f) = choice["finish_reason"].as_str() {
            self.finish = Some(f.to_string());
        }
        let text = if self.chat {
            choice["delta"]["content"].as_str()
        } else {
            choice["text"].as_str()
        };
        if let Some(calls) = choice["delta"].get("tool_calls") {
            self.calls.add(calls);
        }
        if let Some(t) = text.filter(|t| !t.is_empty()) {
            ndjson(out, &Value::Object(self.line(t, false)));
        }
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        let mut o = self.line("", true);
        if self.chat && !self.calls.calls.is_empty() {
            let calls: Vec<Value> = self
                .calls
                .calls
                .iter()
                .map(|(_, name, args)| {
                    json!({"function": {"name": name, "arguments": frame::arguments_object(Some(&json!(args)))}})
                })
                .collect();
            o["message"]["tool_calls"] = Value::Array(calls);
        }
        let reason = done_reason(self.finish.as_deref());
        o.insert("done_reason".into(), json!(reason));
        o.extend(self.usage.clone());
        ndjson(out, &Value::Object(o));
    }
}
