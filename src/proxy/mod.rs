//! The Pingora `ProxyHttp` implementation: each hook a short dispatcher into the modules.
//!
//! A client request is handled in `request_filter`: body read once (bounded), parsed, routed,
//! and then re-issued as a Pingora subrequest carrying the already-read body (Pingora 0.9
//! replays at most 64 KiB of a body read in `request_filter`; the subrequest path has no limit).
//! The subrequest runs the upstream hooks (`upstream_peer`, failover, response headers) and its
//! response is piped back to the client unbuffered.

pub mod access_log;
mod admit;
mod attempt;
mod budget;
pub mod conn;
mod dispatch;
mod framing;
mod handle;
pub mod intake;
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
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::{Error, Result};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

pub use dispatch::{Attempts, Dispatch};
pub use local::models as fleet_models;

use crate::fleet::Fleet;
use crate::metrics::METRICS;
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
}

impl Gateway {
    pub fn new(fleet: Arc<Fleet>, access_log: access_log::AccessLog) -> Gateway {
        Gateway { fleet, access_log }
    }
}

/// Per-request context; only the subrequest (the upstream leg) carries a dispatch.
#[derive(Default)]
pub struct RequestCtx {
    pub dispatch: Option<Arc<Dispatch>>,
    /// Set when the node answers in another protocol than the client's.
    pub translator: Option<crate::protocol::translate::ResponseTranslator>,
}

/// The dispatch a client request attached to this subrequest, if this is one.
fn take_dispatch(session: &mut Session) -> Option<Arc<Dispatch>> {
    let user = session.subrequest_ctx.as_mut()?.user_ctx_mut()?;
    user.downcast_mut::<Arc<Dispatch>>().cloned()
}

