//! First measurement (completion mode): a model a node holds in memory that no answer has
//! measured yet is asked once, as soon as the gateway sees it, for a short answer (a
//! ~400-token prompt, 16 tokens out, streamed), and when that prompt was read within half a
//! second once more with a ~1,600-token one, so routing starts from the node's own decode and
//! prefill rates (one prompt length only gives a floor for the prefill, its TTFT's fixed part
//! taken as rate: a slow node's first answer is rate enough). Without it the
//! first requests of a fresh gateway go to nodes priced as a typical node of the model: at a
//! home lab's pace that sent the first small-model requests to laptops 4x slower than the idle
//! workstation (14-16 s each instead of ~2.5 s).
//!
//! What is asked: on Ollama, the models `/api/ps` lists (with the window it reports as
//! `num_ctx`: a request at another window reloads the model); on vLLM, every model it serves;
//! on llama.cpp, its model when it lists one and is awake (a router that lists several loads
//! them on demand: asking would load each). On `backend: openai` (SGLang, LM Studio, any
//! OpenAI-compatible server), one model per node, after a first ask whose answer is not
//! learned from: such a node hides its loads (a sleeping server wakes, LM Studio loads on
//! demand), so a first answer's time could be a load nobody reports, taken for the model's
//! prefill. Of several listed (each could be loaded in turn), only the one most other nodes
//! hold in memory (of equals the smallest, by its size or the parameters its name states,
//! then by name; none if no other holds any), until any of the node's models answered
//! (`to_pace`): its pace against the fleet prices the others. The prompt starts with a nonce,
//! so no prefix cache answers it from an earlier run.
//!
//! When: one model at a time per node, nodes in parallel, every `health.poll_interval`; only
//! while the node is idle (no request of this gateway's on it, none its backend says it runs
//! or holds) and online as routing sees it (not paused or draining), on a seat of the pair
//! taken like a request's (routing counts it, an eviction leaves the model alone meanwhile).
//! A node busy from the start is measured by its clients' answers instead. Asked once per
//! gateway process: again after a connection error or a 5xx (at most `MAX_TRIES`), not after
//! a 4xx (a model that does not chat) nor once an answer was observed (rates kept in the
//! state dir survive a restart). Like any client request that names none, it leaves the
//! model's keep-alive at the backend's default.
//!
//! The answer feeds the pair's prefill and decode lines only
//! (`fleet::Observation::measurement`): not its service time, output length or demand. A
//! reply that shows a model load (Ollama `load_duration` past a second) teaches nothing.
//! `routing.policy.completion_measure: false` turns it off; spec 000's mode never asks. Counted
//! in `fleetgate_routing_measurements_total{node,model,outcome}`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::config::Backend;
use crate::fleet::{Fleet, LiveModel, Observation};
use crate::proxy::observe::StreamObserver;
use crate::routing::{Health, Mode};

/// Tokens asked for: enough to time the decode, few enough to cost a slow laptop ~0.2 s.
pub const OUTPUT_TOKENS: u32 = 16;
/// Chunks read at most (a node that ignores the limit is hung up on past them).
const MAX_CHUNKS: u32 = 4 * OUTPUT_TOKENS;
/// Sentences in the prompt: ~400 tokens (~16 a sentence; the sim counts 490), past the 256 from which a prefill rate is fitted.
const SENTENCES: usize = 24;
/// The second prompt (~1,600 tokens), asked when the first was read within
/// `LONG_IF_TTFT_S` (a floor, `fleet::FLOOR_TTFT_S`): on such a node it costs at most
/// ~4x that. Read slower, the first prompt's TTFT is the rate.
const LONG_SENTENCES: usize = 4 * SENTENCES;
const LONG_IF_TTFT_S: f64 = crate::fleet::FLOOR_TTFT_S;
const SENTENCE: &str =
    "The gateway measures how quickly this node reads a prompt and writes an answer. ";
