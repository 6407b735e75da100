//! OpenAI-compatible bodies: chat completions, legacy completions, embeddings, responses.

use serde_json::Value;

use super::fields::{self, as_obj, get, Obj, Tally};
use super::{ParseError, ParsedRequest};

fn bad(path: &str, what: &str) -> ParseError {
    ParseError::new(format!("`{path}` must be {what}"))
}

/// `max_completion_tokens` (current) wins over `max_tokens` (deprecated).
fn max_tokens(obj: &Obj) -> Result<Option<u32>, ParseError> {
    let current = fields::opt_count(obj, "max_completion_tokens")?;
    let legacy = fields::opt_count(obj, "max_tokens")?;
    Ok(current.or(legacy))
}

/// One chat content part: `text`, `image_url`, `refusal`; audio/file parts carry no text.
fn chat_part(t: &mut Tally, part: &Value, path: &str) -> Result<(), ParseError> {
    let part = as_obj(part, path)?;
    match get(part, "type").and_then(Value::as_str) {
        Some("text") => {
            let text = fields::opt_str(part, "text", &format!("{path}.text"))?;
            t.text(text.unwrap_or_default());
        }
        Some("refusal") => {
            let text = fields::opt_str(part, "refusal", &format!("{path}.refusal"))?;
            t.text(text.unwrap_or_default());
        }
        Some("image_url") => t.image(),
        _ => {}
    }
    Ok(())
}

/// POST /v1/chat/completions
pub(super) fn chat(obj: &Obj) -> Result<ParsedRequest, ParseError> {
    let model = fields::model(obj)?;
    let messages = fields::req_array(obj, "messages")?;
    let mut t = Tally::default();
    for (i, m) in messages.iter().enumerate() {
        let path = format!("messages[{i}]");
        let m = as_obj(m, &path)?;
        match get(m, "content") {
            None => {}
            Some(Value::String(s)) => t.text(s),
            Some(Value::Array(parts)) => {
                for (j, p) in parts.iter().enumerate() {
                    chat_part(&mut t, p, &format!("{path}.content[{j}]"))?;
                }
            }
            Some(_) => {
                return Err(bad(
                    &format!("{path}.content"),
                    "a string or an array of content parts",
                ))
            }
        }
        // Earlier assistant tool calls are replayed into the prompt.
        for key in ["tool_calls", "function_call"] {
            if let Some(v) = get(m, key) {
                t.json(v);
            }
        }
    }
    t.tools_field(obj, "tools")?;
    t.tools_field(obj, "functions")?;
    Ok(t.finish(
        model,
        messages.len(),
        max_tokens(obj)?,
        fields::bool_or(obj, "stream", false)?,
        fields::fallback_models(obj)?,
    ))
}

/// POST /v1/completions
pub(super) fn completions(obj: &Obj) -> Result<ParsedRequest, ParseError> {
    let model = fields::model(obj)?;
    let mut t = Tally::default();
    if let Some(p) = get(obj, "prompt") {
        t.text_or_tokens(p, "prompt", true)?;
    }
    if let Some(s) = fields::opt_str(obj, "suffix", "suffix")? {
        t.text(s);
    }
    Ok(t.finish(
        model,
        1,
        fields::opt_count(obj, "max_tokens")?,
        fields::bool_or(obj, "stream", false)?,
        fields::fallback_models(obj)?,
    ))
}

/// POST /v1/embeddings (never streams).
pub(super) fn embeddings(obj: &Obj) -> Result<ParsedRequest, ParseError> {
    let model = fields::model(obj)?;
    let mut t = Tally::default();
    match get(obj, "input") {
        None => return Err(ParseError::new("missing field `input`")),
        Some(v) => t.text_or_tokens(v, "input", true)?,
    }
    Ok(t.finish(model, 1, None, false, fields::fallback_models(obj)?))
}

/// A Responses content part: `input_text`/`output_text`/`text`/`refusal` carry text,
/// `input_image` is an image, `input_file` carries none we can count.
fn responses_part(t: &mut Tally, part: &Value, path: &str) -> Result<(), ParseError> {
    let part = as_obj(part, path)?;
    match get(part, "type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text" | "summary_text" | "reasoning_text") => {
            t.text(fields::opt_str(part, "text", &format!("{path}.text"))?.unwrap_or_default());
        }
        Some("refusal") => {
            let text = fields::opt_str(part, "refusal", &format!("{path}.refusal"))?;
            t.text(text.unwrap_or_default());
        }
        Some("input_image") => t.image(),
        _ => {}
    }
    Ok(())
}

