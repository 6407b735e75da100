//! `POST /fleet/nodes/{id}/pause|resume|drain` (admin token): effective for routing at once.
//! `POST /fleet/reload` (admin token): re-read the config file (as SIGHUP does).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;

use super::auth;
use crate::fleet::{Control, Fleet};

pub fn routes() -> Router<Arc<Fleet>> {
    Router::new()
        .route("/fleet/nodes/{id}/pause", post(pause))
        .route("/fleet/nodes/{id}/resume", post(resume))
        .route("/fleet/nodes/{id}/drain", post(drain))
        .route("/fleet/reload", post(reload))
}

async fn pause(s: State<Arc<Fleet>>, p: Path<String>, h: HeaderMap) -> Response {
    apply(s, p, h, Control::Pause)
}

async fn resume(s: State<Arc<Fleet>>, p: Path<String>, h: HeaderMap) -> Response {
    apply(s, p, h, Control::Resume)
}

async fn drain(s: State<Arc<Fleet>>, p: Path<String>, h: HeaderMap) -> Response {
    apply(s, p, h, Control::Drain)
}

async fn reload(State(fleet): State<Arc<Fleet>>, headers: HeaderMap) -> Response {
    if let Err(r) = auth::require(&headers, &[fleet.config().admin_token.as_deref()]) {
        return r;
    }
    match crate::services::reload::reload(&fleet).await {
        Ok(report) => (
            StatusCode::OK,
            Json(json!({"reloaded": true, "report": report})),
        )
            .into_response(),
        Err(errors) => (
            StatusCode::BAD_REQUEST,
            Json(json!({"reloaded": false, "errors": errors})),
        )
            .into_response(),
    }
}

fn apply(
    State(fleet): State<Arc<Fleet>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    c: Control,
) -> Response {
    if let Err(r) = auth::require(&headers, &[fleet.config().admin_token.as_deref()]) {
        return r;
    }
    let Some(idx) = fleet.index_of(&id) else {
        return auth::error(StatusCode::NOT_FOUND, "not_found", "no such node");
    };
    fleet.control(idx, c);
    log::info!("admin: node {id}: {c:?}");
    let health = fleet.view().nodes.get(idx).map(|n| n.health);
    (StatusCode::OK, Json(json!({"node": id, "health": health}))).into_response()
}
