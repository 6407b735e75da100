//! The inputs and outputs of `routing::decide`: plain data, no I/O, no clocks.

use serde::{Deserialize, Serialize};

/// Which wire-protocol family a request arrived in; a node must speak it to be a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    OpenAI,
    Ollama,
    Anthropic,
}

/// Everything about one request that routing looks at. Built by the proxy from the parsed body
/// and the `X-Fleet-*` headers; model names are already alias-resolved.
#[derive(Debug, Clone, Default)]
pub struct RouteRequest {
    /// Primary model first, then fallbacks in order (empty fallbacks when `X-Fleet-No-Fallback`).
    pub models: Vec<String>,
    /// The request's number at this gateway: whose turn it is in `least-busy` and
    /// `round-robin` modes (nothing else reads it).
    pub seq: u64,
    pub family: Option<Family>,
    /// Families the gateway can translate this request into when a node lacks `family`
    /// (such a node stays a candidate; at equal score a native node ranks first).
    pub translatable: Vec<Family>,
    /// Estimated prompt tokens (chars/4 + per-message overhead + per-image cost, calibrated).
    pub prompt_tokens: u32,
    /// `max_tokens` from the body when given; otherwise the node's `output_reserve` applies.
    pub max_output_tokens: Option<u32>,
    /// Capabilities the node must advertise as tags (`X-Fleet-Tags`, `vision` for images).
    pub required_tags: Vec<String>,
    /// `X-Fleet-Pin-Node`: strict, only this node may serve.
    pub pin: Option<String>,
    /// HMAC'd conversation key (`X-Fleet-Conversation`), for rendezvous affinity.
    pub affinity_key: Option<u64>,
    /// Nodes already tried for this request (retry exclusion set).
    pub tried: Vec<String>,
    /// Spec 004: only nodes with the model already loaded are eligible.
    pub require_warm: bool,
    /// The endpoint label (`openai_embeddings` ...): pairs that said "not here" for it are out.
    pub endpoint: Option<&'static str>,
    /// Prompt tokens assumed already in a node's prefix cache (completion mode): credited on
    /// `cached_on` when that node is a candidate, else on the affinity key's rendezvous node.
    pub cached_prefix_tokens: u32,
    /// The node that last served this request's prefix key (this gateway's memory).
    pub cached_on: Option<String>,
    /// The request's system prompt, in tokens, taken as cached on `shared_on`: the nodes that
    /// last served a request with the same system prompt (`fleet::prefix`). Completion mode.
    pub shared_prefix_tokens: u32,
    pub shared_on: Vec<String>,
    /// The system prompt's key in that memory (model + system part hash), and every node
    /// remembered serving it, credited or not: (node index, the prompts it prefilled since),
    /// for its answer to tell how far back its cache reaches.
    pub shared_key: Option<u64>,
    pub shared_seen: Vec<(usize, u64)>,
}

/// How Stage 2 ranks the survivors of Stage 1 (`routing.mode`). `Policy::default()` is spec
/// 000's policy, so `Spec` is the type's default; the config's `routing.mode` defaults to
/// `Completion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Spec 000's point system (8 signals), exact.
    #[default]
    Spec,
    /// Predicted completion time: seat wait + cold load + prefill + decode, lowest wins.
    Completion,
    /// The baselines other routers offer (LiteLLM's least-busy, vLLM's and SGLang's
    /// round-robin), over the same survivors: the node:model with the fewest requests running
    /// on the node and waiting for the pair wins, ties taking turns.
    LeastBusy,
    /// The survivors take turns, request by request (`RouteRequest::seq`).
    RoundRobin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    #[default]
    Online,
    Offline,
    Warmup,
    Draining,
    Paused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Pressure {
    #[default]
    Normal,
    Warn,
    Critical,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    #[default]
    Pinned,
    Provisional,
}

