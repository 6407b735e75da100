//! Simulated inference node: Ollama, OpenAI and Anthropic APIs with load/latency physics.
//!
//! One node serves all three protocols on one port. Physics: at most `seats` requests hold a
//! seat (load, time to first token, decode) at once, the rest wait FIFO; a request on an
//! unloaded model pays `cold_load_ms` (shared by concurrent requests), LRU models are evicted
//! when memory runs short; output text is deterministic from the seed and the request content.
//! Tests drive timing with [`SimControl`] gates instead of sleeping.
//!
//! Endpoints: Ollama `/`, `/api/{version,tags,ps,show,pull,chat,generate,embed,embeddings}`;
//! OpenAI `/v1/models[/{id}]`, `/v1/{chat/completions,completions,embeddings}`; Anthropic
//! `/v1/messages`; `/health`. Every request (any path) is counted in [`SimStats`].
//!
//! Conventions worth knowing:
//! - prompt tokens = ceil(chars/4) per text, +4 per chat message; one word = one output token =
//!   one stream chunk; output = `reply_tokens` capped by the request's max tokens
//!   (`max_tokens`/`max_completion_tokens`, Ollama `options.num_predict`), finish `length` if capped.
//! - Text depends on the node seed, the model name as requested, and the prompt content (not on
//!   arrival order), so identical requests get identical replies.
//! - Pacing: seat (FIFO) → cold load if needed → `ttft_ms` + uncached prompt tokens /
//!   `prefill_tokens_per_sec` (at most `prefill_parallel` prompts at once when set, the
//!   others wait their turn FIFO, in `prompt_eval_duration`) → first-token gate → first token, then one token every
//!   `1/tokens_per_sec`, slowed to `tokens_per_sec / (1 + decode_contention × (n − 1))` while
//!   `n` requests decode at once; both rates times the model's `speed` (default 1: every model
//!   at the node's rates; a 70b beside an 8b might be 0.12). [`SimControl::set_slowdown`]
//!   stretches ttft, prefill and decode at run time. Headers are sent with the first token.
//! - Prefix cache (`prefix_cache_entries` > 0): an LRU of processed prompts per model, as
//!   cumulative hashes per chat message (raw prompts: per 1024-char block); the longest
//!   matching leading run is not prefilled. A (re)load of the model empties its part.
//!   Usage tells it as the real servers do: Ollama `prompt_eval_count` counts only the
//!   prefilled tokens (with `ollama_cached_count`, as newer releases: all of them, with
//!   `prompt_eval_cached_count`), OpenAI `usage.prompt_tokens` all of them with
//!   `prompt_tokens_details.cached_tokens`, Anthropic `input_tokens` the uncached ones with
//!   `cache_read_input_tokens`. Counters in [`SimStats`].
//! - `/api/pull` accepts any name and adds a 4 GB model (an embedding model if the name contains
//!   "embed"); names are matched with Ollama's implied `:latest` tag.
//! - `keep_alive` is honoured for `0` (unload after the request) and shown in `/api/ps`
//!   `expires_at`; models never expire on a timer.
//! - Faults: `Hang` applies to every path (requests are read, counted, never answered, until
//!   the node cuts connections); `Status500` to inference paths only; `Refuse` also cuts open
//!   connections; `DieMidStream` on a non-streaming request cuts the connection before any body;
//!   `CutChunked` / `CutLength` send half a non-streaming JSON reply (chunked, or under its full
//!   Content-Length) then cut; `SlowFirstByte(ms)` delays inference requests; `Flap(ms)` closes
//!   and re-opens the listener every `ms`. `POST /_sim/fault` sets them at run time
//!   (`fault_api.rs`).

mod anthropic;
mod control;
mod engine;
mod fault_api;
mod http;
mod models;
mod net;
mod ollama;
mod ollama_admin;
mod openai;
mod openai_extra;
mod prefix;
mod spec;
mod stream;
mod text;

pub use control::{Fault, SimControl, SimStats};
pub use spec::{SimModel, SimSpec};

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::net::SocketAddr;

use crate::routing::Family;
use std::sync::Arc;

/// Largest request body the node accepts.
pub const MAX_BODY: usize = 64 << 20;

/// A running sim node.
pub struct SimHandle {
    addr: SocketAddr,
    control: Arc<SimControl>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl SimHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn control(&self) -> Arc<SimControl> {
        self.control.clone()
    }

