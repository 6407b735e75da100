//! The engine: one pass over every (node, candidate model) pair, then the provisional pool cap,
//! then the fallback-chain ranking and the affinity outcome.

use super::affinity;
use super::completion::{self, Input};
use super::eliminate;
use super::policy::Policy;
use super::signals::{self, Pair};
use super::types::{
    AffinityKind, Choice, Decision, FleetView, Loads, Mode, ModelLoad, ModelView, NoRoute, Rates,
    Reason, RouteRequest, Row, SeatTest, Signals, Tier, Verdict,
};

/// A surviving pair, kept small: the explain table holds the signals.
#[derive(Debug, Clone, Copy)]
struct Cand {
    node: usize,
    model: usize,
    total: f64,
    loaded: bool,
    /// Provisional node with nothing in flight: what the provisional pool cap removes.
    idle_provisional: bool,
    /// Fallback-chain order of the model: models loaded on a survivor first, then list order.
    rank: usize,
    /// Speaks the client's protocol (no translation): wins a tie on score.
    native: bool,
    /// `least-busy` / `round-robin`: the pair's turn among its model's survivors this
    /// request (lower first at equal score); 0 in the other modes.
    turn: usize,
    /// Completion mode: requests in flight on the node, which breaks a tie on predicted
    /// finish (0 in the other modes: spec 000 breaks ties by node order alone).
    busy: u32,
}

/// Decide where `req` goes (see [`decide_once`]). In completion mode a model not yet loaded
/// is fitted at what it will hold (its weights grown as the node's loaded models grew over
/// theirs); that is an estimate, which steers a load away from a node where it would not fit
/// but refuses nothing spec 000's fit by weights takes: when it leaves no survivor and some
/// pair was out on memory, the weights decide. When nothing survives and some pairs were
/// out only because they answered "not here" for this endpoint, decide again without that
/// rule: the node then gives the client its own native answer (a 501 says what is missing)
/// instead of the holding queue's 503 after a wait.
pub fn decide(
    req: &RouteRequest,
    fleet: &FleetView,
    policy: &Policy,
    loads: &dyn Loads,
    now_ms: u64,
) -> Decision {
    let out_on = |d: &Decision, reason: Reason| {
        d.table
            .iter()
            .any(|r| matches!(r.verdict, Verdict::Eliminated { reason: x } if x == reason))
    };
    let mut d = decide_once(req, fleet, policy, loads, now_ms, true);
    if d.winner().is_none() && policy.mode == Mode::Completion && out_on(&d, Reason::MemoryFit) {
        let by_weights = decide_once(req, fleet, policy, loads, now_ms, false);
        if by_weights.winner().is_some() {
            d = by_weights;
        }
    }
    if d.winner().is_some() || !out_on(&d, Reason::NotCapable) {
        return d;
    }
    let mut again = req.clone();
    again.endpoint = None;
    decide_once(&again, fleet, policy, loads, now_ms, true)
}