/// One model as a node has it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModelView {
    pub name: String,
    /// Weights on disk, GB.
    pub size_gb: f64,
    /// Measured resident size (weights + KV cache) when seen loaded, GB.
    pub resident_gb: Option<f64>,
    pub loaded: bool,
    /// Context window the model is loaded with now (when loaded).
    pub loaded_context: Option<u32>,
    /// Largest context window this node can give the model.
    pub max_context: u32,
    /// When the model was last seen unloaded from this node (ms, same clock as `now_ms`).
    pub unloaded_at_ms: Option<u64>,
    /// On disk (false: pullable only).
    pub on_disk: bool,
    /// The node:model circuit breaker is open (a model-specific fault, spec 003).
    pub breaker_open: bool,
    /// Endpoints this node:model answered "not here" for, until their recheck.
    pub not_capable: Vec<&'static str>,
    /// The most streams of this model the gateway has seen the node decode at once.
    pub seats_seen: u32,
    /// On a node whose seats nobody said (`NodeView::seats_assumed`) that serves several
    /// models: the model was found to run no more than `seats_seen` at once, its own seats
    /// (Ollama's per-model parallel setting behind a URL), whatever the node's other models
    /// run beside it. Priced at those (`completion::priced_seats`).
    pub seats_learned: Option<u32>,
}

/// Capacity learning output for a node with learning turned on (spec 000, Adaptive Capacity).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Learning {
    /// 0.0 ..= 1.0
    pub availability: f64,
    /// Memory ceiling, GB: caps `available` in Signal 2.
    pub ceiling_gb: Option<f64>,
    /// How long CPU has been above 85 %, seconds.
    pub cpu_high_for_s: u64,
    /// Days of observation so far.
    pub days_observed: f64,
}

/// A node as routing sees it: static facts from config plus the last known live state.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeView {
    pub id: String,
    pub health: Health,
    pub breaker_open: bool,
    pub thermal_throttled: bool,
    pub pressure: Pressure,
    /// Free system RAM, GB (None: unknown, treated as total memory minus loaded models).
    pub free_memory_gb: Option<f64>,
    pub memory_gb: f64,
    pub bandwidth_gbps: Option<f64>,
    /// Concurrent seats (spec 003 capacity); at least 1.
    pub seats: u32,
    /// In-flight ceiling (spec 003 hardCap); at least `seats`.
    pub hard_cap: u32,
    /// The node's seats are shared by its models (one count for the node, as a server with a
    /// single queue keeps), not each model's own (Ollama's `OLLAMA_NUM_PARALLEL`): learned
    /// from the requests sent while they were all taken (`fleet::sharing`).
    pub seats_shared: bool,
    /// How likely its models share its seats while its answers have not decided it
    /// (`fleet::SeatSharing::belief`): 1 once they are shared, 0 once each model was found to
    /// have its own; what the wait for a node-wide seat is weighed by
    /// (`completion::Prediction::risk_s`).
    pub seats_shared_p: f64,
    /// Nobody said how many seats it has (no `capacity`, the backend reports none): a batching
    /// server's default is assumed until answers show it runs no more than `seats_seen` at
    /// once (`fleet::sharing`); then those are its seats, shared by its models.
    pub seats_assumed: bool,
    /// The most streams the gateway has seen it decode at once.
    pub seats_seen: u32,
    /// Its backend lists every model it can serve as loaded and says nothing of what is in
    /// memory (`backend: openai`): behind such a list Ollama, LM Studio or llama-swap load a
    /// model on its first request and unload it after a keep-alive. Completion mode learns
    /// those loads from the answers (`Rates::idle_load_s`).
    pub hides_loads: bool,
    pub tier: Tier,
    pub tags: Vec<String>,
    pub families: Vec<Family>,
    pub models: Vec<ModelView>,
    /// Tokens reserved for the output when the request gives no `max_tokens`.
    pub output_reserve: u32,
    /// Per-node overhead tokens (system prompt, video frames ...), spec 003.
    pub overhead_tokens: u32,
    pub learning: Option<Learning>,
    /// Priors a user may know (node config), used until rates are observed: prompt tokens/s,
    /// output tokens/s of one stream, and model-load read speed, GB/s.
    pub prefill_tps: Option<f64>,
    pub decode_tps: Option<f64>,
    pub load_gbps: Option<f64>,
    /// The read speed the node showed loading models, GB/s: their sizes over their observed
    /// load times (read from the first token of an answer that waited for one: `Rates::load_s`),
    /// summed over the models it loaded (`None` before a load was observed). What a model it has
    /// not loaded yet is expected to read at (the disk is the node's).
    pub learned_load_gbps: Option<f64>,
    /// Before the node loaded anything: what the fleet's other nodes showed
    /// (`learned_load_gbps`), their harmonic mean (the mean seconds per GB), as the first
    /// guess for its disk; `None` while no node loaded a model.
    pub peer_load_gbps: Option<f64>,
    /// What the user wrote of the machine (`fleet::view::twin_key`): nodes with the same key
    /// are taken as the same machine (`completion::Input::twin`); `None` without a configured
    /// `memory_gb` (nodes given by URL only all look alike, which says nothing).
    #[serde(skip)]
    pub twin_key: Option<[u64; 8]>,
}

