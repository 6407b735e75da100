//! A placement scenario as written in `benches/scenarios/*.yaml`: the simulated fleet (full
//! physics), the request mix, conversations, bursts and run-time events; and the gateway
//! config it generates, which tells fleetgate only what a user knows.

use std::path::Path;

use fleetgate::sim::{SimHandle, SimSpec};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    /// One line on what the scenario stresses.
    pub about: String,
    /// Trace seed; run `i` uses `seed + i`.
    pub seed: u64,
    /// Open-loop arrivals last this long (seconds); the run ends when every request is done.
    pub duration_s: f64,
    /// Poisson arrival rate of the open-loop mix, requests per second.
    #[serde(default)]
    pub rate_per_s: f64,
    #[serde(default)]
    pub mix: Vec<Class>,
    #[serde(default)]
    pub bursts: Vec<Burst>,
    #[serde(default)]
    pub conversations: Option<Conversations>,
    #[serde(default)]
    pub events: Vec<Event>,
    pub nodes: Vec<NodeDef>,
    /// How many times slower than written the run goes (`FLEETGATE_BENCH_STRETCH`, see
    /// [`Scenario::stretch`]); 1 as written.
    #[serde(skip, default = "one")]
    pub stretch: f64,
}

/// One kind of single-shot request; prompt lengths are drawn log-uniform in `prompt`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Class {
    pub model: String,
    #[serde(default = "one")]
    pub weight: f64,
    /// Prompt tokens, [low, high].
    pub prompt: [u32; 2],
    /// Output tokens (the request's `num_predict`), [low, high], uniform.
    pub output: [u32; 2],
    /// A system prompt before the user message, one of a few the class's requests share (an
    /// agent's or an app's); none by default.
    #[serde(default)]
    pub system: Option<SharedSystem>,
}

/// `prompts` distinct system prompts of `tokens` each; a request draws one uniformly.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedSystem {
    pub prompts: u32,
    pub tokens: u32,
    /// Sent as the `tools` an agent declares (one function whose description is the text)
    /// instead of a system message.
    #[serde(default)]
    pub as_tools: bool,
}

fn one() -> f64 {
    1.0
}

/// `count` requests of `class` arriving together at `at_s`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Burst {
    pub at_s: f64,
    pub count: usize,
    pub class: Class,
}

/// Multi-turn chats: each turn resends the whole history (system prompt, earlier turns and
/// the replies the client got), sent without any conversation header.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conversations {
    pub count: usize,
    pub turns: usize,
    pub model: String,
    /// System prompt tokens (distinct per conversation).
    pub system: u32,
    /// New user tokens per turn, [low, high].
    pub turn: [u32; 2],
    pub output: [u32; 2],
    /// Pause between a reply and the next turn, ms, [low, high].
    pub think_ms: [u64; 2],
    /// Conversations start uniformly within this many seconds.
    pub start_within_s: f64,
}

/// A change applied to a node during the run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    pub at_s: f64,
    /// Node id (a replica's full id, e.g. `gpu-3`).
    pub node: String,
    /// New slowdown factor of the node's compute (1 = normal).
    pub slowdown: f64,
}

/// A node of the fleet, or `replicas` identical ones named `<id>-1` .. `<id>-n`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDef {
    pub id: String,
    #[serde(default)]
    pub replicas: Option<usize>,
    pub sim: SimSpec,
}

/// One concrete node: its id and simulated hardware.
#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    pub spec: SimSpec,
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Scenario, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let s: Scenario =
            serde_yaml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        s.validate()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(s)
    }

    /// Run `k` times slower than written: every duration (arrivals, think times, events,
    /// first-token delays, cold loads) times `k`, every rate (arrivals, tokens/s) over `k`,
    /// and the gateway's timers as the scenario scales them (`gateway_yaml`). The scenarios
    /// run ~10x faster than life; `k = 10` replays one at life's pace, which is what a
    /// learner whose constants are in seconds must also get right.
    pub fn stretch(&mut self, k: f64) {
        self.stretch = k;
        let ms = |x: &mut u64| *x = (*x as f64 * k).round() as u64;
        self.duration_s *= k;
        self.rate_per_s /= k;
        for b in &mut self.bursts {
            b.at_s *= k;
        }
        if let Some(c) = &mut self.conversations {
            c.think_ms.iter_mut().for_each(ms);
            c.start_within_s *= k;
        }
        for e in &mut self.events {
            e.at_s *= k;
        }
        for n in &mut self.nodes {
            let s = &mut n.sim;
            s.tokens_per_sec /= k;
            s.prefill_tokens_per_sec = s.prefill_tokens_per_sec.map(|r| r / k);
            ms(&mut s.ttft_ms);
            for m in &mut s.models {
                ms(&mut m.cold_load_ms);
            }
        }
    }

    fn validate(&self) -> Result<(), String> {
        let nodes = self.nodes();
        for n in &nodes {
            n.spec
                .validate()
                .map_err(|e| format!("node {}: {e}", n.id))?;
        }
        let models = self
            .mix
            .iter()
            .chain(self.bursts.iter().map(|b| &b.class))
            .map(|c| c.model.as_str())
            .chain(self.conversations.iter().map(|c| c.model.as_str()));
        for m in models {
            if !nodes
                .iter()
                .any(|n| n.spec.models.iter().any(|x| x.name == m))
            {
                return Err(format!("model '{m}' is on no node"));
            }
        }
        for e in &self.events {
            if !nodes.iter().any(|n| n.id == e.node) {
                return Err(format!("event for unknown node '{}'", e.node));
            }
        }
        if self.rate_per_s > 0.0 && self.mix.is_empty() {
            return Err("rate_per_s > 0 needs a mix".into());
        }
        Ok(())
    }

    /// Every concrete node, replicas expanded (each replica gets its own seed). With
    /// `FLEETGATE_BENCH_SEATS=said`, each says its seats as llama.cpp's server does
    /// (`SimSpec::says_seats`): nodes by URL only then have them from the backend, as an
    /// SGLang or llama.cpp server's do.
    pub fn nodes(&self) -> Vec<Node> {
        let said = std::env::var("FLEETGATE_BENCH_SEATS").is_ok_and(|v| v == "said");
        let mut out = Vec::new();
        for d in &self.nodes {
            let mut sim = d.sim.clone();
            sim.says_seats |= said;
            match d.replicas {
                None => out.push(Node {
                    id: d.id.clone(),
                    spec: sim,
                }),
                Some(n) => {
                    for i in 1..=n {
                        let mut spec = sim.clone();
                        spec.seed = spec.seed.wrapping_add(i as u64);
                        out.push(Node {
                            id: format!("{}-{i}", d.id),
                            spec,
                        });
                    }
                }
            }
        }
        out
    }
}

