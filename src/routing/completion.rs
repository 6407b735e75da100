//! Completion mode: each surviving (node, model) pair's predicted finish time, from live load and
//! the rates learned for the pair (priors until observed). Pure: time is an argument.
//!
//! ```text
//! total   = wait + load + prefill + decode
//! wait    = max(seat,                        ahead = max(0, in_flight + pending + 1 - seats)
//!               queued / prefill_tps)        queued: prompt tokens the node was sent and has not
//!                                            answered, less those done since the first could
//!                                            start; only on a node learned to prefill one prompt
//!                                            at a time (`Rates::prefill_shared`)
//! load    = observed load time (from the first token of the answer that waited for it until
//!           that answer ends: `fleet::PairRates::came_in`), else size_gb / read speed: the
//!           node's `load_gbps`, else what its observed loads of other models read at, else
//!           the other nodes' loads (`peer_load_gbps`), else `completion_load_gbps` (0 when
//!           loaded with a window that fits),
//!           less how long a load of it that a request started has been under way, less the
//!           seat wait when requests are ahead and their ends are known (they wait for the
//!           same load meanwhile); one past its time: as long again as it has overrun.
//!           Listed as loaded on a node that hides its loads (`backend: openai`), idle past
//!           `completion_keep_alive_s`: the load the pair's requests after such a spell
//!           waited for (zeros count), else the model's other pairs' (`idle_load_s`); not
//!           idle, but another model was sent to the node since the pair's last request: the
//!           load the pair's requests after such a swap waited for (`switch_load_s`, its own
//!           only); sent while such a request waits for its first byte: what is left of that
//!           load
//! prefill = overhead + (prompt - cached) / prefill_tps   cached: only on the node holding it
//! decode  = output_tokens x spt(c)           spt(c) = (spt1 + per_stream x (c - 1)) x pace
//!                                            c - 1 = the streams beside it on average over
//!                                            its decode: the pair's running requests until
//!                                            their predicted ends, the node's other requests
//!                                            throughout (at most seats - 1 in all)
//!                                            per_stream: learned, else the model's pairs' mean
//!                                            relative cost x spt1, else
//!                                            completion_contention_prior x spt1
//!                                            pace: the running answers' seconds per token
//!                                            over spt at the node's decoding streams, >= 1;
//!                                            none running: the node's other models' so
//!           + past the pair's own seat, the wait for the node's: its ceiling across its
//!           models (its seats when its models share them, learned; else its hard cap), from
//!           the predicted ends of every request running on it (`node_wait_s`)
//! seat    = 0 when ahead = 0; else when the seats of the requests running free (their own
//!           predicted ends, `seat_ends`), each request waiting before this one taking the
//!           first free seat for `service`; ahead / seats x service while a running request has
//!           no predicted end (sent before completion mode predicted it)
//! imposed = per_stream / spt(c) x sum over the c - 1 other streams of the seconds they decode
//!           while this one does (until their predicted end, else all of `decode`)
//! rank    = total + imposed
//! ```
//!
//! `imposed` is what sending the request there costs the requests already running on the
//! node: each decodes `per_stream` seconds per token slower while this one decodes. The pairs
//! are ranked by the time the whole fleet spends, the request's own finish plus that (the
//! mean over all requests is what users feel, and a request that saves itself 10 ms by
//! slowing three others by 10 ms each made the mean worse); `total` is what is reported as
//! the request's predicted finish.
//!
//! `service` is the observed seat time of the pair, else this request's own prefill + decode;
//! `output_tokens` the fleet's observed mean for the model (capped by `max_tokens`), else
//! min(`max_tokens`, `wait_heuristic_output_tokens`); with `max_tokens` set and answers seen
//! to requests that set one, `share x max_tokens + (1 - share) x` that, `share` the part of
//! those answers that ran into their limit (`Rates::capped_share`). A rate the pair has not measured comes,
//! in order, from the node's config (`decode_tps`, `prefill_tps`), the mean of the pairs of the
//! same model that measured it, then the priors: decode from model GB over memory bandwidth (a
//! token reads every weight once), prefill `completion_prefill_per_decode` x decode tokens/s.
//! A prefill rate read off prompts of about one length only (`Rates::prefill_floor`: overhead
//! taken as rate, too slow) is raised to that mean with its overhead until the pair measures one.
//!
//! Exploration: a pair never observed is taken as a typical node of the model (the mean of the
//! observed ones, `peer`) as much slower or faster as its node was than the fleet on the
//! models they both served or it streams now (`NodePace`), so an untried node gets a request
//! when such a node would finish it sooner than the known ones at their load; once the model has been served for
//! `completion_explore_after_s`, an untried node gets the exploring discount below as well.
//! A pair whose node the config describes as the same machine as one that answered the model
//! (`Input::twin`, `NodeView::twin_key`) is priced as that one, undiscounted, and a pair never
//! observed no faster than that machine's running answers of the model show (`twin_streams_spt`).
//! One probe per pair (or machine) at a time: while its first request is out, a pair never
//! observed is held back at its priors as long as an observed pair has room (`held_back`).
//! A pair with no response in
//! `completion_explore_after_s` (or none ever) has its prefill and decode multiplied by
//! `completion_explore_factor`, so a node that was slow once is tried again; deterministic in
//! `now_ms`. Never for a turn of a conversation this gateway has served (`cached_on`): it goes
//! where its cache is, unless that node is slower.

use serde::Serialize;

use super::policy::Policy;
use super::types::{
    IdleExpect, LiveDecode, ModelLoad, ModelView, NodeView, PrefillLoad, Rates, RouteRequest,
};

/// The predicted finish of one pair and the rates it came from (the explain row).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Prediction {
    pub total_s: f64,
    pub wait_s: f64,
    pub load_s: f64,
    pub prefill_s: f64,
    pub decode_s: f64,
    /// Seconds this request adds to the streams already decoding on the node (ranked with
    /// `total_s`, not part of it).
    pub imposed_s: f64,
    /// Seconds it would wait for a seat of the node's, were its seats shared by its models,
    /// past `wait_s`, times how likely that is while the answers have not decided it
    /// (`NodeView::seats_shared_p`): ranked with `total_s`, not part of it (its answer is held
    /// against the prediction without it, `SeatTest`). Without it, small requests were sent to
    /// a node whose two seats a slow model held for 10 s more, as if each model had its own.
    pub risk_s: f64,
    /// Requests that must leave a seat before this one runs.
    pub ahead: u32,
    /// Seconds of `wait_s` past the wait for the pair's own seats: the node is at its ceiling
    /// across its models (its seats, when they are shared by its models: learned,
    /// `NodeView::seats_shared`; else its hard cap), so the request waits in the gateway for
    /// one of the node's running requests, whatever their model, to end.
    pub node_wait_s: f64,
    /// What that wait would be if the seats were shared, whether or not they are believed to
    /// be (0 while the node has a seat free): what the node's answers are tested against. On a
    /// node whose seats nobody said, were they only as many as it was seen to run at once
    /// (`NodeView::seats_seen`).
    #[serde(skip)]
    pub shared_wait_s: f64,
    /// On a node whose seats nobody said that serves several models: the wait were the
    /// model's own seats only as many as it was seen to run at once (`own_test_seats`), what
    /// its answer is tested against (`wait_s` when there is no such test).
    #[serde(skip)]
    pub own_wait_s: f64,
    /// Its model has as many requests on the node as it was seen to run at once
    /// (`own_test_seats`): its answer tests the model's seats or nothing, never the node's.
    #[serde(skip)]
    pub own_full: bool,
    /// Streams decoding on the node while this one does.
    pub concurrency: u32,
    /// The seats of the pair its wait was priced at (`priced_seats`, less when a first token
    /// is overdue beside its running streams: `overdue_seats`).
    pub seats: u32,

    /// Prompt tokens taken as cached on this node.
    pub cached_tokens: u32,
    /// Prompt tokens of earlier requests the node prefills before this one (in `wait_s`; 0
    /// unless it was learned to prefill one prompt at a time).
    pub prefill_queue_tokens: u64,
    pub output_tokens: f64,
    /// How many times slower than the rates say the answers running on the pair stream now
    /// (1: as the rates say, or none to tell; `pace`); `decode_tps` includes it.
    pub pace: f64,
    /// Rates used: prompt tokens/s, output tokens/s at `concurrency`, seat time per request.
    pub prefill_tps: f64,
    pub decode_tps: f64,
    pub service_s: f64,
    /// Responses the rates were learned from (0: priors only).
    pub observed: u32,
    /// Its compute terms carry the exploring discount (`completion_explore_factor`).
    pub explored: bool,
    /// Never observed, priced as a node the config describes as the same machine
    /// (`Input::twin`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub twin: bool,
    /// Neither the pair nor any peer of it was observed: the rates are the config's priors,
    /// which can be off by tens of times (its seat is not predicted free at this end).
    #[serde(skip)]
    pub from_priors: bool,
    /// Its first token is due at rates the pair measured: it answered, and its prefill rate
    /// is its own (not its config's, a peer's or a floor raised to theirs). Only then is a late
    /// first token read as a wait for a seat (`Choice::first_measured`).
    #[serde(skip)]
    pub first_measured: bool,
    /// The pair is in a spell on a node that hides its loads (idle past the keep-alive,
    /// displaced by another model, or joining a load under way: `idle_load_s`): what its
    /// answer is held against to tell whether the node loaded the model first.
    #[serde(skip)]
    pub idle: Option<IdleExpect>,
    /// Seconds to its first token: wait, load and prefill without the exploring discount (what
    /// a stalled first token is told by, `fleet::Progress::stalled`).
    #[serde(skip)]
    pub first_s: f64,
}