impl NodeView {
    pub fn model(&self, name: &str) -> Option<&ModelView> {
        self.models.iter().find(|m| m.name == name)
    }

    /// Nobody said its seats, none were learned for the node, and it serves several models:
    /// its seats may be each model's own (Ollama's per-model parallel setting behind a URL),
    /// learned per model (`ModelView::seats_learned`).
    pub fn own_seats_unknown(&self) -> bool {
        self.seats_assumed && !self.seats_shared && self.models.len() > 1
    }
}

/// The fleet at one moment: built when the fleet changes, shared read-only.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetView {
    pub nodes: Vec<NodeView>,
}

/// Live load of one node:model pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ModelLoad {
    pub in_flight: u32,
    pub pending: u32,
    /// p75 of observed total latency, ms (None: too little history).
    pub p75_ms: Option<f64>,
    /// Observed output tokens per second.
    pub observed_tps: Option<f64>,
    /// When the first request of a cold load of the model was sent, ms: while the model is not
    /// loaded and a request holds it, the load has been under way since then.
    pub loading_since_ms: Option<u64>,
    /// On a node that hides its loads: when a request sent to the pair in a spell (idle past
    /// the keep-alive, displaced, or a stalled one's send) went out, ms, while the pair has
    /// sent no first byte since (it may be loading unseen, and a request sent now waits for the
    /// rest of that load).
    pub hidden_load_since_ms: Option<u64>,
    /// That spell began because another model had been sent to the node since the pair's last
    /// request (`displaced`), not because the pair sat idle past the keep-alive.
    pub hidden_load_switch: bool,
    /// On the node, another model was sent a request after this pair's last one: behind a
    /// server that swaps models (llama-swap, LM Studio, a small GPU) it may have pushed this
    /// one out of memory.
    pub displaced: bool,
}

impl ModelLoad {
    /// Requests running or waiting for the model on the node.
    pub fn depth(&self) -> u32 {
        self.in_flight.saturating_add(self.pending)
    }

    /// Some request is running or waiting for it (it cannot be evicted; not loaded, it is
    /// being loaded).
    pub fn busy(&self) -> bool {
        self.depth() > 0
    }
}

/// A node's prefill queue: uncached prompt tokens sent to it and not answered yet, and when
/// the first of them could start (ms; the last first byte, or its send to an idle queue).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefillLoad {
    pub tokens: u64,
    pub head_ms: u64,
}

