//! First measurement (completion mode): a model a node holds in memory that no answer has
//! measured yet is asked once, as soon as the gateway sees it, for a short answer (a
//! ~300-token prompt, 16 tokens out, streamed), so routing starts from the node's own prefill
//! and decode rates. Without it the first requests of a fresh gateway go to nodes priced as a
//! typical node of the model: at a home lab's pace that sent the first small-model requests to
//! laptops 4x slower than the idle workstation (14-16 s each instead of ~2.5 s).
//!
//! What is asked: on Ollama, the models `/api/ps` lists; on vLLM, every model it serves; on
//! llama.cpp, its model when it lists one and is awake (a router that lists several loads them
//! on demand: asking would load each). Not on `backend: openai`: such a node hides its loads
//! (LM Studio loads on demand, a sleeping server wakes), so the answer's time could be a load
//! nobody reports, taken for the model's prefill.
//! The prompt starts with a nonce, so no prefix cache answers it from an earlier run. One
//! model at a time per node, nodes in parallel; each model is asked once per gateway process
//! (answered or not), and not at all once an answer was observed (rates kept in the state dir
//! survive a restart). The answer feeds the pair's prefill and decode lines only
//! (`fleet::Observation::measurement`): not its service time, output length or demand. A
//! reply that shows a model load (Ollama `load_duration` past a second) teaches nothing.
//! `routing.policy.completion_measure: false` turns it off; spec 000's mode never asks. Counted
//! in `fleetgate_routing_measurements_total{node,model,outcome}`.

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
/// Sentences in the prompt: ~300 tokens, past the 256 from which a prefill rate is fitted.
const SENTENCES: usize = 24;
const SENTENCE: &str =
    "The gateway measures how quickly this node reads a prompt and writes an answer. ";
/// Longest wait for the answer (a CPU box prefills ~300 tokens in a few seconds).
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

impl Measure {
    pub fn new(fleet: Arc<Fleet>) -> Measure {
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .build()
            .unwrap_or_default();
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
            let (models, health, measured) = {
                let live = node.live.lock();
                if live.measuring || !live.polled {
                    continue;
                }
                (live.models.clone(), live.health, live.measured.clone())
            };
            let todo = match health {
                Health::Online => pending(&self.fleet, idx, &models, &measured),
                _ => Vec::new(),
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
                live.measured.extend(todo.iter().cloned());
            }
            started += 1;
            let (fleet, client) = (self.fleet.clone(), self.client.clone());
            tokio::spawn(async move {
                for model in &todo {
                    measure(&fleet, &client, idx, model).await;
                }
                let node = fleet.node(idx);
                let mut live = node.live.lock();
                live.measuring = false;
                live.measure_passed = true;
            });
        }
        started
    }
}

/// The models of node `idx` to measure now (see the module doc).
fn pending(fleet: &Fleet, idx: usize, models: &[LiveModel], measured: &[String]) -> Vec<String> {
    let loaded = models.iter().filter(|m| m.loaded).map(|m| m.name.as_str());
    let resident: Vec<&str> = match fleet.node_config(idx).backend {
        Backend::Ollama | Backend::Sim | Backend::Vllm => loaded.collect(),
        Backend::Llamacpp if models.len() == 1 => loaded.collect(),
        // Several models may be loaded on demand; `backend: openai` hides its loads (a
        // sleeping server's wake would be taken for its prefill).
        Backend::Llamacpp | Backend::Openai => Vec::new(),
    };
    let node = fleet.node(idx);
    resident
        .into_iter()
        .filter(|m| !measured.iter().any(|x| x == m))
        .filter(|m| {
            node.peek(m)
                .is_none_or(|c| c.rates.lock().rates().observed == 0)
        })
        .map(str::to_string)
        .collect()
}

/// The request body for `model`, in the node's native protocol.
fn body(backend: Backend, model: &str) -> (&'static str, serde_json::Value) {
    let nonce = format!("[{} {}] ", crate::services::now_ms(), std::process::id());
    let prompt = nonce + &SENTENCE.repeat(SENTENCES);
    let messages = serde_json::json!([{"role": "user", "content": prompt}]);
    match backend {
        Backend::Ollama | Backend::Sim => (
            "/api/chat",
            serde_json::json!({
                "model": model,
                "messages": messages,
                "stream": true,
                "options": {"num_predict": OUTPUT_TOKENS, "temperature": 0},
            }),
        ),
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

/// Ask node `idx` for one short answer from `model` and feed what it took to the pair's rates.
async fn measure(fleet: &Fleet, client: &reqwest::Client, idx: usize, model: &str) {
    let cfg = fleet.node_config(idx);
    let (path, body) = body(cfg.backend, model);
    let url = format!("http://{}{path}", cfg.addr);
    let node = fleet.node(idx);
    let in_flight = node.in_flight.load(std::sync::atomic::Ordering::Relaxed);
    let started = Instant::now();
    let answer = async {
        let mut resp = client
            .post(&url)
            .json(&body)
            .send()
            .await
            .map_err(|e| format!("POST {url}: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("POST {url}: status {}", resp.status()));
        }
        let mut observer = StreamObserver::default();
        let mut first_byte = None;
        while let Some(chunk) = resp.chunk().await.map_err(|e| format!("POST {url}: {e}"))? {
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
        Err(e) => {
            log::info!("node {}: no first measurement of {model}: {e}", cfg.id);
            count(&cfg.id, model, "failed");
            return;
        }
    };
    let end = Instant::now();
    let secs = |ns: Option<u64>| ns.filter(|n| *n > 0).map(|n| n as f64 / 1e9);
    let load_s = secs(observed.load_duration_ns);
    if load_s.is_some_and(|l| l > LOAD_LIMIT_S) {
        log::info!(
            "node {}: the first measurement of {model} waited {:.1} s for a load; nothing learned",
            cfg.id,
            load_s.unwrap_or(0.0)
        );
        count(&cfg.id, model, "load");
        return;
    }
    let view = fleet.view();
    let (prior_prefill_tps, prior_spt) = view
        .nodes
        .get(idx)
        .and_then(|n| Some((n, n.model(model)?)))
        .map_or((0.0, 0.0), |(n, m)| {
            crate::routing::priors(&fleet.config().routing.policy, n, m)
        });
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
        prompt_eval_s: secs(observed.prompt_eval_duration_ns),
        eval_s: secs(observed.eval_duration_ns),
        load_s,
        load_under_way_s: 0.0,
        idle_load_s: None,
        concurrency: in_flight.saturating_add(1),
        decode_streams: None,
        prior_prefill_tps,
        prior_spt,
        measurement: true,
    };
    let rates = {
        let counters = node.counters(model);
        let mut r = counters.rates.lock();
        r.observe(&o);
        r.rates()
    };
    log::info!(
        "node {}: first measurement of {model}: {} prompt tokens, {} out in {:.2} s (prefill {}, decode {})",
        cfg.id,
        prompt_tokens,
        o.output_tokens.unwrap_or(0),
        o.service_s,
        rates
            .prefill_tps
            .map_or("unknown".to_string(), |t| format!("{t:.0} tokens/s")),
        rates
            .decode_spt
            .map_or("unknown".to_string(), |s| format!("{:.1} tokens/s", 1.0 / s)),
    );
    count(&cfg.id, model, "learned");
    fleet.publish();
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
