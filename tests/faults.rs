//! The fault suite: a gateway in front of a faulty and a healthy simulated node, over real
//! HTTP. After each fault (refuse, hang, 5xx storm, cut mid-body chunked and by length, slow
//! first byte, flapping), every request sent either succeeded or got a clean error in its
//! protocol's shape, and no 200 carried a truncated body.

mod common;

use std::time::Duration;

use common::*;
use fleetgate::sim::Fault;
use serde_json::{json, Value};

const MODEL: &str = "m:1b";

fn spec(seats: u32) -> String {
    format!("seats: {seats}\ntokens_per_sec: 2000\nttft_ms: 1\nreply_tokens: 24\nmodels:\n  - {{name: {MODEL}, size_gb: 1, loaded: true}}\n")
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    OpenAI,
    OpenAIStream,
    Ollama,
    OllamaStream,
    Anthropic,
}

const KINDS: [Kind; 5] = [
    Kind::OpenAI,
    Kind::OpenAIStream,
    Kind::Ollama,
    Kind::OllamaStream,
    Kind::Anthropic,
];

fn request(gw: &Gateway, kind: Kind, i: usize) -> reqwest::RequestBuilder {
    let msgs = json!([{"role": "user", "content": format!("question {i}")}]);
    let (path, body) = match kind {
        Kind::OpenAI => (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": msgs}),
        ),
        Kind::OpenAIStream => (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": msgs, "stream": true}),
        ),
        Kind::Ollama => (
            "/api/chat",
            json!({"model": MODEL, "messages": msgs, "stream": false}),
        ),
        Kind::OllamaStream => ("/api/chat", json!({"model": MODEL, "messages": msgs})),
        Kind::Anthropic => (
            "/v1/messages",
            json!({"model": MODEL, "max_tokens": 64, "messages": msgs}),
        ),
    };
    client().post(gw.url(path)).json(&body)
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Succeeded,
    CleanError,
    /// What the client would have been fooled by (or left with).
    Broken(String),
}

fn error_shaped(kind: Kind, v: &Value) -> bool {
    match kind {
        Kind::OpenAI | Kind::OpenAIStream => v["error"]["message"].is_string(),
        Kind::Ollama | Kind::OllamaStream => v["error"].is_string(),
        Kind::Anthropic => v["type"] == "error" && v["error"]["message"].is_string(),
    }
}

/// What a user would make of the response.
async fn verdict(kind: Kind, r: reqwest::Result<reqwest::Response>) -> Verdict {
    let r = match r {
        Ok(r) => r,
        Err(e) => return Verdict::Broken(format!("no response: {e}")),
    };
    let status = r.status().as_u16();
    let text = match r.bytes().await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => return Verdict::Broken(format!("{status} with a body cut off: {e}")),
    };
    if status != 200 {
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        return if error_shaped(kind, &v) {
            Verdict::CleanError
        } else {
            Verdict::Broken(format!(
                "{status} not in the protocol's error shape: {text}"
            ))
        };
    }
    let ok = match kind {
        Kind::OpenAI => serde_json::from_str::<Value>(&text)
            .is_ok_and(|v| v["choices"][0]["message"]["content"].is_string()),
        Kind::Ollama => serde_json::from_str::<Value>(&text)
            .is_ok_and(|v| v["done"] == true && v["message"]["content"].is_string()),
        Kind::Anthropic => {
            serde_json::from_str::<Value>(&text).is_ok_and(|v| v["content"][0]["text"].is_string())
        }
        Kind::OpenAIStream => {
            let last = text
                .lines()
                .rfind(|l| l.starts_with("data: "))
                .unwrap_or("");
            if last == "data: [DONE]" {
                true
            } else if serde_json::from_str::<Value>(&last[6.min(last.len())..])
                .is_ok_and(|v| error_shaped(kind, &v))
            {
                return Verdict::CleanError;
            } else {
                false
            }
        }
        Kind::OllamaStream => {
            let last: Value = text
                .lines()
                .last()
                .and_then(|l| serde_json::from_str(l).ok())
                .unwrap_or(Value::Null);
            if last["done"] == true {
                true
            } else if error_shaped(kind, &last) {
                return Verdict::CleanError;
            } else {
                false
            }
        }
    };
    if ok {
        Verdict::Succeeded
    } else {
        Verdict::Broken(format!("200 with an incomplete body: {text}"))
    }
}

