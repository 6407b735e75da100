//! The decision for one request and what its attempts found out, shared by the client leg,
//! the node leg (`leg.rs`) and the watchdog (`watch.rs`).

use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::fleet::Lease;
use crate::protocol::{Endpoint, ErrorCode};
use crate::routing::{AffinityKind, Choice};

/// What the client leg decided for a request, and what its attempts found out.
#[derive(Debug)]
pub struct Dispatch {
    pub endpoint: Endpoint,
    /// What the node is sent: `endpoint`, or its translation when the node does not speak it.
    pub upstream: Endpoint,
    pub requested_model: String,
    /// What conversation affinity did for this request.
    pub affinity: AffinityKind,
    /// Winner first, then same-model runners-up for failover.
    pub ranked: Vec<Choice>,
    /// The request body; see [`Body`].
    pub body: Mutex<Body>,
    pub started: Instant,
    /// Time spent in the holding and node:model queues before dispatch.
    pub queue_wait: std::time::Duration,
    /// The client asked for a stream (SSE / NDJSON).
    pub stream: bool,
    pub max_retries: u32,
    /// Prompt text characters and fixed (per-message/image) tokens, for calibration.
    pub prompt_chars: usize,
    pub prompt_fixed_tokens: u32,
    /// What the rate learner and the prefix memory read after the response.
    pub learn: LearnInput,
    pub state: Mutex<Attempts>,
}

/// A request's body: as this attempt sends it (the model rewritten for a fallback, the output
/// budget clamped, translated for the node's protocol) and as the client sent it (for the
/// next attempt's dispatch). Both go once the reply has begun reaching the client (the request
/// never moves after that), so an open stream does not hold its prompt, often the largest part
/// of what it holds, for its whole length.
#[derive(Debug, Default)]
pub struct Body {
    sent: Option<Bytes>,
    asked: Option<Bytes>,
}

impl Body {
    pub fn new(sent: Bytes, asked: Bytes) -> Body {
        Body {
            sent: Some(sent),
            asked: Some(asked),
        }
    }
}

/// The request's side of what a response teaches (`outcome::account`).
#[derive(Debug, Clone, Default)]
pub struct LearnInput {
    /// Conversation key (header or prefix): the prefix memory is keyed by it.
    pub affinity_key: Option<u64>,
    /// Estimated prompt tokens, and those credited as cached (on `cached_on`, else on the
    /// rendezvous node: where affinity matched).
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub cached_on: Option<String>,
    /// The system prompt's key, its tokens, the nodes remembered holding it within their
    /// cache's reach (`RouteRequest::shared_on`: routing credited it on those with a seat
    /// free), and every node remembered serving it with its prompts since
    /// (`RouteRequest::shared_seen`).
    pub shared_key: Option<u64>,
    pub shared_tokens: u32,
    pub shared_on: Vec<String>,
    pub shared_seen: Vec<(usize, u64)>,
    /// Requests in flight on the node when this one was sent (itself included).
    pub concurrency: u32,
    /// The output tokens the request allowed (`max_tokens`, `num_predict` ...), if it said.
    pub max_output_tokens: Option<u32>,
}

impl LearnInput {
    /// The prompt tokens `c`'s node was credited as holding, when it was credited with any:
    /// the conversation on the node this gateway saw serve it (not a first turn's rendezvous
    /// credit), or the shared system prompt where routing credited it.
    pub fn credited(&self, c: &Choice) -> Option<u32> {
        let conversation =
            (self.cached_on.as_deref() == Some(c.node_id.as_str())).then_some(self.cached_tokens);
        let shared = self.shared_credited(c).then_some(self.shared_tokens);
        conversation.max(shared)
    }

    /// Routing counted the shared system prompt as cached on `c` (`decide::add_cached_prefix`:
    /// a node remembered holding it, a seat free, the primary model). A conversation's own
    /// credit can be as large on a busy node: a predicted seat wait (or none known) says the
    /// system prompt's was not given.
    pub fn shared_credited(&self, c: &Choice) -> bool {
        self.shared_tokens > 0
            && !c.fallback
            && c.predicted_wait_s().is_some_and(|w| w <= 1e-3)
            && c.cached_tokens >= self.shared_tokens
            && self.shared_on.contains(&c.node_id)
    }
}

