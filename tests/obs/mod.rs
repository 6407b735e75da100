//! Shared by tests/observability.rs and tests/prometheus.rs: the shipped dashboard and its
//! queries, a Prometheus text-exposition reader, the names in src/metrics.rs, and a fleet +
//! traffic mix that makes every exported family appear: `mixed_round` (success, SSE stream,
//! NDJSON stream, Anthropic, a 404 after a failed auto-pull, and a connect failure that is
//! retried and ends in a 503) and `fleet_events` (heartbeats, a pause, a config reload, a
//! breaker opening, a queue abort, a pre-warm, rebalance moves, seat-wait timeouts, a
//! calibration sample).
//!
//! The query checks are generic: they walk every panel (rows and collapsed rows included)
//! and every templating query, so panels added later are covered without touching the tests.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use fleetgate::sim::{Fault, SimHandle};
use serde_json::{json, Value};
use tokio::runtime::Runtime;

use crate::common::{admin_json, client, eventually, fleet, free_port, node, sim, Gateway};

pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

pub const DASHBOARD: &str = "grafana/dashboards/fleetgate.json";

pub fn dashboard() -> Value {
    let path = repo_path(DASHBOARD);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// One PromQL expression of the dashboard and where it sits (for messages).
#[derive(Debug, Clone)]
pub struct Query {
    pub at: String,
    pub expr: String,
}

/// Every panel, depth first, including panels nested in (collapsed) rows.
pub fn all_panels(dash: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
        for p in panels.as_array().into_iter().flatten() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    out
}

/// Every PromQL expression: panel targets, and templating variables' queries (a Grafana
/// `label_values(EXPR, label)` / `query_result(EXPR)` is reduced to its EXPR).
pub fn queries(dash: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for p in all_panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push(Query {
                    at: format!(
                        "panel {} {:?} target {}",
                        p["id"],
                        p["title"].as_str().unwrap_or(""),
                        t["refId"].as_str().unwrap_or("?")
                    ),
                    expr: expr.to_string(),
                });
            }
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"]
            .as_str()
            .or_else(|| v["query"].as_str())
            .or_else(|| v["definition"].as_str())
            .unwrap_or("");
        out.push(Query {
            at: format!("variable ${}", v["name"].as_str().unwrap_or("?")),
            expr: variable_expr(q).0,
        });
    }
    out
}

/// `label_values(EXPR, label)` -> (EXPR, Some(label)); `query_result(EXPR)` -> (EXPR, None).
pub fn variable_expr(q: &str) -> (String, Option<String>) {
    let q = q.trim();
    for f in ["label_values(", "query_result("] {
        if let Some(inner) = q.strip_prefix(f).and_then(|r| r.strip_suffix(')')) {
            return match inner.rsplit_once(',') {
                Some((e, l)) if f == "label_values(" && !l.contains('}') => {
                    (e.trim().to_string(), Some(l.trim().to_string()))
                }
                _ => (inner.trim().to_string(), None),
            };
        }
    }
    (q.to_string(), None)
}

/// Replace Grafana's variables with what they expand to when "All" is selected.
pub fn expand_variables(expr: &str, rate_interval: &str) -> String {
    expr.replace("$__rate_interval", rate_interval)
        .replace("$__interval", rate_interval)
        .replace("${node}", ".*")
        .replace("$node", ".*")
        .replace("${model}", ".*")
        .replace("$model", ".*")
}

/// What a PromQL expression refers to: metric names, label names in selectors per metric,
/// and label names of grouping clauses (`by`, `without`, `on`, `ignoring`, `group_*`).
#[derive(Debug, Default)]
pub struct Refs {
    pub metrics: BTreeSet<String>,
    pub selector_labels: Vec<(String, String)>,
    pub grouping_labels: BTreeSet<String>,
}

