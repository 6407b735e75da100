//! OpenAI-compatible /v1/models and /v1/embeddings.

use super::control::SimControl;
use super::engine::{admit, plan, Ask, Reject};
use super::http::{content_hash, gone, hang_if_faulted, json};
use super::models::KeepAlive;
use super::openai::{bad, openai_request, prompt_of, reject};
use super::text::embedding;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

fn model_obj(name: &str, modified: std::time::SystemTime, context: u32) -> Value {
    let created = modified
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json!({"id": name, "object": "model", "created": created, "owned_by": "library", "max_model_len": context})
}

pub(crate) async fn models(State(ctl): State<Arc<SimControl>>) -> Response {
    ctl.record("/v1/models", 0, "");
    if let Err(r) = hang_if_faulted(&ctl).await {
        return r;
    }
    let reg = ctl.models.lock();
    let data: Vec<Value> = reg
        .entries
        .iter()
        .map(|e| model_obj(&e.spec.name, e.modified_at, e.spec.context))
        .collect();
    json(StatusCode::OK, json!({"object": "list", "data": data}))
}

/// llama.cpp's `GET /props`, as far as a gateway reads it: the slots (`says_seats`).
pub(crate) async fn props(State(ctl): State<Arc<SimControl>>) -> Response {
    ctl.record("/props", 0, "");
    if let Err(r) = hang_if_faulted(&ctl).await {
        return r;
    }
    json(StatusCode::OK, json!({"total_slots": ctl.spec.seats}))
}

pub(crate) async fn model(State(ctl): State<Arc<SimControl>>, Path(id): Path<String>) -> Response {
    ctl.record("/v1/models/{model}", 0, &id);
    if let Err(r) = hang_if_faulted(&ctl).await {
        return r;
    }
    let reg = ctl.models.lock();
    match reg.find(&id) {
        Some(i) => {
            let e = &reg.entries[i];
            json(
                StatusCode::OK,
                model_obj(&e.spec.name, e.modified_at, e.spec.context),
            )
        }
        None => reject(Reject::UnknownModel(id), "model"),
    }
}

#[derive(Deserialize)]
struct EmbReq {
    #[serde(default)]
    model: String,
    input: Option<Value>,
}

pub(crate) async fn embeddings(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    if ctl.spec.embeddings_501 {
        let msg = "This server does not support embeddings. Start it with `--embeddings`";
        return json(
            StatusCode::NOT_IMPLEMENTED,
            json!({"error": {"code": 501, "message": msg, "type": "not_supported_error"}}),
        );
    }
    let (req, started) =
        match openai_request(&ctl, "/v1/embeddings", &body, |r: &EmbReq| &r.model).await {
            Ok(x) => x,
            Err(r) => return r,
        };
    // One entry per input: a string, a token array, or a list of either.
    let items: Vec<Value> = match req.input {
        Some(Value::String(s)) => vec![Value::String(s)],
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            vec![Value::Array(a)]
        }
        Some(Value::Array(a)) if !a.is_empty() => a,
        _ => return bad("'input' is a required property"),
    };
    let mut total = 0u32;
    let mut keys = Vec::with_capacity(items.len());
    for it in &items {
        let flat = match it {
            Value::String(_) => true,
            Value::Array(x) => x.iter().all(Value::is_u64),
            _ => false,
        };
        match prompt_of(it) {
            Some((n, key)) if flat => {
                total = total.saturating_add(n);
                keys.push(key);
            }
            _ => return bad("Invalid type for 'input'"),
        }
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let ask = Ask {
        model: req.model.clone(),
        prompt_tokens: total,
        max_tokens: None,
        hash: content_hash(&req.model, &refs),
        embed: true,
        keep_alive: KeepAlive::Default,
        chain: Vec::new(),
    };
    let p = match plan(&ctl, &ask) {
        Ok(p) => p,
        Err(r) => return reject(r, "input"),
    };
    let Ok(mut gen) = admit(ctl.clone(), p, started).await else {
        return gone();
    };
    let s = gen.finish();
    let seed = ctl.spec.seed;
    let data: Vec<Value> = refs
        .iter()
        .enumerate()
        .map(|(i, k)| json!({"object": "embedding", "index": i, "embedding": embedding(seed ^ content_hash(&req.model, &[k]))}))
        .collect();
    json(
        StatusCode::OK,
        json!({
            "object": "list",
            "data": data,
            "model": req.model,
            "usage": {"prompt_tokens": s.prompt_tokens, "total_tokens": s.prompt_tokens},
        }),
    )
}
