//! Stage 4, pre-warm: every `queue.prewarm_interval_ms`, a node:model queue at
//! `queue.prewarm_threshold` or more (running + waiting) gets its model loaded on the
//! runner-up node, so overflow finds it hot. One load per node:model at a time.
//!
//! In completion mode the trigger is the model's own: a queue whose predicted seat wait for the
//! next request exceeds the runner-up's predicted load time, and the check interval follows
//! observed load times (`services::completion_period`). The same pass reads back in a model
//! the gateway unloaded to make room for another, once that one is idle and the first's users
//! would lose more to its reload than the idle models that go for it (`restore`). And, called
//! by placement for each request, it loads the request's model where it fits in free memory
//! and would serve it sooner (`spare_room`); for any request, where a
//! node nobody has seen answer it holds nothing, so that it can be timed (`to_measure`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::node_api;
use crate::fleet::Fleet;
use crate::metrics::METRICS;
use crate::routing::{Choice, Decision, FleetView, Loads, Mode, Verdict};

pub struct Prewarm {
    fleet: Arc<Fleet>,
}

impl Prewarm {
    pub fn new(fleet: Arc<Fleet>) -> Prewarm {
        Prewarm { fleet }
    }

    /// One pass; returns the loads started.
    pub fn cycle(&self) -> usize {
        let fleet = &self.fleet;
        let threshold = fleet.config().queue.prewarm_threshold;
        let completion = fleet.config().routing.policy.mode == Mode::Completion;
        let view = fleet.view();
        let mut started = 0;
        for (idx, node) in fleet.nodes().iter().enumerate() {
            // The gateway's own first measurement is no demand (and is priced at the priors
            // until it answers).
            if node.live.lock().measuring {
                continue;
            }
            for (model, c) in node.all_counters() {
                let depth = c.in_flight.load(Ordering::Relaxed) + c.pending.load(Ordering::Relaxed);
                if depth < if completion { 1 } else { threshold } {
                    continue;
                }
                // The runner-up: the best node for this model other than the busy one.
                let decision = super::decide_elsewhere(fleet, &view, idx, &model);
                let Some(runner_up) = decision.winner() else {
                    continue;
                };
                if !runner_up.cold || !node_api::can_manage(fleet, runner_up.node) {
                    continue;
                }
                if completion
                    && (!worth_loading(fleet, &view, idx, &model, &decision, runner_up)
                        || crate::routing::crowded(
                            &view.nodes[runner_up.node],
                            runner_up.node,
                            &model,
                            &**fleet,
                        ))
                {
                    continue;
                }
                let why = format!("{model} queue on {} at {depth}", view.nodes[idx].id);
                let room = Room::Make { for_demand: true };
                started +=
                    usize::from(start_load(fleet, runner_up.node, &model, &why, room, false));
            }
        }
        if completion && fleet.config().routing.policy.completion_choose_evictions {
            started += restore(fleet, &view);
        }
        started
    }
}

