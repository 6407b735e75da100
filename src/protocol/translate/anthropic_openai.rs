//! Anthropic client, OpenAI node: /v1/messages -> /v1/chat/completions (system, tool use and
//! tool results, images, stop reasons, usage); SSE chunks back to Anthropic's event stream.

use serde_json::{json, Map, Value};

use super::frame::{self, field, ToolCalls};
use super::{sse, stream_error, Context, StreamXlate};
use crate::protocol::Endpoint;

type Obj = Map<String, Value>;

/// Text of a string or an array of Anthropic blocks (`text` blocks only).
fn blocks_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn image(b: &Value) -> Result<Value, String> {
    let src = &b["source"];
    match src["type"].as_str() {
        Some("base64") => Ok(frame::image_part(
            src["data"].as_str().unwrap_or_default(),
            src["media_type"].as_str(),
        )),
        Some("url") => Ok(json!({"type": "image_url", "image_url": {"url": src["url"]}})),
        other => Err(format!(
            "image source type {other:?} cannot be sent to an OpenAI-compatible node"
        )),
    }
}

/// One Anthropic message as OpenAI messages (tool results become `tool` messages first).
fn message(m: &Obj, out: &mut Vec<Value>) -> Result<(), String> {
    let role = field(m, "role").and_then(Value::as_str).unwrap_or("user");
    let blocks = match field(m, "content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(b)) => b.as_slice(),
        _ => &[],
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => parts.push(json!({"type": "text", "text": b["text"]})),
            Some("image") => parts.push(image(b)?),
            Some("tool_use") => calls.push(json!({
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": frame::arguments_string(b.get("input"))},
            })),
            Some("tool_result") => {
                let mut text = blocks_text(b.get("content"));
                if b["is_error"].as_bool() == Some(true) {
                    text = format!("Error: {text}");
                }
                out.push(json!({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text}));
            }
            // thinking, redacted_thinking, documents ...: nothing an OpenAI chat carries.
            _ => {}
        }
    }
    if role == "assistant" {
        let text: String = parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("");
        let mut msg = json!({"role": "assistant", "content": text});
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        out.push(msg);
    } else if !parts.is_empty() {
        let only_text = parts.iter().all(|p| p["type"] == "text");
        let content = if only_text {
            json!(parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"))
        } else {
            Value::Array(parts)
        };
        out.push(json!({"role": role, "content": content}));
    }
    Ok(())
}

pub(super) fn request(obj: &Obj) -> Result<Value, String> {
    let mut messages = Vec::new();
    let system = blocks_text(field(obj, "system"));
    if !system.is_empty() {
        messages.push(json!({"role": "system", "content": system}));
    }
    for m in field(obj, "messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(m) = m.as_object() {
            message(m, &mut messages)?;
        }
    }
    let mut out = Obj::new();
    frame::copy(
        obj,
        &mut out,
        &[
            ("model", "model"),
            ("max_tokens", "max_tokens"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("stop_sequences", "stop"),
        ],
    );
    out.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = field(obj, "tools").and_then(Value::as_array) {
        let tools: Vec<Value> = tools
            .iter()
            .filter(|t| t.get("input_schema").is_some())
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t["name"],
                    "description": t.get("description").cloned().unwrap_or(json!("")),
                    "parameters": t["input_schema"],
                }})
            })
            .collect();
        if !tools.is_empty() {
            out.insert("tools".into(), Value::Array(tools));
        }
    }
    if let Some(tc) = field(obj, "tool_choice") {
        let choice = match tc["type"].as_str() {
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": tc["name"]}}),
            _ => json!("auto"),
        };
        out.insert("tool_choice".into(), choice);
    }
    frame::openai_stream(obj, &mut out, false);
    Ok(Value::Object(out))
}

fn stop_reason(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "max_tokens",
        Some("tool_calls" | "function_call") => "tool_use",
        Some("content_filter") => "refusal",
        _ => "end_turn",
    }
}

fn usage(v: &Value) -> (u64, u64) {
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap_or(0),
        u["completion_tokens"].as_u64().unwrap_or(0),
    )
}