const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// A small PromQL scanner: identifiers outside string literals, `{...}` after a metric name,
/// and parenthesised label lists after grouping keywords.
pub fn refs(expr: &str) -> Refs {
    let b = expr.as_bytes();
    let mut r = Refs::default();
    let mut i = 0;
    let ident_start = |c: u8| c.is_ascii_alphabetic() || c == b'_' || c == b':';
    let ident_char = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let skip_ws = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        j
    };
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i = skip_string(b, i);
            continue;
        }
        if c == b'[' {
            // Range durations such as [5m] hold no names.
            while i < b.len() && b[i] != b']' {
                i += 1;
            }
            continue;
        }
        if !ident_start(c) || (i > 0 && (ident_char(b[i - 1]) || b[i - 1] == b'$')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && ident_char(b[i]) {
            i += 1;
        }
        let word = &expr[start..i];
        let j = skip_ws(i);
        if word.starts_with("fleetgate_") {
            r.metrics.insert(word.to_string());
            if j < b.len() && b[j] == b'{' {
                let (labels, end) = selector_labels(expr, j);
                for l in labels {
                    r.selector_labels.push((word.to_string(), l));
                }
                i = end;
            }
        } else if GROUPING.contains(&word) && j < b.len() && b[j] == b'(' {
            let end = expr[j..].find(')').map_or(b.len(), |k| j + k);
            for l in expr[j + 1..end].split(',') {
                let l = l.trim();
                if !l.is_empty() {
                    r.grouping_labels.insert(l.to_string());
                }
            }
            i = end;
        }
    }
    r
}

fn skip_string(b: &[u8], start: usize) -> usize {
    let q = b[start];
    let mut i = start + 1;
    while i < b.len() && b[i] != q {
        if b[i] == b'\\' {
            i += 1;
        }
        i += 1;
    }
    i + 1
}

/// Label names of the matchers in the `{...}` starting at `open`; returns them and the index
/// after the closing brace.
fn selector_labels(expr: &str, open: usize) -> (Vec<String>, usize) {
    let b = expr.as_bytes();
    let mut labels = Vec::new();
    let mut i = open + 1;
    let mut name = String::new();
    while i < b.len() && b[i] != b'}' {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i = skip_string(b, i);
            continue;
        }
        if c.is_ascii_alphanumeric() || c == b'_' {
            name.push(c as char);
        } else if matches!(c, b'=' | b'!') && !name.is_empty() {
            labels.push(std::mem::take(&mut name));
        } else if c != b'~' && !c.is_ascii_whitespace() {
            name.clear();
        }
        i += 1;
    }
    (labels, i + 1)
}

/// A parsed `/metrics` scrape.
#[derive(Debug, Default)]
pub struct Scrape {
    /// Family name -> `# TYPE` (counter, gauge, histogram ...).
    pub types: BTreeMap<String, String>,
    /// Sample name (with `_bucket` / `_count` / `_sum`) -> label names seen on it.
    pub samples: BTreeMap<String, BTreeSet<String>>,
    pub text: String,
}

pub fn parse_exposition(text: &str) -> Scrape {
    let mut s = Scrape {
        text: text.to_string(),
        ..Scrape::default()
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            if let (Some(n), Some(t)) = (it.next(), it.next()) {
                s.types.insert(n.to_string(), t.to_string());
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let labels = s.samples.entry(name.to_string()).or_default();
        if line[name_end..].starts_with('{') {
            let (names, _) = selector_labels(line, name_end);
            labels.extend(names);
        }
    }
    s
}

impl Scrape {
    /// The family a sample name belongs to: histogram/summary suffixes stripped only when the
    /// stripped name is declared as such.
    pub fn family_of(&self, sample: &str) -> String {
        for suffix in ["_bucket", "_count", "_sum"] {
            if let Some(base) = sample.strip_suffix(suffix) {
                match self.types.get(base).map(String::as_str) {
                    Some("histogram") => return base.to_string(),
                    Some("summary") if suffix != "_bucket" => return base.to_string(),
                    _ => {}
                }
            }
        }
        sample.to_string()
    }
}

/// Every `"fleetgate_..."` string literal in src/metrics.rs: the metric names it defines.
pub fn metrics_rs_names() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo_path("src/metrics.rs")).expect("src/metrics.rs");
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|s| {
            s.starts_with("fleetgate_")
                && s.bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_')
        })
        .map(str::to_string)
        .collect()
}