/// Send `n` requests at once (all kinds), return (succeeded, clean errors); panics on any
/// broken answer.
async fn storm(gw: &Gateway, n: usize) -> (usize, usize) {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let kind = KINDS[i % KINDS.len()];
            let req = request(gw, kind, i);
            tokio::spawn(async move { verdict(kind, req.send().await).await })
        })
        .collect();
    let (mut ok, mut clean) = (0, 0);
    for t in tasks {
        match t.await.expect("join") {
            Verdict::Succeeded => ok += 1,
            Verdict::CleanError => clean += 1,
            Verdict::Broken(why) => panic!("broken answer: {why}"),
        }
    }
    assert_eq!(ok + clean, n, "every request answered");
    (ok, clean)
}

/// A gateway over a faulty node `bad` and a healthy node `good`.
fn pair(
    rt: &tokio::runtime::Runtime,
    extra: &str,
) -> (
    fleetgate::sim::SimHandle,
    fleetgate::sim::SimHandle,
    Gateway,
) {
    let bad = sim(rt, &spec(4));
    let good = sim(rt, &spec(4));
    let gw = Gateway::start(&format!(
        "{extra}{}",
        fleet(&[
            node("bad", &bad, "      capacity: 4\n"),
            node("good", &good, "      capacity: 4\n"),
        ])
    ));
    (bad, good, gw)
}

#[test]
fn each_fault_leaves_only_successes_and_clean_errors() {
    let rt = runtime();
    let faults = [
        ("refuse", Fault::Refuse),
        ("hang", Fault::Hang),
        ("5xx storm", Fault::Status500),
        ("cut mid-body, chunked", Fault::CutChunked),
        ("cut mid-body, by length", Fault::CutLength),
        ("slow first byte", Fault::SlowFirstByte(5_000)),
        ("flapping", Fault::Flap(30)),
    ];
    for (name, fault) in faults {
        let (bad, good, gw) = pair(&rt, "timeouts:\n  first_byte_ms: 1000\n");
        rt.block_on(async {
            bad.control().set_fault(fault);
            let (ok, clean) = storm(&gw, 40).await;
            eprintln!("{name}: {ok} succeeded, {clean} clean errors of 40");
            match fault {
                // A node's 500 is an answer (in the protocol's shape), passed on as it is; the
                // healthy node serves the rest.
                Fault::Status500 => assert!(ok >= 10, "{name}: {ok}"),
                // A stream the node cut after its first chunk cannot move: it ends with the
                // protocol's error event (a clean error); the rest are served elsewhere.
                Fault::Flap(_) => assert!(ok >= 30, "{name}: {ok}"),
                // Nothing reached the client before the failure: every request moved.
                _ => assert_eq!(ok, 40, "{name}: every request served elsewhere"),
            }
            assert!(served(&good) > 0);
            bad.control().set_fault(Fault::None);
        });
    }
}

#[test]
fn a_reply_cut_mid_body_moves_to_another_node() {
    let rt = runtime();
    for fault in [Fault::CutChunked, Fault::CutLength] {
        let (bad, good, gw) = pair(&rt, "");
        rt.block_on(async {
            bad.control().set_fault(fault);
            // Pinned to the faulty node: nowhere else to go, so the client must see a failure.
            let r = request(&gw, Kind::OpenAI, 0)
                .header("x-fleet-pin-node", "bad")
                .send()
                .await;
            let v = verdict(Kind::OpenAI, r).await;
            assert_eq!(v, Verdict::CleanError, "{fault:?}");
            // Unpinned: the cut reply is retried on the healthy node.
            for i in 0..6 {
                let r = request(&gw, Kind::Ollama, i).send().await.unwrap();
                assert_eq!(r.status(), 200);
                assert_eq!(r.headers()["x-fleet-node"], "good");
                assert_eq!(verdict(Kind::Ollama, Ok(r)).await, Verdict::Succeeded);
            }
            assert!(served(&bad) > 0, "the faulty node was tried");
            assert!(served(&good) >= 6);
        });
    }
}

#[test]
fn a_hung_node_gives_its_requests_back_at_the_first_byte_timeout() {
    let rt = runtime();
    let (bad, _good, gw) = pair(&rt, "timeouts:\n  first_byte_ms: 300\n");
    rt.block_on(async {
        bad.control().set_fault(Fault::Hang);
        let t = std::time::Instant::now();
        let r = request(&gw, Kind::OpenAIStream, 0)
            .header("x-fleet-pin-node", "bad")
            .send()
            .await;
        assert_eq!(verdict(Kind::OpenAIStream, r).await, Verdict::CleanError);
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "not the 600 s read timeout"
        );
        let r = request(&gw, Kind::OpenAI, 1).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-fleet-node"], "good");
    });
}

