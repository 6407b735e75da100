//! One run: fresh simulated nodes, one placement policy (fleetgate in a mode, or a
//! client-side baseline), the seeded trace replayed open-loop as Ollama `/api/chat` streams
//! (or, with `FLEETGATE_BENCH_CLIENT`, OpenAI chat completions streamed or whole); what each
//! request saw and what each node counted.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetgate::sim::{SimHandle, SimStats};
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::runtime::Runtime;

use super::oracle::{Oracle, Want};
use super::scenario::{gateway_yaml, Mode, Node, Scenario};
use super::trace::{text, Trace};
use crate::common;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// fleetgate; `false`: this build has no `routing.mode`, its default runs.
    Fleetgate(Mode, bool),
    /// The client routes straight to the nodes (no gateway hop).
    RoundRobin,
    LeastBusy,
    /// A client-side router that knows the sims' true physics (`oracle.rs`).
    Oracle,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Fleetgate(Mode::Completion, _) => "completion",
            Policy::Fleetgate(Mode::Spec, _) => "spec-000",
            Policy::Fleetgate(Mode::RoundRobin, _) => "round-robin",
            Policy::Fleetgate(Mode::LeastBusy, _) => "least-busy",
            Policy::RoundRobin => "rr-direct",
            Policy::LeastBusy => "lb-direct",
            Policy::Oracle => "ct-oracle",
        }
    }
}

/// How the trace's requests are sent (`FLEETGATE_BENCH_CLIENT`): the wire protocol, and
/// whether the reply is streamed. Ollama's final object carries the node's own timings
/// (`prompt_eval_duration`, `eval_duration`, `load_duration`); an OpenAI reply carries token
/// counts only, so the gateway learns from what it times itself; a whole (non-streamed)
/// reply gives it not even the first token's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// `/api/chat`, `stream: true` (the default).
    OllamaStream,
    /// `/v1/chat/completions`, `stream: true` with `stream_options.include_usage`.
    OpenAiStream,
    /// `/v1/chat/completions`, `stream: false`.
    OpenAiWhole,
}

impl Client {
    /// From `FLEETGATE_BENCH_CLIENT`: `ollama` (default), `openai`, `openai-whole`.
    pub fn from_env() -> Result<Client, String> {
        match std::env::var("FLEETGATE_BENCH_CLIENT").as_deref() {
            Err(_) | Ok("") | Ok("ollama") => Ok(Client::OllamaStream),
            Ok("openai") => Ok(Client::OpenAiStream),
            Ok("openai-whole") => Ok(Client::OpenAiWhole),
            Ok(other) => Err(format!(
                "FLEETGATE_BENCH_CLIENT={other}: expected ollama, openai or openai-whole"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Client::OllamaStream => "Ollama /api/chat, streamed",
            Client::OpenAiStream => "OpenAI /v1/chat/completions, streamed",
            Client::OpenAiWhole => "OpenAI /v1/chat/completions, whole replies",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Client::OllamaStream => "/api/chat",
            _ => "/v1/chat/completions",
        }
    }

    fn body(self, model: &str, messages: &[Value], output: u32) -> Value {
        match self {
            Client::OllamaStream => json!({"model": model, "messages": messages, "stream": true,
                "options": {"num_predict": output}}),
            Client::OpenAiStream => json!({"model": model, "messages": messages, "stream": true,
                "stream_options": {"include_usage": true}, "max_tokens": output}),
            Client::OpenAiWhole => json!({"model": model, "messages": messages, "stream": false,
                "max_tokens": output}),
        }
    }
}

/// What one request saw.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Planned send time from the start of the run.
    pub at: Duration,
    /// `s<i>` for a single shot, `c<i>.<turn>` for a conversation turn.
    pub tag: String,
    pub model: String,
    pub prompt_tokens: u32,
    /// Final status (0: transport error or cut stream).
    pub status: u16,
    /// Context-overflow answers seen (a baseline retries elsewhere after one).
    pub context_errors: u32,
    pub total: Duration,
    pub ttft: Option<Duration>,
    pub node: String,
    /// From the node's final object: time spent loading the model, prompt tokens reused.
    pub load_ms: f64,
    pub cached: u32,
    pub error: String,
    /// `X-Fleet-Score`: spec mode's points, completion mode's minus predicted seconds.
    pub score: Option<f64>,
}

pub struct RunData {
    pub outcomes: Vec<Outcome>,
    pub makespan: Duration,
    /// Per node: id, seats, counters at the end of the run.
    pub nodes: Vec<(String, u32, SimStats)>,
}

/// Picks where a request goes: the gateway, or a node by a client-side baseline over the
/// nodes that have the model on disk (what `/api/tags` tells any client).
struct Router {
    policy: Policy,
    gateway: Option<String>,
    nodes: Vec<(String, String)>, // (id, base url)
    holders: Vec<(String, Vec<usize>)>,
    rr: Vec<AtomicUsize>,
    in_flight: Vec<AtomicU32>,
    oracle: Option<Oracle>,
}

/// Where a request went: the gateway (`None`), or a node and the oracle's ticket.
type Sent = Option<(usize, u64)>;

impl Router {
    /// The gateway, or a node not in `tried`; `None` when every holder has been tried.
    fn pick(&self, want: &Want<'_>, tried: &[usize]) -> Option<(String, Sent)> {
        let model = want.model;
        if let Some(g) = &self.gateway {
            return Some((g.clone(), None));
        }
        let k = self
            .holders
            .iter()
            .position(|(m, _)| m == model)
            .expect("scenario checks every model has a holder");
        let on: Vec<usize> = self.holders[k]
            .1
            .iter()
            .copied()
            .filter(|i| !tried.contains(i))
            .collect();
        if on.is_empty() {
            return None;
        }
        let start = self.rr[k].fetch_add(1, Ordering::Relaxed);
        let mut ticket = 0;
        let i = match (self.policy, &self.oracle) {
            (_, Some(o)) => {
                let (i, t) = o.pick(want, &on, start);
                ticket = t;
                i
            }
            (Policy::RoundRobin, _) => on[start % on.len()],
            // Fewest in flight (counted by this client); ties rotate.
            _ => (0..on.len())
                .map(|j| on[(start + j) % on.len()])
                .min_by_key(|&i| self.in_flight[i].load(Ordering::Relaxed))
                .expect("model has a holder"),
        };
        self.in_flight[i].fetch_add(1, Ordering::Relaxed);
        Some((self.nodes[i].1.clone(), Some((i, ticket))))
    }