/// Decide where `req` goes in `fleet` given the live `loads`, at time `now_ms`.
///
/// Stage 1 eliminates pairs with a [`Reason`]; Stage 2 scores survivors (see `signals`).
/// Fallback chain (spec 000): if any candidate model is loaded on a surviving node, the first
/// such model in list order wins, on its best-scoring node; otherwise the first model some node
/// can load. `ranked` is the winner, then the same model on other nodes, then the other models
/// in that same order, each by score (ties: lower node index), at most `policy.max_ranked`.
///
/// In `Mode::Completion` survivors are ranked by predicted finish time instead (see
/// `completion`; `score` is minus the predicted seconds), and the fallback chain reads: a model
/// with a warm survivor wins in list order, but a model that only some node could cold-load
/// yields to a later model predicted to finish sooner (a loaded fallback beats cold-loading the
/// primary when, and only when, it finishes first). The conversation's cached prefix is
/// credited to the node that last served it, else its rendezvous node; nowhere else.
fn decide_once(
    req: &RouteRequest,
    fleet: &FleetView,
    policy: &Policy,
    loads: &dyn Loads,
    now_ms: u64,
    grown: bool,
) -> Decision {
    // A cold model fitted at what it will hold: completion mode's estimate.
    let grown = grown && policy.mode == Mode::Completion;
    let n_models = req.models.len();
    let key = affinity::request_key(req);
    // Per candidate model: (weight, node) of its rendezvous node among the nodes that have it
    // (whatever their live state, so the owner only moves when the fleet changes).
    let mut rendezvous: Vec<Option<(u64, usize)>> = vec![None; n_models];
    let mut table = Vec::with_capacity(fleet.nodes.len() * n_models);
    let mut cands: Vec<Cand> = Vec::with_capacity(fleet.nodes.len() * n_models);
    let mut model_known = false;
    let mut window_fits = false;
    let mut pinned_spare = vec![false; n_models];
    let mut provisional_in_use = 0u32;
    let mut cached_on: Option<usize> = None;
    let mut shared_on: Vec<usize> = Vec::new();
    // Completion mode: the learned rates of every (node, candidate model) pair, read once
    // (table order), and per model what the fleet observed of it (the untried pairs' prior).
    let rates: Vec<Rates> = match policy.mode {
        Mode::Spec | Mode::LeastBusy | Mode::RoundRobin => Vec::new(),
        Mode::Completion => fleet
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(idx, node)| {
                req.models.iter().map(move |name| match node.model(name) {
                    Some(_) => loads.rates(idx, name),
                    None => Rates::default(),
                })
            })
            .collect(),
    };
    let peers: Vec<Option<completion::Peers>> = (0..n_models)
        .map(|pos| {
            let peers =
                completion::peer_rates(rates.iter().skip(pos).step_by(n_models.max(1)).copied())?;
            // Is some never-observed pair of this model being tried now (fleet-wide)?
            let name = &req.models[pos];
            let probing = fleet.nodes.iter().enumerate().any(|(idx, node)| {
                rates[idx * n_models + pos].observed == 0
                    && node.model(name).is_some()
                    && loads.model(idx, name).busy()
            });
            // Could an observed pair take it now (`completion::held_back`)?
            let room = fleet.nodes.iter().enumerate().any(|(idx, node)| {
                let Some(m) = node.model(name) else {
                    return false;
                };
                rates[idx * n_models + pos].observed > 0
                    && loads.model(idx, name).depth() < completion::priced_seats(node, m)
                    && eliminate::window_fits(m, eliminate::needed_tokens(req, node))
                    && eliminate::node_reason(req, node, policy, loads.node_in_flight(idx))
                        .is_none()
            });
            Some(completion::Peers {
                probing,
                room,
                // The model's untried nodes have waited since its first answer, or since this
                // gateway started if that came later (answers kept from before a restart).
                since_ms: peers.since_ms.map(|t| t.max(loads.watching_since_ms())),
                ..peers
            })
        })
        .collect();

    let post = Post {
        req,
        fleet,
        policy,
        loads,
        rates: &rates,
        peers: &peers,
        now_ms,
    };
    let mut scratch = Scratch::default();
    for (idx, node) in fleet.nodes.iter().enumerate() {
        let node_in_flight = loads.node_in_flight(idx);
        // Completion mode, the node full: what runs and waits on it across its models.
        let mut node_load: Option<ModelLoad> = None;
        // What the node has shown on its models, read once for all its untried pairs.
        let mut shown: Option<Shown> = None;
        let provisional = node.tier == Tier::Provisional;
        if provisional && node_in_flight > 0 {
            provisional_in_use += 1;
        }
        if req.cached_on.as_deref() == Some(node.id.as_str()) {
            cached_on = Some(idx);
        }
        if req.shared_on.contains(&node.id) {
            shared_on.push(idx);
        }
        let node_out = eliminate::node_reason(req, node, policy, node_in_flight);
        let weight = key.map(|k| affinity::rendezvous_weight(k, &node.id));
        let needed = eliminate::needed_tokens(req, node);
        let available = match (node_out, policy.mode) {
            (Some(_), _) => 0.0,
            (None, Mode::Spec | Mode::LeastBusy | Mode::RoundRobin) => {
                eliminate::available_gb(node)
            }
            (None, Mode::Completion) => {
                eliminate::available_gb_evicting(node, |name| loads.model(idx, name).busy())
            }
        };
        for (pos, name) in req.models.iter().enumerate() {
            let model = node.model(name);
            if let Some(m) = model {
                model_known = true;
                window_fits |= eliminate::window_fits(m, needed);
                if let Some(w) = weight {
                    if rendezvous[pos].is_none_or(|(best, _)| w > best) {
                        rendezvous[pos] = Some((w, idx));
                    }
                }
            }
            let outcome = match (node_out, model) {
                (Some(reason), _) => Err(reason),
                (None, None) => Err(Reason::ModelAbsent),
                (None, Some(m)) => {
                    eliminate::model_reason(req, policy, node, m, needed, available, grown)
                        .map(|fit| (m, fit))
                }
            };
            let verdict = match outcome {
                Err(reason) => Verdict::Eliminated { reason },
                Ok((m, fit_ratio)) => {
                    let load = loads.model(idx, name);
                    let (verdict, total) = match policy.mode {
                        Mode::Spec => {
                            let pair = Pair {
                                req,
                                node,
                                model: m,
                                load,
                                node_in_flight,
                                fit_ratio,
                                needed_tokens: needed,
                                now_ms,
                            };
                            let signals = signals::score(policy, &pair);
                            let total = finite(signals.total());
                            (Verdict::Scored { signals, total }, total)
                        }
                        Mode::Completion => {
                            let prediction = predict_pair(
                                &post,
                                (idx, pos),
                                (m, load, node_in_flight, 0),
                                &mut node_load,
                                &mut shown,
                                &mut scratch,
                            );
                            let total = finite(-prediction.rank_s());
                            (Verdict::Predicted { prediction }, total)
                        }
                        Mode::LeastBusy | Mode::RoundRobin => {
                            let busy = node_in_flight.saturating_add(load.pending);
                            let total = match policy.mode {
                                Mode::LeastBusy => -f64::from(busy),
                                _ => 0.0,
                            };
                            let signals = Signals::default();
                            (Verdict::Scored { signals, total }, total)
                        }
                    };
                    if !provisional && node_in_flight < node.seats.max(1) {
                        pinned_spare[pos] = true;
                    }
                    cands.push(Cand {
                        node: idx,
                        model: pos,
                        total,
                        loaded: m.loaded,
                        idle_provisional: provisional && node_in_flight == 0,
                        rank: 0,
                        native: eliminate::speaks(req, node),
                        turn: 0,
                        busy: match policy.mode {
                            Mode::Completion => node_in_flight,
                            _ => 0,
                        },
                    });
                    verdict
                }
            };
            table.push(Row {
                node: idx,
                model: pos,
                verdict,
            });
        }
    }

    let rendezvous: Vec<Option<usize>> = rendezvous.iter().map(|r| r.map(|(_, idx)| idx)).collect();
    match policy.mode {
        Mode::Spec => add_session_affinity(&post, &rendezvous, &mut table, &mut cands),
        Mode::Completion => add_cached_prefix(
            &post,
            &rendezvous,
            cached_on,
            &shared_on,
            (&mut table, &mut cands),
            &mut scratch,
        ),
        Mode::LeastBusy | Mode::RoundRobin => take_turns(req.seq, n_models, &mut cands),
    }

    if policy
        .provisional_pool_cap
        .is_some_and(|cap| provisional_in_use >= cap)
    {
        cands.retain(|c| {
            let capped = c.idle_provisional && pinned_spare[c.model];
            if capped {
                table[c.node * n_models + c.model].verdict = Verdict::Eliminated {
                    reason: Reason::ProvisionalCap,
                };
            }
            !capped
        });
    }

    rank(&mut cands, n_models, policy.max_ranked, policy.mode);

    let affinity = match (req.affinity_key, &req.pin, cands.first()) {
        (Some(_), None, Some(w)) => match rendezvous[w.model] {
            Some(r) if r == w.node => AffinityKind::Matched,
            Some(r)
                if matches!(
                    table[r * n_models + w.model].verdict,
                    Verdict::Scored { .. } | Verdict::Predicted { .. }
                ) =>
            {
                AffinityKind::Spilled
            }
            _ => AffinityKind::New,
        },
        _ => AffinityKind::None,
    };

    let no_route = if !cands.is_empty() {
        None
    } else if !model_known {
        Some(NoRoute::ModelNotFound)
    } else if !window_fits {
        Some(NoRoute::ContextTooLong)
    } else if req.pin.is_some() {
        Some(NoRoute::PinUnavailable)
    } else {
        Some(NoRoute::NoProvider)
    };

    let primary = req.models.first();
    let ranked = cands
        .iter()
        .map(|c| {
            let model = &req.models[c.model];
            // Ranked by `Prediction::rank_s`; reported: the request's own finish.
            let node = &fleet.nodes[c.node];
            let prediction = match &table[c.node * n_models + c.model].verdict {
                Verdict::Predicted { prediction } => Some(prediction),
                _ => None,
            };
            let known = prediction.filter(|p| !p.from_priors);
            Choice {
                node: c.node,
                node_id: fleet.nodes[c.node].id.clone(),
                model: model.clone(),
                score: c.total,
                fallback: Some(model) != primary,
                cold: !c.loaded,
                predicted_s: prediction.map(|p| p.total_s),
                predicted_run_s: known
                    .map(|p| p.total_s - p.wait_s)
                    .filter(|s| s.is_finite()),
                predicted_first_s: known.map(|p| p.first_s).filter(|s| s.is_finite()),
                predicted_prefill_s: prediction
                    .map(|p| p.first_s - p.wait_s - p.load_s)
                    .filter(|s| s.is_finite()),
                first_measured: known.is_some_and(|p| p.first_measured),
                predicted_miss_s: prediction
                    .map(|p| f64::from(p.cached_tokens) / p.prefill_tps)
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .unwrap_or(0.0),
                predicted_load_s: known.map(|p| p.load_s).filter(|s| s.is_finite()),
                predicted_output_tokens: prediction
                    .filter(|p| p.from_priors)
                    .map(|p| p.output_tokens)
                    .filter(|t| t.is_finite() && *t > 0.0),
                cached_tokens: prediction.map_or(0, |p| p.cached_tokens),
                seat_test: prediction.and_then(|p| {
                    seat_test(p, node, node.model(model), c.loaded, || {
                        loads.node_decoding(c.node)
                    })
                }),
                idle: prediction.and_then(|p| p.idle),
            }
        })
        .collect();

    Decision {
        ranked,
        no_route,
        affinity,
        table,
    }
}

