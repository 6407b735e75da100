//! The decision for one request, shared between the client-facing request and the subrequest
//! that carries it upstream (the subrequest is how a fully-read body of any size is replayed).

use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::fleet::Lease;
use crate::protocol::{Endpoint, ErrorCode};
use crate::routing::{AffinityKind, Choice};

/// What the client-facing request hands to its subrequest.
#[derive(Debug)]
pub struct Dispatch {
    pub endpoint: Endpoint,
    pub requested_model: String,
    /// What conversation affinity did for this request.
    pub affinity: AffinityKind,
    /// Winner first, then same-model runners-up for failover.
    pub ranked: Vec<Choice>,
    pub body: Bytes,
    pub started: Instant,
    /// Time spent in the holding and node:model queues before dispatch.
    pub queue_wait: std::time::Duration,
    /// The client asked for a stream (SSE / NDJSON).
    pub stream: bool,
    pub max_retries: u32,
    /// Prompt text characters and fixed (per-message/image) tokens, for calibration.
    pub prompt_chars: usize,
    pub prompt_fixed_tokens: u32,
    pub state: Mutex<Attempts>,
}

/// Where the request is and what happened to it so far.
#[derive(Debug, Default)]
pub struct Attempts {
    /// Index into `ranked` of the current attempt.
    pub current: usize,
    /// Indexes into `ranked` already tried.
    pub tried: Vec<usize>,
    pub retries: u32,
    pub lease: Option<Lease>,
    pub status: Option<u16>,
    pub first_byte: Option<Instant>,
    /// The error that ended the attempt(s), when the upstream failed.
    pub error: Option<String>,
    /// Every attempt failed to connect: nothing reached any node.
    pub unreachable: bool,
    /// Response body bytes sent to the client.
    pub body_bytes: usize,
    /// Status the node answered with (the gateway's own error statuses are not in it).
    pub upstream_status: Option<u16>,
    /// The node broke off or timed out (not a client disconnect).
    pub upstream_error: bool,
    /// Token counting and `usage` of the response body.
    pub observer: super::observe::StreamObserver,
    /// The error the gateway answered with after the upstream failed.
    pub code: Option<ErrorCode>,
}

impl Dispatch {
    pub fn choice(&self) -> &Choice {
        let i = self.state.lock().current;
        &self.ranked[i]
    }

    /// Move to the next candidate not yet tried; None when there is none or retries are spent.
    pub fn next_attempt(&self) -> Option<usize> {
        let mut st = self.state.lock();
        if st.retries >= self.max_retries {
            return None;
        }
        let cur = st.current;
        st.tried.push(cur);
        let next = (0..self.ranked.len()).find(|i| !st.tried.contains(i))?;
        st.current = next;
        st.retries += 1;
        Some(next)
    }
}
