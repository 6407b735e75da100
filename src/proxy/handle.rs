//! The client-facing leg of a request: intake, decision, seat, the node leg, accounting.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use pingora::Result;
use pingora_core::connectors::http::v1::Connector;
use pingora_proxy::Session;

use super::access_log::{AccessLog, Arrival};
use super::attempt::{self, Ended};
use super::dispatch::{Attempts, Dispatch};
use super::place::Unplaced;
use super::{budget, intake, local, place, respond, tenancy, xlate};
use crate::fleet::Fleet;
use crate::metrics::METRICS;
use crate::protocol::{self, ErrorCode, Family};

/// Serve one client request completely (the response is written when this returns Ok).
pub async fn client_request(
    fleet: &Arc<Fleet>,
    log: &AccessLog,
    nodes: &Connector,
    session: &mut Session,
) -> Result<()> {
    let arrived = Instant::now();
    let mut arrival = Arrival::new(session.req_header());
    let method = session.req_header().method.as_str().to_string();
    let path = session.req_header().uri.path().to_string();
    let family = respond::family_of_path(&path);
    let Some(tenant) = tenancy::authenticate(fleet, session, log, &mut arrival, family).await?
    else {
        return Ok(());
    };
    if let Some(l) = protocol::detect_local(&method, &path) {
        return local::answer(session, fleet, l).await;
    }
    let Some(ep) = protocol::detect(&method, &path) else {
        let msg = format!("unknown endpoint {method} {path}");
        let code = ErrorCode::NotFound;
        return fail(session, log, &arrival, family, code, &msg).await;
    };
    let family = ep.family();
    arrival.protocol = ep.label();
    // Moved into each attempt's dispatch and taken back from it for the next one: nothing here
    // holds it while the reply streams (`dispatch::Body`).
    let mut body = match intake::read_body(session, fleet).await? {
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
    if let Some(p) = parsed.prefix {
        fleet
            .prefixes
            .note_turn(p.continues, req.cached_on.is_some());
    }
    let Some(pass) = tenancy::admit(fleet, session, log, &arrival, family, &tenant, &req).await?
    else {
        return Ok(());
    };
    // Output budget fit (opt-in): route on the prompt alone, clamp per chosen node below.
    let opted_in = fleet.config().clamp_output.contains(&req.models[0]);
    // Boxed (rare, and this future lives as long as the reply): 8 bytes, not 208.
    let clamped_req = budget::routable(&req, &fleet.view(), opted_in).map(Box::new);
    let route_req = clamped_req.as_deref().unwrap_or(&req);
    let clamp = clamped_req.as_ref().map(|_| &req);
    let first = place::Terms {
        arrived,
        may_hold: true,
        pass: &pass,
    };
    let placement = match place::place(fleet, session, ep, &parsed, route_req, first).await? {
        Ok(p) => p,
        Err(Unplaced::Error(code, msg)) => {
            tenancy::record_local(&pass, code, &req);
            return fail(session, log, &arrival, family, code, &msg).await;
        }
        Err(Unplaced::Refused(r)) => {
            let code = ErrorCode::QueueFull;
            tenancy::record_local(&pass, code, &req);
            let body = protocol::error_body(family, code, &r.message);
            record_local(arrival.protocol, code);
            log.write(|| arrival.local(code, body.len()));
            return respond::json(session, code.status(), body, Some(r.retry_after_s)).await;
        }
        Err(gone) => return place::answer(session, ep, gone).await,
    };
    let mut placement = placement;
    let mut retries = 0;
    loop {
        let asked = Asked {
            ep,
            parsed: &parsed,
            req: route_req,
            clamp,
        };
        let d = match dispatch_for(fleet, &asked, body, placement, retries) {
            Ok(d) => d,
            Err(msg) => {
                let code = ErrorCode::InvalidRequest;
                tenancy::record_local(&pass, code, &req);
                return fail(session, log, &arrival, family, code, &msg).await;
            }
        };
        let c = d.choice();
        if c.cold {
            // Completion mode picks what the load throws out (the backend's LRU may pick the
            // model dearest to reload).
            crate::services::node_api::make_room(fleet, c.node, &c.model, true).await;
        }
        let ended = {
            let run = attempt::run(session, fleet, nodes, &d);
            tokio::pin!(run);
            tokio::select! {
                r = &mut run => Some(r),
                () = fleet.clients.grace_over() => None,
            }
        };
        let ended = match ended {
            Some(r) => r,
            None => cut_at_shutdown(session, &d).await.map(|()| Ended::Answered),
        };
        if !matches!(ended, Ok(Ended::Unsent)) {
            // Accounted even when the client went away mid-response: the node did the work.
            record(&d, log, &arrival);
            seat_freed(fleet);
            super::outcome::account(fleet, &d);
            super::outcome::recent(fleet, &d);
            tenancy::record_dispatch(&pass, &d, &req);
            return ended.map(|_| ());
        }
        // Nothing reached the client: the breaker hears of it, the seat is freed, and the
        // request goes back through placement (waiting in the next node's queue), retries
        // and the original deadlines permitting.
        super::outcome::account(fleet, &d);
        let failed = d.choice().node_id.clone();
        let spent = {
            let mut st = d.state.lock();
            drop(st.lease.take());
            st.retries
        };
        seat_freed(fleet);
        // The node said the prompt overflows its window: re-placed with the count it gave.
        let overflow = d.state.lock().overflow;
        let mut also = None;
        // Always there: it goes only once the reply began reaching the client (never Unsent).
        let asked_body = d.take_asked_body();
        if asked_body.is_none() {
            log::warn!("request body released before an unsent attempt: not retried");
        }
        if let Some(asked_body) = asked_body.filter(|_| spent < d.max_retries) {
            let mut again = route_req.clone();
            again.tried = d.tried_nodes();
            if let Some(n) = overflow.and_then(|o| o.prompt_tokens) {
                again.prompt_tokens = again.prompt_tokens.max(n);
            }
            let terms = place::Terms {
                arrived,
                may_hold: false,
                pass: &pass,
            };
            match place::place(fleet, session, ep, &parsed, &again, terms).await? {
                Ok(p) => {
                    METRICS.retries.with_label_values(&[&failed]).inc();
                    body = asked_body;
                    placement = p;
                    retries = spent + 1;
                    continue;
                }
                Err(Unplaced::Gone) => {
                    record(&d, log, &arrival);
                    tenancy::record_dispatch(&pass, &d, &req);
                    return place::answer(session, ep, Unplaced::Gone).await;
                }
                Err(Unplaced::Error(_, msg)) => also = Some(format!("no other node: {msg}")),
                Err(Unplaced::Refused(r)) => also = Some(format!("no other node: {}", r.message)),
            }
        }
        let result = attempt::answer_unsent(session, &d, also.as_deref()).await;
        record(&d, log, &arrival);
        super::outcome::recent(fleet, &d);
        tenancy::record_dispatch(&pass, &d, &req);
        return result;
    }
}

/// What the client asked, as every attempt's dispatch reads it.
struct Asked<'a> {
    ep: protocol::Endpoint,
    parsed: &'a protocol::ParsedRequest,
    /// The request as routed (the prompt alone when the output budget is clamped).
    req: &'a crate::routing::RouteRequest,
    /// The request as asked, when its output budget is clamped to the chosen node's window.
    clamp: Option<&'a crate::routing::RouteRequest>,
}