impl Prediction {
    /// What the pairs are ranked by: the predicted finish, what it costs the streams beside it
    /// and what it risks on seats nobody knows are shared.
    pub fn rank_s(&self) -> f64 {
        self.total_s + self.imposed_s + self.risk_s
    }
}

/// What the prediction reads about one surviving pair.
pub(super) struct Input<'a> {
    pub req: &'a RouteRequest,
    pub node: &'a NodeView,
    pub model: &'a ModelView,
    pub load: ModelLoad,
    pub node_in_flight: u32,
    /// Prompts sent to the node and not answered yet.
    pub node_prefilling: PrefillLoad,
    /// For a pair that has not learned whether its node prefills one prompt at a time: what
    /// the node's other pairs learned (set by the caller while prompts are queued there).
    pub node_prefill_shared: Option<bool>,
    pub rates: Rates,
    /// What the fleet observed for the model elsewhere (see [`peer_rates`]).
    pub peer: Option<Peers>,
    /// The best prefill and decode its node has shown on other models (slowed by size, and
    /// no faster than the model's streams show, `decide::live_streams`, nor than its typical
    /// node at this one's pace, [`no_faster_than_peers`]); set (by the caller) only for a pair
    /// never observed.
    pub node_best: Option<Rates>,
    /// How many times slower than the nodes that observed the model its node was on the
    /// models they both served, else than the fleet ([`NodePace`]); set (by the caller) only
    /// for a pair never observed or with a rate not learned yet (the typical node's is then
    /// scaled by it).
    pub node_pace: Option<NodePace>,
    /// The same model's rates on a node the config describes as the same machine
    /// ([`NodeView::twin_key`]): how a pair never observed is expected to do; set (by the
    /// caller) only for such a pair, from the twin that answered last.
    pub twin: Option<Rates>,
    /// A request of the model is out on this pair, or on a never-observed pair of the model on
    /// a node of the same machine (`NodeView::twin_key`), that has not answered (set by the
    /// caller for a pair never observed and not priced as its twin, `twin`): its probe is out
    /// (`held_back`).
    pub probing_here: bool,
    /// Seconds per token of one stream of the model on the node's twins now (their running
    /// answers; set by the caller for a pair never observed): it is priced no faster.
    pub twin_streams_spt: Option<f64>,
    pub needed_tokens: u64,
    pub now_ms: u64,
    /// Seconds until each request running on the pair is predicted to end, soonest first, one
    /// past its predicted end at 0 (`sort_ends`); empty when none is known.
    pub seat_ends: &'a [f64],
    /// Requests running (`in_flight`) and waiting (`pending`) on the node across its models,
    /// and the predicted ends of those running (as `seat_ends`); filled by the caller only
    /// when the node's seats are all taken (`node_in_flight >= seats`), else default / empty.
    pub node_load: ModelLoad,
    pub node_ends: &'a [f64],
    /// How fast the answers running on the pair stream now (see `pace`).
    pub live: Option<LiveDecode>,
    /// With nothing of the pair streaming: how many times slower than their rates the node's
    /// other models stream now (>= 1; set by the caller). A node slowed by heat or another
    /// user is slowed for every model it holds.
    pub node_slowdown: f64,
}

const MIN_SPT: f64 = 1e-4;

/// How many times slower than the other nodes that served the same models a node was, over the
/// models it served (geometric means; below 1: faster): a pair it never served is expected at
/// its model's typical rates times this. A laptop three times slower than the fleet on the
/// small model is not tried on the mid one as if it were a typical node of it (the user fleet,
/// nodes by URL only: a 7,000-token prompt sent to it waited 4 s where the GPUs answer in 0.3).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NodePace {
    /// Seconds per output token over the others'.
    pub decode: f64,
    /// The others' prompt tokens/s over its own (`None`: no prefill rate of its, read off
    /// prompts of several lengths, beside another node's of the same model).
    pub prefill: Option<f64>,
}

/// Sums of the logs of the rates the fleet observed for one model (`node_pace`).
#[derive(Debug, Clone, Copy, Default)]
pub struct LogRates {
    spt: (f64, u32),
    prefill: (f64, u32),
}

impl LogRates {
    /// One observed pair's rates.
    pub fn add(&mut self, r: &Rates) {
        if let Some(spt) = positive(r.decode_spt) {
            self.spt.0 += spt.ln();
            self.spt.1 += 1;
        }
        if let Some(tps) = positive(r.prefill_tps).filter(|_| !r.prefill_floor) {
            self.prefill.0 += tps.ln();
            self.prefill.1 += 1;
        }
    }
}

/// A node's [`NodePace`] from `(its rates, the fleet's LogRates, whether its rates are among
/// those)` for each model it served or is streaming; `None` when no model it served was served
/// elsewhere.
pub fn node_pace(served: impl IntoIterator<Item = (Rates, LogRates, bool)>) -> Option<NodePace> {
    let (mut decode, mut prefill) = ((0.0, 0u32), (0.0, 0u32));
    for (r, all, included) in served {
        // Its log rate less the mean of the others' (the sums less its own term).
        let versus = |own: Option<f64>, (sum, n): (f64, u32)| {
            let own = positive(own)?.ln();
            let (sum, n) = if included {
                (sum - own, n.checked_sub(1)?)
            } else {
                (sum, n)
            };
            (n >= 1).then(|| own - sum / f64::from(n))
        };
        if let Some(d) = versus(r.decode_spt, all.spt) {
            decode = (decode.0 + d, decode.1 + 1);
        }
        if let Some(p) = versus(r.prefill_tps.filter(|_| !r.prefill_floor), all.prefill) {
            prefill = (prefill.0 - p, prefill.1 + 1);
        }
    }
    let mean = |(sum, n): (f64, u32)| (n > 0).then(|| (sum / f64::from(n)).exp());
    Some(NodePace {
        decode: mean(decode)?,
        prefill: mean(prefill),
    })
}

fn positive(x: Option<f64>) -> Option<f64> {
    x.filter(|v| v.is_finite() && *v > 0.0)
}

/// The priors of a pair before any observation: (prompt tokens/s, seconds per output token of
/// one stream), from the node's `prefill_tps` / `decode_tps`, else model GB over bandwidth.
pub fn priors(p: &Policy, node: &NodeView, model: &ModelView) -> (f64, f64) {
    let spt = match positive(node.decode_tps) {
        Some(tps) => 1.0 / tps,
        None => {
            let bw = positive(node.bandwidth_gbps).unwrap_or(p.wait_heuristic_bandwidth_gbps);
            positive(Some(model.size_gb)).unwrap_or(p.completion_prior_model_gb) / bw
        }
    }
    .max(MIN_SPT);
    let prefill = positive(node.prefill_tps).unwrap_or(p.completion_prefill_per_decode / spt);
    (prefill, spt)
}

/// What the fleet has observed for one model on the nodes that served it: their mean rates,
/// the priors of a pair not yet observed (a typical node); cold-load time is the node's own
/// (its disk), never a peer's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peers {
    pub mean: Rates,
    /// What each further concurrent stream costs, relative to one stream's seconds per token
    /// (mean over the pairs seen at several concurrencies): the prior of a pair seen only at
    /// one, so it does not look contention-free next to the nodes whose cost is known.
    pub contention: Option<f64>,
    /// Output tokens per response over all the model's pairs (weighted by responses). How
    /// long an answer is depends on the model and the workload, not on the node: every
    /// candidate is predicted with this one figure, so a node that happened to serve short
    /// answers does not look faster for it.
    pub output_tokens: Option<f64>,
    /// Of the model's answers to requests that set an output limit, the share that ran into
    /// it (weighted by responses, as `output_tokens`).
    pub capped_share: Option<f64>,
    /// A never-observed pair of the model has a request in flight (set by the caller, which
    /// sees the loads): while fewer than two pairs answered, one probe per model at a time,
    /// fleet-wide (`held_back`; after, one per pair or machine), and no exploring discount for
    /// the others meanwhile.
    pub probing: bool,
    /// Pairs observed: a mean of one is that pair, the best, no typical node.
    pub pairs: u32,
    /// The mean over the pairs that showed one of `Rates::idle_load_s`: what an idle pair of
    /// the model on a node that hides its loads waited for.
    pub idle_load_s: Option<f64>,
    /// Some observed pair of the model could take the request now (a seat free, the window
    /// fits; set by the caller). When none can, nothing is held back (`held_back`).
    pub room: bool,
    /// When the model's first answer came (ms; the earliest `Rates::first_ms`): how long the
    /// fleet has been serving it while its untried nodes waited.
    pub since_ms: Option<u64>,
}

