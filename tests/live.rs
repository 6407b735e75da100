//! Live fleet state, end to end: real gateway, simulated nodes and the real `fleetgate agent`
//! binary on 127.0.0.1. Thresholds are short in config; tests poll `/fleet/status` with a
//! deadline instead of sleeping to synchronise.

mod common;

use std::time::{Duration, Instant};

use common::*;
use fleetgate::sim::Fault;
use serde_json::{json, Value};

const SIM: &str = "seats: 2\ntokens_per_sec: 2000\nttft_ms: 2\nmemory_gb: 64\nreply_tokens: 8\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true, cold_load_ms: 5}\n";
const FAST: &str = "health:\n  poll_interval_ms: 100\n  poll_timeout_ms: 500\n  failures_before_offline: 1\n  warmup_s: 1\n  heartbeat_miss_s: 1\n";
const TOKEN: &str = "s3cret";

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hello there"}]})
}

/// `/fleet/status` node `id`.
async fn node_status(gw: &Gateway, id: &str) -> Value {
    let s: Value = client()
        .get(gw.admin_url("/fleet/status"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == id)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Poll node `id`'s status until `ok` holds; panics with the last status after `within`.
async fn wait_node(gw: &Gateway, id: &str, within: Duration, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let n = node_status(gw, id).await;
        if ok(&n) {
            return n;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting on {id}: {n:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A chat request, optionally pinned to a node: (status, serving node).
async fn ask(gw: &Gateway, pin: Option<&str>) -> (u16, String) {
    let mut r = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("m:1b"));
    if let Some(p) = pin {
        r = r.header("x-fleet-pin-node", p);
    }
    let r = r.send().await.unwrap();
    let node = r
        .headers()
        .get("x-fleet-node")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (r.status().as_u16(), node)
}

async fn heartbeat(gw: &Gateway, token: Option<&str>, body: Value) -> (u16, Value) {
    let mut r = client()
        .post(gw.admin_url("/fleet/nodes/heartbeat"))
        .json(&body);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn hb(id: &str, url: &str, extra: Value) -> Value {
    let mut v = json!({"node_id": id, "backend_url": url, "backend": "sim",
        "free_memory_gb": 40.0, "total_memory_gb": 64.0, "pressure": "normal", "cpu_percent": 5.0});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        for (k, x) in e {
            o.insert(k.clone(), x.clone());
        }
    }
    v
}

fn health(n: &Value) -> &str {
    n["health"].as_str().unwrap_or("")
}

#[test]
fn stopped_node_is_excluded_then_warms_up_then_serves_again() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let b = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "{FAST}{}",
        fleet(&[node("st-a", &a, ""), node("st-b", &b, "")])
    ));
    rt.block_on(async {
        assert_eq!(ask(&gw, Some("st-a")).await, (200, "st-a".into()));
        let before = served(&a);
        a.control().set_fault(Fault::Refuse);
        let t = Instant::now();
        wait_node(&gw, "st-a", Duration::from_secs(2), |n| {
            health(n) == "offline"
        })
        .await;
        let took = t.elapsed();
        assert!(
            took < Duration::from_millis(600),
            "excluded after {took:?} (poll 100 ms)"
        );
        for _ in 0..4 {
            assert_eq!(ask(&gw, None).await, (200, "st-b".into()));
        }
        assert_eq!(
            ask(&gw, Some("st-a")).await.0,
            503,
            "offline: strict pin fails"
        );

        a.control().set_fault(Fault::None);
        let n = wait_node(&gw, "st-a", Duration::from_secs(2), |n| {
            health(n) != "offline"
        })
        .await;
        assert_eq!(health(&n), "warmup", "{n:#}");
        assert!(n["warmup_until_ms"].as_u64().is_some());
        for _ in 0..4 {
            assert_eq!(ask(&gw, None).await, (200, "st-b".into()));
        }
        assert_eq!(
            ask(&gw, Some("st-a")).await.0,
            503,
            "warmup: strict pin fails"
        );
        let still = node_status(&gw, "st-a").await;
        assert_eq!(
            health(&still),
            "warmup",
            "the requests above ran during warmup"
        );
        assert_eq!(served(&a), before, "nothing reached the node meanwhile");

        wait_node(&gw, "st-a", Duration::from_secs(3), |n| {
            health(n) == "online"
        })
        .await;
        assert_eq!(ask(&gw, Some("st-a")).await, (200, "st-a".into()));
    });
}

#[test]
fn model_loaded_through_node_api_is_hot_then_recently_unloaded() {
    let rt = runtime();
    let a = sim(
        &rt,
        "seats: 2\ntokens_per_sec: 2000\nttft_ms: 2\nmemory_gb: 64\nreply_tokens: 4\nmodels:\n  - {name: m:1b, size_gb: 1, cold_load_ms: 5}\n",
    );
    let gw = Gateway::start(&format!("{FAST}{}", fleet(&[node("ld-a", &a, "")])));
    let model = |n: &Value| n["models"][0].clone();
    rt.block_on(async {
        let n = node_status(&gw, "ld-a").await;
        assert_eq!(model(&n)["warmth"], "cold", "{n:#}");
        // Load it through the node's own Ollama API, not through the gateway.
        let node_url = format!("http://{}/api/generate", a.addr());
        let r = client()
            .post(&node_url)
            .json(&json!({"model": "m:1b", "prompt": "hi", "stream": false}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let n = wait_node(&gw, "ld-a", Duration::from_secs(2), |n| {
            model(n)["warmth"] == "hot"
        })
        .await;
        assert_eq!(model(&n)["loaded"], true);
        assert!(model(&n)["resident_gb"].as_f64().unwrap() > 1.0, "{n:#}");
        // Unload it the Ollama way: keep_alive 0.
        let r = client()
            .post(&node_url)
            .json(&json!({"model": "m:1b", "prompt": "bye", "stream": false, "keep_alive": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let n = wait_node(&gw, "ld-a", Duration::from_secs(2), |n| {
            model(n)["warmth"] != "hot"
        })
        .await;
        assert_eq!(model(&n)["warmth"], "recent", "{n:#}");
        assert!(model(&n)["unloaded_at_ms"].as_u64().is_some());
    });
}

#[test]
fn agent_heartbeats_pressure_thermal_token_and_missed_heartbeats() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let b = sim(&rt, SIM);
    let gw = Gateway::start(
        &format!(
            "{FAST}{}",
            fleet(&[node("hb-a", &a, ""), node("hb-b", &b, "")])
        )
        .replace("fleet:\n", &format!("fleet:\n  agent_token: {TOKEN}\n")),
    );
    let url = format!("http://{}", a.addr());
    // hb-a's own agent token, signed with the shared secret.
    let own = fleetgate::admin::auth::node_token(TOKEN, "hb-a");
    let tok = own.as_str();
    rt.block_on(async {
        // Critical memory pressure: eliminated.
        let (st, _) = heartbeat(
            &gw,
            Some(tok),
            hb("hb-a", &url, json!({"pressure": "critical"})),
        )
        .await;
        assert_eq!(st, 200);
        assert_eq!(node_status(&gw, "hb-a").await["pressure"], "critical");
        assert_eq!(ask(&gw, Some("hb-a")).await.0, 503);
        for _ in 0..3 {
            assert_eq!(ask(&gw, None).await, (200, "hb-b".into()));
        }
        // A wrong or missing token: 401 and nothing changes.
        let (st, _) = heartbeat(&gw, Some("wrong"), hb("hb-a", &url, json!({}))).await;
        assert_eq!(st, 401);
        let (st, _) = heartbeat(&gw, None, hb("hb-a", &url, json!({}))).await;
        assert_eq!(st, 401);
        let n = node_status(&gw, "hb-a").await;
        assert_eq!(n["pressure"], "critical");
        assert_eq!(n["agent"]["heartbeats"], 1);
        // Back to normal: served again.
        heartbeat(&gw, Some(tok), hb("hb-a", &url, json!({}))).await;
        assert_eq!(ask(&gw, Some("hb-a")).await, (200, "hb-a".into()));
        // Thermally throttled: eliminated.
        heartbeat(
            &gw,
            Some(tok),
            hb("hb-a", &url, json!({"thermal_throttled": true})),
        )
        .await;
        assert_eq!(node_status(&gw, "hb-a").await["thermal_throttled"], true);
        assert_eq!(ask(&gw, Some("hb-a")).await.0, 503);
        heartbeat(&gw, Some(tok), hb("hb-a", &url, json!({}))).await;
        assert_eq!(ask(&gw, Some("hb-a")).await.0, 200);
        // Heartbeats stop: offline after heartbeat_miss (1 s), though the backend answers polls.
        let t = Instant::now();
        wait_node(&gw, "hb-a", Duration::from_secs(3), |n| {
            health(n) == "offline"
        })
        .await;
        assert!(
            t.elapsed() >= Duration::from_millis(900),
            "not before the threshold"
        );
        assert_eq!(ask(&gw, Some("hb-a")).await.0, 503);
        // Reconnect: warmup, then online.
        heartbeat(&gw, Some(tok), hb("hb-a", &url, json!({}))).await;
        assert_eq!(health(&node_status(&gw, "hb-a").await), "warmup");
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            heartbeat(&gw, Some(tok), hb("hb-a", &url, json!({}))).await;
            if health(&node_status(&gw, "hb-a").await) == "online" {
                break;
            }
            assert!(Instant::now() < deadline, "warmup did not end");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(ask(&gw, Some("hb-a")).await, (200, "hb-a".into()));
        let metrics = metrics(&gw).await;
        assert!(
            metrics
                .contains("fleetgate_admin_heartbeats_total{node=\"-\",result=\"unauthorized\"} 2"),
            "{metrics}"
        );
    });
}

#[test]
fn heartbeats_without_token_configured_are_refused_and_unknown_nodes_need_registration() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let url = format!("http://{}", a.addr());
    let closed = Gateway::start(&fleet(&[node("rg-a", &a, "")]));
    rt.block_on(async {
        let (st, _) = heartbeat(&closed, Some("anything"), hb("rg-a", &url, json!({}))).await;
        assert_eq!(st, 403, "no token configured: refused, not open");
    });
    let gw = Gateway::start(&format!(
        "  admin_token: {TOKEN}\n{}",
        fleet(&[node("rg-a", &a, "")])
    ));
    rt.block_on(async {
        let (st, _) = heartbeat(&gw, Some(TOKEN), hb("newcomer", &url, json!({}))).await;
        assert_eq!(st, 404, "registration is off by default");
        assert_eq!(node_status(&gw, "newcomer").await, Value::Null);
    });
    let dynamic = Gateway::start(&format!(
        "  admin_token: {TOKEN}\nfleet:\n  allow_registration: true\n  nodes: []\n"
    ));
    rt.block_on(async {
        assert_eq!(ask(&dynamic, None).await.0, 404, "empty fleet: no model");
        let (st, body) = heartbeat(&dynamic, Some(TOKEN), hb("newcomer", &url, json!({}))).await;
        assert_eq!(st, 200, "{body}");
        assert_eq!(body["registered"], true);
        let n = node_status(&dynamic, "newcomer").await;
        assert_eq!(n["dynamic"], true);
        assert_eq!(
            n["models"][0]["name"], "m:1b",
            "polled at registration: {n:#}"
        );
        assert_eq!(ask(&dynamic, None).await, (200, "newcomer".into()));
        let (_, again) = heartbeat(&dynamic, Some(TOKEN), hb("newcomer", &url, json!({}))).await;
        assert_eq!(again["registered"], false);
    });
}

#[test]
fn admin_pause_resume_drain() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let b = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "  admin_token: {TOKEN}\n{}",
        fleet(&[node("ad-a", &a, ""), node("ad-b", &b, "")])
    ));
    let post = |path: &str, token: Option<&str>| {
        let mut r = client().post(gw.admin_url(path));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    rt.block_on(async {
        assert_eq!(
            post("/fleet/nodes/ad-a/pause", None)
                .await
                .unwrap()
                .status(),
            401
        );
        assert_eq!(
            post("/fleet/nodes/ad-a/pause", Some("x"))
                .await
                .unwrap()
                .status(),
            401
        );
        assert_eq!(health(&node_status(&gw, "ad-a").await), "online");
        assert_eq!(
            post("/fleet/nodes/nope/pause", Some(TOKEN))
                .await
                .unwrap()
                .status(),
            404
        );

        let r = post("/fleet/nodes/ad-a/pause", Some(TOKEN)).await.unwrap();
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["health"], "paused");
        assert_eq!(ask(&gw, Some("ad-a")).await.0, 503, "effective immediately");
        assert_eq!(ask(&gw, None).await, (200, "ad-b".into()));
        assert_eq!(node_status(&gw, "ad-a").await["control"]["paused"], true);

        post("/fleet/nodes/ad-a/resume", Some(TOKEN)).await.unwrap();
        assert_eq!(ask(&gw, Some("ad-a")).await, (200, "ad-a".into()));

        // Drain: a request already running finishes; new ones go elsewhere.
        a.control().hold_first_token(true);
        let gw_url = gw.url("/v1/chat/completions");
        let running = tokio::spawn(async move {
            client()
                .post(gw_url)
                .header("x-fleet-pin-node", "ad-a")
                .json(&chat("m:1b"))
                .send()
                .await
                .unwrap()
                .status()
        });
        a.control().wait_parked(1).await;
        post("/fleet/nodes/ad-a/drain", Some(TOKEN)).await.unwrap();
        assert_eq!(health(&node_status(&gw, "ad-a").await), "draining");
        assert_eq!(ask(&gw, Some("ad-a")).await.0, 503);
        assert_eq!(ask(&gw, None).await, (200, "ad-b".into()));
        a.control().release();
        assert_eq!(running.await.unwrap(), 200, "in-flight request finished");
        let m = metrics(&gw).await;
        assert!(
            m.contains("fleetgate_fleet_node_draining{node=\"ad-a\"} 1"),
            "{m}"
        );
    });
}

#[test]
fn breaker_opens_after_n_faults_then_half_open_success_closes_it() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "breaker:\n  failure_threshold: 3\n  cooldown_s: 2\nqueue:\n  holding_timeout_s: 1\n{}",
        fleet(&[node("br-a", &a, "")])
    ));
    let breaker = |n: &Value| {
        n["models"][0]["breaker"]["state"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    rt.block_on(async {
        a.control().set_fault(Fault::Status500);
        for i in 0..3 {
            assert_eq!(ask(&gw, None).await.0, 500, "request {i} reaches the failing node");
        }
        // The breaker hears of a response after the client has it: wait for the third.
        wait_node(&gw, "br-a", Duration::from_secs(2), |n| breaker(n) == "open").await;
        let reached = served(&a);
        let t = Instant::now();
        assert_eq!(
            ask(&gw, None).await.0,
            503,
            "open breaker: held (1 s), then 503, never sent to the node"
        );
        assert_eq!(served(&a), reached);
        let m = metrics(&gw).await;
        assert!(m.contains("fleetgate_fleet_breaker_state{model=\"m:1b\",node=\"br-a\"} 1"), "{m}");

        a.control().set_fault(Fault::None);
        let n = wait_node(&gw, "br-a", Duration::from_secs(3), |n| breaker(n) == "half_open").await;
        assert!(t.elapsed() >= Duration::from_millis(1800), "cooldown respected: {n:#}");
        assert_eq!(ask(&gw, None).await, (200, "br-a".into()), "the half-open trial");
        let n = wait_node(&gw, "br-a", Duration::from_secs(2), |n| breaker(n) == "closed").await;
        assert_eq!(n["models"][0]["breaker"]["consecutive_faults"], 0);
        let m = metrics(&gw).await;
        assert!(m.contains("fleetgate_fleet_breaker_transitions_total{model=\"m:1b\",node=\"br-a\",to=\"closed\"} 1"), "{m}");
    });
}

/// The model named `name` in a node's status.
fn model_of<'a>(n: &'a Value, name: &str) -> &'a Value {
    n["models"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == name))
        .unwrap_or(&Value::Null)
}

