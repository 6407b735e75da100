//! The node leg of one attempt, driven from the client's own request task: connect (or take a
//! pooled connection), send the request with its already-read body, and hand each part of the
//! node's response to the client leg as it arrives. No second task, no pipe between the two
//! legs: the node's bytes are written to the client by the task that read them.
//!
//! Failover on a failed connect and the repeat on a pooled connection the node had closed
//! happen here; everything after the node answered is the caller's (`attempt`).

use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use futures::FutureExt;
use http::Version;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType, Result};
use pingora_core::connectors::http::v1::Connector;
use pingora_core::protocols::http::v1::client::HttpSession;
use pingora_core::protocols::http::HttpTask;
use pingora_proxy::Session;

use super::dispatch::Dispatch;
use super::{budget, intake, stale, xlate};
use crate::fleet::Fleet;
use crate::metrics::METRICS;
use crate::protocol::translate::ResponseTranslator;
use crate::services::now_ms;

/// Hop-by-hop headers a client may send that are not the node's business.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Fleet headers that steer routing: the gateway's, never sent to a node.
const FLEET_REQUEST_HEADERS: [&str; 4] = [
    intake::PIN_HEADER,
    intake::CONVERSATION_HEADER,
    intake::TAGS_HEADER,
    intake::NO_FALLBACK_HEADER,
];

/// A node connection whose response was read whole, for the pool once the client has its
/// answer (returning it costs a syscall and a task spawn that the client need not wait for).
pub struct Spare {
    h1: HttpSession,
    addr: SocketAddr,
}

impl Spare {
    pub async fn release(self, fleet: &Fleet, nodes: &Connector) {
        // The peer it was taken for, built again (its pool key is the address): an open
        // stream no longer holds a 672-byte `HttpPeer` for the pool's sake.
        let peer = peer_at(fleet, self.addr);
        let idle = peer.options.idle_timeout;
        nodes.release_http_session(self.h1, &peer, idle).await;
    }
}

/// Run the node leg of `d`'s current attempt. Each response part, after the gateway's
/// response hooks, goes through `deliver` (which writes it to the client or holds it).
/// Ok: the node's response ended (whole), and here is its connection. Err: the attempt
/// failed; `d`'s state says how.
pub async fn run<F>(
    session: &mut Session,
    fleet: &Fleet,
    nodes: &Connector,
    d: &Dispatch,
    deliver: &mut F,
) -> Result<Spare>
where
    F: FnMut(HttpTask) -> Result<Option<HttpTask>>,
{
    let r = attempts(session, fleet, nodes, d, deliver).await;
    if let Err(e) = &r {
        failed(d, e);
    }
    r
}