/// [`Peers`] from the rates of every pair of one model; `None` when none was observed.
pub fn peer_rates(all: impl IntoIterator<Item = Rates>) -> Option<Peers> {
    #[derive(Default)]
    struct Mean(f64, u32);
    impl Mean {
        fn add(&mut self, v: Option<f64>) {
            if let Some(v) = positive(v) {
                self.add_any(v);
            }
        }
        /// Zero included.
        fn add_any(&mut self, v: f64) {
            self.0 += v;
            self.1 += 1;
        }
        fn get(&self) -> Option<f64> {
            (self.1 > 0).then(|| self.0 / f64::from(self.1))
        }
    }
    let (mut prefill, mut spt, mut service) = (Mean::default(), Mean::default(), Mean::default());
    let (mut contention, mut per_stream) = (Mean::default(), Mean::default());
    let mut overhead = Mean::default();
    let mut idle_load = Mean::default();
    let (mut output_sum, mut output_n) = (0.0, 0.0);
    let (mut capped_sum, mut capped_n) = (0.0, 0.0);
    let mut first_output: Option<f64> = None;
    let (mut shared, mut decided, mut pairs) = (0u32, 0u32, 0u32);
    let mut since_ms: Option<u64> = None;
    // Floors (`Rates::prefill_floor`) count for the mean only when no pair measured one; their
    // overhead (0 by construction) never.
    let mut floor = Mean::default();
    for r in all.into_iter().filter(|r| r.observed > 0) {
        pairs += 1;
        since_ms = match (since_ms, r.first_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(s) = r.prefill_shared {
            shared += u32::from(s);
            decided += 1;
        }
        if r.prefill_floor {
            floor.add(r.prefill_tps);
        } else {
            prefill.add(r.prefill_tps);
            overhead.add_any(r.prefill_overhead_s.max(0.0));
        }
        spt.add(r.decode_spt);
        service.add(r.service_s);
        if let Some(l) = r.idle_load_s.filter(|l| l.is_finite()) {
            idle_load.add_any(l.max(0.0));
        }
        per_stream.add(r.decode_spt_per_stream);
        if let Some(o) = positive(r.output_tokens) {
            output_sum += o * f64::from(r.observed);
            output_n += f64::from(r.observed);
        }
        if let Some(c) = r.capped_share.filter(|c| c.is_finite()) {
            capped_sum += c.clamp(0.0, 1.0) * f64::from(r.observed);
            capped_n += f64::from(r.observed);
        }
        if let (Some(b), Some(a)) = (r.decode_spt_per_stream, positive(r.decode_spt)) {
            // A measured zero counts (a node that batches for free).
            contention.add_any(b.max(0.0) / a);
        }
        first_output = first_output.or(r.output_tokens);
    }
    if pairs == 0 {
        return None;
    }
    Some(Peers {
        mean: Rates {
            prefill_tps: prefill.get().or(floor.get()),
            prefill_overhead_s: overhead.get().unwrap_or(0.0),
            // How the model's nodes prefill: as most of those that showed it do.
            prefill_shared: (decided > 0).then_some(shared * 2 > decided),
            prefill_floor: prefill.get().is_none(),
            decode_spt: spt.get(),
            decode_spt_per_stream: per_stream.get(),
            service_s: service.get(),
            output_tokens: first_output,
            ..Rates::default()
        },
        contention: contention.get(),
        output_tokens: (output_n > 0.0).then(|| output_sum / output_n),
        capped_share: (capped_n > 0.0).then(|| capped_sum / capped_n),
        probing: false,
        pairs,
        idle_load_s: idle_load.get(),
        room: true,
        since_ms,
    })
}

/// The rates a pair is predicted with (`effective_rates`): its own once observed. Never
/// observed: its twin's, else the peers' mean (a typical node of the model); with no peers,
/// its own (empty: the priors).
/// A probe of the model is out and only one pair was ever observed: that pair's rates would
/// make every untried pair a copy of it (the mean of one is the best) and a second probe would
/// go out at once. The pair keeps its own (the priors) until the probe answers — while the
/// observed pair has room. Once it is full a request would wait there behind its seats while
/// untried nodes sat idle, priced at priors that can be tens of times too slow (a burst of 16
/// queued on the one node seen while a faster one had never been tried): then an untried
/// pair is taken as a copy of the observed one, and the wait decides.
///
/// Nor is a pair whose own probe is out (`Input::probing_here`: on it, or on its twin's
/// never-observed pair; none answered on that machine) sent another while an observed pair has
/// room, however many answered: the probe's answer says within its first tokens what the node
/// is, and until then every request sent there shares its fate. Priced as a typical node (the
/// mean of a fast and a slower one is faster than the slower), three alike boxes 7x slower
/// than the fleet, whose speed nobody said, took 13 requests (11-21 s each) before the first
/// of them answered, beside a known node with free seats.
fn held_back(x: &Input<'_>) -> bool {
    x.rates.observed == 0
        && x.peer
            .is_some_and(|p| p.room && (x.probing_here || (p.pairs < 2 && probe_out(x, &p))))
}

/// A never-observed pair of the model is being tried: this one, or another anywhere.
fn probe_out(x: &Input<'_>, peers: &Peers) -> bool {
    peers.probing || x.load.busy()
}

/// A typical node's rates (`mean`) as much slower (or faster) as the node's `pace` says.
fn at_pace(mean: Rates, pace: Option<NodePace>) -> Rates {
    match pace {
        Some(pace) => Rates {
            decode_spt: mean.decode_spt.map(|s| s * pace.decode),
            decode_spt_per_stream: mean.decode_spt_per_stream.map(|s| s * pace.decode),
            prefill_tps: mean.prefill_tps.map(|t| t / pace.prefill.unwrap_or(1.0)),
            // Scaled by the node's pace, a typical rate read off one prompt length is no floor
            // of this node's to raise back to that rate (`predict`): that undid the pace (a
            // Mac reading 1,200 prompt tokens/s was priced at a GPU's 22,000 for its untried
            // model, and sent 12,000-token prompts).
            prefill_floor: mean.prefill_floor && pace.prefill.is_none(),
            ..mean
        },
        None => mean,
    }
}

/// A node's best on its other models (`best`, for a pair of it never observed) no faster than
/// the typical node of the model at the node's `pace`, where the model has `peers`: a pair
/// held back while a probe of its model is out (`held_back`) keeps its own rates, and its own
/// are this best. A 3b's on a node by URL whose sizes nobody reported priced an untried 70b
/// at 126 tokens/s where the one node that had answered it, 2.4x faster on the 3b, decoded it
/// at 29; four requests went to it in 80 ms and waited 27-76 s. (A typical prefill read off
/// one prompt length is a floor: it bounds nothing.)
pub(super) fn no_faster_than_peers(
    best: Rates,
    peers: Option<Peers>,
    pace: Option<NodePace>,
) -> Rates {
    let Some((peers, pace)) = peers.zip(pace) else {
        return best;
    };
    let typical = at_pace(peers.mean, Some(pace));
    let prefill_bounds = pace.prefill.is_some() && !peers.mean.prefill_floor;
    Rates {
        decode_spt: match (best.decode_spt, positive(typical.decode_spt)) {
            (Some(spt), Some(t)) => Some(spt.max(t)),
            (spt, _) => spt,
        },
        prefill_tps: match (best.prefill_tps, positive(typical.prefill_tps)) {
            (Some(tps), Some(t)) if prefill_bounds => Some(tps.min(t)),
            (tps, _) => tps,
        },
        ..best
    }
}

fn effective_rates(p: &Policy, x: &Input<'_>) -> (Rates, bool) {
    let twin = x.twin.filter(|_| x.rates.observed == 0);
    // The rates the node's pace scaled (decode, prefill), when the typical node is the
    // estimate.
    let mut paced = (false, false);
    let (rates, optimistic) = match (twin, x.peer) {
        // A node configured as one that answered is priced as that one, not as the model's
        // best node: of two alike laptops, the second is not tried as if it were the
        // workstation. Nor discounted by `completion_explore_factor`: it gets a request when
        // its twin's price wins (which teaches its own), not one per node to learn what the
        // twin already showed.
        (Some(twin), _) => (
            Rates {
                load_s: x.rates.load_s,
                idle_load_s: x.rates.idle_load_s,
                switch_load_s: x.rates.switch_load_s,
                observed: 0,
                last_ms: None,
                gap_s: None,
                ..twin
            },
            true,
        ),
        _ if held_back(x) => (x.rates, false),
        // A typical node of the model (the mean of those that answered), not its best: it is
        // tried when that beats what the known nodes offer at their load, so a slow box is not
        // handed a request as if it were the fastest every time the fast ones are busy. Once
        // the model has been served for `completion_explore_after_s` and the node still has
        // not been tried, it gets the exploring discount too: not ignored for good at a load
        // the known nodes carry alone (a new fast box among slow ones).
        (None, Some(peers)) if x.rates.observed == 0 => {
            // One probe at a time: not while an untried pair of the model is being tried.
            let waited = !probe_out(x, &peers)
                && peers.since_ms.is_some_and(|t| {
                    x.now_ms.saturating_sub(t) > p.completion_explore_after_s.saturating_mul(1000)
                });
            // A typical node of the model, as much slower (or faster) as the node was than
            // the fleet on the models they both served.
            let typical = at_pace(peers.mean, x.node_pace);
            paced = x.node_pace.map_or((false, false), |pace| {
                (
                    peers.mean.decode_spt.is_some(),
                    pace.prefill.is_some() && peers.mean.prefill_tps.is_some(),
                )
            });
            (
                Rates {
                    load_s: x.rates.load_s,
                    idle_load_s: x.rates.idle_load_s,
                    switch_load_s: x.rates.switch_load_s,
                    ..typical
                },
                !waited,
            )
        }
        _ => (x.rates, false),
    };
    // A node as fast on its other models as the estimate says is at least that fast on this
    // one: a node known to be quick is tried first, even while another probe is out. Only a
    // rate it made faster is optimism (no discount on it); one slower on its other models
    // leaves the estimate, and its discount, as they were.
    // Not where its pace against the fleet made the estimate: its best is often a smaller
    // model's, and per token a model reads and computes in proportion to its weights (a
    // laptop's 8b at 150 tokens/s says nothing of its 14b but what the pace already says).
    let nb = x.node_best.map(|nb| Rates {
        decode_spt: nb.decode_spt.filter(|_| !paced.0),
        prefill_tps: nb.prefill_tps.filter(|_| !paced.1),
        ..nb
    });
    let (rates, optimistic) = match nb {
        Some(nb) => {
            let merged = Rates {
                prefill_tps: better(rates.prefill_tps, nb.prefill_tps, f64::max),
                decode_spt: better(rates.decode_spt, nb.decode_spt, f64::min),
                ..rates
            };
            let faster =
                merged.prefill_tps != rates.prefill_tps || merged.decode_spt != rates.decode_spt;
            (merged, optimistic || faster)
        }
        None => (rates, optimistic),
    };
    let prior_spt = priors(p, x.node, x.model).1;
    (
        no_faster_than_twins(rates, x.twin_streams_spt, prior_spt),
        optimistic,
    )
}

/// A never-observed pair's `rates` no faster than its twins' streams of the model show now
/// (`Input::twin_streams_spt`), its prefill slowed alike (as a node's best on a bigger model
/// is, `decide::Shown::at_size`). With no decode rate in `rates` (held back, `held_back`) the
/// bound is on the priors' `prior_spt`: a twin streaming faster than them does not make a pair
/// whose probe is out look faster.
fn no_faster_than_twins(rates: Rates, twin_spt: Option<f64>, prior_spt: f64) -> Rates {
    let spt = positive(rates.decode_spt).unwrap_or(prior_spt);
    match positive(twin_spt) {
        Some(twin) if twin > spt => Rates {
            decode_spt: Some(twin),
            prefill_tps: rates.prefill_tps.map(|tps| tps * spt / twin),
            ..rates
        },
        _ => rates,
    }
}

/// The seats a request is priced against. A node whose seats nobody said is assumed a
/// batching server's many and is sent that many (never held for fewer), but priced at twice
/// as many as it was seen to run at once until it runs more: a burst is not all sent to the
/// one node whose seats nobody knows while the others sit idle (a server with 4 queues the
/// rest inside, unseen); each time it is seen to run more at once the figure doubles.
///
/// A model found to run no more at once than it was seen to (its own seats on such a node,
/// `ModelView::seats_learned`) is priced at those.
pub(super) fn priced_seats(node: &NodeView, model: &ModelView) -> u32 {
    let seats = node_priced_seats(node);
    model
        .seats_learned
        .map_or(seats, |own| seats.min(own.max(1)))
}

/// [`priced_seats`], unless a first token of the pair is overdue beside its running streams
/// (`LiveDecode::seated`) on a node whose seats nobody said: it waits inside for a seat, so
/// the node runs no more of the model at once than the requests sent before it, whatever it
/// was priced at. The seats are learned later, from answers (`fleet::sharing`); the requests
/// sent until then are priced at what is seen now, and once they are, at them. A one-seat
/// server by URL took six requests of a burst, priced at two seats, before the first of them
/// came back from its wait. (Only the prediction: `decide`'s test of whether an observed pair
/// has room for its model, `completion::held_back`, reads `priced_seats` alone.)
///
/// Not on a node that prefills one prompt at a time (`prefills_in_turn`): there a first token
/// is late behind the prompts ahead of it as often as behind a seat (a GPU with 24 seats and
/// 20k-token prompts was priced at one to five).
fn overdue_seats(x: &Input<'_>, prefills_in_turn: bool) -> u32 {
    let seats = priced_seats(x.node, x.model);
    // Still guessed: neither the node's seats nor the model's own found by answers.
    let guessed = x.node.seats_assumed && !x.node.seats_shared && x.model.seats_learned.is_none();
    match x.live {
        Some(LiveDecode {
            seated: Some(n), ..
        }) if guessed && !prefills_in_turn => seats.min(n.max(1)),
        _ => seats,
    }
}

/// The node's seats as priced, across its models (what its concurrency and its ceiling are
/// counted against; one model's own seats are not the node's).
fn node_priced_seats(node: &NodeView) -> u32 {
    let seats = node.seats.max(1);
    if node.seats_assumed && !node.seats_shared {
        seats.min(node.seats_seen.max(1).saturating_mul(2))
    } else {
        seats
    }
}

/// The model's own seats a request sent now is tested against, on a node whose seats nobody
/// said that serves several models (whose seats may be each model's, as Ollama keeps them):
/// as many as the model was seen to run at once. `None` once they are learned, on a node with
/// one model (its node's seats are tested, `decide::test_seats`) or with known seats.
pub(super) fn own_test_seats(node: &NodeView, model: &ModelView) -> Option<u32> {
    (node.own_seats_unknown() && model.seats_learned.is_none() && model.seats_seen > 0)
        .then_some(model.seats_seen)
}

/// The better of two rates (`pick`: max or min), either one when the other is unknown.
pub(super) fn better(a: Option<f64>, b: Option<f64>, pick: fn(f64, f64) -> f64) -> Option<f64> {
    match (positive(a), positive(b)) {
        (Some(a), Some(b)) => Some(pick(a, b)),
        (a, b) => a.or(b),
    }
}

/// Predicted finish of `x` with `cached` prompt tokens already in the node's cache.
pub(super) fn predict(p: &Policy, x: &Input<'_>, cached: u32) -> Prediction {
    let (rates, optimistic) = effective_rates(p, x);
    let r = &rates;
    // Undecided (no response had one ahead yet): as the node's other models showed (the queue
    // is the node's), else as the model's other nodes showed (a pair never observed has
    // theirs in `r`), else each seat on its own. Taking an unknown node to queue cost bursts
    // 0.53 -> 0.63 s and slowdown 0.38 -> 0.46 s in the placement bench, where nodes do not
    // queue; a node that does is found out within its first few overlapping requests.
    let shared = x
        .rates
        .prefill_shared
        .or(x.node_prefill_shared)
        .or(r.prefill_shared)
        .or(x.peer.and_then(|p| p.mean.prefill_shared))
        .unwrap_or(false);
    let (node_seats, seats) = (node_priced_seats(x.node), overdue_seats(x, shared));
    // Decode: seconds per token of one stream, then at the node's concurrency.
    let (_, prior_spt) = priors(p, x.node, x.model);
    // A rate the pair has not measured yet (a line too flat to read it from: only short
    // prompts so far) is the fleet's typical one before it is a prior: a prior far below the
    // real rate would keep the pair from ever getting the prompts that would measure it.
    let typical = x
        .peer
        .filter(|_| !held_back(x))
        .map(|peers| at_pace(peers.mean, x.node_pace));
    let spt1 = positive(r.decode_spt)
        .or(positive(x.node.decode_tps).map(|tps| 1.0 / tps))
        .or_else(|| typical.and_then(|t| positive(t.decode_spt)))
        .unwrap_or(prior_spt)
        .max(MIN_SPT);
    // Unknown (seen at one concurrency only): the fleet's relative cost, else the prior.
    let per_stream = r
        .decode_spt_per_stream
        .or_else(|| x.peer.and_then(|p| p.contention).map(|c| c * spt1))
        .or(Some(p.completion_contention_prior * spt1))
        .filter(|b| b.is_finite())
        .map_or(0.0, |b| b.max(0.0));
    let concurrency = x.node_in_flight.saturating_add(1).min(node_seats).max(1);
    let pace = match x.live.filter(|l| l.tokens > 0.0) {
        Some(live) => pace(Some(live), spt1, per_stream),
        None => x.node_slowdown.max(1.0),
    };
    let per_stream = per_stream * pace;
    let mut spt = spt1 * pace + per_stream * f64::from(concurrency - 1);
    // A floor (prompts of one length only: overhead taken as rate) is raised to the model's
    // typical measured rate, with its overhead, until prompts of other lengths measure the
    // pair: one short prompt's TTFT must not make a node look too slow for long ones.
    let raised = x
        .peer
        .map(|p| p.mean)
        .filter(|_| r.prefill_floor)
        .and_then(|m| Some((positive(m.prefill_tps)?, m.prefill_overhead_s)))
        .filter(|(tps, _)| positive(r.prefill_tps).is_some_and(|own| *tps > own));
    let prefill_tps = raised
        .map(|(tps, _)| tps)
        .or(positive(r.prefill_tps))
        .or(positive(x.node.prefill_tps))
        .or_else(|| typical.and_then(|t| positive(t.prefill_tps)))
        .unwrap_or(p.completion_prefill_per_decode / spt1);
    let cap = x.req.max_output_tokens.map_or(f64::INFINITY, f64::from);
    let learned_output = x.peer.and_then(|p| p.output_tokens).or(r.output_tokens);
    let typical_output = positive(learned_output)
        .unwrap_or(f64::from(p.wait_heuristic_output_tokens))
        .min(cap);
    // A request's own limit is its answer's length as often as answers ran into theirs: a
    // client that sets it to what it wants (an agent's step, a benchmark's `num_predict`) is
    // read by it, one that sets a generous ceiling by the model's typical answer. The typical
    // answer alone priced a 300-token request at the 65 the first, short answers showed.
    let capped_share = x
        .peer
        .and_then(|p| p.capped_share)
        .or(r.capped_share)
        .filter(|s| s.is_finite() && cap.is_finite());
    let output_tokens = match capped_share {
        Some(share) => {
            let share = share.clamp(0.0, 1.0);
            share * cap + (1.0 - share) * typical_output
        }
        None => typical_output,
    };
    let cached = cached.min(x.req.prompt_tokens);
    let overhead = match raised {
        Some((_, o)) => o,
        None => r.prefill_overhead_s,
    };
    let overhead = if overhead.is_finite() {
        overhead.max(0.0)
    } else {
        0.0
    };
    let mut prefill_s = overhead + f64::from(x.req.prompt_tokens - cached) / prefill_tps;
    let mut decode_s = output_tokens * spt;
    let service_s = positive(r.service_s).unwrap_or(prefill_s + decode_s);
    // A turn of a conversation this gateway served goes where its cache is: no exploring.
    // Nor for a pair priced as its twin, as its node's best on other models, or (until the
    // model has been served `completion_explore_after_s`) as a typical node (`optimistic`).
    let unexplored = (prefill_s, spt);
    let explored = x.req.cached_on.is_none()
        && r.last_ms
            .is_none_or(|t| x.now_ms.saturating_sub(t) > p.completion_explore_after_s * 1000);
    if explored && !optimistic {
        prefill_s *= p.completion_explore_factor;
        decode_s *= p.completion_explore_factor;
    }
    let depth = x.load.depth();
    let ahead = depth.saturating_add(1).saturating_sub(seats);
    // A node that prefills one prompt at a time does those sent before this one first (less
    // what it has done of the first since it could start): this one's prefill starts once
    // they are done and a seat is free, whichever is later.
    let q = x.node_prefilling;
    let prefill_queue_tokens = if shared && q.tokens > 0 {
        let done = prefill_tps * x.now_ms.saturating_sub(q.head_ms) as f64 / 1000.0;
        (q.tokens as f64 - done).max(0.0)
    } else {
        0.0
    };
    // From the running requests' predicted ends (`Some`), which include any load they wait for.
    let known_wait = (ahead > 0)
        .then(|| seat_wait(seats, &x.load, x.seat_ends, service_s))
        .flatten();
    let seat_wait_s = if ahead == 0 {
        0.0
    } else {
        known_wait.unwrap_or(f64::from(ahead) / f64::from(seats) * service_s)
    };
    let own_test = own_test_seats(x.node, x.model);
    let own_full = own_test.is_some_and(|t| depth >= t);
    let own_seat_wait_s = match own_test {
        Some(t) if t < seats && depth >= t => seat_wait(t, &x.load, x.seat_ends, service_s)
            .unwrap_or(f64::from(depth.saturating_add(1) - t) / f64::from(t) * service_s),
        _ => seat_wait_s,
    };
    // The node's own ceiling across its models (its seats when its models share them,
    // learned; else the hard cap): past it the request waits in the gateway until one of the
    // node's running requests, whatever its model, ends. And what that wait would be were the
    // seats shared, whether or not they are believed to be: what answers are tested against.
    let node_wait = |cap: u32| {
        let ahead = x.node_load.depth().saturating_add(1).saturating_sub(cap);
        if ahead == 0 {
            return 0.0;
        }
        // Sent past the ceiling (before it was known), requests wait inside the node: they
        // take the first seats to free, as the gateway's waiters do.
        let over = x.node_load.in_flight.saturating_sub(cap);
        let load = ModelLoad {
            in_flight: x.node_load.in_flight - over,
            pending: x.node_load.pending.saturating_add(over),
            ..x.node_load
        };
        seat_wait(cap, &load, x.node_ends, service_s)
            .unwrap_or(f64::from(ahead) / f64::from(cap) * service_s)
    };
    let shared_wait_s = node_wait(node_seats);
    let node_wait_s = match x.node.hard_cap {
        _ if x.node.seats_shared => shared_wait_s,
        0 => 0.0,
        cap if cap <= node_seats => shared_wait_s,
        cap => node_wait(cap),
    };
    // A node whose seats nobody said is tested against as many as it was seen to run.
    let shared_wait_s = match super::decide::test_seats(x.node) {
        t if t < node_seats => node_wait(t),
        _ => shared_wait_s,
    };
    let node_wait_s = (node_wait_s - seat_wait_s).max(0.0);
    let wait_s = (seat_wait_s + node_wait_s).max(prefill_queue_tokens / prefill_tps);
    // While the answers have not said whether the node's models share its seats, the wait
    // for a node-wide seat past `wait_s` (as its answer is tested against), weighed by how
    // likely they do (`risk_s`); none where nothing of another model runs.
    let others_run = x.node.models.len() > 1 && x.node_in_flight > x.load.in_flight;
    let risk_s = if x.node.seats_shared || !others_run {
        0.0
    } else {
        let shared = seat_wait_s
            .max(shared_wait_s)
            .max(prefill_queue_tokens / prefill_tps);
        x.node.seats_shared_p.clamp(0.0, 1.0) * (shared - wait_s).max(0.0)
    };
    let own_wait_s = (own_seat_wait_s + node_wait_s).max(wait_s);
    // The requests ahead on the pair wait for the same load (the model is not in, a request
    // holds it; or one the node hides is under way): it runs while this one waits for their
    // seats, whose predicted ends include it,
    // and only what is left of it after that wait is its own. Not so for a reload to a larger
    // window (it starts when the requests on the loaded one are done) nor for a wait guessed
    // from the service time, which has no load in it.
    let reload = x
        .model
        .loaded_context
        .is_some_and(|ctx| ctx > 0 && u64::from(ctx) < x.needed_tokens);
    let spell = spell(p, x);
    let overlaps = known_wait.is_some()
        && x.load.in_flight > 0
        && (!x.model.loaded || (!reload && spell.is_some_and(|s| s.joined.is_some())));
    let load_s = load_s(p, x, spell);
    let load_s = if overlaps {
        (load_s - seat_wait_s).max(0.0)
    } else {
        load_s
    };
    let start = wait_s + load_s + prefill_s;
    let others = (concurrency - 1) as usize;
    // Stream-seconds decoded beside this one: the pair's running requests until their
    // predicted ends, the rest (other models' streams, or those a waiting request would run
    // beside) for all of its decode. One past its predicted end (0) is still running, for
    // how long nobody knows: all of it too (on a node that slowed down every running request
    // is late, and counting them as ended made it look free of contention).
    let beside_s = |decode_s: f64| {
        let mut overlap: f64 = 0.0;
        let mut known = 0;
        if ahead == 0 {
            for e in x.seat_ends.iter().take(others) {
                overlap += if *e <= 0.0 {
                    decode_s
                } else {
                    (e - start).clamp(0.0, decode_s)
                };
                known += 1;
            }
        }
        overlap + (others - known) as f64 * decode_s
    };
    // Its decode pays for the streams beside it on average, not for every request in flight
    // now: a long prompt decodes after most of what runs now has ended (and the contention is
    // learned against the streams that decoded, `queue::decoding`).
    if per_stream > 0.0 && others > 0 && decode_s > 0.0 {
        let beside = beside_s(decode_s) / decode_s;
        let spt_beside = spt1 * pace + per_stream * beside;
        decode_s *= spt_beside / spt;
        spt = spt_beside;
    }
    let total_s = wait_s + load_s + prefill_s + decode_s;
    let from_priors = r.observed == 0 && !optimistic && typical.is_none();
    let imposed_s = if per_stream > 0.0 && others > 0 {
        per_stream / spt * beside_s(decode_s)
    } else {
        0.0
    };
    Prediction {
        total_s: if total_s.is_nan() {
            f64::INFINITY
        } else {
            total_s
        },
        wait_s,
        load_s,
        prefill_s,
        decode_s,
        imposed_s: if imposed_s.is_finite() {
            imposed_s
        } else {
            0.0
        },
        risk_s: if risk_s.is_finite() { risk_s } else { 0.0 },
        ahead,
        node_wait_s,
        shared_wait_s,
        own_wait_s,
        own_full,
        concurrency,
        seats,
        pace,
        cached_tokens: cached,
        prefill_queue_tokens: prefill_queue_tokens.round() as u64,
        output_tokens,
        prefill_tps,
        decode_tps: 1.0 / spt,
        service_s,
        observed: r.observed,
        explored: explored && !optimistic,
        twin: x.rates.observed == 0 && x.twin.is_some(),
        from_priors,
        first_measured: x.rates.observed > 0
            && raised.is_none()
            && positive(x.rates.prefill_tps).is_some(),
        first_s: wait_s + load_s + unexplored.0,
        idle: spell.filter(|_| x.model.loaded).map(|spell| IdleExpect {
            first_s: wait_s + unexplored.0,
            spt: unexplored.1,
            guessed: from_priors,
            prompt_tokens: x.req.prompt_tokens - cached,
            joined: spell.joined.is_some(),
            switch: spell.switch,
            stalled_since_ms: spell.stalled_since_ms,
            load_s: spell.known_s,
        }),
    }
}

/// How many times slower than `spt1` + `per_stream` at the node's decoding streams the answers
/// running on the pair stream now: their seconds over their tokens past the first chunk. At
/// least 1: a node that slowed down (heat, another user, a run-time slowdown) shows it in its
/// running answers long before one of them ends and teaches the rates; until then every
/// request sent there would be priced at the old speed. A node running faster than its rates
/// is left to them (each response teaches it at its end).
pub(super) fn pace(live: Option<LiveDecode>, spt1: f64, per_stream: f64) -> f64 {
    let Some(l) = live.filter(|l| l.tokens > 0.0 && l.secs.is_finite()) else {
        return 1.0;
    };
    let expected = spt1 + per_stream * f64::from(l.node_decoding.max(1) - 1);
    let seen = l.secs / l.tokens;
    if expected > 0.0 && seen > expected {
        seen / expected
    } else {
        1.0
    }
}

/// Requests waiting before one are placed one at a time this far; beyond, they drain at
/// `seats / service` (what the heuristic assumes of all of them).
const SEAT_QUEUE_STEPS: u32 = 64;

/// Seconds until a seat frees for a request that arrives behind `load.pending` waiters on a
/// full pair: the seats free when the running requests end (`ends`, seconds from now), and
/// each waiter ahead takes the first free seat for `service_s`. `None` when some running request
/// has no predicted end (the caller falls back on `ahead / seats x service`).
///
/// A long prompt and a short one hold a seat for very different times: counting both as
/// `service / seats` sent a request to whichever full node looked alike, not to the one whose
/// seat frees first.
fn seat_wait(seats: u32, load: &ModelLoad, ends: &[f64], service_s: f64) -> Option<f64> {
    let (running, pending) = seat_queue(seats, load, ends)?;
    // When each seat is next free, soonest first: the idle seats now, then the `running`
    // soonest ends (a request that ended between the counts and the ends is gone from both
    // soon). The caller sorts them once per pair (`sort_ends`); sorting them here again on
    // every call was most of a decision's time on a full 256-seat server.
    let sorted;
    let ends = if ends.is_sorted_by(|a, b| a.max(0.0) <= b.max(0.0)) {
        ends
    } else {
        let mut copy = ends.to_vec();
        sort_ends(&mut copy);
        sorted = copy;
        &sorted
    };
    let mut free = FreeSeats {
        idle: (seats as usize).saturating_sub(running),
        ends: &ends[..running],
        again: [0.0; SEAT_QUEUE_STEPS as usize],
        head: 0,
        tail: 0,
    };
    let service = service_s.max(0.0);
    let stepped = pending.min(SEAT_QUEUE_STEPS);
    for _ in 0..stepped {
        let t = free.take()? + service;
        free.again[free.tail] = t;
        free.tail += 1;
    }
    let rest = f64::from(pending - stepped) / f64::from(seats.max(1)) * service;
    Some(free.first()? + rest)
}

/// Of a full pair's `load.in_flight` (whose ends are known: else `None`), how many hold its
/// `seats` and how many wait. Sent past the seats (a hard cap above them, or a node priced at
/// fewer seats than it is sent, `priced_seats`), requests wait inside the node: they take the
/// first seats to free, as waiters do, and the seats are held by the soonest to end.
fn seat_queue(seats: u32, load: &ModelLoad, ends: &[f64]) -> Option<(usize, u32)> {
    let sent = load.in_flight as usize;
    if ends.len() < sent {
        return None;
    }
    let running = sent.min(seats.max(1) as usize);
    let pending = load
        .pending
        .saturating_add(u32::try_from(sent - running).unwrap_or(u32::MAX));
    Some((running, pending))
}

/// Predicted ends (seconds from now) as [`seat_wait`] reads them: one past its end at 0, soonest
/// first.
pub(super) fn sort_ends(ends: &mut [f64]) {
    for e in ends.iter_mut() {
        *e = e.max(0.0);
    }
    ends.sort_unstable_by(f64::total_cmp);
}

/// The seats of a full pair by when each is next free, for [`seat_wait`]: the idle ones (free
/// now), the running requests' ends (ascending; below 0 read as 0), and the times the waiters
/// placed so far free theirs again (`again[head..tail]`). Each waiter takes the seat free
/// first and holds it for the same service, so the seats it frees come in the order it took
/// them: three ascending runs, merged at their fronts, where keeping one sorted list cost a
/// shift of every seat per waiter (64 waiters on a 256-seat batching server: 16,000 moves per
/// prediction).
struct FreeSeats<'a> {
    idle: usize,
    ends: &'a [f64],
    again: [f64; SEAT_QUEUE_STEPS as usize],
    head: usize,
    tail: usize,
}