/// Longest wait for the answer (a CPU box prefills ~400 tokens in a few seconds).
const TIMEOUT: Duration = Duration::from_secs(120);
/// A reply that waited this long for a load measured the load, not the model.
const LOAD_LIMIT_S: f64 = 1.0;
/// `fleetgate_routing_measurements_total`'s outcomes: rates learned, no answer (an error, a
/// model that does not chat), an answer that waited for a load (nothing learned).
pub const OUTCOMES: [&str; 3] = ["learned", "failed", "load"];

fn count(node: &str, model: &str, outcome: &str) {
    crate::metrics::METRICS
        .measurements
        .with_label_values(&[node, model, outcome])
        .inc();
}

pub struct Measure {
    fleet: Arc<Fleet>,
    client: reqwest::Client,
}

/// Tries of one model's first measurement: a node down or overloaded at start is asked again
/// on later passes, at most this often.
pub const MAX_TRIES: u32 = 3;

/// How one try went.
enum Tried {
    /// Rates learned, or an answer that waited for a load (nothing learned, not asked again).
    Done,
    /// The node is busy (clients' requests, or the backend says it runs some), the model is
    /// no longer loaded, or the node is not online: not a try; the next pass looks again.
    NotNow,
    /// No answer: a connection error or a 5xx may pass (asked again up to `MAX_TRIES`).
    Failed,
    /// Refused (4xx: a model that does not chat): asking again would not change it.
    Refused,
}

impl Measure {
    pub fn new(fleet: Arc<Fleet>) -> Measure {
        let client = super::node_api::client(TIMEOUT);
        Measure { fleet, client }
    }

    /// Start a pass on every node that has models to measure and none under way; returns
    /// how many started.
    pub fn cycle(&self) -> usize {
        let policy = &self.fleet.config().routing.policy;
        if policy.mode != Mode::Completion || !policy.completion_measure {
            return 0;
        }
        let mut started = 0;
        for idx in 0..self.fleet.len() {
            let node = self.fleet.node(idx);
            // Read apart from the rates (no lock held while another is taken).
            let (models, measured) = {
                let live = node.live.lock();
                if live.measuring || !live.polled {
                    continue;
                }
                (live.models.clone(), live.measured.clone())
            };
            // Not online (yet): nothing asked, and no pass made.
            if !online(&self.fleet, idx) {
                continue;
            }
            // Not yet decidable (the fleet not all polled): no pass made.
            let Some(todo) = pending(&self.fleet, idx, &models, &measured) else {
                continue;
            };
            {
                let mut live = node.live.lock();
                if live.measuring {
                    continue;
                }
                if todo.is_empty() {
                    live.measure_passed = true;
                    continue;
                }
                live.measuring = true;
            }
            started += 1;
            let (fleet, client) = (self.fleet.clone(), self.client.clone());
            tokio::spawn(async move {
                let mut passed = true;
                for model in &todo {
                    let tried = measure(&fleet, &client, idx, model).await;
                    passed &= !matches!(tried, Tried::NotNow);
                    let node = fleet.node(idx);
                    let mut live = node.live.lock();
                    let tries = live.measured.entry(model.clone()).or_insert(0);
                    *tries = match tried {
                        Tried::Done | Tried::Refused => MAX_TRIES,
                        Tried::Failed => *tries + 1,
                        Tried::NotNow => *tries,
                    };
                }
                let node = fleet.node(idx);
                let mut live = node.live.lock();
                live.measuring = false;
                live.measure_passed |= passed;
            });
        }
        started
    }
}

/// Node `idx` is online as routing sees it (not paused, draining, offline or warming up).
fn online(fleet: &Fleet, idx: usize) -> bool {
    fleet
        .view()
        .nodes
        .get(idx)
        .is_some_and(|n| n.health == Health::Online)
}