/// Connect and exchange until the node has answered whole, or the attempt cannot go on.
async fn attempts<F>(
    session: &mut Session,
    fleet: &Fleet,
    nodes: &Connector,
    d: &Dispatch,
    deliver: &mut F,
) -> Result<Spare>
where
    F: FnMut(HttpTask) -> Result<Option<HttpTask>>,
{
    loop {
        // Taken for each send (a pooled connection the node had closed sends again), and
        // dropped once written: the dispatch lets go of it when the reply reaches the client,
        // after which no attempt follows (checked before a connection is taken).
        let Some(body) = d.sent_body() else {
            return Error::e_explain(ErrorType::InternalError, "the request body was released");
        };
        let addr = fleet.node_config(d.choice().node).addr;
        let (mut h1, reused) = {
            let peer = peer_at(fleet, addr);
            // Boxed, as the client write below: this future lives as long as the reply (an
            // open stream holds it for minutes), and unboxed these two sized it (~2 KB).
            match Box::pin(nodes.get_http_session(&peer)).await {
                Ok((mut h1, reused)) => {
                    h1.read_timeout = peer.options.read_timeout;
                    h1.write_timeout = peer.options.write_timeout;
                    (h1, reused)
                }
                Err(e) => {
                    failed_to_connect(fleet, d, e)?;
                    continue;
                }
            }
        };
        // Boxed: the exchange's future holds it (moved out or not) for the whole reply.
        let req = Box::new(upstream_request(
            session.req_header(),
            fleet,
            d,
            body.len(),
        )?);
        let mut exchange = Exchange {
            h1: &mut h1,
            d,
            fleet,
            translator: None,
            body_released: false,
        };
        match exchange.run(session, req, body, deliver).await {
            Ok(()) => return Ok(Spare { h1, addr }),
            // Nothing came back on a pooled connection the node had closed: a fresh one.
            Err(e) if stale::retry(d, &e, reused) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The peer for a node's address, with the limits from config.
fn peer_at(fleet: &Fleet, addr: SocketAddr) -> HttpPeer {
    let limits = &fleet.config().limits;
    let mut peer = HttpPeer::new(addr, false, String::new());
    peer.options.connection_timeout = Some(limits.connect_timeout);
    peer.options.read_timeout = Some(limits.read_timeout);
    peer.options.write_timeout = Some(limits.write_timeout);
    peer.options.idle_timeout = Some(limits.pool_idle_timeout);
    peer
}

/// Nothing reached the node: the breaker hears of it and the next candidate with a seat is
/// tried (Ok), or there is none and the request is unreachable (Err).
fn failed_to_connect(fleet: &Fleet, d: &Dispatch, e: Box<Error>) -> Result<()> {
    let (failed_idx, failed) = {
        let c = d.choice();
        (c.node, c.node_id.clone())
    };
    fleet.record_outcome(failed_idx, None, crate::fleet::Outcome::Fault, now_ms());
    d.state.lock().error = Some(format!(
        "cannot connect to node {failed} ({})",
        e.etype().as_str()
    ));
    match d.next_attempt(|c| fleet.try_lease(c.node, &c.model)) {
        Some(_) => {
            METRICS.retries.with_label_values(&[&failed]).inc();
            Ok(())
        }
        None => {
            d.state.lock().unreachable = true;
            Err(e.into_up())
        }
    }
}

/// What a failed exchange leaves in `d`: a node error marks the attempt as the node's fault.
fn failed(d: &Dispatch, e: &Error) {
    let mut st = d.state.lock();
    st.upstream_error |= *e.esource() == ErrorSource::Upstream;
    if st.error.is_none() || st.status.is_some() {
        st.error = Some(e.to_string());
    }
}

/// The request as the node sees it: HTTP/1.1, the (possibly translated) body's length, its
/// host, no fleet or hop-by-hop headers, and no client key when the gateway authenticates.
fn upstream_request(
    client: &RequestHeader,
    fleet: &Fleet,
    d: &Dispatch,
    body_len: usize,
) -> Result<RequestHeader> {
    // Without the client's header-name case (a node reads names case-insensitively), with room
    // for what is added below: one map, sized once, where a clone kept two (values and case)
    // and doubled both on the first insert. The node connection holds it for the whole reply.
    let mut parts = client.as_owned_parts();
    parts.headers.reserve(3);
    let mut h = RequestHeader::from(parts);
    h.set_version(Version::HTTP_11);
    for name in HOP_BY_HOP.iter().chain(&FLEET_REQUEST_HEADERS) {
        h.remove_header(*name);
    }
    h.insert_header("content-length", body_len.to_string())?;
    // The gateway answered `100 Continue` itself; the node gets the whole body at once.
    h.remove_header("expect");
    xlate::upstream_header(&mut h, d)?;
    h.insert_header("host", fleet.node_config(d.choice().node).host.as_str())?;
    // With `auth:` on, the client's key is the gateway's credential: no node sees it (nor
    // any log line that prints what is sent upstream). Without it, keys pass through.
    if fleet.config().tenancy.auth_enabled() {
        h.remove_header("authorization");
        h.remove_header("x-api-key");
    }
    Ok(h)
}

/// How many `X-Fleet-*` headers a response gets at most (`Exchange::response_header`).
const FLEET_RESPONSE_HEADERS: usize = 9;

/// `resp` without its header-name case map (a client reads names case-insensitively), with
/// room for `extra` more headers. The client's session holds the header for the whole reply:
/// two maps (values and case), each doubled by the gateway's first insert, were ~2.4 KB of an
/// open stream's ~32.
fn without_case(resp: Box<ResponseHeader>, extra: usize) -> Result<Box<ResponseHeader>> {
    let reason = resp.get_reason_phrase().map(str::to_owned);
    let mut parts = http::response::Parts::from(*resp);
    parts.headers.reserve(extra);
    let mut resp = Box::new(ResponseHeader::from(parts));
    resp.set_reason_phrase(reason.as_deref())?;
    Ok(resp)
}

/// One request/response exchange on one node connection.
struct Exchange<'a> {
    h1: &'a mut HttpSession,
    d: &'a Dispatch,
    fleet: &'a Fleet,
    translator: Option<ResponseTranslator>,
    /// `d`'s body let go of (`Dispatch::release_body`).
    body_released: bool,
}

impl Exchange<'_> {
    async fn run<F>(
        &mut self,
        session: &mut Session,
        req: Box<RequestHeader>,
        body: Bytes,
        deliver: &mut F,
    ) -> Result<()>
    where
        F: FnMut(HttpTask) -> Result<Option<HttpTask>>,
    {
        self.h1
            .write_request_header(req)
            .await
            .map_err(Error::into_up)?;
        if !body.is_empty() {
            self.h1.write_body(&body).await.map_err(Error::into_up)?;
        }
        drop(body);
        self.h1.finish_body().await.map_err(Error::into_up)?;
        let head_request = session.req_header().method == http::Method::HEAD;
        let mut ended = false;
        while !ended {
            let first = self.h1.read_response_task().await.map_err(Error::into_up)?;
            let mut tasks = Vec::with_capacity(2);
            ended = self.take(first, head_request, deliver, &mut tasks)?;
            // What the node already sent goes to the client in one write, also when the node
            // broke off right after it.
            let mut broke = None;
            while !ended {
                let more = tokio::task::unconstrained(self.h1.read_response_task()).now_or_never();
                match more {
                    None => break,
                    Some(Ok(t)) => ended = self.take(t, head_request, deliver, &mut tasks)?,
                    Some(Err(e)) => {
                        broke = Some(e.into_up());
                        break;
                    }
                }
            }
            if !tasks.is_empty() {
                Box::pin(session.write_response_tasks(tasks))
                    .await
                    .map_err(|e| e.into_down())?;
                // The reply has begun reaching the client: the request never moves now.
                if !self.body_released {
                    self.body_released = true;
                    self.d.release_body();
                }
            }
            if let Some(e) = broke {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Run the response hooks on one part of the node's response and pass it to `deliver`;
    /// what is to be written now is pushed to `out`. Whether the response has ended.
    fn take<F>(
        &mut self,
        t: HttpTask,
        head_request: bool,
        deliver: &mut F,
        out: &mut Vec<HttpTask>,
    ) -> Result<bool>
    where
        F: FnMut(HttpTask) -> Result<Option<HttpTask>>,
    {
        let t = match t {
            // A node's own `100 Continue` (the client had its 100 from the gateway).
            HttpTask::Header(h, _) if h.status.is_informational() => return Ok(false),
            HttpTask::Header(h, end) => {
                let mut h = without_case(h, FLEET_RESPONSE_HEADERS)?;
                chunk_if_close_delimited(&mut h, head_request, end)?;
                self.response_header(&mut h)?;
                HttpTask::Header(h, end)
            }
            HttpTask::Body(mut b, end) => {
                self.response_body(&mut b, end);
                HttpTask::Body(b, end)
            }
            t => t,
        };
        let end = t.is_end();
        if let Some(t) = deliver(t)? {
            out.push(t);
        }
        Ok(end)
    }

    /// The node's response header: what routing did, in `X-Fleet-*`; the start of a
    /// translation when the node speaks another protocol.
    fn response_header(&mut self, resp: &mut ResponseHeader) -> Result<()> {
        let d = self.d;
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
        resp.insert_header(super::NODE_HEADER, c.node_id.as_str())?;
        resp.insert_header(super::SERVED_MODEL_HEADER, c.model.as_str())?;
        resp.insert_header(super::REQUESTED_MODEL_HEADER, d.requested_model.as_str())?;
        let fallback = if c.fallback { "true" } else { "false" };
        resp.insert_header(super::FALLBACK_HEADER, fallback)?;
        resp.insert_header(super::RETRIES_HEADER, retries.to_string())?;
        // Spec mode: points to a tenth; completion mode: minus the predicted seconds, to the ms
        // (`+ 0.0` turns a -0.0 into 0.0).
        let score = match c.predicted_s {
            None => format!("{:.1}", c.score + 0.0),
            Some(_) => format!("{:.3}", c.score + 0.0),
        };
        resp.insert_header(super::SCORE_HEADER, score)?;
        resp.insert_header(
            super::QUEUE_WAIT_HEADER,
            d.queue_wait.as_millis().to_string(),
        )?;
        if let Some(kind) = super::affinity_label(d.affinity) {
            resp.insert_header(super::AFFINITY_HEADER, kind)?;
        }
        self.translator = xlate::response_header(resp, d, now_ms() / 1000)?;
        Ok(())
    }

    /// A body part of the node's response: first byte, activity, the reply observer; its
    /// translation when translating.
    fn response_body(&mut self, body: &mut Option<bytes::Bytes>, end: bool) {
        // An answer's first byte: its prompt is in the node's prefix cache from now
        // (`fleet::prefix`), told once the attempt's lock is let go.
        let mut prefilled = None;
        let mut came_in = None;
        // A stream began: the streams before it may have held long enough to show more seats.
        let mut decoding = None;
        if let Some(b) = body.as_ref() {
            let mut st = self.d.state.lock();
            if st.first_byte.is_none() && !b.is_empty() {
                st.first_byte = Some(Instant::now());
                // Only a test of learned seats reads when the node (or, of the model's own
                // seats, the pair) last freed one.
                let seat_test = self.d.ranked[st.current].seat_test.filter(|t| t.bound);
                let (sent_ms, seen) = (st.sent_ms, st.first_bytes_at_send);
                // An answer, not an error's body, shows the model in memory (to later ones).
                let answer = st.status.is_some_and(|s| (200..300).contains(&s));
                let choice = &self.d.ranked[st.current];
                let (joined_s, cold) = (st.load_under_way_s, self.d.cold(&st));
                if let Some(lease) = st.lease.as_mut() {
                    let now = now_ms();
                    // Another answer of its model that streamed first since its send.
                    let served = lease
                        .counters
                        .first_byte_after(seen)
                        .filter(|t| *t > sent_ms)
                        .map(|t| (t - sent_ms) as f64 / 1000.0);
                    lease.counters.first_byte(now, answer);
                    let ahead = lease.first_byte(now);
                    // A cold answer, the first of its model's to stream since its send: the
                    // model came in, and its load is read now, not at the answer's end (a
                    // whole reply's first byte is its end).
                    let first = answer && cold && self.d.stream && served.is_none();
                    if let Some(prefill_s) = choice.predicted_prefill_s.filter(|_| first) {
                        let first_s = now.saturating_sub(sent_ms) as f64 / 1000.0;
                        let counters = lease.counters.clone();
                        came_in = Some((choice, counters, first_s, joined_s, prefill_s));
                    }
                    if self.d.stream {
                        lease.start_decoding(now);
                        decoding = Some((choice.node, &choice.model));
                    }
                    let freed = seat_test.map(|t| {
                        if t.own {
                            lease.pair_last_end_ms()
                        } else {
                            lease.node_last_end_ms()
                        }
                    });
                    st.seat_freed_s = freed
                        .filter(|f| *f > sent_ms)
                        .map(|f| (f - sent_ms) as f64 / 1000.0);
                    st.prefill_ahead_s = ahead;
                    st.served_meanwhile_s = served;
                }
                if answer {
                    prefilled = Some(&self.d.ranked[st.current]);
                }
            }
            st.body_bytes += b.len();
            st.last_activity = Some(Instant::now());
            st.observer.feed(b);
            if self.d.stream {
                if let Some(lease) = st.lease.as_ref() {
                    lease.streamed(st.observer.chunks(), now_ms());
                }
            }
        }
        // (Not on a node that hides its loads: cold there only before its first poll.)
        let came_in = came_in.filter(|(c, ..)| {
            let view = self.fleet.view();
            view.nodes.get(c.node).is_some_and(|n| !n.hides_loads)
        });
        if let Some((c, counters, first_s, joined_s, prefill_s)) = came_in {
            let mut rates = counters.rates.lock();
            let changed = rates.came_in(first_s, joined_s, prefill_s);
            let load_s = rates.load_s();
            drop(rates);
            log::debug!(
                target: "fleetgate::learn",
                "{} {}: came in, first byte {first_s:.3} s after its send, {joined_s:.3} s into the load, prefill {prefill_s:.3} s: load {load_s:?}",
                c.node_id,
                c.model,
            );
            if changed {
                // The node's read speed (`learned_load_gbps`) and its peers' follow.
                self.fleet.publish();
            }
        }
        if let Some((node, model)) = decoding {
            self.fleet.publish_seats_seen(node, model, now_ms());
        }
        if let Some(c) = prefilled {
            // The system prompt's key is the primary model's: a fallback's cache is another.
            let system = self.d.learn.shared_key.filter(|_| !c.fallback);
            self.fleet
                .prefixes
                .prefilled(c.node, &c.model, system, now_ms());
        }
        if let Some(x) = self.translator.as_mut() {
            xlate::body(x, body, end);
        }
    }
}

/// A node that ends its body by closing the connection (HTTP/1.0 style): the client gets it
/// chunked, so its connection can be kept.
fn chunk_if_close_delimited(h: &mut ResponseHeader, head_request: bool, end: bool) -> Result<()> {
    let no_body = head_request || matches!(h.status.as_u16(), 204 | 304);
    if !no_body
        && !end
        && h.headers.get("transfer-encoding").is_none()
        && h.headers.get("content-length").is_none()
    {
        h.set_version(Version::HTTP_11);
        h.insert_header("transfer-encoding", "chunked")?;
    }
    Ok(())
}