#[test]
fn broken_stream_counts_as_a_fault_and_4xx_does_not() {
    let rt = runtime();
    let a = sim(
        &rt,
        &format!("{SIM}  - {{name: e:1b, size_gb: 1, loaded: true, embedding: true}}\n"),
    );
    let gw = Gateway::start(&format!(
        "breaker:\n  failure_threshold: 2\n  cooldown_s: 60\nqueue:\n  holding_timeout_s: 1\n{}",
        fleet(&[node("bs-a", &a, "")])
    ));
    rt.block_on(async {
        for _ in 0..3 {
            let r = client()
                .post(gw.url("/v1/chat/completions"))
                .json(&chat("e:1b"))
                .send()
                .await
                .unwrap();
            assert_eq!(
                r.status(),
                400,
                "the node refuses chat on an embedding model"
            );
            assert_eq!(r.headers()["x-fleet-node"], "bs-a");
        }
        let n = node_status(&gw, "bs-a").await;
        assert_eq!(model_of(&n, "e:1b")["breaker"]["state"], "closed", "{n:#}");
        a.control().set_fault(Fault::DieMidStream);
        for _ in 0..2 {
            let mut body = chat("m:1b");
            body["stream"] = json!(true);
            let r = client()
                .post(gw.url("/v1/chat/completions"))
                .json(&body)
                .send()
                .await;
            if let Ok(r) = r {
                let _ = r.text().await;
            }
        }
        let n = wait_node(&gw, "bs-a", Duration::from_secs(2), |n| {
            model_of(n, "m:1b")["breaker"]["state"] == "open"
        })
        .await;
        assert_eq!(model_of(&n, "m:1b")["breaker"]["consecutive_faults"], 2);
        assert_eq!(
            n["breaker"]["state"], "closed",
            "a model fault leaves the node breaker"
        );
        a.control().set_fault(Fault::None);
        assert_eq!(ask(&gw, None).await.0, 503);
    });
}