impl FreeSeats<'_> {
    /// When the seat free first is free (`None`: no seat).
    fn first(&self) -> Option<f64> {
        if self.idle > 0 {
            return Some(0.0);
        }
        let again = self.again[self.head..self.tail].first().copied();
        match (self.ends.first().map(|e| e.max(0.0)), again) {
            (Some(e), Some(a)) => Some(e.min(a)),
            (e, a) => e.or(a),
        }
    }

    /// Take the seat free first: when it is free.
    fn take(&mut self) -> Option<f64> {
        if self.idle > 0 {
            self.idle -= 1;
            return Some(0.0);
        }
        let again = self.again[self.head..self.tail].first().copied();
        match (self.ends.split_first(), again) {
            (Some((e, rest)), a) if a.is_none_or(|a| e.max(0.0) <= a) => {
                self.ends = rest;
                Some(e.max(0.0))
            }
            (_, a) => {
                self.head += usize::from(a.is_some());
                a
            }
        }
    }
}

/// Seconds to read `m` from the node's disk into memory: what its loads took (`observed`),
/// else its size over the node's read speed (else the policy's prior). A reload after an
/// eviction costs the same (`evict`).
pub(super) fn read_s(p: &Policy, node: &NodeView, m: &ModelView, observed: Option<f64>) -> f64 {
    positive(observed).unwrap_or_else(|| {
        m.resident_gb.unwrap_or(m.size_gb).max(0.0)
            / positive(node.load_gbps)
                .or(positive(node.learned_load_gbps))
                .or(positive(node.peer_load_gbps))
                .unwrap_or(p.completion_load_gbps)
    })
}