pub(super) fn response(v: &Value, ctx: &Context) -> Result<Value, String> {
    let choice = &v["choices"][0];
    let msg = &choice["message"];
    let mut content = Vec::new();
    let text = frame::content_text(msg.get("content"));
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for (i, c) in msg["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let id = c["id"]
            .as_str()
            .map_or_else(|| format!("toolu_{i}"), str::to_string);
        content.push(json!({
            "type": "tool_use",
            "id": id,
            "name": c["function"]["name"],
            "input": frame::arguments_object(c["function"].get("arguments")),
        }));
    }
    let (input, output) = usage(v);
    Ok(json!({
        "id": ctx.id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": stop_reason(choice["finish_reason"].as_str()),
        "stop_sequence": null,
        "usage": {"input_tokens": input, "output_tokens": output},
    }))
}

/// What block is open in the Anthropic stream.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    None,
    Text,
    Tool(usize),
}

/// OpenAI chunks as `message_start`, `content_block_*`, `message_delta`, `message_stop`.
pub(super) struct Stream {
    ctx: Context,
    started: bool,
    open: Open,
    /// Index of the next content block.
    next: usize,
    finish: Option<String>,
    usage: (u64, u64),
    calls: ToolCalls,
}

impl Stream {
    pub fn new(ctx: Context) -> Stream {
        Stream {
            ctx,
            started: false,
            open: Open::None,
            next: 0,
            finish: None,
            usage: (0, 0),
            calls: ToolCalls::default(),
        }
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({
            "id": self.ctx.id("msg_"), "type": "message", "role": "assistant",
            "model": self.ctx.model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        });
        sse(
            out,
            Some("message_start"),
            &json!({"type": "message_start", "message": message}),
        );
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if self.open != Open::None {
            let index = self.next - 1;
            sse(
                out,
                Some("content_block_stop"),
                &json!({"type": "content_block_stop", "index": index}),
            );
            self.open = Open::None;
        }
    }

    fn open(&mut self, kind: Open, block: Value, out: &mut Vec<u8>) {
        self.close(out);
        let index = self.next;
        self.next += 1;
        self.open = kind;
        let ev = json!({"type": "content_block_start", "index": index, "content_block": block});
        sse(out, Some("content_block_start"), &ev);
    }

    fn delta(&self, delta: Value, out: &mut Vec<u8>) {
        let ev = json!({"type": "content_block_delta", "index": self.next - 1, "delta": delta});
        sse(out, Some("content_block_delta"), &ev);
    }
}

impl StreamXlate for Stream {
    fn event(&mut self, v: &Value, out: &mut Vec<u8>) {
        if v.get("error").is_some() {
            return stream_error(Endpoint::AnthropicMessages, v, out);
        }
        self.start(out);
        if v["usage"].is_object() {
            self.usage = usage(v);
        }
        let Some(choice) = v["choices"].get(0) else {
            return;
        };
        if let Some(f) = choice["finish_reason"].as_str() {
            self.finish = Some(f.to_string());
        }
        let delta = &choice["delta"];
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            if self.open != Open::Text {
                self.open(Open::Text, json!({"type": "text", "text": ""}), out);
            }
            self.delta(json!({"type": "text_delta", "text": t}), out);
        }
        if let Some(calls) = delta.get("tool_calls") {
            for (i, new, frag) in self.calls.add(calls) {
                if new || self.open != Open::Tool(i) {
                    let (id, name, _) = self.calls.calls[i].clone();
                    let id = if id.is_empty() {
                        format!("toolu_{i}")
                    } else {
                        id
                    };
                    let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                    self.open(Open::Tool(i), block, out);
                }
                if !frag.is_empty() {
                    self.delta(
                        json!({"type": "input_json_delta", "partial_json": frag}),
                        out,
                    );
                }
            }
        }
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        self.start(out);
        self.close(out);
        let ev = json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(self.finish.as_deref()), "stop_sequence": null},
            "usage": {"input_tokens": self.usage.0, "output_tokens": self.usage.1},
        });
        sse(out, Some("message_delta"), &ev);
        sse(out, Some("message_stop"), &json!({"type": "message_stop"}));
    }
}