/// Everything wrong with `dash`'s queries against a scrape and the names in metrics.rs.
pub fn query_problems(dash: &Value, scrape: &Scrape, defined: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    for q in queries(dash) {
        let r = refs(&q.expr);
        if r.metrics.is_empty() {
            problems.push(format!("{}: no fleetgate_ metric in {:?}", q.at, q.expr));
        }
        for m in &r.metrics {
            let family = scrape.family_of(m);
            if !scrape.samples.contains_key(m) {
                let hint = if scrape.types.get(m).is_some_and(|t| t == "histogram") {
                    " (a histogram: query its _bucket, _count or _sum series)"
                } else {
                    " (misspelt, or the test traffic does not exercise it)"
                };
                problems.push(format!(
                    "{}: `{m}` is not exported by a running gateway{hint}",
                    q.at
                ));
            }
            if !defined.contains(&family) {
                problems.push(format!(
                    "{}: `{family}` is not a name defined in src/metrics.rs",
                    q.at
                ));
            }
        }
        for (m, label) in &r.selector_labels {
            let known = scrape.samples.get(m);
            if known.is_some_and(|ls| !ls.contains(label)) {
                problems.push(format!(
                    "{}: `{m}` has no label `{label}` (it has {:?})",
                    q.at,
                    known.into_iter().flatten().collect::<Vec<_>>()
                ));
            }
        }
        let all_labels: BTreeSet<&String> = r
            .metrics
            .iter()
            .filter_map(|m| scrape.samples.get(m))
            .flatten()
            .collect();
        for l in &r.grouping_labels {
            if !all_labels.contains(l) && !all_labels.is_empty() {
                problems.push(format!(
                    "{}: groups by `{l}`, a label none of {:?} has",
                    q.at, r.metrics
                ));
            }
        }
        if let Some(l) = variable_label(dash, &q) {
            if !all_labels.contains(&l) {
                problems.push(format!("{}: label_values of missing label `{l}`", q.at));
            }
        }
    }
    problems
}

fn variable_label(dash: &Value, q: &Query) -> Option<String> {
    let name = q.at.strip_prefix("variable $")?;
    let v = dash["templating"]["list"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == name)?;
    let text = v["query"]["query"]
        .as_str()
        .or_else(|| v["query"].as_str())
        .or_else(|| v["definition"].as_str())?;
    variable_expr(text).1
}

// ---- the fleet and the traffic -------------------------------------------------------------

const FAST: &str = "seats: 4\ntokens_per_sec: 1000\nttft_ms: 30\nmemory_gb: 64\nreply_tokens: 8\n";

/// Only the startup poll: no poll changes state during a test.
const QUIET: &str = "health:\n  poll_interval_ms: 600000\n";

/// The admin token of the observed gateway (pause, heartbeats).
pub const ADMIN_TOKEN: &str = "obs-admin-token";

/// Consecutive 5xx answers that open a node:model breaker (set in the config below).
pub const BREAKER_THRESHOLD: u64 = 5;

/// `queue.max_wait_s`: the longest wait for a seat. Pre-warm and rebalance (50 ms cycles)
/// act well within it; the requests they leave behind on a held node time out.
pub const MAX_WAIT_S: u64 = 2;

/// The fleet behind every dashboard test:
/// - `ob-a`, `ob-b` serve `alpha:1b` (alias `gpt-test`);
/// - `ob-dead1`, `ob-dead2` serve `gamma:1b` and refuse connections after the startup poll
///   (a request for it is retried, then 503). `ob-dead1` has the most memory, so auto-pull
///   picks it for a model no node has, and that pull fails: the request is still a 404;
/// - `ob-flaky` answers 500 for `delta:1b` (its breaker opens in [`fleet_events`]);
/// - `ob-q1` (1 seat, `q:7b` loaded) and `ob-q2` (4 seats, `q:7b` on disk): requests queue
///   at `ob-q1`, `ob-q2` is pre-warmed and waiting requests are rebalanced to it;
/// - `ob-learner`: a capacity-learning node that gets an agent heartbeat and is paused.
pub struct ObservedFleet {
    pub gw: Gateway,
    pub sims: Vec<SimHandle>,
    _dir: TempDir,
}

