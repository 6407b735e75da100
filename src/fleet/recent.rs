//! What the fleet page shows of the last minutes: a bounded ring of recent routing decisions
//! (with what explain needs to name their rows) and, per node:model, a ring of 5-second
//! buckets of served requests and time to first token. Time is an argument.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use crate::protocol::Endpoint;
use crate::routing::{Decision, FleetView, RouteRequest};

/// Decisions kept for the page.
pub const DECISIONS: usize = 20;
/// Width of one traffic bucket, ms.
pub const BUCKET_MS: u64 = 5_000;
/// Buckets kept per node:model (5 minutes).
pub const BUCKETS: usize = 60;

/// One routing decision as the proxy made it, with the request and view it was made from.
#[derive(Debug, Clone)]
pub struct DecisionNote {
    pub at_ms: u64,
    pub endpoint: Endpoint,
    /// How Stage 2 ranked (`routing.mode` when it was made).
    pub mode: crate::routing::Mode,
    pub req: RouteRequest,
    pub decision: Decision,
    pub view: Arc<FleetView>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    /// `at_ms / BUCKET_MS` of the requests counted here.
    epoch: u64,
    requests: u32,
    errors: u32,
    ttft_sum_ms: f64,
    ttft_n: u32,
}

/// Traffic of one node:model over the last `BUCKETS` buckets, oldest first.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Traffic {
    pub node: String,
    pub model: String,
    /// Start of the first bucket, ms.
    pub since_ms: u64,
    pub bucket_ms: u64,
    /// Requests finished per bucket.
    pub requests: Vec<u32>,
    /// Non-2xx answers per bucket.
    pub errors: Vec<u32>,
    /// Mean time to first token per bucket, ms (None: nothing streamed a byte then).
    pub ttft_ms: Vec<Option<f64>>,
    /// Requests over the whole window.
    pub total: u32,
    /// Requests per second over the last minute.
    pub rate_1m: f64,
    /// Mean TTFT over the last minute, ms.
    pub ttft_1m_ms: Option<f64>,
}

/// Recent decisions and per node:model traffic.
#[derive(Debug, Default)]
pub struct Recent {
    decisions: Mutex<VecDeque<DecisionNote>>,
    traffic: Mutex<HashMap<(String, String), [Bucket; BUCKETS]>>,
}

impl Recent {
    /// Keep a decision (the oldest goes when `DECISIONS` are kept).
    pub fn decided(&self, note: DecisionNote) {
        let mut d = self.decisions.lock();
        if d.len() == DECISIONS {
            d.pop_front();
        }
        d.push_back(note);
    }

    /// The kept decisions, newest first.
    pub fn decisions(&self) -> Vec<DecisionNote> {
        self.decisions.lock().iter().rev().cloned().collect()
    }

    /// Count one finished request on node:model at `now_ms`.
    pub fn served(&self, node: &str, model: &str, ok: bool, ttft_ms: Option<f64>, now_ms: u64) {
        let epoch = now_ms / BUCKET_MS;
        let mut t = self.traffic.lock();
        let ring = t
            .entry((node.to_string(), model.to_string()))
            .or_insert([Bucket::default(); BUCKETS]);
        let b = &mut ring[(epoch % BUCKETS as u64) as usize];
        if b.epoch != epoch {
            *b = Bucket {
                epoch,
                ..Bucket::default()
            };
        }
        b.requests += 1;
        b.errors += u32::from(!ok);
        if let Some(ms) = ttft_ms {
            b.ttft_sum_ms += ms;
            b.ttft_n += 1;
        }
    }

