//! Shared pieces of the end-to-end bench harnesses: simulated nodes and a real gateway on
//! 127.0.0.1 ephemeral ports in this process, the scale knob, and order statistics.
//! (Benches cannot import `tests/common`; this is the part of it they need.)

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use fleetgate::config::Config;
use fleetgate::fleet::Fleet;
use fleetgate::sim::{SimHandle, SimSpec};
use tokio::runtime::Runtime;

/// `FLEETGATE_BENCH_SCALE` (default 1): multiplies rounds / requests for a longer, steadier run.
pub fn scale() -> f64 {
    std::env::var("FLEETGATE_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(1.0, |s| s.clamp(0.1, 100.0))
}

/// `n` scaled, at least `min`.
pub fn scaled(n: usize, min: usize) -> usize {
    ((n as f64 * scale()).round() as usize).max(min)
}

pub fn runtime(workers: usize, name: &str) -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("bench runtime")
}

/// A free port on 127.0.0.1 (bound and released; the gateway binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind")
        .port()
}

/// Start a sim node on an ephemeral port, on `rt`.
pub fn sim(rt: &Runtime, spec: SimSpec) -> SimHandle {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind sim");
    rt.block_on(fleetgate::sim::start(spec, l))
        .expect("start sim")
}

/// A running gateway (Pingora server on its own thread); stops and joins when dropped.
pub struct Gateway {
    pub addr: SocketAddr,
    pub fleet: Arc<Fleet>,
    running: Option<fleetgate::server::Running>,
}

impl Gateway {
    /// Start a gateway from YAML; `server.listen`/`admin_listen` are filled with free ports.
    pub fn start(threads: usize, yaml: &str) -> Gateway {
        let port = free_port();
        let full = format!(
            "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:0\n  threads: {threads}\n{yaml}"
        );
        let config = Config::from_yaml(&full).unwrap_or_else(|e| panic!("config: {e}\n{full}"));
        let listen = config.listen;
        let prepared = fleetgate::server::prepare(config).expect("prepare gateway");
        let running = prepared.spawn(listen).expect("gateway listening");
        Gateway {
            addr: running.addr,
            fleet: running.fleet.clone(),
            running: Some(running),
        }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop();
        }
    }
}

/// YAML for one fleet node pointing at a running sim (`extra`: indented node keys).
pub fn node_yaml(id: &str, sim: &SimHandle, extra: &str) -> String {
    format!(
        "    - id: {id}\n      url: http://{}\n      backend: sim\n{extra}",
        sim.addr()
    )
}

/// One HTTP/1.1 client with a keep-alive pool, shared by every task of a harness.
pub fn client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .pool_max_idle_per_host(256)
        .build()
        .expect("client")
}

/// The `q` quantile (0..=1) of `v` by nearest rank; 0 for an empty slice. Sorts `v`.
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Smallest and largest of `v` (0, 0 when empty).
pub fn range(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold(None, |acc: Option<(f64, f64)>, &x| {
            Some(acc.map_or((x, x), |(lo, hi)| (lo.min(x), hi.max(x))))
        })
        .unwrap_or((0.0, 0.0))
}

/// `cargo bench` passes `--bench`; test runners list and run every target (`--list`, or no
/// flag under `cargo test`). A long end-to-end harness runs only when benchmarking, and tells
/// a test runner it holds no tests.
pub fn benchmarking() -> bool {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return false;
    }
    if !args.iter().any(|a| a == "--bench") {
        eprintln!("end-to-end harness: run it with `cargo bench --bench <name>`");
        return false;
    }
    true
}