impl ObservedFleet {
    pub fn start(rt: &Runtime, extra_yaml: &str) -> ObservedFleet {
        let one = |m: &str| format!("models:\n  - {{name: {m}, size_gb: 1, loaded: true}}\n");
        let q1 = "seats: 1\ntokens_per_sec: 1000\nttft_ms: 30\nmemory_gb: 64\nreply_tokens: 8\n\
                  models:\n  - {name: q:7b, size_gb: 5, loaded: true}\n";
        let q2 = format!("{FAST}models:\n  - {{name: q:7b, size_gb: 5, cold_load_ms: 20}}\n");
        let members: [(&str, String, &str); 8] = [
            ("ob-a", format!("{FAST}{}", one("alpha:1b")), ""),
            ("ob-b", format!("{FAST}{}", one("alpha:1b")), ""),
            (
                "ob-dead1",
                format!("{FAST}{}", one("gamma:1b")),
                "      memory_gb: 128\n",
            ),
            ("ob-dead2", format!("{FAST}{}", one("gamma:1b")), ""),
            ("ob-flaky", format!("{FAST}{}", one("delta:1b")), ""),
            ("ob-q1", q1.to_string(), "      capacity: 1\n"),
            ("ob-q2", q2, "      capacity: 4\n"),
            (
                "ob-learner",
                format!("{FAST}{}", one("idle:1b")),
                "      learning: true\n",
            ),
        ];
        let sims: Vec<SimHandle> = members.iter().map(|(_, spec, _)| sim(rt, spec)).collect();
        let nodes: Vec<String> = members
            .iter()
            .zip(&sims)
            .map(|((id, _, extra), s)| node(id, s, extra))
            .collect();
        let yaml = format!(
            concat!(
                "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:0\n  threads: 2\n",
                "  admin_token: {token}\n",
                "{quiet}",
                // Spec mode: the queue, pre-warm and rebalance counts below follow its placement.
                "routing:\n  mode: spec\n",
                "breaker:\n  failure_threshold: {threshold}\n  cooldown_s: 600\n",
                "queue:\n  auto_pull: true\n  max_wait_s: {max_wait}\n",
                "  prewarm_interval_ms: 50\n  rebalance_interval_ms: 50\n",
                "models:\n  aliases:\n    gpt-test: alpha:1b\n",
                "{extra}{fleet}",
            ),
            port = free_port(),
            token = ADMIN_TOKEN,
            quiet = QUIET,
            threshold = BREAKER_THRESHOLD,
            max_wait = MAX_WAIT_S,
            extra = extra_yaml,
            fleet = fleet(&nodes),
        );
        // Started from a file, as `fleetgate run --config FILE` is, so a reload re-reads it.
        let dir = TempDir::new("observed");
        let path = dir.path("fleetgate.yaml");
        std::fs::write(&path, yaml).expect("write config");
        let gw = Gateway::start_file(&path);
        for dead in &sims[2..4] {
            dead.control().set_fault(Fault::Refuse);
        }
        sims[4].control().set_fault(Fault::Status500);
        ObservedFleet {
            gw,
            sims,
            _dir: dir,
        }
    }

    pub fn sim(&self, id: &str) -> &SimHandle {
        let ids = [
            "ob-a",
            "ob-b",
            "ob-dead1",
            "ob-dead2",
            "ob-flaky",
            "ob-q1",
            "ob-q2",
            "ob-learner",
        ];
        let i = ids
            .iter()
            .position(|n| *n == id)
            .expect("a node of ObservedFleet");
        &self.sims[i]
    }
}

