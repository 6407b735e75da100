//! Completion mode: which idle models a cold load should unload to make room. Left to itself
//! the backend (Ollama, the sim) throws out the least recently used, which may be the model
//! whose reload costs its users most: a 70B that takes 25 s to read back in, asked for every
//! few seconds, goes before a 14B that reloads in 9. This picks, among the sets of idle loaded
//! models that free enough memory, the one whose users would lose the least time: each
//! model's demand on the node (responses per second, learned) times its reload time
//! (observed, else size over read speed). A model seen asked for once or never has been asked
//! for at most once since the gateway began watching (`since_ms`): right after a start that
//! is no evidence of being cold, after hours it is. Pure: time is an argument.

use super::completion::read_s;
use super::eliminate::available_with;
use super::policy::Policy;
use super::types::{Loads, ModelView, NodeView};

/// More idle loaded models than this are ranked greedily (cost per GB) instead of over every
/// subset.
const EXHAUSTIVE_UP_TO: usize = 12;

/// One model that could be unloaded.
#[derive(Debug, Clone, Copy)]
struct Idle<'a> {
    name: &'a str,
    gb: f64,
    /// Seconds of reload its users are expected to pay per second it is away.
    cost: f64,
    /// Seconds one reload takes.
    reload_s: f64,
}

/// The idle models to unload from node `idx` (`node` as routing saw it) before loading
/// `model` there: the cheapest set that makes room; empty when the model is loaded, fits as
/// things are, or no set of idle models makes room (the backend then does what it does).
/// `since_ms`: when the gateway began watching (its start; a node registered later is
/// taken as watched since then too).
pub fn victims(
    policy: &Policy,
    node: &NodeView,
    idx: usize,
    model: &str,
    loads: &dyn Loads,
    watched: (u64, u64),
) -> Vec<String> {
    match room(policy, node, idx, model, loads, watched) {
        Some(Room::Unload(set)) => set.into_iter().map(|m| m.name.to_string()).collect(),
        _ => Vec::new(),
    }
}

/// Whether a cold load of `model` on node `idx` fits as things are: the model is on disk
/// there and its size known, the node's memory is known, and the model fits beside what it
/// holds and the loads in progress, nothing unloaded for it.
pub fn fits_free(node: &NodeView, idx: usize, model: &str, loads: &dyn Loads) -> bool {
    node.model(model)
        .filter(|m| !m.loaded && m.on_disk && m.resident_gb.unwrap_or(m.size_gb) > 0.0)
        .is_some_and(|target| {
            let need = need_gb(node, idx, target, loads);
            need.is_finite() && need <= 0.0
        })
}

/// GB a cold load of `target` on node `idx` needs freed first (<= 0: it fits; NaN or
/// infinite: the node's memory cannot be judged).
fn need_gb(node: &NodeView, idx: usize, target: &ModelView, loads: &dyn Loads) -> f64 {
    // Being read in: for a request, or in the background.
    let reading = |name: &str| loads.model(idx, name).busy() || loads.loading(idx, name);
    let g = growth(node);
    held_gb(target, g) - free_gb_held(node, &target.name, reading, g)
}

/// Whether to read `model` back into node `idx` now, unasked: the gateway unloaded it to make
/// room for another model, which has gone idle. Yes when its users are expected to lose more
/// reload time per second while it is away (its learned demand times its reload time) than
/// the idle models that would go for it (the set a cold load would unload, as
/// [`victims`]), or when it fits as things are. A model served fewer than twice on the node
/// has no rate of asking to weigh: it is not read in on speculation.
pub fn worth_restoring(
    policy: &Policy,
    node: &NodeView,
    idx: usize,
    model: &str,
    loads: &dyn Loads,
    (since_ms, now_ms): (u64, u64),
) -> bool {
    let rates = loads.rates(idx, model);
    let Some(target) = node.model(model).filter(|_| rates.gap_s.is_some()) else {
        return false;
    };
    let away = rates.demand_per_s(since_ms, now_ms) * read_s(policy, node, target, rates.load_s);
    match room(policy, node, idx, model, loads, (since_ms, now_ms)) {
        Some(Room::Fits) => true,
        Some(Room::Unload(set)) => away > set.iter().map(|m| m.cost).sum::<f64>(),
        Some(Room::None) | None => false,
    }
}

