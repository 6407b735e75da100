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
/// `GET /get_server_info` `max_running_requests` (the flag it was started with: when it was
/// not given, SGLang reports a ceiling its KV cache allows, thousands, not what it runs), else
/// llama.cpp's `GET /props` `total_slots`. `Ok(None)`: it answered without a count (no such
/// endpoint, another 4xx, none in the body); `Err`: no answer to tell by (no connection, a
/// timeout, a 5xx, 408 or 429), worth asking again.
pub async fn seats(client: &reqwest::Client, addr: SocketAddr) -> Result<Option<u32>, String> {
    let base = format!("http://{addr}");
    let info = answer(client, format!("{base}/get_server_info")).await?;
    if let Some(n) = info
        .as_ref()
        .and_then(|i| count(&i["max_running_requests"]))
    {
        return Ok(Some(n));
    }
    let props = answer(client, format!("{base}/props")).await?;
    Ok(props.as_ref().and_then(|p| count(&p["total_slots"])))
}

/// The JSON body of a GET: `Ok(None)` when the server said no (a 4xx but 408 and 429) or the
/// body is not JSON.
async fn answer(
    client: &reqwest::Client,
    url: String,
) -> Result<Option<serde_json::Value>, String> {
    let r = client
        .get(&url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    let status = r.status();
    // Busy or loading, not a refusal: worth asking again.
    let later = [
        reqwest::StatusCode::REQUEST_TIMEOUT,
        reqwest::StatusCode::TOO_MANY_REQUESTS,
    ];
    if status.is_server_error() || later.contains(&status) {
        return Err(format!("GET {url}: {status}"));
    }
    if !status.is_success() {
        return Ok(None);
    }
    Ok(r.json::<serde_json::Value>().await.ok())
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
    fn a_count_is_a_positive_integer() {
        assert_eq!(count(&json!(48)), Some(48));
        for no in [json!(null), json!(0), json!(-1), json!("8"), json!(2.5)] {
            assert_eq!(count(&no), None, "{no}");
        }
        // SGLang started without the flag: the ceiling in `internal_states` is not read.
        let info = json!({"max_running_requests": null,
            "internal_states": [{"max_running_requests": 2048}]});
        assert_eq!(count(&info["max_running_requests"]), None);
    }
}