/// Where the request is and what happened to it so far.
#[derive(Debug, Default)]
pub struct Attempts {
    /// Index into `ranked` of the current attempt.
    pub current: usize,
    /// Indexes into `ranked` already tried.
    pub tried: Vec<usize>,
    /// Of those, the ones skipped for want of a free seat (never sent anything).
    pub skipped: Vec<usize>,
    pub retries: u32,
    pub lease: Option<Lease>,
    /// Seconds the current attempt waited for the request sent before it on the node to
    /// answer (`queue::prefill`); set at its first byte.
    pub prefill_ahead_s: Option<f64>,
    /// Mean streams decoding on the node while the current attempt's answer streamed, itself
    /// included (`queue::decoding`); set at its end.
    pub decode_streams: Option<f64>,
    /// When the current attempt was sent (ms).
    pub sent_ms: u64,
    /// Seconds from its send to the last end of a stream on the node before its first byte
    /// (`None`: none ended meanwhile): when it would have got a seat, had it waited for one.
    pub seat_freed_s: Option<f64>,
    /// How long the load the current attempt waits for had been under way at its send (0: it
    /// started it, or the model was loaded).
    pub load_under_way_s: f64,
    /// The current attempt was placed while its model was cold and sent after it came in (it
    /// waited for a seat meanwhile): it goes, and is learned from, as a warm one
    /// (`Dispatch::cold`).
    pub found_loaded: bool,
    /// Sent to join a load the node hides (`IdleExpect::joined`) and one was still under way
    /// when it went: only then does its answer say anything of that load.
    pub joined_hidden_load: bool,
    /// Seconds from the current attempt's send to the first byte of another answer of its
    /// model on the node that came before its own (`None`: none did): the model was in memory
    /// by then, so no load the attempt waited for lasted longer (what it waited past that, it
    /// waited for a seat).
    pub served_meanwhile_s: Option<f64>,
    /// The pair's first bytes counted at the current attempt's send, and its requests in
    /// flight then (itself included: more than one, the model was serving when it went, not
    /// swapped out; `outcome::stalled_first_token`).
    pub first_bytes_at_send: u64,
    pub pair_in_flight_at_send: u32,
    pub status: Option<u16>,
    pub first_byte: Option<Instant>,
    /// When the node last sent something (headers or a body chunk).
    pub last_activity: Option<Instant>,
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
    /// Attempts repeated because a pooled connection turned out closed by the node.
    pub stale_retries: u32,
    /// The output budget the gateway clamped the request to (`X-Fleet-Max-Tokens`).
    pub clamped_max_tokens: Option<u32>,
    /// The node answered an error that is not JSON: its text, kept to be re-sent in the
    /// client's error shape (`framing`).
    pub reshape: Option<String>,
    /// The node answered that the prompt overflows its window (held, not sent: a routing
    /// miss the request is re-placed for, `attempt::run`).
    pub overflow: Option<super::overflow::Overflow>,
}

impl Dispatch {
    /// What this attempt sends the node; `None` once the reply has begun reaching the client.
    pub fn sent_body(&self) -> Option<Bytes> {
        self.body.lock().sent.clone()
    }

    /// The body as the client sent it, for another attempt's dispatch; `None` once the reply
    /// has begun reaching the client.
    pub fn take_asked_body(&self) -> Option<Bytes> {
        self.body.lock().asked.take()
    }

    /// The reply has begun reaching the client: no attempt follows, the body is not needed.
    pub fn release_body(&self) {
        *self.body.lock() = Body::default();
    }

