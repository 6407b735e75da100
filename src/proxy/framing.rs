//! How a node's response is framed for the client: node errors that are not JSON (a plain-text
//! 404, a bare 431) re-sent in the client's error shape, and HTTP/1.0 clients served a
//! close-delimited body (chunked encoding does not exist in HTTP/1.0).

use std::sync::Arc;

use bytes::Bytes;
use http::Version;
use pingora::http::ResponseHeader;
use pingora::Result;
use pingora_core::protocols::http::HttpTask;

use super::dispatch::Dispatch;
use crate::protocol::{self, ErrorCode};

/// Most of a node's error text quoted in the reshaped error.
const QUOTE: usize = 200;

/// The gateway's code for a node's error status.
fn code_for(status: u16) -> ErrorCode {
    match status {
        404 => ErrorCode::NotFound,
        408 => ErrorCode::RequestTimeout,
        413 | 431 => ErrorCode::RequestTooLarge,
        401 | 403 => ErrorCode::Unauthorized,
        429 => ErrorCode::QueueFull,
        400..=499 => ErrorCode::InvalidRequest,
        _ => ErrorCode::UpstreamError,
    }
}

/// A node's error response whose body is not JSON (a plain-text 404, an empty 431).
fn needs_reshape(h: &ResponseHeader) -> bool {
    h.status.as_u16() >= 400
        && !h
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains("json"))
}

/// What the client leg does with each part of the node's response on its way to the client:
/// a non-JSON error is held back (its text kept in `reshape`, answered by `reshaped_error`),
/// HTTP/1.0 clients get a close-delimited body.
pub fn client_filter(
    d: Arc<Dispatch>,
    http10: bool,
) -> impl FnMut(HttpTask) -> Result<Option<HttpTask>> {
    let mut holding = false;
    move |t| match t {
        HttpTask::Header(h, _) if needs_reshape(&h) => {
            holding = true;
            d.state.lock().reshape = Some(String::new());
            Ok(None)
        }
        HttpTask::Body(b, _) if holding => {
            let mut st = d.state.lock();
            if let (Some(text), Some(b)) = (st.reshape.as_mut(), b) {
                let room = QUOTE.saturating_sub(text.chars().count());
                let s = String::from_utf8_lossy(&b);
                text.extend(s.chars().filter(|c| !c.is_control()).take(room));
            }
            Ok(None)
        }
        _ if holding => Ok(None),
        t if http10 => Ok(Some(for_http10(t))),
        t => Ok(Some(t)),
    }
}

/// The native error for a node error held back by `client_filter`: (status, body).
pub fn reshaped_error(d: &Dispatch) -> Option<(u16, Bytes)> {
    let st = d.state.lock();
    let text = st.reshape.as_ref()?;
    let status = st.upstream_status.unwrap_or(502);
    let node = &d.ranked[st.current].node_id;
    let said = text.trim();
    let msg = if said.is_empty() {
        format!("node {node} answered {status}")
    } else {
        format!("node {node} answered {status}: {said}")
    };
    let body = protocol::error_body(d.endpoint.family(), code_for(status), &msg);
    Some((status, body))
}

/// The response as an HTTP/1.0 client must get it: no chunked encoding (the body ends when
/// the connection closes).
pub fn for_http10(t: HttpTask) -> HttpTask {
    match t {
        HttpTask::Header(mut h, end) => {
            if h.headers.get("content-length").is_none() {
                h.remove_header("transfer-encoding");
                let _ = h.insert_header("connection", "close");
            }
            h.set_version(Version::HTTP_10);
            HttpTask::Header(h, end)
        }
        t => t,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_node_status() {
        assert_eq!(code_for(404), ErrorCode::NotFound);
        assert_eq!(code_for(431), ErrorCode::RequestTooLarge);
        assert_eq!(code_for(422), ErrorCode::InvalidRequest);
        assert_eq!(code_for(500), ErrorCode::UpstreamError);
    }

    #[test]
    fn http10_gets_a_close_delimited_body() {
        let mut h = ResponseHeader::build(200, None).unwrap();
        h.insert_header("transfer-encoding", "chunked").unwrap();
        let HttpTask::Header(h, _) = for_http10(HttpTask::Header(Box::new(h), false)) else {
            panic!("a header stays a header");
        };
        assert!(h.headers.get("transfer-encoding").is_none());
        assert_eq!(h.headers["connection"], "close");
        assert_eq!(h.version, Version::HTTP_10);
    }
}
