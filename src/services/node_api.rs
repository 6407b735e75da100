//! The few calls the gateway makes to a node's own API: load a model (empty generate with
//! keep_alive, Ollama's pre-warm) and pull one; then re-poll the node so routing sees it.

use std::sync::Arc;
use std::time::Duration;

use crate::config::Backend;
use crate::fleet::Fleet;

/// Whether the gateway can load or pull models on this node (Ollama API).
pub fn can_manage(fleet: &Fleet, idx: usize) -> bool {
    matches!(
        fleet.node_config(idx).backend,
        Backend::Ollama | Backend::Sim
    )
}

fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .unwrap_or_default()
}

async fn post(
    fleet: &Fleet,
    idx: usize,
    path: &str,
    body: serde_json::Value,
    timeout: Duration,
) -> Result<(), String> {
    let url = format!("http://{}{path}", fleet.node_config(idx).addr);
    let resp = client(timeout)
        .post(&url)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("POST {url}: {e}"))?;
    if !resp.status().is_success() {
        return Err(format!("POST {url}: status {}", resp.status()));
    }
    resp.bytes().await.map_err(|e| format!("POST {url}: {e}"))?;
    Ok(())
}

/// Load `model` on node `idx` (Ollama: generate with no prompt and a keep_alive).
pub async fn load(fleet: &Fleet, idx: usize, model: &str) -> Result<(), String> {
    let body = serde_json::json!({"model": model, "keep_alive": "30m"});
    post(fleet, idx, "/api/generate", body, Duration::from_secs(600)).await
}

/// Pull `model` onto node `idx` (Ollama /api/pull, waiting for it to finish).
pub async fn pull(fleet: &Fleet, idx: usize, model: &str) -> Result<(), String> {
    let body = serde_json::json!({"model": model, "stream": false});
    post(fleet, idx, "/api/pull", body, Duration::from_secs(3600)).await
}

/// Poll node `idx` now and publish what changed.
pub async fn refresh(fleet: &Arc<Fleet>, idx: usize) {
    let c = client(fleet.config().health.poll_timeout);
    super::health::poll_and_apply(fleet, &c, idx).await;
}