/// The dispatch of one attempt: the placement's seat and candidates, the body for its model.
fn dispatch_for(
    fleet: &Fleet,
    asked: &Asked<'_>,
    body: bytes::Bytes,
    mut placement: place::Placement,
    retries: u32,
) -> std::result::Result<Arc<Dispatch>, String> {
    let Asked {
        ep,
        parsed,
        req,
        clamp,
    } = *asked;
    let model = placement.ranked[0].model.clone();
    let learn = super::dispatch::LearnInput {
        affinity_key: req.affinity_key,
        prompt_tokens: req.prompt_tokens,
        cached_tokens: req.cached_prefix_tokens,
        cached_on: req.cached_on.clone(),
        shared_key: req.shared_key,
        shared_tokens: req.shared_prefix_tokens,
        shared_on: req.shared_on.clone(),
        shared_seen: req.shared_seen.clone(),
        concurrency: fleet
            .node(placement.lease.node)
            .in_flight
            .load(std::sync::atomic::Ordering::Relaxed),
        max_output_tokens: req.max_output_tokens,
    };
    let sent = if model != parsed.model {
        protocol::rewrite_model(&body, &model).unwrap_or_else(|| body.clone())
    } else {
        body.clone()
    };
    // Clamped in the client's protocol, before any translation carries it over.
    let clamped = clamp.and_then(|asked| {
        let view = fleet.view();
        budget::clamp_for(asked, view.nodes.get(placement.ranked[0].node)?, &model)
    });
    let sent = match clamped {
        Some(max) => budget::rewrite(ep, &sent, max).unwrap_or(sent),
        None => sent,
    };
    let upstream = xlate::plan(fleet, ep, &mut placement.ranked);
    let sent = xlate::request(ep, upstream, sent)?;
    let d = Arc::new(Dispatch {
        endpoint: ep,
        upstream,
        requested_model: parsed.model.clone(),
        affinity: placement.affinity,
        ranked: placement.ranked,
        body: Mutex::new(super::dispatch::Body::new(sent, body)),
        started: Instant::now(),
        queue_wait: placement.queue_wait,
        stream: parsed.stream,
        max_retries: fleet.config().routing.retries,
        prompt_chars: parsed.prompt_chars,
        prompt_fixed_tokens: super::outcome::fixed_tokens(parsed),
        learn,
        state: Mutex::new(Attempts {
            lease: Some(placement.lease),
            retries,
            clamped_max_tokens: clamped,
            ..Attempts::default()
        }),
    });
    d.start_prefill(&mut d.state.lock());
    Ok(d)
}

