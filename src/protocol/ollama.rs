//! Ollama native bodies: /api/chat, /api/generate, /api/embed, /api/embeddings.

use super::fields::{self, as_obj, get, Obj, Tally};
use super::{ParseError, ParsedRequest};

/// `options.num_predict`; negative values (-1 infinite, -2 fill context) mean no limit.
fn num_predict(obj: &Obj) -> Result<Option<u32>, ParseError> {
    let Some(opts) = get(obj, "options") else {
        return Ok(None);
    };
    let opts = as_obj(opts, "options")?;
    match get(opts, "num_predict") {
        None => Ok(None),
        Some(v) if v.as_i64().is_some_and(|n| n < 0) => Ok(None),
        Some(v) if v.as_f64().is_some_and(|f| f < 0.0) => Ok(None),
        Some(v) => fields::count(v, "options.num_predict").map(Some),
    }
}

/// `images`: an array of base64 strings; each one is an image.
fn images(t: &mut Tally, obj: &Obj, path: &str) -> Result<(), ParseError> {
    if let Some(imgs) = fields::opt_array(obj, "images", path)? {
        for (i, img) in imgs.iter().enumerate() {
            if !img.is_string() {
                return Err(ParseError::new(format!(
                    "`{path}[{i}]` must be a base64 string"
                )));
            }
            t.image();
        }
    }
    Ok(())
}

/// POST /api/chat (streams unless `"stream": false`). An empty `messages` just loads the model.
pub(super) fn chat(obj: &Obj) -> Result<ParsedRequest, ParseError> {
    let model = fields::model(obj)?;
    let mut t = Tally::default();
    let messages = fields::opt_array(obj, "messages", "messages")?;
    for (i, m) in messages.into_iter().flatten().enumerate() {
        let path = format!("messages[{i}]");
        let m = as_obj(m, &path)?;
        if let Some(s) = fields::opt_str(m, "content", &format!("{path}.content"))? {
            t.text(s);
        }
        images(&mut t, m, &format!("{path}.images"))?;
        if let Some(v) = get(m, "tool_calls") {
            t.json(v);
        }
    }
    t.tools_field(obj, "tools")?;
    Ok(t.finish(
        model,
        messages.map_or(0, Vec::len),
        num_predict(obj)?,
        fields::bool_or(obj, "stream", true)?,
        fields::fallback_models(obj)?,
    ))
}

/// POST /api/generate (streams unless `"stream": false`). `context` is prior token ids.
pub(super) fn generate(obj: &Obj) -> Result<ParsedRequest, ParseError> {
    let model = fields::model(obj)?;
    let mut t = Tally::default();
    for key in ["prompt", "system", "suffix"] {
        if let Some(s) = fields::opt_str(obj, key, key)? {
            t.text(s);
        }
    }
    images(&mut t, obj, "images")?;
    if let Some(ctx) = fields::opt_array(obj, "context", "context")? {
        t.tokens(ctx.len());
    }
    Ok(t.finish(
        model,
        1,
        num_predict(obj)?,
        fields::bool_or(obj, "stream", true)?,
        fields::fallback_models(obj)?,
    ))
}

/// POST /api/embed: `input` is a string or an array of strings (never streams).
pub(super) fn embed(obj: &Obj) -> Result<ParsedRequest, ParseError> {
    let model = fields::model(obj)?;
    let mut t = Tally::default();
    if let Some(v) = get(obj, "input") {
        t.text_or_tokens(v, "input", false)?;
    }
    Ok(t.finish(model, 1, None, false, fields::fallback_models(obj)?))
}

/// POST /api/embeddings (deprecated): `prompt` is a string (never streams).
pub(super) fn embeddings(obj: &Obj) -> Result<ParsedRequest, ParseError> {
    let model = fields::model(obj)?;
    let mut t = Tally::default();
    if let Some(s) = fields::opt_str(obj, "prompt", "prompt")? {
        t.text(s);
    }
    Ok(t.finish(model, 1, None, false, fields::fallback_models(obj)?))
}

#[cfg(test)]
mod tests {
    use crate::protocol::{parse, Endpoint, ParsedRequest};
    use serde_json::json;

    fn p(ep: Endpoint, v: serde_json::Value) -> Result<ParsedRequest, String> {
        parse(ep, v.to_string().as_bytes()).map_err(|e| e.message)
    }

