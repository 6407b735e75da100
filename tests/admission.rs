//! Admission control on live simulated nodes: node:model queues bounded by count and by
//! predicted wait (429 + Retry-After at once), requests no node could ever serve refused at
//! once, and per-client shares of the holding queue.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn chat() -> Value {
    json!({"model": "m:1b", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
}

fn one_seat_node(rt: &tokio::runtime::Runtime) -> fleetgate::sim::SimHandle {
    sim(
        rt,
        "seats: 1\ntokens_per_sec: 1000\nttft_ms: 1\nreply_tokens: 4\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true}\n",
    )
}

fn spawn_chat(gw: &Gateway) -> tokio::task::JoinHandle<reqwest::Response> {
    let url = gw.url("/v1/chat/completions");
    tokio::spawn(async move { client().post(url).json(&chat()).send().await.expect("send") })
}

async fn waiting(gw: &Gateway) -> usize {
    admin_json(gw, "/fleet/queue").await["waiting"]
        .as_array()
        .map_or(0, Vec::len)
}

/// A refusal: 429, OpenAI error shape with `queue_full`, and a Retry-After of at least 1 s.
async fn assert_refused(r: reqwest::Response, says: &str) -> u64 {
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "queue_full", "{v}");
    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(says), "{msg}");
    retry
}

#[test]
fn a_full_node_queue_refuses_at_once() {
    let rt = runtime();
    let a = one_seat_node(&rt);
    let gw = Gateway::start(&format!(
        "admission:\n  max_queue: 2\n{}",
        fleet(&[node("adm-a", &a, "      capacity: 1\n")])
    ));
    rt.block_on(async {
        a.control().hold_first_token(true);
        let running = spawn_chat(&gw);
        a.control().wait_parked(1).await;
        let queued: Vec<_> = (0..2).map(|_| spawn_chat(&gw)).collect();
        eventually("two waiting", || async { waiting(&gw).await == 2 }).await;
        let t = Instant::now();
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&chat())
            .send()
            .await
            .unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "refused at once");
        assert_refused(r, "the queue is full (2 requests waiting, limit 2)").await;
        assert_eq!(waiting(&gw).await, 2, "the refused request never waited");
        a.control().release();
        for r in std::iter::once(running).chain(queued) {
            assert_eq!(r.await.unwrap().status(), 200);
        }
        assert_eq!(served(&a), 3, "the refused request never reached the node");
    });
}

#[test]
fn predicted_wait_past_the_service_time_ratio_is_refused() {
    let rt = runtime();
    let a = one_seat_node(&rt);
    let gw = Gateway::start(&format!(
        "admission:\n  max_wait_service_ratio: 1.0\n{}",
        fleet(&[node("adm-p", &a, "      capacity: 1\n")])
    ));
    rt.block_on(async {
        // History: the node:model's service time becomes known.
        for _ in 0..3 {
            assert_eq!(spawn_chat(&gw).await.unwrap().status(), 200);
        }
        a.control().hold_first_token(true);
        let running = spawn_chat(&gw);
        a.control().wait_parked(1).await;
        // First in line: predicted wait = 1 service time, within the ratio.
        let queued = spawn_chat(&gw);
        eventually("one waiting", || async { waiting(&gw).await == 1 }).await;
        // Second in line: 2 service times > 1.
        let r = client()
            .post(gw.url("/api/chat"))
            .json(&chat())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429);
        assert!(r.headers().contains_key("retry-after"));
        let v: Value = r.json().await.unwrap();
        let msg = v["error"].as_str().expect("Ollama error shape");
        assert!(msg.contains("predicted wait"), "{msg}");
        a.control().release();
        assert_eq!(running.await.unwrap().status(), 200);
        assert_eq!(queued.await.unwrap().status(), 200);
    });
}

#[test]
fn tags_no_node_has_are_refused_without_holding() {
    let rt = runtime();
    let a = one_seat_node(&rt);
    let gw = Gateway::start(&format!(
        "queue:\n  holding_max: 1\n{}",
        fleet(&[node("adm-t", &a, "      tags: [gpu]\n")])
    ));
    rt.block_on(async {
        for _ in 0..3 {
            let t = Instant::now();
            let r = client()
                .post(gw.url("/v1/chat/completions"))
                .header("x-fleet-tags", "gpu,nvme")
                .json(&chat())
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 400);
            assert!(t.elapsed() < Duration::from_secs(2));
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "invalid_request", "{v}");
            assert!(
                v["error"]["message"].as_str().unwrap().contains("[nvme]"),
                "{v}"
            );
        }
        assert_eq!(admin_json(&gw, "/fleet/queue").await["holding"], 0);
        // A legitimate request is unaffected.
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .header("x-fleet-tags", "gpu")
            .json(&chat())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    });
}

fn client_from(ip: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(std::net::IpAddr::from(ip))
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

#[test]
fn one_client_holds_only_its_share_of_the_holding_queue() {
    let rt = runtime();
    let port = free_port();
    // A node that never comes up: every request waits in the holding queue.
    let gw = Gateway::start(&format!(
        "health:\n  failures_before_offline: 1\nqueue:\n  holding_max: 4\n  holding_timeout_s: 30\nadmission:\n  holding_client_share: 0.5\nfleet:\n  nodes:\n    - id: away\n      url: http://127.0.0.1:{port}\n      backend: ollama\n      models:\n        - {{name: m:1b, size_gb: 1}}\n"
    ));
    rt.block_on(async {
        let send = |ip: [u8; 4]| {
            let url = gw.url("/v1/chat/completions");
            tokio::spawn(async move { client_from(ip).post(url).json(&chat()).send().await })
        };
        let mine: Vec<_> = (0..2).map(|_| send([127, 0, 0, 1])).collect();
        eventually("two held", || async {
            admin_json(&gw, "/fleet/queue").await["holding"] == 2
        })
        .await;
        let r = client_from([127, 0, 0, 1])
            .post(gw.url("/v1/chat/completions"))
            .json(&chat())
            .send()
            .await
            .unwrap();
        assert_refused(r, "its share: 2 of 4").await;
        // Another client still gets a place.
        let other = send([127, 0, 0, 2]);
        eventually("three held", || async {
            admin_json(&gw, "/fleet/queue").await["holding"] == 3
        })
        .await;
        for t in mine.into_iter().chain([other]) {
            t.abort();
        }
    });
}
