//! Configuration: YAML file -> serde types -> env overrides -> `validate()` -> internal `Config`.

mod env;
mod file;

use std::collections::{BTreeMap, HashSet};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

pub use env::apply_env;
pub use file::*;

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
    pub admin_token: Option<String>,
    pub grace_period_s: u64,
    pub limits: Limits,
    pub health: Health,
    pub routing: Routing,
    pub queue: QueueFile,
    pub aliases: BTreeMap<String, String>,
    pub fallbacks: BTreeMap<String, Vec<String>>,
    pub require_warm: Vec<String>,
    pub nodes: Vec<NodeConfig>,
    pub breaker: Breaker,
    pub learning: Learning,
    /// Heartbeats from unknown nodes register them (`fleet.allow_registration`).
    pub allow_registration: bool,
    /// Accepted for heartbeats besides the admin token (`fleet.agent_token`).
    pub agent_token: Option<String>,
    pub access_log: AccessLog,
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
    pub tier: Tier,
    pub tags: Vec<String>,
    pub families: Vec<Family>,
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
        admin_token: f.server.admin_token.filter(|t| !t.is_empty()),
        grace_period_s: f.server.grace_period_s,
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
            policy: f.routing.policy,
        },
        queue: f.queue,
        aliases: f.models.aliases,
        fallbacks: f.models.fallbacks,
        require_warm: f.models.require_warm,
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
    })
}

/// Check the `agent:` section (used by `fleetgate agent`; validated with the rest).
pub fn validate_agent(errors: &mut Vec<String>, a: &AgentFile) {
    for (field, url) in [
        ("gateway_url", &a.gateway_url),
        ("backend_url", &a.backend_url),
    ] {
        if let Err(why) = parse_url(url) {
            errors.push(format!("field `agent.{field}`: value {url:?}: {why}"));
        }
    }
    if !valid_id(&a.node_id) {
        errors.push(format!(
            "field `agent.node_id`: value {:?}: expected letters, digits, '-', '_' or '.'",
            a.node_id
        ));
    }
    if a.interval_ms < 100 {
        errors.push(format!(
            "field `agent.interval_ms`: value {}: expected at least 100",
            a.interval_ms
        ));
    }
    for (field, v) in [
        ("memory_gb", a.memory_gb),
        ("bandwidth_gbps", a.bandwidth_gbps),
    ] {
        if v.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
            errors.push(format!(
                "field `agent.{field}`: value {}: expected a positive number",
                v.unwrap_or_default()
            ));
        }
    }
}

/// Node ids: non-empty, letters, digits, '-', '_' or '.' (they become metric labels).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn validate_node(
    errors: &mut Vec<String>,
    i: usize,
    n: NodeFile,
    seen: &mut HashSet<String>,
) -> Option<NodeConfig> {
    let at = format!("fleet.nodes[{i}]");
    let before = errors.len();
    if !valid_id(&n.id) {
        errors.push(format!(
            "field `{at}.id`: value {:?}: expected letters, digits, '-', '_' or '.'",
            n.id
        ));
    } else if !seen.insert(n.id.clone()) {
        errors.push(format!(
            "field `{at}.id`: value {:?}: expected a unique id (used twice)",
            n.id
        ));
    }
    let (host, addr) = match parse_url(&n.url) {
        Ok(v) => v,
        Err(why) => {
            errors.push(format!("field `{at}.url`: value {:?}: {why}", n.url));
            (String::new(), SocketAddr::from(([127, 0, 0, 1], 0)))
        }
    };
    for (field, v) in [("capacity", n.capacity), ("hard_cap", n.hard_cap)] {
        if v == Some(0) {
            errors.push(format!(
                "field `{at}.{field}`: value 0: expected at least 1"
            ));
        }
    }
    if let (Some(c), Some(h)) = (n.capacity, n.hard_cap) {
        if h < c {
            errors.push(format!(
                "field `{at}.hard_cap`: value {h}: expected at least capacity ({c})"
            ));
        }
    }
    for (field, v) in [
        ("memory_gb", n.memory_gb),
        ("bandwidth_gbps", n.bandwidth_gbps),
    ] {
        if v.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
            errors.push(format!(
                "field `{at}.{field}`: value {}: expected a positive number",
                v.unwrap_or_default()
            ));
        }
    }
    match (n.backend, &n.sim) {
        (Backend::Sim, Some(sim)) if sim.models.is_empty() => errors.push(format!(
            "field `{at}.sim.models`: empty: expected at least one model"
        )),
        (b, Some(_)) if b != Backend::Sim => errors.push(format!(
            "field `{at}.sim`: set on backend {b:?}: expected only with backend sim"
        )),
        _ => {}
    }
    for (j, m) in n.models.iter().enumerate() {
        if m.name.is_empty() {
            errors.push(format!(
                "field `{at}.models[{j}].name`: empty: expected a model name"
            ));
        }
    }
    if errors.len() > before {
        return None;
    }
    let families = n.protocols.unwrap_or_else(|| default_families(n.backend));
    let seats = n
        .capacity
        .or_else(|| n.sim.as_ref().map(|s| s.seats.max(1)));
    let memory_gb = n.memory_gb.or_else(|| n.sim.as_ref().map(|s| s.memory_gb));
    Some(NodeConfig {
        id: n.id,
        url: n.url,
        addr,
        host,
        backend: n.backend,
        seats,
        hard_cap: n.hard_cap,
        memory_gb,
        bandwidth_gbps: n.bandwidth_gbps,
        tier: n.tier,
        tags: n.tags,
        families,
        max_context: n.max_context,
        output_reserve: n.output_reserve.unwrap_or(1024),
        overhead_tokens: n.overhead_tokens,
        models: n.models,
        sim: n.sim,
        learning: n.learning,
        dynamic: false,
    })
}