/// Cold-load seconds: 0 when loaded with a window that holds the request (a smaller loaded
/// window means a reload); observed load time, else size over read (or pull) speed. `spell`:
/// the pair's (`spell`), for a model listed as loaded on a node that hides its loads.
fn load_s(p: &Policy, x: &Input<'_>, spell: Option<Spell>) -> f64 {
    let m = x.model;
    let fits_loaded = m
        .loaded_context
        .is_none_or(|ctx| ctx == 0 || u64::from(ctx) >= x.needed_tokens);
    if m.loaded && fits_loaded {
        return idle_load_s(spell);
    }
    let gb = m.resident_gb.unwrap_or(m.size_gb).max(0.0);
    let read = read_s(p, x.node, m, x.rates.load_s);
    let whole = if m.on_disk || m.loaded {
        read
    } else {
        read + gb / p.completion_pull_gbps
    };
    // A load a request already started (one holds the pair, the model is not in yet) is
    // shared: what is left of it, not a whole one. A node 20 s into a 25 s load finishes a
    // request sooner than an idle node starting its own. One that has run past its expected
    // time is expected to take as long again as it has overrun (not to be done: a hung load
    // would draw every request for the model).
    let under_way = x
        .load
        .loading_since_ms
        .filter(|_| !m.loaded && x.load.in_flight > 0)
        .map_or(0.0, |t| x.now_ms.saturating_sub(t) as f64 / 1000.0);
    (whole - under_way).abs()
}

