//! OpenAI client, Ollama node: /v1/chat/completions -> /api/chat, /v1/completions ->
//! /api/generate (raw), /v1/embeddings -> /api/embed; NDJSON back to SSE.

use serde_json::{json, Map, Value};

use super::frame::{self, field};
use super::{sse, stream_error, Context, StreamXlate};
use crate::protocol::Endpoint;

type Obj = Map<String, Value>;

/// OpenAI sampling knobs as Ollama `options`, `response_format` as `format`, `stream`.
fn options(obj: &Obj, out: &mut Obj) {
    let mut o = Obj::new();
    frame::copy(
        obj,
        &mut o,
        &[
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("seed", "seed"),
            ("presence_penalty", "presence_penalty"),
            ("frequency_penalty", "frequency_penalty"),
            ("max_tokens", "num_predict"),
            ("max_completion_tokens", "num_predict"),
        ],
    );
    if let Some(s) = field(obj, "stop") {
        o.insert("stop".into(), frame::stop_list(s));
    }
    if !o.is_empty() {
        out.insert("options".into(), Value::Object(o));
    }
    if let Some(rf) = field(obj, "response_format") {
        match rf["type"].as_str() {
            Some("json_object") => {
                out.insert("format".into(), json!("json"));
            }
            Some("json_schema") => {
                out.insert("format".into(), rf["json_schema"]["schema"].clone());
            }
            _ => {}
        }
    }
    let stream = field(obj, "stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    out.insert("stream".into(), json!(stream));
}

fn message(m: &Obj, i: usize) -> Result<Value, String> {
    let role = field(m, "role").and_then(Value::as_str).unwrap_or("user");
    let mut out = Obj::new();
    out.insert(
        "role".into(),
        json!(if role == "developer" { "system" } else { role }),
    );
    let mut images = Vec::new();
    let text = match field(m, "content") {
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match p["type"].as_str() {
                    Some("image_url") => {
                        let url = p["image_url"]["url"]
                            .as_str()
                            .or(p["image_url"].as_str())
                            .unwrap_or_default();
                        let Some((_, data)) = frame::data_url(url) else {
                            return Err(format!(
                                "`messages[{i}].content`: an Ollama node takes images as base64 \
                                 data: URLs, not {:.40}",
                                url
                            ));
                        };
                        images.push(json!(data));
                    }
                    _ => text.push_str(p["text"].as_str().unwrap_or_default()),
                }
            }
            text
        }
        other => frame::content_text(other),
    };
    out.insert("content".into(), json!(text));
    if !images.is_empty() {
        out.insert("images".into(), Value::Array(images));
    }
    if let Some(calls) = field(m, "tool_calls").and_then(Value::as_array) {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let f = &c["function"];
                json!({"function": {"name": f["name"], "arguments": frame::arguments_object(f.get("arguments"))}})
            })
            .collect();
        out.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(n) = field(m, "name").filter(|_| role == "tool") {
        out.insert("tool_name".into(), n.clone());
    }
    Ok(Value::Object(out))
}

pub(super) fn chat_request(obj: &Obj) -> Result<Value, String> {
    let mut out = Obj::new();
    frame::copy(obj, &mut out, &[("model", "model"), ("tools", "tools")]);
    let mut messages = Vec::new();
    for (i, m) in field(obj, "messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(m) = m.as_object() {
            messages.push(message(m, i)?);
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    options(obj, &mut out);
    Ok(Value::Object(out))
}

pub(super) fn completions_request(obj: &Obj) -> Result<Value, String> {
    let prompt = match field(obj, "prompt") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            a[0].as_str().unwrap_or_default().to_string()
        }
        Some(_) => {
            return Err(
                "`prompt`: an Ollama node takes one prompt string (not a batch or token ids)"
                    .into(),
            )
        }
    };
    let mut out = Obj::new();
    frame::copy(obj, &mut out, &[("model", "model"), ("suffix", "suffix")]);
    out.insert("prompt".into(), json!(prompt));
    // A completion continues the text as given: no chat template.
    out.insert("raw".into(), json!(true));
    options(obj, &mut out);
    Ok(Value::Object(out))
}

pub(super) fn embeddings_request(obj: &Obj) -> Result<Value, String> {
    let input = field(obj, "input").ok_or("missing field `input`")?;
    let ok = input.is_string()
        || input
            .as_array()
            .is_some_and(|a| a.iter().all(Value::is_string));
    if !ok {
        return Err("`input`: an Ollama node takes strings (not token ids)".into());
    }
    let mut out = Obj::new();
    frame::copy(
        obj,
        &mut out,
        &[("model", "model"), ("dimensions", "dimensions")],
    );
    out.insert("input".into(), input.clone());
    Ok(Value::Object(out))
}