    /// Node ids of every candidate the request was sent to so far, the current one included
    /// (not those skipped for want of a seat).
    pub fn tried_nodes(&self) -> Vec<String> {
        let st = self.state.lock();
        let mut ids: Vec<String> = Vec::new();
        for i in st.tried.iter().chain(std::iter::once(&st.current)) {
            let id = &self.ranked[*i].node_id;
            if !st.skipped.contains(i) && !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        ids
    }

    /// The current attempt is sent: its seat's predicted end (completion mode) goes where
    /// routing reads when that seat frees, and its uncached prompt (the part credited as
    /// cached only on the node that holds it) into its node's prefill queue.
    pub fn start_prefill(&self, st: &mut Attempts) {
        st.prefill_ahead_s = None;
        st.decode_streams = None;
        st.seat_freed_s = None;
        let now_ms = crate::services::now_ms();
        st.sent_ms = now_ms;
        let choice = &self.ranked[st.current];
        st.joined_hidden_load = false;
        st.served_meanwhile_s = None;
        st.load_under_way_s = 0.0;
        st.found_loaded = false;
        if let Some(lease) = st.lease.as_mut() {
            lease.sent();
            let (first_bytes, pair_in_flight) = (
                lease.counters.first_bytes(),
                lease
                    .counters
                    .in_flight
                    .load(std::sync::atomic::Ordering::Relaxed),
            );
            // A request to a pair idle past the keep-alive, or displaced by another model, on a
            // node that hides its loads starts a spell in which later ones wait for the same
            // load (one placed while a request there was stalled starts it at that one's send,
            // if it is still stalled when this one goes), until the pair's
            // first byte (a whole reply's comes at its end: routing takes a spell past twice
            // the known load as over). One placed to join such a spell joins it if it is
            // still under way when the request goes (it may have waited for a seat
            // meanwhile), and starts none.
            let joined = match choice.idle {
                Some(idle) if idle.joined => match idle.stalled_since_ms {
                    Some(since) => lease.counters.hidden_load_stalled(since, now_ms),
                    None => lease.counters.hidden_load_join(now_ms),
                },
                Some(idle) => Some(lease.counters.hidden_load_sent(now_ms, idle.switch)),
                None => None,
            };
            st.joined_hidden_load = joined.is_some() && choice.idle.is_some_and(|i| i.joined);
            st.first_bytes_at_send = first_bytes;
            st.pair_in_flight_at_send = pair_in_flight;
            let cold_load = choice.cold.then(|| lease.counters.load_sent(now_ms));
            st.found_loaded = cold_load.is_some_and(|sent| sent.is_none());
            st.load_under_way_s = match cold_load {
                Some(sent) => sent.unwrap_or(0.0),
                None => joined.unwrap_or(0.0),
            };
            // Of the wait it was predicted, what it spent in the gateway's queue is over; the
            // rest it waits inside the node (a seat the gateway does not hold it for, the
            // node's prefill queue), before its first token and its end. A failover's attempt
            // goes later than its decision: only the first one is counted so.
            let wait_s = choice
                .predicted_wait_s()
                .filter(|_| st.current == 0)
                .map_or(0.0, |w| w.max(0.0));
            let passed_s = wait_s.min(self.queue_wait.as_secs_f64());
            // Placed cold, found in: none of the load it was predicted is left.
            let load_s = choice
                .predicted_load_s
                .filter(|_| st.found_loaded)
                .map_or(0.0, |l| l.max(0.0));
            match (choice.predicted_run_s, choice.predicted_s) {
                (Some(run_s), _) => {
                    let left_s = (run_s - load_s).max(0.0) + wait_s - passed_s;
                    lease.expect_end(now_ms.saturating_add((left_s * 1000.0) as u64))
                }
                (None, Some(_)) => lease.expect_unknown_end(choice.predicted_output_tokens),
                (None, None) => {}
            }
            // A request sent to a node whose seats were all taken tests them: a late first
            // token is its answer (it waited inside), not a stall.
            let judged = self.stream && choice.seat_test.is_none();
            let first = choice.predicted_first_s.map(|f| f - passed_s - load_s);
            if let Some(first_s) = first.filter(|_| judged) {
                lease.expect_first(
                    now_ms,
                    now_ms.saturating_add((first_s.max(0.0) * 1000.0) as u64),
                    (choice.predicted_miss_s * 1000.0) as u64,
                    choice.first_measured,
                );
            }
        }
        // Only a stream's first byte says when its prefill ended (a whole reply comes at the
        // end): a request that is not streamed is not counted in the queue.
        if !self.stream {
            return;
        }
        let l = &self.learn;
        let cached = l.credited(&self.ranked[st.current]).unwrap_or(0);
        let tokens = l.prompt_tokens.saturating_sub(cached);
        if let Some(lease) = st.lease.as_mut() {
            lease.start_prefill(tokens, now_ms);
        }
    }

    pub fn choice(&self) -> &Choice {
        let i = self.state.lock().current;
        &self.ranked[i]
    }

    /// The current attempt waits for its model to load: placed cold, and not sent after the
    /// model came in (`Attempts::found_loaded`).
    pub fn cold(&self, st: &Attempts) -> bool {
        self.ranked[st.current].cold && !st.found_loaded
    }

    /// What the current attempt may wait for of a load the node hides (`Choice::idle`): none
    /// for one placed to join such a load that was over when it went.
    pub fn hidden_load(&self, st: &Attempts) -> Option<crate::routing::IdleExpect> {
        self.ranked[st.current]
            .idle
            .filter(|i| !i.joined || st.joined_hidden_load)
    }

    /// Move to the next candidate not yet tried that `take` gives a seat; None when there is
    /// none or retries are spent. The failed attempt's seat is released first; candidates
    /// without a seat count as tried.
    pub fn next_attempt(&self, mut take: impl FnMut(&Choice) -> Option<Lease>) -> Option<usize> {
        let mut st = self.state.lock();
        let cur = st.current;
        st.tried.push(cur);
        st.lease = None;
        if st.retries >= self.max_retries {
            return None;
        }
        while let Some(next) = (0..self.ranked.len()).find(|i| !st.tried.contains(i)) {
            match take(&self.ranked[next]) {
                Some(lease) => {
                    st.current = next;
                    st.retries += 1;
                    st.lease = Some(lease);
                    self.start_prefill(&mut st);
                    return Some(next);
                }
                None => {
                    st.tried.push(next);
                    st.skipped.push(next);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::*;
    use crate::fleet::NodeState;

    fn choice(node: usize) -> Choice {
        Choice {
            node,
            node_id: format!("n{node}"),
            model: "m".into(),
            score: 0.0,
            fallback: false,
            cold: false,
            predicted_s: None,
            predicted_run_s: None,
            predicted_first_s: None,
            predicted_prefill_s: None,
            predicted_miss_s: 0.0,
            first_measured: false,
            predicted_load_s: None,
            predicted_output_tokens: None,
            cached_tokens: 0,
            seat_test: None,
            idle: None,
        }
    }

    #[test]
    fn a_shared_system_prompt_is_credited_only_where_routing_gave_it() {
        let learn = LearnInput {
            prompt_tokens: 3_000,
            shared_tokens: 2_000,
            shared_on: vec!["n1".into()],
            ..LearnInput::default()
        };
        let credited = |wait: f64, cached: u32, fallback: bool| Choice {
            predicted_s: Some(1.0 + wait),
            predicted_run_s: Some(1.0),
            cached_tokens: cached,
            fallback,
            ..choice(1)
        };
        assert!(learn.shared_credited(&credited(0.0, 2_000, false)));
        assert_eq!(learn.credited(&credited(0.0, 2_000, false)), Some(2_000));
        // A seat wait: a larger credit there was the conversation's, not the system prompt's.
        assert!(!learn.shared_credited(&credited(0.5, 2_400, false)));
        assert_eq!(learn.credited(&credited(0.5, 2_400, false)), None);
        assert!(
            !learn.shared_credited(&credited(0.0, 2_000, true)),
            "a fallback"
        );
        assert!(
            !learn.shared_credited(&credited(0.0, 0, false)),
            "not credited"
        );
        assert!(!learn.shared_credited(&choice(1)), "no prediction");
        assert!(!learn.shared_credited(&Choice {
            cached_tokens: 2_000,
            predicted_s: Some(1.0),
            predicted_run_s: Some(1.0),
            ..choice(2)
        }));
    }

    fn dispatch(max_retries: u32, nodes: &[Arc<NodeState>]) -> Dispatch {
        let first = crate::queue::take_now(0, &nodes[0], &nodes[0].counters("m")).unwrap();
        Dispatch {
            endpoint: Endpoint::OpenAIChat,
            upstream: Endpoint::OpenAIChat,
            requested_model: "m".into(),
            affinity: AffinityKind::None,
            ranked: (0..nodes.len()).map(choice).collect(),
            body: Mutex::new(Body::default()),
            started: Instant::now(),
            queue_wait: Default::default(),
            stream: false,
            max_retries,
            prompt_chars: 0,
            prompt_fixed_tokens: 0,
            learn: LearnInput::default(),
            state: Mutex::new(Attempts {
                lease: Some(first),
                ..Attempts::default()
            }),
        }
    }

    fn nodes(seats: &[u32]) -> Vec<Arc<NodeState>> {
        seats
            .iter()
            .map(|s| {
                let n = Arc::new(NodeState::default());
                n.counters("m").limit.store(*s, Ordering::Relaxed);
                n
            })
            .collect()
    }

    #[test]
    fn the_body_is_sent_each_attempt_taken_back_once_and_let_go_when_the_reply_begins() {
        let ns = nodes(&[1]);
        let d = dispatch(1, &ns);
        *d.body.lock() = Body::new(Bytes::from_static(b"sent"), Bytes::from_static(b"asked"));
        // Each send (a stale pooled connection sends again) reads it; it stays.
        assert_eq!(d.sent_body().as_deref(), Some(&b"sent"[..]));
        assert_eq!(d.sent_body().as_deref(), Some(&b"sent"[..]));
        // Nothing reached the client: the next attempt's dispatch takes the client's body.
        assert_eq!(d.take_asked_body().as_deref(), Some(&b"asked"[..]));
        assert_eq!(d.take_asked_body(), None, "taken once");
        // The reply reached the client: nothing of the body is held any more.
        *d.body.lock() = Body::new(Bytes::from_static(b"sent"), Bytes::from_static(b"asked"));
        d.release_body();
        assert_eq!(d.sent_body(), None);
        assert_eq!(d.take_asked_body(), None);
    }

    #[test]
    fn failover_skips_a_full_node_and_frees_the_failed_seat() {
        let ns = nodes(&[1, 1, 1]);
        // n1 is full: its one seat is held by another request.
        let _other = crate::queue::take_now(1, &ns[1], &ns[1].counters("m")).unwrap();
        let d = dispatch(2, &ns);
        let take =
            |c: &Choice| crate::queue::take_now(c.node, &ns[c.node], &ns[c.node].counters("m"));
        assert_eq!(d.next_attempt(take), Some(2), "n1 has no seat: on to n2");
        assert_eq!(
            ns[0].in_flight.load(Ordering::Relaxed),
            0,
            "the failed node's seat is free"
        );
        assert_eq!(
            ns[1].in_flight.load(Ordering::Relaxed),
            1,
            "n1 never over its seat"
        );
        assert_eq!(ns[2].in_flight.load(Ordering::Relaxed), 1);
        assert_eq!(d.state.lock().retries, 1);
        // n2 fails too: nothing left untried.
        assert_eq!(d.next_attempt(take), None);
        assert_eq!(ns[2].in_flight.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn failover_moves_the_prompt_to_the_new_nodes_prefill_queue() {
        let ns = nodes(&[1, 1]);
        let mut d = dispatch(1, &ns);
        d.stream = true;
        d.learn.prompt_tokens = 900;
        d.start_prefill(&mut d.state.lock());
        assert_eq!(ns[0].prefill.load().tokens, 900);
        let take =
            |c: &Choice| crate::queue::take_now(c.node, &ns[c.node], &ns[c.node].counters("m"));
        assert_eq!(d.next_attempt(take), Some(1));
        assert_eq!(
            ns[0].prefill.load().tokens,
            0,
            "left the failed node's queue"
        );
        assert_eq!(
            ns[1].prefill.load().tokens,
            900,
            "and entered the new one's"
        );
        // Its first byte ends it there; a second call changes nothing.
        let mut st = d.state.lock();
        let lease = st.lease.as_mut().unwrap();
        assert_eq!(lease.first_byte(1), None, "nobody was ahead");
        assert_eq!(lease.first_byte(2), None);
        assert_eq!(ns[1].prefill.load().tokens, 0);
        drop(st);
        // Not streamed: not counted (its only byte comes with the end of the reply).
        let d = dispatch(0, &ns);
        d.start_prefill(&mut d.state.lock());
        assert_eq!(ns[0].prefill.load().tokens, 0);
    }

    #[test]
    fn no_failover_once_retries_are_spent() {
        let ns = nodes(&[1, 1]);
        let d = dispatch(0, &ns);
        let take =
            |c: &Choice| crate::queue::take_now(c.node, &ns[c.node], &ns[c.node].counters("m"));
        assert_eq!(d.next_attempt(take), None);
        assert_eq!(ns[1].in_flight.load(Ordering::Relaxed), 0);
        assert_eq!(
            ns[0].in_flight.load(Ordering::Relaxed),
            0,
            "seat released all the same"
        );
    }
}