/// `least-busy` / `round-robin`: request `seq` starts its model's survivors (`cands`, in node
/// order) at its turn, `seq` mod their count, and goes round from there.
fn take_turns(seq: u64, n_models: usize, cands: &mut [Cand]) {
    for pos in 0..n_models {
        let k = cands.iter().filter(|c| c.model == pos).count();
        if k == 0 {
            continue;
        }
        let start = (seq % k as u64) as usize;
        for (i, c) in cands.iter_mut().filter(|c| c.model == pos).enumerate() {
            c.turn = (i + k - start) % k;
        }
    }
}

/// Refill `out` with the predicted ends of the requests running on node:model (when a request
/// would wait for a seat, and for how long it would slow those streams) and return how fast
/// their answers stream now; none running: empty, `None`.
fn seat_ends(
    loads: &dyn Loads,
    idx: usize,
    name: &str,
    load: &super::types::ModelLoad,
    now_ms: u64,
    out: &mut Vec<f64>,
) -> Option<super::types::LiveDecode> {
    out.clear();
    if load.in_flight > 0 {
        loads.seat_ends(idx, name, now_ms, out)
    } else {
        None
    }
}

/// What runs (`in_flight`) and waits (`pending`) on node `idx` across its models, with the
/// predicted ends of those running in `out`; nothing when a seat of the node is free (then no
/// request waits for one inside the node, whoever owns the seats).
fn node_seats(
    loads: &dyn Loads,
    node: &super::types::NodeView,
    idx: usize,
    node_in_flight: u32,
    now_ms: u64,
    out: &mut Vec<f64>,
) -> ModelLoad {
    out.clear();
    if node_in_flight < test_seats(node) {
        return ModelLoad::default();
    }
    let mut pending = 0u32;
    for m in &node.models {
        let load = loads.model(idx, &m.name);
        pending = pending.saturating_add(load.pending);
        if load.in_flight > 0 {
            loads.seat_ends(idx, &m.name, now_ms, out);
        }
    }
    completion::sort_ends(out);
    ModelLoad {
        in_flight: node_in_flight,
        pending,
        ..ModelLoad::default()
    }
}

/// The node-wide seats a request sent now is tested against: its seats, or, when nobody said
/// how many it has, as many as it was seen to run at once (at least one).
pub(super) fn test_seats(node: &super::types::NodeView) -> u32 {
    if node.seats_assumed && !node.seats_shared {
        node.seats_seen.clamp(1, node.seats.max(1))
    } else {
        node.seats.max(1)
    }
}

/// A warm pair predicted from observed rates, sent at once (no request ahead for its own
/// seats, the node under its ceiling) to a node whose seats were all taken (`test_seats`):
/// its answer tells whether it waited inside. Never on a node already taken to share them (it
/// is not sent past them). The wait predicted for the prompts ahead in the node's prefill
/// queue (the only wait left in `wait_s`) is expected either way: the answer is held against
/// the seat's wait past it.
///
/// On a node whose seats nobody said that serves several models, a request sent while its
/// model has as many requests on the node as it was ever seen to decode at once
/// (`completion::own_test_seats`) tests the model's own seats instead, whatever the node runs
/// beside it: when only that model runs, a wait says as much of them as of the node's, and the
/// node's are told apart by the other models' answers (a per-model count, as Ollama keeps,
/// taken for the node's would hold every model to one model's seats). Counted from the
/// requests sent, not those decoding: behind a slow prefill (a Mac's 20k-token prompt takes
/// seconds) a model's seats are held long before any first token. One sent a moment before
/// may reach the node after this one: then this one took its seat and says it did not wait,
/// which only delays a verdict.
fn seat_test(
    p: &super::completion::Prediction,
    node: &super::types::NodeView,
    model: Option<&super::types::ModelView>,
    loaded: bool,
    node_decoding: impl FnOnce() -> u32,
) -> Option<SeatTest> {
    let at_once = p.ahead == 0 && p.node_wait_s == 0.0;
    if !(loaded && !node.seats_shared && !p.from_priors && at_once && p.load_s == 0.0) {
        return None;
    }
    let own = model.and_then(|m| super::completion::own_test_seats(node, m));
    let test = |shared_wait_s: f64, bound: bool, own: bool, seats: u32| {
        let test = SeatTest {
            first_s: p.wait_s + p.prefill_s,
            decode_s: p.decode_s,
            shared_wait_s,
            bound,
            own,
            seats,
        };
        let finite = test.first_s.is_finite() && test.decode_s.is_finite();
        let full = test.shared_wait_s.is_finite() && test.shared_wait_s > 0.0;
        (finite && full).then_some(test)
    };
    if p.own_full {
        // Its model at its own count: the model's seats, or nothing (a wait could be either's).
        return own.and_then(|seats| test(p.own_wait_s - p.wait_s, true, true, seats));
    }
    let seats = test_seats(node);
    // Of the seats seen: only once that many decode (they have their seats: sent at once,
    // this one could reach the node first and take one of theirs). Read only for such a
    // node: a lock on the node's clock.
    let seen_running = !node.seats_assumed || node_decoding() >= seats;
    test(p.shared_wait_s - p.wait_s, node.seats_assumed, false, seats).filter(|_| seen_running)
}