/// The models of node `idx` to measure now (see the module doc); None: not yet decidable.
fn pending(
    fleet: &Fleet,
    idx: usize,
    models: &[LiveModel],
    measured: &BTreeMap<String, u32>,
) -> Option<Vec<String>> {
    let node = fleet.node(idx);
    let untried = |m: &&str| {
        measured.get(*m).is_none_or(|t| *t < MAX_TRIES)
            && node
                .peek(m)
                .is_none_or(|c| c.rates.lock().rates().observed == 0)
    };
    let loaded = models.iter().filter(|m| m.loaded).map(|m| m.name.as_str());
    let resident: Vec<&str> = match fleet.node_config(idx).backend {
        Backend::Ollama | Backend::Sim | Backend::Vllm => loaded.collect(),
        // One model, after a first ask that wakes it (`measure`); several may be loaded on
        // demand, and asking would load each in turn: one of them gives the node's pace.
        Backend::Llamacpp | Backend::Openai if models.len() == 1 => loaded.collect(),
        // A llama.cpp router's first answer is not a wake asked apart: nothing.
        Backend::Llamacpp => Vec::new(),
        Backend::Openai => to_pace(fleet, idx, models, untried)?.into_iter().collect(),
    };
    Some(
        resident
            .into_iter()
            .filter(untried)
            .map(str::to_string)
            .collect(),
    )
}

/// Of a node that lists several models and may load each on demand, the one to measure: none
/// once any of its models answered (its pace against the fleet is known,
/// `routing::completion::NodePace`), else, of those not yet tried out (`untried`), the one the
/// most other nodes hold in memory (the pace is read on models others answer too), of equals
/// the smallest (`routing::rank_size`: such a node reports no sizes, so mostly what the name
/// states; one of unknown size last), then by name, never an embedding model; none that
/// another holds, none (no pace to read). Its first ask may load it:
/// one load, at start, instead of every model's first requests there priced as a typical
/// node's (on a 32-node fleet the fast boxes' small model was priced as the slow boxes' until
/// tried). None (outer): not yet decidable, an online node not yet polled.
fn to_pace<'a>(
    fleet: &Fleet,
    idx: usize,
    models: &'a [LiveModel],
    untried: impl Fn(&&str) -> bool,
) -> Option<Option<&'a str>> {
    let node = fleet.node(idx);
    let answered = models.iter().any(|m| {
        node.peek(&m.name)
            .is_some_and(|c| c.rates.lock().rates().observed > 0)
    });
    if answered {
        return Some(None);
    }
    // Per model of this node, how many other nodes hold it.
    let mut holding = vec![0usize; models.len()];
    for i in (0..fleet.len()).filter(|i| *i != idx) {
        let other = fleet.node(i);
        let live = other.live.lock();
        if !live.polled {
            drop(live);
            if online(fleet, i) {
                return None;
            }
            continue;
        }
        for (k, m) in models.iter().enumerate() {
            holding[k] += usize::from(live.models.iter().any(|o| o.loaded && o.name == m.name));
        }
    }
    // The most held; of equals the smallest (a load, if it takes one, that is quickest and
    // leaves the most room: every model such a node lists looks loaded), one of unknown size
    // last, then by name. Never an embedding model (it does not chat).
    let size = |m: &LiveModel| match crate::routing::rank_size(&m.name, m.size_gb) {
        s if s > 0.0 => s,
        _ => f64::INFINITY,
    };
    let best = models
        .iter()
        .zip(holding)
        .filter(|(m, _)| {
            m.loaded && !crate::routing::embedding_name(&m.name) && untried(&m.name.as_str())
        })
        .min_by(|(a, n), (b, k)| {
            k.cmp(n)
                .then(size(a).total_cmp(&size(b)))
                .then(a.name.cmp(&b.name))
        });
    Some(best.filter(|(_, n)| *n > 0).map(|(m, _)| m.name.as_str()))
}

