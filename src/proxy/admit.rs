//! Admission at placement: the first ranked candidate with a free seat, or whose queue
//! admits the request (count and predicted wait); else a refusal with `Retry-After`.

use std::net::IpAddr;
use std::sync::atomic::Ordering;

use crate::fleet::{Fleet, Lease, ModelCounters};
use crate::queue::admission::{self, QueueState, Refusal};
use crate::queue::{Acquire, Ticket};
use crate::routing::{Choice, Decision};

/// What placement does next.
pub enum Pick {
    Ready(Choice, Lease),
    Wait(Choice, Ticket),
    /// The winner's breaker refused (its trial was taken): decide again.
    BreakerRefused,
    Refused(Refusal),
}

/// Expected service time of one request on node:model (seat held -> response done), ms.
/// Observed: the p75 of recent whole-request latencies; None without history.
pub fn service_ms(c: &ModelCounters) -> Option<f64> {
    c.load().p75_ms
}

fn queue_state(c: &ModelCounters, ahead: u32) -> QueueState {
    QueueState {
        ahead,
        seats: c.seats(),
        service_ms: service_ms(c),
    }
}

/// Walk the ranked candidates: a free seat wins; else the first queue that admits the request.
/// `on_board`: the request already counts among the waiting (it was in the holding queue).
pub fn pick(
    fleet: &Fleet,
    decision: &Decision,
    on_board: bool,
    share: &crate::queue::Share,
) -> Pick {
    let limits = &fleet.config().admission;
    let mut refusal: Option<Refusal> = None;
    for (i, c) in decision.ranked.iter().enumerate() {
        // Its place among the pair's waiters: by its predicted run there (completion mode;
        // predicted from priors only, which keep no run apart, by its whole predicted time:
        // not as if it took none), at most half the longest wait (`Share::with_run`).
        let run_s = c.predicted_run_s.or(c.predicted_s).unwrap_or(0.0);
        let share = &share.with_run(run_s, fleet.config().queue.max_wait_s);
        match fleet.acquire_as(c.node, &c.model, share) {
            Acquire::Ready(lease) => return Pick::Ready(c.clone(), lease),
            Acquire::Refused if i == 0 => return Pick::BreakerRefused,
            Acquire::Refused => continue,
            Acquire::Wait(ticket) => {
                let counters = fleet.node(c.node).counters(&c.model);
                let ahead = counters.pending.load(Ordering::Relaxed).saturating_sub(1);
                let q = queue_state(&counters, ahead);
                let waiting = fleet.board.len() - usize::from(on_board);
                let verdict = if waiting >= limits.max_waiting {
                    Err(Refusal {
                        message: format!(
                            "too many requests waiting ({waiting}, limit {})",
                            limits.max_waiting
                        ),
                        retry_after_s: q
                            .service_ms
                            .map_or(1, |s| ((s / 1000.0).ceil() as u32).clamp(1, 3600)),
                    })
                } else {
                    admission::admit(&q, limits)
                };
                match verdict {
                    Ok(_) => return Pick::Wait(c.clone(), ticket),
                    Err(r) => {
                        drop(ticket);
                        let sooner = refusal
                            .as_ref()
                            .is_none_or(|old| r.retry_after_s < old.retry_after_s);
                        if sooner {
                            refusal = Some(Refusal {
                                message: format!("node '{}': {}", c.node_id, r.message),
                                ..r
                            });
                        }
                    }
                }
            }
        }
    }
    match refusal {
        Some(r) => Pick::Refused(r),
        None => Pick::BreakerRefused,
    }
}

/// A refusal before entering the holding queue: too many waiting in all, or this client
/// already holds its share of the holding queue.
pub fn holding_refusal(fleet: &Fleet, client: Option<IpAddr>) -> Option<Refusal> {
    let cfg = fleet.config();
    let (a, q) = (&cfg.admission, &cfg.queue);
    let rescan_s = (q.holding_rescore_ms as f64 / 1000.0).ceil().max(1.0) as u32;
    let waiting = fleet.board.len();
    if waiting >= a.max_waiting {
        return Some(Refusal {
            message: format!(
                "too many requests waiting ({waiting}, limit {})",
                a.max_waiting
            ),
            retry_after_s: rescan_s,
        });
    }
    let share = ((q.holding_max as f64) * a.holding_client_share)
        .ceil()
        .max(1.0) as usize;
    let mine = fleet.board.holding_for(client);
    (mine >= share).then(|| Refusal {
        message: format!(
            "this client already has {mine} requests in the holding queue (its share: {share} of {})",
            q.holding_max
        ),
        retry_after_s: rescan_s,
    })
}
