//! Tenants on a live gateway: API keys (401 in each protocol's shape, keys never logged),
//! weighted fair order between tenants in a node:model queue, per-tenant limits (429 with
//! Retry-After and `x-ratelimit-*`), usage counters, and the output-budget clamp.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const KEY_A: &str = "sk-tenant-alpha-0123456789";
const KEY_B: &str = "sk-tenant-bravo-9876543210";

fn spec(seats: u32, context: u32) -> String {
    format!(
        "seats: {seats}\ntokens_per_sec: 1000\nttft_ms: 1\nmemory_gb: 64\nreply_tokens: 4\nmodels:\n  - {{name: m:1b, size_gb: 1, loaded: true, context: {context}}}\n"
    )
}

fn chat() -> Value {
    json!({"model": "m:1b", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
}

fn auth(extra: &str) -> String {
    format!(
        "auth:\n  keys:\n    - {{ key: {KEY_A}, tenant: team-a }}\n    - {{ key: {KEY_B}, tenant: team-b }}\n{extra}"
    )
}

/// One sim node with `seats` seats behind a gateway with both tenants' keys and `extra`.
fn keyed_gateway(
    rt: &tokio::runtime::Runtime,
    id: &str,
    seats: u32,
    extra: &str,
) -> (fleetgate::sim::SimHandle, Gateway) {
    let a = sim(rt, &spec(seats, 8192));
    let gw = Gateway::start(&format!(
        "{}{extra}{}",
        auth(""),
        fleet(&[node(id, &a, &format!("      capacity: {seats}\n"))])
    ));
    (a, gw)
}

/// The status of a chat sent with `authorization: <auth>`.
async fn chat_status(gw: &Gateway, auth: &str) -> u16 {
    post(
        gw,
        "/v1/chat/completions",
        &[("authorization", auth)],
        &chat(),
    )
    .await
    .0
}

fn temp_path(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetgate-tenants-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    dir
}

async fn post(
    gw: &Gateway,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut r = client().post(gw.url(path)).json(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let resp = r.send().await.expect("send");
    let status = resp.status().as_u16();
    let h = resp.headers().clone();
    let text = resp.text().await.expect("body");
    let v = serde_json::from_str(&text).unwrap_or_else(|_| {
        // Ollama streams NDJSON by default: the first line says enough.
        serde_json::from_str(text.lines().next().unwrap_or("null")).unwrap_or(Value::Null)
    });
    (status, h, v)
}

#[test]
fn missing_or_wrong_keys_get_401_in_each_protocol_shape_and_keys_are_never_logged() {
    let rt = runtime();
    let log = temp_path("access.log");
    let (a, gw) = keyed_gateway(
        &rt,
        "t-a",
        2,
        &format!("access_log:\n  enabled: true\n  path: {}\n", log.display()),
    );
    rt.block_on(async {
        let (s, _, v) = post(&gw, "/v1/chat/completions", &[], &chat()).await;
        assert_eq!(s, 401);
        assert_eq!(v["error"]["code"], "unauthorized", "{v}");
        let (s, _, v) = post(
            &gw,
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-not-a-real-key-000")],
            &chat(),
        )
        .await;
        assert_eq!(s, 401);
        assert!(v["error"]["message"].as_str().unwrap().contains("invalid API key"));
        let anthropic = json!({"model": "m:1b", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
        let (s, _, v) = post(&gw, "/v1/messages", &[("x-api-key", "sk-wrong-wrong-wrong")], &anthropic).await;
        assert_eq!(s, 401);
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "authentication_error", "{v}");
        let ollama = json!({"model": "m:1b", "messages": [{"role": "user", "content": "hi"}]});
        let (s, _, v) = post(&gw, "/api/chat", &[], &ollama).await;
        assert_eq!(s, 401);
        assert!(v["error"].is_string(), "{v}");
        let r = client().get(gw.url("/v1/models")).send().await.unwrap();
        assert_eq!(r.status(), 401, "local endpoints need a key too");
        assert_eq!(served(&a), 0, "nothing unauthenticated reached the node");

        // Each SDK's way of sending a valid key is served.
        let bearer = format!("Bearer {KEY_A}");
        let (s, h, _) = post(&gw, "/v1/chat/completions", &[("authorization", &bearer)], &chat()).await;
        assert_eq!(s, 200);
        assert_eq!(h["x-fleet-node"], "t-a");
        let (s, _, v) = post(&gw, "/v1/messages", &[("x-api-key", KEY_B)], &anthropic).await;
        assert_eq!(s, 200, "{v}");
        let (s, _, _) = post(&gw, "/api/chat", &[("authorization", KEY_A)], &ollama).await;
        assert_eq!(s, 200);

        // A tenant's usage is counted after the client has its reply.
        let served_a = r#"fleetgate_tenant_requests_total{status="200",tenant="team-a"} 2"#;
        eventually("team-a's two requests counted", || async {
            metrics(&gw).await.contains(served_a)
        })
        .await;
        let text = metrics(&gw).await;
        assert!(text.contains(r#"fleetgate_tenant_requests_total{status="401",tenant="unauthenticated"} 5"#), "{text}");
        let team_a = || async {
            let status = admin_json(&gw, "/fleet/status").await;
            status["tenants"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["tenant"] == "team-a")
                .expect("team-a in /fleet/status")
                .clone()
        };
        eventually("team-a's usage in /fleet/status", || async {
            team_a().await["requests"] == 2
        })
        .await;
        let team_a = team_a().await;
        assert!(team_a["completion_tokens"].as_u64().unwrap() >= 8, "{team_a}");
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 8 || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(text.lines().count() >= 8, "{text}");
    assert!(text.contains(r#""tenant":"team-a""#), "{text}");
    assert!(text.contains(r#""tenant":"unauthenticated""#), "{text}");
    for secret in [
        KEY_A,
        KEY_B,
        "sk-not-a-real-key-000",
        "sk-wrong-wrong-wrong",
    ] {
        assert!(!text.contains(secret), "a key leaked into the access log");
    }
    let _ = std::fs::remove_file(&log);
}

#[test]
fn one_tenants_backlog_does_not_hold_back_another_tenants_request() {
    let rt = runtime();
    let (a, gw) = keyed_gateway(&rt, "fair", 2, "queue:\n  max_wait_s: 60\n");
    rt.block_on(async {
        a.control().hold_first_token(true);
        let done = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<&'static str>::new()));
        let send = |who: &'static str, key: &'static str| {
            let (url, done) = (gw.url("/v1/chat/completions"), done.clone());
            tokio::spawn(async move {
                let r = client()
                    .post(url)
                    .header("authorization", format!("Bearer {key}"))
                    .json(&chat())
                    .send()
                    .await
                    .expect("send");
                assert_eq!(r.status(), 200);
                r.bytes().await.expect("body");
                done.lock().push(who);
            })
        };
        let mut tasks: Vec<_> = (0..50).map(|_| send("a", KEY_A)).collect();
        a.control().wait_parked(2).await;
        eventually("48 of tenant A's requests waiting", || async {
            admin_json(&gw, "/fleet/queue").await["waiting"]
                .as_array()
                .map_or(0, Vec::len)
                == 48
        })
        .await;
        tasks.push(send("b", KEY_B));
        eventually("tenant B's request waiting too", || async {
            admin_json(&gw, "/fleet/queue").await["waiting"]
                .as_array()
                .map_or(0, Vec::len)
                == 49
        })
        .await;
        // Serve one seat's worth at a time: release, let the next two in, park them again.
        a.control().hold_first_token(false);
        a.control().release();
        for t in tasks {
            t.await.expect("task");
        }
        let order = done.lock().clone();
        let b_at = order.iter().position(|w| *w == "b").expect("b served");
        assert!(
            b_at <= 4,
            "tenant B was served after {b_at} of tenant A's 50 requests (FIFO would be 50): {order:?}"
        );
    });
}

#[test]
fn tenant_limits_refuse_with_429_and_leave_other_tenants_alone() {
    let rt = runtime();
    let (a, gw) = keyed_gateway(
        &rt,
        "lim",
        4,
        "tenants:\n  team-a: { max_in_flight: 1, tokens_per_min: 100000 }\n  team-b: { tokens_per_min: 60 }\n",
    );
    rt.block_on(async {
        let bearer_a = format!("Bearer {KEY_A}");
        let bearer_b = format!("Bearer {KEY_B}");
        // team-a: one at a time.
        a.control().hold_first_token(true);
        let first = {
            let (url, key) = (gw.url("/v1/chat/completions"), bearer_a.clone());
            tokio::spawn(async move {
                client()
                    .post(url)
                    .header("authorization", key)
                    .json(&chat())
                    .send()
                    .await
                    .expect("send")
                    .status()
            })
        };
        a.control().wait_parked(1).await;
        let (s, h, v) = post(&gw, "/v1/chat/completions", &[("authorization", &bearer_a)], &chat()).await;
        assert_eq!(s, 429, "{v}");
        assert_eq!(v["error"]["code"], "queue_full");
        assert!(v["error"]["message"].as_str().unwrap().contains("in flight"));
        assert!(h.contains_key("retry-after"));
        // team-b is not held back by team-a's limit.
        let (s, _, _) = {
            a.control().hold_first_token(false);
            a.control().release();
            post(&gw, "/v1/chat/completions", &[("authorization", &bearer_b)], &chat()).await
        };
        assert_eq!(s, 200);
        assert_eq!(first.await.unwrap(), 200);
        // team-b: 60 tokens a minute; each request is estimated at a few prompt tokens + 4
        // output, so a long prompt goes over.
        let long = json!({"model": "m:1b", "max_tokens": 4, "messages": [{"role": "user", "content": "word ".repeat(60)}]});
        let (s, h, v) = post(&gw, "/v1/chat/completions", &[("authorization", &bearer_b)], &long).await;
        assert_eq!(s, 429, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("tokens per minute"));
        let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry), "retry-after {retry}");
        assert_eq!(h["x-ratelimit-limit-tokens"], "60");
        assert!(h.contains_key("x-ratelimit-remaining-tokens"));
        assert!(h.contains_key("x-ratelimit-reset-tokens"));
        // ... while team-a still gets through.
        let (s, _, _) = post(&gw, "/v1/chat/completions", &[("authorization", &bearer_a)], &long).await;
        assert_eq!(s, 200);
        let text = metrics(&gw).await;
        assert!(text.contains(r#"fleetgate_tenant_rejections_total{limit="in_flight",tenant="team-a"} 1"#), "{text}");
        assert!(text.contains(r#"fleetgate_tenant_rejections_total{limit="tokens_per_min",tenant="team-b"} 1"#));
    });
}

#[test]
fn output_budget_is_clamped_to_the_window_only_when_opted_in() {
    let rt = runtime();
    let a = sim(&rt, &spec(2, 2048));
    let node_yaml = node("small", &a, "      capacity: 2\n");
    // ~1200 prompt tokens + 2000 output does not fit a 2048 window; the prompt does.
    let body = json!({"model": "m:1b", "max_tokens": 2000, "messages": [{"role": "user", "content": "word ".repeat(960)}]});
    let plain = Gateway::start(&fleet(std::slice::from_ref(&node_yaml)));
    let clamping = Gateway::start(&format!(
        "models:\n  clamp_output: [m:1b]\n{}",
        fleet(&[node_yaml])
    ));
    rt.block_on(async {
        let (s, h, v) = post(&plain, "/v1/chat/completions", &[], &body).await;
        assert_eq!(s, 400, "{v}");
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        assert!(!h.contains_key("x-fleet-max-tokens"));

        let (s, h, v) = post(&clamping, "/v1/chat/completions", &[], &body).await;
        assert_eq!(s, 200, "{v}");
        let max: u32 = h["x-fleet-max-tokens"].to_str().unwrap().parse().unwrap();
        assert!(max > 0 && max < 2000, "clamped to {max}");
        let usage = &v["usage"];
        let total = usage["prompt_tokens"].as_u64().unwrap() + u64::from(max);
        assert!(
            total <= 2048,
            "prompt + clamped output fit the window: {usage} + {max}"
        );

        // A request that fits as asked is untouched.
        let (s, h, _) = post(&clamping, "/v1/chat/completions", &[], &chat()).await;
        assert_eq!(s, 200);
        assert!(!h.contains_key("x-fleet-max-tokens"));
    });
}

#[test]
fn the_key_file_is_re_read_on_reload() {
    let rt = runtime();
    let a = sim(&rt, &spec(2, 8192));
    let dir = std::env::temp_dir().join(format!("fleetgate-keyfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys.txt");
    std::fs::write(&keys, format!("# tenant key\nteam-a {KEY_A}\n")).unwrap();
    let path = dir.join("fleetgate.yaml");
    std::fs::write(
        &path,
        format!(
            "server:\n  listen: 127.0.0.1:{}\n  admin_listen: 127.0.0.1:0\n  admin_token: secret\nauth:\n  key_file: {}\n{}",
            free_port(),
            keys.display(),
            fleet(&[node("kf", &a, "      capacity: 2\n")])
        ),
    )
    .unwrap();
    let gw = Gateway::start_file(&path);
    rt.block_on(async {
        let a_key = format!("Bearer {KEY_A}");
        let b_key = format!("Bearer {KEY_B}");
        let s = chat_status(&gw, &a_key).await;
        assert_eq!(s, 200);
        let s = chat_status(&gw, &b_key).await;
        assert_eq!(s, 401);
        // Rotate: team-a's key is revoked, team-b's added.
        std::fs::write(&keys, format!("team-b {KEY_B}\n")).unwrap();
        let r = client()
            .post(gw.admin_url("/fleet/reload"))
            .bearer_auth("secret")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let s = chat_status(&gw, &a_key).await;
        assert_eq!(s, 401, "a revoked key is refused after reload");
        let s = chat_status(&gw, &b_key).await;
        assert_eq!(s, 200);
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// The real binary at the most verbose log level (its own and pingora's debug lines on
/// stderr): keys sent every way an SDK sends them, right and wrong, appear nowhere in that
/// output; the tenant does.
#[test]
fn keys_never_reach_the_gateways_own_log_output() {
    use std::process::{Command, Stdio};
    let rt = runtime();
    let a = sim(&rt, &spec(2, 8192));
    let dir = std::env::temp_dir().join(format!("fleetgate-keylog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (port, admin) = (free_port(), free_port());
    let path = dir.join("fleetgate.yaml");
    std::fs::write(
        &path,
        format!(
            "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:{admin}\n  threads: 1\n{}access_log:\n  enabled: true\n{}",
            auth(""),
            fleet(&[node("kl", &a, "      capacity: 2\n")])
        ),
    )
    .unwrap();
    let stderr = dir.join("stderr.log");
    let stdout = dir.join("stdout.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["run", "--config"])
        .arg(&path)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::from(std::fs::File::create(&stdout).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&stderr).unwrap()))
        .spawn()
        .expect("spawn fleetgate");
    let base = format!("http://127.0.0.1:{port}");
    rt.block_on(async {
        let c = client();
        eventually("the gateway serves", || {
            let c = c.clone();
            let url = format!("{base}/v1/chat/completions");
            async move {
                c.post(url)
                    .bearer_auth(KEY_A)
                    .json(&chat())
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200)
            }
        })
        .await;
        let anthropic = json!({"model": "m:1b", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
        let ollama = json!({"model": "m:1b", "stream": false, "messages": [{"role": "user", "content": "hi"}]});
        let sends = [
            ("/v1/chat/completions", "authorization", format!("Bearer {KEY_B}"), chat(), 200),
            ("/v1/messages", "x-api-key", KEY_A.to_string(), anthropic.clone(), 200),
            ("/api/chat", "authorization", KEY_B.to_string(), ollama.clone(), 200),
            ("/v1/chat/completions", "authorization", "Bearer sk-not-a-real-key-000".into(), chat(), 401),
            ("/v1/messages", "x-api-key", "sk-wrong-wrong-wrong".into(), anthropic, 401),
        ];
        for (p, header, value, body, want) in sends {
            let r = c
                .post(format!("{base}{p}"))
                .header(header, value)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), want, "{p}");
        }
    });
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let out = std::fs::read_to_string(&stdout).unwrap_or_default()
        + &std::fs::read_to_string(&stderr).unwrap_or_default();
    assert!(out.lines().count() >= 6, "the gateway logged: {out}");
    assert!(out.contains("team-a") && out.contains("team-b"), "{out}");
    for secret in [
        KEY_A,
        KEY_B,
        "sk-not-a-real-key-000",
        "sk-wrong-wrong-wrong",
    ] {
        let leaks: Vec<&str> = out.lines().filter(|l| l.contains(secret)).collect();
        assert!(
            leaks.is_empty(),
            "a key leaked into the log output: {leaks:#?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