/// What a traffic round sent, by outcome.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sent {
    pub ok: u64,
    pub not_found: u64,
    pub unavailable: u64,
    /// Routed, and the node answered 5xx (passed through, not a gateway error).
    pub node_error: u64,
    /// Waited for a seat longer than `queue.max_wait_s`: a 503 from the gateway, never sent.
    pub timed_out: u64,
    /// Of `ok`, the streamed ones: only these are time-to-first-token samples.
    pub streamed: u64,
}

impl Sent {
    pub fn total(&self) -> u64 {
        self.ok + self.not_found + self.unavailable + self.node_error + self.timed_out
    }
    /// Errors the gateway answered itself.
    pub fn gateway_errors(&self) -> u64 {
        self.not_found + self.unavailable + self.timed_out
    }
    /// Requests dispatched to a node (and the retried 503), whose latency is recorded.
    pub fn routed(&self) -> u64 {
        self.ok + self.unavailable + self.node_error
    }
    pub fn add(&mut self, o: Sent) {
        self.ok += o.ok;
        self.not_found += o.not_found;
        self.unavailable += o.unavailable;
        self.node_error += o.node_error;
        self.timed_out += o.timed_out;
        self.streamed += o.streamed;
    }
}

pub fn chat(model: &str, text: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": text}]})
}