/// What the answers running on a pair have streamed so far (completion mode): seconds and
/// tokens after each one's first chunk, summed over `streams` of them, and the streams the
/// node is decoding now (what they are paying for).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LiveDecode {
    pub secs: f64,
    pub tokens: f64,
    pub streams: u32,
    pub node_decoding: u32,
    /// When the first-sent of the pair's streamed requests that are stalled went out (ms):
    /// no first token yet, late by more than `STALL_LATE` times its predicted wait for it and
    /// by at least `STALL_MIN_MS` (`fleet::SeatEnds::read`). A node that hides its loads is then
    /// taken to be loading the model unseen (`routing::completion`).
    pub stalled_since_ms: Option<u64>,
    /// Beside a running stream of the pair sent before it (the model is in memory), a first
    /// token due at rates the pair measured that takes more than twice its predicted wait (and
    /// longer than a miss of its credited cache, and `OVERDUE_MIN_MS` late) waits for a seat
    /// inside the node: how many of the pair's requests were sent before the first such one
    /// (`fleet::SeatEnds::read`).
    /// A server queues in order, so no more than those hold seats.
    pub seated: Option<u32>,
}

/// Live load, read at decision time (atomics in the proxy, plain maps in tests).
pub trait Loads {
    /// Requests in flight on the node across all its models.
    fn node_in_flight(&self, node: usize) -> u32;
    fn model(&self, node: usize, model: &str) -> ModelLoad;
    /// Streams the node is decoding now (first token seen, not ended); by default every
    /// request in flight.
    fn node_decoding(&self, node: usize) -> u32 {
        self.node_in_flight(node)
    }
    /// Prompts sent to the node and not yet answered (its prefill queue).
    fn node_prefilling(&self, _node: usize) -> PrefillLoad {
        PrefillLoad::default()
    }
    /// Rates learned for node:model (completion mode); none known by default.
    fn rates(&self, _node: usize, _model: &str) -> Rates {
        Rates::default()
    }
    /// When this gateway began watching the fleet (ms; 0 by default: always): an untried
    /// node's wait for its turn counts from then, not from answers kept from before a restart.
    fn watching_since_ms(&self) -> u64 {
        0
    }
    /// A load of the model that no request is waiting for (pre-warm, restore) is in
    /// progress on the node: its memory is being taken.
    fn loading(&self, _node: usize, _model: &str) -> bool {
        false
    }
    /// Seconds from `now_ms` until each request running on node:model is predicted to end
    /// (completion mode records it when the request is sent; 0 for one past it), pushed to
    /// `out`; returns how fast their answers stream now (`None`: none has streamed enough to
    /// tell). Nothing known by default.
    fn seat_ends(
        &self,
        _node: usize,
        _model: &str,
        _now_ms: u64,
        _out: &mut Vec<f64>,
    ) -> Option<LiveDecode> {
        None
    }
}

/// What was learned about one node:model pair from its responses (`None`: not observed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Rates {
    /// Prompt tokens per second (TTFT of warm requests), and the TTFT no prompt explains.
    pub prefill_tps: Option<f64>,
    pub prefill_overhead_s: f64,
    /// `prefill_tps` is a floor: the prompts seen were all of about one length, and their TTFT
    /// cannot tell fixed overhead from rate, so all of it was taken as rate.
    pub prefill_floor: bool,
    /// The node prefills one prompt at a time (learned: the wait for the request sent before
    /// explains TTFTs), so a request waits for the prompts ahead; `None` until a response had
    /// one ahead (the fleet's majority is taken meanwhile).
    pub prefill_shared: Option<bool>,
    /// Seconds per output token of one stream, and what each further concurrent stream adds
    /// (`None` until responses at different concurrencies were seen).
    pub decode_spt: Option<f64>,
    pub decode_spt_per_stream: Option<f64>,
    /// Seconds a cold load of the model took on the node: observed at the end of an answer
    /// that waited for one, else read at its first token (`fleet::PairRates::came_in`).
    pub load_s: Option<f64>,
    /// On a node that hides its loads (`NodeView::hides_loads`): the seconds a request to the
    /// pair idle past the keep-alive waited for a load before its prefill (0: it found the
    /// model in memory); a decayed mean, so with spells minutes apart, mostly what the last
    /// one showed; `None` until such a request was answered.
    pub idle_load_s: Option<f64>,
    /// As `idle_load_s`, for a request sent after another model was (`ModelLoad::displaced`)
    /// and not idle past the keep-alive: how long the node takes to swap this model back in
    /// (0: the two stay in memory together). The pair's own only: what a swap costs depends on
    /// what the node's memory holds beside it.
    pub switch_load_s: Option<f64>,
    /// Seconds a request held its seat (dispatch to end).
    pub service_s: Option<f64>,
    /// Output tokens per response.
    pub output_tokens: Option<f64>,
    /// Of the answers to requests that set an output limit, the share that ran into it.
    pub capped_share: Option<f64>,
    /// Responses observed, and when the last one was (ms).
    pub observed: u32,
    pub last_ms: Option<u64>,
    /// When its first response was (ms).
    pub first_ms: Option<u64>,
    /// Seconds between responses (time-decayed mean; `None` before the second): with
    /// `last_ms`, how often the pair is asked for ([`Rates::demand_per_s`]).
    pub gap_s: Option<f64>,
}