fn finite(total: f64) -> f64 {
    if total.is_nan() {
        f64::NEG_INFINITY
    } else {
        total
    }
}

/// What the passes after the first read.
struct Post<'a> {
    req: &'a RouteRequest,
    fleet: &'a FleetView,
    policy: &'a Policy,
    loads: &'a dyn Loads,
    /// Completion mode: learned rates per (node, model), in table order.
    rates: &'a [Rates],
    peers: &'a [Option<completion::Peers>],
    now_ms: u64,
}

/// Completion mode: the prefix the request shares with earlier turns is cached on the node that
/// served them (`cached_on`), else on the key's rendezvous node; that one pair's prefill is
/// predicted again with `cached_prefix_tokens` taken as cached. Its system prompt is cached
/// on the nodes that last served it (`shared_on`, the primary model only: what they served
/// was that model): those with a seat free now are predicted again with
/// `shared_prefix_tokens` (or the larger credit of the two) taken as cached.
fn add_cached_prefix<'f>(
    post: &Post<'f>,
    rendezvous: &[Option<usize>],
    cached_on: Option<usize>,
    shared_on: &[usize],
    (table, cands): (&mut [Row], &mut [Cand]),
    scratch: &mut Scratch<'f>,
) {
    let req = post.req;
    let conversation = req.cached_prefix_tokens > 0 && affinity::request_key(req).is_some();
    let n_models = req.models.len();
    for (pos, owner) in rendezvous.iter().enumerate() {
        // The pair's first-pass prediction, if it was scored.
        let predicted = |table: &[Row], idx: usize| match table[idx * n_models + pos].verdict {
            Verdict::Predicted { prediction } => Some(prediction),
            _ => None,
        };
        let scored = |table: &[Row], idx: usize| predicted(table, idx).is_some();
        let credited = conversation
            .then(|| {
                cached_on
                    .filter(|i| scored(table, *i))
                    .or(owner.filter(|i| scored(table, *i)))
            })
            .flatten();
        let shared = if pos == 0 { shared_on } else { &[] };
        // A system prompt counts only where a seat is free now: the cache churns while a
        // request waits (each prompt prefilled ahead of it pushes an older one out), so the
        // prompts counted since say nothing of what it would find.
        let free =
            |table: &[Row], idx: usize| predicted(table, idx).is_some_and(|p| p.wait_s <= 0.0);
        if let Some(idx) = credited {
            let tokens = if shared.contains(&idx) && free(table, idx) {
                req.cached_prefix_tokens.max(req.shared_prefix_tokens)
            } else {
                req.cached_prefix_tokens
            };
            predict_cached(post, (idx, pos), tokens, (table, cands), scratch);
        }
        for &idx in shared {
            if Some(idx) != credited && req.shared_prefix_tokens > 0 && free(table, idx) {
                let tokens = req.shared_prefix_tokens;
                predict_cached(post, (idx, pos), tokens, (table, cands), scratch);
            }
        }
    }
}

/// The pair (`idx`, model `pos`) predicted again with `cached` prompt tokens in its cache,
/// with what the first pass read of the fleet's rates (`scratch.logs`); the node's load and
/// what it has shown are read afresh.
fn predict_cached<'f>(
    post: &Post<'f>,
    (idx, pos): (usize, usize),
    cached: u32,
    (table, cands): (&mut [Row], &mut [Cand]),
    scratch: &mut Scratch<'f>,
) {
    let n_models = post.req.models.len();
    let name = &post.req.models[pos];
    let Some(model) = post.fleet.nodes[idx].model(name) else {
        return;
    };
    let load = post.loads.model(idx, name);
    let node_in_flight = post.loads.node_in_flight(idx);
    let prediction = predict_pair(
        post,
        (idx, pos),
        (model, load, node_in_flight, cached),
        &mut None,
        &mut None,
        scratch,
    );
    let total = finite(-prediction.rank_s());
    table[idx * n_models + pos].verdict = Verdict::Predicted { prediction };
    if let Ok(i) = cands.binary_search_by(|c| (c.node, c.model).cmp(&(idx, pos))) {
        cands[i].total = total;
    }
}

/// What one decision's predictions reuse: buffers, and what is read once for all of them.
#[derive(Default)]
struct Scratch<'f> {
    /// The running requests' predicted ends of the pair being predicted (refilled per pair),
    /// soonest first, one past its end at 0 (`completion::sort_ends`).
    ends: Vec<f64>,
    /// Of every pair of a node whose seats are all taken (refilled per node, `node_seats`),
    /// sorted as `ends`.
    node_ends: Vec<f64>,
    /// Of the node's other pairs, read for their live pace only (`node_slowdown`).
    others: Vec<f64>,
    /// Per model, the fleet's observed rates (read when an untried pair needs its node's
    /// pace, once per model).
    logs: PaceCache<'f>,
}

