//! The client-facing leg of a request: intake, decision, seat, subrequest, accounting.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use pingora::Result;
use pingora_core::protocols::http::HttpTask;
use pingora_proxy::subrequest::pipe::{pipe_subrequest, InputBody, InputBodyType};
use pingora_proxy::subrequest::{BodyMode, Ctx as SubCtx};
use pingora_proxy::Session;

use super::access_log::{AccessLog, Arrival};
use super::dispatch::{Attempts, Dispatch};
use super::place::Unplaced;
use super::{intake, local, place, respond, xlate};
use crate::fleet::Fleet;
use crate::metrics::METRICS;
use crate::protocol::{self, ErrorCode, Family};

/// Serve one client request completely (the response is written when this returns Ok).
pub async fn client_request(
    fleet: &Arc<Fleet>,
    log: &AccessLog,
    session: &mut Session,
) -> Result<()> {
    let arrived = Instant::now();
    let mut arrival = Arrival::new(session.req_header());
    let method = session.req_header().method.as_str().to_string();
    let path = session.req_header().uri.path().to_string();
    if let Some(l) = protocol::detect_local(&method, &path) {
        return local::answer(session, fleet, l).await;
    }
    let Some(ep) = protocol::detect(&method, &path) else {
        let family = respond::family_of_path(&path);
        let msg = format!("unknown endpoint {method} {path}");
        let code = ErrorCode::NotFound;
        return fail(session, log, &arrival, family, code, &msg).await;
    };
    let family = ep.family();
    arrival.protocol = ep.label();
    let body = match intake::read_body(session, fleet).await? {
        Ok(b) => b,
        Err((code, msg)) => return fail(session, log, &arrival, family, code, &msg).await,
    };
    arrival.bytes_in = body.len();
    let (parsed, req) = match intake::prepare(fleet, ep, &body, session.req_header()) {
        Ok(v) => v,
        Err(msg) => {
            let code = ErrorCode::InvalidRequest;
            return fail(session, log, &arrival, family, code, &msg).await;
        }
    };
    arrival.requested_model = parsed.model.clone();
    let placement = match place::place(fleet, session, ep, &parsed, &req, arrived).await? {
        Ok(p) => p,
        Err(Unplaced::Error(code, msg)) => {
            return fail(session, log, &arrival, family, code, &msg).await
        }
        Err(Unplaced::Refused(r)) => {
            let code = ErrorCode::QueueFull;
            let body = protocol::error_body(family, code, &r.message);
            record_local(arrival.protocol, code);
            log.write(&arrival.local(code, body.len()));
            return respond::json(session, code.status(), body, Some(r.retry_after_s)).await;
        }
        Err(gone) => return place::answer(session, ep, gone).await,
    };
    let mut placement = placement;
    let model = placement.ranked[0].model.clone();
    let body = if model != parsed.model {
        protocol::rewrite_model(&body, &model).unwrap_or(body)
    } else {
        body
    };
    let upstream = xlate::plan(fleet, ep, &mut placement.ranked);
    let body = match xlate::request(ep, upstream, body) {
        Ok(b) => b,
        Err(msg) => {
            let code = ErrorCode::InvalidRequest;
            return fail(session, log, &arrival, family, code, &msg).await;
        }
    };
    let dispatch = Arc::new(Dispatch {
        endpoint: ep,
        upstream,
        requested_model: parsed.model.clone(),
        affinity: placement.affinity,
        ranked: placement.ranked,
        body,
        started: Instant::now(),
        queue_wait: placement.queue_wait,
        stream: parsed.stream,
        max_retries: fleet.config().routing.retries,
        prompt_chars: parsed.prompt_chars,
        prompt_fixed_tokens: super::outcome::fixed_tokens(&parsed),
        state: Mutex::new(Attempts {
            lease: Some(placement.lease),
            ..Attempts::default()
        }),
    });
    // Accounted even when the client went away mid-response: the node did the work.
    let result = proxy_via_subrequest(session, &dispatch).await;
    record(&dispatch, log, &arrival);
    super::outcome::account(fleet, &dispatch);
    super::outcome::recent(fleet, &dispatch);
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

pub(super) fn record_local(protocol: &str, code: ErrorCode) {
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
    let failed = result.is_err();
    match result {
        Ok(mut state) => {
            if let Some(j) = state.join_handle.take() {
                let _ = j.await;
            }
        }
        Err(mut e) => {
            {
                let mut st = d.state.lock();
                if st.error.is_none() {
                    st.error = Some(e.error.to_string());
                }
            }
            // The failure can overtake response parts the node did send: forward those first.
            if let Some(rx) = e.state.pipe_rx.take() {
                forward_leftovers(session, rx).await;
            }
        }
    }
    if failed && session.response_written().is_some() {
        // The node failed after the response began: nothing can be retried, so end the
        // stream with an error the client's SDK understands.
        // (The breaker hears of it through `upstream_error`, set by `error_while_proxy`.)
        if d.stream {
            let err = {
                let mut st = d.state.lock();
                st.code = Some(ErrorCode::UpstreamError);
                st.error.clone().unwrap_or_default()
            };
            let msg = format!("node {} failed mid-stream: {err}", d.choice().node_id);
            let chunk = protocol::stream_error_chunk(d.endpoint, ErrorCode::UpstreamError, &msg);
            let _ = session.write_response_body(Some(chunk), true).await;
        }
        return Ok(());
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

/// Write the response header and body parts still in the pipe after a subrequest failed.
async fn forward_leftovers(session: &mut Session, mut rx: tokio::sync::mpsc::Receiver<HttpTask>) {
    let mut tasks = Vec::new();
    let drain = async {
        while let Some(t) = rx.recv().await {
            if matches!(t, HttpTask::Header(..) | HttpTask::Body(..)) {
                tasks.push(t);
            }
        }
    };
    // The subrequest reports its failure last, so the pipe closes right after.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drain).await;
    let tasks: Vec<HttpTask> = tasks
        .into_iter()
        .map(|t| match t {
            HttpTask::Body(b, _) => HttpTask::Body(b, false),
            t => t,
        })
        .collect();
    if !tasks.is_empty() {
        let _ = session.write_response_tasks(tasks).await;
    }
}

/// Count the outcome of a proxied request, log it and release its seat.
fn record(d: &Dispatch, log: &AccessLog, arrival: &Arrival) {
    let c = d.choice();
    let mut st = d.state.lock();
    // The seat is free from here on (the next waiter of that node gets it).
    drop(st.lease.take());
    let status_code = st.status.unwrap_or(502);
    let status = status_code.to_string();
    let labels = [c.node_id.as_str(), c.model.as_str()];
    METRICS
        .requests
        .with_label_values(&[labels[0], labels[1], d.endpoint.label(), &status])
        .inc();
    let total = d.started.elapsed();
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
