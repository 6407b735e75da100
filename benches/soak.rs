//! Soak with faults: a real gateway over two simulated nodes under steady mixed load
//! (streams, whole replies, client aborts, slow and bad clients) while one node cycles
//! through faults (5xx storm, cut streams, refusing connections). Samples the process's RSS
//! and open file descriptors over time and reports growth after warm-up (target < 5 %).
//! Only under `cargo bench --bench soak` (FLEETGATE_BENCH_SCALE lengthens it).

mod common;

// The allocator the `fleetgate` binary ships with (`src/main.rs`), so RSS over time is the
// gateway's as deployed, not glibc malloc's arena growth.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use fleetgate::sim::{Fault, SimModel, SimSpec};

fn spec(seed: u64) -> SimSpec {
    let mut m = SimModel::new("m:1b", 1.0);
    m.loaded = true;
    SimSpec {
        seed,
        seats: 8,
        ttft_ms: 2,
        tokens_per_sec: 800.0,
        reply_tokens: 24,
        memory_gb: 64.0,
        models: vec![m],
        ..SimSpec::default()
    }
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

fn main() {
    if !benchmarking() {
        return;
    }
    let secs = scaled(60, 20) as u64;
    let rt = runtime(2, "soak");
    let (a, b) = (sim(&rt, spec(1)), sim(&rt, spec(2)));
    let gw = Gateway::start(
        2,
        &format!(
            "routing:\n  retries: 2\nbreaker:\n  cooldown_s: 1\nclients:\n  head_timeout_ms: 500\n  body_timeout_ms: 1000\nhealth:\n  poll_interval_ms: 500\nfleet:\n  nodes:\n{}{}",
            node_yaml("soak-a", &a, ""),
            node_yaml("soak-b", &b, "")
        ),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let c = client(Duration::from_secs(10));
    let url = format!("{}/v1/chat/completions", gw.base());
    for worker in 0..6u64 {
        let (stop, ok, errors, c, url) = (
            stop.clone(),
            ok.clone(),
            errors.clone(),
            c.clone(),
            url.clone(),
        );
        rt.spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let stream = (i + worker).is_multiple_of(3);
                let body = serde_json::json!({"model": "m:1b", "stream": stream,
                    "messages": [{"role": "user", "content": format!("soak {worker} {i}")}]});
                match c.post(&url).json(&body).send().await {
                    Ok(mut r) => {
                        let status = r.status();
                        if (i + worker).is_multiple_of(7) {
                            // A client that goes away after the first chunk.
                            let _ = r.chunk().await;
                            drop(r);
                        } else {
                            while let Ok(Some(_)) = r.chunk().await {}
                        }
                        if status.is_success() {
                            ok.fetch_add(1, Ordering::Relaxed);
                        } else {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    // Bad clients: a slow head and a body that never finishes, over and over.
    {
        let (stop, addr) = (stop.clone(), gw.addr);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(mut s) = std::net::TcpStream::connect(addr) {
                    let _ = s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 50\r\n\r\n{\"mo");
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
        });
    }
    // Faults on node a: a cycle of 5xx storm, cut streams, refused connections, normal.
    let ctl = a.control();
    let faults = [
        Fault::Status500,
        Fault::DieMidStream,
        Fault::Refuse,
        Fault::None,
    ];
    let start = Instant::now();
    let mut samples: Vec<(f64, u64, u64)> = Vec::new();
    println!("soak: {secs} s, faults on soak-a cycling every 2 s");
    println!(
        "{:>7} {:>10} {:>6} {:>9} {:>8}",
        "t_s", "rss_kb", "fds", "ok", "errors"
    );
    let mut k = 0;
    while start.elapsed() < Duration::from_secs(secs) {
        ctl.set_fault(faults[k % faults.len()]);
        k += 1;
        std::thread::sleep(Duration::from_secs(2));
        let s = (start.elapsed().as_secs_f64(), rss_kb(), open_fds());
        println!(
            "{:>7.1} {:>10} {:>6} {:>9} {:>8}",
            s.0,
            s.1,
            s.2,
            ok.load(Ordering::Relaxed),
            errors.load(Ordering::Relaxed)
        );
        samples.push(s);
    }
    ctl.set_fault(Fault::None);
    stop.store(true, Ordering::Relaxed);
    // Growth: the last quarter's median against the median just after warm-up (first 25 %).
    let n = samples.len();
    let q = (n / 4).max(1);
    let base: Vec<f64> = samples[q..(2 * q).min(n)]
        .iter()
        .map(|s| s.1 as f64)
        .collect();
    let tail: Vec<f64> = samples[n - q..].iter().map(|s| s.1 as f64).collect();
    let fd_base: Vec<f64> = samples[q..(2 * q).min(n)]
        .iter()
        .map(|s| s.2 as f64)
        .collect();
    let fd_tail: Vec<f64> = samples[n - q..].iter().map(|s| s.2 as f64).collect();
    let growth = |b: &[f64], t: &[f64]| (median(t) - median(b)) / median(b).max(1.0) * 100.0;
    let (rss_g, fd_g) = (growth(&base, &tail), growth(&fd_base, &fd_tail));
    println!(
        "soak: rss after warm-up {:.0} kB -> {:.0} kB ({rss_g:+.1} %), open fds {:.0} -> {:.0} ({fd_g:+.1} %); target < 5 %: {}",
        median(&base), median(&tail), median(&fd_base), median(&fd_tail),
        if rss_g < 5.0 && fd_g < 5.0 { "met" } else { "NOT met" }
    );
    println!(
        "soak: {} answered 2xx, {} errors (faults and aborts included), buffered body bytes now {}",
        ok.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
        gw.fleet.clients.budget.used()
    );
}