#[test]
fn observed_tokens_per_second_ttft_and_calibration() {
    let rt = runtime();
    let a = sim(&rt, "seats: 2\ntokens_per_sec: 500\nttft_ms: 20\nmemory_gb: 64\nreply_tokens: 20\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true}\n");
    let gw = Gateway::start(&format!(
        "routing:\n  chars_per_token: 3.0\n{}",
        fleet(&[node("ob-a", &a, "")])
    ));
    rt.block_on(async {
        let text = "word ".repeat(200);
        for stream in [false, true] {
            let body = json!({"model": "m:1b", "stream": stream,
                "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": text}]});
            let r = client()
                .post(gw.url("/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.text().await.unwrap();
        }
        // Each request is accounted just after its last byte reaches the client.
        let both =
            r#"fleetgate_proxy_time_per_output_token_seconds_count{model="m:1b",node="ob-a"} 2"#;
        eventually("both requests accounted", || async {
            metrics(&gw).await.contains(both)
        })
        .await;
        // The calibration is the last thing a request's accounting updates.
        eventually("both prompts calibrated", || async {
            let s = admin_json(&gw, "/fleet/status").await;
            s["chars_per_token"][0][1].as_f64().is_some_and(|v| v > 3.3)
        })
        .await;
        let s = admin_json(&gw, "/fleet/status").await;
        let m = &s["nodes"][0]["models"][0];
        let tps = m["observed_tps"].as_f64().expect("observed tps");
        assert!(
            (100.0..5000.0).contains(&tps),
            "sim decodes 500 tok/s: {tps}"
        );
        assert!(m["ttft_ms"].as_f64().unwrap() >= 20.0, "{m}");
        // p75 latency (Signal 4) from the same completed requests: at least the 20 ms TTFT.
        assert!(m["p75_ms"].as_f64().expect("p75") >= 20.0, "{m}");
        // The sim counts ceil(chars/4) tokens: calibration moves from 3.0 toward 4.
        let cpt = &s["chars_per_token"][0];
        assert_eq!(cpt[0], "m:1b");
        let v = cpt[1].as_f64().unwrap();
        assert!(v > 3.3 && v <= 4.0, "3 -> 3.2 -> 3.36: {cpt}");
        // The calibrated figure is what routing (and explain) now estimate with: 1000 chars.
        let body = json!({"model": "m:1b", "messages": [{"role": "user", "content": text}]});
        let e: Value = explain(&gw, "/fleet/explain", &body).await;
        let want = (1000.0 / v).ceil() as u64 + 4;
        assert_eq!(
            e["prompt_tokens"].as_u64(),
            Some(want),
            "not 338 (3.0 chars/token)"
        );
        // Tokens in and out, and the decode time per token, as Prometheus sees them.
        let text = metrics(&gw).await;
        let out = r#"fleetgate_proxy_tokens_total{direction="out",model="m:1b",node="ob-a"} 40"#;
        assert!(text.contains(out), "two replies of 20 tokens: {text}");
        let prompt = r#"fleetgate_proxy_tokens_total{direction="in",model="m:1b",node="ob-a"}"#;
        assert!(text.contains(prompt), "{text}");
        let tpot =
            r#"fleetgate_proxy_time_per_output_token_seconds_count{model="m:1b",node="ob-a"} 2"#;
        assert!(text.contains(tpot), "{text}");
    });
}

