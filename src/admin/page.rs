//! The fleet page: `GET /` on the admin listener serves one HTML page (its script and style
//! compiled into the binary, no build step, no CDN) that polls `GET /fleet/live`, the JSON of
//! nodes, queues, per node:model traffic and the last decisions with their explain rows.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::explain::Report;
use super::status;
use crate::fleet::Fleet;
use crate::services::now_ms;

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/style.css");

pub fn routes() -> Router<Arc<Fleet>> {
    Router::new()
        .route("/", get(index))
        .route("/fleet/page/app.js", get(script))
        .route("/fleet/page/style.css", get(style))
        .route("/fleet/live", get(live))
}

async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX,
    )
}

async fn script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
}

async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE)
}

/// Everything the page shows, in one document.
pub fn live_json(fleet: &Fleet) -> Value {
    let now = now_ms();
    let status = status::fleet_status(fleet);
    let mut waiting = fleet.board.snapshot();
    waiting.sort_by_key(|w| std::cmp::Reverse(w.waited_ms));
    let decisions: Vec<Value> = fleet
        .recent
        .decisions()
        .iter()
        .map(|n| {
            let report = Report::new(n.endpoint, &n.req, &n.decision, &n.view, n.mode);
            json!({ "at_ms": n.at_ms, "report": report })
        })
        .collect();
    json!({
        "now_ms": now,
        "version": env!("CARGO_PKG_VERSION"),
        "nodes": status.nodes,
        "holding": fleet.board.holding(),
        "waiting": waiting,
        "traffic": fleet.recent.traffic(now),
        "decisions": decisions,
    })
}

async fn live(State(fleet): State<Arc<Fleet>>) -> impl IntoResponse {
    (
        [(header::CACHE_CONTROL, "no-store")],
        Json(live_json(&fleet)),
    )
}
