//! Shared pieces of the translators: line framing of a stream, images, content text, stop
//! reasons.

use serde_json::{json, Map, Value};

/// Longest line kept while waiting for its end (a stream line longer than this is dropped).
const MAX_LINE: usize = 16 << 20;

/// Splits a byte stream into lines without keeping more than the current partial line.
#[derive(Debug, Default)]
pub(super) struct Lines {
    partial: Vec<u8>,
    overlong: bool,
}

impl Lines {
    /// Call `each` for every line completed by `chunk` (without the `\n` / `\r\n`).
    pub fn push(&mut self, chunk: &[u8], mut each: impl FnMut(&[u8])) {
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            let piece = &rest[..i];
            if self.partial.is_empty() && !self.overlong {
                each(trim_cr(piece));
            } else {
                if !self.overlong {
                    self.partial.extend_from_slice(piece);
                    each(trim_cr(&self.partial));
                }
                self.partial.clear();
                self.overlong = false;
            }
            rest = &rest[i + 1..];
        }
        if self.partial.len() + rest.len() > MAX_LINE {
            self.partial.clear();
            self.overlong = true;
        } else if !self.overlong {
            self.partial.extend_from_slice(rest);
        }
    }

    /// The last line when the stream ended without a newline.
    pub fn rest(&mut self) -> Option<Vec<u8>> {
        let l = std::mem::take(&mut self.partial);
        (!l.is_empty() && !self.overlong).then_some(l)
    }
}

fn trim_cr(l: &[u8]) -> &[u8] {
    l.strip_suffix(b"\r").unwrap_or(l)
}

/// The media type of base64 image data, from its first bytes (Ollama sends bare base64).
pub(super) fn image_mime(b64: &str) -> &'static str {
    if b64.starts_with("/9j/") {
        "image/jpeg"
    } else if b64.starts_with("R0lG") {
        "image/gif"
    } else if b64.starts_with("UklG") {
        "image/webp"
    } else {
        "image/png"
    }
}

/// An OpenAI `image_url` content part for bare base64 data.
pub(super) fn image_part(b64: &str, mime: Option<&str>) -> Value {
    let mime = mime.unwrap_or_else(|| image_mime(b64));
    json!({"type": "image_url", "image_url": {"url": format!("data:{mime};base64,{b64}")}})
}

/// (media type, base64) of a `data:` URL; None for other URLs.
pub(super) fn data_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (mime, data) = rest.split_once(";base64,")?;
    Some((mime, data))
}

/// The text of OpenAI message content: a string, or the `text` of its text parts.
pub(super) fn content_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// `obj[key]` unless absent or null.
pub(super) fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// `stream` as the client asked (`default` when it did not say), carried to an OpenAI body; a
/// stream asks for usage in its last chunk (what the client's protocol reports at the end).
pub(super) fn openai_stream(obj: &Map<String, Value>, out: &mut Map<String, Value>, default: bool) {
    let stream = field(obj, "stream")
        .and_then(Value::as_bool)
        .unwrap_or(default);
    out.insert("stream".into(), json!(stream));
    if stream {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
}

/// Copy the keys present in `from` to `to` under new names.
pub(super) fn copy(from: &Map<String, Value>, to: &mut Map<String, Value>, keys: &[(&str, &str)]) {
    for (src, dst) in keys {
        if let Some(v) = field(from, src) {
            to.insert((*dst).to_string(), v.clone());
        }
    }
}

/// `stop` as an array of strings (OpenAI takes a string or an array).
pub(super) fn stop_list(v: &Value) -> Value {
    match v {
        Value::String(s) => json!([s]),
        other => other.clone(),
    }
}

/// Tool-call arguments as the JSON object Ollama and Anthropic carry (OpenAI sends a string).
pub(super) fn arguments_object(v: Option<&Value>) -> Value {
    match v {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| json!({ "_raw": s })),
        Some(v @ Value::Object(_)) => v.clone(),
        _ => json!({}),
    }
}

/// Tool-call arguments as the JSON string OpenAI carries.
pub(super) fn arguments_string(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "{}".into(),
    }
}

/// Accumulates streamed OpenAI `tool_calls` deltas by index.
#[derive(Debug, Default, Clone)]
pub(super) struct ToolCalls {
    pub calls: Vec<(String, String, String)>,
}

impl ToolCalls {
    /// Add one delta's `tool_calls`; returns (index, is_new, name, arguments fragment) each.
    pub fn add(&mut self, deltas: &Value) -> Vec<(usize, bool, String)> {
        let mut seen = Vec::new();
        for d in deltas.as_array().into_iter().flatten() {
            let i = d
                .get("index")
                .and_then(Value::as_u64)
                .map_or(self.calls.len().saturating_sub(1), |i| i as usize)
                .min(1024);
            let new = i >= self.calls.len();
            while self.calls.len() <= i {
                self.calls.push(Default::default());
            }
            let c = &mut self.calls[i];
            if let Some(id) = d.get("id").and_then(Value::as_str) {
                c.0 = id.to_string();
            }
            let f = d.get("function");
            if let Some(n) = f.and_then(|f| f.get("name")).and_then(Value::as_str) {
                c.1.push_str(n);
            }
            let frag = f
                .and_then(|f| f.get("arguments"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            c.2.push_str(frag);
            seen.push((i, new, frag.to_string()));
        }
        seen
    }
}