    fn done(&self, sent: Sent) {
        if let Some((i, ticket)) = sent {
            self.in_flight[i].fetch_sub(1, Ordering::Relaxed);
            if let Some(o) = &self.oracle {
                o.done(i, ticket);
            }
        }
    }
}

/// Send one chat; returns the outcome and the reply text. A client-side baseline that gets
/// an error tries the next node that has the model (as LiteLLM's retries and context-window
/// fallbacks do); the time of failed attempts counts in the request's total.
async fn send(
    (client, kind): (&reqwest::Client, Client),
    router: &Router,
    model: &str,
    (messages, tools): (&[Value], Option<&Value>),
    (tag, prompt_tokens, output): (String, u32, u32),
    chat: Option<(usize, u32)>,
    t0: Instant,
) -> (Outcome, String) {
    let mut body = kind.body(model, messages, output);
    if let Some(tools) = tools {
        body["tools"] = tools.clone();
    }
    let start = Instant::now();
    let mut o = Outcome {
        at: start - t0,
        tag,
        model: model.to_string(),
        prompt_tokens,
        status: 0,
        context_errors: 0,
        total: Duration::ZERO,
        ttft: None,
        node: String::new(),
        load_ms: 0.0,
        cached: 0,
        error: String::new(),
        score: None,
    };
    let mut reply = String::new();
    let mut tried = Vec::new();
    let want = Want {
        model,
        prompt: prompt_tokens,
        output,
        chat,
    };
    while let Some((base, sent)) = router.pick(&want, &tried) {
        o.node = sent
            .map(|(i, _)| router.nodes[i].0.clone())
            .unwrap_or_default();
        attempt((client, kind), &base, &body, start, &mut o, &mut reply).await;
        router.done(sent);
        match sent {
            Some((i, _)) if o.status != 200 => tried.push(i),
            _ => break,
        }
    }
    o.total = start.elapsed();
    (o, reply)
}

async fn attempt(
    (client, kind): (&reqwest::Client, Client),
    base: &str,
    body: &Value,
    start: Instant,
    o: &mut Outcome,
    reply: &mut String,
) {
    match client
        .post(format!("{base}{}", kind.path()))
        .json(body)
        .send()
        .await
    {
        Err(e) => {
            o.status = 0;
            o.error = e.to_string();
        }
        Ok(r) => {
            o.status = r.status().as_u16();
            if let Some(n) = r
                .headers()
                .get("x-fleet-node")
                .and_then(|v| v.to_str().ok())
            {
                o.node = n.to_string();
            }
            // Completion mode: minus the predicted seconds.
            o.score = r
                .headers()
                .get("x-fleet-score")
                .and_then(|v| v.to_str().ok()?.parse().ok());
            if o.status != 200 {
                let b = r.text().await.unwrap_or_default();
                o.context_errors += u32::from(b.contains("context"));
                o.error = b.chars().take(160).collect();
            } else {
                o.error.clear();
                match kind {
                    Client::OllamaStream => read_stream(r, start, o, reply).await,
                    Client::OpenAiStream => read_sse(r, start, o, reply).await,
                    Client::OpenAiWhole => read_whole(r, o, reply).await,
                }
            }
        }
    }
}

async fn read_stream(r: reqwest::Response, start: Instant, o: &mut Outcome, reply: &mut String) {
    let mut s = r.bytes_stream();
    let mut buf = Vec::new();
    let mut done = false;
    while let Some(chunk) = s.next().await {
        let Ok(chunk) = chunk else {
            o.error = "stream cut".into();
            o.status = 0;
            return;
        };
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let Ok(v) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            if let Some(t) = v["message"]["content"].as_str().filter(|t| !t.is_empty()) {
                o.ttft.get_or_insert_with(|| start.elapsed());
                reply.push_str(t);
            }
            if v["done"] == true {
                done = true;
                o.load_ms = v["load_duration"].as_f64().unwrap_or(0.0) / 1e6;
                let evaluated = v["prompt_eval_count"].as_u64().unwrap_or(0) as u32;
                o.cached = o.prompt_tokens.saturating_sub(evaluated);
            }
        }
    }
    if !done {
        o.error = "no final object".into();
        o.status = 0;
    }
}

