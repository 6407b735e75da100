//! Walking gateway, end to end: real Pingora gateway, simulated nodes, real HTTP on 127.0.0.1.

mod common;

use common::*;
use serde_json::{json, Value};

const SMALL: &str = "seats: 2\ntokens_per_sec: 1000\nttft_ms: 5\nmemory_gb: 64\nreply_tokens: 8\n";

/// Health polls every 10 minutes: the initial poll at startup is the only one in a test.
const QUIET: &str = "health:\n  poll_interval_ms: 600000\n";

fn sim_with(rt: &tokio::runtime::Runtime, models: &str) -> fleetgate::sim::SimHandle {
    sim(rt, &format!("{SMALL}models:\n{models}"))
}

fn chat(model: &str, text: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": text}]})
}

#[test]
fn routes_by_model_and_names_the_node() {
    let rt = runtime();
    let a = sim_with(&rt, "  - {name: alpha:1b, size_gb: 1, loaded: true}\n");
    let b = sim_with(&rt, "  - {name: beta:1b, size_gb: 1, loaded: true}\n");
    let gw = Gateway::start(&fleet(&[node("rt-a", &a, ""), node("rt-b", &b, "")]));
    let c = client();
    rt.block_on(async {
        for (model, node) in [
            ("beta:1b", "rt-b"),
            ("alpha:1b", "rt-a"),
            ("beta:1b", "rt-b"),
        ] {
            let r = c
                .post(gw.url("/v1/chat/completions"))
                .json(&chat(model, "hi"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            assert_eq!(r.headers()["x-fleet-node"], node);
            assert_eq!(r.headers()["x-fleet-served-model"], model);
            assert_eq!(r.headers()["x-fleet-requested-model"], model);
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["object"], "chat.completion");
            assert!(!body["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .is_empty());
        }
    });
    assert_eq!(served(&a), 1);
    assert_eq!(served(&b), 2);
}

#[test]
fn alias_is_rewritten_for_the_node() {
    let rt = runtime();
    let a = sim_with(&rt, "  - {name: llama3.2:3b, size_gb: 2, loaded: true}\n");
    let yaml = format!(
        "models:\n  aliases:\n    gpt-4o-mini: llama3.2:3b\n{}",
        fleet(&[node("al-a", &a, "")])
    );
    let gw = Gateway::start(&yaml);
    rt.block_on(async {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&chat("gpt-4o-mini", "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-fleet-served-model"], "llama3.2:3b");
        assert_eq!(r.headers()["x-fleet-requested-model"], "gpt-4o-mini");
    });
    assert_eq!(a.control().stats().by_model.get("llama3.2:3b"), Some(&1));
}

#[test]
fn stream_reaches_client_before_node_finishes() {
    let rt = runtime();
    let a = sim_with(&rt, "  - {name: alpha:1b, size_gb: 1, loaded: true}\n");
    let gw = Gateway::start(&fleet(&[node("st-a", &a, "")]));
    let ctl = a.control();
    ctl.hold_after_first_chunk(true);
    rt.block_on(async {
        let mut body = chat("alpha:1b", "stream please");
        body["stream"] = json!(true);
        let mut r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-fleet-node"], "st-a");
        // The node is parked after its first chunk: what we read now cannot be the last one.
        let first = r.chunk().await.unwrap().expect("first chunk");
        let text = String::from_utf8_lossy(&first).to_string();
        assert!(text.starts_with("data: "), "{text}");
        assert!(
            !text.contains("[DONE]"),
            "the stream must not be complete yet: {text}"
        );
        assert_eq!(ctl.stats().in_flight, 1, "node still generating");
        ctl.release();
        let mut rest = String::new();
        while let Some(c) = r.chunk().await.unwrap() {
            rest.push_str(&String::from_utf8_lossy(&c));
        }
        assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");
    });
}

#[test]
fn ollama_ndjson_stream_passes_through() {
    let rt = runtime();
    let a = sim_with(&rt, "  - {name: alpha:1b, size_gb: 1, loaded: true}\n");
    let gw = Gateway::start(&fleet(&[node("nd-a", &a, "")]));
    rt.block_on(async {
        let r = client()
            .post(gw.url("/api/chat"))
            .json(&chat("alpha:1b", "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(lines.len() > 2, "streamed by default: {text}");
        assert_eq!(lines.last().unwrap()["done"], true);
    });
}

#[test]
fn bodies_of_any_size_arrive_whole() {
    let rt = runtime();
    let a = sim(
        &rt,
        &format!(
            "{SMALL}models:\n  - {{name: big:1b, size_gb: 1, context: 1000000, loaded: true}}\n"
        ),
    );
    // No polls during the test: they would overwrite the node's last-request record.
    let gw = Gateway::start(&format!("{QUIET}{}", fleet(&[node("bd-a", &a, "")])));
    let c = client();
    rt.block_on(async {
        // 1 KiB, just under and over Pingora's 64 KiB replay buffer, and 1 MiB.
        for size in [1024usize, 60 * 1024, 70 * 1024, 1024 * 1024] {
            let body = serde_json::to_vec(&json!({
                "model": "big:1b",
                "messages": [{"role": "user", "content": "x".repeat(size)}],
                "max_tokens": 4
            }))
            .unwrap();
            let len = body.len();
            let r = c
                .post(gw.url("/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "size {size}: {}", r.text().await.unwrap());
            assert_eq!(a.control().stats().last_body_len, len, "size {size}");
        }
    });
}

#[test]
fn errors_are_native_to_each_protocol() {
    let rt = runtime();
    let a = sim_with(&rt, "  - {name: alpha:1b, size_gb: 1, loaded: true}\n");
    let gw = Gateway::start(&format!(
        "limits:\n  max_body_bytes: 4096\n{}",
        fleet(&[node("er-a", &a, "")])
    ));
    let c = client();
    rt.block_on(async {
        // Unknown model: 404 in each shape.
        let r = c.post(gw.url("/v1/chat/completions")).json(&chat("nope:1b", "hi")).send().await.unwrap();
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        let r = c.post(gw.url("/api/chat")).json(&chat("nope:1b", "hi")).send().await.unwrap();
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains("nope:1b"));
        let r = c
            .post(gw.url("/v1/messages"))
            .json(&json!({"model": "nope:1b", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "not_found_error");

        // An endpoint that does not exist: 404, as OpenAI and Ollama answer it.
        let r = c.get(gw.url("/v1/nope")).send().await.unwrap();
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        let r = c.post(gw.url("/api/nope")).send().await.unwrap();
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.unwrap();
        assert!(v["error"].as_str().unwrap().contains("/api/nope"));

        // Malformed JSON and missing model: 400 invalid_request.
        let r = c.post(gw.url("/v1/chat/completions")).body("{not json").send().await.unwrap();
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_request");
        let r = c.post(gw.url("/v1/chat/completions")).json(&json!({"messages": []})).send().await.unwrap();
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains("model"));

        // Too large: 413.
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .json(&chat("alpha:1b", &"y".repeat(8192)))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 413);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "request_too_large");
    });
    assert_eq!(served(&a), 0, "nothing reached the node");
}

#[test]
fn no_node_up_is_503_with_retry_after() {
    let rt = runtime();
    let dead = free_port();
    let yaml = format!(
        "health:\n  failures_before_offline: 1\nqueue:\n  holding_timeout_s: 1\nfleet:\n  nodes:\n    - id: nn-dead\n      url: http://127.0.0.1:{dead}\n      backend: ollama\n      models:\n        - {{name: alpha:1b, size_gb: 1}}\n"
    );
    let gw = Gateway::start(&yaml);
    rt.block_on(async {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&chat("alpha:1b", "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "2");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "no_provider_available");
    });
}

#[test]
fn local_endpoints_aggregate_the_fleet() {
    let rt = runtime();
    let a = sim_with(
        &rt,
        "  - {name: alpha:1b, size_gb: 1, loaded: true}\n  - {name: shared:7b, size_gb: 4}\n",
    );
    let b = sim_with(
        &rt,
        "  - {name: beta:1b, size_gb: 1}\n  - {name: shared:7b, size_gb: 4}\n",
    );
    let gw = Gateway::start(&fleet(&[node("lo-a", &a, ""), node("lo-b", &b, "")]));
    let c = client();
    rt.block_on(async {
        let v: Value = c.get(gw.url("/v1/models")).send().await.unwrap().json().await.unwrap();
        let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["alpha:1b", "beta:1b", "shared:7b"]);
        let v: Value = c.get(gw.url("/api/tags")).send().await.unwrap().json().await.unwrap();
        assert_eq!(v["models"].as_array().unwrap().len(), 3);
        let v: Value = c.get(gw.url("/api/ps")).send().await.unwrap().json().await.unwrap();
        let loaded: Vec<&str> = v["models"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
        assert_eq!(loaded, ["alpha:1b"]);
        let v: Value = c.get(gw.url("/api/version")).send().await.unwrap().json().await.unwrap();
        assert!(v["version"].is_string());
        let r = c.head(gw.url("/")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let r = c.post(gw.url("/api/show")).json(&json!({"model": "shared:7b"})).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let r = c
            .post(gw.url("/v1/messages/count_tokens"))
            .json(&json!({"model": "alpha:1b", "messages": [{"role": "user", "content": "x".repeat(400)}]}))
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["input_tokens"], 104, "400 chars / 4 + 4 per message");
    });
    assert_eq!(served(&a) + served(&b), 0);
}

#[test]
fn admin_status_and_metrics() {
    let rt = runtime();
    let a = sim_with(&rt, "  - {name: alpha:1b, size_gb: 1, loaded: true}\n");
    let gw = Gateway::start(&fleet(&[node("ad-a", &a, "")]));
    let c = client();
    rt.block_on(async {
        // Streamed: time to first token is recorded for a streamed success only.
        let mut body = chat("alpha:1b", "hi");
        body["stream"] = json!(true);
        let r = c.post(gw.url("/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        let v: Value = c.get(gw.admin_url("/fleet/status")).send().await.unwrap().json().await.unwrap();
        let node = &v["nodes"][0];
        assert_eq!(node["id"], "ad-a");
        assert_eq!(node["health"], "online");
        assert_eq!(node["models"][0]["name"], "alpha:1b");
        assert_eq!(node["models"][0]["loaded"], true);
        // The request is accounted right after its last byte is written: wait for that.
        let expected = [
            r#"fleetgate_proxy_requests_total{model="alpha:1b",node="ad-a",protocol="openai_chat",status="200"} 1"#,
            r#"fleetgate_proxy_request_duration_seconds_count{model="alpha:1b",node="ad-a"} 1"#,
            r#"fleetgate_proxy_time_to_first_token_seconds_count{model="alpha:1b",node="ad-a"} 1"#,
            r#"fleetgate_fleet_in_flight_requests{model="alpha:1b",node="ad-a"} 0"#,
        ];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let text = c.get(gw.admin_url("/metrics")).send().await.unwrap().text().await.unwrap();
            let missing: Vec<_> = expected.iter().filter(|l| !text.contains(*l)).collect();
            if missing.is_empty() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "missing {missing:?} in\n{text}");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    });
}

#[test]
fn connect_failure_fails_over_to_the_next_node() {
    let rt = runtime();
    let a = sim_with(&rt, "  - {name: alpha:1b, size_gb: 1, loaded: true}\n");
    let b = sim_with(&rt, "  - {name: alpha:1b, size_gb: 1, loaded: true}\n");
    let gw = Gateway::start(&fleet(&[node("fo-a", &a, ""), node("fo-b", &b, "")]));
    // Both polled up; now the first choice refuses connections.
    a.control().set_fault(fleetgate::sim::Fault::Refuse);
    rt.block_on(async {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&chat("alpha:1b", "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-fleet-node"], "fo-b");
        assert_eq!(r.headers()["x-fleet-retries"], "1");
    });
    assert_eq!(served(&b), 1);
}
