//! Figures of a run (mean / p50 / p99 total, TTFT, errors, cold loads, prefix reuse, per-node
//! utilisation), medians over runs, the per-scenario table and per-request traces.

use super::drive::{Outcome, RunData};
use crate::common::{median, quantile};

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub requests: usize,
    pub mean_s: f64,
    pub p50_s: f64,
    pub p99_s: f64,
    pub ttft_mean_s: f64,
    pub ttft_p50_s: f64,
    /// Requests that failed in the end.
    pub errors: f64,
    /// Context-overflow answers (a baseline then retries on another node).
    pub context_errors: f64,
    /// Model loads on the nodes during the run (cold loads and pre-warms).
    pub loads: f64,
    /// Requests that waited for a model load.
    pub waited_load: f64,
    /// Share of prompt tokens served from the nodes' prefix caches.
    pub reuse: f64,
    /// Per node: seat time / (seats x run time).
    pub util: Vec<f64>,
    /// Total seconds of each request that succeeded, by tag (for like-for-like comparisons).
    pub served: std::collections::HashMap<String, f64>,
}

/// Mean total of `a` over the requests `b` also served, divided by `b`'s over the same ones:
/// a like-for-like ratio when one policy fails requests the other serves (their slow ones
/// would otherwise only count against the policy that served them). NaN when none in common.
pub fn common_ratio(a: &Figures, b: &Figures) -> f64 {
    let both: Vec<(f64, f64)> = a
        .served
        .iter()
        .filter_map(|(tag, ta)| b.served.get(tag).map(|tb| (*ta, *tb)))
        .collect();
    let (sa, sb) = both
        .iter()
        .fold((0.0, 0.0), |(x, y), (p, q)| (x + p, y + q));
    if both.is_empty() || sb <= 0.0 {
        f64::NAN
    } else {
        sa / sb
    }
}

pub fn figures(d: &RunData) -> Figures {
    let ok: Vec<&Outcome> = d.outcomes.iter().filter(|o| o.status == 200).collect();
    let mut total: Vec<f64> = ok.iter().map(|o| o.total.as_secs_f64()).collect();
    let mut ttft: Vec<f64> = ok
        .iter()
        .filter_map(|o| o.ttft)
        .map(|t| t.as_secs_f64())
        .collect();
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let wall = d.makespan.as_secs_f64().max(1e-9);
    let (reused, prefilled) = d.nodes.iter().fold((0u64, 0u64), |(r, p), (_, _, s)| {
        (r + s.prefix_tokens_reused, p + s.prompt_tokens_prefilled)
    });
    Figures {
        requests: d.outcomes.len(),
        mean_s: mean(&total),
        p50_s: quantile(&mut total, 0.5),
        p99_s: quantile(&mut total, 0.99),
        ttft_mean_s: mean(&ttft),
        ttft_p50_s: quantile(&mut ttft, 0.5),
        errors: (d.outcomes.len() - ok.len()) as f64,
        context_errors: d.outcomes.iter().map(|o| f64::from(o.context_errors)).sum(),
        loads: d.nodes.iter().map(|(_, _, s)| s.loads.len()).sum::<usize>() as f64,
        waited_load: ok.iter().filter(|o| o.load_ms > 1.0).count() as f64,
        reuse: if reused + prefilled == 0 {
            0.0
        } else {
            reused as f64 / (reused + prefilled) as f64
        },
        util: d
            .nodes
            .iter()
            .map(|(_, seats, s)| s.seat_seconds / (f64::from(*seats) * wall))
            .collect(),
        served: ok
            .iter()
            .map(|o| (o.tag.clone(), o.total.as_secs_f64()))
            .collect(),
    }
}

/// Median of each figure over runs (utilisation per node).
pub fn medians(runs: &[Figures]) -> Figures {
    let m = |f: fn(&Figures) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    let nodes = runs.first().map_or(0, |r| r.util.len());
    Figures {
        requests: runs.first().map_or(0, |r| r.requests),
        mean_s: m(|f| f.mean_s),
        p50_s: m(|f| f.p50_s),
        p99_s: m(|f| f.p99_s),
        ttft_mean_s: m(|f| f.ttft_mean_s),
        ttft_p50_s: m(|f| f.ttft_p50_s),
        errors: m(|f| f.errors),
        context_errors: m(|f| f.context_errors),
        loads: m(|f| f.loads),
        waited_load: m(|f| f.waited_load),
        reuse: m(|f| f.reuse),
        util: (0..nodes)
            .map(|i| median(&runs.iter().map(|r| r.util[i]).collect::<Vec<_>>()))
            .collect(),
        served: Default::default(),
    }
}

/// Utilisation per node as whole percents; for big fleets min / median / max.
fn util_text(u: &[f64]) -> String {
    if u.len() > 8 {
        let mut v = u.to_vec();
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = v.iter().cloned().fold(0.0, f64::max);
        let mid = quantile(&mut v, 0.5);
        return format!(
            "min {:.0} / med {:.0} / max {:.0}",
            lo * 100.0,
            mid * 100.0,
            hi * 100.0
        );
    }
    u.iter()
        .map(|x| format!("{:.0}", x * 100.0))
        .collect::<Vec<_>>()
        .join("/")
}

pub fn header(node_ids: &[String]) -> String {
    let nodes = if node_ids.len() > 8 {
        format!("{} nodes", node_ids.len())
    } else {
        node_ids.join("/")
    };
    format!(
        "  {:<12} {:>7} {:>7} {:>7} {:>7} {:>7} {:>4} {:>4} {:>5} {:>5} {:>6}  util % ({nodes})",
        "policy",
        "mean s",
        "p50 s",
        "p99 s",
        "ttft s",
        "ttft50",
        "err",
        "ctx",
        "loads",
        "waitL",
        "reuse%"
    )
}

pub fn row(name: &str, f: &Figures) -> String {
    format!(
        "  {:<12} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>4} {:>4} {:>5} {:>5} {:>6.1}  {}",
        name,
        f.mean_s,
        f.p50_s,
        f.p99_s,
        f.ttft_mean_s,
        f.ttft_p50_s,
        f.errors,
        f.context_errors,
        f.loads,
        f.waited_load,
        f.reuse * 100.0,
        util_text(&f.util)
    )
}

/// One line per request, in send order.
pub fn trace_lines(policy: &str, d: &RunData) -> Vec<String> {
    let mut v: Vec<&Outcome> = d.outcomes.iter().collect();
    v.sort_by_key(|o| o.at);
    v.iter()
        .map(|o| {
            format!(
                "    {policy:<11} {:>7.3}s {:<8} {:<12} {:<14} prompt {:>6} cached {:>6} load {:>6.0}ms ttft {:>7.3}s total {:>7.3}s {} score {:>7.3}{}",
                o.at.as_secs_f64(),
                o.tag,
                o.model,
                o.node,
                o.prompt_tokens,
                o.cached,
                o.load_ms,
                o.ttft.map_or(f64::NAN, |t| t.as_secs_f64()),
                o.total.as_secs_f64(),
                o.status,
                o.score.unwrap_or(f64::NAN),
                if o.error.is_empty() { String::new() } else { format!(" {}", o.error) }
            )
        })
        .collect()
}