/// A cold load of `model` on node `idx` would push out a model in use: the node's memory is
/// known, the model does not fit, and its idle loaded models do not make room. A load nobody
/// asked for (pre-warm) is not started then: the backend would evict a model requests run
/// on, or hold the load until they end, and their next requests would bring it back over
/// this one.
pub fn crowded(node: &NodeView, idx: usize, model: &str, loads: &dyn Loads) -> bool {
    let Some(target) = node.model(model).filter(|m| !m.loaded) else {
        return false;
    };
    let need = need_gb(node, idx, target, loads);
    need.is_finite() && need > 0.0 && idle_gb(node, idx, model, loads) < need
}

/// What node `idx`'s loaded models other than `model` that nothing runs or waits for hold.
fn idle_gb(node: &NodeView, idx: usize, model: &str, loads: &dyn Loads) -> f64 {
    let g = growth(node);
    node.models
        .iter()
        .filter(|m| m.loaded && m.name != model && !loads.model(idx, &m.name).busy())
        .map(|m| held_gb(m, g))
        .sum()
}

/// What a cold load of a model needs unloaded first.
enum Room<'a> {
    /// It fits as things are.
    Fits,
    /// The cheapest set of idle models that makes room.
    Unload(Vec<Idle<'a>>),
    /// No set of idle models makes room.
    None,
}

/// [`Room`] for a cold load of `model` on node `idx`; `None` when it is loaded or not there.
fn room<'a>(
    policy: &Policy,
    node: &'a NodeView,
    idx: usize,
    model: &str,
    loads: &dyn Loads,
    (since_ms, now_ms): (u64, u64),
) -> Option<Room<'a>> {
    let target = node.model(model).filter(|m| !m.loaded)?;
    let busy = |name: &str| loads.model(idx, name).busy();
    let g = growth(node);
    let need = need_gb(node, idx, target, loads);
    if need.is_nan() || need.is_infinite() {
        return Some(Room::None);
    }
    if need <= 0.0 {
        return Some(Room::Fits);
    }
    if idle_gb(node, idx, model, loads) < need {
        return Some(Room::None);
    }
    let idle: Vec<Idle<'_>> = node
        .models
        .iter()
        .filter(|m| m.loaded && m.name != model)
        .filter(|m| !busy(&m.name))
        .map(|m| {
            let rates = loads.rates(idx, &m.name);
            let reload_s = read_s(policy, node, m, rates.load_s);
            Idle {
                name: &m.name,
                gb: held_gb(m, g),
                cost: rates.demand_per_s(since_ms, now_ms) * reload_s,
                reload_s,
            }
        })
        .collect();
    let chosen = if idle.len() <= EXHAUSTIVE_UP_TO {
        cheapest_subset(&idle, need)
    } else {
        greedy(&idle, need)
    };
    Some(Room::Unload(chosen.into_iter().map(|i| idle[i]).collect()))
}

/// How much more than their weights the node's loaded models hold (context and cache come on
/// top): resident over weights summed over those with both known, else 1.
pub(super) fn growth(node: &NodeView) -> f64 {
    let (resident, weights) = node
        .models
        .iter()
        .filter(|m| m.loaded && m.size_gb > 0.0)
        .filter_map(|m| m.resident_gb.map(|r| (r, m.size_gb)))
        .fold((0.0, 0.0), |(r, w), (a, b)| (r + a, w + b));
    if weights > 0.0 && resident > 0.0 {
        resident / weights
    } else {
        1.0
    }
}

/// What a model holds (or will hold) in memory: its resident size when measured, else its
/// weights grown by `g` (the node's [`growth`]).
pub(super) fn held_gb(model: &ModelView, g: f64) -> f64 {
    model.resident_gb.unwrap_or(model.size_gb * g)
}

/// Free memory for a cold load of `target` with nothing evicted, GB as they will be held:
/// loaded models, and the other cold loads in progress (models the view has not loaded that
/// requests were sent to, or a pre-warm or restore is reading in), count as [`held_gb`]. Negative
/// when the loads in progress already overdraw it. A node that reports its free memory has
/// counted the loads in progress itself.
fn free_gb_held(node: &NodeView, target: &str, reading: impl Fn(&str) -> bool, g: f64) -> f64 {
    let loading: f64 = if node.free_memory_gb.is_some() {
        0.0
    } else {
        node.models
            .iter()
            .filter(|m| !m.loaded && m.name != target && reading(&m.name))
            .map(|m| held_gb(m, g))
            .sum()
    };
    available_with(node, 0.0, |m| held_gb(m, g)) - loading
}

