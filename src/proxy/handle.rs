//! The client-facing leg of a request: intake, decision, seat, subrequest, accounting.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use pingora::Result;
use pingora_proxy::subrequest::pipe::{pipe_subrequest, InputBody, InputBodyType};
use pingora_proxy::subrequest::{BodyMode, Ctx as SubCtx};
use pingora_proxy::Session;

use super::access_log::{AccessLog, Arrival};
use super::dispatch::{Attempts, Dispatch};
use super::{intake, local, respond};
use crate::fleet::Fleet;
use crate::metrics::METRICS;
use crate::protocol::{self, ErrorCode, Family};
use crate::routing::{self, NoRoute};
use crate::services::now_ms;

/// Serve one client request completely (the response is written when this returns Ok).
pub async fn client_request(
    fleet: &Arc<Fleet>,
    log: &AccessLog,
    session: &mut Session,
) -> Result<()> {
    let mut arrival = Arrival::new(session.req_header());
    let method = session.req_header().method.as_str().to_string();
    let path = session.req_header().uri.path().to_string();
    if let Some(l) = protocol::detect_local(&method, &path) {
        return local::answer(session, fleet, l).await;
    }
    let Some(ep) = protocol::detect(&method, &path) else {
        let family = respond::family_of_path(&path);
        let msg = format!("unknown endpoint {method} {path}");
        return fail(
            session,
            log,
            &arrival,
            family,
            ErrorCode::InvalidRequest,
            &msg,
        )
        .await;
    };
    let family = ep.family();
    arrival.protocol = ep.label();
    let body = match intake::read_body(session, fleet.config.limits.max_body_bytes).await? {
        Ok(b) => b,
        Err((code, msg)) => return fail(session, log, &arrival, family, code, &msg).await,
    };
    arrival.bytes_in = body.len();
    let parsed = match protocol::parse(ep, &body) {
        Ok(p) => p,
        Err(e) => {
            let code = ErrorCode::InvalidRequest;
            return fail(session, log, &arrival, family, code, &e.message).await;
        }
    };
    arrival.requested_model = parsed.model.clone();
    let req = intake::route_request(&fleet.config, ep, &parsed, session.req_header());
    let view = fleet.view();
    let decision = routing::decide(
        &req,
        &view,
        &fleet.config.routing.policy,
        fleet.as_ref(),
        now_ms(),
    );
    let Some(winner) = decision.winner().cloned() else {
        let (code, msg) = match decision.no_route.unwrap_or(NoRoute::NoProvider) {
            NoRoute::ModelNotFound => (
                ErrorCode::ModelNotFound,
                format!("model '{}' not found on any node", parsed.model),
            ),
            NoRoute::ContextTooLong => (
                ErrorCode::ContextLengthExceeded,
                format!(
                    "request needs about {} prompt tokens plus output; no node's context window for '{}' fits",
                    req.prompt_tokens, req.models[0]
                ),
            ),
            NoRoute::PinUnavailable => (
                ErrorCode::NoProviderAvailable,
                format!("pinned node '{}' cannot serve this request now", req.pin.clone().unwrap_or_default()),
            ),
            NoRoute::NoProvider => (
                ErrorCode::NoProviderAvailable,
                format!("no node can serve model '{}' right now", req.models[0]),
            ),
        };
        return fail(session, log, &arrival, family, code, &msg).await;
    };
    let body = if winner.model != parsed.model {
        protocol::rewrite_model(&body, &winner.model).unwrap_or(body)
    } else {
        body
    };
    let ranked: Vec<_> = decision
        .ranked
        .iter()
        .filter(|c| c.model == winner.model)
        .cloned()
        .collect();
    let lease = fleet.lease(winner.node, &winner.model);
    let dispatch = Arc::new(Dispatch {
        endpoint: ep,
        requested_model: parsed.model.clone(),
        ranked,
        body,
        started: Instant::now(),
        max_retries: fleet.config.routing.retries,
        state: Mutex::new(Attempts {
            lease: Some(lease),
            ..Attempts::default()
        }),
    });
    // Accounted even when the client went away mid-response: the node did the work.
    let result = proxy_via_subrequest(session, &dispatch).await;
    record(&dispatch, log, &arrival);
    result
}

