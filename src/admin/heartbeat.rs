//! `POST /fleet/nodes/heartbeat`: agent heartbeats (bearer token: `fleet.agent_token` or the
//! admin token). Unknown nodes register when `fleet.allow_registration` is on; a bad token gets
//! 401 and changes nothing.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::json;

use super::auth;
use crate::config::NodeConfig;
use crate::fleet::{Fleet, Heartbeat};
use crate::metrics::METRICS;
use crate::services::health::{poll_and_apply, poll_client};
use crate::services::now_ms;

pub const PATH: &str = "/fleet/nodes/heartbeat";

pub fn routes() -> Router<Arc<Fleet>> {
    Router::new().route(PATH, post(heartbeat))
}

fn count(node: &str, result: &str) {
    METRICS.heartbeats.with_label_values(&[node, result]).inc();
}

async fn heartbeat(State(fleet): State<Arc<Fleet>>, headers: HeaderMap, body: Bytes) -> Response {
    let config = fleet.config();
    let accepted = [config.agent_token.as_deref(), config.admin_token.as_deref()];
    if let Err(r) = auth::require(&headers, &accepted) {
        count("-", "unauthorized");
        return r;
    }
    let hb: Heartbeat = match serde_json::from_slice(&body) {
        Ok(h) => h,
        Err(e) => {
            count("-", "invalid");
            let msg = format!("heartbeat body: {e}");
            return auth::error(StatusCode::BAD_REQUEST, "invalid_request", &msg);
        }
    };
    let (idx, registered) = match fleet.index_of(&hb.node_id) {
        Some(i) => (i, false),
        None if !fleet.config().allow_registration => {
            count("-", "unknown");
            return auth::error(
                StatusCode::NOT_FOUND,
                "unknown_node",
                "unknown node id and registration is off (fleet.allow_registration)",
            );
        }
        None => match register(&fleet, &hb).await {
            Ok(i) => (i, true),
            Err(msg) => {
                count("-", "invalid");
                return auth::error(StatusCode::BAD_REQUEST, "invalid_request", &msg);
            }
        },
    };
    let id = hb.node_id.clone();
    fleet.apply_heartbeat(idx, hb, now_ms());
    count(&id, if registered { "registered" } else { "ok" });
    let health = fleet.view().nodes.get(idx).map(|n| n.health);
    (
        StatusCode::OK,
        Json(json!({"node": id, "registered": registered, "health": health})),
    )
        .into_response()
}

/// Add the node and poll its backend once, so it is routable as soon as this answers.
async fn register(fleet: &Arc<Fleet>, hb: &Heartbeat) -> Result<usize, String> {
    let (id, url, backend) = (hb.node_id.clone(), hb.backend_url.clone(), hb.backend);
    let (mem, bw) = (hb.total_memory_gb, hb.bandwidth_gbps);
    let reserve = fleet.config().routing.default_output_reserve;
    // Resolving the URL may block on DNS.
    let cfg = tokio::task::spawn_blocking(move || {
        NodeConfig::dynamic(&id, &url, backend, mem, bw, reserve)
    })
    .await
    .map_err(|e| format!("registration: {e}"))??;
    let idx = fleet.register(cfg);
    log::info!("registered node {} ({})", hb.node_id, hb.backend_url);
    poll_and_apply(fleet, &poll_client(fleet.config().health.poll_timeout), idx).await;
    Ok(idx)
}
