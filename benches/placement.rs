//! Placement quality end to end: one seeded workload (open-loop arrivals plus a few multi-turn
//! conversations) replayed on a fresh heterogeneous simulated fleet through fleetgate and
//! through two client-side baselines, in the same run; prints per-strategy results and the
//! ratios fleetgate / baseline (medians over rounds; each round uses the next workload seed).
//!
//! Baselines (what LiteLLM's simple-shuffle/round-robin/least-busy or a plain L7 balancer do):
//! - round-robin: per model, take the nodes that have it on disk in turn;
//! - least-busy: the node with the fewest in-flight requests (counted by this client) among
//!   those that have the model on disk, first in fleet order on ties.
//!
//! Neither knows context windows, what is loaded, seats or speeds; fleetgate is given what a
//! user writes in its config (seats, memory, bandwidth, context windows) and polls the rest.
//!
//! `cargo bench --bench placement`  (`FLEETGATE_BENCH_SCALE=3` for 3x the requests and rounds)

mod common;

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{median, quantile, scaled};
use fleetgate::sim::{SimHandle, SimModel, SimSpec};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::runtime::Runtime;

const SMALL: &str = "small:3b";
const MID: &str = "mid:32b";
const BIG: &str = "big:70b";

/// Open-loop arrival rate, requests per second.
const RATE: f64 = 8.0;
const CONVERSATIONS: usize = 4;
const TURNS: usize = 4;

/// One node of the fleet: its simulated hardware and what fleetgate's config says about it.
struct NodeDef {
    id: &'static str,
    spec: SimSpec,
    bandwidth_gbps: f64,
    max_context: u32,
}

fn model(name: &str, size_gb: f64, context: u32, loaded: bool, cold_load_ms: u64) -> SimModel {
    SimModel {
        context,
        loaded,
        cold_load_ms,
        ..SimModel::new(name, size_gb)
    }
}

/// A 512 GB workstation, a laptop, two GPU boxes; cold loads scaled down (40 GB in 3 s).
fn fleet() -> Vec<NodeDef> {
    let spec = |seed, seats, tokens_per_sec, ttft_ms, memory_gb, models| SimSpec {
        seed,
        seats,
        tokens_per_sec,
        ttft_ms,
        memory_gb,
        reply_tokens: 512,
        models,
        ..SimSpec::default()
    };
    vec![
        NodeDef {
            id: "workstation",
            spec: spec(
                1,
                4,
                90.0,
                100,
                512.0,
                vec![
                    model(BIG, 42.0, 131_072, true, 3000),
                    model(MID, 20.0, 32_768, false, 1500),
                    model(SMALL, 2.0, 131_072, false, 300),
                ],
            ),
            bandwidth_gbps: 800.0,
            max_context: 131_072,
        },
        NodeDef {
            id: "laptop",
            spec: spec(
                2,
                1,
                45.0,
                200,
                24.0,
                vec![
                    model(SMALL, 2.0, 8192, true, 400),
                    model(MID, 20.0, 8192, false, 2000),
                ],
            ),
            bandwidth_gbps: 100.0,
            max_context: 8192,
        },
        NodeDef {
            id: "gpu-a",
            spec: spec(
                3,
                8,
                120.0,
                60,
                48.0,
                vec![
                    model(MID, 20.0, 32_768, true, 1500),
                    model(SMALL, 2.0, 32_768, false, 300),
                    model(BIG, 42.0, 32_768, false, 3000),
                ],
            ),
            bandwidth_gbps: 900.0,
            max_context: 32_768,
        },
        NodeDef {
            id: "gpu-b",
            spec: spec(
                4,
                2,
                75.0,
                80,
                24.0,
                vec![
                    model(SMALL, 2.0, 16_384, true, 300),
                    model(MID, 20.0, 16_384, false, 1500),
                ],
            ),
            bandwidth_gbps: 450.0,
            max_context: 16_384,
        },
    ]
}

