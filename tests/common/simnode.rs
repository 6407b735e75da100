//! Helpers for talking to one simulated node directly (the sim's own API tests).

use fleetgate::sim::{start, SimHandle, SimModel, SimSpec};
use futures::StreamExt;
use serde_json::{json, Value};

pub fn spec() -> SimSpec {
    let mut small = SimModel::new("llama3.2:3b", 2.0);
    small.loaded = true;
    let mut big = SimModel::new("qwen2.5:7b", 4.7);
    big.cold_load_ms = 30;
    let mut emb = SimModel::new("nomic-embed-text:latest", 0.3);
    emb.embedding = true;
    emb.cold_load_ms = 0;
    SimSpec {
        seed: 7,
        ttft_ms: 1,
        tokens_per_sec: 2000.0,
        reply_tokens: 12,
        models: vec![small, big, emb],
        ..SimSpec::default()
    }
}

pub async fn node(spec: SimSpec) -> (SimHandle, String, reqwest::Client) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let h = start(spec, l).await.expect("start");
    let base = format!("http://{}", h.addr());
    let c = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    (h, base, c)
}

pub async fn post(c: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = c.post(url).json(&body).send().await.expect("send");
    let s = r.status().as_u16();
    (s, r.json().await.expect("json body"))
}

pub async fn get(c: &reqwest::Client, url: String) -> Value {
    let r = c.get(url).send().await.expect("send");
    assert_eq!(r.status(), 200);
    r.json().await.expect("json body")
}

/// Read a body to its end; returns the bytes and whether the stream ended in an error.
pub async fn drain(r: reqwest::Response) -> (String, bool) {
    let mut s = r.bytes_stream();
    let mut out = Vec::new();
    while let Some(item) = s.next().await {
        match item {
            Ok(b) => out.extend_from_slice(&b),
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), true),
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), false)
}

pub fn ndjson(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).expect("ndjson line"))
        .collect()
}

pub fn chat_body(model: &str, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Why is the sky blue?"}], "stream": stream})
}

pub fn sse_data(s: &str) -> Vec<String> {
    s.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}