/// Completion mode's prediction of pair (`idx`, model `pos`): `m` on the node, the pair's
/// `load`, the node's requests in flight, `cached` prompt tokens taken as in the node's
/// cache. Read once per node and kept by the caller across its pairs: what runs and waits on
/// the node across its models (`node_load`, with their ends in `scratch.node_ends`) and what
/// it has shown on its models (`shown`, for a pair it never served). A pair never observed is
/// priced by what its node has shown (no faster than the model streams, `live_streams`) and
/// its pace against the model's observers; one whose rates were not measured, by that pace.
fn predict_pair<'f>(
    post: &Post<'f>,
    (idx, pos): (usize, usize),
    (m, load, node_in_flight, cached): (&ModelView, ModelLoad, u32, u32),
    node_load: &mut Option<ModelLoad>,
    shown: &mut Option<Shown>,
    scratch: &mut Scratch<'f>,
) -> completion::Prediction {
    let (req, fleet, loads, now_ms) = (post.req, post.fleet, post.loads, post.now_ms);
    let n_models = req.models.len();
    let node = &fleet.nodes[idx];
    let name = &req.models[pos];
    let own = post.rates[idx * n_models + pos];
    let live = seat_ends(loads, idx, name, &load, now_ms, &mut scratch.ends);
    // Soonest first, once: what each seat wait reads (`completion::seat_wait`).
    completion::sort_ends(&mut scratch.ends);
    let node_load = *node_load.get_or_insert_with(|| {
        node_seats(
            loads,
            node,
            idx,
            node_in_flight,
            now_ms,
            &mut scratch.node_ends,
        )
    });
    let prefilling = loads.node_prefilling(idx);
    let (node_best, node_pace) = if own.observed == 0 {
        let s = *shown.get_or_insert_with(|| {
            node_shown(fleet, node, idx, loads, now_ms, &mut scratch.logs, None)
        });
        let pace = pace_for(fleet, node, idx, loads, now_ms, &mut scratch.logs, name);
        // (The exponent reads the fleet's rates: only for a node that showed something.)
        let best = s.best.and_then(|_| {
            let exponent = scratch.logs.size_exponent(fleet, loads);
            s.at_size(m.size_gb, exponent)
        });
        let pace = pace.or(s.pace);
        // No faster than the model showed: its streams (its prefill slowed alike, as
        // `Shown::at_size` takes it to), before any pair of it answered and after, and its
        // answers at the node's pace. A pair held back from being priced as a typical node of
        // the model (`completion::held_back`) is priced at this best.
        let best = best.map(
            |b| match (b.decode_spt, live_streams(post, idx, name, scratch)) {
                (Some(best), Some(live)) if live > best => Rates {
                    decode_spt: Some(live),
                    prefill_tps: b.prefill_tps.map(|tps| tps * best / live),
                    ..b
                },
                (None, live) if post.peers[pos].is_none() => Rates {
                    decode_spt: live,
                    ..b
                },
                _ => b,
            },
        );
        let best = best.map(|b| completion::no_faster_than_peers(b, post.peers[pos], pace));
        (best, pace)
    } else if unmeasured(&own) {
        let pace = pace_for(fleet, node, idx, loads, now_ms, &mut scratch.logs, name);
        (None, pace)
    } else {
        (None, None)
    };
    let twin = twin(fleet, post.rates, idx, pos, n_models);
    let input = Input {
        req,
        node,
        model: m,
        load,
        node_in_flight,
        node_prefilling: prefilling,
        node_prefill_shared: own
            .prefill_shared
            .is_none()
            .then(|| node_prefill_shared(loads, node, idx, name, prefilling))
            .flatten(),
        rates: own,
        peer: post.peers[pos],
        node_best,
        node_pace,
        twin,
        probing_here: own.observed == 0
            && twin.is_none()
            && (load.busy() || twin_probing(post, idx, pos)),
        twin_streams_spt: if own.observed == 0 {
            twin_streams(post, idx, name, scratch)
        } else {
            None
        },
        needed_tokens: eliminate::needed_tokens(req, node),
        now_ms,
        seat_ends: &scratch.ends,
        node_load,
        node_ends: &scratch.node_ends,
        live,
        node_slowdown: node_slowdown(
            post.policy,
            loads,
            node,
            idx,
            (name, &load, node_in_flight),
            now_ms,
            &mut scratch.others,
        ),
    };
    completion::predict(post.policy, &input, cached)
}

/// Seconds per token of one stream of `name` on node `idx`, from its streams now: on the node
/// itself, and on the other nodes times how much slower node `idx` decoded than each on the
/// models both answered (`slower_than`; a node it shares no answered model with tells
/// nothing), each less the contention prior for the streams beside them, weighted by the
/// tokens they streamed; `None` when none streams. For a pair never observed: its node's best
/// on other models is no faster than this (an untried 70b, sizes unknown, was
/// priced at its node's 14b speed, 138.8 tokens/s, while a stream of it on a twin showed
/// 35.7).
fn live_streams(post: &Post<'_>, idx: usize, name: &str, scratch: &mut Scratch<'_>) -> Option<f64> {
    streams_spt(post, name, scratch, 0..post.fleet.nodes.len(), |j| {
        slower_than(post, idx, j)
    })
}

/// Seconds per token of one stream of `name` on a node, from the streams of it running on
/// `nodes` now: each one's (less the contention prior for the streams beside them, as
/// `one_stream_spt`) times how much slower the node is than that one (`slower`; `None`: it
/// tells nothing), weighted by the tokens they streamed; `None` when none streams.
fn streams_spt(
    post: &Post<'_>,
    name: &str,
    scratch: &mut Scratch<'_>,
    nodes: impl Iterator<Item = usize>,
    slower: impl Fn(usize) -> Option<f64>,
) -> Option<f64> {
    let (fleet, loads, now_ms) = (post.fleet, post.loads, post.now_ms);
    let (mut weighted, mut tokens) = (0.0, 0.0);
    for j in nodes {
        if fleet.nodes[j].model(name).is_none() {
            continue;
        }
        let load = loads.model(j, name);
        let Some(live) = seat_ends(loads, j, name, &load, now_ms, &mut scratch.others)
            .filter(|l| l.tokens > 0.0 && l.secs > 0.0)
        else {
            continue;
        };
        let Some(slower) = slower(j) else {
            continue;
        };
        weighted += one_stream_spt(post.policy, &live) * slower * live.tokens;
        tokens += live.tokens;
    }
    (tokens > 0.0).then(|| weighted / tokens)
}

/// How many times slower node `i` decoded than node `j` on the models both answered (the
/// geometric mean of their ratios; 1 for the node itself); `None` where they answered none
/// alike.
fn slower_than(post: &Post<'_>, i: usize, j: usize) -> Option<f64> {
    if i == j {
        return Some(1.0);
    }
    let (mut logs, mut n) = (0.0, 0u32);
    for m in &post.fleet.nodes[i].models {
        if post.fleet.nodes[j].model(&m.name).is_none() {
            continue;
        }
        let (a, b) = (post.loads.rates(i, &m.name), post.loads.rates(j, &m.name));
        let spt = |r: &Rates| {
            r.decode_spt
                .filter(|s| r.observed > 0 && s.is_finite() && *s > 0.0)
        };
        if let (Some(a), Some(b)) = (spt(&a), spt(&b)) {
            logs += (a / b).ln();
            n += 1;
        }
    }
    (n > 0).then(|| (logs / f64::from(n)).exp())
}

