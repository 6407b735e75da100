//! Gateway overhead end to end: the same requests straight to simulated nodes (the baseline)
//! and through fleetgate, interleaved round by round in one process on this machine; prints
//! medians over rounds, the ratio gateway/direct and the added microseconds.
//!
//! Two kinds of node, four of each; the direct client round-robins over them, the gateway
//! routes over them:
//! - `null`: a canned OpenAI answer as soon as the body is read (what proxy benchmarks put
//!   behind a proxy): the pure cost of the gateway;
//! - `sim`: fleetgate's simulated node at its fastest (ttft 0, one output token, 4096 seats);
//!   its pacing timer has millisecond resolution, so it costs ~1 ms per request.
//!
//! `cargo bench --bench overhead`  (`FLEETGATE_BENCH_SCALE=4 cargo bench --bench overhead`
//! for 4x the rounds and samples)

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use common::{median, quantile, range, scaled};
use fleetgate::sim::{SimHandle, SimModel, SimSpec};
use tokio::runtime::Runtime;

const MODEL: &str = "bench:1b";
const NODES: usize = 4;
const CONCURRENCY: usize = 32;

/// Where requests go: one or more base URLs, taken in turn.
struct Target {
    name: &'static str,
    bases: Vec<String>,
    next: AtomicUsize,
}

impl Target {
    fn url(&self, path: &str) -> String {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.bases.len();
        format!("{}{path}", self.bases[i])
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Scenario {
    /// Non-streaming chat, one at a time: latency per request.
    Serial,
    /// Non-streaming chat, 32 at a time for a fixed time: requests per second.
    Throughput,
    /// Streaming chat, one at a time: time to the first body chunk.
    StreamFirstByte,
    /// Non-streaming chat with a 1 MiB prompt, one at a time: the body replay path.
    BigBody,
}

/// What one (scenario, target) run measured, in µs or req/s.
#[derive(Default, Clone, Copy)]
struct Sample {
    p50: f64,
    p99: f64,
    rate: f64,
    errors: usize,
}

fn chat_body(content: &str, stream: bool) -> Bytes {
    Bytes::from(
        serde_json::json!({
            "model": MODEL,
            "max_tokens": 1,
            "stream": stream,
            "messages": [{"role": "user", "content": content}],
        })
        .to_string(),
    )
}

struct Bodies {
    small: Bytes,
    stream: Bytes,
    big: Bytes,
}

async fn one(
    client: &reqwest::Client,
    target: &Target,
    body: &Bytes,
    first_byte: bool,
) -> Result<Duration, String> {
    let t0 = Instant::now();
    let mut resp = client
        .post(target.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if resp.status() != 200 {
        return Err(format!("status {}", resp.status()));
    }
    let mut at = None;
    while let Some(_chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if at.is_none() {
            at = Some(t0.elapsed());
        }
    }
    let total = t0.elapsed();
    Ok(if first_byte {
        at.unwrap_or(total)
    } else {
        total
    })
}

async fn serial(
    client: &reqwest::Client,
    target: &Target,
    body: &Bytes,
    n: usize,
    first_byte: bool,
) -> Sample {
    let mut us = Vec::with_capacity(n);
    let mut errors = 0;
    for _ in 0..n {
        match one(client, target, body, first_byte).await {
            Ok(d) => us.push(d.as_secs_f64() * 1e6),
            Err(_) => errors += 1,
        }
    }
    Sample {
        p50: quantile(&mut us, 0.5),
        p99: quantile(&mut us, 0.99),
        rate: 0.0,
        errors,
    }
}

async fn throughput(
    client: &reqwest::Client,
    target: &Arc<Target>,
    body: &Bytes,
    window: Duration,
) -> Sample {
    let t0 = Instant::now();
    let deadline = t0 + window;
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (client, target, body) = (client.clone(), target.clone(), body.clone());
            tokio::spawn(async move {
                let (mut ok, mut errors) = (0usize, 0usize);
                while Instant::now() < deadline {
                    match one(&client, &target, &body, false).await {
                        Ok(_) => ok += 1,
                        Err(_) => errors += 1,
                    }
                }
                (ok, errors)
            })
        })
        .collect();
    let (mut ok, mut errors) = (0, 0);
    for t in tasks {
        let (o, e) = t.await.expect("load task");
        ok += o;
        errors += e;
    }
    Sample {
        rate: ok as f64 / t0.elapsed().as_secs_f64(),
        errors,
        ..Sample::default()
    }
}

struct Plan {
    rounds: usize,
    serial_n: usize,
    stream_n: usize,
    big_n: usize,
    window: Duration,
}

async fn run(
    s: Scenario,
    plan: &Plan,
    client: &reqwest::Client,
    target: &Arc<Target>,
    b: &Bodies,
) -> Sample {
    match s {
        Scenario::Serial => serial(client, target, &b.small, plan.serial_n, false).await,
        Scenario::Throughput => throughput(client, target, &b.small, plan.window).await,
        Scenario::StreamFirstByte => serial(client, target, &b.stream, plan.stream_n, true).await,
        Scenario::BigBody => serial(client, target, &b.big, plan.big_n, false).await,
    }
}

/// One table row: the median over rounds of each side, the ratio of the medians, the added
/// amount, and the range of the per-round ratios (how noisy the row is).
fn row(label: &str, unit: &str, direct: &[f64], gw: &[f64]) {
    let (d, g) = (median(direct), median(gw));
    let ratios: Vec<f64> = direct
        .iter()
        .zip(gw)
        .map(|(d, g)| if *d > 0.0 { g / d } else { 0.0 })
        .collect();
    let (lo, hi) = range(&ratios);
    let added = if unit == "req/s" {
        format!("{:+.0} req/s", g - d)
    } else {
        format!("{:+.0} µs", g - d)
    };
    println!(
        "{label:<32} {d:>10.0} {g:>10.0} {unit:<6} {:>6.2}x {added:>13}   {lo:.2}–{hi:.2}",
        g / d.max(f64::MIN_POSITIVE)
    );
}

/// The node that costs nothing: reads the body, parses it as the real servers do, answers.
mod null_node {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Chat {
        #[serde(default)]
        stream: bool,
    }