/// Answer with an error the gateway produced before any node was involved.
async fn fail(
    session: &mut Session,
    log: &AccessLog,
    arrival: &Arrival,
    family: Family,
    code: ErrorCode,
    msg: &str,
) -> Result<()> {
    let body = protocol::error_body(family, code, msg);
    record_local(arrival.protocol, code);
    log.write(&arrival.local(code, body.len()));
    respond::json(session, code.status(), body, respond::retry_after(code)).await
}

fn record_local(protocol: &str, code: ErrorCode) {
    METRICS
        .requests
        .with_label_values(&["-", "-", protocol, &code.status().to_string()])
        .inc();
    METRICS
        .errors
        .with_label_values(&[protocol, code.as_str()])
        .inc();
}

/// Send the request upstream through a subrequest that carries the body, piping the response.
async fn proxy_via_subrequest(session: &mut Session, d: &Arc<Dispatch>) -> Result<()> {
    let Some(spawner) = session.subrequest_spawner.as_ref() else {
        return respond::error(
            session,
            d.endpoint.family(),
            ErrorCode::UpstreamError,
            "subrequests disabled",
        )
        .await;
    };
    let ctx = SubCtx::builder()
        .user_ctx(Box::new(d.clone()))
        .body_mode(BodyMode::ExpectBody)
        .build();
    let (sub, handle) = spawner.create_subrequest(session.as_downstream(), ctx);
    let input = InputBodyType::Preset(InputBody::Bytes(vec![d.body.clone()]));
    let result = pipe_subrequest(session, sub, handle, |t| Ok(Some(t)), input).await;
    let join = match result {
        Ok(mut state) => state.join_handle.take(),
        Err(mut e) => {
            let mut st = d.state.lock();
            if st.error.is_none() {
                st.error = Some(e.error.to_string());
            }
            drop(st);
            e.state.join_handle.take()
        }
    };
    if let Some(j) = join {
        let _ = j.await;
    }
    if session.response_written().is_none() {
        let (unreachable, err) = {
            let st = d.state.lock();
            (
                st.unreachable,
                st.error.clone().unwrap_or_else(|| "upstream failed".into()),
            )
        };
        let (code, msg) = if unreachable {
            (
                ErrorCode::NoProviderAvailable,
                format!("no node could be reached: {err}"),
            )
        } else {
            (
                ErrorCode::UpstreamError,
                format!("node {} failed: {err}", d.choice().node_id),
            )
        };
        let body = protocol::error_body(d.endpoint.family(), code, &msg);
        {
            let mut st = d.state.lock();
            st.status = Some(code.status());
            st.code = Some(code);
            st.body_bytes = body.len();
        }
        return respond::json(session, code.status(), body, respond::retry_after(code)).await;
    }
    Ok(())
}

/// Count the outcome of a proxied request, log it and release its seat.
fn record(d: &Dispatch, log: &AccessLog, arrival: &Arrival) {
    let c = d.choice();
    let mut st = d.state.lock();
    let lease = st.lease.take();
    let status_code = st.status.unwrap_or(502);
    let status = status_code.to_string();
    let labels = [c.node_id.as_str(), c.model.as_str()];
    METRICS
        .requests
        .with_label_values(&[labels[0], labels[1], d.endpoint.label(), &status])
        .inc();
    let total = d.started.elapsed();
    if let Some(lease) = lease.filter(|_| (200..300).contains(&status_code)) {
        lease.counters.observe_latency(total.as_secs_f64() * 1000.0);
    }
    METRICS
        .duration
        .with_label_values(&labels)
        .observe(total.as_secs_f64());
    if let Some(fb) = st.first_byte {
        METRICS
            .ttft
            .with_label_values(&labels)
            .observe(fb.duration_since(d.started).as_secs_f64());
    }
    if let Some(code) = st.code {
        METRICS
            .errors
            .with_label_values(&[d.endpoint.label(), code.as_str()])
            .inc();
    }
    log.write(&arrival.routed(d, &st, total));
}