/// An OpenAI stream: `data:` events, content deltas, the usage event, `[DONE]`. The
/// prompt tokens the node reused come from `prompt_tokens_details.cached_tokens`.
async fn read_sse(r: reqwest::Response, start: Instant, o: &mut Outcome, reply: &mut String) {
    let mut s = r.bytes_stream();
    let mut buf = Vec::new();
    let mut done = false;
    while let Some(chunk) = s.next().await {
        let Ok(chunk) = chunk else {
            o.error = "stream cut".into();
            o.status = 0;
            return;
        };
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            let data = data.trim_ascii();
            if data == b"[DONE]" {
                done = true;
                continue;
            }
            let Ok(v) = serde_json::from_slice::<Value>(data) else {
                continue;
            };
            if let Some(t) = v["choices"][0]["delta"]["content"]
                .as_str()
                .filter(|t| !t.is_empty())
            {
                o.ttft.get_or_insert_with(|| start.elapsed());
                reply.push_str(t);
            }
            if let Some(c) = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() {
                o.cached = c as u32;
            }
        }
    }
    if !done {
        o.error = "no [DONE]".into();
        o.status = 0;
    }
}

/// A whole OpenAI reply: no first-token time (the client sees none).
async fn read_whole(r: reqwest::Response, o: &mut Outcome, reply: &mut String) {
    let v: Value = match r.json().await {
        Ok(v) => v,
        Err(e) => {
            o.error = format!("reply body: {e}");
            o.status = 0;
            return;
        }
    };
    match v["choices"][0]["message"]["content"].as_str() {
        Some(t) => reply.push_str(t),
        None => {
            o.error = "no message in the reply".into();
            o.status = 0;
            return;
        }
    }
    if let Some(c) = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() {
        o.cached = c as u32;
    }
}

