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

pub(crate) fn client(timeout: Duration) -> reqwest::Client {
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

/// Unload `model` from node `idx` now (Ollama: generate with no prompt and keep_alive 0).
pub async fn unload(fleet: &Fleet, idx: usize, model: &str) -> Result<(), String> {
    let body = serde_json::json!({"model": model, "keep_alive": 0});
    post(
        fleet,
        idx,
        "/api/generate",
        body,
        fleet.config().health.poll_timeout,
    )
    .await
}

/// What a cold load of `model` on node `idx` would unload first, as `view` shows the node
/// (`routing::victims`), where the gateway makes that choice: completion mode with
/// `completion_choose_evictions`, on a node it manages. Empty elsewhere.
pub fn victims(
    fleet: &Fleet,
    view: &crate::routing::FleetView,
    idx: usize,
    model: &str,
) -> Vec<String> {
    let config = fleet.config();
    let policy = &config.routing.policy;
    let chooses = policy.mode == crate::routing::Mode::Completion
        && policy.completion_choose_evictions
        && can_manage(fleet, idx);
    match view.nodes.get(idx).filter(|_| chooses) {
        Some(node) => crate::routing::victims(
            policy,
            node,
            idx,
            model,
            fleet,
            (fleet.watching_since_ms, super::now_ms()),
        ),
        None => Vec::new(),
    }
}

/// Completion mode, before a cold load of `model` on node `idx`: unload the idle models that
/// make room at the least expected reload time (`routing::victims`) instead of leaving the
/// choice to the backend's least-recently-used rule. Does nothing where the gateway cannot
/// manage models or nothing needs to go; a failed unload is logged and the load goes on
/// (the backend then evicts as it would have).
/// `for_demand`: the load is for requests (a request's own, a pre-warm), so what it unloads
/// may be read back in later (`prewarm::restore`); a restore's own unloads are not, or two
/// models could take turns.
pub async fn make_room(fleet: &Fleet, idx: usize, model: &str, for_demand: bool) {
    let view = fleet.view();
    let victims = victims(fleet, &view, idx, model);
    if victims.is_empty() {
        return;
    }
    let node = &view.nodes[idx]; // `victims` found it
    let now = super::now_ms();
    let mut gone = Vec::with_capacity(victims.len());
    for v in victims {
        // Claimed before the call, so no request is routed to it meanwhile; not at all when a
        // request took it up since, or another cold load unloaded it first.
        if !fleet.claim_unload(idx, &v, now) {
            continue;
        }
        match unload(fleet, idx, &v).await {
            Ok(()) => gone.push(v),
            Err(e) => {
                log::warn!(
                    "node {}: unloading {v} to make room for {model}: {e}",
                    node.id
                );
                fleet.mark_loaded(idx, &v);
            }
        }
    }
    if !gone.is_empty() {
        log::info!(
            "node {}: unloaded {} to make room for {model}",
            node.id,
            gone.join(", ")
        );
        if for_demand {
            let mut evicted = fleet.evicted.lock();
            evicted.extend(gone.iter().map(|v| (node.id.clone(), v.clone())));
        }
        for v in &gone {
            crate::metrics::METRICS
                .evictions
                .with_label_values(&[&node.id, v])
                .inc();
        }
    }
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