/// How fleetgate is run: the routing mode to set, if this build knows `routing.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Completion,
    Spec,
    LeastBusy,
    RoundRobin,
}

impl Mode {
    pub fn key(self) -> &'static str {
        match self {
            Mode::Completion => "completion",
            Mode::Spec => "spec",
            Mode::LeastBusy => "least-busy",
            Mode::RoundRobin => "round-robin",
        }
    }
}

/// The gateway config for the running fleet: per node only its URL, `backend: ollama`, seats
/// and memory (what a user knows; with `FLEETGATE_BENCH_BACKEND=openai`, only its URL and
/// `backend: openai`, as for a vLLM, SGLang or llama.cpp server); models, windows, speeds and what is loaded fleetgate must
/// find out itself. The scenarios run ~10x faster than life, so the two timers a user would
/// tune to their fleet are scaled like it: health polls every 500 ms (default 5 s), a request
/// no node can take now waits at most 3 s (default 30 s), a queued one 30 s (default 300 s).
/// `mode`: `None` when this build has no `routing.mode` (the default placement runs).
/// `stretch` (see [`Scenario::stretch`]) scales the three timers back towards the defaults.
pub fn gateway_yaml(
    nodes: &[Node],
    sims: &[SimHandle],
    mode: Option<Mode>,
    stretch: f64,
) -> String {
    let mut y = format!(
        "health:\n  poll_interval_ms: {}\nqueue:\n  holding_timeout_s: {}\n  max_wait_s: {}\n",
        (500.0 * stretch).round() as u64,
        (3.0 * stretch).ceil() as u64,
        (30.0 * stretch).ceil() as u64
    );
    if let Some(m) = mode {
        y += &format!("routing:\n  mode: {}\n  prefix_affinity: true\n", m.key());
        // A/B runs of one knob: `FLEETGATE_BENCH_POLICY="completion_choose_evictions: false"`
        // (`;` between settings) goes into `routing.policy`.
        if let Ok(p) = std::env::var("FLEETGATE_BENCH_POLICY") {
            y += "  policy:\n";
            for kv in p.split(';').map(str::trim).filter(|kv| !kv.is_empty()) {
                y += &format!("    {kv}\n");
            }
        }
    }
    y += "fleet:\n  nodes:\n";
    let openai = matches!(
        std::env::var("FLEETGATE_BENCH_BACKEND").as_deref(),
        Ok("openai")
    );
    for (n, s) in nodes.iter().zip(sims) {
        y += &if openai {
            // A user who fronts OpenAI-compatible servers and knows only their URLs.
            format!(
                "    - id: {}\n      url: http://{}\n      backend: openai\n",
                n.id,
                s.addr()
            )
        } else {
            format!(
                "    - id: {}\n      url: http://{}\n      backend: ollama\n      capacity: {}\n      memory_gb: {}\n",
                n.id,
                s.addr(),
                n.spec.seats,
                n.spec.memory_gb
            )
        };
    }
    y
}

/// Whether this build's config accepts `routing.mode` (the completion-time work has landed).
pub fn modes_supported() -> bool {
    let y = "server:\n  listen: 127.0.0.1:1\n  admin_listen: 127.0.0.1:0\nrouting:\n  mode: completion\n  prefix_affinity: true\nfleet:\n  nodes:\n    - id: a\n      url: http://127.0.0.1:2\n      backend: ollama\n";
    fleetgate::config::Config::from_yaml(y).is_ok()
}
