//! `fleetgate agent`: runs beside a node's backend and heartbeats host facts to the gateway's
//! admin listener (`POST /fleet/nodes/heartbeat`, bearer token) every `interval_ms`. SIGTERM
//! (or ctrl-c) sends one last heartbeat with `draining: true`, then exits: the gateway stops
//! routing new requests to the node while in-flight ones finish.

pub mod host;

use std::path::Path;
use std::time::Duration;

use crate::config::{validate_agent, AgentFile, Backend, Config};
use crate::fleet::{BackendReport, Heartbeat};
use crate::services::health::{poll_backend, poll_client};
use host::{cpu_percent, Host};

/// Command-line settings; each overrides the `agent:` section of the config file.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AgentArgs {
    /// The gateway's admin listener, e.g. http://10.0.0.1:9090.
    #[arg(long, env = "FLEETGATE_AGENT_GATEWAY")]
    pub gateway: Option<String>,
    /// This node's id at the gateway.
    #[arg(long, env = "FLEETGATE_AGENT_NODE_ID")]
    pub node_id: Option<String>,
    /// The local backend as the gateway reaches it, e.g. http://10.0.0.7:11434.
    #[arg(long, env = "FLEETGATE_AGENT_BACKEND_URL")]
    pub backend_url: Option<String>,
    /// ollama | openai | vllm | llamacpp | sim
    #[arg(long)]
    pub backend: Option<Backend>,
    /// Heartbeat interval, ms.
    #[arg(long)]
    pub interval_ms: Option<u64>,
    /// Bearer token (the gateway's fleet.agent_token or server.admin_token).
    #[arg(long, env = "FLEETGATE_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Total memory to report, GB (default: /proc/meminfo).
    #[arg(long)]
    pub memory_gb: Option<f64>,
    /// Memory bandwidth, GB/s (it cannot be measured cheaply; give it here).
    #[arg(long)]
    pub bandwidth_gbps: Option<f64>,
    /// Root of /proc and /sys (tests use a fake tree).
    #[arg(long)]
    pub sys_root: Option<String>,
    /// Send one heartbeat and exit.
    #[arg(long)]
    pub once: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid agent settings:\n  - {}", .0.join("\n  - "))]
    Config(Vec<String>),
    #[error("heartbeat to {url}: {message}")]
    Send { url: String, message: String },
    #[error("signal handler: {0}")]
    Signal(std::io::Error),
}

/// The `agent:` section of `config` (when the file exists), overridden by `args`, validated.
pub fn settings(config: &Path, args: &AgentArgs) -> Result<AgentFile, AgentError> {
    let mut a = match std::fs::read_to_string(config) {
        Ok(text) => Config::parse(&text)
            .map_err(|e| AgentError::Config(e.0))?
            .agent
            .unwrap_or_default(),
        Err(_) => AgentFile::default(),
    };
    let args = args.clone();
    a.gateway_url = args.gateway.unwrap_or(a.gateway_url);
    a.node_id = args.node_id.unwrap_or(a.node_id);
    a.backend_url = args.backend_url.unwrap_or(a.backend_url);
    a.backend = args.backend.unwrap_or(a.backend);
    a.interval_ms = args.interval_ms.unwrap_or(a.interval_ms);
    a.token = args.token.or(a.token);
    a.memory_gb = args.memory_gb.or(a.memory_gb);
    a.bandwidth_gbps = args.bandwidth_gbps.or(a.bandwidth_gbps);
    a.sys_root = args.sys_root.unwrap_or(a.sys_root);
    let mut errors = Vec::new();
    validate_agent(&mut errors, &a);
    if errors.is_empty() {
        Ok(a)
    } else {
        Err(AgentError::Config(errors))
    }
}

/// The agent's state between heartbeats.
pub struct Agent {
    s: AgentFile,
    host: Host,
    client: reqwest::Client,
    poll: reqwest::Client,
    last_cpu: Option<(u64, u64)>,
}

impl Agent {
    pub fn new(s: AgentFile) -> Agent {
        let host = Host::new(&s.sys_root);
        Agent {
            host,
            client: poll_client(Duration::from_secs(5)),
            poll: poll_client(Duration::from_secs(2)),
            last_cpu: None,
            s,
        }
    }

    fn url(&self) -> String {
        format!(
            "{}{}",
            self.s.gateway_url.trim_end_matches('/'),
            crate::admin::heartbeat::PATH
        )
    }

    /// Build one heartbeat: host facts now plus what the local backend answers.
    pub async fn heartbeat(&mut self, draining: bool) -> Heartbeat {
        let mem = self.host.memory();
        let cpu_now = self.host.cpu_sample();
        let cpu = match (self.last_cpu, cpu_now) {
            (Some(a), Some(b)) => cpu_percent(a, b),
            _ => None,
        };
        self.last_cpu = cpu_now.or(self.last_cpu);
        let backend_report = match crate::config::parse_url(&self.s.backend_url) {
            Ok((_, addr)) => Some(match poll_backend(&self.poll, self.s.backend, addr).await {
                Ok(p) => BackendReport {
                    reachable: true,
                    loaded_models: p
                        .models
                        .into_iter()
                        .filter(|m| m.loaded)
                        .map(|m| m.name)
                        .collect(),
                    error: None,
                },
                Err(e) => BackendReport {
                    reachable: false,
                    loaded_models: Vec::new(),
                    error: Some(e),
                },
            }),
            Err(_) => None,
        };
        Heartbeat {
            node_id: self.s.node_id.clone(),
            backend_url: self.s.backend_url.clone(),
            backend: self.s.backend,
            free_memory_gb: mem.map(|m| m.available_gb),
            total_memory_gb: self.s.memory_gb.or(mem.map(|m| m.total_gb)),
            pressure: self.host.pressure(mem),
            cpu_percent: cpu,
            thermal_throttled: self.host.thermal_throttled(),
            bandwidth_gbps: self.s.bandwidth_gbps,
            draining,
            backend_report,
        }
    }

    /// Send one heartbeat; the gateway's answer (JSON) on success.
    pub async fn send(&mut self, draining: bool) -> Result<serde_json::Value, AgentError> {
        let hb = self.heartbeat(draining).await;
        let url = self.url();
        let mut req = self.client.post(&url).json(&hb);
        if let Some(t) = &self.s.token {
            req = req.bearer_auth(t);
        }
        let err = |message: String| AgentError::Send {
            url: url.clone(),
            message,
        };
        let resp = req.send().await.map_err(|e| err(e.to_string()))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(err(format!("status {status}: {body}")));
        }
        Ok(serde_json::from_str(&body).unwrap_or(serde_json::Value::Null))
    }

    /// Heartbeat every interval until SIGTERM / ctrl-c, then send the drain heartbeat.
    pub async fn run(mut self, once: bool) -> Result<(), AgentError> {
        if once {
            return self.send(false).await.map(|_| ());
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(AgentError::Signal)?;
        let mut tick = tokio::time::interval(Duration::from_millis(self.s.interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        log::info!(
            "agent {}: heartbeating {} every {} ms",
            self.s.node_id,
            self.url(),
            self.s.interval_ms
        );
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
                _ = tick.tick() => match self.send(false).await {
                    Ok(v) => log::debug!("agent {}: heartbeat ok: {v}", self.s.node_id),
                    Err(e) => log::warn!("agent {}: {e}", self.s.node_id),
                },
            }
        }
        log::info!(
            "agent {}: stopping: sending drain heartbeat",
            self.s.node_id
        );
        self.send(true).await.map(|_| ())
    }
}