/// The request as the node sees it: the (possibly rewritten) body's length, no fleet headers.
fn prepare_upstream_header(h: &mut RequestHeader, body_len: usize) -> Result<()> {
    h.remove_header("transfer-encoding");
    h.insert_header("content-length", body_len.to_string())?;
    // The gateway answered `100 Continue` itself; the node gets the whole body at once.
    h.remove_header("expect");
    for name in [
        intake::PIN_HEADER,
        intake::CONVERSATION_HEADER,
        intake::TAGS_HEADER,
        intake::NO_FALLBACK_HEADER,
    ] {
        h.remove_header(name);
    }
    Ok(())
}

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
        RequestCtx::default()
    }

    fn allow_spawning_subrequest(&self, session: &Session, _ctx: &RequestCtx) -> bool {
        session.subrequest_ctx.is_none()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        if session.subrequest_ctx.is_some() {
            let Some(d) = take_dispatch(session) else {
                return Error::e_explain(
                    pingora::ErrorType::InternalError,
                    "subrequest without dispatch",
                );
            };
            prepare_upstream_header(session.req_header_mut(), d.body.len())?;
            xlate::upstream_header(session.req_header_mut(), &d)?;
            ctx.dispatch = Some(d);
            return Ok(false);
        }
        conn::head_done(session);
        // Pipelined requests are served in order, not dropped with the connection.
        session.as_downstream_mut().set_pipelining_enabled(true);
        let in_flight = self.fleet.clients.request();
        let result = handle::client_request(&self.fleet, &self.access_log, session).await;
        drop(in_flight);
        conn::request_done(session);
        result.map(|()| true)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        let Some(d) = &ctx.dispatch else {
            return Error::e_explain(
                pingora::ErrorType::InternalError,
                "no dispatch for upstream",
            );
        };
        let node = self.fleet.node_config(d.choice().node);
        let limits = &self.fleet.config().limits;
        let mut peer = HttpPeer::new(node.addr, false, String::new());
        peer.options.connection_timeout = Some(limits.connect_timeout);
        peer.options.read_timeout = Some(limits.read_timeout);
        peer.options.write_timeout = Some(limits.write_timeout);
        peer.options.idle_timeout = Some(limits.pool_idle_timeout);
        Ok(Box::new(peer))
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        let Some(d) = &ctx.dispatch else { return e };
        let failed = d.choice().node_id.clone();
        let failed_idx = d.choice().node;
        self.fleet.record_outcome(
            failed_idx,
            None,
            crate::fleet::Outcome::Fault,
            crate::services::now_ms(),
        );
        d.state.lock().error = Some(format!(
            "cannot connect to node {failed} ({})",
            e.etype().as_str()
        ));
        match d.next_attempt(|c| self.fleet.try_lease(c.node, &c.model)) {
            Some(_) => {
                METRICS.retries.with_label_values(&[&failed]).inc();
                e.set_retry(true);
            }
            None => {
                d.state.lock().unreachable = true;
                e.set_retry(false);
            }
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(d) = &ctx.dispatch {
            upstream.insert_header(
                "host",
                self.fleet.node_config(d.choice().node).host.as_str(),
            )?;
        }
        // With `auth:` on, the client's key is the gateway's credential: no node sees it (nor
        // any log line that prints what is sent upstream). Without it, keys pass through.
        if self.fleet.config().tenancy.auth_enabled() {
            upstream.remove_header("authorization");
            upstream.remove_header("x-api-key");
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let Some(d) = &ctx.dispatch else {
            return Ok(());
        };
        if resp.status.is_informational() {
            // A node's own `100 Continue` (the client had its 100 from the gateway).
            return Ok(());
        }
        let c = d.choice();
        if c.cold && resp.status.is_success() {
            self.fleet.mark_loaded(c.node, &c.model);
        }
        let (retries, clamped) = {
            let mut st = d.state.lock();
            st.status = Some(resp.status.as_u16());
            st.upstream_status = Some(resp.status.as_u16());
            st.last_activity = Some(Instant::now());
            (st.retries, st.clamped_max_tokens)
        };
        if let Some(max) = clamped {
            resp.insert_header(budget::MAX_TOKENS_HEADER, max.to_string())?;
        }
        resp.insert_header(NODE_HEADER, c.node_id.as_str())?;
        resp.insert_header(SERVED_MODEL_HEADER, c.model.as_str())?;
        resp.insert_header(REQUESTED_MODEL_HEADER, d.requested_model.as_str())?;
        resp.insert_header(FALLBACK_HEADER, if c.fallback { "true" } else { "false" })?;
        resp.insert_header(RETRIES_HEADER, retries.to_string())?;
        // Spec mode: points to a tenth; completion mode: minus the predicted seconds, to the ms
        // (`+ 0.0` turns a -0.0 into 0.0).
        let score = match c.predicted_s {
            None => format!("{:.1}", c.score + 0.0),
            Some(_) => format!("{:.3}", c.score + 0.0),
        };
        resp.insert_header(SCORE_HEADER, score)?;
        resp.insert_header(QUEUE_WAIT_HEADER, d.queue_wait.as_millis().to_string())?;
        if let Some(kind) = affinity_label(d.affinity) {
            resp.insert_header(AFFINITY_HEADER, kind)?;
        }
        ctx.translator = xlate::response_header(resp, d, crate::services::now_ms() / 1000)?;
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        if let (Some(d), Some(b)) = (&ctx.dispatch, body.as_ref()) {
            let mut st = d.state.lock();
            if st.first_byte.is_none() && !b.is_empty() {
                st.first_byte = Some(Instant::now());
                if let Some(lease) = st.lease.as_mut() {
                    st.prefill_ahead_s = lease.first_byte(crate::services::now_ms());
                }
            }
            st.body_bytes += b.len();
            st.last_activity = Some(Instant::now());
            st.observer.feed(b);
        }
        if let Some(x) = ctx.translator.as_mut() {
            xlate::body(x, body, end_of_stream);
        }
        Ok(None)
    }

    /// A client that went away is routine, not an error: debug, not one ERROR line each.
    fn suppress_error_log(&self, _session: &Session, _ctx: &RequestCtx, e: &Error) -> bool {
        let client = *e.esource() == pingora::ErrorSource::Downstream;
        if client {
            log::debug!("client went away: {e}");
        }
        client
    }

    /// A pooled connection the node had closed (keep-alive advertised, closed after a stream):
    /// nothing reached the node, so the same attempt is sent again on a fresh connection
    /// (`stale.rs`). Other errors: Pingora's rule (retry only what failed on a reused
    /// connection, and only idempotent, replayable requests).
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut RequestCtx,
        client_reused: bool,
    ) -> Box<Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        let replayable = !session.as_ref().retry_buffer_truncated();
        let stale = ctx
            .dispatch
            .as_ref()
            .is_some_and(|d| stale::retry(d, &e, client_reused && replayable));
        if stale {
            e.set_retry(true);
        } else if !session.req_header().method.is_idempotent() || !replayable {
            e.set_retry(false);
        } else {
            e.retry.decide_reuse(client_reused);
        }
        e
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        if session.subrequest_ctx.is_none() && session.response_written().is_none() {
            // The client leg failed before answering (a body it could not read: broken
            // framing, a smuggling pair): say so in the client's shape, not with a bare close.
            let code = respond::client_leg_failure(session, e).await;
            return FailToProxy {
                error_code: code,
                can_reuse_downstream: false,
            };
        }
        // The client-facing request writes the native error (or ends the stream) itself.
        if let Some(d) = &ctx.dispatch {
            let mut st = d.state.lock();
            st.upstream_error |= *e.esource() == pingora::ErrorSource::Upstream;
            if st.error.is_none() || st.status.is_some() {
                st.error = Some(e.to_string());
            }
        }
        FailToProxy {
            error_code: 502,
            can_reuse_downstream: false,
        }
    }
}
