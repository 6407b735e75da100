//! OpenAI Responses client, OpenAI chat node (stateless: the whole conversation is in
//! `input`); chat chunks back to Responses stream events.

use serde_json::{json, Map, Value};

use super::frame::{self, field, ToolCalls};
use super::{sse, stream_error, Context, StreamXlate};
use crate::protocol::Endpoint;

type Obj = Map<String, Value>;

fn content(v: Option<&Value>) -> Value {
    match v {
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            let mut text_only = true;
            for p in parts {
                match p["type"].as_str() {
                    Some("input_image") => {
                        text_only = false;
                        let url = p["image_url"]
                            .as_str()
                            .or(p["image_url"]["url"].as_str())
                            .unwrap_or_default();
                        out.push(json!({"type": "image_url", "image_url": {"url": url}}));
                    }
                    _ => {
                        let t = p["text"].as_str().or(p["refusal"].as_str());
                        out.push(json!({"type": "text", "text": t.unwrap_or_default()}));
                    }
                }
            }
            if text_only {
                json!(out
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""))
            } else {
                Value::Array(out)
            }
        }
        Some(v) => json!(frame::content_text(Some(v))),
        None => json!(""),
    }
}

fn messages(obj: &Obj) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    if let Some(s) = field(obj, "instructions").and_then(Value::as_str) {
        out.push(json!({"role": "system", "content": s}));
    }
    let items = match field(obj, "input") {
        Some(Value::String(s)) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(out);
        }
        Some(Value::Array(items)) => items.as_slice(),
        _ => &[],
    };
    for (i, item) in items.iter().enumerate() {
        match item["type"].as_str() {
            None | Some("message") => {
                let role = item["role"].as_str().unwrap_or("user");
                let role = if role == "developer" { "system" } else { role };
                out.push(json!({"role": role, "content": content(item.get("content"))}));
            }
            Some("function_call") => {
                let call = json!({
                    "id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": frame::arguments_string(item.get("arguments"))},
                });
                // Consecutive calls belong to one assistant turn.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" && last["tool_calls"].is_array() => {
                        if let Some(a) = last["tool_calls"].as_array_mut() {
                            a.push(call);
                        }
                    }
                    _ => {
                        out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]}))
                    }
                }
            }
            Some("function_call_output") => {
                let output = match &item["output"] {
                    Value::String(s) => s.clone(),
                    other => frame::content_text(Some(other)),
                };
                out.push(
                    json!({"role": "tool", "tool_call_id": item["call_id"], "content": output}),
                );
            }
            // Reasoning items carry nothing a chat model reads back.
            Some("reasoning") => {}
            Some(other) => {
                return Err(format!(
                    "`input[{i}]`: item type {other:?} cannot be sent to an OpenAI chat node"
                ))
            }
        }
    }
    Ok(out)
}

pub(super) fn request(obj: &Obj) -> Result<Value, String> {
    if field(obj, "previous_response_id").is_some() || field(obj, "conversation").is_some() {
        return Err(super::super::STATELESS.into());
    }
    let mut out = Obj::new();
    frame::copy(
        obj,
        &mut out,
        &[
            ("model", "model"),
            ("temperature", "temperature"),
            ("top_p", "top_p"),
            ("max_output_tokens", "max_tokens"),
            ("parallel_tool_calls", "parallel_tool_calls"),
        ],
    );
    out.insert("messages".into(), Value::Array(messages(obj)?));
    if let Some(tools) = field(obj, "tools").and_then(Value::as_array) {
        let mut list = Vec::new();
        for t in tools {
            if t["type"] != "function" {
                return Err(format!(
                    "tool type {} is a hosted OpenAI tool: an OpenAI chat node only takes function tools",
                    t["type"]
                ));
            }
            list.push(json!({"type": "function", "function": {
                "name": t["name"], "description": t.get("description").cloned().unwrap_or(json!("")),
                "parameters": t.get("parameters").cloned().unwrap_or(json!({})),
            }}));
        }
        if !list.is_empty() {
            out.insert("tools".into(), Value::Array(list));
        }
    }
    if let Some(tc) = field(obj, "tool_choice") {
        let choice = match tc {
            Value::Object(o) if o.get("name").is_some() => {
                json!({"type": "function", "function": {"name": o["name"]}})
            }
            other => other.clone(),
        };
        out.insert("tool_choice".into(), choice);
    }
    let format = &obj.get("text").unwrap_or(&Value::Null)["format"];
    match format["type"].as_str() {
        Some("json_object") => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some("json_schema") => {
            let schema = json!({"name": format["name"], "schema": format["schema"], "strict": format.get("strict").cloned().unwrap_or(json!(false))});
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": schema}),
            );
        }
        _ => {}
    }
    frame::openai_stream(obj, &mut out, false);
    Ok(Value::Object(out))
}