/// Nothing of the pair runs or waits and its last answer is older than the keep-alive (or
/// there was none), on a node that hides its loads: the model may be out of memory.
pub(super) fn pair_idle(p: &Policy, x: &Input<'_>) -> bool {
    let keep_ms = p.completion_keep_alive_s.saturating_mul(1000);
    x.node.hides_loads
        && keep_ms > 0
        && !x.load.busy()
        && x.rates
            .last_ms
            .is_none_or(|t| x.now_ms.saturating_sub(t) > keep_ms)
}

/// A spell in which a request to the pair, on a node that hides its loads, may wait for a load
/// first: the pair is idle past the keep-alive, or another model was sent to the node since
/// its last request (a server that swaps models may have pushed it out), or a request sent in
/// such a spell has had no first byte yet (`joined`: how long it has been under way).
#[derive(Debug, Clone, Copy)]
struct Spell {
    joined: Option<f64>,
    /// Seen, not foreseen: a request sent at this ms is stalled before its first token, and
    /// no spell was known (the send that joins it starts one then).
    stalled_since_ms: Option<u64>,
    /// A request of the spell is stalled (`LiveDecode::stalled_since_ms`): under way for
    /// sure, however long a load is known to take.
    stalled: bool,
    /// Begun by the swap alone (its load is `Rates::switch_load_s`).
    switch: bool,
    /// The load it is known to bring (`None`: nothing known).
    known_s: Option<f64>,
}

