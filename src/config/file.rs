//! The user-facing YAML schema: serde types with defaults and `deny_unknown_fields`.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::routing::Policy;
use crate::sim::SimSpec;

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: ServerFile,
    #[serde(default)]
    pub limits: LimitsFile,
    #[serde(default)]
    pub health: HealthFile,
    #[serde(default)]
    pub routing: RoutingFile,
    #[serde(default)]
    pub queue: QueueFile,
    #[serde(default)]
    pub models: ModelsFile,
    #[serde(default)]
    pub fleet: FleetFile,
    #[serde(default)]
    pub breaker: BreakerFile,
    #[serde(default)]
    pub learning: LearningFile,
    /// Settings of `fleetgate agent` (the gateway ignores them).
    pub agent: Option<AgentFile>,
    #[serde(default)]
    pub access_log: AccessLogFile,
    /// API keys -> tenants; auth is on when any key is configured.
    #[serde(default)]
    pub auth: super::tenants::AuthFile,
    /// Tenant id -> weight and limits.
    #[serde(default)]
    pub tenants: BTreeMap<String, super::tenants::TenantFile>,
    #[serde(default)]
    pub clients: super::ClientsFile,
    #[serde(default)]
    pub admission: super::admission::AdmissionFile,
    #[serde(default)]
    pub timeouts: super::admission::TimeoutsFile,
}

/// One JSON line per proxied request, written off the request path.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLogFile {
    pub enabled: bool,
    /// File to append to; standard output when absent.
    pub path: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerFile {
    pub listen: String,
    pub admin_listen: String,
    pub threads: usize,
    /// Tokio work stealing between the proxy's worker threads (off: each connection, its
    /// tasks and its wake-ups stay on one thread, as in nginx's workers; faster at c=1, but
    /// see conf/fleetgate.yaml before turning it off).
    pub work_stealing: bool,
    pub admin_token: Option<String>,
    pub grace_period_s: u64,
    /// Unix socket a new process (`fleetgate run --upgrade`) takes the listening sockets from.
    pub upgrade_sock: String,
}

