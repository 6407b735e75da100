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

/// The requests an OpenAI-compatible server at `addr` says it runs at once: SGLang's
/// `GET /get_server_info` `max_running_requests` (at the top, or in its first
/// `internal_states` when the flag was not given), else llama.cpp's `GET /props`
/// `total_slots`; `None` when neither answers with a count.
pub async fn seats(client: &reqwest::Client, addr: SocketAddr) -> Option<u32> {
    let base = format!("http://{addr}");
    let get = |path: &str| {
        let url = format!("{base}{path}");
        async move {
            let r = client.get(url).send().await.ok()?;
            r.status().is_success().then_some(())?;
            r.json::<serde_json::Value>().await.ok()
        }
    };
    if let Some(n) = get("/get_server_info")
        .await
        .as_ref()
        .and_then(sglang_seats)
    {
        return Some(n);
    }
    get("/props")
        .await
        .as_ref()
        .and_then(|p| count(&p["total_slots"]))
}

/// SGLang's `max_running_requests`: the server argument, else what its scheduler reports.
fn sglang_seats(info: &serde_json::Value) -> Option<u32> {
    count(&info["max_running_requests"])
        .or_else(|| count(&info["internal_states"][0]["max_running_requests"]))
}

/// A positive count.
fn count(v: &serde_json::Value) -> Option<u32> {
    v.as_u64()
        .filter(|n| *n > 0)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sglang_says_its_seats_as_an_argument_or_as_its_scheduler_runs_them() {
        let given = json!({"max_running_requests": 48, "internal_states": [{}]});
        assert_eq!(sglang_seats(&given), Some(48));
        let computed = json!({"max_running_requests": null,
            "internal_states": [{"max_running_requests": 2048, "last_gen_throughput": 0.0}]});
        assert_eq!(sglang_seats(&computed), Some(2048));
        assert_eq!(sglang_seats(&json!({"version": "0.4.6"})), None);
        assert_eq!(sglang_seats(&json!({"max_running_requests": 0})), None);
    }
}
