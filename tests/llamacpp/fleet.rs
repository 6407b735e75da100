//! Real llama.cpp servers for the integration tests: finds what tests/llamacpp/setup.sh
//! installed (running it when nothing is there yet) and starts `serve.py` processes on
//! 127.0.0.1 ephemeral ports, one CPU thread each. Readiness is the `READY <url>` line
//! serve.py prints once `/health` answers; servers are killed when dropped.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The installed server runtime and model.
#[derive(Debug, Clone)]
pub struct Setup {
    pub python: PathBuf,
    pub model: PathBuf,
}

impl Setup {
    /// What setup.sh installed; Err(reason) only when the install failed.
    pub fn find() -> Result<Setup, String> {
        let home = std::env::var("FLEETGATE_LLAMACPP_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(ROOT).join(".cache/llamacpp"));
        if !home.join("env").exists() {
            let status = Command::new(format!("{ROOT}/tests/llamacpp/setup.sh"))
                .env("FLEETGATE_LLAMACPP_HOME", &home)
                .status()
                .map_err(|e| format!("cannot run tests/llamacpp/setup.sh: {e}"))?;
            if !status.success() {
                return Err(format!("tests/llamacpp/setup.sh exited with {status}"));
            }
        }
        if let Ok(why) = std::fs::read_to_string(home.join("failed")) {
            return Err(why.trim().to_string());
        }
        let env = std::fs::read_to_string(home.join("env"))
            .map_err(|e| format!("{}: {e}", home.join("env").display()))?;
        let get = |key: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .map(PathBuf::from)
                .ok_or_else(|| format!("{key} missing in {}", home.join("env").display()))
        };
        Ok(Setup {
            python: get("PYTHON")?,
            model: get("MODEL")?,
        })
    }
}

/// How to start one server.
#[derive(Debug, Clone, Copy)]
pub struct ServerSpec {
    /// Total context; each slot gets `ctx / slots`.
    pub ctx: u32,
    pub slots: u32,
    /// Unload the model after this many idle seconds (`--sleep-idle-seconds`).
    pub sleep_idle_s: Option<u32>,
}

/// One running llama.cpp server process.
pub struct Server {
    pub addr: SocketAddr,
    pub spec: ServerSpec,
    child: Option<Child>,
}

impl Server {
    /// Start servers for all `specs` at once (they load in parallel) and wait until each is
    /// ready.
    pub fn start_all(setup: &Setup, specs: &[ServerSpec]) -> Vec<Server> {
        let pending: Vec<_> = specs.iter().map(|s| Server::spawn(setup, *s)).collect();
        pending
            .into_iter()
            .map(|(spec, mut child, rx)| {
                let addr = match rx.recv_timeout(Duration::from_secs(120)) {
                    Ok(a) => a.parse().expect("READY address"),
                    Err(_) => {
                        let _ = child.kill();
                        panic!("llama.cpp server {spec:?} did not get ready in 120 s");
                    }
                };
                Server {
                    addr,
                    spec,
                    child: Some(child),
                }
            })
            .collect()
    }

    fn spawn(setup: &Setup, spec: ServerSpec) -> (ServerSpec, Child, mpsc::Receiver<String>) {
        let mut cmd = Command::new(&setup.python);
        cmd.arg(format!("{ROOT}/tests/llamacpp/serve.py"))
            .arg(&setup.model)
            .args(["--ctx", &spec.ctx.to_string()])
            .args(["--slots", &spec.slots.to_string()]);
        if let Some(s) = spec.sleep_idle_s {
            cmd.args(["--sleep-idle", &s.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start serve.py");
        let stdout = child.stdout.take().expect("serve.py stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("READY http://") {
                    let _ = tx.send(url.trim_end_matches('/').to_string());
                }
            }
        });
        (spec, child, rx)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// SIGKILL the server (as a crash would) and wait for it to be gone.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// YAML for one gateway node in front of `s`.
pub fn node_yaml(id: &str, s: &Server) -> String {
    format!(
        "    - id: {id}\n      url: http://{}\n      backend: llamacpp\n",
        s.addr
    )
}
