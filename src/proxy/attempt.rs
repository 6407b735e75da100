//! One attempt of a dispatched request: the node leg to the chosen node (`leg.rs`), watched for
//! its first byte, for stalls between chunks and for the node going offline (`watch.rs`). Non-streaming
//! replies are held until complete, so a reply cut mid-body never reaches the client as a
//! clean 200: it is retried elsewhere, or answered with an error.

use std::sync::Arc;
use std::time::Instant;

use pingora::{Error, ErrorType, Result};
use pingora_core::connectors::http::v1::Connector;
use pingora_core::protocols::http::HttpTask;
use pingora_proxy::Session;

use super::dispatch::Dispatch;
use super::{framing, leg, respond, watch};
use crate::fleet::Fleet;
use crate::protocol::{self, ErrorCode};

/// How an attempt ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The client has its answer: whole, or a stream ended with its protocol's error event.
    Answered,
    /// Nothing reached the client: the request may go to another node.
    Unsent,
}

enum Piped {
    Done(Result<(), Box<Error>>),
    Stalled(String),
}

/// Send `d`'s current choice its request and pipe (or hold, then write) the response; the
/// node's connection goes back to the pool after the client has the answer.
///
/// This future lives as long as the client's request (an open stream holds it for minutes),
/// so what only the end needs is boxed: the spare connection (~1.2 KB, none while the reply
/// runs) and the pool's release (~4.5 KB); unboxed they sized it at ~5.7 KB instead of ~3.7.
pub async fn run(
    session: &mut Session,
    fleet: &Fleet,
    nodes: &Connector,
    d: &Arc<Dispatch>,
) -> Result<Ended> {
    let mut spare = None;
    let ended = answer(session, fleet, nodes, d, &mut spare).await;
    if let Some(s) = spare {
        Box::pin(s.release(fleet, nodes)).await;
    }
    ended
}

/// `run`, leaving a node connection whose response was read whole in `spare`.
async fn answer(
    session: &mut Session,
    fleet: &Fleet,
    nodes: &Connector,
    d: &Arc<Dispatch>,
    spare: &mut Option<Box<leg::Spare>>,
) -> Result<Ended> {
    let cap = fleet.config().limits.max_body_bytes;
    let mut held: Vec<HttpTask> = Vec::new();
    let mut held_bytes = 0usize;
    let stream = d.stream;
    let http10 = session.req_header().version == http::Version::HTTP_10;
    if http10 {
        session.set_keepalive(None);
    }
    // Non-JSON node errors are held back for `reshaped_error`; HTTP/1.0 gets no chunking.
    let mut frame = framing::client_filter(d.clone(), http10);
    // Whole replies are held; so is a stream's 400/413 answer (small), which may be the node's
    // context overflow: a routing miss to re-place, not the client's error.
    let mut hold = !stream;
    let mut filter = |t: HttpTask| -> Result<Option<HttpTask>> {
        let Some(t) = frame(t)? else {
            return Ok(None);
        };
        if let HttpTask::Header(h, _) = &t {
            hold |= matches!(h.status.as_u16(), 400 | 413);
        }
        if !hold {
            return Ok(Some(t));
        }
        if let HttpTask::Body(Some(b), _) = &t {
            held_bytes += b.len();
            if held_bytes > cap {
                return Error::e_explain(
                    ErrorType::InternalError,
                    format!("non-streaming reply larger than {cap} bytes"),
                );
            }
        }
        held.push(t);
        Ok(None)
    };
    let piped = {
        let leg = leg::run(session, fleet, nodes, d, &mut filter);
        tokio::select! {
            r = leg => Piped::Done(r.map(|s| *spare = Some(Box::new(s)))),
            why = watch::stalled(fleet, d, Instant::now()) => Piped::Stalled(why),
        }
    };
    if let Piped::Done(Ok(())) = &piped {
        if let Some((status, body)) = framing::reshaped_error(d) {
            let node = Some(d.choice().node_id.as_str());
            d.state.lock().body_bytes = body.len();
            respond::json_from(session, status, body, None, node).await?;
            return Ok(Ended::Answered);
        }
    }
    match piped {
        Piped::Done(Err(e)) if stream && *e.esource() == pingora::ErrorSource::Downstream => {
            // The client went away: not the node's fault, and nobody to tell.
            note(d, "client closed the connection".into());
            Ok(Ended::Answered)
        }
        Piped::Done(Ok(())) if stream && held.is_empty() => Ok(Ended::Answered),
        Piped::Done(Ok(())) => {
            if d.state.lock().upstream_error || !complete(&held) {
                note(d, "the node's reply ended before it was complete".into());
                return Ok(Ended::Unsent);
            }
            if let Some(o) = overflowed(d) {
                note(
                    d,
                    format!(
                        "node {} answered a context overflow (prompt {} tokens, window {})",
                        d.choice().node_id,
                        o.prompt_tokens.map_or("?".into(), |n| n.to_string()),
                        o.window.map_or("?".into(), |n| n.to_string()),
                    ),
                );
                d.state.lock().overflow = Some(o);
                return Ok(Ended::Unsent);
            }
            session.write_response_tasks(held).await?;
            Ok(Ended::Answered)
        }
        Piped::Done(Err(e)) => {
            note(d, e.to_string());
            if !stream || !held.is_empty() {
                return Ok(Ended::Unsent);
            }
            end_stream_if_begun(session, d).await
        }
        Piped::Stalled(why) => {
            {
                let mut st = d.state.lock();
                st.upstream_error = true;
                st.error = Some(why);
            }
            end_stream_if_begun(session, d).await
        }
    }
}