/// Wire protocols a backend speaks when the config does not say.
pub fn default_families(b: Backend) -> Vec<Family> {
    match b {
        Backend::Ollama => vec![Family::OpenAI, Family::Ollama],
        Backend::Openai | Backend::Vllm | Backend::Llamacpp => vec![Family::OpenAI],
        Backend::Sim => vec![Family::OpenAI, Family::Ollama, Family::Anthropic],
    }
}

impl NodeConfig {
    /// A node that registered through a heartbeat: what the agent told us, defaults for the rest.
    pub fn dynamic(
        id: &str,
        url: &str,
        backend: Backend,
        memory_gb: Option<f64>,
        bandwidth_gbps: Option<f64>,
        output_reserve: u32,
    ) -> Result<NodeConfig, String> {
        if !valid_id(id) {
            return Err(format!(
                "node id {id:?}: expected letters, digits, '-', '_' or '.'"
            ));
        }
        let (host, addr) = parse_url(url).map_err(|why| format!("backend_url {url:?}: {why}"))?;
        Ok(NodeConfig {
            id: id.to_string(),
            url: url.to_string(),
            addr,
            host,
            backend,
            seats: None,
            hard_cap: None,
            memory_gb: memory_gb.filter(|v| v.is_finite() && *v > 0.0),
            bandwidth_gbps: bandwidth_gbps.filter(|v| v.is_finite() && *v > 0.0),
            tier: Tier::Provisional,
            tags: Vec::new(),
            families: default_families(backend),
            max_context: None,
            output_reserve,
            overhead_tokens: 0,
            models: Vec::new(),
            sim: None,
            learning: false,
            dynamic: true,
        })
    }
}

/// `http://host:port` -> (Host header value, resolved address).
pub fn parse_url(url: &str) -> Result<(String, SocketAddr), String> {
    let rest = match url.split_once("://") {
        Some(("http", rest)) => rest,
        Some(("https", _)) => {
            return Err("expected an http:// URL (TLS upstreams are not supported yet)".into())
        }
        _ => return Err("expected a URL such as http://192.168.1.20:11434".into()),
    };
    let host = rest.split('/').next().unwrap_or_default();
    if rest.len() > host.len() + 1 {
        return Err(
            "expected no path after host:port (the gateway keeps the client's path)".into(),
        );
    }
    if host.is_empty() {
        return Err("expected a host after http://".into());
    }
    let with_port = if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.chars().all(|c| c.is_ascii_digit()))
    {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    let addr = with_port
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {with_port}: {e}"))?
        .next()
        .ok_or_else(|| format!("{with_port} resolves to no address"))?;
    Ok((host.to_string(), addr))
}

#[cfg(test)]
mod tests;
