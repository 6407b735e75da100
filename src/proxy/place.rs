//! Placement: decide (Stage 1-2), wait in the holding queue when nothing survives, then wait
//! for a seat in the winner's node:model queue (Stage 3). A client that disconnects while
//! waiting leaves at once and never takes a seat.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora::Result;
use pingora_proxy::Session;

use super::admit::{self, Pick};
use super::respond;
use crate::fleet::{Fleet, Lease};
use crate::metrics::METRICS;
use crate::protocol::{Endpoint, ErrorCode, ParsedRequest};
use crate::queue::admission::Refusal;
use crate::queue::{Waiting, WaitingGuard};
use crate::routing::{self, AffinityKind, Choice, Decision, FleetView, NoRoute, RouteRequest};
use crate::services::now_ms;

/// Where a request will run, with its seat.
pub struct Placement {
    pub lease: Lease,
    /// The node holding the seat first, then same-model runners-up for failover.
    pub ranked: Vec<Choice>,
    pub affinity: AffinityKind,
    pub queue_wait: Duration,
}

/// How placement ended when it produced no seat.
pub enum Unplaced {
    /// An error answer: the code and message to send.
    Error(ErrorCode, String),
    /// Admission turned it away: 429 with the `Retry-After` the queue's drain rate gives.
    Refused(Refusal),
    /// The client went away while waiting.
    Gone,
}

/// Resolves when the client closes its connection (the body is already read).
async fn client_gone(session: &mut Session) {
    loop {
        match session.downstream_session.read_body_or_idle(true).await {
            Ok(Some(_)) => continue, // pipelined bytes: not a close
            _ => return,
        }
    }
}

fn no_route_error(
    no_route: NoRoute,
    parsed: &ParsedRequest,
    req: &RouteRequest,
) -> (ErrorCode, String) {
    match no_route {
        NoRoute::ModelNotFound => (
            ErrorCode::ModelNotFound,
            format!("model '{}' not found on any node", parsed.model),
        ),
        NoRoute::ContextTooLong => (
            ErrorCode::ContextLengthExceeded,
            format!(
                "request needs about {} prompt tokens plus output; no node's context window for '{}' fits",
                req.prompt_tokens, req.models[0]
            ),
        ),
        NoRoute::PinUnavailable => (
            ErrorCode::NoProviderAvailable,
            format!(
                "pinned node '{}' cannot serve this request now",
                req.pin.clone().unwrap_or_default()
            ),
        ),
        NoRoute::NoProvider => (
            ErrorCode::NoProviderAvailable,
            format!("no node can serve model '{}' right now", req.models[0]),
        ),
    }
}

fn decide(fleet: &Fleet, req: &RouteRequest) -> (Decision, Arc<FleetView>) {
    let view = fleet.view();
    let d = routing::decide(req, &view, &fleet.config().routing.policy, fleet, now_ms());
    if log::log_enabled!(target: "fleetgate::decisions", log::Level::Debug) {
        log_prediction(req, &view, &d);
    }
    (d, view)
}

/// Each candidate's predicted terms and the winner, one line each (`RUST_LOG=
/// fleetgate::decisions=debug`): what to read when a request went somewhere unexpected.
fn log_prediction(req: &RouteRequest, view: &FleetView, d: &Decision) {
    for row in &d.table {
        if let routing::Verdict::Predicted { prediction: p } = &row.verdict {
            log::debug!(
                target: "fleetgate::decisions",
                "prompt {} node {} total {:.3} = wait {:.3} (node {:.3}, shared {:.3}) + load {:.3} + prefill {:.3} (after {} queued tokens) + decode {:.3}; risk {:.3} imposed {:.3}; \
                 streams {} seats {} output {:.0} prefill {:.0} tok/s decode {:.1} tok/s (pace {:.2}) observed {} explored {}",
                req.prompt_tokens, view.nodes[row.node].id, p.total_s, p.wait_s, p.node_wait_s, p.shared_wait_s, p.load_s,
                p.prefill_s, p.prefill_queue_tokens, p.decode_s, p.risk_s, p.imposed_s, p.concurrency, p.seats, p.output_tokens, p.prefill_tps,
                p.decode_tps, p.pace, p.observed, p.explored
            );
        }
    }
    let winner = d.winner().map(|w| w.node_id.as_str());
    log::debug!(target: "fleetgate::decisions", "prompt {} -> {winner:?}", req.prompt_tokens);
}

/// Count a decision the proxy acts on and keep it for the fleet page.
fn note(fleet: &Fleet, ep: Endpoint, req: &RouteRequest, d: &Decision, view: &Arc<FleetView>) {
    crate::metrics::record_decision(d, req.pin.is_some());
    fleet.recent.decided(crate::fleet::recent::DecisionNote {
        at_ms: now_ms(),
        endpoint: ep,
        mode: fleet.config().routing.policy.mode,
        req: req.clone(),
        decision: d.clone(),
        view: view.clone(),
    });
}