fn usage(input: u64, output: u64) -> Value {
    json!({
        "input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + output,
    })
}

/// The `response` object with `output` items, as both the whole body and `response.completed`.
fn envelope(
    ctx: &Context,
    status: &str,
    output: Vec<Value>,
    finish: Option<&str>,
    u: (u64, u64),
) -> Value {
    let incomplete = (finish == Some("length")).then(|| json!({"reason": "max_output_tokens"}));
    let status = if incomplete.is_some() {
        "incomplete"
    } else {
        status
    };
    json!({
        "id": ctx.id("resp_"), "object": "response", "created_at": ctx.now_s, "status": status,
        "model": ctx.model, "output": output, "incomplete_details": incomplete, "error": null,
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        "usage": if status == "in_progress" { Value::Null } else { usage(u.0, u.1) },
    })
}

fn message_item(ctx: &Context, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": ctx.id("msg_"), "status": status, "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn call_item(
    ctx: &Context,
    i: usize,
    call_id: &str,
    name: &str,
    args: &str,
    status: &str,
) -> Value {
    json!({"type": "function_call", "id": format!("fc_{:016x}_{i}", ctx.id_seed), "call_id": call_id,
           "name": name, "arguments": args, "status": status})
}

pub(super) fn response(v: &Value, ctx: &Context) -> Result<Value, String> {
    let choice = &v["choices"][0];
    let msg = &choice["message"];
    let mut output = Vec::new();
    let text = frame::content_text(msg.get("content"));
    if !text.is_empty() {
        output.push(message_item(ctx, &text, "completed"));
    }
    for (i, c) in msg["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let f = &c["function"];
        let args = frame::arguments_string(f.get("arguments"));
        let id = c["id"].as_str().unwrap_or_default();
        output.push(call_item(
            ctx,
            i,
            id,
            f["name"].as_str().unwrap_or_default(),
            &args,
            "completed",
        ));
    }
    let u = &v["usage"];
    let u = (
        u["prompt_tokens"].as_u64().unwrap_or(0),
        u["completion_tokens"].as_u64().unwrap_or(0),
    );
    Ok(envelope(
        ctx,
        "completed",
        output,
        choice["finish_reason"].as_str(),
        u,
    ))
}

/// Chat chunks as `response.*` events; text deltas go out as they arrive.
pub(super) struct Stream {
    ctx: Context,
    seq: u64,
    started: bool,
    /// Output index of the message item, once text began.
    text_item: Option<usize>,
    text: String,
    items: usize,
    /// Output index of each tool call, by the chunk's call index.
    call_items: Vec<usize>,
    calls: ToolCalls,
    finish: Option<String>,
    usage: (u64, u64),
}

impl Stream {
    pub fn new(ctx: Context) -> Stream {
        Stream {
            ctx,
            seq: 0,
            started: false,
            text_item: None,
            text: String::new(),
            items: 0,
            call_items: Vec::new(),
            calls: ToolCalls::default(),
            finish: None,
            usage: (0, 0),
        }
    }

    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, mut ev: Value) {
        ev["type"] = json!(kind);
        ev["sequence_number"] = json!(self.seq);
        self.seq += 1;
        sse(out, Some(kind), &ev);
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.started = true;
            let r = envelope(&self.ctx, "in_progress", Vec::new(), None, (0, 0));
            self.emit(out, "response.created", json!({"response": r}));
            let r = envelope(&self.ctx, "in_progress", Vec::new(), None, (0, 0));
            self.emit(out, "response.in_progress", json!({"response": r}));
        }
    }

    fn call_done(&mut self, i: usize, out: &mut Vec<u8>) -> Value {
        let (id, name, args) = self.calls.calls[i].clone();
        let item = call_item(&self.ctx, i, &id, &name, &args, "completed");
        let oi = self.call_items[i];
        let item_id = item["id"].clone();
        self.emit(
            out,
            "response.function_call_arguments.done",
            json!({"item_id": item_id, "output_index": oi, "arguments": args}),
        );
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": oi, "item": item}),
        );
        item
    }
}