/// The request body for `model`, in the node's native protocol. On Ollama the window the
/// model is loaded with goes along (`num_ctx`): a request without it is served at the default
/// window, which reloads a model a client loaded larger.
fn body(
    backend: Backend,
    model: &str,
    window: Option<u32>,
    sentences: usize,
) -> (&'static str, serde_json::Value) {
    let nonce = format!("[{} {}] ", crate::services::now_ms(), std::process::id());
    let prompt = nonce + &SENTENCE.repeat(sentences);
    let messages = serde_json::json!([{"role": "user", "content": prompt}]);
    match backend {
        Backend::Ollama | Backend::Sim => {
            let mut options = serde_json::json!({"num_predict": OUTPUT_TOKENS, "temperature": 0});
            if let Some(w) = window {
                options["num_ctx"] = w.into();
            }
            (
                "/api/chat",
                serde_json::json!({
                    "model": model,
                    "messages": messages,
                    "stream": true,
                    "options": options,
                }),
            )
        }
        Backend::Vllm | Backend::Llamacpp | Backend::Openai => (
            "/v1/chat/completions",
            serde_json::json!({
                "model": model,
                "messages": messages,
                "stream": true,
                "stream_options": {"include_usage": true},
                "max_tokens": OUTPUT_TOKENS,
                "temperature": 0,
            }),
        ),
    }
}

/// Ask node `idx` for one short answer from `model` and feed what it took to the pair's
/// rates. Only on an idle node (no client request of this gateway's, none the backend says it
/// runs or holds) with the model still loaded, and on a seat of the pair's own: routing counts
/// it taken, and an eviction does not take the model from under it.
async fn measure(fleet: &Fleet, client: &reqwest::Client, idx: usize, model: &str) -> Tried {
    let node = fleet.node(idx);
    let window = {
        let live = node.live.lock();
        let Some(m) = live.models.iter().find(|m| m.name == model && m.loaded) else {
            return Tried::NotNow;
        };
        let busy = live
            .models
            .iter()
            .any(|m| m.running.unwrap_or(0) + m.waiting.unwrap_or(0) > 0);
        if busy {
            return Tried::NotNow;
        }
        m.context
    };
    if !online(fleet, idx) || node.in_flight.load(std::sync::atomic::Ordering::Relaxed) > 0 {
        return Tried::NotNow;
    }
    let Some(seat) = crate::queue::try_take(idx, &node, &node.counters(model)) else {
        return Tried::NotNow;
    };
    // Sent like a request: on a node that holds one model at a time, the model clients were
    // sent reads as displaced (`fleet::ModelLoad::displaced`) if this ask swaps it out.
    seat.sent();
    // A node that hides its loads is woken first: what that answer took may be a load.
    if matches!(fleet.node_config(idx).backend, Backend::Openai) {
        if let Err(tried) = ask(fleet, client, idx, model, window, SENTENCES, false).await {
            return tried;
        }
    }
    // A second, longer prompt when the first was read fast: one prompt length only gives a
    // floor for the prefill rate (its TTFT's fixed part taken as rate), two give the line.
    let ttft = match ask(fleet, client, idx, model, window, SENTENCES, true).await {
        Ok(ttft) => ttft,
        Err(tried) => return tried,
    };
    if ttft.is_some_and(|t| t <= LONG_IF_TTFT_S) {
        // Whatever the second answer says, the first one taught the rates.
        let _ = ask(fleet, client, idx, model, window, LONG_SENTENCES, true).await;
    }
    drop(seat);
    fleet.publish();
    Tried::Done
}

