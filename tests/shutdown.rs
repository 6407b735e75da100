//! SIGTERM on the real `fleetgate` binary: streams still running when the grace period ends
//! get the protocol's error event (not a raw EOF), and with nothing in flight the process
//! exits at once instead of sleeping out the grace period.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{config_file, free_port, scratch_dir};
use serde_json::json;

const SLOW: &str = "seats: 2\n        tokens_per_sec: 5\n        ttft_ms: 1\n        memory_gb: 64\n        reply_tokens: 400\n        models:\n          - {name: m:1b, size_gb: 1, loaded: true}\n";

struct Gw {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    dir: std::path::PathBuf,
}

impl Drop for Gw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn start(name: &str, grace_s: u64) -> Gw {
    start_logging(name, grace_s, None)
}

fn start_logging(name: &str, grace_s: u64, log: Option<&std::path::Path>) -> Gw {
    let (port, admin, sim_port) = (free_port(), free_port(), free_port());
    let dir = scratch_dir(name);
    let path = config_file(
        &dir,
        &format!(
            "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:{admin}\n  threads: 1\n  grace_period_s: {grace_s}\nhealth:\n  poll_interval_ms: 600000\nfleet:\n  nodes:\n    - id: sd-a\n      url: http://127.0.0.1:{sim_port}\n      backend: sim\n      sim:\n        {SLOW}"
        ),
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fleetgate"));
    cmd.args(["run", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn");
    if let Some(log) = log {
        cmd.stderr(std::fs::File::create(log).unwrap());
    }
    let child = cmd.spawn().expect("spawn fleetgate");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "gateway did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    Gw {
        child,
        addr,
        admin,
        dir,
    }
}

fn sigterm(gw: &Gw) {
    let ok = Command::new("kill")
        .args(["-TERM", &gw.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success());
}

/// Wait for the child to exit; how long it took.
fn exited_within(gw: &mut Gw, limit: Duration) -> Duration {
    let t = Instant::now();
    loop {
        if let Some(st) = gw.child.try_wait().unwrap() {
            assert!(st.success(), "exit status {st}");
            return t.elapsed();
        }
        assert!(t.elapsed() < limit, "still running after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The admin listener answers as soon as the proxy port does, even while the first poll of a
/// node that does not answer is still waiting for its connect timeout (the admin listener
/// used to refuse connections for about a second at start, until that poll had run).
#[test]
fn the_admin_listener_is_up_with_the_proxy() {
    let (port, admin) = (free_port(), free_port());
    let dir = scratch_dir("admin-up");
    // 10.255.255.1: a non-routed address, so the first poll hangs in its connect.
    let path = config_file(
        &dir,
        &format!(
            "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:{admin}\n  threads: 1\nfleet:\n  nodes:\n    - id: silent\n      url: http://10.255.255.1:9\n      backend: ollama\n"
        ),
    );
    let child = Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(["run", "--config"])
        .arg(&path)
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("spawn fleetgate");
    let gw = Gw {
        child,
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        admin: format!("127.0.0.1:{admin}").parse().unwrap(),
        dir,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(gw.addr).is_err() {
        assert!(Instant::now() < deadline, "gateway did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    TcpStream::connect(gw.admin).expect("the admin listener accepts once the proxy does");
}

#[test]
fn with_nothing_in_flight_sigterm_exits_at_once() {
    let mut gw = start("idle-term", 30);
    sigterm(&gw);
    let took = exited_within(&mut gw, Duration::from_secs(10));
    assert!(
        took < Duration::from_secs(10),
        "{took:?} with a 30 s grace period"
    );
}

#[test]
fn streams_cut_by_the_grace_period_end_with_the_protocols_error_event() {
    let mut gw = start("stream-term", 1);
    let rt = common::runtime();
    let url = format!("http://{}", gw.addr);
    let bodies = rt.block_on(async {
        let c = reqwest::Client::new();
        let mut rs = Vec::new();
        for (path, model) in [("/v1/chat/completions", "openai"), ("/api/chat", "ollama")] {
            let mut r = c
                .post(format!("{url}{path}"))
                .json(&json!({"model": "m:1b", "stream": true,
                    "messages": [{"role": "user", "content": "a long story please"}]}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{model}");
            let first = r.chunk().await.unwrap().expect("first chunk");
            rs.push((model, r, first));
        }
        sigterm(&gw);
        let mut out = Vec::new();
        for (model, mut r, first) in rs {
            let mut text = String::from_utf8_lossy(&first).into_owned();
            while let Ok(Some(c)) = r.chunk().await {
                text.push_str(&String::from_utf8_lossy(&c));
            }
            out.push((model, text));
        }
        out
    });
    for (model, text) in bodies {
        let last = text.trim_end().lines().last().unwrap_or("").to_string();
        assert!(
            last.contains("shutting down"),
            "{model}: last line {last:?}"
        );
        let json = last.strip_prefix("data: ").unwrap_or(&last);
        let v: serde_json::Value = serde_json::from_str(json).expect("a JSON error event");
        assert!(
            v["error"].is_object() || v["error"].is_string(),
            "{model}: {v}"
        );
    }
    let took = exited_within(&mut gw, Duration::from_secs(10));
    assert!(took < Duration::from_secs(6), "{took:?}");
}

#[test]
fn clients_going_away_mid_stream_log_no_error_lines() {
    let log =
        std::env::temp_dir().join(format!("fleetgate-abort-stderr-{}.log", std::process::id()));
    let gw = start_logging("abort-log", 1, Some(&log));
    let rt = common::runtime();
    let url = format!("http://{}", gw.addr);
    rt.block_on(async {
        let c = reqwest::Client::new();
        for _ in 0..5 {
            let mut r = c
                .post(format!("{url}/v1/chat/completions"))
                .json(&json!({"model": "m:1b", "stream": true,
                    "messages": [{"role": "user", "content": "go on"}]}))
                .send()
                .await
                .unwrap();
            r.chunk().await.unwrap().expect("first chunk");
            drop(r);
        }
        // Served after the aborts: the gateway noticed each one.
        let r = c
            .post(format!("{url}/v1/chat/completions"))
            .json(&json!({"model": "m:1b", "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    });
    std::thread::sleep(Duration::from_millis(300));
    drop(gw);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let _ = std::fs::remove_file(&log);
}