fn spell(p: &Policy, x: &Input<'_>) -> Option<Spell> {
    if !x.node.hides_loads {
        return None;
    }
    let running = x.load.in_flight > 0;
    // A request stalled before its first token is taken as a load under way since its send
    // (a swap, unless a spell began before it), on a node that lists several models (one that
    // lists one swaps nothing: late, it more likely queued behind seats nobody said).
    let swaps = x.node.models.len() >= 2;
    let stalled = x
        .live
        .and_then(|l| l.stalled_since_ms)
        .filter(|_| running && swaps);
    let spell_since = x.load.hidden_load_since_ms.filter(|_| running);
    // A spell under way is joined (below) whatever began it; a new one begins when the pair
    // is idle past the keep-alive or displaced.
    let (begins, switch) = match (spell_since, stalled) {
        (Some(_), _) => (false, x.load.hidden_load_switch),
        (None, Some(_)) => (false, true),
        (None, None) => {
            let idle = pair_idle(p, x);
            let displaced = !idle && !x.load.busy() && x.load.displaced;
            (idle || displaced, displaced)
        }
    };
    let known_s = if switch {
        x.rates.switch_load_s
    } else {
        known_idle_load(x)
    }
    .filter(|l| l.is_finite())
    .map(|l| l.max(0.0));
    let under_way = |since: u64| x.now_ms.saturating_sub(since) as f64 / 1000.0;
    let joined = match (spell_since, stalled) {
        (Some(a), Some(b)) => Some(under_way(a.min(b))),
        (None, Some(b)) => Some(under_way(b)),
        _ => joined_s(x, known_s),
    };
    (begins || joined.is_some()).then_some(Spell {
        joined,
        stalled_since_ms: stalled.filter(|_| spell_since.is_none()),
        stalled: stalled.is_some(),
        switch,
        known_s,
    })
}

/// A model the node lists as loaded, on a node that hides its loads, in a spell (`spell`): the
/// load the pair's requests after such spells waited for (its zeros count; mostly the last
/// spell's); after an idle one, else the model's other pairs' (an untried pair's first request
/// is one: of a model that is loaded on one box of fourteen and on disk on the rest, what the
/// first tries showed). A request sent now joins one sent in the spell that has had no first
/// byte yet: it waits for the rest of that load, charged as a cold load under way is
/// (`load_s`).
///
/// A stalled one with no load known is expected to take as long again as it has been under way.
fn idle_load_s(spell: Option<Spell>) -> f64 {
    spell
        .and_then(|s| match (s.known_s, s.stalled) {
            (Some(l), _) => Some(left_of(l, s.joined)),
            (None, true) => s.joined,
            (None, false) => None,
        })
        .unwrap_or(0.0)
}

/// Seconds a load the node hides has been under way on the pair: a request sent to it in a
/// spell is still waiting for its first byte (`ModelLoad::hidden_load_since_ms`). Past twice
/// the load the pair is `known` for, it is taken as over (a long prefill, or an answer slow to
/// start), not as a load that keeps growing.
fn joined_s(x: &Input<'_>, known: Option<f64>) -> Option<f64> {
    let since = x.load.hidden_load_since_ms?;
    let under_way = x.now_ms.saturating_sub(since) as f64 / 1000.0;
    let known = known.map_or(f64::INFINITY, |l| 2.0 * l);
    (x.node.hides_loads && x.load.in_flight > 0 && under_way <= known).then_some(under_way)
}

/// What is left of a `whole`-second load `under_way` seconds in; one past its expected time
/// is expected to take as long again as it has overrun (as `load_s`).
fn left_of(whole: f64, under_way: Option<f64>) -> f64 {
    under_way.map_or(whole, |u| (whole - u).abs())
}