    /// Stop serving: close the port, cut open connections, end the server task.
    pub async fn shutdown(mut self) {
        self.control.slot.stop();
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.control.slot.stop();
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn fallback(State(ctl): State<Arc<SimControl>>, uri: Uri) -> Response {
    ctl.record(uri.path(), 0, "");
    if let Err(r) = http::hang_if_faulted(&ctl).await {
        return r;
    }
    (StatusCode::NOT_FOUND, "404 page not found").into_response()
}

async fn health(State(ctl): State<Arc<SimControl>>) -> Response {
    ctl.record("/health", 0, "");
    if let Err(r) = http::hang_if_faulted(&ctl).await {
        return r;
    }
    StatusCode::OK.into_response()
}

/// The API families a sim node serves (all of them unless restricted with [`start_serving`]).
pub const ALL_APIS: [Family; 3] = [Family::OpenAI, Family::Ollama, Family::Anthropic];

fn router(ctl: Arc<SimControl>, serves: &[Family]) -> Router {
    let mut r = Router::new()
        .route("/health", get(health))
        .route("/_sim/fault", get(fault_api::get).post(fault_api::set));
    if serves.contains(&Family::Ollama) {
        r = r
            .route("/", get(ollama_admin::root))
            .route("/api/version", get(ollama_admin::version))
            .route("/api/tags", get(ollama_admin::tags))
            .route("/api/ps", get(ollama_admin::ps))
            .route("/api/show", post(ollama_admin::show))
            .route("/api/pull", post(ollama_admin::pull))
            .route("/api/embed", post(ollama_admin::embed))
            .route("/api/embeddings", post(ollama_admin::embeddings))
            .route("/api/chat", post(ollama::chat))
            .route("/api/generate", post(ollama::generate));
    }
    if serves.contains(&Family::OpenAI) {
        r = r
            .route("/v1/models", get(openai_extra::models))
            .route("/v1/models/{*model}", get(openai_extra::model))
            .route("/v1/chat/completions", post(openai::chat))
            .route("/v1/completions", post(openai::completions))
            .route("/v1/embeddings", post(openai_extra::embeddings));
    }
    if serves.contains(&Family::Anthropic) {
        r = r.route("/v1/messages", post(anthropic::messages));
    }
    if ctl.spec.says_seats {
        r = r.route("/props", get(openai_extra::props));
    }
    r.fallback(fallback)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(ctl)
}

/// Start a sim node on an already-bound std listener. Must be called inside a tokio runtime.
pub async fn start(spec: SimSpec, listener: std::net::TcpListener) -> std::io::Result<SimHandle> {
    start_serving(spec, listener, &ALL_APIS).await
}

/// [`start`], serving only the endpoints of `serves` (others answer 404, as a llama.cpp
/// server answers `/api/chat`): a node that speaks one protocol, for translation tests.
pub async fn start_serving(
    spec: SimSpec,
    listener: std::net::TcpListener,
    serves: &[Family],
) -> std::io::Result<SimHandle> {
    spec.validate()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let slot = Arc::new(net::ListenSlot::new(listener)?);
    let addr = slot.addr();
    let control = Arc::new(SimControl::new(spec, slot.clone()));
    let app = router(control.clone(), serves);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(net::SimListener::new(slot), app).await {
            log::warn!("sim {addr}: server ended: {e}");
        }
    });
    Ok(SimHandle {
        addr,
        control,
        task: Some(task),
    })
}

/// Bind `addr` and start.
pub async fn start_on(spec: SimSpec, addr: SocketAddr) -> std::io::Result<SimHandle> {
    let l = std::net::TcpListener::bind(addr)?;
    start(spec, l).await
}

/// Start each node and serve until ctrl-c or SIGTERM (`fleetgate sim`).
pub async fn run_cli(specs: Vec<(String, SocketAddr, SimSpec)>) -> anyhow::Result<()> {
    let mut handles = Vec::with_capacity(specs.len());
    for (id, addr, spec) in specs {
        let h = start_on(spec, addr)
            .await
            .map_err(|e| anyhow::anyhow!("sim node '{id}' on {addr}: {e}"))?;
        log::info!("sim node '{id}' listening on {}", h.addr());
        handles.push(h);
    }
    wait_for_signal().await?;
    log::info!("sim: stopping {} node(s)", handles.len());
    for h in handles {
        h.shutdown().await;
    }
    Ok(())
}

#[cfg(unix)]
async fn wait_for_signal() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}

#[cfg(not(unix))]
async fn wait_for_signal() -> anyhow::Result<()> {
    tokio::signal::ctrl_c().await?;
    Ok(())
}