impl Default for ServerFile {
    fn default() -> Self {
        ServerFile {
            listen: "0.0.0.0:8080".into(),
            admin_listen: "127.0.0.1:9090".into(),
            threads: 2,
            work_stealing: true,
            admin_token: None,
            grace_period_s: 30,
            upgrade_sock: "/tmp/fleetgate_upgrade.sock".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsFile {
    pub max_body_bytes: usize,
    pub connect_timeout_ms: u64,
    pub read_timeout_s: u64,
    pub write_timeout_s: u64,
    pub pool_idle_timeout_s: u64,
}

impl Default for LimitsFile {
    fn default() -> Self {
        LimitsFile {
            max_body_bytes: 32 * 1024 * 1024,
            connect_timeout_ms: 2_000,
            read_timeout_s: 600,
            write_timeout_s: 60,
            pool_idle_timeout_s: 30,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthFile {
    pub poll_interval_ms: u64,
    pub poll_timeout_ms: u64,
    pub failures_before_offline: u32,
    /// A node that comes back (polls answer again, heartbeats resume) is in warmup this long.
    pub warmup_s: u64,
    /// A node whose agent heartbeat is older than this is offline.
    pub heartbeat_miss_s: u64,
}

impl Default for HealthFile {
    fn default() -> Self {
        HealthFile {
            poll_interval_ms: 5_000,
            poll_timeout_ms: 2_000,
            failures_before_offline: 2,
            warmup_s: 90,
            heartbeat_miss_s: 90,
        }
    }
}

/// Outcome-fed circuit breaker (spec 003).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerFile {
    /// Consecutive fault-qualifying outcomes that open the breaker.
    pub failure_threshold: u32,
    /// How long an open breaker keeps the node (or node:model) out before a half-open trial.
    pub cooldown_s: u64,
}

impl Default for BreakerFile {
    fn default() -> Self {
        BreakerFile {
            failure_threshold: 5,
            cooldown_s: 30,
        }
    }
}

/// Capacity learning (spec 000, Adaptive Capacity): where learned baselines are kept.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LearningFile {
    /// Directory of the learner's state file (`capacity.json`); none: not persisted.
    pub state_dir: Option<String>,
    /// How often the state file is rewritten (also on shutdown).
    pub save_interval_s: u64,
}

impl Default for LearningFile {
    fn default() -> Self {
        LearningFile {
            state_dir: None,
            save_interval_s: 60,
        }
    }
}

/// `fleetgate agent`: heartbeats host facts of this node to the gateway's admin listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentFile {
    /// The gateway's admin listener, e.g. http://10.0.0.1:9090.
    pub gateway_url: String,
    pub node_id: String,
    /// The local backend, as the gateway should reach it.
    pub backend_url: String,
    pub backend: Backend,
    pub interval_ms: u64,
    /// Bearer token (`fleet.agent_token` or `server.admin_token` of the gateway).
    pub token: Option<String>,
    pub memory_gb: Option<f64>,
    pub bandwidth_gbps: Option<f64>,
    /// Root that `/proc` and `/sys` are read under (tests point it at a fake tree).
    pub sys_root: String,
}

impl Default for AgentFile {
    fn default() -> Self {
        AgentFile {
            gateway_url: "http://127.0.0.1:9090".into(),
            node_id: String::new(),
            backend_url: "http://127.0.0.1:11434".into(),
            backend: Backend::Ollama,
            interval_ms: 5_000,
            token: None,
            memory_gb: None,
            bandwidth_gbps: None,
            sys_root: "/".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingFile {
    pub retries: u32,
    pub chars_per_token: f64,
    pub default_output_reserve: u32,
    /// HMAC secret for `X-Fleet-Conversation` keys; replicas must share it to agree.
    pub affinity_secret: String,
    /// Spec 004 "only warm providers" for every model (per model: `models.require_warm`).
    pub require_warm: bool,
    /// Stage 2: `completion` (predicted finish time; the default), `spec` (spec 000's points),
    /// or the baselines `least-busy` and `round-robin`, over the same survivors.
    pub mode: crate::routing::Mode,
    /// Derive an affinity key from the stable prompt prefix when no `X-Fleet-Conversation`.
    pub prefix_affinity: bool,
    pub policy: Policy,
}

impl Default for RoutingFile {
    fn default() -> Self {
        RoutingFile {
            retries: 2,
            chars_per_token: 4.0,
            default_output_reserve: 1024,
            affinity_secret: DEFAULT_AFFINITY_SECRET.into(),
            require_warm: false,
            mode: crate::routing::Mode::Completion,
            prefix_affinity: true,
            policy: Policy::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueFile {
    /// Longest a request waits in the holding queue (nothing can serve it) before 503.
    pub holding_timeout_s: u64,
    /// The holding queue rescans at least this often (and on every fleet change).
    pub holding_rescore_ms: u64,
    /// Most requests in the holding queue; past it, 429 queue_full at once.
    pub holding_max: usize,
    /// Longest a request waits for a seat in a node:model queue before 503.
    pub max_wait_s: u64,
    /// Pre-warm (Stage 4): check interval and the depth (running + waiting) that triggers it.
    pub prewarm_interval_ms: u64,
    pub prewarm_threshold: u32,
    /// Rebalance (Stage 5): interval, waiting depth that triggers it, moves per cycle.
    pub rebalance_interval_ms: u64,
    pub rebalance_threshold: u32,
    pub rebalance_max_moves: u32,
    /// Pull a model no node has (Ollama /api/pull) onto the node with the most free memory.
    pub auto_pull: bool,
}

impl Default for QueueFile {
    fn default() -> Self {
        QueueFile {
            holding_timeout_s: 30,
            holding_rescore_ms: 2_000,
            holding_max: 256,
            max_wait_s: 300,
            prewarm_interval_ms: 5_000,
            prewarm_threshold: 3,
            rebalance_interval_ms: 5_000,
            rebalance_threshold: 4,
            rebalance_max_moves: 3,
            auto_pull: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsFile {
    /// Client-facing name -> model name on the nodes.
    pub aliases: BTreeMap<String, String>,
    /// Model -> fallback models in order, used when the body gives none.
    pub fallbacks: BTreeMap<String, Vec<String>>,
    /// Models served only by nodes that have them loaded (spec 004 warm-only rule).
    pub require_warm: Vec<String>,
    /// Models whose output budget is clamped to the chosen node's window when the prompt fits
    /// but prompt + requested output would not (spec 003 lease `maxTokens`); opt-in.
    pub clamp_output: Vec<String>,
    /// Coding-agent model ids mapped by tier to what the fleet has.
    pub resolve: super::resolve::ResolveFile,
}

/// The built-in affinity secret: fine for one gateway, set your own for several replicas
/// (they agree only when they share it) or to keep conversation keys unguessable.
pub const DEFAULT_AFFINITY_SECRET: &str = "fleetgate-affinity";

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct FleetFile {
    pub nodes: Vec<NodeFile>,
    /// Accept heartbeats from nodes not in `nodes` and add them to the fleet.
    pub allow_registration: bool,
    /// Bearer token agents may use for heartbeats (the admin token is accepted too).
    pub agent_token: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Ollama,
    Openai,
    /// OpenAI-compatible, plus `/metrics` (requests running / waiting).
    Vllm,
    /// llama.cpp server: OpenAI-compatible, plus `/props` and `/slots`.
    Llamacpp,
    Sim,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ollama" => Ok(Backend::Ollama),
            "openai" => Ok(Backend::Openai),
            "vllm" => Ok(Backend::Vllm),
            "llamacpp" => Ok(Backend::Llamacpp),
            "sim" => Ok(Backend::Sim),
            _ => Err(format!(
                "unknown backend {s:?}: expected ollama, openai, vllm, llamacpp or sim"
            )),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeFile {
    pub id: String,
    pub url: String,
    pub backend: Backend,
    /// Concurrent seats; default: from the backend, else 1.
    pub capacity: Option<u32>,
    /// In-flight ceiling; default: capacity x 4.
    pub hard_cap: Option<u32>,
    pub memory_gb: Option<f64>,
    pub bandwidth_gbps: Option<f64>,
    /// Priors for completion mode until rates are observed: prompt tokens/s, output tokens/s
    /// of one stream, model-load read speed (GB/s).
    pub prefill_tokens_per_sec: Option<f64>,
    pub decode_tokens_per_sec: Option<f64>,
    pub load_gbps: Option<f64>,
    #[serde(default)]
    pub tier: crate::routing::Tier,
    #[serde(default)]
    pub tags: Vec<String>,
    /// Wire protocols the node speaks; default by backend.
    pub protocols: Option<Vec<crate::routing::Family>>,
    /// Context window cap for every model on the node.
    pub max_context: Option<u32>,
    pub output_reserve: Option<u32>,
    #[serde(default)]
    pub overhead_tokens: u32,
    /// Static model facts (what the backend cannot report, or a what-if fleet for `explain`).
    #[serde(default)]
    pub models: Vec<ModelFile>,
    /// Capacity learning from this node's agent heartbeats (spec 000, opt-in).
    #[serde(default)]
    pub learning: bool,
    /// For `backend: sim`: the simulated node the gateway starts in-process on `url`'s port.
    pub sim: Option<SimSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    pub name: String,
    pub size_gb: Option<f64>,
    pub context: Option<u32>,
    #[serde(default)]
    pub loaded: bool,
}