    /// Every node:model's traffic over the window ending at `now_ms`, sorted by node, model.
    pub fn traffic(&self, now_ms: u64) -> Vec<Traffic> {
        let last = now_ms / BUCKET_MS;
        let first = (last + 1).saturating_sub(BUCKETS as u64);
        let minute = 60_000 / BUCKET_MS;
        let mut out: Vec<Traffic> = self
            .traffic
            .lock()
            .iter()
            .map(|((node, model), ring)| {
                let at =
                    |e: u64| Some(ring[(e % BUCKETS as u64) as usize]).filter(|b| b.epoch == e);
                let buckets: Vec<Option<Bucket>> = (first..=last).map(at).collect();
                let recent = &buckets[buckets.len().saturating_sub(minute as usize)..];
                let sum = |bs: &[Option<Bucket>], f: fn(&Bucket) -> f64| {
                    bs.iter().flatten().map(f).sum::<f64>()
                };
                let n_1m = sum(recent, |b| b.requests.into());
                let ttft_n = sum(recent, |b| b.ttft_n.into());
                // The current bucket is partly elapsed: rate over the time actually covered.
                let covered_ms = (minute - 1) * BUCKET_MS + (now_ms % BUCKET_MS).max(1);
                Traffic {
                    node: node.clone(),
                    model: model.clone(),
                    since_ms: first * BUCKET_MS,
                    bucket_ms: BUCKET_MS,
                    requests: buckets
                        .iter()
                        .map(|b| b.map_or(0, |b| b.requests))
                        .collect(),
                    errors: buckets.iter().map(|b| b.map_or(0, |b| b.errors)).collect(),
                    ttft_ms: buckets
                        .iter()
                        .map(|b| {
                            b.filter(|b| b.ttft_n > 0)
                                .map(|b| b.ttft_sum_ms / f64::from(b.ttft_n))
                        })
                        .collect(),
                    total: buckets.iter().flatten().map(|b| b.requests).sum(),
                    rate_1m: n_1m * 1000.0 / covered_ms as f64,
                    ttft_1m_ms: (ttft_n > 0.0).then(|| sum(recent, |b| b.ttft_sum_ms) / ttft_n),
                }
            })
            .collect();
        out.sort_by(|a, b| (&a.node, &a.model).cmp(&(&b.node, &b.model)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_count_rate_and_ttft_and_old_ones_fall_out() {
        let r = Recent::default();
        let t0 = 1_000 * BUCKET_MS; // a bucket boundary
        r.served("a", "m", true, Some(100.0), t0);
        r.served("a", "m", true, Some(300.0), t0 + 10);
        r.served("a", "m", false, None, t0 + BUCKET_MS);
        let now = t0 + BUCKET_MS + 2_500;
        let t = &r.traffic(now)[0];
        assert_eq!((t.node.as_str(), t.model.as_str()), ("a", "m"));
        assert_eq!(t.requests.len(), BUCKETS);
        assert_eq!(&t.requests[BUCKETS - 2..], &[2, 1]);
        assert_eq!(&t.errors[BUCKETS - 2..], &[0, 1]);
        assert_eq!(t.ttft_ms[BUCKETS - 2], Some(200.0));
        assert_eq!(t.ttft_ms[BUCKETS - 1], None);
        assert_eq!(t.total, 3);
        assert_eq!(t.ttft_1m_ms, Some(200.0));
        // 3 requests over 55 s of past buckets and 2.5 s of the current one.
        let covered = (11 * BUCKET_MS + 2_500) as f64 / 1000.0;
        assert!((t.rate_1m - 3.0 / covered).abs() < 1e-9, "{}", t.rate_1m);
        // Five minutes later the ring has nothing of it, and a reused slot starts afresh.
        let later = t0 + BUCKETS as u64 * BUCKET_MS;
        assert_eq!(r.traffic(later + BUCKET_MS)[0].total, 0);
        r.served("a", "m", true, None, later + BUCKET_MS);
        assert_eq!(r.traffic(later + BUCKET_MS)[0].total, 1);
    }

    #[test]
    fn the_decision_ring_keeps_the_newest() {
        let r = Recent::default();
        for i in 0..(DECISIONS as u64 + 5) {
            r.decided(DecisionNote {
                at_ms: i,
                endpoint: Endpoint::OpenAIChat,
                mode: crate::routing::Mode::Spec,
                req: RouteRequest::default(),
                decision: Decision {
                    ranked: vec![],
                    no_route: None,
                    affinity: crate::routing::AffinityKind::None,
                    table: vec![],
                },
                view: Arc::default(),
            });
        }
        let d = r.decisions();
        assert_eq!(d.len(), DECISIONS);
        assert_eq!(d[0].at_ms, DECISIONS as u64 + 4);
        assert_eq!(d[DECISIONS - 1].at_ms, 5);
    }
}