impl Rates {
    /// Responses per second the pair serves lately: one per mean gap between its responses,
    /// fewer once the last is older than that gap (a model gone quiet). Before a second
    /// response there is no gap: at most one was served in the time the gateway has been
    /// watching (since `since_ms`).
    pub fn demand_per_s(&self, since_ms: u64, now_ms: u64) -> f64 {
        let watched_s = now_ms.saturating_sub(since_ms).max(1) as f64 / 1000.0;
        let (Some(gap), Some(last)) = (self.gap_s, self.last_ms) else {
            return 1.0 / watched_s;
        };
        let since_last_s = now_ms.saturating_sub(last) as f64 / 1000.0;
        1.0 / gap.max(since_last_s).max(0.001)
    }
}

/// Why a (node, model) pair cannot serve the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Offline,
    Draining,
    Paused,
    Warmup,
    BreakerOpen,
    Thermal,
    MemoryPressure,
    ModelAbsent,
    MemoryFit,
    Context,
    Capability,
    Protocol,
    NotWarm,
    ProvisionalCap,
    HardCap,
    Tried,
    PinnedElsewhere,
    CpuHigh,
    LowAvailability,
    Learning,
    /// The node answered "not here" (501/404/405) for this endpoint on this model lately.
    NotCapable,
}

impl Reason {
    /// Every reason, in declaration order (`reason as usize` indexes it).
    pub const ALL: [Reason; 21] = [
        Reason::Offline,
        Reason::Draining,
        Reason::Paused,
        Reason::Warmup,
        Reason::BreakerOpen,
        Reason::Thermal,
        Reason::MemoryPressure,
        Reason::ModelAbsent,
        Reason::MemoryFit,
        Reason::Context,
        Reason::Capability,
        Reason::Protocol,
        Reason::NotWarm,
        Reason::ProvisionalCap,
        Reason::HardCap,
        Reason::Tried,
        Reason::PinnedElsewhere,
        Reason::CpuHigh,
        Reason::LowAvailability,
        Reason::Learning,
        Reason::NotCapable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Offline => "offline",
            Reason::Draining => "draining",
            Reason::Paused => "paused",
            Reason::Warmup => "warmup",
            Reason::BreakerOpen => "breaker_open",
            Reason::Thermal => "thermal",
            Reason::MemoryPressure => "memory_pressure",
            Reason::ModelAbsent => "model_absent",
            Reason::MemoryFit => "memory_fit",
            Reason::Context => "context",
            Reason::Capability => "capability",
            Reason::Protocol => "protocol",
            Reason::NotWarm => "not_warm",
            Reason::ProvisionalCap => "provisional_cap",
            Reason::HardCap => "hard_cap",
            Reason::Tried => "tried",
            Reason::PinnedElsewhere => "pinned_elsewhere",
            Reason::CpuHigh => "cpu_high",
            Reason::LowAvailability => "low_availability",
            Reason::Learning => "learning",
            Reason::NotCapable => "not_capable",
        }
    }
}

