//! Health poller: asks each node's backend what it has, every `health.poll_interval`, one file
//! per backend kind (Ollama `/api/tags` + `/api/ps`; OpenAI-style `/v1/models`, and once
//! whether the server says its seats, `probe::seats`; vLLM adds `/metrics`; llama.cpp adds
//! `/props` + `/slots`), and feeds the fleet state. A node that fails `failures_before_offline`
//! polls in a row is offline; when it answers again it is in warmup.
//!
//! Pingora's `pingora-load-balancing` health checks were considered: their `HealthCheck::check`
//! returns only up/down, while routing needs what the backend reports (models, sizes, context,
//! queue depth), so the poll itself is ours; the consecutive-failure threshold is the same idea.

mod llamacpp;
mod ollama;
mod openai;
mod probe;
mod vllm;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use serde::Deserialize;

use super::now_ms;
use crate::config::Backend;
use crate::fleet::{Fleet, LiveModel, PollReport};

const GB: f64 = 1_000_000_000.0;

/// What one backend answered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackendPoll {
    pub models: Vec<LiveModel>,
    /// Parallel slots the backend reports (llama.cpp `total_slots`).
    pub seats: Option<u32>,
}

pub struct HealthPoller {
    fleet: Arc<Fleet>,
    client: reqwest::Client,
}

/// The HTTP client polls use (timeout `health.poll_timeout`).
pub fn poll_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .pool_idle_timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default()
}

impl HealthPoller {
    pub fn new(fleet: Arc<Fleet>) -> HealthPoller {
        let client = poll_client(fleet.config().health.poll_timeout);
        HealthPoller { fleet, client }
    }

    /// Poll node `idx` once and apply the result; true when routing-relevant state changed.
    pub async fn poll_one(&self, idx: usize) -> bool {
        poll_and_apply(&self.fleet, &self.client, idx).await
    }

    /// Poll every node once, concurrently; returns how many changed.
    pub async fn poll_all(&self) -> usize {
        let polls = (0..self.fleet.len()).map(|idx| self.poll_one(idx));
        futures::future::join_all(polls)
            .await
            .into_iter()
            .filter(|c| *c)
            .count()
    }
}

/// Poll node `idx` of `fleet` and apply the report.
pub async fn poll_and_apply(fleet: &Fleet, client: &reqwest::Client, idx: usize) -> bool {
    let cfg = fleet.node_config(idx);
    let polled = poll_backend(client, cfg.backend, cfg.addr).await;
    let said = match &polled {
        Ok(_) if cfg.backend == Backend::Openai => said_seats(fleet, client, idx).await,
        _ => None,
    };
    let report = match polled {
        Ok(p) => PollReport::Ok {
            models: p.models,
            seats: p.seats.or(said),
            now_ms: now_ms(),
        },
        Err(error) => {
            log::debug!("poll {}: {error}", cfg.id);
            PollReport::Failed { error }
        }
    };
    let probe = matches!(report, PollReport::Ok { .. })
        && !cfg.protocols_fixed
        && fleet.node(idx).live.lock().probed_families.is_none();
    if probe {
        let families = probe::families(client, cfg.backend, cfg.addr).await;
        log::info!("node {}: speaks {families:?}", cfg.id);
        fleet.node(idx).live.lock().probed_families = Some(families);
    }
    let threshold = fleet.config().health.failures_before_offline;
    fleet.apply_poll(idx, report, threshold)
}

/// The seats a server behind `backend: openai` says (SGLang, llama.cpp: they then count as the
/// backend's, not assumed), asked once it answers a poll: once, or again after an ask nothing
/// answered (at most `MAX_SEATS_ASKS`), and anew after the node was offline or its config
/// replaced. While another poll asks, what the node reported last.
async fn said_seats(fleet: &Fleet, client: &reqwest::Client, idx: usize) -> Option<u32> {
    use crate::fleet::{SeatsAsked, MAX_SEATS_ASKS};
    let (cfg, node) = (fleet.node_config(idx), fleet.node(idx));
    let before = {
        let mut live = node.live.lock();
        match live.seats_asked {
            SeatsAsked::Answered(said) => return said,
            SeatsAsked::Asking => return live.seats,
            SeatsAsked::Failed(n) if n >= MAX_SEATS_ASKS => return None,
            before => {
                live.seats_asked = SeatsAsked::Asking;
                before
            }
        }
    };
    let asked = probe::seats(client, cfg.addr).await;
    let now = match asked {
        Ok(said) => {
            if let Some(n) = said {
                log::info!("node {}: says it runs {n} requests at once", cfg.id);
            }
            SeatsAsked::Answered(said)
        }
        Err(error) => {
            log::debug!("node {}: asking its seats: {error}", cfg.id);
            match before {
                SeatsAsked::Failed(n) => SeatsAsked::Failed(n + 1),
                _ => SeatsAsked::Failed(1),
            }
        }
    };
    let mut live = node.live.lock();
    // (Unless the node went offline or was replaced meanwhile: then it is asked anew.)
    if live.seats_asked == SeatsAsked::Asking {
        live.seats_asked = now;
    }
    match now {
        SeatsAsked::Answered(said) => said,
        _ => None,
    }
}

#[async_trait]
impl BackgroundService for HealthPoller {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.fleet.config().health.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate; startup already polled
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {
                    let changed = self.poll_all().await;
                    log::debug!("health poll: {} nodes, {changed} changed", self.fleet.len());
                }
            }
        }
    }
}

/// Ask one backend what it has.
pub async fn poll_backend(
    client: &reqwest::Client,
    backend: Backend,
    addr: SocketAddr,
) -> Result<BackendPoll, String> {
    let base = format!("http://{addr}");
    match backend {
        Backend::Ollama | Backend::Sim => ollama::poll(client, &base).await,
        Backend::Openai => openai::poll(client, &base).await,
        Backend::Vllm => vllm::poll(client, &base).await,
        Backend::Llamacpp => llamacpp::poll(client, &base).await,
    }
}

async fn get(client: &reqwest::Client, url: &str) -> Result<reqwest::Response, String> {
    let resp = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("GET {url}: status {}", resp.status()));
    }
    Ok(resp)
}

async fn get_json<T: for<'de> Deserialize<'de>>(
    client: &reqwest::Client,
    url: String,
) -> Result<T, String> {
    get(client, &url)
        .await?
        .json()
        .await
        .map_err(|e| format!("GET {url}: bad JSON: {e}"))
}

async fn get_text(client: &reqwest::Client, url: String) -> Result<String, String> {
    get(client, &url)
        .await?
        .text()
        .await
        .map_err(|e| format!("GET {url}: {e}"))
}
