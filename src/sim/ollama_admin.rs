//! Ollama catalogue and embedding endpoints: tags, ps, version, show, pull, embed, embeddings.

use super::control::SimControl;
use super::engine::Summary;
use super::engine::{admit, plan, Ask, Reject};
use super::http::{
    content_hash, gone, hang_if_faulted, intake, json, streaming, typed, Intake, NDJSON,
};
use super::models::PULLED_SIZE_GB;
use super::ollama::{err, not_found, ollama_request};
use super::text::{digest, embedding, est_tokens};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// Version reported by `/api/version`.
pub const OLLAMA_VERSION: &str = "0.6.8";

pub(crate) async fn root(State(ctl): State<Arc<SimControl>>) -> Response {
    ctl.record("/", 0, "");
    if let Err(r) = hang_if_faulted(&ctl).await {
        return r;
    }
    "Ollama is running".into_response()
}

pub(crate) async fn tags(State(ctl): State<Arc<SimControl>>) -> Response {
    ctl.record("/api/tags", 0, "");
    if let Err(r) = hang_if_faulted(&ctl).await {
        return r;
    }
    let v = ctl.models.lock().tags_json();
    json(StatusCode::OK, v)
}

pub(crate) async fn ps(State(ctl): State<Arc<SimControl>>) -> Response {
    ctl.record("/api/ps", 0, "");
    if let Err(r) = hang_if_faulted(&ctl).await {
        return r;
    }
    let v = ctl.models.lock().ps_json();
    json(StatusCode::OK, v)
}

pub(crate) async fn version(State(ctl): State<Arc<SimControl>>) -> Response {
    ctl.record("/api/version", 0, "");
    if let Err(r) = hang_if_faulted(&ctl).await {
        return r;
    }
    json(StatusCode::OK, json!({ "version": OLLAMA_VERSION }))
}

#[derive(Deserialize)]
struct NameReq {
    #[serde(default)]
    model: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    stream: Option<bool>,
}

impl NameReq {
    fn model(&self) -> &str {
        if self.model.is_empty() {
            &self.name
        } else {
            &self.model
        }
    }
}

/// Parse a request naming a model; the error is the 400 message.
fn name_req(v: &Result<Value, String>) -> Result<NameReq, String> {
    let r: NameReq = typed(v)?;
    if r.model().is_empty() {
        return Err("model is required".into());
    }
    Ok(r)
}

pub(crate) async fn show(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    let Intake { json: v, .. } = match intake(&ctl, "/api/show", &body).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let req = match name_req(&v) {
        Ok(r) => r,
        Err(e) => return err(StatusCode::BAD_REQUEST, &e),
    };
    let reg = ctl.models.lock();
    match reg.find(req.model()) {
        Some(i) => json(StatusCode::OK, reg.show_json(i)),
        None => not_found(req.model()),
    }
}

/// Any name is accepted and added to disk as a 4 GB model (names containing "embed" become
/// embedding models); pulling a model already on disk just refreshes its modified_at.
pub(crate) async fn pull(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    let Intake { json: v, .. } = match intake(&ctl, "/api/pull", &body).await {
        Ok(i) => i,
        Err(r) => return r,
    };
    let req = match name_req(&v) {
        Ok(r) => r,
        Err(e) => return err(StatusCode::BAD_REQUEST, &e),
    };
    let size = {
        let mut reg = ctl.models.lock();
        let i = reg.add(req.model(), PULLED_SIZE_GB);
        (reg.entries[i].spec.size_gb * 1e9) as u64
    };
    if !req.stream.unwrap_or(true) {
        return json(StatusCode::OK, json!({"status": "success"}));
    }
    let d = format!("sha256:{}", digest(req.model()));
    let lines = [
        json!({"status": "pulling manifest"}),
        json!({"status": format!("pulling {}", &d[7..19]), "digest": d, "total": size}),
        json!({"status": format!("pulling {}", &d[7..19]), "digest": d, "total": size, "completed": size}),
        json!({"status": "verifying sha256 digest"}),
        json!({"status": "writing manifest"}),
        json!({"status": "success"}),
    ];
    let chunks: Vec<std::io::Result<Bytes>> = lines
        .iter()
        .map(|l| Ok(Bytes::from(format!("{l}\n"))))
        .collect();
    streaming(NDJSON, futures::stream::iter(chunks))
}

#[derive(Deserialize)]
struct EmbedReq {
    #[serde(default)]
    model: String,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    keep_alive: Option<Value>,
}

/// `/api/embed` (batch, `embeddings`) and legacy `/api/embeddings` (`prompt` → `embedding`).
async fn embed_common(
    ctl: Arc<SimControl>,
    path: &'static str,
    body: Bytes,
    legacy: bool,
) -> Response {
    fn fields(r: &EmbedReq) -> (&str, Option<&Value>) {
        (r.model.as_str(), r.keep_alive.as_ref())
    }
    let (req, keep, started) = match ollama_request(&ctl, path, &body, fields).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let inputs: Vec<String> = if legacy {
        req.prompt.into_iter().filter(|p| !p.is_empty()).collect()
    } else {
        match req.input {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s],
            Some(Value::Array(a)) => {
                let mut out = Vec::with_capacity(a.len());
                for x in a {
                    match x {
                        Value::String(s) => out.push(s),
                        _ => return err(StatusCode::BAD_REQUEST, "invalid input type"),
                    }
                }
                out
            }
            Some(_) => return err(StatusCode::BAD_REQUEST, "invalid input type"),
        }
    };
    let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    let ask = Ask {
        model: req.model.clone(),
        prompt_tokens: refs
            .iter()
            .map(|s| est_tokens(s))
            .fold(0, u32::saturating_add),
        max_tokens: None,
        hash: content_hash(&req.model, &refs),
        embed: true,
        keep_alive: keep,
        chain: Vec::new(),
    };
    let p = match plan(&ctl, &ask) {
        Ok(p) => p,
        Err(Reject::UnknownModel(m)) => return not_found(&m),
        Err(_) => return err(StatusCode::BAD_REQUEST, "invalid embedding request"),
    };
    let Ok(mut gen) = admit(ctl.clone(), p, started).await else {
        return gone();
    };
    let s = gen.finish();
    let seed = ctl.spec.seed;
    let vecs: Vec<Vec<f32>> = refs
        .iter()
        .map(|t| embedding(seed ^ content_hash(&req.model, &[t])))
        .collect();
    if legacy {
        let e = vecs.into_iter().next().unwrap_or_default();
        return json(StatusCode::OK, json!({ "embedding": e }));
    }
    json(
        StatusCode::OK,
        json!({
            "model": req.model,
            "embeddings": vecs,
            "total_duration": Summary::ns(s.total),
            "load_duration": Summary::ns(s.load),
            "prompt_eval_count": s.prompt_tokens,
        }),
    )
}

pub(crate) async fn embed(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    embed_common(ctl, "/api/embed", body, false).await
}

pub(crate) async fn embeddings(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    embed_common(ctl, "/api/embeddings", body, true).await
}