/// Each signal's points for one surviving (node, model) pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Signals {
    pub warmth: f64,
    pub memory_fit: f64,
    pub queue_depth: f64,
    pub wait_time: f64,
    pub role_affinity: f64,
    pub availability: f64,
    pub context_fit: f64,
    pub session_affinity: f64,
    pub tier: f64,
    pub load: f64,
}

impl Signals {
    pub fn total(&self) -> f64 {
        self.warmth
            + self.memory_fit
            + self.queue_depth
            + self.wait_time
            + self.role_affinity
            + self.availability
            + self.context_fit
            + self.session_affinity
            + self.tier
            + self.load
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Eliminated {
        reason: Reason,
    },
    Scored {
        signals: Signals,
        total: f64,
    },
    /// Completion mode: the predicted finish and its terms (lower `total_s` wins).
    Predicted {
        #[serde(flatten)]
        prediction: super::completion::Prediction,
    },
}

/// One line of the explain table, by index so building it allocates nothing per row.
/// [`Decision::explain`] resolves the indices to names for display.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Index into `FleetView::nodes`.
    pub node: usize,
    /// Index into `RouteRequest::models`.
    pub model: usize,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// A [`Row`] with names, for `POST /fleet/explain` and `fleetgate explain`.
#[derive(Debug, Clone, Serialize)]
pub struct ExplainRow<'a> {
    pub node: &'a str,
    pub model: &'a str,
    #[serde(flatten)]
    pub verdict: &'a Verdict,
    /// With a `context` elimination: the largest window the node gives the model and the
    /// tokens the request needs there (prompt estimate + output + the node's overhead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextNeed>,
}

/// Why a window did not fit: what the node has and what the request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ContextNeed {
    pub window: u32,
    pub needed_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AffinityKind {
    None,
    /// The conversation's rendezvous node won.
    Matched,
    /// The rendezvous node was eligible but another node won (it was busy).
    Spilled,
    /// The rendezvous node could not serve (eliminated).
    New,
}

/// A place the request can go.
#[derive(Debug, Clone, Serialize)]
pub struct Choice {
    /// Index into `FleetView::nodes`.
    pub node: usize,
    pub node_id: String,
    pub model: String,
    pub score: f64,
    /// The model is not the primary one.
    pub fallback: bool,
    /// The model is not loaded on the node: serving it means a cold load.
    pub cold: bool,
    /// Completion mode: the predicted finish, seconds from now.
    pub predicted_s: Option<f64>,
    /// Completion mode: of that, the seconds from its send to its end (load, prefill and
    /// decode; not the wait for a seat): its seat's predicted end once sent (`Loads::seat_ends`).
    #[serde(skip)]
    pub predicted_run_s: Option<f64>,
    /// Completion mode: the seconds to its first token (its wait, load and prefill, without the
    /// exploring discount), counted from its send: when a streamed answer is stalled
    /// (`LiveDecode::stalled_since_ms`).
    #[serde(skip)]
    pub predicted_first_s: Option<f64>,
    /// Completion mode: of `predicted_first_s`, its prompt's prefill (a cold answer's first
    /// byte less it is what the load took, `fleet::PairRates::came_in`); from priors too.
    #[serde(skip)]
    pub predicted_prefill_s: Option<f64>,
    /// Completion mode: how much later its first token would come were the prefix it took as
    /// cached (`cached_tokens`) not, at its predicted prefill rate (0 with nothing cached).
    #[serde(skip)]
    pub predicted_miss_s: f64,
    /// Completion mode: `predicted_first_s` came from rates the pair measured
    /// (`Prediction::first_measured`). Only then is a late first token read as a wait for a
    /// seat inside the node (`LiveDecode::seated`): an estimate's is as often its error.
    #[serde(skip)]
    pub first_measured: bool,
    /// Completion mode: of `predicted_first_s` and `predicted_run_s`, the load it waits for
    /// (0 when loaded): what none is left of when it is sent after its model came in
    /// (`proxy::Dispatch::start_prefill`). `None` from priors, as `predicted_first_s`.
    #[serde(skip)]
    pub predicted_load_s: Option<f64>,
    /// Completion mode, predicted from priors only (no end recorded for its seat): the
    /// answer's length it was priced at, which the pace it streams at turns into an end
    /// (`fleet::SeatEnds::read`).
    #[serde(skip)]
    pub predicted_output_tokens: Option<f64>,
    /// Completion mode: the prompt tokens its prediction took as cached on the node (a
    /// conversation's prefix, a shared system prompt; 0 otherwise).
    pub cached_tokens: u32,
    /// Completion mode, a warm pair sent at once to a node whose seats were all taken: what
    /// its answer tests about the node's seats (`fleet::sharing`).
    #[serde(skip)]
    pub seat_test: Option<SeatTest>,
    /// Completion mode, sent to a pair idle past the keep-alive on a node that hides its
    /// loads: what tells from its answer whether the node loaded the model first.
    #[serde(skip)]
    pub idle: Option<IdleExpect>,
}

