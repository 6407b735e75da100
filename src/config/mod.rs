//! Configuration: YAML file -> serde types -> env overrides -> `validate()` -> internal `Config`.

mod admission;
mod clients;
mod env;
mod file;
mod node;
mod resolve;
pub mod tenants;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

pub use admission::{AdmissionFile, TimeoutsFile};
pub use clients::{Clients, ClientsFile};
pub use env::apply_env;
pub use file::*;
use node::validate_node;
pub use node::{default_families, parse_url, valid_id, validate_agent};
pub use resolve::{ResolveFile, TierFile};

use crate::routing::{Family, Policy, Tier};
use crate::sim::SimSpec;

/// Every problem found in a config file, each naming the field, the value and what was expected.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.join("\n"))]
pub struct ConfigError(pub Vec<String>);

/// The validated configuration the rest of the code uses.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub threads: usize,
    pub work_stealing: bool,
    pub admin_token: Option<String>,
    pub grace_period_s: u64,
    pub upgrade_sock: String,
    pub limits: Limits,
    pub health: Health,
    pub routing: Routing,
    pub queue: QueueFile,
    pub aliases: BTreeMap<String, String>,
    pub fallbacks: BTreeMap<String, Vec<String>>,
    pub require_warm: Vec<String>,
    /// `models.resolve`: coding-agent ids by tier.
    pub resolve: crate::routing::Resolve,
    pub nodes: Vec<NodeConfig>,
    pub breaker: Breaker,
    pub learning: Learning,
    /// Heartbeats from unknown nodes register them (`fleet.allow_registration`).
    pub allow_registration: bool,
    /// Accepted for heartbeats besides the admin token (`fleet.agent_token`).
    pub agent_token: Option<String>,
    pub access_log: AccessLog,
    /// API keys, tenants and their limits (`auth:`, `tenants:`).
    pub tenancy: tenants::Tenancy,
    /// Models whose output budget may be clamped to fit a window (`models.clamp_output`).
    pub clamp_output: Vec<String>,
    pub clients: Clients,
    pub admission: AdmissionFile,
    pub timeouts: TimeoutsFile,
}

#[derive(Debug, Clone)]
pub struct Breaker {
    pub failure_threshold: u32,
    pub cooldown: Duration,
}

#[derive(Debug, Clone)]
pub struct Learning {
    pub state_dir: Option<std::path::PathBuf>,
    pub save_interval: Duration,
}

/// Where the access log goes; `None`: no access log.
#[derive(Debug, Clone, Default)]
pub struct AccessLog {
    pub target: Option<AccessLogTarget>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    Stdout,
    File(std::path::PathBuf),
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub pool_idle_timeout: Duration,
}

#[derive(Debug, Clone)]
pub struct Health {
    pub poll_interval: Duration,
    pub poll_timeout: Duration,
    pub failures_before_offline: u32,
    pub warmup: Duration,
    pub heartbeat_miss: Duration,
}

#[derive(Debug, Clone)]
pub struct Routing {
    pub retries: u32,
    pub chars_per_token: f64,
    pub default_output_reserve: u32,
    pub affinity_secret: String,
    pub require_warm: bool,
    /// Header-less prefix affinity (`routing.prefix_affinity`).
    pub prefix_affinity: bool,
    /// `policy.mode` holds `routing.mode`.
    pub policy: Policy,
}

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: String,
    pub url: String,
    /// Resolved at load: `HttpPeer::new` must never see a name it cannot resolve.
    pub addr: SocketAddr,
    /// `host[:port]` as written in the URL, sent as the Host header.
    pub host: String,
    pub backend: Backend,
    pub seats: Option<u32>,
    pub hard_cap: Option<u32>,
    pub memory_gb: Option<f64>,
    pub bandwidth_gbps: Option<f64>,
    /// Completion-mode priors: prompt tokens/s, output tokens/s, load GB/s.
    pub prefill_tps: Option<f64>,
    pub decode_tps: Option<f64>,
    pub load_gbps: Option<f64>,
    pub tier: Tier,
    pub tags: Vec<String>,
    pub families: Vec<Family>,
    /// `protocols:` was set: `families` is final (no probing).
    pub protocols_fixed: bool,
    pub max_context: Option<u32>,
    pub output_reserve: u32,
    pub overhead_tokens: u32,
    pub models: Vec<ModelFile>,
    pub sim: Option<SimSpec>,
    /// Capacity learning from agent heartbeats.
    pub learning: bool,
    /// Registered by a heartbeat, not from the config file.
    pub dynamic: bool,
}

