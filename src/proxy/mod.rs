//! The Pingora `ProxyHttp` implementation: each hook a short dispatcher into the modules.
//!
//! A client request is handled in `request_filter`: body read once (bounded), parsed, routed,
//! and then sent to the chosen node by the same task (`leg.rs`: Pingora's HTTP/1 connector and
//! connection pool, the already-read body written whole), its response piped back to the
//! client as it arrives. Pingora 0.9 replays at most 64 KiB of a body read in
//! `request_filter`, so its own upstream phase is not used; a subrequest per request (the
//! path before) cost a second task, a second session and a pipe between the two.

pub mod access_log;
mod admit;
mod attempt;
mod budget;
pub mod conn;
mod dispatch;
mod framing;
mod handle;
pub mod intake;
mod leg;
mod local;
pub mod observe;
mod outcome;
mod overflow;
mod place;
mod respond;
mod stale;
mod tenancy;
mod watch;
mod xlate;

use std::sync::Arc;

use async_trait::async_trait;
use pingora::prelude::HttpPeer;
use pingora::{Error, Result};
use pingora_core::connectors::http::v1::Connector;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

pub use dispatch::{Attempts, Dispatch};
pub use local::models as fleet_models;

use crate::fleet::Fleet;
use crate::routing::AffinityKind;

/// Response headers that say what routing did.
pub const NODE_HEADER: &str = "x-fleet-node";
pub const SERVED_MODEL_HEADER: &str = "x-fleet-served-model";
pub const REQUESTED_MODEL_HEADER: &str = "x-fleet-requested-model";
pub const FALLBACK_HEADER: &str = "x-fleet-fallback";
pub const RETRIES_HEADER: &str = "x-fleet-retries";
pub const SCORE_HEADER: &str = "x-fleet-score";
pub const AFFINITY_HEADER: &str = "x-fleet-affinity";
pub const QUEUE_WAIT_HEADER: &str = "x-fleet-queue-wait-ms";

pub struct Gateway {
    fleet: Arc<Fleet>,
    access_log: access_log::AccessLog,
    /// Connections to the nodes, pooled.
    nodes: Connector,
}

impl Gateway {
    pub fn new(fleet: Arc<Fleet>, access_log: access_log::AccessLog, nodes: Connector) -> Gateway {
        Gateway {
            fleet,
            access_log,
            nodes,
        }
    }
}

/// Per-request context: everything a request needs lives in its `request_filter` call.
#[derive(Default)]
pub struct RequestCtx;

/// `X-Fleet-Affinity` value; no header when the request carried no conversation.
pub fn affinity_label(kind: AffinityKind) -> Option<&'static str> {
    match kind {
        AffinityKind::None => None,
        AffinityKind::Matched => Some("matched"),
        AffinityKind::Spilled => Some("spilled"),
        AffinityKind::New => Some("new"),
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx
    }

    async fn request_filter(&self, session: &mut Session, _ctx: &mut RequestCtx) -> Result<bool> {
        conn::head_done(session);
        // Pipelined requests are served in order, not dropped with the connection.
        session.as_downstream_mut().set_pipelining_enabled(true);
        let in_flight = self.fleet.clients.request();
        let result =
            handle::client_request(&self.fleet, &self.access_log, &self.nodes, session).await;
        drop(in_flight);
        conn::request_done(session);
        result.map(|()| true)
    }

    /// Never reached: `request_filter` answers every request itself (`leg.rs` is the node leg).
    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        Error::e_explain(
            pingora::ErrorType::InternalError,
            "no upstream phase: request_filter answers every request",
        )
    }

    /// A client that went away is routine, not an error: debug, not one ERROR line each.
    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, e: &Error) -> bool {
        let client = *e.esource() == pingora::ErrorSource::Downstream;
        if client {
            log::debug!("client went away: {e}");
        }
        client
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        _ctx: &mut RequestCtx,
    ) -> FailToProxy {
        if session.response_written().is_none() {
            // The client leg failed before answering (a body it could not read: broken
            // framing, a smuggling pair): say so in the client's shape, not with a bare close.
            let code = respond::client_leg_failure(session, e).await;
            return FailToProxy {
                error_code: code,
                can_reuse_downstream: false,
            };
        }
        FailToProxy {
            error_code: 502,
            can_reuse_downstream: false,
        }
    }
}