/// Signal 8: the rendezvous node of each candidate model, when it survived, gets
/// 20 / (1 + depth / 2). `cands` are still in table order here, so found by binary search.
fn add_session_affinity(
    post: &Post<'_>,
    rendezvous: &[Option<usize>],
    table: &mut [Row],
    cands: &mut [Cand],
) {
    let (req, fleet, policy, loads) = (post.req, post.fleet, post.policy, post.loads);
    let n_models = req.models.len();
    for (pos, owner) in rendezvous.iter().enumerate() {
        let Some(idx) = *owner else { continue };
        let Verdict::Scored { signals, total } = &mut table[idx * n_models + pos].verdict else {
            continue;
        };
        let load = loads.model(idx, &req.models[pos]);
        let depth = signals::depth(&load, &fleet.nodes[idx]);
        signals.session_affinity = signals::session_affinity(policy, depth);
        let sum = signals.total();
        *total = if sum.is_nan() { f64::NEG_INFINITY } else { sum };
        if let Ok(i) = cands.binary_search_by(|c| (c.node, c.model).cmp(&(idx, pos))) {
            cands[i].total = *total;
        }
    }
}

/// What node `idx` has shown on its models, for a pair of it never observed.
#[derive(Debug, Clone, Copy)]
struct Shown {
    /// The fastest prefill and decode it has shown on any of its models (only those two rates
    /// set; None when it has shown nothing): how a pair it has not served yet is at least
    /// expected to do. Shown: the rates of the responses it has answered, and the pace of the
    /// answers it is streaming now (seconds over tokens past their first, beside the streams
    /// decoding with them). Right after a start no response has ended anywhere and every pair
    /// is priced at priors that can be tens of times off: the home-lab bench's workstation,
    /// streaming at 400 tokens/s, lost its first small requests to laptops at 100 because both
    /// were priors.
    best: Option<Rates>,
    /// The weights (GB) of the models that showed `best`'s decode and prefill (0: unknown).
    best_gb: (f64, f64),
    /// How much slower than the fleet it was on the models it served or streams now
    /// (`completion::NodePace`).
    pace: Option<completion::NodePace>,
}

impl Shown {
    /// `best` for a model of `gb` GB: one larger than the model that showed a rate is slower
    /// by their sizes' ratio to the power `exponent` (`PaceCache::size_exponent`: a token
    /// reads every weight once, 1 where bandwidth is all; an untried 14b priced at its node's
    /// 3b speed took 10 s where 3 were predicted); a smaller one is taken as no faster (the
    /// overheads do not shrink with it). Unknown sizes: as shown.
    fn at_size(&self, gb: f64, exponent: f64) -> Option<Rates> {
        let ratio = |from: f64| {
            if from > 0.0 && gb > from {
                (gb / from).powf(exponent)
            } else {
                1.0
            }
        };
        self.best.map(|b| Rates {
            decode_spt: b.decode_spt.map(|spt| spt * ratio(self.best_gb.0)),
            prefill_tps: b.prefill_tps.map(|tps| tps / ratio(self.best_gb.1)),
            ..b
        })
    }
}

/// How a node's decode slows with a model's weights until some node has answered models of two
/// sizes (`PaceCache::size_exponent`): in proportion, as the bandwidth priors of a pair nothing
/// was shown for take it (a token reads every weight once: decode from the model's GB over the
/// node's bandwidth; a node's configured `decode_tps` is taken for every model alike). Taken
/// as 0 (size says nothing), an untried 70b on a slow box was priced at the 3b speed that box
/// showed (39 tokens/s where it decodes 4), beside a fast box priced at those priors, and the
/// first eight requests of the model went to the slow box (26-42 s each where the fast one
/// answered in 3-7).
const SIZE_EXPONENT_PRIOR: f64 = 1.0;

/// What the paces of one decision read, filled as needed and shared across its nodes: per
/// model, which nodes observed it; the sums of the logs of their rates, over all of them and
/// over those that also observed another model (the one an untried pair is priced for).
#[derive(Default)]
struct PaceCache<'f> {
    /// Per model, `observed[j]`: node `j` answered it.
    observed: Vec<(&'f str, Vec<bool>)>,
    /// Per (model, model it is read against: None for the whole fleet), the sums.
    sums: Vec<(&'f str, Option<&'f str>, completion::LogRates)>,
    /// `size_exponent`, once read.
    size_exponent: Option<f64>,
}

impl<'f> PaceCache<'f> {
    /// How a node's decode slows with a model's weights (its prefill is taken to slow alike: it
    /// computes over every weight), learned from the nodes that answered
    /// models of different sizes: per such node the slope of the log of its seconds per token
    /// against the log of the models' GB, their mean, between 0 and 1 (a token reads every
    /// weight once: at most in proportion; overheads that do not grow with the model make it
    /// less). [`SIZE_EXPONENT_PRIOR`] until some node showed it.
    fn size_exponent(&mut self, fleet: &FleetView, loads: &dyn Loads) -> f64 {
        if let Some(e) = self.size_exponent {
            return e;
        }
        let (mut slopes, mut nodes) = (0.0, 0u32);
        for (j, node) in fleet
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.models.len() > 1)
        {
            let points = node
                .models
                .iter()
                .filter(|m| m.size_gb > 0.0)
                .filter_map(|m| {
                    let r = loads.rates(j, &m.name);
                    let spt = r.decode_spt.filter(|s| *s > 0.0 && s.is_finite());
                    spt.filter(|_| r.observed > 0)
                        .map(|spt| (m.size_gb.ln(), spt.ln()))
                });
            let (mut n, mut sx, mut sy, mut sxx, mut sxy) = (0.0f64, 0.0, 0.0, 0.0, 0.0);
            for (x, y) in points {
                (n, sx, sy, sxx, sxy) = (n + 1.0, sx + x, sy + y, sxx + x * x, sxy + x * y);
            }
            let var = sxx - sx * sx / n.max(1.0);
            if n >= 2.0 && var > 1e-9 {
                slopes += (sxy - sx * sy / n) / var;
                nodes += 1;
            }
        }
        let e = if nodes > 0 {
            (slopes / f64::from(nodes)).clamp(0.0, 1.0)
        } else {
            SIZE_EXPONENT_PRIOR
        };
        self.size_exponent = Some(e);
        e
    }

    /// Index into `observed` of `model` (None: no node lists it).
    fn observers(&mut self, fleet: &'f FleetView, loads: &dyn Loads, model: &str) -> Option<usize> {
        if let Some(at) = self.observed.iter().position(|(m, _)| *m == model) {
            return Some(at);
        }
        let mut name = None;
        let seen = fleet
            .nodes
            .iter()
            .enumerate()
            .map(|(j, n)| match n.model(model) {
                Some(m) => {
                    name.get_or_insert(m.name.as_str());
                    loads.rates(j, model).observed > 0
                }
                None => false,
            })
            .collect();
        self.observed.push((name?, seen));
        Some(self.observed.len() - 1)
    }

    /// Whether node `j` answered `model`.
    fn answered(&mut self, fleet: &'f FleetView, loads: &dyn Loads, model: &str, j: usize) -> bool {
        self.observers(fleet, loads, model)
            .is_some_and(|at| self.observed[at].1[j])
    }

    /// The log rates of `model` over the nodes that answered it (and `against`, when given).
    fn sums(
        &mut self,
        fleet: &'f FleetView,
        loads: &dyn Loads,
        model: &str,
        against: Option<&str>,
    ) -> completion::LogRates {
        let (Some(m), a) = (
            self.observers(fleet, loads, model),
            against.and_then(|a| self.observers(fleet, loads, a)),
        ) else {
            return completion::LogRates::default();
        };
        if against.is_some() && a.is_none() {
            return completion::LogRates::default();
        }
        let key = (self.observed[m].0, a.map(|a| self.observed[a].0));
        if let Some((_, _, l)) = self.sums.iter().find(|(x, y, _)| (*x, *y) == key) {
            return *l;
        }
        let mut all = completion::LogRates::default();
        for (j, seen) in self.observed[m].1.iter().enumerate() {
            if *seen && a.is_none_or(|a| self.observed[a].1[j]) {
                all.add(&loads.rates(j, model));
            }
        }
        self.sums.push((key.0, key.1, all));
        all
    }
}