/// String or array of content parts at `path`.
fn responses_content(t: &mut Tally, v: &Value, path: &str) -> Result<(), ParseError> {
    match v {
        Value::String(s) => t.text(s),
        Value::Array(parts) => {
            for (j, p) in parts.iter().enumerate() {
                responses_part(t, p, &format!("{path}[{j}]"))?;
            }
        }
        _ => return Err(bad(path, "a string or an array of content parts")),
    }
    Ok(())
}

/// One `input` item: a message (`role` + `content`), a `function_call` (arguments are
/// replayed), a `function_call_output` (its output is read), or another item type.
fn responses_item(t: &mut Tally, item: &Value, path: &str) -> Result<(), ParseError> {
    let item = as_obj(item, path)?;
    if let Some(c) = get(item, "content") {
        responses_content(t, c, &format!("{path}.content"))?;
    }
    match get(item, "type").and_then(Value::as_str) {
        Some("function_call" | "custom_tool_call") => {
            for key in ["name", "arguments", "input"] {
                if let Some(Value::String(s)) = get(item, key) {
                    t.text(s);
                }
            }
        }
        Some("function_call_output" | "custom_tool_call_output") => {
            if let Some(o) = get(item, "output") {
                responses_content(t, o, &format!("{path}.output"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// POST /v1/responses
pub(super) fn responses(obj: &Obj) -> Result<ParsedRequest, ParseError> {
    let model = fields::model(obj)?;
    if get(obj, "previous_response_id").is_some() || get(obj, "conversation").is_some() {
        return Err(ParseError::new(super::STATELESS));
    }
    let mut t = Tally::default();
    let messages = match get(obj, "input") {
        None => 0,
        Some(Value::String(s)) => {
            t.text(s);
            1
        }
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                responses_item(&mut t, item, &format!("input[{i}]"))?;
            }
            items.len()
        }
        Some(_) => return Err(bad("input", "a string or an array of input items")),
    };
    if let Some(s) = fields::opt_str(obj, "instructions", "instructions")? {
        t.text(s);
    }
    t.tools_field(obj, "tools")?;
    Ok(t.finish(
        model,
        messages,
        fields::opt_count(obj, "max_output_tokens")?,
        fields::bool_or(obj, "stream", false)?,
        fields::fallback_models(obj)?,
    ))
}

#[cfg(test)]
mod tests {
    use crate::protocol::{parse, Endpoint};
    use serde_json::json;

    fn p(ep: Endpoint, v: serde_json::Value) -> Result<crate::protocol::ParsedRequest, String> {
        parse(ep, v.to_string().as_bytes()).map_err(|e| e.message)
    }

    #[test]
    fn chat_with_image_url_part_and_tools() {
        // Shape from the OpenAI vision guide + function calling guide.
        let tools = json!([{"type":"function","function":{"name":"get_weather",
            "parameters":{"type":"object","properties":{"location":{"type":"string"}}}}}]);
        let body = json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "developer", "content": "You are terse."},
                {"role": "user", "content": [
                    {"type": "text", "text": "What's in this image?"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg", "detail": "high"}}
                ]},
                {"role": "assistant", "content": null,
                 "tool_calls": [{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"}
            ],
            "tools": tools,
            "max_completion_tokens": 300,
            "max_tokens": 50,
            "fallback_models": ["llama3.1:8b"]
        });
        let r = p(Endpoint::OpenAIChat, body.clone()).unwrap();
        let tool_calls = body["messages"][2]["tool_calls"].to_string().len();
        assert_eq!(r.model, "gpt-4o");
        assert_eq!(r.messages, 4);
        assert_eq!(r.images, 1);
        assert!(r.tools);
        assert_eq!(
            r.prompt_chars,
            "You are terse.".len()
                + "What's in this image?".len()
                + 2
                + tool_calls
                + tools.to_string().len()
        );
        assert_eq!(r.max_tokens, Some(300), "max_completion_tokens wins");
        assert!(!r.stream, "OpenAI defaults to non-streaming");
        assert_eq!(r.fallback_models, ["llama3.1:8b"]);
        assert_eq!(r.token_ids, 0);
    }

    #[test]
    fn chat_legacy_fields_and_stream() {
        let r = p(
            Endpoint::OpenAIChat,
            json!({"model":"m","messages":[{"role":"user","content":"hi"}],
                   "max_tokens":64,"stream":true,"functions":[{"name":"f"}]}),
        )
        .unwrap();
        assert_eq!((r.max_tokens, r.stream, r.tools), (Some(64), true, true));
        let r = p(
            Endpoint::OpenAIChat,
            json!({"model":"m","messages":[],"tools":[]}),
        )
        .unwrap();
        assert!(!r.tools && r.prompt_chars == 0 && r.max_tokens.is_none());
    }

    #[test]
    fn chat_errors_name_the_field() {
        let cases = [
            (json!({"model":"m"}), "missing field `messages`"),
            (
                json!({"model":"m","messages":{}}),
                "`messages` must be an array",
            ),
            (
                json!({"model":"m","messages":["x"]}),
                "`messages[0]` must be an object",
            ),
            (
                json!({"model":"m","messages":[{"content":5}]}),
                "`messages[0].content` must be",
            ),
            (
                json!({"model":"m","messages":[{"content":[{"type":"text","text":1}]}]}),
                "`messages[0].content[0].text` must be a string",
            ),
            (
                json!({"model":"m","messages":[],"stream":"yes"}),
                "`stream` must be a boolean",
            ),
            (
                json!({"model":"m","messages":[],"max_tokens":-5}),
                "`max_tokens` must be a non-negative",
            ),
            (
                json!({"model":"m","messages":[],"tools":{}}),
                "`tools` must be an array",
            ),
        ];
        for (body, want) in cases {
            let e = p(Endpoint::OpenAIChat, body.clone()).unwrap_err();
            assert!(e.starts_with(want), "{body}: {e}");
        }
    }

    #[test]
    fn completions_prompt_forms() {
        let r = p(
            Endpoint::OpenAICompletions,
            json!({"model":"m","prompt":"abcd","suffix":"ef","max_tokens":7}),
        )
        .unwrap();
        assert_eq!((r.prompt_chars, r.messages, r.max_tokens), (6, 1, Some(7)));
        let r = p(
            Endpoint::OpenAICompletions,
            json!({"model":"m","prompt":["ab","cd"],"stream":true}),
        )
        .unwrap();
        assert_eq!((r.prompt_chars, r.stream), (4, true));
        let r = p(
            Endpoint::OpenAICompletions,
            json!({"model":"m","prompt":[1,2,3]}),
        )
        .unwrap();
        assert_eq!((r.prompt_chars, r.token_ids), (0, 3));
        let r = p(
            Endpoint::OpenAICompletions,
            json!({"model":"m","prompt":[[1,2],[3]]}),
        )
        .unwrap();
        assert_eq!(r.token_ids, 3);
        let e = p(
            Endpoint::OpenAICompletions,
            json!({"model":"m","prompt":[{}]}),
        )
        .unwrap_err();
        assert!(e.starts_with("`prompt[0]` must be"), "{e}");
    }

    #[test]
    fn embeddings_never_stream() {
        let r = p(
            Endpoint::OpenAIEmbeddings,
            json!({"model":"nomic-embed-text","input":["a","bc"],"stream":true}),
        )
        .unwrap();
        assert_eq!(
            (r.prompt_chars, r.stream, r.messages, r.max_tokens),
            (3, false, 1, None)
        );
        let r = p(
            Endpoint::OpenAIEmbeddings,
            json!({"model":"e","input":"hello","encoding_format":"float"}),
        )
        .unwrap();
        assert_eq!(r.prompt_chars, 5);
        let e = p(Endpoint::OpenAIEmbeddings, json!({"model":"e"})).unwrap_err();
        assert_eq!(e, "missing field `input`");
        let e = p(Endpoint::OpenAIEmbeddings, json!({"model":"e","input":5})).unwrap_err();
        assert!(e.starts_with("`input` must be"), "{e}");
    }

    #[test]
    fn responses_items_and_instructions() {
        // Shapes from the Responses API reference (input items, input_image, function calls).
        let body = json!({
            "model": "gpt-4.1",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [
                    {"type": "input_text", "text": "describe"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
                ]},
                {"type": "message", "role": "assistant", "content": [{"type":"output_text","text":"a cat"}]},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{\"a\":1}"},
                {"type": "function_call_output", "call_id": "c", "output": "42"}
            ],
            "tools": [{"type":"function","name":"f","parameters":{}}],
            "max_output_tokens": 1000,
            "stream": true
        });
        let r = p(Endpoint::OpenAIResponses, body.clone()).unwrap();
        let tools = body["tools"].to_string().len();
        assert_eq!(r.prompt_chars, 9 + 8 + 5 + 1 + 7 + 2 + tools);
        assert_eq!((r.messages, r.images, r.tools), (4, 1, true));
        assert_eq!((r.max_tokens, r.stream), (Some(1000), true));
        let r = p(Endpoint::OpenAIResponses, json!({"model":"m","input":"hi"})).unwrap();
        assert_eq!((r.prompt_chars, r.messages, r.stream), (2, 1, false));
        let e = p(Endpoint::OpenAIResponses, json!({"model":"m","input":3})).unwrap_err();
        assert!(e.starts_with("`input` must be"), "{e}");
        let e = p(
            Endpoint::OpenAIResponses,
            json!({"model":"m","input":[{"content":{}}]}),
        )
        .unwrap_err();
        assert!(e.starts_with("`input[0].content` must be"), "{e}");
    }
}
