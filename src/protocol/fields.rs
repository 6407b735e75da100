//! Typed access to request-body fields, with errors that name the field.

use serde_json::{Map, Value};

use super::{ParseError, ParsedRequest};

pub(super) type Obj = Map<String, Value>;

/// Parse `body` as a JSON object.
pub(super) fn object(body: &[u8]) -> Result<Obj, ParseError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ParseError::new("request body must be a JSON object")),
        Err(e) => Err(ParseError::new(format!("invalid JSON: {e}"))),
    }
}

/// `obj[key]`, treating an explicit `null` as absent.
pub(super) fn get<'a>(obj: &'a Obj, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn wrong(path: &str, what: &str) -> ParseError {
    ParseError::new(format!("`{path}` must be {what}"))
}

/// Characters in `s` (not bytes: multi-byte scripts are not over-counted).
pub(super) fn chars(s: &str) -> usize {
    s.chars().count()
}

/// Characters of `v` serialized as compact JSON.
pub(super) fn json_chars<T: serde::Serialize + ?Sized>(v: &T) -> usize {
    let mut count = JsonText::default();
    serde_json::to_writer(&mut count, v).map_or(0, |()| count.chars)
}

/// A sink for serialized JSON that counts its characters and feeds its bytes to `hasher`, if
/// any: sizing and hashing a large value (a tools list) without building its text.
#[derive(Default)]
pub(super) struct JsonText<'h> {
    pub chars: usize,
    pub hasher: Option<&'h mut xxhash_rust::xxh3::Xxh3>,
}

impl std::io::Write for JsonText<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Every byte but a UTF-8 continuation byte starts a character.
        self.chars += buf.iter().filter(|b| (**b & 0xC0) != 0x80).count();
        if let Some(h) = self.hasher.as_deref_mut() {
            h.update(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A model name with a control character (a newline, NUL, ESC ...) names nothing a node has;
/// it is refused at intake rather than sent to a node.
fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// The required, non-empty `model` string.
pub(super) fn model(obj: &Obj) -> Result<String, ParseError> {
    match get(obj, "model") {
        None => Err(ParseError::new("missing field `model`")),
        Some(Value::String(s)) if s.trim().is_empty() => Err(wrong("model", "a non-empty string")),
        Some(Value::String(s)) if has_control(s) => {
            Err(wrong("model", "a model name without control characters"))
        }
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(wrong("model", "a string")),
    }
}

/// Optional boolean `key`, `default` when absent.
pub(super) fn bool_or(obj: &Obj, key: &str, default: bool) -> Result<bool, ParseError> {
    match get(obj, key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(wrong(key, "a boolean")),
    }
}

/// Optional string `key` at `path`.
pub(super) fn opt_str<'a>(
    obj: &'a Obj,
    key: &str,
    path: &str,
) -> Result<Option<&'a str>, ParseError> {
    match get(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(wrong(path, "a string")),
    }
}

/// Optional array `key` at `path`.
pub(super) fn opt_array<'a>(
    obj: &'a Obj,
    key: &str,
    path: &str,
) -> Result<Option<&'a Vec<Value>>, ParseError> {
    match get(obj, key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(_) => Err(wrong(path, "an array")),
    }
}

/// Required array `key`.
pub(super) fn req_array<'a>(obj: &'a Obj, key: &str) -> Result<&'a Vec<Value>, ParseError> {
    opt_array(obj, key, key)?.ok_or_else(|| ParseError::new(format!("missing field `{key}`")))
}

/// `v` as an object, or an error naming `path`.
pub(super) fn as_obj<'a>(v: &'a Value, path: &str) -> Result<&'a Obj, ParseError> {
    v.as_object().ok_or_else(|| wrong(path, "an object"))
}

/// A token count: non-negative integer (an integral float is tolerated), saturating at u32::MAX.
pub(super) fn count(v: &Value, path: &str) -> Result<u32, ParseError> {
    let bad = || wrong(path, "a non-negative integer");
    if let Some(u) = v.as_u64() {
        return Ok(u32::try_from(u).unwrap_or(u32::MAX));
    }
    match v.as_f64() {
        Some(f) if f >= 0.0 && f.fract() == 0.0 => Ok(if f >= u32::MAX as f64 {
            u32::MAX
        } else {
            f as u32
        }),
        _ => Err(bad()),
    }
}

/// Optional token count `key`.
pub(super) fn opt_count(obj: &Obj, key: &str) -> Result<Option<u32>, ParseError> {
    get(obj, key).map(|v| count(v, key)).transpose()
}

/// The optional non-standard `fallback_models` array of model names.
pub(super) fn fallback_models(obj: &Obj) -> Result<Vec<String>, ParseError> {
    let Some(arr) = opt_array(obj, "fallback_models", "fallback_models")? else {
        return Ok(Vec::new());
    };
    arr.iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) if !s.trim().is_empty() && !has_control(s) => Ok(s.clone()),
            _ => Err(wrong(
                &format!("fallback_models[{i}]"),
                "a non-empty model name without control characters",
            )),
        })
        .collect()
}

