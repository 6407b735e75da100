//! Routing explanations: `POST /fleet/explain[/<api path>]` on the admin listener (live fleet)
//! and `fleetgate explain` (static facts from a config file). Nothing is sent to any node.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use pingora::http::RequestHeader;
use serde::Serialize;

use crate::fleet::Fleet;
use crate::protocol::{self, Endpoint};
use crate::proxy::intake;
use crate::routing::{self, AffinityKind, Choice, ExplainRow, NoRoute, RouteRequest};

pub fn routes() -> Router<Arc<Fleet>> {
    Router::new()
        .route("/fleet/explain", post(explain_default))
        .route("/fleet/explain/{*path}", post(explain_path))
}

/// The explanation of one decision.
#[derive(Debug, Serialize)]
pub struct Report<'a> {
    pub endpoint: &'static str,
    /// `spec` (points, higher wins) or `completion` (predicted seconds, lower wins).
    pub mode: routing::Mode,
    pub models: &'a [String],
    pub prompt_tokens: u32,
    pub max_output_tokens: Option<u32>,
    pub required_tags: &'a [String],
    pub pin: Option<&'a str>,
    pub winner: Option<&'a Choice>,
    pub ranked: &'a [Choice],
    pub affinity: AffinityKind,
    pub no_route: Option<NoRoute>,
    /// Completion mode: the idle models the winner's cold load would unload first to make
    /// room (`node_api::victims`, set by [`Report::evicting`]); empty when nothing has to go,
    /// and for the fleet page's past decisions.
    pub evicts: Vec<String>,
    pub table: Vec<ExplainRow<'a>>,
}

impl<'a> Report<'a> {
    pub fn new(
        ep: Endpoint,
        req: &'a RouteRequest,
        decision: &'a routing::Decision,
        view: &'a routing::FleetView,
        mode: routing::Mode,
    ) -> Report<'a> {
        Report {
            endpoint: ep.label(),
            mode,
            models: &req.models,
            prompt_tokens: req.prompt_tokens,
            max_output_tokens: req.max_output_tokens,
            required_tags: &req.required_tags,
            pin: req.pin.as_deref(),
            winner: decision.winner(),
            ranked: &decision.ranked,
            affinity: decision.affinity,
            no_route: decision.no_route,
            evicts: Vec::new(),
            table: decision.explain(req, view),
        }
    }

    /// With what the winner's cold load would unload on `fleet` now (see [`Report::evicts`]).
    pub fn evicting(mut self, fleet: &Fleet, view: &routing::FleetView) -> Report<'a> {
        self.evicts = match self.winner {
            Some(w) if w.cold => crate::services::node_api::victims(fleet, view, w.node, &w.model),
            _ => Vec::new(),
        };
        self
    }

    /// A plain-text table, one line per node and candidate model.
    pub fn render(&self) -> String {
        use crate::routing::Verdict;
        let mut out = format!(
            "request: {} models={:?} prompt_tokens~{} max_output={:?} tags={:?}\n",
            self.endpoint,
            self.models,
            self.prompt_tokens,
            self.max_output_tokens,
            self.required_tags
        );
        if self.mode == routing::Mode::Completion {
            out.push_str(&completion_header());
        } else {
            out.push_str(&format!(
                "{:<16} {:<22} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} {:>6} {:>6} {:>5} {:>5}\n",
                "node",
                "model",
                "total",
                "warm",
                "fit",
                "queue",
                "wait",
                "role",
                "avail",
                "ctx",
                "sess",
                "tier",
                "load"
            ));
        }
        for row in &self.table {
            match row.verdict {
                Verdict::Eliminated { reason } => match row.context {
                    Some(c) => out.push_str(&format!(
                        "{:<16} {:<22} out: {} (window {}, needs ~{} tokens)\n",
                        row.node,
                        row.model,
                        reason.as_str(),
                        c.window,
                        c.needed_tokens
                    )),
                    None => out.push_str(&format!(
                        "{:<16} {:<22} out: {}\n",
                        row.node,
                        row.model,
                        reason.as_str()
                    )),
                },
                Verdict::Scored { signals: s, total } => out.push_str(&format!(
                    "{:<16} {:<22} {:>7.1} {:>6.1} {:>6.1} {:>6.1} {:>6.1} {:>6.1} {:>5.1} {:>6.1} {:>6.1} {:>5.1} {:>5.2}\n",
                    row.node,
                    row.model,
                    total + 0.0,
                    s.warmth + 0.0,
                    s.memory_fit + 0.0,
                    s.queue_depth + 0.0,
                    s.wait_time + 0.0,
                    s.role_affinity + 0.0,
                    s.availability + 0.0,
                    s.context_fit + 0.0,
                    s.session_affinity + 0.0,
                    s.tier + 0.0,
                    s.load + 0.0
                )),
                Verdict::Predicted { prediction: p } => {
                    out.push_str(&completion_row(row.node, row.model, p))
                }
            }
        }
        match (self.winner, self.no_route) {
            (Some(w), _) => out.push_str(&format!(
                "winner: {} {} {}{}{}\n",
                w.node_id,
                w.model,
                match w.predicted_s {
                    Some(t) => format!("predicted {t:.2} s"),
                    None => format!("score {:.1}", w.score),
                },
                if w.fallback { " (fallback)" } else { "" },
                match (w.cold, self.evicts.is_empty()) {
                    (false, _) => String::new(),
                    (true, true) => " (cold load)".to_string(),
                    (true, false) => format!(" (cold load, unloads {})", self.evicts.join(", ")),
                }
            )),
            (None, Some(n)) => out.push_str(&format!("no route: {n:?}\n")),
            (None, None) => {}
        }
        out
    }
}