/// The gateway config for the running fleet: seats, memory, bandwidth and windows, as a user
/// writes them; everything else at its default except the background intervals, scaled down
/// like the workload's times (cold loads here take 0.3-3 s instead of 5-30 s): health poll
/// 1 s instead of 5 s, pre-warm and rebalance every 0.5 s instead of 5 s.
fn gateway_yaml(defs: &[NodeDef], sims: &[SimHandle]) -> String {
    let intervals = std::env::var("FLEETGATE_BENCH_QUEUE_MS").unwrap_or_else(|_| "500".into());
    let mut y = format!(
        "health:\n  poll_interval_ms: 1000\nqueue:\n  prewarm_interval_ms: {intervals}\n  rebalance_interval_ms: {intervals}\nfleet:\n  nodes:\n"
    );
    for (d, s) in defs.iter().zip(sims) {
        let mut extra = format!(
            "      capacity: {}\n      memory_gb: {}\n      bandwidth_gbps: {}\n      max_context: {}\n      models:\n",
            d.spec.seats, d.spec.memory_gb, d.bandwidth_gbps, d.max_context
        );
        for m in &d.spec.models {
            extra += &format!(
                "        - {{ name: \"{}\", size_gb: {}, context: {} }}\n",
                m.name, m.size_gb, m.context
            );
        }
        y += &common::node_yaml(d.id, s, &extra);
    }
    y
}

/// One request of the workload.
#[derive(Clone)]
struct Job {
    model: &'static str,
    prompt_tokens: u32,
    max_tokens: u32,
}

impl Job {
    fn body(&self, salt: u64) -> String {
        // ~4 chars per token, as the sim and the gateway both count them.
        let filler = "lorem ipsum dolor sit amet ".repeat(self.prompt_tokens as usize * 4 / 27 + 1);
        serde_json::json!({
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": [{"role": "user", "content": format!("request {salt}: {filler}")}],
        })
        .to_string()
    }
}

/// Open-loop arrivals (Poisson at `RATE`) and conversations (sequential turns, growing prompt).
struct Workload {
    arrivals: Vec<(Duration, Job)>,
    conversations: Vec<Conversation>,
}

struct Conversation {
    start: Duration,
    model: &'static str,
    think: Vec<Duration>,
}