/// Order of two sets: expected cost, then total reload time (what a cost of 0 cannot tell:
/// with nothing learned every model is as likely to be asked for next), then fewer models.
fn key(idle: &[Idle<'_>], set: &[usize]) -> (f64, f64, usize) {
    let cost = set.iter().map(|&i| idle[i].cost).sum();
    let reload = set.iter().map(|&i| idle[i].reload_s).sum();
    (cost, reload, set.len())
}

fn cheapest_subset(idle: &[Idle<'_>], need: f64) -> Vec<usize> {
    let mut best: Option<(Vec<usize>, (f64, f64, usize))> = None;
    for mask in 1u32..(1 << idle.len()) {
        let set: Vec<usize> = (0..idle.len()).filter(|i| mask & (1 << i) != 0).collect();
        if set.iter().map(|&i| idle[i].gb).sum::<f64>() < need {
            continue;
        }
        let k = key(idle, &set);
        if best
            .as_ref()
            .is_none_or(|(_, b)| k.partial_cmp(b).is_some_and(|o| o.is_lt()))
        {
            best = Some((set, k));
        }
    }
    best.map(|(s, _)| s).unwrap_or_default()
}

/// Cheapest per GB first until enough is freed.
fn greedy(idle: &[Idle<'_>], need: f64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..idle.len()).collect();
    let per_gb = |i: usize| {
        let m = idle[i];
        (
            m.cost / m.gb.max(f64::MIN_POSITIVE),
            m.reload_s / m.gb.max(f64::MIN_POSITIVE),
        )
    };
    order.sort_by(|&a, &b| {
        per_gb(a)
            .partial_cmp(&per_gb(b))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut freed = 0.0;
    let mut set = Vec::new();
    for i in order {
        if freed >= need {
            break;
        }
        freed += idle[i].gb;
        set.push(i);
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::testkit::{loaded, model, node, queue, TableLoads};
    use crate::routing::Rates;

    const NOW: u64 = 10_000_000;

    /// The home lab's workstation: 64 GB holding small, mid and big; coder (20 GB) needs 7
    /// more than is free.
    fn workstation() -> NodeView {
        let mut ws = node(
            "ws",
            vec![
                loaded("small", 2.0),
                loaded("mid", 9.0),
                loaded("big", 40.0),
                model("coder", 20.0),
            ],
        );
        ws.memory_gb = 64.0;
        ws.free_memory_gb = None;
        ws
    }

    /// Asked for every `gap_s`, last just now, each load having taken `load_s`.
    fn asked(gap_s: f64, load_s: f64) -> Rates {
        Rates {
            observed: 10,
            last_ms: Some(NOW),
            gap_s: Some(gap_s),
            load_s: Some(load_s),
            ..Rates::default()
        }
    }

    fn pick(ws: &NodeView, target: &str, loads: &TableLoads) -> Vec<String> {
        // Watching for an hour: a model never asked for is cold.
        victims(
            &Policy::default(),
            ws,
            0,
            target,
            loads,
            (NOW - 3_600_000, NOW),
        )
    }

    #[test]
    fn nothing_is_learned_yet_the_cheapest_reload_that_makes_room_goes() {
        // Small alone frees 2 of the 7; mid (9 GB, 4.5 s at 2 GB/s) is cheaper than big (20 s).
        assert_eq!(
            pick(&workstation(), "coder", &TableLoads::default()),
            ["mid"]
        );
    }

    #[test]
    fn a_model_never_asked_for_is_cold_only_after_a_while_of_watching() {
        // Big asked for every 10 s, reloads in 2.5 s: 0.25 s/s. Mid never seen asked for.
        let loads = TableLoads::default().rated(0, "big", asked(10.0, 2.5));
        assert_eq!(pick(&workstation(), "coder", &loads), ["mid"]);
        // One second after the gateway started, "never" is under a second: mid's 4.5 s reload
        // at 1/s costs more than big's.
        let v = victims(
            &Policy::default(),
            &workstation(),
            0,
            "coder",
            &loads,
            (NOW - 1_000, NOW),
        );
        assert_eq!(v, ["big"]);
    }

    #[test]
    fn a_cold_model_takes_the_room_the_loaded_ones_took_over_their_weights() {
        // Loaded models hold 10 % over their weights: 56.1 GB, 7.9 free; coder's 20 GB will
        // take 22, so mid (9.9) is not room enough and big goes.
        let mut ws = workstation();
        for m in ws.models.iter_mut().filter(|m| m.loaded) {
            m.resident_gb = Some(m.size_gb * 1.1);
        }
        assert_eq!(pick(&ws, "coder", &TableLoads::default()), ["big"]);
        // Big just loaded, its resident size not reported yet: it holds 44 as the others
        // grew, so mid and small (12.1) are still not room enough while big is busy.
        ws.models[2].resident_gb = None;
        let loads = TableLoads::default().with(0, "big", queue(1, 0));
        assert!(pick(&ws, "coder", &loads).is_empty());
    }

    #[test]
    fn a_cold_load_in_progress_holds_the_room_it_is_reading_into() {
        // Big unloaded for coder earlier and now being read back in (a request sent to it):
        // its 40 GB are taken, so loading coder needs 7 more again and mid goes.
        let mut ws = workstation();
        ws.models[2].loaded = false;
        let loads = TableLoads::default().with(0, "big", queue(1, 0));
        assert_eq!(pick(&ws, "coder", &loads), ["mid"]);
        assert!(
            pick(&ws, "coder", &TableLoads::default()).is_empty(),
            "nothing loading"
        );
        // Read back in by a restore, no request waiting: as taken.
        let reading = TableLoads::default().reading(0, "big");
        assert_eq!(pick(&ws, "coder", &reading), ["mid"]);
        // A node that reports its free memory has counted the load in progress itself: 13
        // free means 7 short, mid goes (not big's 40 taken off again).
        ws.free_memory_gb = Some(13.0);
        assert_eq!(pick(&ws, "coder", &loads), ["mid"]);
    }

    #[test]
    fn the_model_asked_for_least_times_its_reload_goes_first() {
        // Equal demand: mid's 0.9 s reload beats big's 2.5 s.
        let loads = TableLoads::default()
            .rated(0, "mid", asked(0.7, 0.9))
            .rated(0, "big", asked(0.7, 2.5));
        assert_eq!(pick(&workstation(), "coder", &loads), ["mid"]);
        // Mid asked for ten times as often: big goes (3.6 s/s against mid's 12.9).
        let loads = TableLoads::default()
            .rated(0, "mid", asked(0.07, 0.9))
            .rated(0, "big", asked(0.7, 2.5));
        assert_eq!(pick(&workstation(), "coder", &loads), ["big"]);
        // Big not asked for in 100 s (its gap was 0.7 s): quiet, it goes.
        let quiet = Rates {
            last_ms: Some(NOW - 100_000),
            ..asked(0.7, 2.5)
        };
        let loads = TableLoads::default()
            .rated(0, "mid", asked(0.7, 0.9))
            .rated(0, "big", quiet);
        assert_eq!(pick(&workstation(), "coder", &loads), ["big"]);
    }

    #[test]
    fn a_busy_model_is_never_unloaded_and_no_room_means_no_choice() {
        let loads = TableLoads::default().with(0, "mid", queue(1, 0));
        assert_eq!(pick(&workstation(), "coder", &loads), ["big"]);
        let loads = loads.with(0, "big", queue(0, 1));
        assert!(pick(&workstation(), "coder", &loads).is_empty());
    }

    /// Crowded: only a model in use could make room (what pre-warm will not load over); not
    /// so while an idle one can, when it fits, or when the node's memory is not known.
    #[test]
    fn a_load_only_a_busy_model_could_make_room_for_is_crowded() {
        let mid_busy = TableLoads::default().with(0, "mid", queue(1, 0));
        assert!(
            !crowded(&workstation(), 0, "coder", &mid_busy),
            "big is idle"
        );
        let both_busy = mid_busy.with(0, "big", queue(0, 1));
        assert!(crowded(&workstation(), 0, "coder", &both_busy));
        let mut roomy = workstation();
        roomy.memory_gb = 128.0;
        assert!(!crowded(&roomy, 0, "coder", &both_busy), "it fits");
        let mut unknown = workstation();
        unknown.memory_gb = 0.0;
        assert!(
            !crowded(&unknown, 0, "coder", &both_busy),
            "memory not known"
        );
    }

    #[test]
    fn a_loaded_or_fitting_model_unloads_nothing() {
        let ws = workstation();
        assert!(pick(&ws, "mid", &TableLoads::default()).is_empty());
        let mut roomy = workstation();
        roomy.memory_gb = 128.0;
        assert!(pick(&roomy, "coder", &TableLoads::default()).is_empty());
    }

    /// The workstation after a request's cold load of coder unloaded big: small, mid and
    /// coder loaded, each holding 10 % over its weights (34.1 GB); big needs 44 of 64.
    fn after_coder() -> NodeView {
        let mut ws = workstation();
        ws.models[2].loaded = false;
        ws.models[3].loaded = true;
        for m in ws.models.iter_mut().filter(|m| m.loaded) {
            m.resident_gb = Some(m.size_gb * 1.1);
        }
        ws
    }

    fn restore(ws: &NodeView, model: &str, loads: &TableLoads) -> bool {
        worth_restoring(
            &Policy::default(),
            ws,
            0,
            model,
            loads,
            (NOW - 3_600_000, NOW),
        )
    }

    #[test]
    fn an_unloaded_model_comes_back_when_its_users_lose_more_than_the_idle_ones_that_go() {
        // Big asked for every 0.7 s, last 1 s ago, reloads in 2.5 s: 2.5 s lost per second
        // away. Coder (the only set that makes room: small and mid hold 12.1 of the 14.1
        // needed) asked for every 3 s, reloads in 1.5 s: 0.5 s/s.
        let big = Rates {
            last_ms: Some(NOW - 1_000),
            ..asked(0.7, 2.5)
        };
        let loads = TableLoads::default()
            .rated(0, "big", big)
            .rated(0, "coder", asked(3.0, 1.5));
        assert!(restore(&after_coder(), "big", &loads));
        // Coder asked for every 0.3 s: 5 s/s, it stays.
        let loads = loads.clone().rated(0, "coder", asked(0.3, 1.5));
        assert!(!restore(&after_coder(), "big", &loads));
        // Big quiet for 100 s: 0.025 s/s, it stays away.
        let quiet = Rates {
            last_ms: Some(NOW - 100_000),
            ..asked(0.7, 2.5)
        };
        let loads = TableLoads::default()
            .rated(0, "big", quiet)
            .rated(0, "coder", asked(3.0, 1.5));
        assert!(!restore(&after_coder(), "big", &loads));
    }

    #[test]
    fn nothing_busy_is_unloaded_and_nothing_unserved_is_read_in_to_restore() {
        let big = Rates {
            last_ms: Some(NOW - 1_000),
            ..asked(0.7, 2.5)
        };
        // Coder serving: no idle set makes room.
        let loads = TableLoads::default()
            .rated(0, "big", big)
            .with(0, "coder", queue(1, 0));
        assert!(!restore(&after_coder(), "big", &loads));
        // Never served on this node, or once: no evidence anyone will ask again.
        assert!(!restore(&after_coder(), "big", &TableLoads::default()));
        let once = Rates { gap_s: None, ..big };
        let loads_once = TableLoads::default().rated(0, "big", once);
        assert!(!restore(&after_coder(), "big", &loads_once));
        // Loaded already: nothing to restore.
        assert!(!restore(&workstation(), "big", &loads));
        // Room enough as things are: it comes back without unloading anything.
        let mut roomy = after_coder();
        roomy.memory_gb = 128.0;
        let loads = TableLoads::default().rated(0, "big", big);
        assert!(restore(&roomy, "big", &loads));
    }

    #[test]
    fn many_idle_models_are_ranked_greedily_by_cost_per_gb() {
        let mut models: Vec<ModelView> = (0..14).map(|i| loaded(&format!("m{i}"), 4.0)).collect();
        models.push(model("new", 10.0));
        let mut n = node("n", models);
        n.memory_gb = 56.0;
        n.free_memory_gb = None;
        let mut loads = TableLoads::default();
        for i in 0..14 {
            loads = loads.rated(0, &format!("m{i}"), asked(1.0 + f64::from(i), 1.0));
        }
        // 10 GB needed: the three asked for least (m13, m12, m11).
        let mut v = pick(&n, "new", &loads);
        v.sort();
        assert_eq!(v, ["m11", "m12", "m13"]);
    }
}