    #[test]
    fn chat_with_images_tools_and_defaults() {
        // Shape from Ollama's API docs (chat request with images, tools).
        let tools = json!([{"type":"function","function":{"name":"get_current_weather",
            "description":"Get the current weather","parameters":{"type":"object",
            "properties":{"location":{"type":"string"}},"required":["location"]}}}]);
        let body = json!({
            "model": "llava",
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "what is in this image?",
                 "images": ["iVBORw0KGgoAAAANSUhEUgAAAG0AAABm", "R0lGODlhAQABAAAAACw="]}
            ],
            "tools": tools,
            "options": {"temperature": 0.2, "num_predict": 128, "num_ctx": 8192}
        });
        let r = p(Endpoint::OllamaChat, body).unwrap();
        assert_eq!(r.model, "llava");
        assert_eq!((r.messages, r.images, r.tools), (2, 2, true));
        assert_eq!(r.prompt_chars, 3 + 22 + tools.to_string().len());
        assert_eq!(r.max_tokens, Some(128));
        assert!(r.stream, "Ollama chat streams by default");
    }

    #[test]
    fn stream_and_num_predict_rules() {
        let cases = [
            (json!({"model":"m","stream":false}), false, None),
            (
                json!({"model":"m","stream":true,"options":{"num_predict":-1}}),
                true,
                None,
            ),
            (
                json!({"model":"m","options":{"num_predict":-2}}),
                true,
                None,
            ),
            (
                json!({"model":"m","options":{"num_predict":0}}),
                true,
                Some(0),
            ),
            (json!({"model":"m","options":null}), true, None),
        ];
        for ep in [Endpoint::OllamaChat, Endpoint::OllamaGenerate] {
            for (body, stream, max) in &cases {
                let r = p(ep, body.clone()).unwrap();
                assert_eq!((r.stream, r.max_tokens), (*stream, *max), "{ep:?} {body}");
            }
        }
        for ep in [Endpoint::OllamaEmbed, Endpoint::OllamaEmbeddings] {
            assert!(!p(ep, json!({"model":"m","stream":true})).unwrap().stream);
        }
    }

    #[test]
    fn generate_prompt_system_images_context() {
        let r = p(
            Endpoint::OllamaGenerate,
            json!({"model":"llava","prompt":"describe","system":"be nice","suffix":"!",
                   "images":["AAAA"],"context":[1,2,3,4],"stream":false}),
        )
        .unwrap();
        assert_eq!((r.prompt_chars, r.images, r.messages), (8 + 7 + 1, 1, 1));
        assert_eq!((r.token_ids, r.stream), (4, false));
    }

    #[test]
    fn embed_forms() {
        let r = p(
            Endpoint::OllamaEmbed,
            json!({"model":"all-minilm","input":["Why is the sky blue?","ok"]}),
        )
        .unwrap();
        assert_eq!((r.prompt_chars, r.messages), (22, 1));
        let r = p(
            Endpoint::OllamaEmbed,
            json!({"model":"all-minilm","input":"abc"}),
        )
        .unwrap();
        assert_eq!(r.prompt_chars, 3);
        let e = p(Endpoint::OllamaEmbed, json!({"model":"m","input":[1,2]})).unwrap_err();
        assert!(
            e.starts_with("`input[0]` must be a string or an array of strings"),
            "{e}"
        );
        let r = p(
            Endpoint::OllamaEmbeddings,
            json!({"model":"m","prompt":"hello"}),
        )
        .unwrap();
        assert_eq!(r.prompt_chars, 5);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (
                Endpoint::OllamaChat,
                json!({"model":"m","messages":"hi"}),
                "`messages` must be an array",
            ),
            (
                Endpoint::OllamaChat,
                json!({"model":"m","messages":[{"content":["x"]}]}),
                "`messages[0].content` must be a string",
            ),
            (
                Endpoint::OllamaChat,
                json!({"model":"m","messages":[{"content":"x","images":[1]}]}),
                "`messages[0].images[0]` must be a base64 string",
            ),
            (
                Endpoint::OllamaChat,
                json!({"model":"m","stream":"false"}),
                "`stream` must be a boolean",
            ),
            (
                Endpoint::OllamaChat,
                json!({"model":"m","options":[]}),
                "`options` must be an object",
            ),
            (
                Endpoint::OllamaGenerate,
                json!({"model":"m","options":{"num_predict":"9"}}),
                "`options.num_predict` must be",
            ),
            (
                Endpoint::OllamaGenerate,
                json!({"model":"m","prompt":{}}),
                "`prompt` must be a string",
            ),
            (
                Endpoint::OllamaGenerate,
                json!({"model":"m","images":"AAAA"}),
                "`images` must be an array",
            ),
            (
                Endpoint::OllamaEmbeddings,
                json!({"model":"m","prompt":["a"]}),
                "`prompt` must be a string",
            ),
        ];
        for (ep, body, want) in cases {
            let e = p(ep, body.clone()).unwrap_err();
            assert!(e.starts_with(want), "{body}: {e}");
        }
    }
}
