//! Stages 3-5 on live simulated nodes: node:model queues, holding queue, client abort,
//! pre-warm, rebalance, failover, mid-stream failure, auto-pull.

mod common;

use common::*;
use serde_json::{json, Value};

fn chat(model: &str) -> Value {
    json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
}

fn spec(seats: u32, models: &str) -> String {
    format!("seats: {seats}\ntokens_per_sec: 1000\nttft_ms: 1\nmemory_gb: 64\nreply_tokens: 4\nmodels:\n{models}")
}

fn spawn_chat(gw: &Gateway, model: &str) -> tokio::task::JoinHandle<reqwest::Response> {
    let (url, body) = (gw.url("/v1/chat/completions"), chat(model));
    tokio::spawn(async move { client().post(url).json(&body).send().await.expect("send") })
}

async fn waiting(gw: &Gateway) -> usize {
    admin_json(gw, "/fleet/queue").await["waiting"]
        .as_array()
        .map_or(0, Vec::len)
}

#[test]
fn ten_requests_on_a_two_seat_node_wait_in_the_gateway() {
    let rt = runtime();
    let a = sim(
        &rt,
        &spec(2, "  - {name: m:1b, size_gb: 1, loaded: true}\n"),
    );
    let gw = Gateway::start(&fleet(&[node("q-a", &a, "      capacity: 2\n")]));
    rt.block_on(async {
        a.control().hold_first_token(true);
        let reqs: Vec<_> = (0..10).map(|_| spawn_chat(&gw, "m:1b")).collect();
        a.control().wait_parked(2).await;
        eventually("8 requests waiting in the gateway", || async {
            waiting(&gw).await == 8
        })
        .await;
        let status = admin_json(&gw, "/fleet/status").await;
        let m = &status["nodes"][0]["models"][0];
        assert_eq!(
            (m["in_flight"].as_u64(), m["pending"].as_u64()),
            (Some(2), Some(8))
        );
        let s = a.control().stats();
        assert_eq!(
            (s.in_flight, s.queued),
            (2, 0),
            "the node holds exactly its seats, no backlog"
        );
        a.control().release();
        for r in reqs {
            let r = r.await.unwrap();
            assert_eq!(r.status(), 200);
        }
        assert_eq!(a.control().stats().max_in_flight, 2);
        assert_eq!(served(&a), 10);
    });
}

/// Completion mode, one seat taken: a long request, then a short one a moment later, wait
/// for it. The short one goes first (it is due first: arrived plus its predicted run) and
/// ends long before the long one; in spec-000 mode the seat goes in arrival order.
#[test]
fn a_short_request_does_not_wait_behind_a_long_one_that_came_just_before() {
    let order = |mode: &str| {
        let rt = runtime();
        // 100 tokens/s, answers as long as asked: 300 tokens take 3 s, 5 take 0.05 s.
        let a = sim(
            &rt,
            "seats: 1\ntokens_per_sec: 100\nttft_ms: 1\nmemory_gb: 64\nreply_tokens: 4096\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true}\n",
        );
        let gw = Gateway::start(&format!(
            "routing:\n  mode: {mode}\n{}",
            fleet(&[node("q-a", &a, "      capacity: 1\n")])
        ));
        let ask = |tokens: u32| {
            let (url, body) = (
                gw.url("/v1/chat/completions"),
                json!({"model": "m:1b", "max_tokens": tokens,
                    "messages": [{"role": "user", "content": "hi"}]}),
            );
            tokio::spawn(async move {
                let r = client().post(url).json(&body).send().await.expect("send");
                assert_eq!(r.status(), 200);
                r.bytes().await.unwrap();
                std::time::Instant::now()
            })
        };
        rt.block_on(async {
            // What answers take, learned: each runs into its limit.
            for tokens in [5, 40, 5, 40] {
                ask(tokens).await.unwrap();
            }
            a.control().hold_first_token(true);
            let running = ask(5);
            a.control().wait_parked(1).await;
            let long = ask(300);
            eventually("the long one waiting", || async { waiting(&gw).await == 1 }).await;
            let short = ask(5);
            eventually("both waiting", || async { waiting(&gw).await == 2 }).await;
            a.control().release();
            running.await.unwrap();
            let (long, short) = (long.await.unwrap(), short.await.unwrap());
            short < long
        })
    };
    assert!(order("completion"), "completion: the short one ends first");
    assert!(!order("spec"), "spec-000: arrival order");
}