/// Column titles of completion mode's table: the terms (seconds), then the rates behind them.
fn completion_header() -> String {
    format!(
        "{:<16} {:<22} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>6} {:>5} {:>5} {:>7} {:>8} {:>8} {:>7} {:>5} {:>7} {:>5}\n",
        "node",
        "model",
        "total_s",
        "wait",
        "node_w",
        "load",
        "prefill",
        "decode",
        "risk",
        "ahead",
        "seats",
        "cached",
        "pf_queue",
        "pf_tok/s",
        "tok/s",
        "pace",
        "svc_s",
        "seen"
    )
}

fn completion_row(node: &str, model: &str, p: &routing::Prediction) -> String {
    format!(
        "{:<16} {:<22} {:>8.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>6.2} {:>5} {:>5} {:>7} {:>8} {:>8.0} {:>7.1} {:>5.2} {:>7.2} {:>4}{}\n",
        node,
        model,
        p.total_s,
        p.wait_s,
        p.node_wait_s,
        p.load_s,
        p.prefill_s,
        p.decode_s,
        p.risk_s,
        p.ahead,
        p.seats,
        p.cached_tokens,
        p.prefill_queue_tokens,
        p.prefill_tps,
        p.decode_tps,
        p.pace,
        p.service_s,
        p.observed,
        match (p.twin, p.explored) {
            (true, _) => "=",
            (false, true) => "*",
            (false, false) => " ",
        }
    )
}

/// Explain a request body for `path` (an API path such as `/v1/chat/completions`).
pub fn explain_json(
    fleet: &Fleet,
    path: &str,
    headers: &RequestHeader,
    body: &[u8],
) -> Result<serde_json::Value, String> {
    let (ep, req, decision, view) = decide_for(fleet, path, headers, body)?;
    let mode = fleet.config().routing.policy.mode;
    let report = Report::new(ep, &req, &decision, &view, mode).evicting(fleet, &view);
    serde_json::to_value(report).map_err(|e| e.to_string())
}

/// What the proxy would decide for `body` on `path` now: intake and `routing::decide`, with
/// nothing sent to any node.
fn decide_for(
    fleet: &Fleet,
    path: &str,
    headers: &RequestHeader,
    body: &[u8],
) -> Result<
    (
        Endpoint,
        RouteRequest,
        routing::Decision,
        Arc<routing::FleetView>,
    ),
    String,
> {
    let ep = protocol::detect("POST", path)
        .ok_or_else(|| format!("not a routed endpoint: POST {path}"))?;
    let (_, req) = intake::prepare(fleet, ep, body, headers)?;
    let view = fleet.view();
    let policy = &fleet.config().routing.policy;
    let decision = routing::decide(&req, &view, policy, fleet, crate::services::now_ms());
    Ok((ep, req, decision, view))
}

/// Without a path: Ollama's generate when the body has a `prompt`, else OpenAI chat.
pub fn default_path(body: &[u8]) -> &'static str {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    if v.get("prompt").is_some() && v.get("messages").is_none() {
        "/api/generate"
    } else {
        "/v1/chat/completions"
    }
}

async fn explain_default(
    State(fleet): State<Arc<Fleet>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = default_path(&body);
    respond(&fleet, path, &headers, &body)
}

async fn explain_path(
    State(fleet): State<Arc<Fleet>>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    respond(&fleet, &format!("/{path}"), &headers, &body)
}

fn respond(fleet: &Fleet, path: &str, headers: &HeaderMap, body: &[u8]) -> Response {
    let mut h = match RequestHeader::build("POST", path.as_bytes(), Some(headers.len())) {
        Ok(h) => h,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(serde_json::json!({"error": e.to_string()})),
            )
                .into_response()
        }
    };
    for (name, value) in headers {
        let _ = h.append_header(name.clone(), value.clone());
    }
    match explain_json(fleet, path, &h, body) {
        Ok(v) => Json(v).into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": e})),
        )
            .into_response(),
    }
}

/// `fleetgate explain`: the decision for `body` on the fleet a config describes (static facts:
/// the `models:` and `sim:` blocks, no load), as a table or JSON.
/// What `explain_offline` printed, and whether some node can take the request.
pub struct Offline {
    pub text: String,
    pub routed: bool,
}

pub fn explain_offline(
    config: crate::config::Config,
    path: Option<&str>,
    body: &[u8],
    json: bool,
) -> Result<Offline, String> {
    // Nodes whose models only a live poll can tell (no `models:` list, not simulated).
    let unknown: Vec<String> = config
        .nodes
        .iter()
        .filter(|n| n.models.is_empty() && n.sim.is_none())
        .map(|n| n.id.clone())
        .collect();
    let fleet = Fleet::new(Arc::new(config));
    let path = path.unwrap_or_else(|| default_path(body));
    let h = RequestHeader::build("POST", path.as_bytes(), None).map_err(|e| e.to_string())?;
    let (ep, req, decision, view) = decide_for(&fleet, path, &h, body)?;
    let mode = fleet.config().routing.policy.mode;
    let report = Report::new(ep, &req, &decision, &view, mode).evicting(&fleet, &view);
    let routed = decision.winner().is_some();
    let mut text = if json {
        serde_json::to_string_pretty(&report).map_err(|e| e.to_string())? + "\n"
    } else {
        report.render()
    };
    if !json && !unknown.is_empty() {
        text += &format!(
            "note: offline, the models of {} are unknown (no `models:` list; its backend reports them when polled): `model_absent` there says nothing of the live node; ask the running gateway's POST /fleet/explain\n",
            unknown.join(", ")
        );
    }
    Ok(Offline { text, routed })
}