impl Choice {
    /// Completion mode: the seconds it was predicted to wait for a seat (its finish less its
    /// run); None from priors or in other modes.
    pub fn predicted_wait_s(&self) -> Option<f64> {
        self.predicted_s
            .zip(self.predicted_run_s)
            .map(|(total, run)| total - run)
    }
}

/// What a request to an idle pair on a node that hides its loads was predicted to take
/// without a load. Its answer shows a load when its first token came much later than its
/// prefill explains, more than the node's decode was slower than predicted (a node slower
/// all round is slow, not loading), and by at least `MIN_LOAD_S`: a load is seconds, many
/// prefills long; a slow node is a few times slower at both.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdleExpect {
    /// Seconds from its send to its first token (its wait and prefill, no load), and per
    /// output token.
    pub first_s: f64,
    pub spt: f64,
    /// Nothing measured stood behind the prediction (the config's priors: without model
    /// sizes they can be off by a hundred times): the prefill is then judged from the answer's
    /// own decode speed and the prefill-to-decode ratio the fleet measured.
    pub guessed: bool,
    /// Prompt tokens it was to prefill (uncached).
    pub prompt_tokens: u32,
    /// Placed to join a load under way (a request sent to the idle pair has had no first
    /// byte yet), not to start one.
    pub joined: bool,
    /// The spell is a swap (`ModelLoad::displaced`), not an idle past the keep-alive: its load
    /// is learned as `Rates::switch_load_s`.
    pub switch: bool,
    /// The spell was seen, not foreseen: a request sent to the pair at this ms is stalled
    /// (`LiveDecode::stalled_since_ms`); the spell is taken to have begun then.
    pub stalled_since_ms: Option<u64>,
    /// The load it may wait for (`Rates::idle_load_s`, else the model's other pairs'; after a
    /// swap or a stall `Rates::switch_load_s`, the pair's own; whole,
    /// also for a request that joins one under way and is charged only what is left); `None`
    /// when nothing was known of the node's loads: then it has no first-byte timeout (a load
    /// of any length may come first), else the timeout allows for this much more.
    pub load_s: Option<f64>,
}

impl IdleExpect {
    /// How many times the predicted prefill (scaled by how much slower the node decoded than
    /// predicted) the first token must be late by to read as a load.
    const LATE: f64 = 4.0;
    /// Shorter is not a load worth pricing, and after an idle spell a new connection (its
    /// pooled one long closed) and the node's own warm-up come first.
    pub const MIN_LOAD_S: f64 = 0.25;

