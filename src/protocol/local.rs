//! Bodies for the endpoints the gateway answers itself, aggregated over the fleet.

use bytes::Bytes;
use serde_json::{json, Value};

use super::ErrorCode;

/// One model as the fleet offers it (aggregated by the caller over all nodes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelInfo {
    pub name: String,
    pub size_bytes: u64,
    pub context_length: u32,
    pub loaded: bool,
    pub resident_bytes: u64,
    pub nodes: Vec<String>,
    pub embedding: bool,
}

/// No clock here: timestamps Ollama clients require but we cannot know.
const MODIFIED_AT: &str = "1970-01-01T00:00:00Z";
/// Loaded models stay as long as their node keeps them; we do not know until when.
const EXPIRES_AT: &str = "9999-12-31T23:59:59Z";
/// `general.architecture` we report; `<arch>.context_length` carries the context.
const ARCH: &str = "fleetgate";

fn to_bytes(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap_or_default())
}

/// A stable 64-hex-digit pseudo digest of the model name (FNV-1a, four lanes).
fn digest(name: &str) -> String {
    let mut out = String::with_capacity(64);
    for lane in 0u64..4 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ lane.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for b in name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out
}

fn details() -> Value {
    json!({
        "parent_model": "",
        "format": "gguf",
        "family": "",
        "families": null,
        "parameter_size": "",
        "quantization_level": "",
    })
}

/// GET /v1/models
pub fn openai_models(models: &[ModelInfo], created: u64) -> Bytes {
    let data: Vec<Value> = models
        .iter()
        .map(|m| json!({"id": m.name, "object": "model", "created": created, "owned_by": "fleetgate"}))
        .collect();
    to_bytes(&json!({"object": "list", "data": data}))
}

/// GET /api/tags
pub fn ollama_tags(models: &[ModelInfo]) -> Bytes {
    let list: Vec<Value> = models
        .iter()
        .map(|m| {
            json!({
                "name": m.name,
                "model": m.name,
                "modified_at": MODIFIED_AT,
                "size": m.size_bytes,
                "digest": digest(&m.name),
                "details": details(),
            })
        })
        .collect();
    to_bytes(&json!({"models": list}))
}

/// GET /api/ps: loaded models only.
pub fn ollama_ps(models: &[ModelInfo]) -> Bytes {
    let list: Vec<Value> = models
        .iter()
        .filter(|m| m.loaded)
        .map(|m| {
            let size = if m.resident_bytes > 0 {
                m.resident_bytes
            } else {
                m.size_bytes
            };
            json!({
                "name": m.name,
                "model": m.name,
                "size": size,
                "digest": digest(&m.name),
                "details": details(),
                "expires_at": EXPIRES_AT,
                "size_vram": m.resident_bytes,
                "context_length": m.context_length,
            })
        })
        .collect();
    to_bytes(&json!({"models": list}))
}

/// GET /api/version
pub fn ollama_version(version: &str) -> Bytes {
    to_bytes(&json!({"version": version}))
}

/// Ollama's implicit `:latest` tag: `llama3` and `llama3:latest` name the same model.
fn same_model(asked: &str, have: &str) -> bool {
    let norm = |s: &str| -> String {
        if s.contains(':') {
            s.to_owned()
        } else {
            format!("{s}:latest")
        }
    };
    asked == have || norm(asked) == norm(have)
}

