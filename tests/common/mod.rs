//! Test harness: simulated nodes and a real gateway (Pingora server) on 127.0.0.1 ephemeral
//! ports, in this process. No sleeps to synchronise: readiness is a successful connect.

#![allow(dead_code)]

pub mod simnode;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetgate::config::Config;
use fleetgate::fleet::Fleet;
use fleetgate::sim::{SimControl, SimHandle, SimSpec};
use tokio::runtime::Runtime;

pub fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("test runtime")
}

/// A free port on 127.0.0.1 for a listener the gateway binds itself a moment later. Taken
/// below the kernel's ephemeral range (`ip_local_port_range`, 32768-60999 by default), where
/// no `bind(127.0.0.1:0)` of a test process running beside this one (its sims, raw nodes and
/// admin listeners) can take it in between: a port from that range, released, may be the next
/// one the kernel hands out, and the gateway's readiness probe then reached a foreign server.
/// Each test process starts at its own offset; a port is handed out only if it binds now.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const BASE: u32 = 10_000;
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = low.saturating_sub(BASE);
    if span >= 1_000 {
        let start = std::process::id().wrapping_mul(97) % span;
        for _ in 0..span.min(4_096) {
            let k = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = (BASE + (start + k) % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind")
        .port()
}

/// A scratch directory for one test process, created (`fleetgate-<name>-<pid>`).
pub fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetgate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Write `yaml` as `gw.yaml` in `dir`, for a gateway run as a child (`fleetgate run --config`).
pub fn config_file(dir: &std::path::Path, yaml: &str) -> std::path::PathBuf {
    let path = dir.join("gw.yaml");
    std::fs::write(&path, yaml).expect("write gw.yaml");
    path
}

/// Start a sim node on an ephemeral port.
pub fn sim(rt: &Runtime, yaml: &str) -> SimHandle {
    let spec: SimSpec = serde_yaml::from_str(yaml).expect("sim spec");
    let l = TcpListener::bind("127.0.0.1:0").expect("bind sim");
    rt.block_on(fleetgate::sim::start(spec, l))
        .expect("start sim")
}

/// A running gateway; stops when dropped.
pub struct Gateway {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub fleet: Arc<Fleet>,
    _running: fleetgate::server::Running,
}

impl Gateway {
    /// Start a gateway from YAML; `server.listen`/`admin_listen` are filled with free ports.
    pub fn start(yaml: &str) -> Gateway {
        let port = free_port();
        let full = format!(
            "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:0\n  threads: 2\n{yaml}"
        );
        let mut config = Config::from_yaml(&full).unwrap_or_else(|e| panic!("config: {e}\n{full}"));
        // The first measurements (`services::measure`) send each loaded model a request of
        // the gateway's own: tests count what reaches a node and what was learned from their
        // own requests, so they run without it unless their config names it (tests/measure.rs).
        if !yaml.contains("completion_measure") {
            config.routing.policy.completion_measure = false;
        }
        Gateway::run(config)
    }

    /// Start a gateway from a complete config file, as `fleetgate run --config FILE` does
    /// (the file must set `server.listen`; reloads re-read it).
    pub fn start_file(path: &std::path::Path) -> Gateway {
        let mut config =
            Config::load(path).unwrap_or_else(|e| panic!("config {}: {e}", path.display()));
        // As `start` (until a reload re-reads the file).
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if !text.contains("completion_measure") {
            config.routing.policy.completion_measure = false;
        }
        let gw = Gateway::run(config);
        gw.fleet.set_config_path(path.to_path_buf());
        gw
    }

    fn run(config: Config) -> Gateway {
        let listen = config.listen;
        let prepared = fleetgate::server::prepare(config).expect("prepare gateway");
        let running = prepared.spawn(listen).expect("gateway listening");
        Gateway {
            addr: running.addr,
            admin: running.admin_addr,
            fleet: running.fleet.clone(),
            _running: running,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }
}

/// YAML for one fleet node pointing at a running sim.
pub fn node(id: &str, sim: &SimHandle, extra: &str) -> String {
    format!(
        "    - id: {id}\n      url: http://{}\n      backend: sim\n{extra}",
        sim.addr()
    )
}

/// YAML for one fleet node known by its URL only (`backend: openai`, no `capacity`): what a
/// user in front of vLLM, SGLang, llama.cpp or Ollama's `/v1` writes.
pub fn node_by_url(id: &str, sim: &SimHandle) -> String {
    format!(
        "    - id: {id}\n      url: http://{}\n      backend: openai\n",
        sim.addr()
    )
}

pub fn fleet(nodes: &[String]) -> String {
    format!("fleet:\n  nodes:\n{}", nodes.concat())
}

pub fn control(sim: &SimHandle) -> Arc<SimControl> {
    sim.control()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// Inference requests a sim node received (polls of /api/tags and /api/ps carry no model).
pub fn served(sim: &SimHandle) -> u64 {
    sim.control().stats().by_model.values().sum()
}

/// GET a JSON document from the gateway's admin listener.
pub async fn admin_json(gw: &Gateway, path: &str) -> serde_json::Value {
    get_json(&gw.admin_url(path)).await
}

/// GET a JSON document (an admin path, a sim node's `/api/ps` ...).
pub async fn get_json(url: &str) -> serde_json::Value {
    client()
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"))
}

/// POST `body` to an admin explain path (`/fleet/explain` or `/fleet/explain/<api path>`).
pub async fn explain(gw: &Gateway, path: &str, body: &serde_json::Value) -> serde_json::Value {
    client()
        .post(gw.admin_url(path))
        .json(body)
        .send()
        .await
        .expect("explain request")
        .json()
        .await
        .expect("explain JSON")
}

/// Poll `check` until it returns true, failing with `what` after 10 s. For state that other
/// threads change (queues, polls): a readiness check, not a sleep.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The gateway's Prometheus exposition text.
pub async fn metrics(gw: &Gateway) -> String {
    client()
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text")
}