/// How many times slower than their rates the answers of node `idx`'s other models stream now
/// (`completion::pace` of each, at the prior contention where none was learned; their mean
/// by tokens streamed), for a pair with nothing running (`pair`: its model, load, and the node's requests
/// in flight): a slowdown the node shows on one model is the node's. 1 when the pair runs
/// something (its own answers tell) or nothing else runs.
fn node_slowdown(
    policy: &super::policy::Policy,
    loads: &dyn Loads,
    node: &super::types::NodeView,
    idx: usize,
    (name, load, node_in_flight): (&str, &super::types::ModelLoad, u32),
    now_ms: u64,
    scratch: &mut Vec<f64>,
) -> f64 {
    if load.in_flight > 0 || node_in_flight == 0 {
        return 1.0;
    }
    let (mut paced, mut tokens) = (0.0, 0.0);
    for m in node.models.iter().filter(|m| m.loaded && m.name != name) {
        let other = loads.model(idx, &m.name);
        let Some(live) = seat_ends(loads, idx, &m.name, &other, now_ms, scratch) else {
            continue;
        };
        let r = loads.rates(idx, &m.name);
        let Some(spt1) = r.decode_spt.filter(|s| s.is_finite() && *s > 0.0) else {
            continue;
        };
        let per_stream = r
            .decode_spt_per_stream
            .unwrap_or(policy.completion_contention_prior * spt1);
        paced += completion::pace(Some(live), spt1, per_stream.max(0.0)) * live.tokens;
        tokens += live.tokens;
    }
    if tokens > 0.0 {
        paced / tokens
    } else {
        1.0
    }
}

/// Whether node `idx` prefills one prompt at a time, as its other loaded models that have
/// decided it say (most of them), for a pair of `name` that has not, while prompts are queued
/// there: the queue is the node's (one GPU's compute), so a model newly loaded on a node found
/// to queue its prompts queues them too. Read only when it could matter (a node of one model
/// reads no rates: they cost a lock and two fits each).
fn node_prefill_shared(
    loads: &dyn Loads,
    node: &super::types::NodeView,
    idx: usize,
    name: &str,
    prefilling: super::types::PrefillLoad,
) -> Option<bool> {
    if prefilling.tokens == 0 {
        return None;
    }
    let loaded = node.models.iter().filter(|m| m.loaded && m.name != name);
    let (yes, no) = loaded.fold((0u32, 0u32), |(y, n), m| {
        match loads.rates(idx, &m.name).prefill_shared {
            Some(true) => (y + 1, n),
            Some(false) => (y, n + 1),
            None => (y, n),
        }
    });
    (yes + no > 0).then_some(yes > no)
}

/// `logs`: what the decision's paces read. `against`: the pace is read against the nodes that
/// answered this model only (else against every node that served the same models).
fn node_shown<'f>(
    fleet: &'f FleetView,
    node: &super::types::NodeView,
    idx: usize,
    loads: &dyn Loads,
    now_ms: u64,
    logs: &mut PaceCache<'f>,
    against: Option<&str>,
) -> Shown {
    let mut best: Option<Rates> = None;
    let mut best_gb = (0.0, 0.0);
    // Keep `seen` (of a model of `gb`) where it beats what `best` holds.
    let mut keep = |seen: Rates, gb: f64| {
        let b = best.get_or_insert(Rates::default());
        let decode = completion::better(b.decode_spt, seen.decode_spt, f64::min);
        if decode != b.decode_spt {
            (b.decode_spt, best_gb.0) = (decode, gb);
        }
        let prefill = completion::better(b.prefill_tps, seen.prefill_tps, f64::max);
        if prefill != b.prefill_tps {
            (b.prefill_tps, best_gb.1) = (prefill, gb);
        }
    };
    let mut served = Vec::new();
    let mut ends = Vec::new();
    // Its own rates are among the sums when it answered the models read against.
    let counted = against.is_none_or(|a| logs.answered(fleet, loads, a, idx));
    for m in &node.models {
        let r = loads.rates(idx, &m.name);
        if r.observed > 0 {
            keep(r, m.size_gb);
            served.push((r, logs.sums(fleet, loads, &m.name, against), counted));
        }
        let load = loads.model(idx, &m.name);
        let live = seat_ends(loads, idx, &m.name, &load, now_ms, &mut ends)
            .filter(|l| l.tokens > 0.0 && l.secs > 0.0);
        if let Some(l) = live {
            // Not answered yet, streaming: its pace so far says how fast the node decodes.
            let streaming = Rates {
                decode_spt: Some(l.secs / l.tokens),
                ..Rates::default()
            };
            keep(streaming, m.size_gb);
            if r.observed == 0 {
                served.push((streaming, logs.sums(fleet, loads, &m.name, against), false));
            }
        }
    }
    Shown {
        best,
        best_gb,
        pace: completion::node_pace(served),
    }
}

