//! Anthropic Messages bodies: POST /v1/messages (and /v1/messages/count_tokens).

use serde_json::Value;

use super::fields::{self, as_obj, get, Obj, Tally};
use super::{ParseError, ParsedRequest};

fn bad(path: &str, what: &str) -> ParseError {
    ParseError::new(format!("`{path}` must be {what}"))
}

/// One content block. `text` is read, `image` is an image, `tool_use` replays its input,
/// `tool_result` reads its content (string or blocks), `document` with a text source is read.
fn block(t: &mut Tally, b: &Value, path: &str, depth: u8) -> Result<(), ParseError> {
    let b = as_obj(b, path)?;
    match get(b, "type").and_then(Value::as_str) {
        Some("text") => {
            t.text(fields::opt_str(b, "text", &format!("{path}.text"))?.unwrap_or_default());
        }
        Some("image") => t.image(),
        Some("tool_use" | "server_tool_use") => {
            if let Some(Value::String(name)) = get(b, "name") {
                t.text(name);
            }
            if let Some(input) = get(b, "input") {
                t.json(input);
            }
        }
        Some("tool_result") if depth == 0 => {
            if let Some(c) = get(b, "content") {
                content(t, c, &format!("{path}.content"), depth + 1)?;
            }
        }
        Some("document") => {
            let source = get(b, "source").and_then(Value::as_object);
            if let Some(Value::String(data)) = source.and_then(|s| get(s, "data")) {
                if source.and_then(|s| get(s, "type")).and_then(Value::as_str) == Some("text") {
                    t.text(data);
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// A string or an array of content blocks at `path`.
fn content(t: &mut Tally, v: &Value, path: &str, depth: u8) -> Result<(), ParseError> {
    match v {
        Value::String(s) => t.text(s),
        Value::Array(blocks) => {
            for (j, b) in blocks.iter().enumerate() {
                block(t, b, &format!("{path}[{j}]"), depth)?;
            }
        }
        _ => return Err(bad(path, "a string or an array of content blocks")),
    }
    Ok(())
}

/// POST /v1/messages. `max_tokens` is required by Anthropic but optional here.
pub(super) fn messages(obj: &Obj) -> Result<ParsedRequest, ParseError> {
    let model = fields::model(obj)?;
    let mut t = Tally::default();
    if let Some(sys) = get(obj, "system") {
        match sys {
            Value::String(s) => t.text(s),
            Value::Array(blocks) => {
                for (j, b) in blocks.iter().enumerate() {
                    block(&mut t, b, &format!("system[{j}]"), 1)?;
                }
            }
            _ => return Err(bad("system", "a string or an array of text blocks")),
        }
    }
    let messages = fields::req_array(obj, "messages")?;
    for (i, m) in messages.iter().enumerate() {
        let path = format!("messages[{i}]");
        let m = as_obj(m, &path)?;
        match get(m, "content") {
            None => return Err(ParseError::new(format!("missing field `{path}.content`"))),
            Some(c) => content(&mut t, c, &format!("{path}.content"), 0)?,
        }
    }
    t.tools_field(obj, "tools")?;
    Ok(t.finish(
        model,
        messages.len(),
        fields::opt_count(obj, "max_tokens")?,
        fields::bool_or(obj, "stream", false)?,
        fields::fallback_models(obj)?,
    ))
}

#[cfg(test)]
mod tests {
    use crate::protocol::{parse, Endpoint, ParsedRequest};
    use serde_json::json;

    fn p(v: serde_json::Value) -> Result<ParsedRequest, String> {
        parse(Endpoint::AnthropicMessages, v.to_string().as_bytes()).map_err(|e| e.message)
    }

    #[test]
    fn system_array_image_block_tools() {
        // Shapes from the Messages API reference: system text blocks with cache_control,
        // base64 image block, tool definitions, tool_use / tool_result round trip.
        let tools = json!([{"name":"get_weather","description":"Get the weather",
            "input_schema":{"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}}]);
        let body = json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 1024,
            "system": [
                {"type": "text", "text": "You are a helpful assistant."},
                {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
            ],
            "messages": [
                {"role": "user", "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}},
                    {"type": "text", "text": "Describe this image."}
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"location": "SF"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": [
                        {"type": "text", "text": "15C"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}
                    ]}
                ]},
                {"role": "assistant", "content": "ok"}
            ],
            "tools": tools,
            "stream": true
        });
        let r = p(body).unwrap();
        assert_eq!(r.model, "claude-sonnet-4-5");
        assert_eq!((r.messages, r.images, r.tools), (4, 2, true));
        let input = json!({"location":"SF"}).to_string().len();
        assert_eq!(
            r.prompt_chars,
            28 + 9 + 20 + "get_weather".len() + input + 3 + 2 + tools.to_string().len()
        );
        assert_eq!((r.max_tokens, r.stream), (Some(1024), true));
    }

    #[test]
    fn defaults_and_string_forms() {
        let r = p(
            json!({"model":"claude","system":"sys","messages":[{"role":"user","content":"hello"}]}),
        )
        .unwrap();
        assert_eq!(
            (r.prompt_chars, r.messages, r.max_tokens, r.stream, r.tools),
            (8, 1, None, false, false)
        );
        let r = p(json!({"model":"c","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"abc"}]}]})).unwrap();
        assert_eq!(r.prompt_chars, 3);
        let r = p(json!({"model":"c","messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"doc"}}]}]})).unwrap();
        assert_eq!(r.prompt_chars, 3);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({"model":"c"}), "missing field `messages`"),
            (
                json!({"model":"c","messages":[{"role":"user"}]}),
                "missing field `messages[0].content`",
            ),
            (
                json!({"model":"c","messages":[{"role":"user","content":7}]}),
                "`messages[0].content` must be",
            ),
            (
                json!({"model":"c","messages":[{"role":"user","content":[{"type":"tool_result","content":{}}]}]}),
                "`messages[0].content[0].content` must be",
            ),
            (
                json!({"model":"c","system":5,"messages":[]}),
                "`system` must be",
            ),
            (
                json!({"model":"c","system":["x"],"messages":[]}),
                "`system[0]` must be an object",
            ),
            (
                json!({"model":"c","messages":[],"max_tokens":"1"}),
                "`max_tokens` must be",
            ),
            (
                json!({"model":"c","messages":[],"fallback_models":[""]}),
                "`fallback_models[0]` must be",
            ),
        ];
        for (body, want) in cases {
            let e = p(body.clone()).unwrap_err();
            assert!(e.starts_with(want), "{body}: {e}");
        }
    }
}