/// Replay `trace` on a fresh fleet under `policy`.
pub fn run(rt: &Runtime, sc: &Scenario, trace: &Trace, policy: Policy, kind: Client) -> RunData {
    let nodes: Vec<Node> = sc.nodes();
    let sims: Vec<SimHandle> = nodes
        .iter()
        .map(|n| common::sim(rt, n.spec.clone()))
        .collect();
    let gw = match policy {
        Policy::Fleetgate(mode, supported) => {
            let yaml = gateway_yaml(&nodes, &sims, supported.then_some(mode), sc.stretch);
            let gw = common::Gateway::start(2, &yaml);
            // Ready when every node has answered a poll and, in completion mode, the first
            // measurements are done (a gateway up for a second before traffic arrives).
            let measures = mode == Mode::Completion && supported;
            let ready = |n: &fleetgate::fleet::NodeState| {
                let live = n.live.lock();
                live.polled && (!measures || (live.measure_passed && !live.measuring))
            };
            // The measurements take as much longer as the scenario is stretched (a CPU box's
            // at life's pace took more than 20 s).
            let deadline = Instant::now() + Duration::from_secs(20).mul_f64(sc.stretch.max(1.0));
            while !gw.fleet.nodes().iter().all(|n| ready(n)) {
                assert!(Instant::now() < deadline, "gateway never polled the fleet");
                std::thread::sleep(Duration::from_millis(20));
            }
            Some(gw)
        }
        _ => None,
    };
    let mut holders: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for m in &n.spec.models {
            match holders.iter_mut().find(|(x, _)| *x == m.name) {
                Some((_, v)) => v.push(i),
                None => holders.push((m.name.clone(), vec![i])),
            }
        }
    }
    let router = Arc::new(Router {
        policy,
        gateway: gw.as_ref().map(|g| g.base()),
        nodes: nodes
            .iter()
            .zip(&sims)
            .map(|(n, s)| (n.id.clone(), format!("http://{}", s.addr())))
            .collect(),
        rr: holders.iter().map(|_| AtomicUsize::new(0)).collect(),
        in_flight: nodes.iter().map(|_| AtomicU32::new(0)).collect(),
        oracle: (policy == Policy::Oracle).then(|| {
            Oracle::new(
                nodes
                    .iter()
                    .zip(&sims)
                    .map(|(n, s)| (n.spec.clone(), s.control()))
                    .collect(),
            )
        }),
        holders,
    });
    let client = common::client(Duration::from_secs(120));
    let t0 = Instant::now();
    let outcomes = rt.block_on(async {
        let mut tasks = Vec::new();
        for e in &sc.events {
            let i = nodes.iter().position(|n| n.id == e.node).expect("validated");
            let (ctl, f, at) = (sims[i].control(), e.slowdown, e.at_s);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until((t0 + Duration::from_secs_f64(at)).into()).await;
                ctl.set_slowdown(f);
                Vec::new()
            }));
        }
        for (i, s) in trace.shots.iter().enumerate() {
            let (client, router, s) = (client.clone(), router.clone(), s.clone());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until((t0 + s.at).into()).await;
                let tag = format!("s{i}");
                let mut msgs = Vec::with_capacity(2);
                let mut tools = None;
                let mut prompt = s.prompt_tokens;
                if let Some((g, tokens)) = s.system {
                    let shared = text(&format!("g{g} system"), tokens.saturating_sub(4));
                    if s.as_tools {
                        // One function (the sim counts the JSON text; ~15 tokens of it are not
                        // the description's).
                        tools = Some(json!([{"type": "function", "function": {"name": format!("g{g}"), "description": shared}}]));
                    } else {
                        msgs.push(json!({"role": "system", "content": shared}));
                    }
                    prompt += tokens;
                }
                msgs.push(json!({"role": "user", "content": text(&tag, s.prompt_tokens.saturating_sub(4))}));
                let what = (tag, prompt, s.output);
                vec![send((&client, kind), &router, &s.model, (&msgs, tools.as_ref()), what, None, t0).await.0]
            }));
        }
        for (c, chat) in trace.chats.iter().enumerate() {
            let (client, router, chat) = (client.clone(), router.clone(), chat.clone());
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until((t0 + chat.start).into()).await;
                let sys = text(&format!("c{c} system"), chat.system_tokens.saturating_sub(4));
                let mut msgs = vec![json!({"role": "system", "content": sys})];
                let mut prompt = chat.system_tokens;
                let mut out = Vec::new();
                let mut prev = 0;
                for (k, (user, output, think)) in chat.turns.iter().enumerate() {
                    let tag = format!("c{c}.{k}");
                    msgs.push(json!({"role": "user", "content": text(&tag, user.saturating_sub(4))}));
                    prompt += (*user).max(4);
                    let what = (tag, prompt, *output);
                    let held = Some((c, prev));
                    prev = prompt;
                    let (o, reply) = send((&client, kind), &router, &chat.model, (&msgs, None), what, held, t0).await;
                    out.push(o);
                    let reply_tokens = sim_tokens(&reply);
                    msgs.push(json!({"role": "assistant", "content": reply}));
                    prompt += reply_tokens + 4;
                    tokio::time::sleep(*think).await;
                }
                out
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("request task"));
        }
        all
    });
    let makespan = t0.elapsed();
    drop(gw);
    let data = RunData {
        outcomes,
        makespan,
        nodes: nodes
            .iter()
            .zip(&sims)
            .map(|(n, s)| (n.id.clone(), n.spec.seats, s.control().stats()))
            .collect(),
    };
    rt.block_on(async {
        for s in sims {
            s.shutdown().await;
        }
    });
    data
}

/// Tokens the sim counts for a text: chars / 4, rounded up.
fn sim_tokens(t: &str) -> u32 {
    t.chars().count().div_ceil(4) as u32
}
