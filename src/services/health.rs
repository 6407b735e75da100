//! Health poller: asks each node's backend what it has (Ollama `/api/tags` + `/api/ps`,
//! OpenAI-style `/v1/models`) every `health.poll_interval` and feeds the fleet state.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use serde::Deserialize;

use super::now_ms;
use crate::config::{Backend, NodeConfig};
use crate::fleet::{Fleet, LiveModel, PollReport};

const GB: f64 = 1_000_000_000.0;

pub struct HealthPoller {
    fleet: Arc<Fleet>,
    client: reqwest::Client,
}

impl HealthPoller {
    pub fn new(fleet: Arc<Fleet>) -> HealthPoller {
        let client = reqwest::Client::builder()
            .timeout(fleet.config.health.poll_timeout)
            .pool_idle_timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        HealthPoller { fleet, client }
    }

    /// Poll every node once, concurrently; returns how many changed.
    pub async fn poll_all(&self) -> usize {
        let polls = (0..self.fleet.config.nodes.len()).map(|idx| async move {
            let report = poll_node(&self.client, self.fleet.node_config(idx)).await;
            if let PollReport::Failed { error } = &report {
                log::debug!("poll {}: {error}", self.fleet.node_config(idx).id);
            }
            let threshold = self.fleet.config.health.failures_before_offline;
            self.fleet.apply_poll(idx, report, threshold)
        });
        futures::future::join_all(polls)
            .await
            .into_iter()
            .filter(|c| *c)
            .count()
    }
}

#[async_trait]
impl BackgroundService for HealthPoller {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.fleet.config.health.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate; startup already polled
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {
                    let changed = self.poll_all().await;
                    log::debug!("health poll: {} nodes, {changed} changed", self.fleet.config.nodes.len());
                }
            }
        }
    }
}

#[derive(Deserialize)]
struct OllamaList {
    #[serde(default)]
    models: Vec<OllamaModel>,
}

#[derive(Deserialize)]
struct OllamaModel {
    name: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    context_length: Option<u32>,
}

#[derive(Deserialize)]
struct OpenAIList {
    #[serde(default)]
    data: Vec<OpenAIModel>,
}

#[derive(Deserialize)]
struct OpenAIModel {
    id: String,
    #[serde(default)]
    max_model_len: Option<u32>,
}

async fn get_json<T: for<'de> Deserialize<'de>>(
    client: &reqwest::Client,
    url: String,
) -> Result<T, String> {
    let resp = client
        .get(&url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("GET {url}: status {}", resp.status()));
    }
    resp.json()
        .await
        .map_err(|e| format!("GET {url}: bad JSON: {e}"))
}

/// Ask one node what it has.
pub async fn poll_node(client: &reqwest::Client, node: &NodeConfig) -> PollReport {
    let base = format!("http://{}", node.addr);
    let result = match node.backend {
        Backend::Ollama | Backend::Sim => poll_ollama(client, &base).await,
        Backend::Openai => poll_openai(client, &base).await,
    };
    match result {
        Ok(models) => PollReport::Ok {
            models,
            seats: None,
            now_ms: now_ms(),
        },
        Err(error) => PollReport::Failed { error },
    }
}

async fn poll_ollama(client: &reqwest::Client, base: &str) -> Result<Vec<LiveModel>, String> {
    let (tags, ps) = tokio::join!(
        get_json::<OllamaList>(client, format!("{base}/api/tags")),
        get_json::<OllamaList>(client, format!("{base}/api/ps")),
    );
    let (tags, ps) = (tags?, ps?);
    let mut models: Vec<LiveModel> = tags
        .models
        .into_iter()
        .map(|m| LiveModel {
            name: m.name,
            size_gb: m.size as f64 / GB,
            on_disk: true,
            ..LiveModel::default()
        })
        .collect();
    for p in ps.models {
        let idx = match models.iter().position(|m| m.name == p.name) {
            Some(i) => i,
            None => {
                models.push(LiveModel {
                    name: p.name.clone(),
                    ..LiveModel::default()
                });
                models.len() - 1
            }
        };
        let m = &mut models[idx];
        m.loaded = true;
        m.resident_gb = Some(p.size as f64 / GB);
        m.context = p.context_length;
    }
    models.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(models)
}

async fn poll_openai(client: &reqwest::Client, base: &str) -> Result<Vec<LiveModel>, String> {
    let list = get_json::<OpenAIList>(client, format!("{base}/v1/models")).await?;
    let mut models: Vec<LiveModel> = list
        .data
        .into_iter()
        .map(|m| LiveModel {
            name: m.id,
            context: m.max_model_len,
            loaded: true,
            on_disk: true,
            ..LiveModel::default()
        })
        .collect();
    models.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(models)
}
