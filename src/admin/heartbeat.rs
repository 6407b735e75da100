//! `POST /fleet/nodes/heartbeat`: agent heartbeats (bearer token: the node's own agent token,
//! derived from `fleet.agent_token`, or the admin token). Unknown nodes register when
//! `fleet.allow_registration` is on; a bad token gets 401 and changes nothing; a heartbeat never
//! changes a known node's address. `POST /fleet/nodes/{id}/forget-agent` (admin token) drops
//! what the node's agent said, so a node that stopped heartbeating is judged by polls again.

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
    Router::new()
        .route(PATH, post(heartbeat))
        .route("/fleet/nodes/{id}/forget-agent", post(forget))
}

async fn forget(
    State(fleet): State<Arc<Fleet>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = auth::require(&headers, &[fleet.config().admin_token.as_deref()]) {
        return r;
    }
    let Some(idx) = fleet.index_of(&id) else {
        return auth::error(StatusCode::NOT_FOUND, "not_found", "no such node");
    };
    let had = fleet.forget_agent(idx);
    log::info!("admin: node {id}: agent state cleared ({had} heartbeat(s) forgotten)");
    let health = fleet.view().nodes.get(idx).map(|n| n.health);
    (
        StatusCode::OK,
        Json(json!({"node": id, "forgotten_heartbeats": had, "health": health})),
    )
        .into_response()
}

fn count(node: &str, result: &str) {
    METRICS.heartbeats.with_label_values(&[node, result]).inc();
}

async fn heartbeat(State(fleet): State<Arc<Fleet>>, headers: HeaderMap, body: Bytes) -> Response {
    let config = fleet.config();
    // The node id the token must be for is in the body: parse first, then judge the token
    // (a body that does not parse is refused either way and changes nothing).
    let hb: Heartbeat = match serde_json::from_slice(&body) {
        Ok(h) => h,
        Err(e) => {
            if let Err(r) = auth::require(&headers, &[config.admin_token.as_deref()]) {
                count("-", "unauthorized");
                return r;
            }
            count("-", "invalid");
            let msg = format!("heartbeat body: {e}");
            return auth::error(StatusCode::BAD_REQUEST, "invalid_request", &msg);
        }
    };
    let (admin, secret) = (config.admin_token.as_deref(), config.agent_token.as_deref());
    if let Err(r) = auth::require_node(&headers, admin, secret, &hb.node_id) {
        count("-", "unauthorized");
        return r;
    }
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
    let config = fleet.config();
    let reserve = config.routing.default_output_reserve;
    let mut own = fleet.clients.listeners();
    own.extend([config.listen, config.admin_listen]);
    // Resolving the URL may block on DNS.
    let cfg = tokio::task::spawn_blocking(move || {
        NodeConfig::dynamic(&id, &url, backend, mem, bw, reserve)
    })
    .await
    .map_err(|e| format!("registration: {e}"))??;
    if own.iter().any(|l| same_listener(*l, cfg.addr)) {
        return Err(format!(
            "backend_url {}: that is this gateway's own listener, not a node",
            hb.backend_url
        ));
    }
    let idx = fleet.register(cfg);
    log::info!("registered node {} ({})", hb.node_id, hb.backend_url);
    poll_and_apply(fleet, &poll_client(fleet.config().health.poll_timeout), idx).await;
    Ok(idx)
}

/// True when `addr` reaches `listener` (same port; same IP, or loopback/any on either side).
fn same_listener(listener: std::net::SocketAddr, addr: std::net::SocketAddr) -> bool {
    if listener.port() != addr.port() {
        return false;
    }
    let local = |ip: std::net::IpAddr| ip.is_loopback() || ip.is_unspecified();
    listener.ip() == addr.ip() || (local(addr.ip()) && local(listener.ip()))
}

#[cfg(test)]
mod tests {
    use super::same_listener;

    #[test]
    fn own_listener_is_recognised() {
        let a = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert!(same_listener(a("127.0.0.1:8080"), a("127.0.0.1:8080")));
        assert!(same_listener(a("0.0.0.0:8080"), a("127.0.0.1:8080")));
        assert!(same_listener(a("127.0.0.1:8080"), a("0.0.0.0:8080")));
        assert!(same_listener(a("10.0.0.1:8080"), a("10.0.0.1:8080")));
        assert!(!same_listener(a("127.0.0.1:8080"), a("127.0.0.1:8081")));
        assert!(
            !same_listener(a("0.0.0.0:8080"), a("10.0.0.9:8080")),
            "another host"
        );
    }
}