impl Config {
    /// Read, apply `FLEETGATE_*` overrides and validate.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError(vec![format!(
                "config file {}: cannot read: {e}",
                path.display()
            )])
        })?;
        let mut file = Self::parse(&text)?;
        apply_env(&mut file, |k| std::env::var(k).ok())?;
        validate(file)
    }

    /// Parse YAML text (no env, no validation).
    pub fn parse(text: &str) -> Result<FileConfig, ConfigError> {
        serde_yaml::from_str(text).map_err(|e| ConfigError(vec![format!("yaml: {e}")]))
    }

    /// Parse and validate YAML text, without env overrides (tests, `explain`).
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        validate(Self::parse(text)?)
    }

    pub fn node(&self, id: &str) -> Option<&NodeConfig> {
        self.nodes.iter().find(|n| n.id == id)
    }
}

fn socket(errors: &mut Vec<String>, field: &str, value: &str) -> SocketAddr {
    match value.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            errors.push(format!(
                "field `{field}`: value {value:?}: expected an IP:port such as 127.0.0.1:8080"
            ));
            SocketAddr::from(([127, 0, 0, 1], 0))
        }
    }
}

/// Check every field; collect all problems rather than stopping at the first.
pub fn validate(f: FileConfig) -> Result<Config, ConfigError> {
    let mut errors = Vec::new();
    let listen = socket(&mut errors, "server.listen", &f.server.listen);
    let admin_listen = socket(&mut errors, "server.admin_listen", &f.server.admin_listen);
    if f.server.threads == 0 {
        errors.push("field `server.threads`: value 0: expected at least 1".into());
    }
    if f.limits.max_body_bytes < 1024 {
        errors.push(format!(
            "field `limits.max_body_bytes`: value {}: expected at least 1024",
            f.limits.max_body_bytes
        ));
    }
    if f.health.poll_interval_ms < 100 {
        errors.push(format!(
            "field `health.poll_interval_ms`: value {}: expected at least 100",
            f.health.poll_interval_ms
        ));
    }
    if !(f.routing.chars_per_token > 0.5 && f.routing.chars_per_token < 32.0) {
        errors.push(format!(
            "field `routing.chars_per_token`: value {}: expected a number between 0.5 and 32",
            f.routing.chars_per_token
        ));
    }
    if f.fleet.nodes.is_empty() && !f.fleet.allow_registration {
        errors.push(
            "field `fleet.nodes`: empty: expected at least one node (or fleet.allow_registration: true)"
                .into(),
        );
    }
    if f.breaker.failure_threshold == 0 {
        errors.push("field `breaker.failure_threshold`: value 0: expected at least 1".into());
    }
    if f.learning.save_interval_s == 0 {
        errors.push("field `learning.save_interval_s`: value 0: expected at least 1".into());
    }
    if let Some(a) = &f.agent {
        validate_agent(&mut errors, a);
    }
    if let Err(e) = f.routing.policy.validate() {
        errors.push(format!(
            "field `routing.policy.{}`: value {}: expected {}",
            e.field, e.value, e.expected
        ));
    }
    if f.routing.affinity_secret.is_empty() {
        errors.push("field `routing.affinity_secret`: empty: expected a secret string".into());
    }
    for (field, v, min) in [
        ("queue.holding_rescore_ms", f.queue.holding_rescore_ms, 10),
        ("queue.prewarm_interval_ms", f.queue.prewarm_interval_ms, 10),
        (
            "queue.rebalance_interval_ms",
            f.queue.rebalance_interval_ms,
            10,
        ),
    ] {
        if v < min {
            errors.push(format!(
                "field `{field}`: value {v}: expected at least {min}"
            ));
        }
    }
    let tenancy = tenants::validate(
        &mut errors,
        f.auth,
        f.tenants,
        |k| std::env::var(k).ok(),
        |p| std::fs::read_to_string(p),
    );
    let clients = f.clients.validate(f.limits.max_body_bytes, &mut errors);
    admission::validate(&mut errors, &f.admission, &f.timeouts);
    let mut seen = HashSet::new();
    let mut nodes = Vec::new();
    for (i, n) in f.fleet.nodes.into_iter().enumerate() {
        if let Some(node) = validate_node(&mut errors, i, n, &mut seen) {
            nodes.push(node);
        }
    }
    for (alias, target) in &f.models.aliases {
        if alias.is_empty() || target.is_empty() {
            errors.push(format!(
                "field `models.aliases.{alias}`: value {target:?}: expected a non-empty model name"
            ));
        }
    }
    let resolve = resolve::validate_resolve(&mut errors, f.models.resolve);
    if f.access_log.path.as_deref() == Some("") {
        errors.push(
            "field `access_log.path`: empty: expected a file path (or no path for stdout)".into(),
        );
    }
    if !errors.is_empty() {
        return Err(ConfigError(errors));
    }
    let access_log = AccessLog {
        target: f.access_log.enabled.then(|| match f.access_log.path {
            Some(p) => AccessLogTarget::File(p.into()),
            None => AccessLogTarget::Stdout,
        }),
    };
    Ok(Config {
        listen,
        admin_listen,
        threads: f.server.threads,
        work_stealing: f.server.work_stealing,
        admin_token: f.server.admin_token.filter(|t| !t.is_empty()),
        grace_period_s: f.server.grace_period_s,
        upgrade_sock: f.server.upgrade_sock,
        limits: Limits {
            max_body_bytes: f.limits.max_body_bytes,
            connect_timeout: Duration::from_millis(f.limits.connect_timeout_ms),
            read_timeout: Duration::from_secs(f.limits.read_timeout_s),
            write_timeout: Duration::from_secs(f.limits.write_timeout_s),
            pool_idle_timeout: Duration::from_secs(f.limits.pool_idle_timeout_s),
        },
        health: Health {
            poll_interval: Duration::from_millis(f.health.poll_interval_ms),
            poll_timeout: Duration::from_millis(f.health.poll_timeout_ms),
            failures_before_offline: f.health.failures_before_offline.max(1),
            warmup: Duration::from_secs(f.health.warmup_s),
            heartbeat_miss: Duration::from_secs(f.health.heartbeat_miss_s),
        },
        routing: Routing {
            retries: f.routing.retries,
            chars_per_token: f.routing.chars_per_token,
            default_output_reserve: f.routing.default_output_reserve,
            affinity_secret: f.routing.affinity_secret,
            require_warm: f.routing.require_warm,
            prefix_affinity: f.routing.prefix_affinity,
            policy: Policy {
                mode: f.routing.mode,
                ..f.routing.policy
            },
        },
        queue: f.queue,
        aliases: f.models.aliases,
        fallbacks: f.models.fallbacks,
        require_warm: f.models.require_warm,
        resolve,
        nodes,
        breaker: Breaker {
            failure_threshold: f.breaker.failure_threshold,
            cooldown: Duration::from_secs(f.breaker.cooldown_s),
        },
        learning: Learning {
            state_dir: f.learning.state_dir.map(std::path::PathBuf::from),
            save_interval: Duration::from_secs(f.learning.save_interval_s),
        },
        allow_registration: f.fleet.allow_registration,
        agent_token: f.fleet.agent_token.filter(|t| !t.is_empty()),
        access_log,
        tenancy,
        clamp_output: f.models.clamp_output,
        clients,
        admission: f.admission,
        timeouts: f.timeouts,
    })
}

#[cfg(test)]
mod tests;