/// Send one measuring request (`sentences` long) and, when `learn`, feed what it took to the
/// pair's rates: its time to first token (streamed), seconds; else how the try ends (`Done`:
/// it waited for a load, nothing learned).
async fn ask(
    fleet: &Fleet,
    client: &reqwest::Client,
    idx: usize,
    model: &str,
    window: Option<u32>,
    sentences: usize,
    learn: bool,
) -> Result<Option<f64>, Tried> {
    let cfg = fleet.node_config(idx);
    let (path, body) = body(cfg.backend, model, window, sentences);
    let url = format!("http://{}{path}", cfg.addr);
    let started = Instant::now();
    let answer = async {
        let mut resp = client
            .post(&url)
            .json(&body)
            .send()
            .await
            .map_err(|e| (format!("POST {url}: {e}"), false))?;
        let status = resp.status();
        if !status.is_success() {
            return Err((
                format!("POST {url}: status {status}"),
                status.is_client_error(),
            ));
        }
        let mut observer = StreamObserver::default();
        let mut first_byte = None;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| (format!("POST {url}: {e}"), false))?
        {
            first_byte.get_or_insert_with(Instant::now);
            observer.feed(&chunk);
            // A node that ignores the token limit is not left generating for the gateway:
            // enough was seen to time the decode, and dropping the reply hangs up.
            if observer.chunks() > MAX_CHUNKS {
                break;
            }
        }
        Ok((first_byte, observer.finish()))
    };
    let (first_byte, observed) = match answer.await {
        Ok(a) => a,
        Err((e, refused)) => {
            log::info!("node {}: no first measurement of {model}: {e}", cfg.id);
            count(&cfg.id, model, "failed");
            return Err(if refused {
                Tried::Refused
            } else {
                Tried::Failed
            });
        }
    };
    let end = Instant::now();
    if !learn {
        log::debug!(
            "node {}: woke {model} in {:.2} s before measuring it",
            cfg.id,
            end.duration_since(started).as_secs_f64()
        );
        return Ok(None);
    }
    let secs = crate::proxy::observe::secs;
    let load_s = secs(observed.load_duration_ns);
    if let Some(l) = load_s.filter(|l| *l > LOAD_LIMIT_S) {
        log::info!(
            "node {}: the first measurement of {model} waited {l:.1} s for a load; nothing learned",
            cfg.id
        );
        count(&cfg.id, model, "load");
        return Err(Tried::Done);
    }
    let (prior_prefill_tps, prior_spt) = fleet.rate_priors(idx, model);
    let prompt_tokens = observed
        .prompt_tokens
        .map_or(0, |p| p.saturating_sub(observed.cached_tokens.unwrap_or(0)));
    let o = Observation {
        now_ms: crate::services::now_ms(),
        cold: false,
        service_s: end.duration_since(started).as_secs_f64(),
        ttft_s: first_byte
            .filter(|_| observed.chunks >= 2)
            .map(|fb| fb.duration_since(started).as_secs_f64()),
        prompt_tokens,
        prefill_ahead_s: None,
        output_tokens: observed.output_tokens(),
        max_output_tokens: Some(OUTPUT_TOKENS),
        prompt_eval_s: secs(observed.prompt_eval_duration_ns),
        eval_s: secs(observed.eval_duration_ns),
        load_s,
        load_under_way_s: 0.0,
        idle_load_s: None,
        switch: false,
        concurrency: 1,
        decode_streams: None,
        prior_prefill_tps,
        prior_spt,
        measurement: true,
        seat_unsure: false,
    };
    let rates = {
        let counters = fleet.node(idx).counters(model);
        let mut r = counters.rates.lock();
        r.observe(&o);
        r.rates()
    };
    log::info!(
        "node {}: first measurement of {model}: {} prompt tokens, {} out in {:.2} s (prefill {}{}, decode {})",
        cfg.id,
        prompt_tokens,
        o.output_tokens.unwrap_or(0),
        o.service_s,
        rates
            .prefill_tps
            .map_or("unknown".to_string(), |t| format!("{t:.0} tokens/s")),
        if rates.prefill_floor { " at least" } else { "" },
        rates
            .decode_spt
            .map_or("unknown".to_string(), |s| format!("{:.1} tokens/s", 1.0 / s)),
    );
    count(&cfg.id, model, "learned");
    Ok(o.ttft_s)
}

#[async_trait]
impl BackgroundService for Measure {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.fleet.config().health.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {
                    self.cycle();
                }
            }
        }
    }
}