/// The pair's idle load, else the model's other pairs'; `None`: nothing known.
fn known_idle_load(x: &Input<'_>) -> Option<f64> {
    x.rates
        .idle_load_s
        .or(x.peer.and_then(|peers| peers.idle_load_s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::testkit::{loaded, loading, model, node};

    /// `seat_wait` as it was written first: one sorted list of free times, each waiter taking
    /// its front and putting it back `service` later.
    fn seat_wait_sorted(seats: u32, load: &ModelLoad, ends: &[f64], service_s: f64) -> Option<f64> {
        let (running, pending) = seat_queue(seats, load, ends)?;
        let mut free: Vec<f64> = ends.iter().map(|e| e.max(0.0)).collect();
        free.sort_unstable_by(f64::total_cmp);
        free.truncate(running);
        let idle = (seats as usize).saturating_sub(running);
        free.splice(0..0, std::iter::repeat_n(0.0, idle));
        if free.is_empty() {
            return None;
        }
        let service = service_s.max(0.0);
        let stepped = pending.min(SEAT_QUEUE_STEPS);
        for _ in 0..stepped {
            let t = free.remove(0) + service;
            let at = free.partition_point(|f| *f <= t);
            free.insert(at, t);
        }
        let rest = f64::from(pending - stepped) / f64::from(seats.max(1)) * service;
        Some(free[0] + rest)
    }

    #[test]
    fn the_merged_seat_wait_is_the_sorted_lists() {
        // A small deterministic generator: seats 0-300, running 0-320, waiting 0-200, ends
        // 0-10 s (some past, some equal, a few NaN or infinite), services 0-3 s.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..4_000 {
            let seats = next(300) as u32;
            let in_flight = next(320) as u32;
            let pending = next(200) as u32;
            let known = in_flight as usize + next(3) as usize;
            let mut ends: Vec<f64> = (0..known)
                .map(|_| match next(200) {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    _ => next(101) as f64 / 10.0 - 0.5,
                })
                .collect();
            if next(2) == 0 {
                // As the caller passes them.
                sort_ends(&mut ends);
            }
            let service = next(31) as f64 / 10.0;
            let load = ModelLoad {
                in_flight,
                pending,
                ..ModelLoad::default()
            };
            let want = seat_wait_sorted(seats, &load, &ends, service);
            let got = seat_wait(seats, &load, &ends, service);
            assert_eq!(
                got.map(f64::to_bits),
                want.map(f64::to_bits),
                "seats {seats} load {load:?} service {service} ends {ends:?}"
            );
        }
        // Fewer ends known than requests running: not known.
        let load = ModelLoad {
            in_flight: 2,
            ..ModelLoad::default()
        };
        assert_eq!(seat_wait(2, &load, &[1.0], 1.0), None);
    }

    /// A request for model `m` with a `prompt`-token prompt.
    fn ask_m(prompt: u32) -> RouteRequest {
        RouteRequest {
            models: vec!["m".into()],
            prompt_tokens: prompt,
            ..RouteRequest::default()
        }
    }

    fn input<'a>(
        req: &'a RouteRequest,
        node: &'a NodeView,
        rates: Rates,
        load: ModelLoad,
    ) -> Input<'a> {
        Input {
            req,
            node,
            model: &node.models[0],
            load,
            node_in_flight: load.in_flight,
            node_prefilling: PrefillLoad::default(),
            node_prefill_shared: None,
            rates,
            peer: None,
            node_best: None,
            node_pace: None,
            twin: None,
            probing_here: false,
            twin_streams_spt: None,
            needed_tokens: 2_000,
            now_ms: 1_000_000,
            seat_ends: &[],
            node_load: ModelLoad::default(),
            node_ends: &[],
            live: None,
            node_slowdown: 1.0,
        }
    }

    /// A cold model's read time: the node's own speed, else its peers' (a node that loaded
    /// nothing), else the prior (2 GB/s).
    #[test]
    fn a_cold_load_reads_at_the_nodes_speed_else_its_peers_else_the_prior() {
        let p = Policy::default();
        let cold = model("m", 20.0);
        let mut n = node("n", vec![cold.clone()]);
        assert!((read_s(&p, &n, &cold, None) - 10.0).abs() < 1e-9);
        n.peer_load_gbps = Some(8.0);
        assert!((read_s(&p, &n, &cold, None) - 2.5).abs() < 1e-9);
        n.learned_load_gbps = Some(20.0);
        assert!((read_s(&p, &n, &cold, None) - 1.0).abs() < 1e-9);
    }

    fn learned() -> Rates {
        Rates {
            prefill_tps: Some(1_000.0),
            decode_spt: Some(0.02),
            decode_spt_per_stream: Some(0.01),
            service_s: Some(4.0),
            output_tokens: Some(100.0),
            observed: 10,
            last_ms: Some(999_000),
            ..Rates::default()
        }
    }

    #[test]
    fn terms_add_up_from_learned_rates() {
        let req = ask_m(1_000);
        let mut n = node("a", vec![loaded("m", 8.0)]);
        n.seats = 2;
        // 2 running, 1 waiting on 2 seats: 2 ahead, 2 streams decoding.
        let x = input(&req, &n, learned(), crate::routing::testkit::queue(2, 1));
        let p = predict(&Policy::default(), &x, 0);
        assert_eq!(p.ahead, 2);
        assert_eq!(p.concurrency, 2);
        assert!(
            (p.wait_s - 4.0).abs() < 1e-9,
            "2 ahead / 2 seats x 4 s: {p:?}"
        );
        assert_eq!(p.load_s, 0.0);
        assert!((p.prefill_s - 1.0).abs() < 1e-9);
        assert!((p.decode_s - 100.0 * 0.03).abs() < 1e-9);
        assert!((p.total_s - 8.0).abs() < 1e-9);
        assert!(!p.explored);
        // A cached prefix only shortens prefill.
        let c = predict(&Policy::default(), &x, 600);
        assert!((c.prefill_s - 0.4).abs() < 1e-9);
        assert_eq!(c.cached_tokens, 600);
        assert!((p.total_s - c.total_s - 0.6).abs() < 1e-9);
    }

    #[test]
    fn cold_load_from_observation_else_size_over_read_speed() {
        let req = ask_m(10);
        let n = node("a", vec![model("m", 40.0)]);
        let q = ModelLoad::default();
        let p = predict(&Policy::default(), &input(&req, &n, learned(), q), 0);
        assert!((p.load_s - 20.0).abs() < 1e-9, "40 GB at 2 GB/s: {p:?}");
        let seen = Rates {
            load_s: Some(7.0),
            ..learned()
        };
        let p = predict(&Policy::default(), &input(&req, &n, seen, q), 0);
        assert_eq!(p.load_s, 7.0);
        // A loaded window too small for the request means a reload.
        let mut n = node("a", vec![loaded("m", 40.0)]);
        n.models[0].loaded_context = Some(1_024);
        let p = predict(&Policy::default(), &input(&req, &n, seen, q), 0);
        assert_eq!(p.load_s, 7.0);
    }

    /// A model the node never loaded reads at the speed its other loads showed (40 GB at 20
    /// GB/s), unless the config says the node's speed.
    #[test]
    fn an_unloaded_model_reads_at_the_speed_the_nodes_loads_showed() {
        let req = ask_m(10);
        let mut n = node("a", vec![model("m", 40.0)]);
        n.seats = 4;
        n.learned_load_gbps = Some(20.0);
        let q = ModelLoad::default();
        let p = predict(&Policy::default(), &input(&req, &n, learned(), q), 0);
        assert!((p.load_s - 2.0).abs() < 1e-9, "{p:?}");
        n.load_gbps = Some(4.0);
        let p = predict(&Policy::default(), &input(&req, &n, learned(), q), 0);
        assert!((p.load_s - 10.0).abs() < 1e-9, "{p:?}");
    }

    /// A load that a request started 5 s ago (one holds the pair, the model is not in yet)
    /// has 2 s of its 7 left; at 7 s it is due; 2 s past its time it is expected to take as
    /// long again; without a request holding the pair nothing is known to be under way.
    #[test]
    fn a_load_under_way_costs_what_is_left_of_it() {
        let req = ask_m(10);
        // Seats to spare: no wait for one (a wait would hide part of the load).
        let mut n = node("a", vec![model("m", 40.0)]);
        n.seats = 4;
        let seen = Rates {
            load_s: Some(7.0),
            ..learned()
        };
        let now = 1_000_000;
        let under_way = |since: u64, in_flight: u32| loading(in_flight, Some(since));
        let p = predict(
            &Policy::default(),
            &input(&req, &n, seen, under_way(now - 5_000, 1)),
            0,
        );
        assert!((p.load_s - 2.0).abs() < 1e-9, "{p:?}");
        let p = predict(
            &Policy::default(),
            &input(&req, &n, seen, under_way(now - 7_000, 1)),
            0,
        );
        assert_eq!(p.load_s, 0.0, "due now");
        let p = predict(
            &Policy::default(),
            &input(&req, &n, seen, under_way(now - 9_000, 1)),
            0,
        );
        assert!(
            (p.load_s - 2.0).abs() < 1e-9,
            "2 s overrun, as long again: {p:?}"
        );
        let p = predict(
            &Policy::default(),
            &input(&req, &n, seen, under_way(now - 5_000, 0)),
            0,
        );
        assert_eq!(
            p.load_s, 7.0,
            "nothing holds the pair: no load known to be under way"
        );
    }

    #[test]
    fn priors_then_exploration_of_untried_pairs() {
        let req = RouteRequest {
            models: vec!["m".into()],
            prompt_tokens: 2_000,
            max_output_tokens: Some(100),
            ..RouteRequest::default()
        };
        let mut n = node("a", vec![loaded("m", 4.0)]);
        n.decode_tps = Some(50.0);
        let q = ModelLoad::default();
        let p = predict(&Policy::default(), &input(&req, &n, Rates::default(), q), 0);
        // Prior: 50 tok/s decode, 20 x 50 = 1000 tok/s prefill; explored at x0.5.
        assert!(p.explored);
        assert!((p.decode_tps - 50.0).abs() < 1e-9);
        assert!((p.prefill_tps - 1_000.0).abs() < 1e-9);
        assert!((p.total_s - 0.5 * (2.0 + 2.0)).abs() < 1e-9, "{p:?}");
        // Observed long ago: explored again; recently: not.
        let stale = Rates {
            last_ms: Some(1_000_000 - 61_000),
            ..learned()
        };
        assert!(predict(&Policy::default(), &input(&req, &n, stale, q), 0).explored);
        // Without a decode prior: model GB over bandwidth (4 GB / 400 GB/s = 100 tok/s).
        n.decode_tps = None;
        let p = predict(&Policy::default(), &input(&req, &n, Rates::default(), q), 0);
        assert!((p.decode_tps - 100.0).abs() < 1e-9);
    }
    /// A request's own output limit counts as its answer's length as often as the model's
    /// answers ran into theirs: all of them, the limit; none, the typical answer.
    #[test]
    fn an_output_limit_counts_as_often_as_answers_ran_into_theirs() {
        let req = RouteRequest {
            models: vec!["m".into()],
            prompt_tokens: 100,
            max_output_tokens: Some(300),
            ..RouteRequest::default()
        };
        let mut n = node("a", vec![loaded("m", 4.0)]);
        n.decode_tps = Some(100.0);
        let q = ModelLoad::default();
        let seen = |share: Option<f64>| Rates {
            output_tokens: Some(60.0),
            capped_share: share,
            ..learned()
        };
        let out = |rates: Rates, req: &RouteRequest| {
            predict(&Policy::default(), &input(req, &n, rates, q), 0).output_tokens
        };
        assert_eq!(out(seen(None), &req), 60.0, "nothing known of limits");
        assert_eq!(out(seen(Some(1.0)), &req), 300.0);
        assert_eq!(out(seen(Some(0.0)), &req), 60.0);
        assert_eq!(out(seen(Some(0.5)), &req), 180.0);
        let open = RouteRequest {
            max_output_tokens: None,
            ..req.clone()
        };
        assert_eq!(out(seen(Some(1.0)), &open), 60.0, "no limit of its own");
    }
}
