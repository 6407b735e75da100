//! Answers the gateway writes itself: native protocol errors and local JSON endpoints.

use bytes::Bytes;
use pingora::http::ResponseHeader;
use pingora::Result;
use pingora_proxy::Session;

use crate::protocol::{self, ErrorCode, Family};

/// Seconds a client should wait before retrying a 503 / 429.
pub const RETRY_AFTER_S: u32 = 2;

/// Write a complete JSON response.
pub async fn json(
    session: &mut Session,
    status: u16,
    body: Bytes,
    retry_after: Option<u32>,
) -> Result<()> {
    json_full(session, status, body, retry_after, None, &[]).await
}

/// Write a complete JSON response about a request that went to `node` (`X-Fleet-Node`).
pub async fn json_from(
    session: &mut Session,
    status: u16,
    body: Bytes,
    retry_after: Option<u32>,
    node: Option<&str>,
) -> Result<()> {
    json_full(session, status, body, retry_after, node, &[]).await
}

/// Write a complete JSON response with extra headers (e.g. `x-ratelimit-*`).
pub async fn json_with(
    session: &mut Session,
    status: u16,
    body: Bytes,
    retry_after: Option<u32>,
    extra: &[(&'static str, String)],
) -> Result<()> {
    json_full(session, status, body, retry_after, None, extra).await
}

async fn json_full(
    session: &mut Session,
    status: u16,
    body: Bytes,
    retry_after: Option<u32>,
    node: Option<&str>,
    extra: &[(&'static str, String)],
) -> Result<()> {
    let mut h = ResponseHeader::build(status, Some(5 + extra.len()))?;
    if let Some(n) = node {
        h.insert_header(super::NODE_HEADER, n)?;
    }
    h.insert_header("content-type", "application/json")?;
    h.insert_header("content-length", body.len().to_string())?;
    if let Some(s) = retry_after {
        h.insert_header("retry-after", s.to_string())?;
    }
    for (name, value) in extra {
        h.insert_header(*name, value.as_str())?;
    }
    let head = session.req_header().method == http::Method::HEAD;
    session.write_response_header(Box::new(h), head).await?;
    if !head {
        session.write_response_body(Some(body), true).await?;
    }
    Ok(())
}

/// Write an error in the client's protocol shape, with `Retry-After` where the code calls for it.
pub async fn error(
    session: &mut Session,
    family: Family,
    code: ErrorCode,
    message: &str,
) -> Result<()> {
    json(
        session,
        code.status(),
        protocol::error_body(family, code, message),
        retry_after(code),
    )
    .await
}

/// `Retry-After` seconds for the codes that call for it.
pub fn retry_after(code: ErrorCode) -> Option<u32> {
    matches!(
        code,
        ErrorCode::NoProviderAvailable | ErrorCode::QueueFull | ErrorCode::Overloaded
    )
    .then_some(RETRY_AFTER_S)
}

/// The protocol family a path belongs to, for errors on requests that did not parse.
pub fn family_of_path(path: &str) -> Family {
    if path.starts_with("/api/") {
        Family::Ollama
    } else if path.starts_with("/v1/messages") {
        Family::Anthropic
    } else {
        Family::OpenAI
    }
}

/// Answer a client request that failed before any response (the request could not be read):
/// 400 in the client's shape (in the client leg only reading the client's request can fail;
/// node trouble is handled by the node leg), 502 for anything from a node.
/// Returns the status (the client may already be gone: then nothing is written).
pub async fn client_leg_failure(session: &mut Session, e: &pingora::Error) -> u16 {
    let family = family_of_path(session.req_header().uri.path());
    let (code, msg) = if *e.esource() == pingora::ErrorSource::Upstream {
        (ErrorCode::UpstreamError, e.to_string())
    } else {
        (ErrorCode::InvalidRequest, format!("malformed request: {e}"))
    };
    session.set_keepalive(None);
    let _ = error(session, family, code, &msg).await;
    code.status()
}
