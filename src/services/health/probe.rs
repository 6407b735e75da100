//! Which wire protocols a node speaks beyond what its backend kind implies, learned by asking
//! once: Ollama's `GET /api/tags`, Anthropic's `POST /v1/messages` (an empty body: a server
//! that has the endpoint answers 400/422, one that does not answers 404).

use std::net::SocketAddr;

use crate::config::{default_families, Backend};
use crate::routing::Family;

/// The families `backend` at `addr` speaks: its kind's defaults plus what answers.
pub async fn families(client: &reqwest::Client, backend: Backend, addr: SocketAddr) -> Vec<Family> {
    let base = format!("http://{addr}");
    let mut out = default_families(backend);
    if !out.contains(&Family::Ollama) && speaks_ollama(client, &base).await {
        out.push(Family::Ollama);
    }
    if !out.contains(&Family::Anthropic) && speaks_anthropic(client, &base).await {
        out.push(Family::Anthropic);
    }
    out
}

async fn speaks_ollama(client: &reqwest::Client, base: &str) -> bool {
    let Ok(r) = client.get(format!("{base}/api/tags")).send().await else {
        return false;
    };
    if !r.status().is_success() {
        return false;
    }
    r.json::<serde_json::Value>()
        .await
        .is_ok_and(|v| v["models"].is_array())
}

async fn speaks_anthropic(client: &reqwest::Client, base: &str) -> bool {
    let r = client
        .post(format!("{base}/v1/messages"))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body("{}")
        .send()
        .await;
    r.is_ok_and(|r| matches!(r.status().as_u16(), 400 | 422))
}