/// The pace of node `idx` for `model` against the nodes that answered `model`, on the other
/// models it shares with them: those nodes' rates are the typical ones it is scaled from
/// (`completion::effective_rates`). Against the whole fleet, a Mac that reads prompts 20x
/// slower than the GPU, the only node that had answered its untried model, but only 3x slower
/// than the fleet (a slow mini PC in it) was priced 7x too fast. None when no model of it was
/// answered by those nodes (the caller falls back to the fleet).
fn pace_for<'f>(
    fleet: &'f FleetView,
    node: &super::types::NodeView,
    idx: usize,
    loads: &dyn Loads,
    now_ms: u64,
    logs: &mut PaceCache<'f>,
    model: &str,
) -> Option<completion::NodePace> {
    // Alone, no peer (and the decision allocates nothing for it).
    if fleet.nodes.len() < 2 {
        return None;
    }
    let at = logs.observers(fleet, loads, model)?;
    let others = logs.observed[at]
        .1
        .iter()
        .enumerate()
        .any(|(j, seen)| *seen && j != idx);
    if !others {
        return None;
    }
    node_shown(fleet, node, idx, loads, now_ms, logs, Some(model)).pace
}

/// A pair that answered without teaching one of its rates yet (prompts of one length only,
/// replies not streamed): priced from the typical node of its model for that rate.
fn unmeasured(r: &Rates) -> bool {
    r.decode_spt.is_none() || r.prefill_tps.is_none()
}

/// For a pair never observed, the same model's rates on the node of the same machine
/// (`NodeView::twin_key`) that answered it last; `None` for an observed pair, or when no such
/// node answered it. `rates` in table order.
fn twin(
    fleet: &FleetView,
    rates: &[Rates],
    idx: usize,
    pos: usize,
    n_models: usize,
) -> Option<Rates> {
    if rates[idx * n_models + pos].observed > 0 {
        return None;
    }
    twins_of(fleet, idx)
        .map(|j| rates[j * n_models + pos])
        .filter(|r| r.observed > 0)
        .max_by_key(|r| (r.last_ms, r.observed))
}

/// The other nodes the config describes as the same machine as node `idx`
/// (`NodeView::twin_key`); none when it has no key.
fn twins_of(fleet: &FleetView, idx: usize) -> impl Iterator<Item = usize> + '_ {
    let key = fleet.nodes[idx].twin_key;
    fleet
        .nodes
        .iter()
        .enumerate()
        .filter(move |(j, n)| key.is_some() && *j != idx && n.twin_key == key)
        .map(|(j, _)| j)
}

/// A never-observed pair of model `pos` on a twin of node `idx` (`NodeView::twin_key`) has a
/// request out: the same machine is being tried (`completion::held_back`).
fn twin_probing(post: &Post<'_>, idx: usize, pos: usize) -> bool {
    let (n_models, name) = (post.req.models.len(), &post.req.models[pos]);
    twins_of(post.fleet, idx).any(|j| {
        post.fleet.nodes[j].model(name).is_some()
            && post.rates[j * n_models + pos].observed == 0
            && post.loads.model(j, name).busy()
    })
}

/// Seconds per token of one stream of `name` on the twins of node `idx` (the same machine by
/// the config, `NodeView::twin_key`) from their streams now, each less the contention prior
/// for the streams beside it, weighted by the tokens they streamed; `None` when none streams.
/// What a twin's answer shows while it runs is what this node would do: three alike boxes
/// 7x slower than the fleet took seven more requests at the fleet's typical speed while a
/// stream on one of them showed 23 tokens/s.
fn twin_streams(post: &Post<'_>, idx: usize, name: &str, scratch: &mut Scratch<'_>) -> Option<f64> {
    streams_spt(post, name, scratch, twins_of(post.fleet, idx), |_| {
        Some(1.0)
    })
}

/// Seconds per token of one stream, from what the streams of a pair showed: less the
/// contention prior for the streams decoding beside them.
fn one_stream_spt(policy: &Policy, live: &super::types::LiveDecode) -> f64 {
    let beside = f64::from(live.node_decoding.max(1) - 1);
    live.secs / live.tokens / (1.0 + policy.completion_contention_prior * beside)
}

/// Order survivors by fallback-chain model order, then score (desc), then native protocol
/// before translated, then (`least-busy`, `round-robin`) whose turn it is, then (completion
/// mode) fewer requests in flight on the node — an equal prediction says nothing about which
/// is busier — then node index, keeping
/// the best `max_ranked` (0: all). The order is total, so the result is deterministic.
fn rank(cands: &mut Vec<Cand>, n_models: usize, max_ranked: usize, mode: Mode) {
    let mut model_loaded = [false; 64];
    let mut model_loaded_heap = Vec::new();
    let loaded: &mut [bool] = if n_models <= model_loaded.len() {
        &mut model_loaded[..n_models]
    } else {
        model_loaded_heap.resize(n_models, false);
        &mut model_loaded_heap
    };
    for c in cands.iter() {
        if c.loaded {
            loaded[c.model] = true;
        }
    }
    let first = match mode {
        Mode::Spec | Mode::LeastBusy | Mode::RoundRobin => None,
        Mode::Completion => completion_first(cands, loaded),
    };
    for c in cands.iter_mut() {
        c.rank = match first {
            Some(w) if c.model == w => 0,
            Some(_) => 1 + c.model,
            None if loaded[c.model] => c.model,
            None => n_models + c.model,
        };
    }
    let order = |a: &Cand, b: &Cand| {
        a.rank
            .cmp(&b.rank)
            .then(b.total.total_cmp(&a.total))
            .then(b.native.cmp(&a.native))
            .then(a.turn.cmp(&b.turn))
            .then(a.busy.cmp(&b.busy))
            .then(a.node.cmp(&b.node))
    };
    if max_ranked > 0 && cands.len() > max_ranked {
        cands.select_nth_unstable_by(max_ranked - 1, order);
        cands.truncate(max_ranked);
    }
    cands.sort_unstable_by(order);
}

/// Completion mode's model: the first in list order that has a warm survivor, or whose best
/// predicted finish is no later than every later model's best.
fn completion_first(cands: &[Cand], loaded: &[bool]) -> Option<usize> {
    let mut best = vec![f64::NEG_INFINITY; loaded.len()];
    for c in cands {
        best[c.model] = best[c.model].max(c.total);
    }
    let present = |m: usize| cands.iter().any(|c| c.model == m);
    (0..loaded.len())
        .filter(|m| present(*m))
        .find(|&m| loaded[m] || best[m + 1..].iter().all(|later| best[m] >= *later))
}