impl StreamXlate for Stream {
    fn event(&mut self, v: &Value, out: &mut Vec<u8>) {
        if v.get("error").is_some() {
            return stream_error(Endpoint::OpenAIResponses, v, out);
        }
        self.start(out);
        if v["usage"].is_object() {
            let u = &v["usage"];
            self.usage = (
                u["prompt_tokens"].as_u64().unwrap_or(0),
                u["completion_tokens"].as_u64().unwrap_or(0),
            );
        }
        let Some(choice) = v["choices"].get(0) else {
            return;
        };
        if let Some(f) = choice["finish_reason"].as_str() {
            self.finish = Some(f.to_string());
        }
        let delta = &choice["delta"];
        if let Some(t) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            let oi = match self.text_item {
                Some(oi) => oi,
                None => {
                    let oi = self.items;
                    self.items += 1;
                    self.text_item = Some(oi);
                    let mut item = message_item(&self.ctx, "", "in_progress");
                    item["content"] = json!([]);
                    self.emit(
                        out,
                        "response.output_item.added",
                        json!({"output_index": oi, "item": item}),
                    );
                    self.emit(
                        out,
                        "response.content_part.added",
                        json!({"item_id": self.ctx.id("msg_"),
                        "output_index": oi, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}}),
                    );
                    oi
                }
            };
            self.text.push_str(t);
            self.emit(
                out,
                "response.output_text.delta",
                json!({"item_id": self.ctx.id("msg_"),
                "output_index": oi, "content_index": 0, "delta": t, "logprobs": []}),
            );
        }
        if let Some(calls) = delta.get("tool_calls") {
            for (i, new, frag) in self.calls.add(calls) {
                if new {
                    let oi = self.items;
                    self.items += 1;
                    self.call_items.push(oi);
                    let (id, name, _) = self.calls.calls[i].clone();
                    let item = call_item(&self.ctx, i, &id, &name, "", "in_progress");
                    self.emit(
                        out,
                        "response.output_item.added",
                        json!({"output_index": oi, "item": item}),
                    );
                }
                if !frag.is_empty() {
                    let item_id = format!("fc_{:016x}_{i}", self.ctx.id_seed);
                    let oi = self.call_items[i];
                    self.emit(
                        out,
                        "response.function_call_arguments.delta",
                        json!({"item_id": item_id, "output_index": oi, "delta": frag}),
                    );
                }
            }
        }
    }

    fn end(&mut self, out: &mut Vec<u8>) {
        self.start(out);
        let mut output: Vec<(usize, Value)> = Vec::new();
        if let Some(oi) = self.text_item {
            let text = std::mem::take(&mut self.text);
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            let id = self.ctx.id("msg_");
            self.emit(out, "response.output_text.done",
                json!({"item_id": id, "output_index": oi, "content_index": 0, "text": text, "logprobs": []}));
            self.emit(
                out,
                "response.content_part.done",
                json!({"item_id": id, "output_index": oi, "content_index": 0, "part": part}),
            );
            let item = message_item(&self.ctx, &text, "completed");
            self.emit(
                out,
                "response.output_item.done",
                json!({"output_index": oi, "item": item}),
            );
            output.push((oi, item));
        }
        for i in 0..self.calls.calls.len() {
            let item = self.call_done(i, out);
            output.push((self.call_items[i], item));
        }
        output.sort_by_key(|(oi, _)| *oi);
        let output = output.into_iter().map(|(_, v)| v).collect();
        let r = envelope(
            &self.ctx,
            "completed",
            output,
            self.finish.as_deref(),
            self.usage,
        );
        let kind = if r["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.emit(out, kind, json!({"response": r}));
    }
}