/// One of each: OpenAI chat, OpenAI SSE stream, Ollama NDJSON stream, Anthropic messages,
/// an unknown model (404), a model only on refusing nodes (one retry, then 503).
pub async fn mixed_round(gw: &Gateway) -> Sent {
    let c = client();
    let mut sent = Sent::default();
    let mut stream = chat("alpha:1b", "stream please");
    stream["stream"] = json!(true);
    let anthropic = json!({"model": "alpha:1b", "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}]});
    for (path, body, streamed) in [
        ("/v1/chat/completions", chat("gpt-test", "hello"), false),
        ("/v1/chat/completions", stream, true),
        ("/api/chat", chat("alpha:1b", "hi"), true), // Ollama streams by default
        ("/v1/messages", anthropic, false),
    ] {
        let r = c.post(gw.url(path)).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        r.bytes().await.unwrap();
        sent.ok += 1;
        sent.streamed += u64::from(streamed);
    }
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("nope:1b", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    r.bytes().await.unwrap();
    sent.not_found += 1;
    let r = c
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("gamma:1b", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503, "both gamma nodes refuse connections");
    r.bytes().await.unwrap();
    sent.unavailable += 1;
    sent
}

/// Once per test, after a [`mixed_round`]: what a live fleet does besides answering, so every
/// node-state, throughput and placement series has a real value:
/// - a chat with a long prompt (a chars-per-token calibration sample);
/// - an agent heartbeat for `ob-learner` (and one without a token, refused), then an admin
///   pause of it;
/// - `ob-flaky` answers 500 [`BREAKER_THRESHOLD`] times: its `delta:1b` breaker opens;
/// - a config reload (`POST /fleet/reload`, the same file);
/// - `ob-q1`'s one seat is held: a client leaves while queued there (a queue abort), five more
///   queue, `ob-q2` is pre-warmed and three of them are rebalanced to it and served; the two
///   left at `ob-q1` time out after [`MAX_WAIT_S`] (503), then the held one is served.
pub async fn fleet_events(f: &ObservedFleet) -> Sent {
    let gw = &f.gw;
    let c = client();
    let mut sent = Sent::default();

    let r = c
        .post(gw.url("/v1/chat/completions"))
        .json(&chat("alpha:1b", &"calibrate ".repeat(100)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    sent.ok += 1;

    let learner = f.sim("ob-learner").addr();
    let hb = json!({"node_id": "ob-learner", "backend_url": format!("http://{learner}"),
        "backend": "sim", "free_memory_gb": 8.0, "total_memory_gb": 64.0,
        "pressure": "normal", "cpu_percent": 20.0});
    let heartbeat = c.post(gw.admin_url("/fleet/nodes/heartbeat")).json(&hb);
    let r = heartbeat.try_clone().unwrap().send().await.unwrap();
    assert_eq!(r.status(), 401, "a heartbeat without a token is refused");
    let r = heartbeat.bearer_auth(ADMIN_TOKEN).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let r = c
        .post(gw.admin_url("/fleet/nodes/ob-learner/pause"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let r = c
        .post(gw.admin_url("/fleet/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());

    for _ in 0..BREAKER_THRESHOLD {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .json(&chat("delta:1b", "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 500, "ob-flaky answers 500");
        r.bytes().await.unwrap();
        sent.node_error += 1;
    }

    let q1 = f.sim("ob-q1").control();
    q1.hold_first_token(true);
    let spawn = || {
        let (url, body) = (gw.url("/v1/chat/completions"), chat("q:7b", "queue"));
        tokio::spawn(async move { client().post(url).json(&body).send().await })
    };
    let first = spawn();
    q1.wait_parked(1).await;
    let leaver = spawn();
    eventually("one request queued at ob-q1", || async {
        pending(gw).await == 1
    })
    .await;
    leaver.abort(); // the client hangs up while queued
    eventually("the queue abort is counted", || async {
        sum(&scrape(gw).await, "fleetgate_queue_client_aborts_total") == 1.0
    })
    .await;
    // Five more queue at the hot 1-seat node rather than cold-loading ob-q2: depth >= 3
    // pre-warms ob-q2, then 5 waiting >= 4 moves 3 of them there.
    let rest: Vec<_> = (0..5).map(|_| spawn()).collect();
    eventually("a pre-warm and three rebalance moves", || async {
        let s = scrape(gw).await;
        sum(&s, "fleetgate_queue_prewarms_total") >= 1.0
            && sum(&s, "fleetgate_queue_rebalance_moves_total") >= 3.0
    })
    .await;
    eventually("the two left at ob-q1 time out", || async {
        sum(&scrape(gw).await, "fleetgate_queue_timeouts_total") == 2.0
    })
    .await;
    q1.release();
    let mut statuses = Vec::new();
    for r in std::iter::once(first).chain(rest) {
        let r = r.await.unwrap().expect("send");
        statuses.push(r.status().as_u16());
        r.bytes().await.unwrap();
    }
    statuses.sort();
    assert_eq!(statuses, [200, 200, 200, 200, 503, 503]);
    sent.ok += 4;
    sent.timed_out += 2;
    sent
}

/// Requests waiting for a seat in the gateway.
async fn pending(gw: &Gateway) -> usize {
    admin_json(gw, "/fleet/queue").await["waiting"]
        .as_array()
        .map_or(0, Vec::len)
}

/// `n` plain OpenAI chats that succeed.
pub async fn chats(gw: &Gateway, n: u64) -> Sent {
    let c = client();
    for i in 0..n {
        let r = c
            .post(gw.url("/v1/chat/completions"))
            .json(&chat("alpha:1b", &format!("request {i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    Sent {
        ok: n,
        ..Sent::default()
    }
}

pub async fn scrape(gw: &Gateway) -> Scrape {
    let text = client()
        .get(gw.admin_url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    parse_exposition(&text)
}

/// A scrape once everything `sent` is accounted: a request is recorded just after its last
/// byte is written, so the client can be a moment ahead of `/metrics`. Bounded wait.
pub async fn settled_scrape(gw: &Gateway, sent: Sent) -> Scrape {
    let want = [
        ("fleetgate_proxy_requests_total", sent.total()),
        ("fleetgate_proxy_errors_total", sent.gateway_errors()),
        (
            "fleetgate_proxy_request_duration_seconds_count",
            sent.routed(),
        ),
        (
            "fleetgate_proxy_time_to_first_token_seconds_count",
            sent.streamed,
        ),
    ];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let s = scrape(gw).await;
        let off: Vec<_> = want
            .iter()
            .filter(|(name, n)| sum(&s, name) != *n as f64)
            .collect();
        if off.is_empty() {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not accounted: {off:?}\n{}",
            s.text
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Sum of every sample of `name` in a scrape.
pub fn sum(scrape: &Scrape, name: &str) -> f64 {
    scrape
        .text
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A directory under the system temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("fleetgate-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