fn workload(seed: u64, n: usize) -> Workload {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut at = 0.0f64;
    let mut arrivals = Vec::with_capacity(n);
    for _ in 0..n {
        at += -(1.0 - rng.gen::<f64>()).ln() / RATE;
        let p: f64 = rng.gen();
        let job = if p < 0.45 {
            Job {
                model: SMALL,
                prompt_tokens: rng.gen_range(50..300),
                max_tokens: rng.gen_range(16..48),
            }
        } else if p < 0.65 {
            Job {
                model: MID,
                prompt_tokens: rng.gen_range(100..600),
                max_tokens: rng.gen_range(16..64),
            }
        } else if p < 0.82 {
            Job {
                model: BIG,
                prompt_tokens: rng.gen_range(100..600),
                max_tokens: rng.gen_range(16..64),
            }
        } else {
            // A long document: fits only the larger windows.
            Job {
                model: if rng.gen_bool(0.6) { SMALL } else { MID },
                prompt_tokens: rng.gen_range(9_000..20_000),
                max_tokens: 32,
            }
        };
        arrivals.push((Duration::from_secs_f64(at), job));
    }
    let span = at;
    let conversations = (0..CONVERSATIONS)
        .map(|i| Conversation {
            start: Duration::from_secs_f64(rng.gen_range(0.0..span / 4.0)),
            model: [SMALL, SMALL, MID, BIG][i % 4],
            think: (0..TURNS)
                .map(|_| Duration::from_millis(rng.gen_range(100..400)))
                .collect(),
        })
        .collect();
    Workload {
        arrivals,
        conversations,
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Strategy {
    Fleetgate,
    RoundRobin,
    LeastBusy,
}

impl Strategy {
    fn name(self) -> &'static str {
        match self {
            Strategy::Fleetgate => "fleetgate",
            Strategy::RoundRobin => "round-robin",
            Strategy::LeastBusy => "least-busy",
        }
    }
}

/// Picks a base URL per request: the gateway, or a client-side baseline over the nodes.
struct Router {
    strategy: Strategy,
    gateway: Option<String>,
    nodes: Vec<String>,
    /// Node indexes that have each model on disk.
    holders: Vec<(&'static str, Vec<usize>)>,
    rr: Vec<AtomicUsize>,
    in_flight: Vec<AtomicU32>,
}

impl Router {
    fn new(strategy: Strategy, defs: &[NodeDef], sims: &[SimHandle], gw: Option<String>) -> Self {
        let holders: Vec<(&'static str, Vec<usize>)> = [SMALL, MID, BIG]
            .into_iter()
            .map(|m| {
                let on = (0..defs.len())
                    .filter(|&i| defs[i].spec.models.iter().any(|x| x.name == m))
                    .collect();
                (m, on)
            })
            .collect();
        Router {
            strategy,
            gateway: gw,
            nodes: sims
                .iter()
                .map(|s| format!("http://{}", s.addr()))
                .collect(),
            rr: holders.iter().map(|_| AtomicUsize::new(0)).collect(),
            in_flight: sims.iter().map(|_| AtomicU32::new(0)).collect(),
            holders,
        }
    }

    /// The base URL and, for the client-side baselines, the node index it counts against.
    fn pick(&self, model: &str) -> (String, Option<usize>) {
        if let Some(g) = &self.gateway {
            return (g.clone(), None);
        }
        let k = self
            .holders
            .iter()
            .position(|(m, _)| *m == model)
            .expect("workload model is in the fleet");
        let on = &self.holders[k].1;
        let i = match self.strategy {
            Strategy::RoundRobin => on[self.rr[k].fetch_add(1, Ordering::Relaxed) % on.len()],
            _ => *on
                .iter()
                .min_by_key(|&&i| self.in_flight[i].load(Ordering::Relaxed))
                .expect("model has a holder"),
        };
        self.in_flight[i].fetch_add(1, Ordering::Relaxed);
        (self.nodes[i].clone(), Some(i))
    }

    fn done(&self, node: Option<usize>) {
        if let Some(i) = node {
            self.in_flight[i].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The outcome of one request: HTTP status (0: transport error), latency, finish time.
struct Outcome {
    status: u16,
    latency: Duration,
    finished: Duration,
    context_error: bool,
}

async fn send(
    client: &reqwest::Client,
    router: &Router,
    job: &Job,
    salt: u64,
    conversation: Option<String>,
    t0: Instant,
) -> Outcome {
    let (base, node) = router.pick(job.model);
    let start = Instant::now();
    let mut req = client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(job.body(salt));
    if let Some(c) = conversation {
        req = req.header("x-fleet-conversation", c);
    }
    let (status, body) = match req.send().await {
        Ok(r) => {
            let s = r.status().as_u16();
            match r.text().await {
                Ok(b) => (s, b),
                Err(_) => (0, String::new()),
            }
        }
        Err(_) => (0, String::new()),
    };
    router.done(node);
    Outcome {
        status,
        latency: start.elapsed(),
        finished: t0.elapsed(),
        context_error: status == 400 && body.contains("context_length_exceeded"),
    }
}

/// What one run (one strategy, one workload) measured.
#[derive(Clone, Default)]
struct RunResult {
    completed: usize,
    errors: usize,
    context_errors: usize,
    p50_s: f64,
    p95_s: f64,
    makespan_s: f64,
    cold_loads: usize,
    per_node: Vec<u64>,
}

fn run(
    rt: &Runtime,
    strategy: Strategy,
    defs: &[NodeDef],
    wl: &Arc<Workload>,
    client: &reqwest::Client,
) -> RunResult {
    // Fresh nodes with the same seeds every run, so cold loads start from the same state.
    let sims: Vec<SimHandle> = defs
        .iter()
        .map(|d| common::sim(rt, d.spec.clone()))
        .collect();
    let gw = (strategy == Strategy::Fleetgate)
        .then(|| common::Gateway::start(2, &gateway_yaml(defs, &sims)));
    let router = Arc::new(Router::new(
        strategy,
        defs,
        &sims,
        gw.as_ref().map(|g| g.base()),
    ));
    let before: Vec<u64> = sims.iter().map(served).collect();
    let outcomes: Vec<Outcome> = rt.block_on(async {
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for (i, (at, job)) in wl.arrivals.iter().enumerate() {
            let (client, router, job, at) = (client.clone(), router.clone(), job.clone(), *at);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until((t0 + at).into()).await;
                vec![send(&client, &router, &job, i as u64, None, t0).await]
            }));
        }
        for c in 0..wl.conversations.len() {
            let (client, router, wl) = (client.clone(), router.clone(), wl.clone());
            tasks.push(tokio::spawn(async move {
                let conv = &wl.conversations[c];
                tokio::time::sleep_until((t0 + conv.start).into()).await;
                let mut out = Vec::new();
                for turn in 0..TURNS {
                    // Each turn resends the history: ~2700 more prompt tokens per turn.
                    let job = Job {
                        model: conv.model,
                        prompt_tokens: 200 + 2700 * turn as u32,
                        max_tokens: 48,
                    };
                    let tag = Some(format!("conv-{c}"));
                    out.push(send(&client, &router, &job, 10_000 + c as u64, tag, t0).await);
                    tokio::time::sleep(conv.think[turn]).await;
                }
                out
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("request task"));
        }
        all
    });
    drop(gw);
    let mut lat: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.status == 200)
        .map(|o| o.latency.as_secs_f64())
        .collect();
    let completed = lat.len();
    let r = RunResult {
        completed,
        errors: outcomes.len() - completed,
        context_errors: outcomes.iter().filter(|o| o.context_error).count(),
        p50_s: quantile(&mut lat, 0.5),
        p95_s: quantile(&mut lat, 0.95),
        makespan_s: outcomes
            .iter()
            .map(|o| o.finished.as_secs_f64())
            .fold(0.0, f64::max),
        cold_loads: sims.iter().map(|s| s.control().stats().loads.len()).sum(),
        per_node: sims
            .iter()
            .zip(&before)
            .map(|(s, b)| served(s) - b)
            .collect(),
    };
    rt.block_on(async {
        for s in sims {
            s.shutdown().await;
        }
    });
    r
}

/// One column of a [`RunResult`] as a number.
type Metric = fn(&RunResult) -> f64;

/// Inference requests a sim node received.
fn served(sim: &SimHandle) -> u64 {
    sim.control().stats().by_model.values().sum()
}

fn main() {
    if !common::benchmarking() {
        return;
    }
    let n = scaled(36, 16);
    let rounds = scaled(3, 1);
    let defs = fleet();
    let rt = common::runtime(2, "placement");
    let client = common::client(Duration::from_secs(120));
    let strategies = [
        Strategy::Fleetgate,
        Strategy::RoundRobin,
        Strategy::LeastBusy,
    ];
    let total = n + CONVERSATIONS * TURNS;
    println!(
        "placement: fleet {} | {n} open-loop requests at {RATE}/s + {CONVERSATIONS} conversations x {TURNS} turns = {total} per run, {rounds} rounds",
        defs.iter().map(|d| d.id).collect::<Vec<_>>().join(", "),
    );
    println!(
        "{:<6} {:<12} {:>5} {:>6} {:>5} {:>7} {:>7} {:>8} {:>5}  requests per node ({})",
        "round",
        "strategy",
        "ok",
        "errors",
        "ctx",
        "p50 s",
        "p95 s",
        "makespan",
        "loads",
        defs.iter().map(|d| d.id).collect::<Vec<_>>().join("/")
    );
    let mut results: Vec<Vec<RunResult>> = vec![Vec::new(); strategies.len()];
    for round in 0..rounds {
        let wl = Arc::new(workload(0xF1EE7 + round as u64, n));
        // Rotate the order so drift on the shared box does not always hit the same strategy.
        for k in 0..strategies.len() {
            let si = (k + round) % strategies.len();
            let r = run(&rt, strategies[si], &defs, &wl, &client);
            println!(
                "{round:<6} {:<12} {:>5} {:>6} {:>5} {:>7.2} {:>7.2} {:>8.2} {:>5}  {:?}",
                strategies[si].name(),
                r.completed,
                r.errors,
                r.context_errors,
                r.p50_s,
                r.p95_s,
                r.makespan_s,
                r.cold_loads,
                r.per_node
            );
            results[si].push(r);
        }
    }
    let med =
        |si: usize, f: Metric| -> f64 { median(&results[si].iter().map(f).collect::<Vec<_>>()) };
    let metrics: [(&str, Metric); 7] = [
        ("completed", |r| r.completed as f64),
        ("errors", |r| r.errors as f64),
        ("  of which context 400", |r| r.context_errors as f64),
        ("latency p50 (s)", |r| r.p50_s),
        ("latency p95 (s)", |r| r.p95_s),
        ("makespan (s)", |r| r.makespan_s),
        ("cold loads", |r| r.cold_loads as f64),
    ];
    println!();
    println!(
        "{:<24} {:>10} {:>12} {:>11} {:>10} {:>10}",
        "medians over rounds", "fleetgate", "round-robin", "least-busy", "fg/rr", "fg/lb"
    );
    for (label, f) in metrics {
        let (fg, rr, lb) = (med(0, f), med(1, f), med(2, f));
        let ratio = |b: f64| {
            if b > 0.0 {
                format!("{:.2}x", fg / b)
            } else {
                "-".into()
            }
        };
        println!(
            "{label:<24} {fg:>10.2} {rr:>12.2} {lb:>11.2} {:>10} {:>10}",
            ratio(rr),
            ratio(lb)
        );
    }
}
