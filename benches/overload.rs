//! Overload harness (issue 10, item 1): two simulated nodes x 2 seats behind fleetgate,
//! offered 5x their capacity in open loop. Admission on (`max_wait_service_ratio: 1.0`)
//! against the same run with admission off (the count and 120 s predicted-wait bounds only):
//! p99 of admitted requests against their service time, how fast refusals come back, and the
//! process's RSS. Run: `cargo bench --bench overload` (`FLEETGATE_BENCH_SCALE` lengthens it).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use fleetgate::sim::{SimModel, SimSpec};
use parking_lot::Mutex;
use serde_json::json;

const MODEL: &str = "m:1b";
const SEATS: u32 = 2;

fn spec(seed: u64) -> SimSpec {
    let mut m = SimModel::new(MODEL, 1.0);
    m.loaded = true;
    SimSpec {
        seed,
        seats: SEATS,
        ttft_ms: 100,
        tokens_per_sec: 100.0,
        reply_tokens: 20,
        models: vec![m],
        ..SimSpec::default()
    }
}

/// Resident set size of this process (client, nodes and gateway), MB.
fn rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

#[derive(Default)]
struct Outcomes {
    admitted_s: Vec<f64>,
    refused_ms: Vec<f64>,
    retry_after_s: Vec<f64>,
    errors: usize,
}

struct Run {
    offered: usize,
    out: Outcomes,
    rss_start: f64,
    rss_peak: f64,
    rss_end: f64,
    wall_s: f64,
}

fn chat(i: usize) -> serde_json::Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": format!("q{i}")}]})
}

/// Sequential requests: the unloaded service time (median, s); the gateway learns it too.
async fn warm_up(c: &reqwest::Client, url: &str, n: usize) -> f64 {
    let mut v = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        let r = c.post(url).json(&chat(i)).send().await.expect("warm-up");
        assert_eq!(r.status(), 200, "warm-up");
        let _ = r.bytes().await;
        v.push(t.elapsed().as_secs_f64());
    }
    median(&v)
}

fn run(rt: &tokio::runtime::Runtime, admission: &str, rate: f64, dur: Duration) -> (f64, Run) {
    let a = sim(rt, spec(1));
    let b = sim(rt, spec(2));
    let nodes = [
        node_yaml("o-a", &a, &format!("      capacity: {SEATS}\n")),
        node_yaml("o-b", &b, &format!("      capacity: {SEATS}\n")),
    ]
    .concat();
    let gw = Gateway::start(2, &format!("{admission}fleet:\n  nodes:\n{nodes}"));
    let url = format!("{}/v1/chat/completions", gw.base());
    let c = client(Duration::from_secs(600));
    rt.block_on(async move {
        let service = warm_up(&c, &url, 8).await;
        let out = Arc::new(Mutex::new(Outcomes::default()));
        let rss_start = rss_mb();
        let peak = Arc::new(Mutex::new(rss_start));
        let sampling = {
            let peak = peak.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let r = rss_mb();
                    let mut p = peak.lock();
                    *p = p.max(r);
                }
            })
        };
        let started = Instant::now();
        let offered = (rate * dur.as_secs_f64()).round() as usize;
        let mut tasks = Vec::with_capacity(offered);
        let gap = Duration::from_secs_f64(1.0 / rate);
        for i in 0..offered {
            tokio::time::sleep_until((started + gap * i as u32).into()).await;
            let (c, url, out) = (c.clone(), url.clone(), out.clone());
            tasks.push(tokio::spawn(async move {
                let t = Instant::now();
                let r = c.post(&url).json(&chat(i)).send().await;
                let Ok(r) = r else {
                    out.lock().errors += 1;
                    return;
                };
                let status = r.status().as_u16();
                let retry = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok()?.parse::<f64>().ok());
                let whole = r.bytes().await.is_ok();
                let secs = t.elapsed().as_secs_f64();
                let mut o = out.lock();
                match (status, whole) {
                    (200, true) => o.admitted_s.push(secs),
                    (429, true) => {
                        o.refused_ms.push(secs * 1000.0);
                        o.retry_after_s.extend(retry);
                    }
                    _ => o.errors += 1,
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        let wall_s = started.elapsed().as_secs_f64();
        sampling.abort();
        let rss_peak = *peak.lock();
        let out = std::mem::take(&mut *out.lock());
        (
            service,
            Run {
                offered,
                out,
                rss_start,
                rss_peak,
                rss_end: rss_mb(),
                wall_s,
            },
        )
    })
}

fn main() {
    if !common::benchmarking() {
        return;
    }
    let rt = runtime(2, "overload");
    // Capacity from the sim's physics: 4 seats, ~0.3 s per request.
    let dur = Duration::from_secs_f64(6.0 * scale());
    let nominal_service = 0.1 + 20.0 / 100.0;
    let capacity = f64::from(2 * SEATS) / nominal_service;
    let rate = 5.0 * capacity;
    eprintln!("overload: 2 nodes x {SEATS} seats, capacity ~{capacity:.1} req/s, offered {rate:.1} req/s for {:.0} s", dur.as_secs_f64());
    let (service_on, mut on) = run(
        &rt,
        "admission:\n  max_wait_service_ratio: 1.0\n",
        rate,
        dur,
    );
    let (service_off, mut off) = run(&rt, "", rate, dur);
    let service = (service_on + service_off) / 2.0;
    let mut row = |name: &str, f: &dyn Fn(&mut Run) -> String| {
        println!("| {name} | {} | {} |", f(&mut on), f(&mut off));
    };
    println!(
        "\nunloaded service time (median of 8 sequential, through the gateway): {:.3} s\n",
        service
    );
    println!("| 5x capacity | admission on (ratio 1.0) | admission off |");
    println!("|---|---|---|");
    row("offered", &|r| r.offered.to_string());
    row("admitted (200)", &|r| r.out.admitted_s.len().to_string());
    row("refused (429)", &|r| r.out.refused_ms.len().to_string());
    row("other errors", &|r| r.out.errors.to_string());
    row("admitted p50", &|r| {
        format!("{:.3} s", quantile(&mut r.out.admitted_s, 0.5))
    });
    row("admitted p99", &|r| {
        format!("{:.3} s", quantile(&mut r.out.admitted_s, 0.99))
    });
    row("admitted p99 / service time", &|r| {
        format!("{:.2}x", quantile(&mut r.out.admitted_s, 0.99) / service)
    });
    row("refusal latency p50", &|r| {
        format!("{:.2} ms", quantile(&mut r.out.refused_ms, 0.5))
    });
    row("refusal latency p99", &|r| {
        format!("{:.2} ms", quantile(&mut r.out.refused_ms, 0.99))
    });
    row("Retry-After median", &|r| {
        format!("{:.0} s", median(&r.out.retry_after_s))
    });
    row("RSS start / peak / end", &|r| {
        format!(
            "{:.1} / {:.1} / {:.1} MB",
            r.rss_start, r.rss_peak, r.rss_end
        )
    });
    row("wall time", &|r| format!("{:.1} s", r.wall_s));
}
