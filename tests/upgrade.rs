//! Pingora's zero-downtime upgrade on the real binary: a new `fleetgate run --upgrade` takes
//! the listening socket from the running one (SIGQUIT), under load, with no failed request.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

const SIM: &str = "seats: 8\ntokens_per_sec: 2000\nttft_ms: 1\nmemory_gb: 64\nreply_tokens: 4\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true}\n";

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(p: &Proc, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &p.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success());
}

#[test]
fn a_new_process_takes_the_listener_under_load_without_a_failed_request() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let (port, admin) = (free_port(), free_port());
    let dir = scratch_dir("upgrade");
    let path = config_file(
        &dir,
        &format!(
            "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:{admin}\n  threads: 1\n  grace_period_s: 5\n  upgrade_sock: {}\nhealth:\n  poll_interval_ms: 600000\nfleet:\n  nodes:\n    - id: up-a\n      url: http://{}\n      backend: sim\n",
            dir.join("upgrade.sock").display(),
            a.addr()
        ),
    );
    let spawn = |upgrade: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fleetgate"));
        c.args(["run", "--config"])
            .arg(&path)
            .env("RUST_LOG", "warn");
        if upgrade {
            c.arg("--upgrade");
        }
        Proc(c.spawn().expect("spawn fleetgate"))
    };
    let old = spawn(false);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "old gateway did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Load: two clients asking back to back for the whole upgrade, new connections each time.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let load: Vec<_> = (0..2)
        .map(|_| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            let url = format!("http://{addr}/v1/chat/completions");
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let c = reqwest::Client::builder()
                    .pool_max_idle_per_host(0)
                    .build()
                    .unwrap();
                let mut errors = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = rt.block_on(
                        c.post(&url)
                            .json(&serde_json::json!({"model": "m:1b", "max_tokens": 2,
                                "messages": [{"role": "user", "content": "hi"}]}))
                            .send(),
                    );
                    match r.map(|r| r.status().as_u16()) {
                        Ok(200) => ok.fetch_add(1, Ordering::Relaxed),
                        other => {
                            errors.push(format!("{other:?}"));
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
                errors
            })
        })
        .collect();
    let before = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while ok.load(Ordering::Relaxed) < n {
            assert!(Instant::now() < deadline, "load is not being served");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    before(20);
    let new = spawn(true);
    // The new process waits on the upgrade socket; the old one sends its listeners on SIGQUIT.
    let sock = dir.join("upgrade.sock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(
            Instant::now() < deadline,
            "new process is not waiting for the sockets"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&old, "-QUIT");
    let mut old = old;
    let deadline = Instant::now() + Duration::from_secs(30);
    while old.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "old process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    let served_at_exit = ok.load(Ordering::Relaxed);
    before(served_at_exit + 20);
    stop.store(true, Ordering::Relaxed);
    let errors: Vec<String> = load.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert_eq!(failed.load(Ordering::Relaxed), 0, "{errors:?}");
    // The new process answers on the admin port too, once the old one let it go.
    let deadline = Instant::now() + Duration::from_secs(10);
    let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    while TcpStream::connect(admin).is_err() {
        assert!(Instant::now() < deadline, "admin not taken over");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(new);
    let _ = std::fs::remove_dir_all(&dir);
}
