//! Admin listener: the fleet page (`/`), `/metrics`, `/fleet/status`, `/fleet/live`, agent
//! heartbeats, node pause/resume/drain.

pub mod auth;
mod control;
pub mod explain;
pub mod heartbeat;
mod page;
mod status;
mod zero;

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
    /// During an upgrade: the address to bind once the old process lets it go.
    pending: Option<std::net::SocketAddr>,
}

impl AdminService {
    pub fn new(fleet: Arc<Fleet>, listener: TcpListener) -> AdminService {
        AdminService {
            fleet,
            listener: Mutex::new(Some(listener)),
            pending: None,
        }
    }

    /// Bind `addr` as soon as it is free (a zero-downtime upgrade: the old process holds it
    /// until it exits).
    pub fn when_free(fleet: Arc<Fleet>, addr: std::net::SocketAddr) -> AdminService {
        AdminService {
            fleet,
            listener: Mutex::new(None),
            pending: Some(addr),
        }
    }

    /// The address it serves on.
    pub fn addr(&self) -> std::io::Result<std::net::SocketAddr> {
        match (&*self.listener.lock(), self.pending) {
            (Some(l), _) => l.local_addr(),
            (None, Some(a)) => Ok(a),
            (None, None) => Err(std::io::Error::other("admin listener already taken")),
        }
    }

    async fn bind_when_free(&self, shutdown: &mut ShutdownWatch) -> Option<TcpListener> {
        let addr = self.pending?;
        loop {
            match TcpListener::bind(addr) {
                Ok(l) => {
                    log::info!("admin listener {addr} taken over");
                    return Some(l);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {}
                Err(e) => {
                    log::error!("admin listener {addr}: {e}");
                    return None;
                }
            }
            tokio::select! {
                _ = shutdown.changed() => return None,
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            }
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
        .merge(page::routes())
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
        let taken = self.listener.lock().take();
        let Some(std_listener) = (match taken {
            Some(l) => Some(l),
            None => self.bind_when_free(&mut shutdown).await,
        }) else {
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