/// Completion mode, a request placed (`decision`, routing's for it): its model is loaded on
/// another node that the gateway manages, that has it on disk, fits it in free memory (nothing
/// unloaded for it) and, with it loaded, would have finished the request sooner than where it
/// goes (priced from what was seen of the pair or its model, not the config's priors, and
/// without the exploring discount). The load costs no one a reload and puts the model where
/// it is served faster or where the demand waits for a seat; the predicted load time does not
/// enter (what a node takes to read a model it never loaded is the least known rate of all,
/// and no request waits for this load). Not only for a request that waits for a seat: a
/// faster node holding another model would keep its copy of this one on disk while slower
/// ones have seats free, its read speed guessed at 2 GB/s and so never worth a request's own
/// load. One node,
/// the one that would finish soonest, and one such load of a model at a time. True when a
/// load started.
pub fn spare_room(
    fleet: &Arc<Fleet>,
    view: &FleetView,
    models: &[String],
    decision: &Decision,
) -> bool {
    let Some(winner) = decision.winner() else {
        return false;
    };
    let policy = &fleet.config().routing.policy;
    // Cheap first: completion mode only predicts, and a pair it predicts cold tells a model
    // some node keeps on disk.
    // Nor for a request that loads its model itself: a second copy would be read in beside
    // the one it waits for, priced against a finish that includes that load.
    let Some(best_s) = winner.predicted_s.filter(|_| !winner.cold) else {
        return false;
    };
    let Some(pos) = models
        .iter()
        .position(|m| *m == winner.model)
        .filter(|_| policy.completion_spare_loads)
    else {
        return false;
    };
    let model = &winner.model;
    let rows = || decision.table.iter().filter(move |row| row.model == pos);
    let undiscount = 1.0 / policy.completion_explore_factor.clamp(1e-3, 1.0) - 1.0;
    let spare = rows()
        .filter_map(|row| match row.verdict {
            Verdict::Predicted { prediction: p }
                if row.node != winner.node && p.load_s > 0.0 && !p.from_priors =>
            {
                let compute = p.prefill_s + p.decode_s;
                let warm = p.total_s - p.load_s
                    + if p.explored {
                        compute * undiscount
                    } else {
                        0.0
                    };
                Some((row.node, warm))
            }
            _ => None,
        })
        .filter(|&(idx, warm)| {
            warm < best_s
                && node_api::can_manage(fleet, idx)
                && !fleet.model(idx, model).busy()
                && crate::routing::fits_free(&view.nodes[idx], idx, model, &**fleet)
        })
        .min_by(|a, b| a.1.total_cmp(&b.1));
    // Last (a key formatted per node): one such load of the model at a time.
    let Some((idx, _)) = spare.filter(|_| !rows().any(|row| fleet.loading(row.node, model))) else {
        return false;
    };
    let why = format!(
        "{model} is served sooner on {} than on {} and fits in its free memory",
        view.nodes[idx].id, winner.node_id
    );
    start_load(fleet, idx, model, &why, Room::Free, false)
}

/// Completion mode with `completion_measure`: the request's model (the winner's) is loaded
/// in the background on each node that could serve it and that nobody has seen answer it: a
/// node the gateway manages, online, running nothing and holding nothing in memory (no one
/// is using it), where the model fits in free memory. Once it is in memory the first
/// measurement (`services::measure`) times the node, while requests keep going where they
/// are priced best. Without it such a node is priced as the model's typical node plus a load
/// priced from the model's size, so a fleet whose measured nodes were its slow ones kept
/// every request on them until their queues cost more than that guess (a random fleet of the
/// placement bench: three fast boxes with the model on disk left idle for its first 2.3 s,
/// 35 requests at 4-15 s each on two slow ones). A node busy or holding another model is
/// timed by that model's answers instead (its pace prices this one). Once per node and model
/// per gateway process; true when a load started.
pub fn to_measure(
    fleet: &Arc<Fleet>,
    view: &FleetView,
    models: &[String],
    decision: &Decision,
) -> bool {
    let policy = &fleet.config().routing.policy;
    if policy.mode != Mode::Completion || !policy.completion_measure {
        return false;
    }
    let Some(winner) = decision.winner() else {
        return false;
    };
    let Some(pos) = models.iter().position(|m| *m == winner.model) else {
        return false;
    };
    let model = &winner.model;
    let mut started = false;
    for row in decision.table.iter().filter(|row| row.model == pos) {
        let idx = row.node;
        // Cold there, and priced from no answer of its own (as a typical node or a twin).
        let untried = matches!(row.verdict,
            Verdict::Predicted { prediction: p } if p.load_s > 0.0 && p.observed == 0);
        if !untried || idx == winner.node {
            continue;
        }
        let Some(node) = view.nodes.get(idx) else {
            continue;
        };
        let empty = node.models.iter().all(|m| !m.loaded)
            && node.health == crate::routing::Health::Online
            && fleet.node_in_flight(idx) == 0;
        if !empty
            || fleet.ops.was_done(&load_key(idx, model))
            || !node_api::can_manage(fleet, idx)
            || !crate::routing::fits_free(node, idx, model, &**fleet)
        {
            continue;
        }
        let why = format!(
            "{model} is asked for and {} holds nothing: to time it",
            node.id
        );
        started |= start_load(fleet, idx, model, &why, Room::Free, true);
    }
    started
}

