//! Admin listener: `/metrics`, `/fleet/status`, agent heartbeats, node pause/resume/drain.

pub mod auth;
mod control;
pub mod explain;
pub mod heartbeat;
mod status;

use std::net::TcpListener;
use std::sync::Arc;

use async_trait::async_trait;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use parking_lot::Mutex;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::fleet::Fleet;

/// The admin HTTP service; the listener is bound before the server starts so a busy port is a
/// startup error, not a silent background failure.
pub struct AdminService {
    fleet: Arc<Fleet>,
    listener: Mutex<Option<TcpListener>>,
}

impl AdminService {
    pub fn new(fleet: Arc<Fleet>, listener: TcpListener) -> AdminService {
        AdminService {
            fleet,
            listener: Mutex::new(Some(listener)),
        }
    }
}

pub fn router(fleet: Arc<Fleet>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/fleet/status", get(status))
        .merge(heartbeat::routes())
        .merge(control::routes())
        .route("/fleet/queue", get(queue))
        .merge(explain::routes())
        .with_state(fleet)
}

async fn metrics(State(fleet): State<Arc<Fleet>>) -> impl IntoResponse {
    status::refresh_gauges(&fleet);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::encode(),
    )
}

async fn status(State(fleet): State<Arc<Fleet>>) -> impl IntoResponse {
    Json(status::fleet_status(&fleet))
}

/// Every request waiting in this gateway: in the holding queue (`node: null`) or a node:model
/// queue, oldest first.
async fn queue(State(fleet): State<Arc<Fleet>>) -> impl IntoResponse {
    let mut waiting = fleet.board.snapshot();
    waiting.sort_by_key(|w| std::cmp::Reverse(w.waited_ms));
    Json(serde_json::json!({ "holding": fleet.board.holding(), "waiting": waiting }))
}

#[async_trait]
impl BackgroundService for AdminService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(std_listener) = self.listener.lock().take() else {
            return;
        };
        let listener = match std_listener
            .set_nonblocking(true)
            .and_then(|_| tokio::net::TcpListener::from_std(std_listener))
        {
            Ok(l) => l,
            Err(e) => {
                log::error!("admin listener: {e}");
                return;
            }
        };
        let app = router(self.fleet.clone());
        let stop = async move {
            let _ = shutdown.changed().await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            log::error!("admin listener stopped: {e}");
        }
    }
}