#[test]
fn client_that_leaves_the_queue_takes_no_seat() {
    let rt = runtime();
    let a = sim(
        &rt,
        &spec(1, "  - {name: m:1b, size_gb: 1, loaded: true}\n"),
    );
    let gw = Gateway::start(&fleet(&[node("ab-a", &a, "      capacity: 1\n")]));
    rt.block_on(async {
        a.control().hold_first_token(true);
        let first = spawn_chat(&gw, "m:1b");
        a.control().wait_parked(1).await;
        let leaver = spawn_chat(&gw, "m:1b");
        eventually("one request queued", || async { waiting(&gw).await == 1 }).await;
        leaver.abort(); // the client hangs up while queued
        eventually("queue empty after the client left", || async {
            waiting(&gw).await == 0
        })
        .await;
        a.control().release();
        assert_eq!(first.await.unwrap().status(), 200);
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&chat("m:1b"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        // The seat is released just after the last byte reaches the client.
        eventually("no seat held, nobody waiting", || async {
            let m = &admin_json(&gw, "/fleet/status").await["nodes"][0]["models"][0];
            (m["in_flight"].as_u64(), m["pending"].as_u64()) == (Some(0), Some(0))
        })
        .await;
    });
    assert_eq!(
        served(&a),
        2,
        "the request whose client left never reached the node"
    );
}

/// `busy`, a one-seat node holding m:7b loaded, and `runner_up` (`spec`, four seats in the
/// gateway's config, `extra` more of it), behind a gateway checking pre-warm and rebalance
/// every 50 ms.
fn busy_and_runner_up(
    rt: &tokio::runtime::Runtime,
    (busy, runner_up): (&str, &str),
    (runner_up_spec, extra): (&str, &str),
) -> (
    fleetgate::sim::SimHandle,
    fleetgate::sim::SimHandle,
    Gateway,
) {
    let a = sim(rt, &spec(1, "  - {name: m:7b, size_gb: 5, loaded: true}\n"));
    let b = sim(rt, runner_up_spec);
    let gw = Gateway::start(&format!(
        "queue:\n  prewarm_interval_ms: 50\n  rebalance_interval_ms: 50\n{}",
        fleet(&[
            node(busy, &a, "      capacity: 1\n"),
            node(runner_up, &b, &format!("      capacity: 4\n{extra}"))
        ])
    ));
    (a, b, gw)
}

#[test]
fn prewarm_loads_the_runner_up_once_and_rebalance_moves_waiters_there() {
    let rt = runtime();
    let (a, b, gw) = busy_and_runner_up(
        &rt,
        ("pw-a", "pw-b"),
        (
            &spec(4, "  - {name: m:7b, size_gb: 5, cold_load_ms: 20}\n"),
            "",
        ),
    );
    rt.block_on(async {
        a.control().hold_first_token(true);
        let first = spawn_chat(&gw, "m:7b");
        a.control().wait_parked(1).await;
        // Five more pile up behind it at pw-a (hot) rather than cold-loading pw-b.
        let rest: Vec<_> = (0..5).map(|_| spawn_chat(&gw, "m:7b")).collect();
        // Depth 6 >= 3: pw-b gets one pre-warm load; then 5 waiting >= 4: rebalance moves 3.
        eventually("three moved requests served by pw-b", || async {
            served_by(&gw, "pw-b").await == 3
        })
        .await;
        assert_eq!(
            b.control().stats().loads,
            vec!["m:7b".to_string()],
            "exactly one load"
        );
        a.control().release();
        let mut nodes = vec![first.await.unwrap().headers()["x-fleet-node"]
            .to_str()
            .unwrap()
            .to_string()];
        for r in rest {
            let r = r.await.unwrap();
            assert_eq!(r.status(), 200);
            nodes.push(r.headers()["x-fleet-node"].to_str().unwrap().to_string());
        }
        // The first stays on pw-a; the three moved are pw-b's. Of the two left waiting at
        // pw-a, a rebalance tick before the release may move more: pw-b, warm and idle, would
        // finish them sooner than pw-a, still held (timing, not a miscount).
        assert_eq!(nodes[0], "pw-a");
        let on_b = nodes.iter().filter(|n| *n == "pw-b").count();
        assert!((3..=5).contains(&on_b), "{nodes:?}");
        let metrics = metrics(&gw).await;
        assert!(
            metrics.contains(r#"fleetgate_queue_prewarms_total{model="m:7b",node="pw-b"} 1"#),
            "{metrics}"
        );
        let key = r#"fleetgate_queue_rebalance_moves_total{from="pw-a",model="m:7b",to="pw-b"} "#;
        let moves: usize = metrics
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        assert!((3..=on_b).contains(&moves), "{moves} moves, {on_b} on pw-b");
    });
}

/// Completion mode's pre-warm does not start a load that only a model in use could make room
/// for. The runner-up holds x:7b, running a request, and is reading in y:7b for another; the
/// waiting model fits beside x:7b's weights as the node is polled, not beside y:7b's load as
/// well. Started, the load would have the node evict a model requests run on (or hold it until
/// they end) and their next requests bring it back. Once both are idle, the same queue gets
/// its pre-warm: an idle model is unloaded for it.
#[test]
fn prewarm_does_not_load_over_the_models_in_use() {
    let rt = runtime();
    let (a, b, gw) = busy_and_runner_up(
        &rt,
        ("cw-a", "cw-b"),
        (
            "seats: 4\ntokens_per_sec: 1000\nttft_ms: 1\nmemory_gb: 12\nreply_tokens: 4\nmodels:\n  - {name: x:7b, size_gb: 4, loaded: true}\n  - {name: y:7b, size_gb: 5, cold_load_ms: 3000}\n  - {name: m:7b, size_gb: 5, cold_load_ms: 20}\n",
            "      memory_gb: 12\n",
        ),
    );
    rt.block_on(async {
        // On cw-b x:7b runs (held before its first token) and y:7b is being read in.
        b.control().hold_first_token(true);
        let x = spawn_chat(&gw, "x:7b");
        b.control().wait_parked(1).await;
        let y = spawn_chat(&gw, "y:7b");
        // Sent before any m:7b queues (pre-warm looks from then on).
        eventually("y:7b sent to cw-b", || async {
            b.control().stats().by_model.get("y:7b") == Some(&1)
        })
        .await;
        a.control().hold_first_token(true);
        let first = spawn_chat(&gw, "m:7b");
        a.control().wait_parked(1).await;
        let rest: Vec<_> = (0..5).map(|_| spawn_chat(&gw, "m:7b")).collect();
        eventually("five waiting at cw-a", || async { waiting(&gw).await == 5 }).await;
        // A dozen pre-warm passes while x:7b and y:7b are in use: none loads m:7b on cw-b.
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        let text = metrics(&gw).await;
        assert!(
            text.contains(r#"fleetgate_queue_prewarms_total{model="m:7b",node="cw-b"} 0"#),
            "a pre-warm of m:7b on cw-b while x:7b ran and y:7b loaded there: {text}"
        );
        // Both done: idle, they make room, and the queue's pre-warm goes ahead.
        b.control().release();
        assert_eq!(x.await.unwrap().status(), 200);
        assert_eq!(y.await.unwrap().status(), 200);
        eventually("m:7b pre-warmed on cw-b", || async {
            metrics(&gw)
                .await
                .contains(r#"fleetgate_queue_prewarms_total{model="m:7b",node="cw-b"} 1"#)
        })
        .await;
        eventually("m:7b read in on cw-b", || async {
            b.control().stats().loads.contains(&"m:7b".to_string())
        })
        .await;
        a.control().release();
        assert_eq!(first.await.unwrap().status(), 200);
        for r in rest {
            assert_eq!(r.await.unwrap().status(), 200);
        }
    });
}

/// Requests a node served, from the gateway's own counter.
async fn served_by(gw: &Gateway, node: &str) -> u64 {
    let text = metrics(gw).await;
    text.lines()
        .filter(|l| {
            l.starts_with("fleetgate_proxy_requests_total{")
                && l.contains(&format!("node=\"{node}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn holding_queue_serves_when_a_node_comes_up() {
    let rt = runtime();
    let port = free_port();
    let yaml = format!(
        "health:\n  poll_interval_ms: 100\n  failures_before_offline: 1\nfleet:\n  nodes:\n    - id: late\n      url: http://127.0.0.1:{port}\n      backend: sim\n      models:\n        - {{name: m:1b, size_gb: 1}}\n"
    );
    let gw = Gateway::start(&yaml);
    rt.block_on(async {
        let req = spawn_chat(&gw, "m:1b");
        eventually("request in the holding queue", || async {
            admin_json(&gw, "/fleet/queue").await["holding"] == 1
        })
        .await;
        // The node comes up on its port later; the held request is then served.
        let spec: fleetgate::sim::SimSpec =
            serde_yaml::from_str(&spec(1, "  - {name: m:1b, size_gb: 1, loaded: true}\n")).unwrap();
        let node = fleetgate::sim::start_on(spec, format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap();
        let r = req.await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-fleet-node"], "late");
        let waited: u64 = r.headers()["x-fleet-queue-wait-ms"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(waited > 0);
        node.shutdown().await;
    });
}

#[test]
fn holding_queue_times_out_with_503_and_is_bounded_with_429() {
    let rt = runtime();
    let port = free_port();
    let yaml = format!(
        "health:\n  failures_before_offline: 1\nqueue:\n  holding_timeout_s: 1\n  holding_max: 1\nfleet:\n  nodes:\n    - id: never\n      url: http://127.0.0.1:{port}\n      backend: ollama\n      models:\n        - {{name: m:1b, size_gb: 1}}\n"
    );
    let gw = Gateway::start(&yaml);
    rt.block_on(async {
        let held = spawn_chat(&gw, "m:1b");
        eventually("one held", || async {
            admin_json(&gw, "/fleet/queue").await["holding"] == 1
        })
        .await;
        let r = client()
            .post(gw.url("/api/chat"))
            .json(&chat("m:1b"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429);
        assert!(r.headers().contains_key("retry-after"));
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("holding queue is full"),
            "{v}"
        );
        let started = std::time::Instant::now();
        let r = held.await.unwrap();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "2");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "no_provider_available");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    });
}

#[test]
fn failure_mid_stream_ends_the_stream_with_a_native_error() {
    let rt = runtime();
    let a = sim(
        &rt,
        &spec(1, "  - {name: m:1b, size_gb: 1, loaded: true}\n"),
    );
    let gw = Gateway::start(&fleet(&[node("ms-a", &a, "")]));
    a.control().set_fault(fleetgate::sim::Fault::DieMidStream);
    rt.block_on(async {
        let mut body = chat("m:1b");
        body["stream"] = json!(true);
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "headers were already sent");
        let mut text = String::new();
        let mut r = r;
        while let Ok(Some(c)) = r.chunk().await {
            text.push_str(&String::from_utf8_lossy(&c));
        }
        assert!(text.starts_with("data: "), "{text}");
        assert!(!text.contains("[DONE]"));
        let last = text.trim_end().lines().last().unwrap();
        let err: Value = serde_json::from_str(last.trim_start_matches("data: ")).unwrap();
        assert_eq!(err["error"]["code"], "upstream_error", "{text}");
        // Ollama's NDJSON gets an Ollama-shaped error line.
        let r = client()
            .post(gw.url("/api/chat"))
            .json(&chat("m:1b"))
            .send()
            .await
            .unwrap();
        let text = r.text().await.unwrap_or_default();
        let last: Value = serde_json::from_str(text.trim_end().lines().last().unwrap()).unwrap();
        assert!(
            last["error"].as_str().unwrap().contains("mid-stream"),
            "{text}"
        );
    });
    assert_eq!(served(&a), 2, "no retry after bytes were sent");
}

#[test]
fn auto_pull_fetches_a_model_no_node_has() {
    let rt = runtime();
    let a = sim(
        &rt,
        &spec(1, "  - {name: m:1b, size_gb: 1, loaded: true}\n"),
    );
    let yaml = format!(
        "queue:\n  auto_pull: true\n{}",
        fleet(&[node("ap-a", &a, "")])
    );
    let gw = Gateway::start(&yaml);
    let gw2 = Gateway::start(&fleet(&[node("ap-b", &a, "")]));
    rt.block_on(async {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&chat("fresh:1b"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-fleet-served-model"], "fresh:1b");
        // Off by default: the same request on a gateway without auto_pull is a 404.
        let r = client()
            .post(gw2.url("/v1/chat/completions"))
            .json(&chat("other:1b"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
    });
    assert_eq!(
        a.control().stats().by_model.get("fresh:1b"),
        Some(&2),
        "one pull, one chat"
    );
}