/// Completion mode: read back in the models the gateway unloaded to make room for a cold
/// load, once the model they made room for has gone idle and their users would lose more
/// reload time than the idle models that go for them (`routing::worth_restoring`), so the
/// next request for a model asked for often does not pay its reload. One pass; the loads
/// started.
fn restore(fleet: &Arc<Fleet>, view: &FleetView) -> usize {
    let pairs: Vec<(String, String)> = fleet.evicted.lock().iter().cloned().collect();
    let policy = &fleet.config().routing.policy;
    let watched = (fleet.watching_since_ms, super::now_ms());
    let mut started = 0;
    for pair in pairs {
        let (node_id, model) = &pair;
        let here = view.nodes.iter().position(|n| &n.id == node_id);
        // Forgotten once back (a request loaded it), or gone from the node or the fleet.
        let Some(idx) = here.filter(|&i| view.nodes[i].model(model).is_some_and(|m| !m.loaded))
        else {
            fleet.evicted.lock().remove(&pair);
            continue;
        };
        let node = &view.nodes[idx];
        // Requests for it load it themselves; a node not taking work is left alone.
        let ready =
            !fleet.model(idx, model).busy() && node.health == crate::routing::Health::Online;
        if ready
            && crate::routing::worth_restoring(policy, node, idx, model, &**fleet, watched)
            && start_load(
                fleet,
                idx,
                model,
                "its users lose more while it is away",
                Room::Make { for_demand: false },
                false,
            )
        {
            fleet.evicted.lock().remove(&pair);
            started += 1;
        }
    }
    started
}

/// The `Ops` key of a background load of `model` on node `idx`.
pub fn load_key(idx: usize, model: &str) -> String {
    format!("load:{idx}:{model}")
}

/// What a background load may unload first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Room {
    /// The idle models `node_api::make_room` picks; `for_demand` as there.
    Make { for_demand: bool },
    /// Nothing: it was found to fit in free memory (the node may still evict on its own).
    Free,
}

/// Load `model` on node `idx` in the background, unless a load of it there is in progress
/// (or failed a moment ago, `Ops::RETRY_AFTER`); true when one started. `once`: recorded as
/// done when it ends (`Ops::was_done`), so it is not started again for the same reason.
fn start_load(
    fleet: &Arc<Fleet>,
    idx: usize,
    model: &str,
    why: &str,
    room: Room,
    once: bool,
) -> bool {
    let key = load_key(idx, model);
    if !fleet.ops.start(&key) {
        return false;
    }
    let node_id = fleet.node_config(idx).id.clone();
    METRICS.prewarms.with_label_values(&[&node_id, model]).inc();
    log::info!("pre-warm: {why}, loading {model} on {node_id}");
    let (fleet, model) = (fleet.clone(), model.to_string());
    tokio::spawn(async move {
        // What the load throws out is chosen as for a request's cold load.
        if let Room::Make { for_demand } = room {
            node_api::make_room(&fleet, idx, &model, for_demand).await;
        }
        if let Err(e) = node_api::load(&fleet, idx, &model).await {
            log::warn!("pre-warm {model} on {node_id}: {e}");
            fleet.ops.failed(&key);
        }
        node_api::refresh(&fleet, idx).await;
        fleet.ops.finish(&key, once);
    });
    true
}

/// Completion mode: the next request's predicted seat wait on the busy node exceeds the
/// runner-up's predicted load time.
fn worth_loading(
    fleet: &Fleet,
    view: &FleetView,
    busy: usize,
    model: &str,
    elsewhere: &Decision,
    runner_up: &Choice,
) -> bool {
    let here = super::prediction_of(&super::decide_model(fleet, view, model), busy);
    let there = super::prediction_of(elsewhere, runner_up.node);
    matches!((here, there), (Some(h), Some(t)) if h.wait_s > t.load_s)
}

#[async_trait]
impl BackgroundService for Prewarm {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let configured = self.fleet.config().queue.prewarm_interval_ms;
        loop {
            let period = match self.fleet.config().routing.policy.mode {
                Mode::Completion => super::completion_period(&self.fleet, configured),
                Mode::Spec | Mode::LeastBusy | Mode::RoundRobin => {
                    Duration::from_millis(configured)
                }
            };
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tokio::time::sleep(period) => {
                    let n = self.cycle();
                    log::debug!("pre-warm cycle: {n} loads started");
                }
            }
        }
    }
}