/// The node's held answer was a context overflow (400/413 in one of the wordings servers use).
fn overflowed(d: &Dispatch) -> Option<super::overflow::Overflow> {
    let st = d.state.lock();
    if !matches!(st.upstream_status, Some(400 | 413)) {
        return None;
    }
    super::overflow::parse(st.observer.head())
}

/// A held response is complete when its last task ends it.
fn complete(held: &[HttpTask]) -> bool {
    matches!(held.first(), Some(HttpTask::Header(..))) && held.iter().any(HttpTask::is_end)
}

fn note(d: &Dispatch, err: String) {
    let mut st = d.state.lock();
    if st.error.is_none() {
        st.error = Some(err);
    }
}

/// A stream whose response began cannot move: end it with the protocol's error event.
async fn end_stream_if_begun(session: &mut Session, d: &Dispatch) -> Result<Ended> {
    if session.response_written().is_none() {
        return Ok(Ended::Unsent);
    }
    let err = {
        let mut st = d.state.lock();
        st.code = Some(ErrorCode::UpstreamError);
        st.error.clone().unwrap_or_default()
    };
    if d.stream {
        let msg = format!("node {} failed mid-stream: {err}", d.choice().node_id);
        let chunk = protocol::stream_error_chunk(d.endpoint, ErrorCode::UpstreamError, &msg);
        let _ = session.write_response_body(Some(chunk), true).await;
    } else {
        // Never a clean end for a cut body: the client must notice.
        session.set_keepalive(None);
        return Error::e_explain(ErrorType::ConnectionClosed, "non-streaming reply cut");
    }
    Ok(Ended::Answered)
}

/// Answer a request that nothing was sent to the client for, after its last attempt: the
/// client's own `context_length_exceeded` when the node refused the prompt for its window
/// (and no other window fits), else why no node served it.
pub async fn answer_unsent(session: &mut Session, d: &Dispatch, also: Option<&str>) -> Result<()> {
    let (unreachable, overflow, err) = {
        let st = d.state.lock();
        (
            st.unreachable,
            st.overflow,
            st.error.clone().unwrap_or_else(|| "upstream failed".into()),
        )
    };
    let node = &d.choice().node_id;
    let also = also.map(|a| format!("; {a}")).unwrap_or_default();
    let (code, msg) = match overflow {
        Some(o) => {
            let counted = o
                .prompt_tokens
                .map_or(String::new(), |n| format!(" counted {n} prompt tokens and"));
            let window = o
                .window
                .map_or(String::new(), |n| format!(" of {n} tokens"));
            (
                ErrorCode::ContextLengthExceeded,
                format!("the prompt does not fit: node {node}{counted} refused it for its window{window}{also}"),
            )
        }
        None if unreachable => (
            ErrorCode::NoProviderAvailable,
            format!("no node could be reached: {err}{also}"),
        ),
        None => (
            ErrorCode::UpstreamError,
            format!("node {node} failed: {err}{also}"),
        ),
    };
    answer_error(session, d, code, &msg).await
}

/// Answer `code` in the client's protocol shape for a dispatched request (nothing of the
/// node's reply was sent), naming the node in `X-Fleet-Node` and keeping the outcome in `d`.
pub async fn answer_error(
    session: &mut Session,
    d: &Dispatch,
    code: ErrorCode,
    msg: &str,
) -> Result<()> {
    let body = protocol::error_body(d.endpoint.family(), code, msg);
    {
        let mut st = d.state.lock();
        st.status = Some(code.status());
        st.code = Some(code);
        st.body_bytes = body.len();
    }
    let node = Some(d.choice().node_id.as_str());
    respond::json_from(
        session,
        code.status(),
        body,
        respond::retry_after(code),
        node,
    )
    .await
}