#[test]
fn learned_baselines_survive_a_restart() {
    use fleetgate::fleet::{Learner, LearnerStore, Sample};
    let rt = runtime();
    let a = sim(&rt, SIM);
    let dir = std::env::temp_dir().join(format!("fleetgate-live-learn-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let yaml = format!(
        "  admin_token: {TOKEN}\nqueue:\n  holding_timeout_s: 1\nlearning:\n  state_dir: {}\n  save_interval_s: 1\n{}",
        dir.display(),
        fleet(&[node("lr-a", &a, "      learning: true\n")])
    );
    let url = format!("http://{}", a.addr());
    {
        // No history: a learning node is held back during its first days.
        let fresh = dir.join("fresh");
        let gw =
            Gateway::start(&yaml.replace(&dir.display().to_string(), &fresh.display().to_string()));
        rt.block_on(async {
            heartbeat(&gw, Some(TOKEN), hb("lr-a", &url, json!({}))).await;
            let n = node_status(&gw, "lr-a").await;
            assert!(
                n["learning"]["days_observed"].as_f64().unwrap() < 0.01,
                "{n:#}"
            );
            assert_eq!(ask(&gw, None).await.0, 503);
        });
    }
    // Eight days of an idle machine, learned with an injected clock, saved as the state file.
    let now = fleetgate::services::now_ms();
    let mut l = Learner::default();
    let mut t = now - 8 * 86_400_000;
    while t < now {
        l.observe(
            t,
            Sample {
                cpu_percent: 3.0,
                owner_mem_fraction: 0.05,
                total_gb: 64.0,
            },
        );
        t += 600_000;
    }
    let mut store = LearnerStore::default();
    store.nodes.insert("lr-a".into(), l);
    store.save(&dir).unwrap();
    let saved = LearnerStore::load(&dir).unwrap();
    let gw = Gateway::start(&yaml);
    rt.block_on(async {
        heartbeat(
            &gw,
            Some(TOKEN),
            hb("lr-a", &url, json!({"free_memory_gb": 60.0})),
        )
        .await;
        let n = node_status(&gw, "lr-a").await;
        assert!(
            n["learning"]["days_observed"].as_f64().unwrap() >= 7.9,
            "{n:#}"
        );
        assert!(
            n["learning"]["availability"].as_f64().unwrap() > 0.8,
            "{n:#}"
        );
        assert_eq!(ask(&gw, None).await, (200, "lr-a".into()));
        // The saver rewrites the file (with this heartbeat folded in).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let back = LearnerStore::load(&dir).unwrap();
            if back.nodes.contains_key("lr-a") && back != saved {
                break;
            }
            assert!(Instant::now() < deadline, "state file not rewritten");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn agent_binary_heartbeats_and_drains_on_sigterm() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let b = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "  admin_token: {TOKEN}\n{}",
        fleet(&[node("ag-a", &a, ""), node("ag-b", &b, "")])
    ));
    // A fake /proc + /sys: critical PSI memory pressure.
    let root = std::env::temp_dir().join(format!("fleetgate-agent-root-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("proc/pressure")).unwrap();
    std::fs::write(
        root.join("proc/meminfo"),
        "MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n",
    )
    .unwrap();
    let psi = root.join("proc/pressure/memory");
    std::fs::write(
        &psi,
        "some avg10=70.00 avg60=1 avg300=1 total=1\nfull avg10=40.00 avg60=1 avg300=1 total=1\n",
    )
    .unwrap();
    std::fs::write(root.join("proc/stat"), "cpu  100 0 100 700 100 0 0 0\n").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["agent", "--config", "/nonexistent.yaml", "--gateway"])
        .arg(format!("http://{}", gw.admin))
        .args([
            "--node-id",
            "ag-a",
            "--backend",
            "sim",
            "--interval-ms",
            "100",
        ])
        .arg("--backend-url")
        .arg(format!("http://{}", a.addr()))
        .arg("--sys-root")
        .arg(&root)
        .env("FLEETGATE_AGENT_TOKEN", TOKEN)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("spawn fleetgate agent");
    rt.block_on(async {
        let n = wait_node(&gw, "ag-a", Duration::from_secs(10), |n| {
            n["agent"].is_object()
        })
        .await;
        assert_eq!(
            n["pressure"], "critical",
            "read from the fake PSI file: {n:#}"
        );
        assert!(
            (n["free_memory_gb"].as_f64().unwrap() - 34.36).abs() < 0.01,
            "{n:#}"
        );
        assert_eq!(
            n["agent"]["last"]["backend_report"]["loaded_models"][0],
            "m:1b"
        );
        assert_eq!(
            ask(&gw, Some("ag-a")).await.0,
            503,
            "critical pressure: eliminated"
        );
        std::fs::write(
            &psi,
            "some avg10=0.00 avg60=0 avg300=0 total=1\nfull avg10=0.00 avg60=0 avg300=0 total=1\n",
        )
        .unwrap();
        wait_node(&gw, "ag-a", Duration::from_secs(5), |n| {
            n["pressure"] == "normal"
        })
        .await;
        assert_eq!(ask(&gw, Some("ag-a")).await, (200, "ag-a".into()));
    });
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "agent exits cleanly after the drain heartbeat: {status:?}"
    );
    rt.block_on(async {
        let n = node_status(&gw, "ag-a").await;
        assert_eq!(health(&n), "draining", "{n:#}");
        assert_eq!(n["agent"]["last"]["draining"], true);
        assert_eq!(ask(&gw, Some("ag-a")).await.0, 503);
        assert_eq!(ask(&gw, None).await, (200, "ag-b".into()));
    });
    let _ = std::fs::remove_dir_all(&root);
}

/// A minimal backend on 127.0.0.1 answering fixed bodies (vLLM / llama.cpp shapes).
fn fake_backend(rt: &tokio::runtime::Runtime, routes: Vec<(&'static str, String)>) -> String {
    let mut app = axum::Router::new();
    for (path, body) in routes {
        app = app.route(path, axum::routing::get(move || async move { body }));
    }
    serve(rt, app)
}

/// Serve `app` on 127.0.0.1; its base URL.
fn serve(rt: &tokio::runtime::Runtime, app: axum::Router) -> String {
    let l = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = l.local_addr().unwrap();
    rt.spawn(async move { axum::serve(l, app).await });
    format!("http://{addr}")
}

/// Servers given as `backend: openai` are asked whether they say their seats: SGLang's
/// `/get_server_info` (the flag it was started with; without it, SGLang's ceiling of thousands
/// is not taken), llama.cpp's `/props`, asked again after an ask nothing answered (a 503, a
/// 429).
/// Those that say them are sent that many at once, from `backend`; the others keep a batching
/// server's default until answers show more.
#[test]
fn a_server_behind_backend_openai_that_says_its_seats_is_taken_at_its_word() {
    let rt = runtime();
    let models =
        |id: &str| format!(r#"{{"object":"list","data":[{{"id":"{id}","object":"model"}}]}}"#);
    let sglang = fake_backend(
        &rt,
        vec![
            ("/v1/models", models("qwen")),
            ("/get_server_info", r#"{"max_running_requests":48,"version":"0.4.6","internal_states":[{"max_running_requests":48}]}"#.into()),
        ],
    );
    let sglang_auto = fake_backend(
        &rt,
        vec![
            ("/v1/models", models("qwen")),
            ("/get_server_info", r#"{"max_running_requests":null,"internal_states":[{"max_running_requests":2048}]}"#.into()),
        ],
    );
    // llama.cpp, busy at the first two asks: `/props` answers 503, then 429, then its slots.
    let asks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let llama = {
        let asks = asks.clone();
        let body = models("gemma");
        let app = axum::Router::new()
            .route(
                "/v1/models",
                axum::routing::get(move || async move { body }),
            )
            .route(
                "/props",
                axum::routing::get(move || async move {
                    match asks.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                        0 => (axum::http::StatusCode::SERVICE_UNAVAILABLE, String::new()),
                        1 => (axum::http::StatusCode::TOO_MANY_REQUESTS, String::new()),
                        _ => (
                            axum::http::StatusCode::OK,
                            r#"{"total_slots":3}"#.to_string(),
                        ),
                    }
                }),
            );
        serve(&rt, app)
    };
    let plain = fake_backend(&rt, vec![("/v1/models", models("phi"))]);
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 100\nfleet:\n  nodes:\n    - {{id: sg, url: \"{sglang}\", backend: openai}}\n    - {{id: sg-auto, url: \"{sglang_auto}\", backend: openai}}\n    - {{id: lc, url: \"{llama}\", backend: openai}}\n    - {{id: plain, url: \"{plain}\", backend: openai}}\n"
    ));
    rt.block_on(async {
        eventually("llama.cpp asked again", || async {
            node_status(&gw, "lc").await["seats"] == 3
        })
        .await;
        for (id, seats, from) in [
            ("sg", 48, "backend"),
            ("sg-auto", 64, "default_batching"),
            ("lc", 3, "backend"),
            ("plain", 64, "default_batching"),
        ] {
            let n = node_status(&gw, id).await;
            assert_eq!(
                (n["seats"].as_u64(), n["seats_from"].as_str()),
                (Some(seats), Some(from)),
                "{n:#}"
            );
        }
        // Several polls since: an answer is not asked for again.
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    });
    assert_eq!(
        asks.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "the 503, the 429, then the answer"
    );
}

#[test]
fn vllm_metrics_and_llamacpp_slots_are_polled() {
    let rt = runtime();
    let vllm = fake_backend(
        &rt,
        vec![
            ("/v1/models", r#"{"object":"list","data":[{"id":"qwen","object":"model","max_model_len":32768}]}"#.into()),
            ("/metrics", "vllm:num_requests_running{engine=\"0\",model_name=\"qwen\"} 3.0\nvllm:num_requests_waiting{engine=\"0\",model_name=\"qwen\"} 2.0\n".into()),
        ],
    );
    let llama = fake_backend(
        &rt,
        vec![
            ("/v1/models", r#"{"object":"list","data":[{"id":"gemma","meta":{"n_ctx_train":131072}}]}"#.into()),
            ("/props", r#"{"default_generation_settings":{"n_ctx":8192},"total_slots":4}"#.into()),
            ("/slots", r#"[{"id":0,"is_processing":true},{"id":1,"is_processing":false},{"id":2,"is_processing":false},{"id":3,"is_processing":false}]"#.into()),
        ],
    );
    let gw = Gateway::start(&format!(
        "fleet:\n  nodes:\n    - {{id: vl, url: \"{vllm}\", backend: vllm}}\n    - {{id: lc, url: \"{llama}\", backend: llamacpp}}\n"
    ));
    rt.block_on(async {
        let v = node_status(&gw, "vl").await;
        let q = model_of(&v, "qwen");
        assert_eq!(
            (q["in_flight"].as_u64(), q["pending"].as_u64()),
            (Some(3), Some(2)),
            "{v:#}"
        );
        assert_eq!(q["max_context"], 32768);
        let l = node_status(&gw, "lc").await;
        assert_eq!(l["seats"], 4, "{l:#}");
        let g = model_of(&l, "gemma");
        assert_eq!(g["in_flight"], 1);
        assert_eq!(
            g["max_context"], 8192,
            "the context the server runs with: {l:#}"
        );
    });
}