fn finish_reason(v: &Value) -> &'static str {
    match v["done_reason"].as_str() {
        Some("length") => "length",
        _ if v["message"]["tool_calls"].is_array() => "tool_calls",
        _ => "stop",
    }
}

fn usage(v: &Value) -> Value {
    let p = v["prompt_eval_count"].as_u64().unwrap_or(0);
    let c = v["eval_count"].as_u64().unwrap_or(0);
    json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c})
}

fn openai_calls(calls: &Value) -> Value {
    let list: Vec<Value> = calls
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| {
            let f = &c["function"];
            json!({"index": i, "id": format!("call_{i}"), "type": "function", "function": {
                "name": f["name"],
                "arguments": frame::arguments_string(f.get("arguments")),
            }})
        })
        .collect();
    Value::Array(list)
}

pub(super) fn chat_response(v: &Value, ctx: &Context) -> Result<Value, String> {
    let mut message = json!({"role": "assistant", "content": v["message"]["content"].as_str().unwrap_or_default()});
    if v["message"]["tool_calls"].is_array() {
        message["tool_calls"] = openai_calls(&v["message"]["tool_calls"]);
    }
    Ok(json!({
        "id": ctx.id("chatcmpl-"),
        "object": "chat.completion",
        "created": ctx.now_s,
        "model": ctx.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(v)}],
        "usage": usage(v),
    }))
}

pub(super) fn completions_response(v: &Value, ctx: &Context) -> Result<Value, String> {
    Ok(json!({
        "id": ctx.id("cmpl-"),
        "object": "text_completion",
        "created": ctx.now_s,
        "model": ctx.model,
        "choices": [{"index": 0, "text": v["response"].as_str().unwrap_or_default(),
                     "logprobs": null, "finish_reason": finish_reason(v)}],
        "usage": usage(v),
    }))
}

pub(super) fn embeddings_response(v: &Value, ctx: &Context) -> Result<Value, String> {
    let data: Vec<Value> = v["embeddings"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, e)| json!({"object": "embedding", "index": i, "embedding": e}))
        .collect();
    let p = v["prompt_eval_count"].as_u64().unwrap_or(0);
    Ok(json!({
        "object": "list",
        "data": data,
        "model": ctx.model,
        "usage": {"prompt_tokens": p, "total_tokens": p},
    }))
}

/// Ollama NDJSON lines as OpenAI SSE chunks, then `data: [DONE]`.
pub(super) struct Stream {
    chat: bool,
    client: Endpoint,
    ctx: Context,
    started: bool,
    /// A tool call went by: the finish reason is `tool_calls`.
    tools: bool,
}

impl Stream {
    pub fn new(client: Endpoint, ctx: Context) -> Stream {
        Stream {
            chat: client == Endpoint::OpenAIChat,
            client,
            ctx,
            started: false,
            tools: false,
        }
    }

    fn chunk(&self, choice: Value, usage: Option<Value>) -> Value {
        let (id, object) = if self.chat {
            (self.ctx.id("chatcmpl-"), "chat.completion.chunk")
        } else {
            (self.ctx.id("cmpl-"), "text_completion")
        };
        let mut c = json!({"id": id, "object": object, "created": self.ctx.now_s,
                           "model": self.ctx.model, "choices": [choice]});
        if let Some(u) = usage {
            c["usage"] = u;
        }
        c
    }
}

impl StreamXlate for Stream {
    fn event(&mut self, v: &Value, out: &mut Vec<u8>) {
        if v.get("error").is_some() {
            return stream_error(self.client, v, out);
        }
        let done = v["done"].as_bool() == Some(true);
        if self.chat {
            let mut delta = Map::new();
            if !self.started {
                delta.insert("role".into(), json!("assistant"));
            }
            let text = v["message"]["content"].as_str().unwrap_or_default();
            if !text.is_empty() || !self.started {
                delta.insert("content".into(), json!(text));
            }
            if v["message"]["tool_calls"].is_array() {
                self.tools = true;
                delta.insert(
                    "tool_calls".into(),
                    openai_calls(&v["message"]["tool_calls"]),
                );
            }
            self.started = true;
            if !delta.is_empty() {
                let choice = json!({"index": 0, "delta": delta, "finish_reason": null});
                sse(out, None, &self.chunk(choice, None));
            }
        } else {
            let text = v["response"].as_str().unwrap_or_default();
            if !text.is_empty() {
                let choice = json!({"index": 0, "text": text, "finish_reason": null});
                sse(out, None, &self.chunk(choice, None));
            }
        }
        if done {
            let reason = match finish_reason(v) {
                "stop" if self.tools => "tool_calls",
                r => r,
            };
            let choice = if self.chat {
                json!({"index": 0, "delta": {}, "finish_reason": reason})
            } else {
                json!({"index": 0, "text": "", "finish_reason": reason})
            };
            sse(out, None, &self.chunk(choice, Some(usage(v))));
        }
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: [DONE]\n\n");
    }
}