    /// Seconds the answer waited for a load (0: none shown; `None`: it cannot tell, e.g. a
    /// whole reply predicted from priors). Streamed: its first token against the predicted
    /// prefill; whole: its end against prefill and decode. `ratio`: prompt tokens/s per output
    /// token/s and the TTFT no prompt explains, as the fleet measured them (for a guessed
    /// prediction).
    pub fn load_seen(
        &self,
        ttft_s: Option<f64>,
        service_s: f64,
        output_tokens: Option<u32>,
        ratio: (f64, f64),
    ) -> Option<f64> {
        let out = output_tokens.map_or(0.0, f64::from);
        let spt_seen = match ttft_s {
            Some(first) if out >= 2.0 => Some((service_s - first) / out),
            _ => None,
        };
        // A guess is replaced by what the answer's own decode speed says its prefill took.
        let (first_s, spt) = match (self.guessed, spt_seen) {
            (true, Some(spt)) if ratio.0 > 0.0 && spt > 0.0 => (
                ratio.1.max(0.0) + f64::from(self.prompt_tokens) * spt / ratio.0,
                spt,
            ),
            (true, _) => return None,
            _ => (self.first_s, self.spt),
        };
        let (late, expected) = match ttft_s {
            Some(first) => {
                let slower = match spt_seen {
                    Some(seen) if spt > 0.0 => (seen / spt).max(1.0),
                    _ => 1.0,
                };
                (first - first_s, first_s * slower)
            }
            None => {
                let expected = first_s + out * spt;
                (service_s - expected, expected)
            }
        };
        if !(late.is_finite() && expected.is_finite()) {
            return None;
        }
        let threshold = (Self::LATE * expected.max(0.0)).max(Self::MIN_LOAD_S);
        Some(if late > threshold { late } else { 0.0 })
    }
}

/// What a request sent to a full node predicted, to be held against its answer: with seats
/// the node's models share it waits `shared_wait_s` inside the node, with each model's own it
/// starts at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeatTest {
    /// Seconds from its send to its first token, and then to its end, without that wait.
    pub first_s: f64,
    pub decode_s: f64,
    pub shared_wait_s: f64,
    /// Of a node whose seats nobody said: `shared_wait_s` is the wait were its seats only the
    /// `seats` it was seen to run at once (`NodeView::seats_seen`).
    pub bound: bool,
    /// And of the model's own seats, not the node's (`ModelView::seats_seen`): the model was
    /// seen to decode `seats` at once and has as many on the node now, which serves several.
    pub own: bool,
    pub seats: u32,
}

/// Why nothing was chosen; maps to the client-visible error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NoRoute {
    /// No node knows any candidate model (404 model_not_found).
    ModelNotFound,
    /// Nodes have the model but no window fits the request (400 context_length_exceeded).
    ContextTooLong,
    /// The pinned node cannot serve now (503, strict pin).
    PinUnavailable,
    /// Nodes exist but none can take it now (holding queue, then 503).
    NoProvider,
}

/// The outcome of `routing::decide`.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    /// Best first; empty when nothing survives. `ranked[0]` is the winner.
    pub ranked: Vec<Choice>,
    pub no_route: Option<NoRoute>,
    pub affinity: AffinityKind,
    /// Per node and candidate model: the elimination reason or the signal points.
    pub table: Vec<Row>,
}

impl Decision {
    pub fn winner(&self) -> Option<&Choice> {
        self.ranked.first()
    }

    /// The explain table with node and model names; `req` and `fleet` must be the ones this
    /// decision was made from (rows whose indices do not resolve are skipped).
    pub fn explain<'a>(
        &'a self,
        req: &'a RouteRequest,
        fleet: &'a FleetView,
    ) -> Vec<ExplainRow<'a>> {
        self.table
            .iter()
            .filter_map(|row| {
                let node = fleet.nodes.get(row.node)?;
                let model = req.models.get(row.model)?.as_str();
                let context = match row.verdict {
                    Verdict::Eliminated {
                        reason: Reason::Context,
                    } => node.model(model).map(|m| ContextNeed {
                        window: m.max_context,
                        needed_tokens: super::eliminate::needed_tokens(req, node),
                    }),
                    _ => None,
                };
                Some(ExplainRow {
                    node: node.id.as_str(),
                    model,
                    verdict: &row.verdict,
                    context,
                })
            })
            .collect()
    }
}