#[test]
fn a_node_that_goes_offline_releases_its_requests() {
    let rt = runtime();
    // No first-byte limit (no history): only the node going offline frees the requests.
    let (bad, good, gw) = pair(
        &rt,
        // A poll timeout well above what a busy CI machine takes to answer one: a slow poll
        // must not take the node offline before the stream below has started.
        "health:\n  poll_interval_ms: 100\n  poll_timeout_ms: 1000\n  failures_before_offline: 1\n",
    );
    rt.block_on(async {
        // A stream in progress on the node, parked after its first chunk.
        bad.control().hold_after_first_chunk(true);
        let stream = request(&gw, Kind::OpenAIStream, 0)
            .header("x-fleet-pin-node", "bad")
            .send()
            .await
            .unwrap();
        assert_eq!(
            stream.status(),
            200,
            "the pinned stream started on the bad node"
        );
        bad.control().wait_parked(1).await;
        // Then the node hangs: a request sent now receives nothing.
        bad.control().set_fault(Fault::Hang);
        let waiting = request(&gw, Kind::Ollama, 1)
            .header("x-fleet-pin-node", "bad")
            .send();
        let moved = tokio::spawn(async move { verdict(Kind::Ollama, waiting.await).await });
        // The stream ends with the protocol's error event once the node is offline.
        assert_eq!(
            verdict(Kind::OpenAIStream, Ok(stream)).await,
            Verdict::CleanError
        );
        // The pinned request cannot move: a clean error, not a 45 s client timeout.
        assert_eq!(moved.await.unwrap(), Verdict::CleanError);
        // The stream's seat is freed once its error event is written.
        eventually("the bad node's seats released", || async {
            let status = admin_json(&gw, "/fleet/status").await;
            status["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["id"] == "bad")
                .is_some_and(|n| n["models"][0]["in_flight"] == 0)
        })
        .await;
        // An unpinned request goes to the healthy node.
        let r = request(&gw, Kind::OpenAI, 2).send().await.unwrap();
        assert_eq!(r.headers()["x-fleet-node"], "good");
        assert!(served(&good) >= 1);
    });
}

#[test]
fn failover_waits_in_the_next_nodes_queue_instead_of_refusing() {
    let rt = runtime();
    let dead = sim(&rt, &spec(4));
    let one = sim(&rt, &spec(1));
    let gw = Gateway::start(&fleet(&[
        node("dead", &dead, "      capacity: 4\n"),
        node("one", &one, "      capacity: 1\n"),
    ]));
    rt.block_on(async {
        // Killed after the gateway saw it up: routing still picks it until polls say otherwise.
        dead.control().set_fault(Fault::Refuse);
        let tasks: Vec<_> = (0..10)
            .map(|i| {
                let req = request(&gw, Kind::OpenAI, i);
                tokio::spawn(async move { req.send().await.unwrap() })
            })
            .collect();
        for t in tasks {
            let r = t.await.unwrap();
            assert_eq!(r.status(), 200, "{:?}", r.text().await);
        }
        assert_eq!(served(&one), 10);
        assert_eq!(
            one.control().stats().max_in_flight,
            1,
            "never over its one seat"
        );
    });
}

#[test]
fn sim_faults_switch_over_its_http_control_api() {
    let rt = runtime();
    let h = sim(&rt, &spec(1));
    rt.block_on(async {
        let c = client();
        let base = format!("http://{}", h.addr());
        // Switches go on a fresh connection each: the pooled one may be the one a cut reply
        // left broken.
        let set = |body: Value| {
            client()
                .post(format!("{base}/_sim/fault"))
                .json(&body)
                .send()
        };
        let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}]});
        for fault in ["cut_length", "cut_chunked"] {
            let r = set(json!({"fault": fault})).await.unwrap();
            assert_eq!(r.status(), 200);
            let r = c
                .post(format!("{base}/v1/chat/completions"))
                .json(&chat)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            assert!(r.bytes().await.is_err(), "{fault}: the body is cut off");
        }
        let r = set(json!({"fault": "slow_first_byte"})).await.unwrap();
        assert_eq!(r.status(), 400, "ms is required");
        let r = set(json!({"fault": "none"})).await.unwrap();
        assert_eq!(r.status(), 200);
        let now: Value = client()
            .get(format!("{base}/_sim/fault"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(now["fault"], "none");
        let r = c
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat)
            .send()
            .await
            .unwrap();
        assert!(r.json::<Value>().await.is_ok());
    });
}