    const REPLY: &str = r#"{"id":"chatcmpl-0","object":"chat.completion","created":0,"model":"bench:1b","choices":[{"index":0,"message":{"role":"assistant","content":"Paris"},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}"#;
    const STREAM: &str = concat!(
        r#"data: {"id":"chatcmpl-0","object":"chat.completion.chunk","created":0,"model":"bench:1b","choices":[{"index":0,"delta":{"role":"assistant","content":"Paris"},"finish_reason":null}]}"#,
        "\n\n",
        r#"data: {"id":"chatcmpl-0","object":"chat.completion.chunk","created":0,"model":"bench:1b","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
        "\n\ndata: [DONE]\n\n"
    );
    const MODELS: &str = r#"{"object":"list","data":[{"id":"bench:1b","object":"model","created":0,"owned_by":"bench","max_model_len":4000000}]}"#;

    async fn chat(body: Bytes) -> Response {
        let stream = serde_json::from_slice::<Chat>(&body).is_ok_and(|c| c.stream);
        if stream {
            ([("content-type", "text/event-stream")], STREAM).into_response()
        } else {
            ([("content-type", "application/json")], REPLY).into_response()
        }
    }

    async fn models() -> Response {
        ([("content-type", "application/json")], MODELS).into_response()
    }

    /// Serve on an ephemeral port of 127.0.0.1 until the runtime stops.
    pub fn start(rt: &Runtime) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind null node");
        l.set_nonblocking(true).expect("nonblocking");
        let addr = l.local_addr().expect("addr");
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/v1/models", get(models))
            .layer(DefaultBodyLimit::max(64 << 20));
        rt.spawn(async move {
            let l = tokio::net::TcpListener::from_std(l).expect("tokio listener");
            let _ = axum::serve(l, app).await;
        });
        format!("http://{addr}")
    }
}

fn sim_spec(seed: u64) -> SimSpec {
    SimSpec {
        seed,
        seats: 4096,
        tokens_per_sec: 1e6,
        ttft_ms: 0,
        memory_gb: 64.0,
        reply_tokens: 1,
        models: vec![SimModel {
            loaded: true,
            context: 4_000_000,
            ..SimModel::new(MODEL, 1.0)
        }],
        ..SimSpec::default()
    }
}

#[derive(Clone, Copy, PartialEq)]
enum NodeKind {
    Null,
    Sim,
}

/// Four nodes of `kind`: their base URLs, the fleet YAML for the gateway, and the sim handles
/// (kept alive by the caller).
fn start_nodes(kind: NodeKind, rt: &Runtime) -> (Vec<String>, String, Vec<SimHandle>) {
    let mut bases = Vec::new();
    let mut sims = Vec::new();
    for i in 0..NODES {
        match kind {
            NodeKind::Null => bases.push(null_node::start(rt)),
            NodeKind::Sim => {
                let s = common::sim(rt, sim_spec(i as u64 + 1));
                bases.push(format!("http://{}", s.addr()));
                sims.push(s);
            }
        }
    }
    let backend = if kind == NodeKind::Null {
        "openai"
    } else {
        "sim"
    };
    let nodes: String = bases
        .iter()
        .enumerate()
        .map(|(i, b)| {
            format!(
                "    - id: n{i}\n      url: {b}\n      backend: {backend}\n      capacity: 4096\n      hard_cap: 8192\n      models:\n        - {{ name: \"{MODEL}\", size_gb: 1, context: 4000000 }}\n"
            )
        })
        .collect();
    (bases, format!("fleet:\n  nodes:\n{nodes}"), sims)
}

