//! Replace the top-level `"model"` value in a JSON body, leaving every other byte as it was.
//!
//! The body is validated with serde_json, then the top-level object is scanned (iteratively,
//! no recursion) for the byte span of each `model` value, which is spliced. Nothing else is
//! re-serialized, so key order, whitespace, number spellings and huge base64 strings survive.

use bytes::Bytes;
use serde::de::IgnoredAny;

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// `b[i]` is `"`: index just past the closing quote.
fn skip_string(b: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    loop {
        match b.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// Index just past the JSON value starting at `b[i]`.
fn skip_value(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => skip_string(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            loop {
                match b.get(j)? {
                    b'"' => {
                        j = skip_string(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
        }
        _ => {
            let mut j = i;
            while !matches!(
                b.get(j),
                None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                j += 1;
            }
            Some(j)
        }
    }
}

/// Byte spans of every top-level `model` value, and the index just past the opening `{`.
fn model_spans(b: &[u8]) -> Option<(usize, Vec<(usize, usize)>)> {
    let open = skip_ws(b, 0);
    if b.get(open) != Some(&b'{') {
        return None;
    }
    let mut spans = Vec::new();
    let mut i = skip_ws(b, open + 1);
    if b.get(i) == Some(&b'}') {
        return Some((open + 1, spans));
    }
    loop {
        let key_end = skip_string(b, i)?;
        // Keys may be escaped (`"mod\u0065l"`): decode rather than compare bytes.
        let key: String = serde_json::from_slice(b.get(i..key_end)?).ok()?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(b, i + 1);
        let end = skip_value(b, start)?;
        if key == "model" {
            spans.push((start, end));
        }
        i = skip_ws(b, end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => return Some((open + 1, spans)),
            _ => return None,
        }
    }
}

/// `body` with its top-level `"model"` set to `model` (added first if absent); every other
/// field is kept verbatim. `None` if `body` is not a valid JSON object.
pub fn rewrite_model(body: &[u8], model: &str) -> Option<Bytes> {
    serde_json::from_slice::<IgnoredAny>(body).ok()?;
    let (after_open, spans) = model_spans(body)?;
    let value = serde_json::to_string(model).ok()?;
    let mut out = Vec::with_capacity(body.len() + value.len() + 10);
    if spans.is_empty() {
        out.extend_from_slice(&body[..after_open]);
        out.extend_from_slice(b"\"model\":");
        out.extend_from_slice(value.as_bytes());
        let rest = &body[after_open..];
        if rest.get(skip_ws(rest, 0)) != Some(&b'}') {
            out.push(b',');
        }
        out.extend_from_slice(rest);
    } else {
        let mut last = 0;
        for (start, end) in spans {
            out.extend_from_slice(body.get(last..start)?);
            out.extend_from_slice(value.as_bytes());
            last = end;
        }
        out.extend_from_slice(body.get(last..)?);
    }
    Some(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn s(b: &Bytes) -> &str {
        std::str::from_utf8(b).unwrap_or("<not utf-8>")
    }

    #[test]
    fn replaces_only_top_level_model_verbatim() {
        let body = r#"{ "stream" : true, "model" : "gpt-4" ,
            "messages":[{"role":"user","content":"say \"model\": {x}","model":"inner"}],
            "temperature": 1.0000000000000001, "seed": 123456789012345678901234567890,
            "z": [1,{"a":"]}"}] }"#;
        let out = rewrite_model(body.as_bytes(), "llama3.1:8b").unwrap();
        assert_eq!(s(&out), body.replacen("\"gpt-4\"", "\"llama3.1:8b\"", 1));
        let mut want: Value = serde_json::from_str(body).unwrap();
        want["model"] = json!("llama3.1:8b");
        assert_eq!(serde_json::from_slice::<Value>(&out).unwrap(), want);
    }

    #[test]
    fn escaped_duplicate_and_non_string_values() {
        let out = rewrite_model(br#"{"mod\u0065l":"a","x":1,"model":"b"}"#, "m").unwrap();
        assert_eq!(
            s(&out),
            r#"{"model":"m","x":1,"model":"m"}"#.replacen("model", "mod\\u0065l", 1)
        );
        let out = rewrite_model(br#"{"model":null,"x":[]}"#, "m").unwrap();
        assert_eq!(s(&out), r#"{"model":"m","x":[]}"#);
        let out = rewrite_model(br#"{"model":{"a":[1,2]}}"#, "m").unwrap();
        assert_eq!(s(&out), r#"{"model":"m"}"#);
        let out = rewrite_model(br#"{"a":1,"model":-1.5e3}"#, "q\"x").unwrap();
        assert_eq!(s(&out), r#"{"a":1,"model":"q\"x"}"#);
    }

    #[test]
    fn inserts_when_absent() {
        assert_eq!(s(&rewrite_model(b"{}", "m").unwrap()), r#"{"model":"m"}"#);
        assert_eq!(
            s(&rewrite_model(b" { \n } ", "m").unwrap()),
            " {\"model\":\"m\" \n } "
        );
        assert_eq!(
            s(&rewrite_model(br#"{"a":1}"#, "m").unwrap()),
            r#"{"model":"m","a":1}"#
        );
    }

    #[test]
    fn rejects_non_objects() {
        for body in [
            &b"[]"[..],
            b"\"model\"",
            b"",
            b"{",
            b"{\"model\":1",
            b"{} {}",
            b"nul",
        ] {
            assert!(
                rewrite_model(body, "m").is_none(),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn deep_nesting_is_scanned_without_recursion() {
        // Valid JSON nested far past serde's recursion limit: validated and scanned iteratively.
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
        let out = rewrite_model(deep.as_bytes(), "m").unwrap();
        assert!(s(&out).starts_with(r#"{"model":"m","a":[[["#));
        assert_eq!(out.len(), deep.len() + r#""model":"m","#.len());
    }

    #[test]
    fn big_body() {
        let blob = "A".repeat(2 << 20);
        let body = json!({"model":"x","images":[blob],"prompt":"p"}).to_string();
        let out = rewrite_model(body.as_bytes(), "llava:13b").unwrap();
        assert_eq!(out.len(), body.len() + "llava:13b".len() - 1);
    }
}
