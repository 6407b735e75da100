//! A pooled upstream connection the node had already closed (servers that advertise
//! keep-alive and close after a streamed response, e.g. llama.cpp): the request failed before
//! any response byte, so nothing reached the node; it is sent again on a fresh connection.

use pingora::{Error, ErrorType};

use super::dispatch::Dispatch;

/// Attempts repeated this way per request, at most.
pub const MAX_STALE_RETRIES: u32 = 2;

/// Whether the failed attempt is repeated: the connection was reused (the body is in memory,
/// so it can be sent again), no response has begun, and the error is the connection closing or failing on
/// read/write. Counts the repeat.
pub fn retry(d: &Dispatch, e: &Error, reused: bool) -> bool {
    if !reused {
        return false;
    }
    let closed = matches!(
        e.etype(),
        ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError
    );
    let mut st = d.state.lock();
    if !closed || st.status.is_some() || st.first_byte.is_some() {
        return false;
    }
    if st.stale_retries >= MAX_STALE_RETRIES {
        return false;
    }
    st.stale_retries += 1;
    log::debug!(
        "node {}: pooled connection was closed ({}); sending again on a new connection",
        d.ranked[st.current].node_id,
        e.etype().as_str()
    );
    true
}