/// POST /api/show: body `{"model": ...}` (or the older `{"name": ...}`).
pub fn ollama_show(body: &[u8], models: &[ModelInfo]) -> Result<Bytes, (ErrorCode, String)> {
    let invalid = |m: String| (ErrorCode::InvalidRequest, m);
    let v: Value =
        serde_json::from_slice(body).map_err(|e| invalid(format!("invalid JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| invalid("request body must be a JSON object".into()))?;
    let asked = match obj
        .get("model")
        .filter(|v| !v.is_null())
        .or(obj.get("name"))
    {
        Some(Value::String(s)) if !s.trim().is_empty() => s.as_str(),
        None | Some(Value::Null) => return Err(invalid("missing field `model`".into())),
        Some(_) => return Err(invalid("`model` must be a non-empty string".into())),
    };
    let m = models
        .iter()
        .find(|m| m.name == asked)
        .or_else(|| models.iter().find(|m| same_model(asked, &m.name)))
        .ok_or_else(|| {
            (
                ErrorCode::ModelNotFound,
                format!("model '{asked}' not found"),
            )
        })?;
    let capabilities = if m.embedding {
        ["embedding"]
    } else {
        ["completion"]
    };
    Ok(to_bytes(&json!({
        "modelfile": format!("# served by fleetgate\nFROM {}\n", m.name),
        "parameters": format!("num_ctx {}", m.context_length),
        "template": "",
        "details": details(),
        "model_info": {
            "general.architecture": ARCH,
            format!("{ARCH}.context_length"): m.context_length,
        },
        "capabilities": capabilities,
        "modified_at": MODIFIED_AT,
        "fleetgate": {"nodes": m.nodes, "loaded": m.loaded, "size": m.size_bytes},
    })))
}

/// POST /v1/messages/count_tokens
pub fn count_tokens_body(tokens: u32) -> Bytes {
    to_bytes(&json!({"input_tokens": tokens}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet() -> Vec<ModelInfo> {
        vec![
            ModelInfo {
                name: "llama3.1:8b".into(),
                size_bytes: 4_900_000_000,
                context_length: 131072,
                loaded: true,
                resident_bytes: 6_000_000_000,
                nodes: vec!["gpu1".into(), "gpu2".into()],
                embedding: false,
            },
            ModelInfo {
                name: "nomic-embed-text:latest".into(),
                size_bytes: 274_000_000,
                context_length: 8192,
                embedding: true,
                nodes: vec!["cpu1".into()],
                ..ModelInfo::default()
            },
        ]
    }

    fn v(b: &[u8]) -> Value {
        serde_json::from_slice(b).expect("valid JSON")
    }

    #[test]
    fn models_list() {
        let got = v(&openai_models(&fleet(), 1_700_000_000));
        assert_eq!(got["object"], "list");
        assert_eq!(
            got["data"][0],
            json!({"id":"llama3.1:8b","object":"model","created":1_700_000_000u64,"owned_by":"fleetgate"})
        );
        assert_eq!(got["data"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            v(&openai_models(&[], 0)),
            json!({"object":"list","data":[]})
        );
    }

    #[test]
    fn tags_and_ps() {
        let tags = v(&ollama_tags(&fleet()));
        let t0 = &tags["models"][0];
        assert_eq!(
            (t0["name"].as_str(), t0["model"].as_str()),
            (Some("llama3.1:8b"), Some("llama3.1:8b"))
        );
        assert_eq!(t0["size"], 4_900_000_000u64);
        assert_eq!(t0["details"]["format"], "gguf");
        let d = t0["digest"].as_str().unwrap_or_default();
        assert!(
            d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()),
            "{d}"
        );
        assert_ne!(Some(d), tags["models"][1]["digest"].as_str());

        let ps = v(&ollama_ps(&fleet()));
        let list = ps["models"].as_array().cloned().unwrap_or_default();
        assert_eq!(list.len(), 1, "only loaded models");
        assert_eq!(list[0]["name"], "llama3.1:8b");
        assert_eq!(list[0]["size_vram"], 6_000_000_000u64);
        assert_eq!(list[0]["size"], 6_000_000_000u64);
        assert_eq!(list[0]["context_length"], 131072);
        assert!(list[0]["expires_at"].is_string());
    }

    #[test]
    fn version_and_count_tokens() {
        assert_eq!(v(&ollama_version("0.1.0")), json!({"version":"0.1.0"}));
        assert_eq!(v(&count_tokens_body(42)), json!({"input_tokens":42}));
    }

    #[test]
    fn show() {
        let f = fleet();
        let got = v(&ollama_show(br#"{"model":"llama3.1:8b"}"#, &f).unwrap());
        assert_eq!(got["model_info"]["general.architecture"], "fleetgate");
        assert_eq!(got["model_info"]["fleetgate.context_length"], 131072);
        assert_eq!(got["capabilities"], json!(["completion"]));
        assert_eq!(got["fleetgate"]["nodes"], json!(["gpu1", "gpu2"]));
        // Older clients send "name"; the implicit ":latest" tag resolves.
        let got = v(&ollama_show(br#"{"name":"nomic-embed-text"}"#, &f).unwrap());
        assert_eq!(got["capabilities"], json!(["embedding"]));

        let cases: [(&[u8], ErrorCode, &str); 5] = [
            (
                br#"{"model":"nope"}"#,
                ErrorCode::ModelNotFound,
                "model 'nope' not found",
            ),
            (
                br#"{"model":"llama3.1"}"#,
                ErrorCode::ModelNotFound,
                "model 'llama3.1' not found",
            ),
            (b"{}", ErrorCode::InvalidRequest, "missing field `model`"),
            (
                b"[1]",
                ErrorCode::InvalidRequest,
                "request body must be a JSON object",
            ),
            (
                br#"{"model":5}"#,
                ErrorCode::InvalidRequest,
                "`model` must be a non-empty string",
            ),
        ];
        for (body, code, msg) in cases {
            assert_eq!(ollama_show(body, &f), Err((code, msg.to_owned())));
        }
        let (code, msg) = ollama_show(b"{", &f).unwrap_err();
        assert!(code == ErrorCode::InvalidRequest && msg.starts_with("invalid JSON"));
    }
}