/// Same-model candidates with the node that holds the seat first.
fn ranked_for(decision: &Decision, lease_node: usize, model: &str, fleet: &Fleet) -> Vec<Choice> {
    let mut ranked: Vec<Choice> = decision
        .ranked
        .iter()
        .filter(|c| c.model == model)
        .cloned()
        .collect();
    match ranked.iter().position(|c| c.node == lease_node) {
        Some(0) => {}
        Some(i) => {
            let c = ranked.remove(i);
            ranked.insert(0, c);
        }
        None => ranked.insert(
            0,
            Choice {
                node: lease_node,
                node_id: fleet.node_config(lease_node).id.clone(),
                model: model.to_string(),
                score: 0.0,
                fallback: decision.ranked.first().is_some_and(|c| c.fallback),
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
            },
        ),
    }
    ranked
}

/// How a request waits: deadlines count from `arrived`; `may_hold`: the holding queue is
/// allowed (a first placement, not a failover); `pass`: its tenant's admission (fair share,
/// `max_queued`).
pub struct Terms<'a> {
    pub arrived: Instant,
    pub may_hold: bool,
    pub pass: &'a crate::tenant::Pass,
}

/// Find a node and a seat for the request, waiting as the queues say.
pub async fn place(
    fleet: &Arc<Fleet>,
    session: &mut Session,
    ep: Endpoint,
    parsed: &ParsedRequest,
    req: &RouteRequest,
    terms: Terms<'_>,
) -> Result<std::result::Result<Placement, Unplaced>> {
    let Terms {
        arrived,
        may_hold,
        pass,
    } = terms;
    let q = &fleet.config().queue;
    let share = crate::queue::Share {
        tenant: pass.tenant().clone(),
        weight: pass.limits.weight,
        pinned: req.pin.is_some(),
        run_s: 0.0,
    };
    // Held while the request waits (node:model queue or holding queue): the tenant's
    // `max_queued` counts it.
    let mut queued: Option<crate::tenant::Queued> = None;
    let wait_turn =
        |queued: &mut Option<crate::tenant::Queued>| -> std::result::Result<(), Unplaced> {
            if queued.is_none() {
                *queued = Some(
                    pass.queue()
                        .map_err(|r| Unplaced::Error(ErrorCode::QueueFull, r.message))?,
                );
            }
            Ok(())
        };
    let started = Instant::now();
    let hold_deadline = arrived + Duration::from_secs(q.holding_timeout_s);
    let mut board: Option<WaitingGuard> = None;
    let client = session
        .client_addr()
        .and_then(|a| a.as_inet())
        .map(|a| a.ip());
    let enter = |node: Option<String>| {
        fleet.board.enter(Waiting {
            id: crate::queue::next_id(),
            protocol: ep.label(),
            model: req.models[0].clone(),
            node,
            since: started,
            client,
            waited_ms: 0,
        })
    };
    if let Some(missing) = routing::unservable_tags(req, &fleet.view()) {
        return Ok(Err(Unplaced::Error(
            ErrorCode::InvalidRequest,
            format!(
                "no node in the fleet has the tags [{}] (X-Fleet-Tags: {})",
                missing.join(", "),
                req.required_tags.join(", ")
            ),
        )));
    }
    let mut refusals = 0;
    loop {
        let changed = fleet.changed.notified();
        let (decision, view) = decide(fleet, req);
        let winner = decision.winner().cloned();
        // A breaker that keeps refusing what routing picks: wait in the holding queue instead.
        if winner.is_some() && refusals < 3 {
            note(fleet, ep, req, &decision, &view);
            crate::services::prewarm::spare_room(fleet, &view, &req.models, &decision);
            crate::services::prewarm::to_measure(fleet, &view, &req.models, &decision);
            let (w, lease) = match admit::pick(fleet, &decision, board.is_some(), &share) {
                Pick::Ready(w, lease) => (w, lease),
                // A breaker's trial was taken a moment ago: the new snapshot eliminates it.
                Pick::BreakerRefused => {
                    refusals += 1;
                    continue;
                }
                Pick::Refused(r) => return Ok(Err(Unplaced::Refused(r))),
                Pick::Wait(w, mut ticket) => {
                    if let Err(e) = wait_turn(&mut queued) {
                        return Ok(Err(e));
                    }
                    let guard = board.take().unwrap_or_else(|| enter(None));
                    guard.set_node(Some(w.node_id.clone()));
                    let left = (arrived + Duration::from_secs(q.max_wait_s))
                        .saturating_duration_since(Instant::now());
                    let max_wait = tokio::time::sleep(left);
                    let lease = tokio::select! {
                        lease = ticket.granted() => match lease {
                            Some(lease) => lease,
                            None => return Ok(Err(Unplaced::Error(ErrorCode::NoProviderAvailable, "seat lost".into()))),
                        },
                        _ = client_gone(session) => {
                            METRICS.queue_aborts.with_label_values(&[&w.node_id, &w.model]).inc();
                            return Ok(Err(Unplaced::Gone));
                        }
                        _ = max_wait => {
                            METRICS.queue_timeouts.with_label_values(&[&w.node_id, &w.model]).inc();
                            return Ok(Err(Unplaced::Error(
                                ErrorCode::NoProviderAvailable,
                                format!("no seat on node '{}' for model '{}' within {} s", w.node_id, w.model, q.max_wait_s),
                            )));
                        }
                    };
                    (w, lease)
                }
            };
            if board.is_some() {
                METRICS.holding.with_label_values(&["served"]).inc();
            }
            let ranked = ranked_for(&decision, lease.node, &w.model, fleet);
            let queue_wait = started.elapsed();
            METRICS
                .queue_wait
                .with_label_values(&[&ranked[0].node_id, &w.model])
                .observe(queue_wait.as_secs_f64());
            return Ok(Ok(Placement {
                lease,
                ranked,
                affinity: decision.affinity,
                queue_wait,
            }));
        }
        refusals = 0;
        if board.is_none() && winner.is_none() {
            note(fleet, ep, req, &decision, &view);
        }
        let no_route = match winner {
            Some(_) => NoRoute::NoProvider,
            None => decision.no_route.unwrap_or(NoRoute::NoProvider),
        };
        let pulling = no_route == NoRoute::ModelNotFound
            && crate::services::autopull::request(fleet, &req.models[0]);
        // A node still starting up may report the model in a moment: wait for it briefly.
        let settle_deadline = started + crate::services::settle::SETTLE_WAIT;
        let settling = no_route == NoRoute::ModelNotFound
            && may_hold
            && Instant::now() < settle_deadline
            && crate::services::settle::any_settling(fleet);
        if (no_route != NoRoute::NoProvider || !may_hold) && !pulling && !settling {
            let (code, msg) = no_route_error(no_route, parsed, req);
            return Ok(Err(Unplaced::Error(code, msg)));
        }
        // Holding queue: nothing can take it now; wait for the fleet to change.
        if board.is_none() {
            if fleet.board.holding() >= q.holding_max {
                METRICS.holding.with_label_values(&["full"]).inc();
                return Ok(Err(Unplaced::Error(
                    ErrorCode::QueueFull,
                    format!(
                        "the holding queue is full ({} requests waiting)",
                        q.holding_max
                    ),
                )));
            }
            if let Some(r) = admit::holding_refusal(fleet, client) {
                METRICS.holding.with_label_values(&["full"]).inc();
                return Ok(Err(Unplaced::Refused(r)));
            }
            if let Err(e) = wait_turn(&mut queued) {
                return Ok(Err(e));
            }
            board = Some(enter(None));
        }
        let now = Instant::now();
        if now >= hold_deadline {
            METRICS.holding.with_label_values(&["timeout"]).inc();
            let (code, msg) = no_route_error(NoRoute::NoProvider, parsed, req);
            return Ok(Err(Unplaced::Error(
                code,
                format!("{msg} (waited {} s)", q.holding_timeout_s),
            )));
        }
        let mut rescore = Duration::from_millis(q.holding_rescore_ms).min(hold_deadline - now);
        if settling {
            rescore = rescore.min(settle_deadline.saturating_duration_since(now));
        }
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep(rescore) => {}
            _ = client_gone(session) => {
                METRICS.holding.with_label_values(&["aborted"]).inc();
                return Ok(Err(Unplaced::Gone));
            }
        }
    }
}

/// Answer an unplaced request (or nothing, when the client left).
pub async fn answer(session: &mut Session, ep: Endpoint, unplaced: Unplaced) -> Result<()> {
    match unplaced {
        Unplaced::Gone => {
            session.set_keepalive(None);
            Ok(())
        }
        Unplaced::Error(code, msg) => {
            super::handle::record_local(ep.label(), code);
            respond::error(session, ep.family(), code, &msg).await
        }
        Unplaced::Refused(r) => {
            let code = ErrorCode::QueueFull;
            super::handle::record_local(ep.label(), code);
            let body = crate::protocol::error_body(ep.family(), code, &r.message);
            respond::json(session, code.status(), body, Some(r.retry_after_s)).await
        }
    }
}