/// The shutdown grace period ended with this request in flight: end a stream with the
/// protocol's error event, answer 503 if nothing was sent yet.
async fn cut_at_shutdown(session: &mut Session, d: &Arc<Dispatch>) -> Result<()> {
    let code = ErrorCode::Overloaded;
    let msg = "the gateway is shutting down: its grace period (server.grace_period_s) is over";
    d.state.lock().code = Some(code);
    session.set_keepalive(None);
    if session.response_written().is_some() {
        if d.stream {
            let chunk = protocol::stream_error_chunk(d.endpoint, code, msg);
            let _ = session.write_response_body(Some(chunk), true).await;
        }
        return Ok(());
    }
    attempt::answer_error(session, d, code, msg).await
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
    log.write(|| arrival.local(code, body.len()));
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

/// A seat was freed: requests in the holding queue re-decide now, not at their next rescore
/// (a seat or an evictable model may be what they were waiting for).
fn seat_freed(fleet: &Fleet) {
    if !fleet.board.is_empty() {
        fleet.changed.notify_waiters();
    }
}

/// Count the outcome of a proxied request, log it and release its seat.
fn record(d: &Dispatch, log: &AccessLog, arrival: &Arrival) {
    let c = d.choice();
    let mut st = d.state.lock();
    // The seat is free from here on (the next waiter of that node gets it).
    if let Some(mut lease) = st.lease.take() {
        st.decode_streams = lease.end_decoding(crate::services::now_ms());
    }
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
    // Time to first token means something for a streamed success only (a non-streaming
    // request's first byte is its whole answer; an error has no token).
    let ok = (200..300).contains(&status_code);
    if let Some(fb) = st.first_byte.filter(|_| ok && d.stream) {
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
    log.write(|| arrival.routed(d, &st, total));
}
