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

/// How a client request goes on after `request_filter`.
pub enum Next {
    /// Answered: locally, with an error, or piped back from the subrequest.
    Done,
    /// Pingora proxies it in this very session: the body (at most 64 KiB) is replayed from
    /// its retry buffer on every attempt, and `logging` accounts for it.
    Direct(Arc<Dispatch>, Box<Arrival>),
}

/// Serve one client request: answered here, or handed back to Pingora to proxy directly.
pub async fn client_request(
    fleet: &Arc<Fleet>,
    log: &AccessLog,
    session: &mut Session,
) -> Result<Next> {
    let done = |r: Result<()>| r.map(|()| Next::Done);
    let arrived = Instant::now();
    let mut arrival = Arrival::new(session.req_header());
    let (method, path) = {
        let h = session.req_header();
        (h.method.clone(), h.uri.path().to_string())
    };
    if let Some(l) = protocol::detect_local(method.as_str(), &path) {
        return done(local::answer(session, fleet, l).await);
    }
    let Some(ep) = protocol::detect(method.as_str(), &path) else {
        let family = respond::family_of_path(&path);
        let msg = format!("unknown endpoint {method} {path}");
        let code = ErrorCode::NotFound;
        return done(fail(session, log, &arrival, family, code, &msg).await);
    };
    let family = ep.family();
    arrival.protocol = ep.label();
    // Pingora keeps up to 64 KiB of what is read here and replays it upstream (the direct path).
    session.enable_retry_buffering();
    let body = match intake::read_body(session, fleet).await? {
        Ok(b) => b,
        Err((code, msg)) => return done(fail(session, log, &arrival, family, code, &msg).await),
    };
    arrival.bytes_in = body.len();
    let (parsed, req) = match intake::prepare(fleet, ep, &body, session.req_header()) {
        Ok(v) => v,
        Err(msg) => {
            let code = ErrorCode::InvalidRequest;
            return done(fail(session, log, &arrival, family, code, &msg).await);
        }
    };
    arrival.requested_model = parsed.model.clone();
    let mut placement = match place::place(fleet, session, ep, &parsed, &req, arrived).await? {
        Ok(p) => p,
        Err(Unplaced::Error(code, msg)) => {
            return done(fail(session, log, &arrival, family, code, &msg).await)
        }
        Err(Unplaced::Refused(r)) => {
            let code = ErrorCode::QueueFull;
            let body = protocol::error_body(family, code, &r.message);
            record_local(arrival.protocol, code);
            log.write(&arrival.local(code, body.len()));
            let answer = respond::json(session, code.status(), body, Some(r.retry_after_s));
            return done(answer.await);
        }
        Err(gone) => return done(place::answer(session, ep, gone).await),
    };
    let model = &placement.ranked[0].model;
    let (body, renamed) = if *model != parsed.model {
        match protocol::rewrite_model(&body, model) {
            Some(b) => (b, true),
            None => (body, false),
        }
    } else {
        (body, false)
    };
    let upstream = xlate::plan(fleet, ep, &mut placement.ranked);
    let body = match xlate::request(ep, upstream, body) {
        Ok(b) => b,
        Err(msg) => {
            let code = ErrorCode::InvalidRequest;
            return done(fail(session, log, &arrival, family, code, &msg).await);
        }
    };
    let dispatch = Arc::new(Dispatch {
        endpoint: ep,
        upstream,
        requested_model: parsed.model.clone(),
        affinity: placement.affinity,
        ranked: placement.ranked,
        body,
        rewritten: renamed || upstream != ep,
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
    if !session.retry_buffer_truncated() && !dispatch.body.is_empty() {
        return Ok(Next::Direct(dispatch, Box::new(arrival)));
    }
    // Larger bodies: a subrequest carrying the body (no size limit).
    let result = proxy_via_subrequest(session, &dispatch).await;
    finish(fleet, log, &dispatch, &arrival);
    done(result)
}

/// Account for a proxied request, log it and free its seat; also when the client went away
/// mid-response (the node did the work).
pub fn finish(fleet: &Fleet, log: &AccessLog, d: &Dispatch, arrival: &Arrival) {
    record(d, log, arrival);
    super::outcome::account(fleet, d);
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
    if failed || session.response_written().is_none() {
        return answer_failure(session, d).await;
    }
    Ok(())
}

/// The upstream failed: end a begun stream with an error event the client's SDK understands
/// (nothing can be retried once the response began), or answer the native error when nothing
/// was written yet. (The breaker hears of a cut stream through `upstream_error`.)
pub async fn answer_failure(session: &mut Session, d: &Dispatch) -> Result<()> {
    if session.response_written().is_some() {
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
    respond::json(session, code.status(), body, respond::retry_after(code)).await
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