/// Measure every scenario against `kind` nodes, direct and through a fresh gateway, and print
/// the table.
fn measure(kind: NodeKind, plan: &Plan, nodes_rt: &Runtime, client_rt: &Runtime, b: &Bodies) {
    let (bases, yaml, _sims) = start_nodes(kind, nodes_rt);
    let gw = common::Gateway::start(2, &yaml);
    let direct = Arc::new(Target {
        name: "direct",
        bases,
        next: AtomicUsize::new(0),
    });
    let gateway = Arc::new(Target {
        name: "fleetgate",
        bases: vec![gw.base()],
        next: AtomicUsize::new(0),
    });
    let client = common::client(Duration::from_secs(30));
    let scenarios = [
        Scenario::Serial,
        Scenario::Throughput,
        Scenario::StreamFirstByte,
        Scenario::BigBody,
    ];
    // results[scenario][0 = direct, 1 = gateway][round]
    let mut results = vec![[Vec::new(), Vec::new()]; scenarios.len()];
    let label = if kind == NodeKind::Null {
        "null"
    } else {
        "sim"
    };
    eprint!("{label} nodes ");
    client_rt.block_on(async {
        for t in [&direct, &gateway] {
            let w = serial(&client, t, &b.small, 200, false).await;
            assert_eq!(w.errors, 0, "warm-up against {} failed", t.name);
        }
        for round in 0..plan.rounds {
            for (si, s) in scenarios.iter().enumerate() {
                // Alternate which side goes first so drift on the shared box hits both.
                let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                for side in order {
                    let t = if side == 0 { &direct } else { &gateway };
                    let r = run(*s, plan, &client, t, b).await;
                    assert_eq!(r.errors, 0, "{} had errors in round {round}", t.name);
                    results[si][side].push(r);
                }
            }
            eprint!(".");
        }
        eprintln!();
    });
    drop(gw);
    let col = |si: usize, side: usize, f: fn(&Sample) -> f64| -> Vec<f64> {
        results[si][side].iter().map(f).collect()
    };
    let p50 = |s: &Sample| s.p50;
    let p99 = |s: &Sample| s.p99;
    let rate = |s: &Sample| s.rate;
    println!();
    println!(
        "{:<32} {:>10} {:>10} {:<6} {:>7} {:>13}   per-round ratio",
        format!("{label} nodes: median of {} rounds", plan.rounds),
        "direct",
        "fleetgate",
        "",
        "ratio",
        "added"
    );
    row(
        "chat c=1 latency p50",
        "µs",
        &col(0, 0, p50),
        &col(0, 1, p50),
    );
    row(
        "chat c=1 latency p99",
        "µs",
        &col(0, 0, p99),
        &col(0, 1, p99),
    );
    row(
        &format!("chat c={CONCURRENCY} throughput"),
        "req/s",
        &col(1, 0, rate),
        &col(1, 1, rate),
    );
    row(
        "stream c=1 first byte p50",
        "µs",
        &col(2, 0, p50),
        &col(2, 1, p50),
    );
    row(
        "stream c=1 first byte p99",
        "µs",
        &col(2, 0, p99),
        &col(2, 1, p99),
    );
    row(
        "chat 1 MiB body c=1 p50",
        "µs",
        &col(3, 0, p50),
        &col(3, 1, p50),
    );
}

fn main() {
    if !common::benchmarking() {
        return;
    }
    let plan = Plan {
        rounds: scaled(5, 3),
        serial_n: scaled(400, 50),
        stream_n: scaled(200, 50),
        big_n: scaled(20, 5),
        window: Duration::from_millis(1000),
    };
    let bodies = Bodies {
        small: chat_body("Hello! What is the capital of France?", false),
        stream: chat_body("Hello! What is the capital of France?", true),
        big: chat_body(&"lorem ".repeat((1 << 20) / 6), false),
    };
    println!(
        "overhead: {NODES} nodes, fleetgate threads=2, {} rounds; per round and side {} serial, \
         {} streamed, {} x 1 MiB, {} ms at c={CONCURRENCY}",
        plan.rounds,
        plan.serial_n,
        plan.stream_n,
        plan.big_n,
        plan.window.as_millis()
    );
    let nodes_rt = common::runtime(2, "nodes");
    let client_rt = common::runtime(2, "client");
    for kind in [NodeKind::Null, NodeKind::Sim] {
        measure(kind, &plan, &nodes_rt, &client_rt, &bodies);
    }
}