/// Running totals while walking a body.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub chars: usize,
    pub images: u32,
    pub token_ids: u32,
    pub tools: bool,
}

impl Tally {
    pub fn text(&mut self, s: &str) {
        self.chars = self.chars.saturating_add(chars(s));
    }

    pub fn json(&mut self, v: &Value) {
        self.chars = self.chars.saturating_add(json_chars(v));
    }

    pub fn image(&mut self) {
        self.images = self.images.saturating_add(1);
    }

    pub fn tokens(&mut self, n: usize) {
        self.token_ids = self
            .token_ids
            .saturating_add(u32::try_from(n).unwrap_or(u32::MAX));
    }

    /// A tools declaration at `key`: must be an array; non-empty counts as tools and its
    /// serialized JSON as prompt text.
    pub fn tools_field(&mut self, obj: &Obj, key: &str) -> Result<(), ParseError> {
        if let Some(arr) = opt_array(obj, key, key)? {
            if !arr.is_empty() {
                self.tools = true;
                self.chars = self.chars.saturating_add(json_chars(arr));
            }
        }
        Ok(())
    }

    /// A string, an array of strings, an array of token ids or an array of token-id arrays
    /// (OpenAI `prompt`/`input`; Ollama `input` accepts the string forms).
    pub fn text_or_tokens(
        &mut self,
        v: &Value,
        path: &str,
        tokens_ok: bool,
    ) -> Result<(), ParseError> {
        let what = if tokens_ok {
            "a string, an array of strings or an array of token ids"
        } else {
            "a string or an array of strings"
        };
        match v {
            Value::Null => Ok(()),
            Value::String(s) => {
                self.text(s);
                Ok(())
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) => self.text(s),
                        Value::Number(_) if tokens_ok => self.tokens(1),
                        Value::Array(ids) if tokens_ok && ids.iter().all(Value::is_number) => {
                            self.tokens(ids.len())
                        }
                        _ => return Err(wrong(&format!("{path}[{i}]"), what)),
                    }
                }
                Ok(())
            }
            _ => Err(wrong(path, what)),
        }
    }

    pub fn finish(
        self,
        model: String,
        messages: usize,
        max_tokens: Option<u32>,
        stream: bool,
        fallback_models: Vec<String>,
    ) -> ParsedRequest {
        ParsedRequest {
            model,
            prompt_chars: self.chars,
            messages: u32::try_from(messages).unwrap_or(u32::MAX),
            images: self.images,
            tools: self.tools,
            max_tokens,
            stream,
            fallback_models,
            token_ids: self.token_ids,
            prefix: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Obj {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn counts() {
        let cases = [
            (json!(0), Ok(0)),
            (json!(4096), Ok(4096)),
            (json!(1u64 << 40), Ok(u32::MAX)),
            (json!(512.0), Ok(512)),
            (json!(1e300), Ok(u32::MAX)),
            (json!(-1), Err(())),
            (json!(1.5), Err(())),
            (json!("100"), Err(())),
            (json!(true), Err(())),
        ];
        for (v, want) in cases {
            assert_eq!(count(&v, "max_tokens").map_err(|_| ()), want, "{v}");
        }
        let e = count(&json!("x"), "max_tokens").unwrap_err();
        assert_eq!(e.message, "`max_tokens` must be a non-negative integer");
    }

    #[test]
    fn model_and_fallbacks() {
        assert_eq!(model(&obj(json!({"model":"m"}))).unwrap(), "m");
        assert_eq!(
            model(&obj(json!({"model":null}))).unwrap_err().message,
            "missing field `model`"
        );
        assert!(model(&obj(json!({"model":"  "}))).is_err());
        for bad in ["m\n", "m\u{0}x", "\u{1b}[31mm", "m\u{7f}"] {
            let e = model(&obj(json!({ "model": bad }))).unwrap_err().message;
            assert!(e.contains("control characters"), "{bad:?}: {e}");
            let e = fallback_models(&obj(json!({ "fallback_models": ["ok", bad] })))
                .unwrap_err()
                .message;
            assert!(e.contains("fallback_models[1]"), "{bad:?}: {e}");
        }
        let o = obj(json!({"fallback_models":["a","b"]}));
        assert_eq!(fallback_models(&o).unwrap(), ["a", "b"]);
        assert!(fallback_models(&obj(json!({}))).unwrap().is_empty());
        assert!(fallback_models(&obj(json!({"fallback_models":null})))
            .unwrap()
            .is_empty());
        let e = fallback_models(&obj(json!({"fallback_models":"a"}))).unwrap_err();
        assert_eq!(e.message, "`fallback_models` must be an array");
        let e = fallback_models(&obj(json!({"fallback_models":["a",3]}))).unwrap_err();
        assert_eq!(
            e.message,
            "`fallback_models[1]` must be a non-empty model name without control characters"
        );
    }

    #[test]
    fn chars_not_bytes() {
        let mut t = Tally::default();
        t.text("héllo 日本");
        assert_eq!(t.chars, 8);
    }
}
