//! `decide` in completion mode: ranking by predicted finish, the fallback chain by time, the
//! prefix credit, and the hard rules shared with spec mode.

use super::completion::Prediction;
use super::decide::decide;
use super::policy::Policy;
use super::testkit::*;
use super::types::*;

fn completion() -> Policy {
    Policy {
        mode: Mode::Completion,
        ..Policy::default()
    }
}

fn req(models: &[&str], prompt: u32) -> RouteRequest {
    RouteRequest {
        models: models.iter().map(|m| m.to_string()).collect(),
        prompt_tokens: prompt,
        max_output_tokens: Some(200),
        ..RouteRequest::default()
    }
}

/// Completion mode's decision at the time the rates were seen.
fn at(r: &RouteRequest, f: &FleetView, loads: &TableLoads) -> Decision {
    decide(r, f, &completion(), loads, 1_000_000)
}

/// Rates of a node decoding at `tps` alone (prefill 20x), seen just now.
fn seen(tps: f64) -> Rates {
    Rates {
        prefill_tps: Some(20.0 * tps),
        decode_spt: Some(1.0 / tps),
        output_tokens: Some(200.0),
        observed: 20,
        last_ms: Some(1_000_000),
        ..Rates::default()
    }
}

/// The prediction of table row `row` (completion mode).
fn predicted(d: &Decision, row: usize) -> Prediction {
    match d.table[row].verdict {
        Verdict::Predicted { prediction } => prediction,
        ref other => panic!("row {row} not predicted: {other:?}"),
    }
}

/// `got` (a rate of `p`) is `want`.
fn assert_near(got: f64, want: f64, p: &Prediction) {
    assert!((got - want).abs() < 1e-9, "{got} vs {want}: {p:?}");
}

/// `nodes` with 4 seats each and no bandwidth given (priors: model GB / 100 GB/s).
fn fleet_of_4_seats(nodes: Vec<NodeView>) -> FleetView {
    let mut f = fleet(nodes);
    for n in &mut f.nodes {
        n.seats = 4;
        n.bandwidth_gbps = None;
    }
    f
}

/// Nodes of 4 seats, each with `m` (`gb` GB) loaded.
fn alike(ids: &[&str], gb: f64) -> FleetView {
    fleet_of_4_seats(
        ids.iter()
            .map(|id| node(id, vec![loaded("m", gb)]))
            .collect(),
    )
}

/// Nodes 0 and 1 of a fleet serving `m`: node 0 at 100 tokens/s alone, +5 ms per token for
/// each further stream, running 2; node 1 at 20 tokens/s, idle.
fn known_busy_and_slow() -> TableLoads {
    let busy = Rates {
        decode_spt_per_stream: Some(0.005),
        ..seen(100.0)
    };
    TableLoads::default()
        .rated(0, "m", busy)
        .with(0, "m", queue(2, 0))
        .rated(1, "m", seen(20.0))
}

/// The home lab of issue 9: a workstation 4x faster than a laptop, both with the small model
/// loaded. Spec 000's role affinity sends small models to the laptop; completion mode sends
/// them where they finish first, until the workstation's seats are full.
#[test]
fn small_model_goes_to_the_fast_node_with_free_seats() {
    let mut ws = node("workstation", vec![loaded("small", 4.0)]);
    ws.seats = 8;
    let laptop = node("laptop", vec![loaded("small", 4.0)]);
    let mut laptop = laptop;
    laptop.bandwidth_gbps = Some(100.0);
    laptop.seats = 2;
    let f = fleet(vec![ws, laptop]);
    let loads = TableLoads::default()
        .rated(0, "small", seen(40.0))
        .rated(1, "small", seen(10.0));
    let r = req(&["small"], 500);
    let spec = decide(&r, &f, &Policy::default(), &loads, 1_000_000);
    assert_eq!(
        spec.winner().unwrap().node_id,
        "laptop",
        "spec 000 role affinity"
    );
    let d = at(&r, &f, &loads);
    let w = d.winner().unwrap();
    assert_eq!(w.node_id, "workstation");
    assert!((w.predicted_s.unwrap() - (500.0 / 800.0 + 200.0 / 40.0)).abs() < 1e-9);
    // All 8 seats busy and p waiting: (p + 1) / 8 seat times of wait (6.7 s each at 8
    // streams, with the prior contention of 3 % a stream). The workstation keeps winning until
    // that exceeds the laptop's 22.5 s.
    let busy = |pending| loads.clone().with(0, "small", queue(8, pending));
    let d = decide(&r, &f, &completion(), &busy(10), 1_000_000);
    assert_eq!(d.winner().unwrap().node_id, "workstation");
    let d = decide(&r, &f, &completion(), &busy(30), 1_000_000);
    assert_eq!(d.winner().unwrap().node_id, "laptop");
}

#[test]
fn loaded_fallback_beats_cold_primary_only_when_it_finishes_first() {
    // Primary 40 GB, cold (20 s at 2 GB/s); fallback loaded: the fallback wins.
    let f = fleet(vec![
        node("a", vec![model("big", 40.0)]),
        node("b", vec![loaded("small", 4.0)]),
    ]);
    let loads = TableLoads::default()
        .rated(0, "big", seen(20.0))
        .rated(1, "small", seen(40.0));
    let d = at(&req(&["big", "small"], 100), &f, &loads);
    let w = d.winner().unwrap();
    assert_eq!((w.node_id.as_str(), w.fallback), ("b", true));
    // A 1 GB primary loads in 0.5 s while the fallback's node is deep in queue: the primary.
    let f = fleet(vec![
        node("a", vec![model("big", 1.0)]),
        node("b", vec![loaded("small", 4.0)]),
    ]);
    let deep = loads.clone().with(1, "small", queue(1, 5));
    let d = at(&req(&["big", "small"], 100), &f, &deep);
    let w = d.winner().unwrap();
    assert_eq!((w.node_id.as_str(), w.cold), ("a", true));
    // A warm primary wins even when a fallback would be faster.
    let f = fleet(vec![
        node("a", vec![loaded("big", 40.0)]),
        node("b", vec![loaded("small", 4.0)]),
    ]);
    let d = at(&req(&["big", "small"], 100), &f, &loads);
    assert_eq!(d.winner().unwrap().model, "big");
    assert_eq!(d.ranked[1].model, "small");
}

/// Three alike nodes a, b, c with model m loaded, each with 40 answers' rates.
fn three_alike() -> (FleetView, TableLoads) {
    let f = fleet(vec![
        node("a", vec![loaded("m", 4.0)]),
        node("b", vec![loaded("m", 4.0)]),
        node("c", vec![loaded("m", 4.0)]),
    ]);
    let mut loads = TableLoads::default();
    for i in 0..3 {
        loads = loads.rated(i, "m", seen(40.0));
    }
    (f, loads)
}

#[test]
fn the_cached_prefix_counts_on_its_node_only_and_spills_when_that_queue_deepens() {
    let (f, loads) = three_alike();
    let key = 42u64;
    let owner = (0..3)
        .max_by_key(|i| super::rendezvous_weight(key, &f.nodes[*i].id))
        .unwrap();
    let r = RouteRequest {
        affinity_key: Some(key),
        cached_prefix_tokens: 3_000,
        ..req(&["m"], 4_000)
    };
    let d = at(&r, &f, &loads);
    assert_eq!(d.winner().unwrap().node, owner);
    assert_eq!(d.affinity, AffinityKind::Matched);
    let prediction = predicted(&d, owner);
    assert_eq!(prediction.cached_tokens, 3_000);
    let other = (owner + 1) % 3;
    let prediction = predicted(&d, other);
    assert_eq!(prediction.cached_tokens, 0);
    // The owner's one seat is taken and two wait: another node finishes sooner.
    let busy = loads.clone().with(owner, "m", queue(1, 2));
    let d = at(&r, &f, &busy);
    assert_ne!(d.winner().unwrap().node, owner);
    assert_eq!(d.affinity, AffinityKind::Spilled);
    // The node this gateway saw serve the conversation holds it, not the rendezvous node.
    let r = RouteRequest {
        cached_on: Some(f.nodes[other].id.clone()),
        ..r
    };
    let d = at(&r, &f, &loads);
    assert_eq!(d.winner().unwrap().node, other);
}

#[test]
fn a_system_prompt_counts_as_cached_on_the_nodes_that_served_it() {
    let (f, loads) = three_alike();
    // A one-shot request (no conversation) whose 3,000-token system prompt b and c served.
    let r = RouteRequest {
        shared_prefix_tokens: 3_000,
        shared_on: vec!["c".into(), "b".into()],
        ..req(&["m"], 3_200)
    };
    let d = at(&r, &f, &loads);
    assert_ne!(d.winner().unwrap().node_id, "a");
    assert_eq!(predicted(&d, 0).cached_tokens, 0);
    assert_eq!(predicted(&d, 1).cached_tokens, 3_000);
    assert_eq!(predicted(&d, 2).cached_tokens, 3_000);
    // A fallback model is not credited: what b and c served was the primary.
    let two = RouteRequest {
        models: vec!["m".into(), "m2".into()],
        ..r.clone()
    };
    let f2 = fleet(vec![
        node("a", vec![loaded("m", 4.0)]),
        node("b", vec![loaded("m2", 4.0)]),
    ]);
    let d = at(&two, &f2, &TableLoads::default());
    let b = d
        .table
        .iter()
        .find(|row| (row.node, row.model) == (1, 1))
        .and_then(|row| match &row.verdict {
            Verdict::Predicted { prediction } => Some(prediction.cached_tokens),
            _ => None,
        });
    assert_eq!(b, Some(0));
    // A conversation credited on c with less than its system prompt gets the larger credit.
    let r = RouteRequest {
        affinity_key: Some(42),
        cached_on: Some("c".into()),
        cached_prefix_tokens: 1_000,
        ..r
    };
    let d = at(&r, &f, &loads);
    assert_eq!(predicted(&d, 2).cached_tokens, 3_000);
    // Busy, c keeps its conversation's credit (the system prompt's needs a free seat), and a
    // busy b gets none.
    let busy = loads
        .clone()
        .with(1, "m", queue(1, 2))
        .with(2, "m", queue(1, 2));
    let d = at(&r, &f, &busy);
    assert_eq!(predicted(&d, 2).cached_tokens, 1_000);
    assert_eq!(predicted(&d, 1).cached_tokens, 0);
}

#[test]
fn hard_rules_are_the_same_in_both_modes() {
    let mut small = node("small-window", vec![loaded("m", 4.0)]);
    small.models[0].max_context = 4_096;
    small.models[0].loaded_context = Some(4_096);
    let mut off = node("offline", vec![loaded("m", 4.0)]);
    off.health = Health::Offline;
    let mut tagged = node("no-vision", vec![loaded("m", 4.0)]);
    tagged.tags = vec![];
    let mut vision = node("vision", vec![model("m", 4.0)]);
    vision.tags = vec!["vision".into()];
    let f = fleet(vec![small, off, tagged, vision]);
    let r = RouteRequest {
        required_tags: vec!["vision".into()],
        ..req(&["m"], 8_000)
    };
    let loads = TableLoads::default();
    let spec = decide(&r, &f, &Policy::default(), &loads, 0);
    let comp = decide(&r, &f, &completion(), &loads, 0);
    let reasons = |d: &Decision| {
        d.table
            .iter()
            .map(|row| match row.verdict {
                Verdict::Eliminated { reason } => Some(reason),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(reasons(&spec), reasons(&comp));
    assert_eq!(comp.winner().unwrap().node_id, "vision");
    assert!(comp.winner().unwrap().cold);
    // Nothing fits: the same no-route cause.
    let huge = req(&["m"], 1_000_000);
    assert_eq!(
        decide(&huge, &f, &completion(), &loads, 0).no_route,
        Some(NoRoute::ContextTooLong)
    );
}

#[test]
fn a_deeper_queue_is_never_predicted_sooner() {
    let f = fleet(vec![node("a", vec![loaded("m", 4.0)])]);
    let mut last = 0.0;
    for pending in 0..20 {
        let loads = TableLoads::default()
            .rated(0, "m", seen(30.0))
            .with(0, "m", queue(1, pending));
        let d = decide(&req(&["m"], 1_000), &f, &completion(), &loads, 1_000_000);
        let t = d.winner().unwrap().predicted_s.unwrap();
        assert!(t > last, "pending {pending}: {t} <= {last}");
        last = t;
    }
}

/// A node that slowed down: its running answer streams five times slower than the rates it
/// was learned at, so the next request is priced at that pace and goes to its twin; a node
/// streaming faster than its rates keeps them.
#[test]
fn a_node_whose_running_answers_stream_slower_than_its_rates_is_priced_at_that_pace() {
    let f = fleet(vec![
        node("slowed", vec![loaded("m", 4.0)]),
        node("steady", vec![loaded("m", 4.0)]),
    ]);
    // Both learned at 100 tok/s alone; one stream running on each.
    let r = req(&["m"], 1_000);
    let loads = TableLoads::default()
        .rated(0, "m", seen(100.0))
        .rated(1, "m", seen(100.0))
        .with(0, "m", queue(1, 0))
        .with(1, "m", queue(1, 0));
    // `slowed`'s answer has streamed 40 tokens in 2 s (20 tok/s): five times its rate.
    let d = at(
        &r,
        &f,
        &loads
            .clone()
            .streaming(0, "m", 2.0, 40.0, 1)
            .streaming(1, "m", 0.4, 40.0, 1),
    );
    let (a, b) = (predicted(&d, 0), predicted(&d, 1));
    assert_near(a.pace, 5.0, &a);
    assert_near(b.pace, 1.0, &b);
    assert_near(a.decode_s, 200.0 * 0.05, &a);
    assert_eq!(d.winner().unwrap().node_id, "steady");
    // Faster than its rates: left to the rates (the response teaches it at its end).
    let d = at(&r, &f, &loads.streaming(0, "m", 0.2, 40.0, 1));
    assert_near(predicted(&d, 0).pace, 1.0, &predicted(&d, 0));
}

/// A slowdown is the node's: with nothing of `m` running on `slowed`, the answer its other
/// model streams five times slower than that model's rate prices `m` there five times slower
/// too, and the request goes to `steady` (the rag-agents bench: a small model newly loaded on
/// a GPU slowed half-way was priced at its full speed and waited 5.6 s there).
#[test]
fn a_node_slowed_on_one_model_is_priced_slowed_on_the_others() {
    let f = fleet(vec![
        node("slowed", vec![loaded("m", 4.0), loaded("other", 4.0)]),
        node("steady", vec![loaded("m", 4.0)]),
    ]);
    let r = req(&["m"], 1_000);
    let loads = TableLoads::default()
        .rated(0, "m", seen(100.0))
        .rated(0, "other", seen(100.0))
        .rated(1, "m", seen(95.0))
        .with(0, "other", queue(1, 0));
    let p = predicted(&at(&r, &f, &loads), 0);
    assert_near(p.pace, 1.0, &p);
    // `other`'s answer has streamed 40 tokens in 2 s (20 tok/s): five times its rate.
    let slowed = loads.streaming(0, "other", 2.0, 40.0, 1);
    let d = at(&r, &f, &slowed);
    let p = predicted(&d, 0);
    assert_near(p.pace, 5.0, &p);
    assert_eq!(d.winner().unwrap().node_id, "steady", "{:?}", d.table);
}

/// Both nodes are full and alike in every rate: the one whose running requests end first (a
/// short prompt's, not two long ones') is where a seat frees first, and the wait says so; a
/// request waiting there already takes that seat, so the next free one counts. Without the
/// ends (requests sent before anything predicted them) both wait `ahead / seats x service`.
#[test]
fn a_full_node_whose_seats_free_first_wins() {
    let mut f = fleet(vec![
        node("long", vec![loaded("m", 4.0)]),
        node("short", vec![loaded("m", 4.0)]),
    ]);
    for n in &mut f.nodes {
        n.seats = 2;
    }
    let rated = |l: TableLoads| {
        let service = Rates {
            service_s: Some(2.0),
            ..seen(100.0)
        };
        l.rated(0, "m", service).rated(1, "m", service)
    };
    let r = req(&["m"], 1_000);
    let full = rated(TableLoads::default())
        .with(0, "m", queue(2, 0))
        .with(1, "m", queue(2, 0));
    let blind = at(&r, &f, &full);
    let (a, b) = (predicted(&blind, 0), predicted(&blind, 1));
    assert_near(a.wait_s, 1.0, &a);
    assert_near(b.wait_s, 1.0, &b);
    let ended = full
        .clone()
        .ending(0, "m", &[3.0, 5.0])
        .ending(1, "m", &[4.0, 0.25]);
    let d = at(&r, &f, &ended);
    assert_eq!(d.winner().unwrap().node_id, "short");
    assert_near(predicted(&d, 0).wait_s, 3.0, &predicted(&d, 0));
    assert_near(predicted(&d, 1).wait_s, 0.25, &predicted(&d, 1));
    // One already waits on `short`: it takes the seat free at 0.25 s until 2.25 s; the next
    // one frees at 2.25 s, still before `long`'s first at 3 s.
    let queued = rated(TableLoads::default())
        .with(0, "m", queue(2, 0))
        .with(1, "m", queue(2, 1))
        .ending(0, "m", &[3.0, 5.0])
        .ending(1, "m", &[4.0, 0.25]);
    let d = at(&r, &f, &queued);
    assert_near(predicted(&d, 1).wait_s, 2.25, &predicted(&d, 1));
    assert_eq!(d.winner().unwrap().node_id, "short");
    // Two wait there: 2.25 s and then 4 s taken, `long` (3 s) is sooner.
    let deeper = rated(TableLoads::default())
        .with(0, "m", queue(2, 0))
        .with(1, "m", queue(2, 2))
        .ending(0, "m", &[3.0, 5.0])
        .ending(1, "m", &[4.0, 0.25]);
    let d = at(&r, &f, &deeper);
    assert_near(predicted(&d, 1).wait_s, 4.0, &predicted(&d, 1));
    assert_eq!(d.winner().unwrap().node_id, "long");
    // One end unknown on `short` (2 running, 1 predicted): the heuristic there again.
    let partial = full.ending(1, "m", &[0.25]);
    let d = at(&r, &f, &partial);
    assert_near(predicted(&d, 1).wait_s, 1.0, &predicted(&d, 1));
}

/// An untried node is predicted as a typical node of the model (the mean of the observed
/// ones), so it gets a request when that beats what the known nodes offer at their load, not
/// each time the fastest is busy; once answered its own rates decide. (Priced at the fleet's
/// best, as until stop 36, the untried node won here although a typical node is 3x slower
/// than the known one alone: on the bench a slow box took a request as if it were the
/// fastest each time the fast ones had a stream or two.)
#[test]
fn an_untried_node_is_priced_as_a_typical_one() {
    let f = alike(&["known", "slow", "fresh"], 5.0);
    let r = req(&["m"], 1_000);
    // The known node runs 2 streams (each adds 5 ms per token): 50 tokens/s; a typical node
    // alone: 1 / 30 ms = 33 tokens/s. The known one wins.
    let loads = known_busy_and_slow();
    let d = at(&r, &f, &loads);
    assert_eq!(d.winner().unwrap().node_id, "known");
    let prediction = predicted(&d, 2);
    assert_near(
        prediction.decode_tps,
        1.0 / ((0.01 + 0.05) / 2.0),
        &prediction,
    );
    assert_eq!(prediction.observed, 0);
    // The known node full (4 running, 2 waiting): the untried one is tried.
    let full = loads.clone().with(0, "m", queue(4, 2));
    let d = at(&r, &f, &full);
    assert_eq!(d.winner().unwrap().node_id, "fresh");
    // Answered, and slow: its own rates keep it out while the known node has room.
    let answered = loads.clone().rated(2, "m", seen(10.0));
    let d = at(&r, &f, &answered);
    assert_eq!(d.winner().unwrap().node_id, "known");
    // With nothing observed anywhere there is no peer to borrow from: the priors
    // (5 GB / 100 GB/s = 20 tokens/s).
    let none = TableLoads::default();
    let d = at(&r, &f, &none);
    let prediction = predicted(&d, 0);
    assert_near(prediction.decode_tps, 20.0, &prediction);
}

/// An untried node waits its turn only so long: once the model has been served for
/// `completion_explore_after_s` (60 s) it gets the exploring discount (x0.5) on the typical
/// node's rates, so a new box is tried at a load the known nodes would carry alone.
#[test]
fn an_untried_node_is_discounted_once_the_model_has_been_served_a_while() {
    let f = alike(&["known", "slow", "fresh"], 5.0);
    let r = req(&["m"], 1_000);
    let first = |ms: u64| Rates {
        first_ms: Some(ms),
        ..seen(20.0)
    };
    let busy = Rates {
        decode_spt_per_stream: Some(0.005),
        first_ms: Some(1_000_000),
        ..seen(100.0)
    };
    let loads = |slow_first_ms: u64| {
        TableLoads::default()
            .rated(0, "m", busy)
            .with(0, "m", queue(2, 0))
            .rated(1, "m", first(slow_first_ms))
    };
    // Served for 1 s: typical (33 tokens/s), the known one (50) wins.
    let d = at(&r, &f, &loads(999_000));
    assert_eq!(d.winner().unwrap().node_id, "known");
    let soon = predicted(&d, 2);
    // Served for 61 s: the untried one, at half a typical node's time, is tried.
    let d = at(&r, &f, &loads(1_000_000 - 61_000));
    assert_eq!(d.winner().unwrap().node_id, "fresh");
    let later = predicted(&d, 2);
    assert_near(later.decode_s, 0.5 * soon.decode_s, &later);
    // The same when its node answered another model, slower: that is no optimism to spare
    // it the discount (it would have left it out for good).
    let mut f = f;
    f.nodes[2].models.push(loaded("other", 5.0));
    let d = at(
        &r,
        &f,
        &loads(1_000_000 - 61_000).rated(2, "other", seen(10.0)),
    );
    assert_eq!(d.winner().unwrap().node_id, "fresh");
    assert!(predicted(&d, 2).explored);
    // Answers kept from before a restart 1 s ago: the wait counts from the restart.
    let restarted = Restarted(loads(1_000_000 - 61_000), 999_000);
    let d = decide(&r, &f, &completion(), &restarted, 1_000_000);
    assert_eq!(d.winner().unwrap().node_id, "known");
}

/// `TableLoads` with the gateway watching since `.1` (ms).
struct Restarted(TableLoads, u64);

impl Loads for Restarted {
    fn node_in_flight(&self, node: usize) -> u32 {
        self.0.node_in_flight(node)
    }
    fn model(&self, node: usize, model: &str) -> ModelLoad {
        self.0.model(node, model)
    }
    fn rates(&self, node: usize, model: &str) -> Rates {
        self.0.rates(node, model)
    }
    fn watching_since_ms(&self) -> u64 {
        self.1
    }
}

/// A node the config describes as the same machine as one that answered (the same memory and
/// seats) is priced as that one until its own first answer, not as the model's best node: the
/// second laptop of a home lab is not tried as if it were the workstation while the
/// workstation has room (on the home-lab bench each laptop's first request took ~1.5 s where
/// the workstation answered in ~0.3).
#[test]
fn an_untried_node_alike_one_that_answered_is_priced_as_that_one() {
    let mut f = fleet(vec![
        node("workstation", vec![loaded("m", 5.0)]),
        node("laptop-1", vec![loaded("m", 5.0)]),
        node("laptop-2", vec![loaded("m", 5.0)]),
    ]);
    f.nodes[0].seats = 8;
    f.nodes[0].twin_key = Some([64, 8, 0, 0, 0, 0, 0, 0]);
    for n in &mut f.nodes[1..] {
        n.seats = 2;
        n.memory_gb = 8.0;
        n.twin_key = Some([8, 2, 0, 0, 0, 0, 0, 0]);
    }
    let r = req(&["m"], 1_000);
    // The workstation at 100 tokens/s alone, +5 ms per token for each further stream, running
    // 2; laptop-1 at 25 tokens/s.
    let busy = Rates {
        decode_spt_per_stream: Some(0.005),
        ..seen(100.0)
    };
    let loads = TableLoads::default()
        .rated(0, "m", busy)
        .with(0, "m", queue(2, 0))
        .rated(1, "m", seen(25.0));
    let d = at(&r, &f, &loads);
    assert_eq!(d.winner().unwrap().node_id, "workstation");
    let p = predicted(&d, 2);
    assert_near(p.decode_tps, 25.0, &p);
    assert_near(p.prefill_tps, 500.0, &p);
    assert_eq!(p.observed, 0);
    // Another machine (other memory), or one the config says nothing of: priced as a typical
    // node (40 tokens/s), and tried (on the workstation it would also slow the 2 streams
    // there).
    for key in [Some([16, 2, 0, 0, 0, 0, 0, 0]), None] {
        f.nodes[2].twin_key = key;
        let d = at(&r, &f, &loads);
        assert_eq!(d.winner().unwrap().node_id, "laptop-2");
    }
}

/// A node known to be fast on one model is expected at least as fast on a model it has not
/// served yet, so it is tried before unknown nodes, even while another is being probed (on the
/// 32-node bench the fast boxes, busy with the big model, were the last tried for the small).
#[test]
fn a_node_fast_on_another_model_is_tried_first() {
    let f = fleet_of_4_seats(vec![
        node("unknown", vec![loaded("small", 2.0)]),
        node("mid", vec![loaded("small", 2.0)]),
        node("fast", vec![loaded("small", 2.0), loaded("big", 40.0)]),
    ]);
    let r = req(&["small"], 500);
    let loads = TableLoads::default()
        .rated(1, "small", seen(100.0))
        .rated(2, "big", seen(200.0))
        .with(2, "big", queue(1, 0));
    let d = at(&r, &f, &loads);
    assert_eq!(d.winner().unwrap().node_id, "fast", "{:#?}", d.table);
    // At 200 tokens/s alone, beside the big model's stream (the prior contention: 3 %).
    let prediction = predicted(&d, 2);
    assert_near(prediction.decode_tps, 200.0 / 1.03, &prediction);
    // The unknown node being probed does not hold the fast one back.
    let probing = loads.clone().with(0, "small", queue(1, 0));
    assert_eq!(at(&r, &f, &probing).winner().unwrap().node_id, "fast");
    // Without anything seen on the fast node, it is one unknown among others.
    let blind = TableLoads::default()
        .rated(1, "small", seen(100.0))
        .with(2, "big", queue(1, 0));
    let d = at(&r, &f, &blind);
    let prediction = predicted(&d, 2);
    assert_near(prediction.decode_tps, 100.0 / 1.03, &prediction);
}

/// Right after a start nothing has ended anywhere, but a node's running answers already show
/// how fast it streams: a pair it has not served is expected at least that fast, so the
/// workstation streaming at 400 tokens/s takes the next small request, not a laptop priced at
/// the same priors and free of contention (the home-lab bench's first small requests went to
/// laptops at 100 tokens/s).
#[test]
fn a_node_streaming_fast_before_any_response_ends_is_tried_first() {
    let f = fleet_of_4_seats(vec![
        node("laptop", vec![loaded("small", 2.0)]),
        node("ws", vec![loaded("small", 2.0), loaded("big", 40.0)]),
    ]);
    let r = req(&["small"], 500);
    let running = TableLoads::default().with(1, "big", queue(1, 0));
    // Nothing streamed enough to tell: both are priors, and the laptop is free.
    assert_eq!(at(&r, &f, &running).winner().unwrap().node_id, "laptop");
    // The big model's answer has streamed 40 tokens in 0.1 s on the workstation.
    let d = at(&r, &f, &running.streaming(1, "big", 0.1, 40.0, 1));
    assert_eq!(d.winner().unwrap().node_id, "ws", "{:#?}", d.table);
    let prediction = predicted(&d, 1);
    assert_near(prediction.decode_tps, 400.0 / 1.03, &prediction);
}

/// The owner of a conversation's prefix is predicted a second time with the prefix cached;
/// that pass keeps what the node has shown on its other models. It priced an untried model on
/// its owner at priors (the home-lab workstation's first mid request at 11 tokens/s where the
/// node streams 400).
#[test]
fn the_prefix_owner_keeps_what_its_node_has_shown_on_other_models() {
    let f = fleet_of_4_seats(vec![node(
        "ws",
        vec![loaded("small", 2.0), loaded("mid", 9.0)],
    )]);
    let loads = TableLoads::default().rated(0, "small", seen(400.0));
    let r = RouteRequest {
        affinity_key: Some(7),
        cached_prefix_tokens: 100,
        ..req(&["mid"], 500)
    };
    let d = at(&r, &f, &loads);
    let prediction = predicted(&d, 0);
    assert_eq!(prediction.cached_tokens, 100);
    // Its small model's rates, slowed for the 4.5x weights (no node showed two sizes yet).
    assert_near(prediction.decode_tps, 400.0 / 4.5, &prediction);
    assert_near(prediction.prefill_tps, 8_000.0 / 4.5, &prediction);
}

/// A node that answered a 2 GB model at 400 tokens/s and a 40 GB one at 40 shows how its
/// decode slows with a model's weights (10x for 20x: an exponent of ln 10 / ln 20); a 9 GB
/// model it has not served is priced from the fastest it showed, slowed by that much for its
/// size (4.5x the weights), not at the 2 GB model's speed. Where no node has shown two sizes,
/// in proportion to its weights, as the bandwidth priors take it.
#[test]
fn an_untried_model_is_priced_slower_by_its_size_as_the_fleet_showed() {
    let f = fleet_of_4_seats(vec![node(
        "ws",
        vec![
            loaded("small", 2.0),
            loaded("mid", 9.0),
            loaded("big", 40.0),
        ],
    )]);
    let loads = TableLoads::default()
        .rated(0, "small", seen(400.0))
        .rated(0, "big", seen(40.0));
    let d = at(&req(&["mid"], 500), &f, &loads);
    let p = predicted(&d, 0);
    let slower = 4.5f64.powf(10f64.ln() / 20f64.ln());
    assert!((p.decode_tps - 400.0 / slower).abs() < 1e-6, "{p:?}");
    assert!((p.prefill_tps - 8_000.0 / slower).abs() < 1e-6, "{p:?}");

    let one_size = TableLoads::default().rated(0, "small", seen(400.0));
    let p = predicted(&at(&req(&["mid"], 500), &f, &one_size), 0);
    assert_near(p.decode_tps, 400.0 / 4.5, &p);
    assert_near(p.prefill_tps, 8_000.0 / 4.5, &p);
}

/// Sizes unknown (nodes by URL only): an untried 70b would be priced at its node's 14b speed.
/// While no pair of it has answered, a stream of it elsewhere bounds that: its pace there (36
/// tokens/s, alone on its node), at this node's pace against that one.
#[test]
fn an_untried_model_is_priced_no_faster_than_it_streams_elsewhere() {
    let f = fleet_of_4_seats(vec![
        node("a", vec![loaded("mid", 0.0), loaded("big", 0.0)]),
        node("b", vec![loaded("mid", 0.0), loaded("big", 0.0)]),
    ]);
    let rated = TableLoads::default()
        .rated(0, "mid", seen(140.0))
        .rated(1, "mid", seen(140.0));
    let alone = predicted(&at(&req(&["big"], 500), &f, &rated), 0);
    assert_near(alone.decode_tps, 140.0, &alone);
    let streaming = rated
        .clone()
        .with(1, "big", queue(1, 0))
        .streaming(1, "big", 1.0, 36.0, 1);
    let p = predicted(&at(&req(&["big"], 500), &f, &streaming), 0);
    assert_near(p.decode_tps, 36.0, &p);
    // Its prefill slowed alike (140 x 20 tokens/s on mid).
    assert_near(p.prefill_tps, 2_800.0 * 36.0 / 140.0, &p);
    // Node a twice as slow as b on mid: twice as slow at big.
    let slower = streaming.clone().rated(0, "mid", seen(70.0));
    let p = predicted(&at(&req(&["big"], 500), &f, &slower), 0);
    assert_near(p.decode_tps, 18.0, &p);
    // Beside another stream on b, one stream there is that much faster (the contention prior).
    let beside = rated
        .clone()
        .with(1, "big", queue(1, 0))
        .streaming(1, "big", 1.0, 36.0, 2);
    let p = predicted(&at(&req(&["big"], 500), &f, &beside), 0);
    let prior = Policy::default().completion_contention_prior;
    assert_near(p.decode_tps, 36.0 * (1.0 + prior), &p);
    // Its own stream counts: a, streaming at 60, is no slower than it shows (beside that
    // stream, at the contention prior).
    let own = rated
        .with(0, "big", queue(1, 0))
        .streaming(0, "big", 1.0, 60.0, 1);
    let p = predicted(&at(&req(&["big"], 500), &f, &own), 0);
    assert_near(p.decode_tps, 60.0 / (1.0 + prior), &p);
}

/// Sizes unknown, one pair of the 70b answered and another node trying it: an untried pair is
/// held back from being priced as the one that answered (`held_back`), but not at its node's
/// best on the 14b either. What the model showed bounds it: the answered pair's rate at the
/// node's pace against it (here 2x slower on the 14b), and the streams of it elsewhere.
#[test]
fn an_untried_model_held_back_is_priced_no_faster_than_the_model_showed() {
    let f = fleet_of_4_seats(vec![
        node("a", vec![loaded("mid", 0.0), loaded("big", 0.0)]),
        node("b", vec![loaded("mid", 0.0), loaded("big", 0.0)]),
        node("c", vec![loaded("mid", 0.0), loaded("big", 0.0)]),
    ]);
    let rated = TableLoads::default()
        .rated(0, "mid", seen(140.0))
        .rated(1, "mid", seen(280.0))
        .rated(2, "mid", seen(280.0))
        .rated(1, "big", seen(36.0));
    // Nobody tries it: priced as b at its pace.
    let p = predicted(&at(&req(&["big"], 500), &f, &rated), 0);
    assert_near(p.decode_tps, 18.0, &p);
    // c is trying it (a probe out, nothing streamed yet): a is held back, still no faster.
    let probing = rated.clone().with(2, "big", queue(1, 0));
    let p = predicted(&at(&req(&["big"], 500), &f, &probing), 0);
    assert_near(p.decode_tps, 18.0, &p);
    // c streams it at 20 tokens/s, 10 at a's pace: that bounds it too.
    let streaming = probing.streaming(2, "big", 1.0, 20.0, 1);
    let p = predicted(&at(&req(&["big"], 500), &f, &streaming), 0);
    assert_near(p.decode_tps, 10.0, &p);
}

/// A node that so far had only short prompts has no prefill rate of its own (TTFT looked like
/// fixed overhead): it is predicted with its peers' typical rate, not the far lower prior
/// (20 x its decode rate). With the prior, the context bench's 8k-window node was predicted
/// 12x slower at prefill than it is and never got the prompts that would have shown it.
#[test]
fn a_prefill_rate_not_measured_yet_is_the_peers_typical_one() {
    let f = fleet_of_4_seats(vec![
        node("measured", vec![loaded("m", 5.0)]),
        node("short-only", vec![loaded("m", 5.0)]),
    ]);
    let r = req(&["m"], 4_000);
    let short_only = Rates {
        prefill_tps: None,
        prefill_overhead_s: 0.02,
        ..seen(200.0)
    };
    let measured = Rates {
        prefill_tps: Some(50_000.0),
        prefill_overhead_s: 0.02,
        decode_spt_per_stream: Some(0.001),
        ..seen(200.0)
    };
    let loads = TableLoads::default()
        .rated(0, "m", measured)
        .with(0, "m", queue(2, 0))
        .rated(1, "m", short_only);
    let d = at(&r, &f, &loads);
    let prediction = predicted(&d, 1);
    // The measured node's rate.
    assert_near(prediction.prefill_tps, 50_000.0, &prediction);
    assert_eq!(
        d.winner().unwrap().node_id,
        "short-only",
        "idle, and as fast"
    );
    // No peer measured it either: the prior.
    let alone = TableLoads::default().rated(1, "m", short_only);
    let d = at(&r, &f, &alone);
    let prediction = predicted(&d, 1);
    assert_near(prediction.prefill_tps, 20.0 * 200.0, &prediction);
}

/// A node seen at one concurrency only does not look contention-free: it borrows what each
/// further stream costs, relative to one stream, from the nodes seen at several. Else requests
/// pile onto the node whose contention nobody has measured yet.
#[test]
fn contention_not_yet_seen_on_a_node_is_borrowed_from_its_peers() {
    let mut f = fleet(vec![
        node("measured", vec![loaded("m", 5.0)]),
        node("unmeasured", vec![loaded("m", 5.0)]),
    ]);
    for n in &mut f.nodes {
        n.seats = 8;
    }
    let r = req(&["m"], 1_000);
    // Both 100 tokens/s alone; the first seen at several concurrencies (+5 ms per further
    // stream, half a stream's time), the second only alone. The second has 3 streams
    // running, the first 1.
    let loads = TableLoads::default()
        .rated(
            0,
            "m",
            Rates {
                decode_spt_per_stream: Some(0.005),
                ..seen(100.0)
            },
        )
        .with(0, "m", queue(1, 0))
        .rated(1, "m", seen(100.0))
        .with(1, "m", queue(3, 0));
    let d = at(&r, &f, &loads);
    assert_eq!(d.winner().unwrap().node_id, "measured");
    let prediction = predicted(&d, 1);
    // 4 streams there: 10 ms + 3 x 5 ms per token.
    assert_near(prediction.decode_tps, 1.0 / 0.025, &prediction);
    // A measured zero stays zero (a node that batches for free).
    let free = loads.clone().rated(
        1,
        "m",
        Rates {
            decode_spt_per_stream: Some(0.0),
            ..seen(100.0)
        },
    );
    let d = at(&r, &f, &free);
    assert_eq!(d.winner().unwrap().node_id, "unmeasured");
}

/// Completion mode counts what idle loaded models hold as memory a cold load can have (the
/// backend evicts them); spec mode keeps spec 000's fit ratio, and a busy model is never
/// counted.
#[test]
fn a_cold_load_may_evict_idle_models_in_completion_mode_only() {
    let ws = with_memory(
        node(
            "ws",
            vec![loaded("a", 20.0), loaded("b", 20.0), model("big", 22.0)],
        ),
        50.0,
    );
    let f = fleet(vec![ws]);
    let r = req(&["big"], 100);
    let spec = decide(
        &r,
        &f,
        &Policy::default(),
        &TableLoads::default(),
        1_000_000,
    );
    assert!(matches!(
        spec.table[0].verdict,
        Verdict::Eliminated {
            reason: Reason::MemoryFit
        }
    ));
    let d = decide(&r, &f, &completion(), &TableLoads::default(), 1_000_000);
    let w = d.winner().expect("evicting an idle model makes room");
    assert!(w.cold);
    // Both loaded models busy: 10 GB free, nothing to evict.
    let busy = TableLoads::default()
        .with(0, "a", queue(1, 0))
        .with(0, "b", queue(0, 1));
    let d = at(&r, &f, &busy);
    assert!(d.winner().is_none());
    assert!(matches!(
        d.table[0].verdict,
        Verdict::Eliminated {
            reason: Reason::MemoryFit
        }
    ));
}

/// A model not yet loaded will hold more than its weights, as much more as the node's loaded
/// models do (Ollama's `/api/ps` sizes: weights plus context and cache). On a 24 GB GPU with a
/// busy 5 GB model resident at 5.5 GB, a 17 GB model's weights fit (22.5 GB) but the 18.7 GB
/// it will hold do not: completion mode sends it to the 96 GB Mac, listed after, not to the
/// GPU to evict the busy model. Spec mode keeps spec 000's fit by weights.
#[test]
fn a_cold_model_is_fitted_at_the_size_the_nodes_loaded_models_grow_to() {
    let mut busy_model = loaded("qwen", 5.0);
    busy_model.resident_gb = Some(5.5);
    let gpu = with_memory(node("gpu", vec![busy_model, model("gemma", 17.0)]), 24.0);
    let mac = with_memory(node("mac", vec![model("gemma", 17.0)]), 96.0);
    let f = fleet(vec![gpu, mac]);
    let r = req(&["gemma"], 100);
    let busy = TableLoads::default().with(0, "qwen", queue(1, 0));
    let d = at(&r, &f, &busy);
    assert_eq!(d.winner().map(|w| w.node_id.as_str()), Some("mac"));
    assert!(matches!(
        d.table[0].verdict,
        Verdict::Eliminated {
            reason: Reason::MemoryFit
        }
    ));
    let spec = decide(&r, &f, &Policy::default(), &busy, 1_000_000);
    assert!(
        !matches!(spec.table[0].verdict, Verdict::Eliminated { .. }),
        "spec 000 fits by weights"
    );
    // Idle, the resident model is evicted for it: the GPU (listed first, alike otherwise).
    let d = at(&r, &f, &TableLoads::default());
    assert!(d.winner().is_some_and(|w| w.cold && w.node_id == "gpu"));
}

/// The grown size is an estimate: it steers a load to a node where the model fits, but when
/// no node fits it and one fits its weights, the weights decide (as spec 000 would take it),
/// rather than refusing a request the node can serve. Here a small model loaded with a large
/// window holds three times its weights.
#[test]
fn a_grown_size_that_fits_nowhere_refuses_nothing_the_weights_fit() {
    let mut long_window = loaded("tiny", 1.0);
    long_window.resident_gb = Some(3.0);
    let box24 = with_memory(node("box", vec![long_window, model("mid", 10.0)]), 24.0);
    let r = req(&["mid"], 100);
    let alone = fleet(vec![box24.clone()]);
    // Grown, 30 GB in 24: nothing fits; by its weights it does.
    let d = at(&r, &alone, &TableLoads::default());
    assert!(d.winner().is_some_and(|w| w.cold && w.node_id == "box"));
    // Beside a 64 GB node that fits it grown, the grown size steers it there.
    let big = with_memory(node("big", vec![model("mid", 10.0)]), 64.0);
    let both = fleet(vec![box24, big]);
    let d = at(&r, &both, &TableLoads::default());
    assert_eq!(d.winner().map(|w| w.node_id.as_str()), Some("big"));
}

/// Two equal nodes with a free seat each; node 0 has 20,000 prompt tokens sent and not yet
/// answered. Learned to prefill one prompt at a time, node 0 does those first: the request
/// goes to node 1. Learned to prefill each seat on its own, the queue costs nothing there.
#[test]
fn a_node_that_prefills_one_at_a_time_counts_the_prompts_sent_before() {
    let f = alike(&["a", "b"], 4.0);
    let r = req(&["m"], 1_000);
    for shared in [true, false] {
        let rates = Rates {
            prefill_shared: Some(shared),
            ..seen(100.0)
        };
        let mut loads = TableLoads::default()
            .rated(0, "m", rates)
            .rated(1, "m", rates)
            .with(0, "m", queue(1, 0));
        // The first of them could start just now: all 20,000 are ahead.
        loads.prefilling = vec![
            PrefillLoad {
                tokens: 20_000,
                head_ms: 1_000_000,
            },
            PrefillLoad::default(),
        ];
        let d = at(&r, &f, &loads);
        let p = predicted(&d, 0);
        if shared {
            assert_eq!(p.prefill_queue_tokens, 20_000);
            // 20,000 tokens ahead at 2,000 tokens/s, then its own 1,000.
            assert_near(p.wait_s, 10.0, &p);
            assert_near(p.prefill_s, 0.5, &p);
            assert_eq!(d.winner().unwrap().node_id, "b", "{:?}", d.table);
            // Half a second after it could start, 1,000 of them are done.
            loads.prefilling[0].head_ms = 999_500;
            let p = predicted(&at(&r, &f, &loads), 0);
            assert_eq!(p.prefill_queue_tokens, 19_000);
        } else {
            assert_eq!(p.prefill_queue_tokens, 0);
            assert_near(p.wait_s, 0.0, &p);
            assert_near(p.prefill_s, 0.5, &p);
        }
    }
}

/// The prompt queue is the node's: a model that has not learned whether its node prefills one
/// prompt at a time (newly loaded there) takes the verdict of the node's other model, not of
/// its own other nodes (the rag-agents bench: a small model loaded on a GPU found to queue
/// its RAG prompts was priced free of that queue, and waited 5.6 s for its first token).
#[test]
fn a_model_new_on_a_node_takes_the_nodes_verdict_on_its_prompt_queue() {
    let f = fleet_of_4_seats(vec![
        node("gpu", vec![loaded("m", 4.0), loaded("other", 4.0)]),
        node("box", vec![loaded("m", 4.0)]),
    ]);
    let r = req(&["m"], 1_000);
    // Observed there without a verdict yet, or never observed there (priced as the model's
    // typical node, whose verdict is `box`'s: not to queue).
    for (node_queues, own_seen) in [(true, true), (false, true), (true, false)] {
        let decided = Rates {
            prefill_shared: Some(node_queues),
            ..seen(100.0)
        };
        let own = if own_seen {
            seen(100.0)
        } else {
            Rates::default()
        };
        let mut loads = TableLoads::default()
            .rated(0, "m", own)
            .rated(0, "other", decided)
            .rated(
                1,
                "m",
                Rates {
                    prefill_shared: Some(false),
                    ..seen(100.0)
                },
            )
            .with(0, "other", queue(1, 0));
        loads.prefilling = vec![
            PrefillLoad {
                tokens: 20_000,
                head_ms: 1_000_000,
            },
            PrefillLoad::default(),
        ];
        let p = predicted(&at(&r, &f, &loads), 0);
        let want = if node_queues { 20_000 } else { 0 };
        assert_eq!(p.prefill_queue_tokens, want, "{p:?}");
    }
}

/// A rate read off prompts of one length only (overhead taken as rate) is raised to the rate
/// the model's nodes measured: one short prompt's TTFT does not shut a node out of long ones.
#[test]
fn a_prefill_floor_is_raised_to_the_typical_measured_rate() {
    let f = alike(&["a", "b"], 4.0);
    let floor = Rates {
        prefill_tps: Some(16_000.0),
        prefill_floor: true,
        ..seen(100.0)
    };
    let measured = Rates {
        prefill_tps: Some(50_000.0),
        prefill_overhead_s: 0.02,
        ..seen(100.0)
    };
    let loads = TableLoads::default()
        .rated(0, "m", floor)
        .rated(1, "m", measured);
    let d = at(&req(&["m"], 6_000), &f, &loads);
    let p = predicted(&d, 0);
    assert_near(p.prefill_tps, 50_000.0, &p);
    assert_near(p.prefill_s, 0.02 + 0.12, &p);
    // Measured, the node's own rate stands, slow or not.
    let loads = loads.rated(
        0,
        "m",
        Rates {
            prefill_floor: false,
            ..floor
        },
    );
    let p = predicted(&at(&req(&["m"], 6_000), &f, &loads), 0);
    assert_near(p.prefill_tps, 16_000.0, &p);
}

/// The home lab's first seconds: one node observed, a probe out on an untried one. The mean of
/// one observed node is that node, so "typical" would be "as fast as the best" and a second
/// probe would go out at once; instead the other untried node keeps its priors until the
/// probe answers.
#[test]
fn with_one_node_observed_a_probe_out_holds_the_other_untried_nodes_back() {
    let f = alike(&["known", "fresh-a", "fresh-b"], 5.0);
    let r = req(&["m"], 1_000);
    let loads = TableLoads::default()
        .rated(0, "m", seen(100.0))
        .with(0, "m", queue(1, 0));
    // Nothing out: an untried node is predicted with the known node's rates.
    let d = at(&r, &f, &loads);
    let p = predicted(&d, 1);
    assert_near(p.decode_tps, 100.0, &p);
    // fresh-a's probe is out: fresh-b is predicted with its priors (5 GB / 100 GB/s = 20
    // tokens/s, explored at x0.5), and the known node wins.
    let probing = loads.clone().with(1, "m", queue(1, 0));
    let d = at(&r, &f, &probing);
    assert_eq!(d.winner().unwrap().node_id, "known", "{d:?}");
    let p = predicted(&d, 2);
    assert_near(p.decode_tps, 20.0, &p);
}

/// Bursts on a fleet where one node was seen: once that node's seats are all taken, holding
/// the untried nodes at their priors (tens of times too slow on a fast fleet) would queue the
/// whole burst there while they sat idle. With no observed pair left with room, an untried one
/// is a copy of the observed one, and the wait decides.
#[test]
fn when_the_one_node_seen_is_full_an_untried_one_is_priced_as_its_copy() {
    let f = alike(&["known", "fresh-a", "fresh-b"], 5.0);
    let r = req(&["m"], 1_000);
    let known_running = |n| {
        TableLoads::default()
            .rated(0, "m", seen(100.0))
            .with(0, "m", queue(n, 0))
            .with(1, "m", queue(1, 0))
    };
    let d = at(&r, &f, &known_running(4));
    let p = predicted(&d, 2);
    assert_near(p.decode_tps, 100.0, &p);
    assert_eq!(d.winner().unwrap().node_id, "fresh-b", "{d:?}");
    // With a seat free on it again, fresh-b is held back at its priors and the known node wins.
    let d = at(&r, &f, &known_running(3));
    assert_eq!(d.winner().unwrap().node_id, "known", "{d:?}");
    let p = predicted(&d, 2);
    assert_near(p.decode_tps, 20.0, &p);
}

/// A first token is judged late for a seat (`Choice::first_measured`) only where it is due at
/// rates the pair measured: not on a pair never observed (priced as a typical node), nor on
/// one that answered but took its prefill rate from the fleet (a floor raised to the typical).
#[test]
fn only_a_first_token_due_at_measured_rates_is_judged_for_seats() {
    let f = alike(&["known", "fresh", "floor"], 5.0);
    let r = req(&["m"], 1_000);
    let loads = TableLoads::default().rated(0, "m", seen(100.0)).rated(
        2,
        "m",
        Rates {
            prefill_floor: true,
            prefill_tps: Some(500.0),
            ..seen(100.0)
        },
    );
    let d = at(&r, &f, &loads);
    let measured = |id: &str| {
        d.ranked
            .iter()
            .find(|c| c.node_id == id)
            .map(|c| (c.predicted_first_s.is_some(), c.first_measured))
    };
    assert_eq!(measured("known"), Some((true, true)), "{d:?}");
    assert_eq!(measured("fresh"), Some((true, false)), "{d:?}");
    assert_eq!(measured("floor"), Some((true, false)), "{d:?}");
}

/// Two nodes answered the model, the fast one is full: an untried node, priced as a typical
/// node (the mean of the two, faster than the slower one), takes the request. Once its probe is
/// out, on it or on its twin (the same machine by the config), it is held back at its priors
/// while the slower node has a seat: whatever the probe shows of the machine, the next request
/// would share it. With no seat left on an observed node, the wait decides again, and what
/// the twin's answer shows while it streams prices the machine.
#[test]
fn an_untried_node_whose_probe_is_out_is_held_back_while_a_known_one_has_room() {
    let mut f = alike(&["fast", "slower", "fresh", "fresh-twin"], 5.0);
    f.nodes[2].twin_key = Some([7; 8]);
    f.nodes[3].twin_key = Some([7; 8]);
    let r = req(&["m"], 1_000);
    let known = |slower_running| {
        TableLoads::default()
            .rated(0, "m", seen(100.0))
            .with(0, "m", queue(4, 4))
            .rated(1, "m", seen(60.0))
            .with(1, "m", queue(slower_running, 0))
    };
    // Nothing out on it: fresh is a typical node (1 / mean of 10 and 16.7 ms a token).
    let d = at(&r, &f, &known(0));
    assert_eq!(d.winner().unwrap().node_id, "fresh", "{d:?}");
    assert_near(predicted(&d, 2).decode_tps, 75.0, &predicted(&d, 2));
    // Its probe out: held back at its priors; the slower node wins. (Without the rule its idle
    // twin wins at 75 tokens/s.)
    let probed = known(0).with(2, "m", queue(1, 0));
    let d = at(&r, &f, &probed);
    assert_eq!(d.winner().unwrap().node_id, "slower", "{d:?}");
    assert!(predicted(&d, 2).from_priors, "{d:?}");
    // Its twin's probe out: the same (5 GB / 100 GB/s = 20 tokens/s, explored at x0.5), even
    // where the twin's answer streams faster than those priors (60 tokens/s): no faster than
    // the twin is a bound, not a price.
    let twin_probed = known(0).with(3, "m", queue(1, 0));
    for loads in [
        twin_probed.clone(),
        twin_probed.streaming(3, "m", 2.0, 120.0, 1),
    ] {
        let d = at(&r, &f, &loads);
        assert_eq!(d.winner().unwrap().node_id, "slower", "{d:?}");
        assert_near(predicted(&d, 2).decode_tps, 20.0, &predicted(&d, 2));
    }
    // The slower node full too: no observed node has room, and fresh is a typical node again.
    let full = known(4).with(3, "m", queue(1, 0));
    let d = at(&r, &f, &full);
    assert_near(predicted(&d, 2).decode_tps, 75.0, &predicted(&d, 2));
    // Unless its twin's answer, streaming, shows the machine slower: 30 tokens in 2 s, alone
    // on the node. Fresh is priced at its 15 tokens/s, and the known nodes' queues win.
    let d = at(&r, &f, &full.streaming(3, "m", 2.0, 30.0, 1));
    assert_near(predicted(&d, 2).decode_tps, 15.0, &predicted(&d, 2));
    assert!(
        ["fast", "slower"].contains(&d.winner().unwrap().node_id.as_str()),
        "{d:?}"
    );
}

/// A request is ranked by the time the fleet spends on it: its own finish plus what it adds to
/// the streams already decoding beside it. Three streams that would each decode 0.2 s slower
/// while it runs cost more than the 0.47 s it saves itself on the faster node; three that end
/// before its prefill is done cost nothing, and the faster node wins.
#[test]
fn the_slowdown_a_request_imposes_on_running_streams_counts_until_they_end() {
    let f = alike(&["fast-busy", "slower-idle"], 5.0);
    let r = req(&["m"], 1_000);
    let fast = Rates {
        decode_spt_per_stream: Some(0.001),
        ..seen(100.0)
    };
    let loads = TableLoads::default()
        .rated(0, "m", fast)
        .with(0, "m", queue(3, 0))
        .rated(1, "m", seen(70.0));
    let d = at(&r, &f, &loads);
    let p = predicted(&d, 0);
    // Own: 0.5 s prefill + 200 x 0.013 s; imposed: 3 streams x 0.001 / 0.013 x 2.6 s.
    assert_near(p.total_s, 0.5 + 2.6, &p);
    assert_near(p.imposed_s, 0.6, &p);
    assert_eq!(predicted(&d, 1).imposed_s, 0.0);
    let w = d.winner().unwrap();
    assert_eq!(w.node_id, "slower-idle", "{d:?}");
    // The reported finish is the request's own.
    assert_near(w.predicted_s.unwrap(), 1_000.0 / 1_400.0 + 200.0 / 70.0, &p);
    // The three end in 0.1 s, before this one's first token: nothing imposed, and its own
    // decode runs alone (200 x 0.01 s), not at the four streams in flight now.
    let ending = loads.clone().ending(0, "m", &[0.1, 0.1, 0.1]);
    let d = at(&r, &f, &ending);
    let p = predicted(&d, 0);
    assert_near(p.imposed_s, 0.0, &p);
    assert_near(p.decode_s, 2.0, &p);
    assert_eq!(d.winner().unwrap().node_id, "fast-busy", "{d:?}");
    // One ends at 1.8 s, 1.3 s into the decode (2.6 s at four streams): half a stream beside
    // it on average, 200 x 0.0105 s.
    let one = loads.ending(0, "m", &[0.1, 0.1, 1.8]);
    let p = predicted(&at(&r, &f, &one), 0);
    assert_near(p.decode_s, 2.1, &p);
    assert_near(p.imposed_s, 0.001 / 0.0105 * 1.3, &p);
}

/// The context bench's first seconds: two nodes alike, each seen twice at one stream, one of
/// them 2 % faster by the noise of two responses and running three streams. No contention was
/// measured anywhere yet: the prior (`completion_contention_prior`) prices the three streams,
/// and the idle node gets the long prompt.
#[test]
fn before_any_contention_is_measured_an_idle_node_beats_a_busy_one_a_little_faster() {
    let f = alike(&["busy", "idle"], 5.0);
    let r = req(&["m"], 20_000);
    let loads = TableLoads::default()
        .rated(0, "m", seen(102.0))
        .with(0, "m", queue(3, 0))
        .rated(1, "m", seen(100.0));
    let d = at(&r, &f, &loads);
    assert_eq!(d.winner().unwrap().node_id, "idle", "{d:?}");
    let p = predicted(&d, 0);
    assert_near(p.decode_tps, 102.0 / 1.09, &p);
    assert!(p.imposed_s > 0.0, "{p:?}");
    // Measured at zero on the fleet, the contention is zero: the faster node wins.
    let free = Rates {
        decode_spt_per_stream: Some(0.0),
        ..seen(102.0)
    };
    let d = at(&r, &f, &loads.clone().rated(0, "m", free));
    assert_eq!(d.winner().unwrap().node_id, "busy", "{d:?}");
}

/// A model cold on two alike nodes; on node 0 a request started its 20 s load 15 s ago. The
/// next request joins that load (5 s left) rather than start a second one on node 1; with
/// the load's start unknown, both look like a whole load and node 0's running request tips it
/// to node 1.
#[test]
fn a_request_joins_a_load_under_way_rather_than_start_another() {
    let f = fleet_of_4_seats(vec![
        node("a", vec![model("m", 40.0)]),
        node("b", vec![model("m", 40.0)]),
    ]);
    let r = req(&["m"], 100);
    let joined = TableLoads::default().with(0, "m", loading(1, Some(1_000_000 - 15_000)));
    let d = at(&r, &f, &joined);
    let w = d.winner().expect("a winner");
    assert_eq!(w.node_id, "a", "{:?}", d.table);
    assert!(w.cold);
    let p = predicted(&d, 0);
    assert!((p.load_s - 5.0).abs() < 0.5, "{p:?}");
    let unknown = TableLoads::default().with(0, "m", loading(1, None));
    let d = at(&r, &f, &unknown);
    assert_eq!(d.winner().expect("a winner").node_id, "b", "{:?}", d.table);
}

/// A cold model whose two seats are held by requests waiting for its load: the next request
/// waits for a seat (3 s) while the load runs (5 s in all, 1 s of it done), so it pays the
/// 1 s of load left after its wait, not the wait and the whole rest of the load on top.
#[test]
fn a_request_waiting_behind_a_load_pays_the_load_once() {
    let mut n = node("a", vec![model("m", 40.0)]);
    n.seats = 2;
    let f = fleet(vec![n]);
    let r = req(&["m"], 100);
    let rates = Rates {
        load_s: Some(5.0),
        ..seen(100.0)
    };
    let loads = TableLoads::default()
        .with(0, "m", loading(2, Some(1_000_000 - 1_000)))
        .rated(0, "m", rates)
        .ending(0, "m", &[3.0, 3.5]);
    let d = at(&r, &f, &loads);
    let p = predicted(&d, 0);
    assert_near(p.wait_s, 3.0, &p);
    assert_near(p.load_s, 1.0, &p);
}

/// A reload to a larger window starts when the requests running on the loaded one are done:
/// its wait for their seats hides none of it.
#[test]
fn a_reload_for_a_larger_window_is_not_hidden_by_the_seat_wait() {
    let mut n = node("a", vec![loaded("m", 40.0)]);
    n.seats = 2;
    n.models[0].loaded_context = Some(1_024);
    let f = fleet(vec![n]);
    let r = req(&["m"], 4_000);
    let rates = Rates {
        load_s: Some(5.0),
        ..seen(100.0)
    };
    let loads = TableLoads::default()
        .with(0, "m", queue(2, 0))
        .rated(0, "m", rates)
        .ending(0, "m", &[3.0, 3.5]);
    let d = at(&r, &f, &loads);
    let p = predicted(&d, 0);
    assert_near(p.wait_s, 3.0, &p);
    assert_near(p.load_s, 5.0, &p);
}

/// A workstation of two seats serving `a` and `b`, both taken by `b` (ending in 3 and 5 s), at
/// 100 tokens/s; `other`, idle, two seats, `a` at 50: 200 output tokens take 2 s and 4 s.
fn workstation_full_of_b() -> (FleetView, TableLoads) {
    let mut ws = node("workstation", vec![loaded("a", 4.0), loaded("b", 4.0)]);
    ws.seats = 2;
    ws.hard_cap = 8;
    let mut f = fleet(vec![ws, node("other", vec![loaded("a", 4.0)])]);
    f.nodes[1].seats = 2;
    let loads = TableLoads::default()
        .rated(0, "a", seen(100.0))
        .rated(0, "b", seen(100.0))
        .rated(1, "a", seen(50.0))
        .with(0, "b", queue(2, 0))
        .ending(0, "b", &[3.0, 5.0]);
    (f, loads)
}

/// A node whose models share its seats (learned): a request for a model with no request of
/// its own there still waits for the node's running requests of the other model to free a
/// seat, and goes to a slower idle node that finishes it first. Believed to be each model's
/// own (the default), the full node is predicted free, and the request is marked to test that
/// belief with its answer (`SeatTest`).
#[test]
fn a_node_whose_models_share_its_seats_is_full_for_every_model() {
    let (mut f, loads) = workstation_full_of_b();
    let r = req(&["a"], 100);
    let own = at(&r, &f, &loads);
    let p = predicted(&own, 0);
    assert_near(p.wait_s, 0.0, &p);
    assert_near(p.shared_wait_s, 3.0, &p);
    assert_eq!(own.winner().unwrap().node_id, "workstation");
    let test = own.ranked[0]
        .seat_test
        .expect("sent to a full node: a test");
    assert_near(test.shared_wait_s, 3.0, &p);

    f.nodes[0].seats_shared = true;
    let shared = at(&r, &f, &loads);
    let p = predicted(&shared, 0);
    assert_near(p.wait_s, 3.0, &p);
    assert_near(p.node_wait_s, 3.0, &p);
    assert_eq!(shared.winner().unwrap().node_id, "other", "{p:?}");
    // Once a seat of the node is free, no wait either way.
    let one_free = TableLoads::default()
        .rated(0, "a", seen(100.0))
        .rated(0, "b", seen(100.0))
        .rated(1, "a", seen(50.0))
        .with(0, "b", queue(1, 0))
        .ending(0, "b", &[3.0]);
    let d = at(&r, &f, &one_free);
    assert_near(predicted(&d, 0).wait_s, 0.0, &predicted(&d, 0));
    assert_eq!(d.winner().unwrap().node_id, "workstation");
    assert!(d.ranked[0].seat_test.is_none());
}

/// While its answers have not said whether its models share its seats, a full node's wait for
/// a node-wide seat is ranked weighed by how likely that is (`NodeView::seats_shared_p`), not
/// added to the prediction its answer is tested against. The workstation finishes `a` in 2 s
/// with a seat of its own, or in 5 s behind `b`'s first end; the other node in 4 s. At even
/// odds (3.5 s ranked) the workstation is sent it, with a test; at nine in ten (4.7 s), the
/// other node; at 0 or once the seats are known shared, as before.
#[test]
fn a_full_node_whose_seat_sharing_is_unknown_is_ranked_at_the_odds_of_waiting() {
    let (mut f, loads) = workstation_full_of_b();
    let r = req(&["a"], 100);
    let at_odds = |f: &FleetView, p: f64| {
        let mut f = f.clone();
        f.nodes[0].seats_shared_p = p;
        at(&r, &f, &loads)
    };

    let even = at_odds(&f, 0.5);
    let p = predicted(&even, 0);
    assert_near(p.wait_s, 0.0, &p);
    assert_near(p.risk_s, 1.5, &p);
    assert_near(p.rank_s(), p.total_s + p.imposed_s + 1.5, &p);
    assert_eq!(even.winner().unwrap().node_id, "workstation");
    let test = even.ranked[0]
        .seat_test
        .expect("sent to a full node: a test");
    assert_near(test.first_s, p.prefill_s, &p);
    assert_near(test.shared_wait_s, 3.0, &p);

    let likely = at_odds(&f, 0.9);
    assert_near(predicted(&likely, 0).risk_s, 2.7, &predicted(&likely, 0));
    assert_eq!(likely.winner().unwrap().node_id, "other");

    assert_near(predicted(&at_odds(&f, 0.0), 0).risk_s, 0.0, &p);
    f.nodes[0].seats_shared = true;
    let known = at_odds(&f, 1.0);
    let p = predicted(&known, 0);
    assert_near(p.wait_s, 3.0, &p);
    assert_near(p.risk_s, 0.0, &p);
    assert_eq!(known.winner().unwrap().node_id, "other");
    // Nothing of another model runs (three of `a`, on two seats, one of unknown end): nothing
    // of the kind, however the node-wide wait is reckoned.
    let own_only = TableLoads::default()
        .rated(0, "a", seen(100.0))
        .rated(1, "a", seen(50.0))
        .with(0, "a", queue(3, 0))
        .ending(0, "a", &[3.0, 5.0]);
    let mut f = f.clone();
    f.nodes[0].seats_shared = false;
    f.nodes[0].seats_shared_p = 0.5;
    let p = predicted(&at(&r, &f, &own_only), 0);
    assert_near(p.risk_s, 0.0, &p);
}

/// `vllm`, whose seats nobody said (64 assumed, seen to run `seen` at once), at 100 tokens/s
/// with requests running that end `ends` seconds from now; beside it `other`, idle, with
/// `other_seats` seats at 50 tokens/s.
fn assumed_beside(seen_at_once: u32, other_seats: u32, ends: &[f64]) -> (FleetView, TableLoads) {
    let mut vllm = node("vllm", vec![loaded("a", 4.0)]);
    vllm.seats = 64;
    vllm.hard_cap = 256;
    vllm.seats_assumed = true;
    vllm.seats_seen = seen_at_once;
    let mut f = fleet(vec![vllm, node("other", vec![loaded("a", 4.0)])]);
    f.nodes[1].seats = other_seats;
    let running = u32::try_from(ends.len()).unwrap();
    let loads = TableLoads::default()
        .rated(0, "a", seen(100.0))
        .rated(1, "a", seen(50.0))
        .with(0, "a", queue(running, 0))
        .ending(0, "a", ends);
    (f, loads)
}

/// A node whose seats nobody said (a batching server's 64 assumed) that was seen to run two at
/// once: with two running, a request sent to it is predicted to start at once (64 seats) and
/// carries a test of the seats seen, the wait for the first of the two to end. Found to run
/// no more than those two (the view then holds 2 seats, shared by its models), it is full.
#[test]
fn a_node_whose_seats_nobody_said_is_tested_against_the_streams_it_ran_at_once() {
    let (mut f, loads) = assumed_beside(2, 2, &[3.0, 5.0]);
    let r = req(&["a"], 100);
    let d = at(&r, &f, &loads);
    let p = predicted(&d, 0);
    assert_near(p.wait_s, 0.0, &p);
    assert_eq!(d.winner().unwrap().node_id, "vllm");
    let test = d.ranked[0]
        .seat_test
        .expect("past the streams seen: a test");
    assert!(test.bound && test.seats == 2, "{test:?}");
    assert_near(test.shared_wait_s, 3.0, &p);

    // One running: under the streams seen, no test.
    let (_, one) = assumed_beside(2, 2, &[3.0]);
    assert!(at(&r, &f, &one).ranked[0].seat_test.is_none());

    f.nodes[0].seats = 2;
    f.nodes[0].hard_cap = 8;
    f.nodes[0].seats_shared = true;
    let d = at(&r, &f, &loads);
    let p = predicted(&d, 0);
    assert_near(p.wait_s, 3.0, &p);
    assert_eq!(d.winner().unwrap().node_id, "other", "{p:?}");
    assert!(d.ranked.iter().all(|c| c.seat_test.is_none()));
}

/// A node whose seats nobody said, seen to run two at once (priced at four), with three
/// running: under four, a request would start at once there. But only the first of them has
/// its first token, and the next, sent after it, is overdue for its own (`LiveDecode::seated`):
/// the node runs one at once, so the new request waits for all three and goes to the idle
/// node at half the speed. Not so on a node that prefills one prompt at a time, nor with the
/// node's seats found by answers or known: they are taken at their word.
#[test]
fn a_first_token_overdue_on_a_node_whose_seats_nobody_said_prices_it_at_the_seats_held() {
    let (mut f, loads) = assumed_beside(2, 2, &[3.0, 5.0, 6.0]);
    let r = req(&["a"], 100);
    let d = at(&r, &f, &loads);
    assert_near(predicted(&d, 0).wait_s, 0.0, &predicted(&d, 0));
    assert_eq!(d.winner().unwrap().node_id, "vllm");

    let mut late = loads.clone();
    late.live.push((
        0,
        "a".into(),
        LiveDecode {
            seated: Some(1),
            ..LiveDecode::default()
        },
    ));
    let d = at(&r, &f, &late);
    let p = predicted(&d, 0);
    assert!(p.wait_s >= 6.0, "{p:?}");
    assert_eq!(d.winner().unwrap().node_id, "other", "{p:?}");

    // A node seen to prefill one prompt at a time: as late behind the prompts ahead.
    let in_turn = Rates {
        prefill_shared: Some(true),
        ..seen(100.0)
    };
    let d = at(&r, &f, &late.clone().rated(0, "a", in_turn));
    assert_near(predicted(&d, 0).wait_s, 0.0, &predicted(&d, 0));

    // Its seats found by answers (four, shared by its models): priced at them.
    let mut found = f.clone();
    found.nodes[0].seats = 4;
    found.nodes[0].seats_shared = true;
    let d = at(&r, &found, &late);
    assert_near(predicted(&d, 0).wait_s, 0.0, &predicted(&d, 0));

    f.nodes[0].seats_assumed = false;
    f.nodes[0].seats = 4;
    let d = at(&r, &f, &late);
    assert_near(predicted(&d, 0).wait_s, 0.0, &predicted(&d, 0));
    assert_eq!(d.winner().unwrap().node_id, "vllm");
}

/// A Mac known by its URL only (64 seats assumed, four seen at once) serving `a` and `b`, two
/// of each running (`a`'s end in 3 and 5 s), `a` seen to run two at once and `b` three; beside
/// it `other`, idle, at half its speed.
fn mac_beside_other() -> (FleetView, TableLoads) {
    let mut mac = node("mac", vec![loaded("a", 4.0), loaded("b", 4.0)]);
    mac.seats = 64;
    mac.hard_cap = 256;
    mac.seats_assumed = true;
    mac.seats_seen = 4;
    mac.models[0].seats_seen = 2;
    mac.models[1].seats_seen = 3;
    let f = fleet(vec![
        mac,
        node("other", vec![loaded("a", 4.0), loaded("b", 4.0)]),
    ]);
    let loads = TableLoads::default()
        .rated(0, "a", seen(100.0))
        .rated(0, "b", seen(100.0))
        .rated(1, "a", seen(50.0))
        .rated(1, "b", seen(50.0))
        .with(0, "a", queue(2, 0))
        .ending(0, "a", &[3.0, 5.0])
        .with(0, "b", queue(2, 0))
        .ending(0, "b", &[4.0, 6.0]);
    (f, loads)
}

/// On a node whose seats nobody said that serves several models, a request for a model with as
/// many running as it was seen to run at once tests the model's own seats (the wait for its
/// first to end), not the node's; one for a model under its count tests the node's. Found to
/// run no more than two (`seats_learned`), `a` is priced at them: the third waits 3 s and goes
/// to the slower idle node, while `b` is still priced at the node's seats.
#[test]
fn a_model_with_its_own_seats_behind_a_url_is_tested_and_priced_at_them() {
    let (mut f, loads) = mac_beside_other();
    let a = req(&["a"], 100);
    let d = at(&a, &f, &loads);
    let p = predicted(&d, 0);
    assert_near(p.wait_s, 0.0, &p);
    assert_eq!(d.winner().unwrap().node_id, "mac");
    let test = d.ranked[0].seat_test.expect("a's two running: a test");
    assert!(test.own && test.bound && test.seats == 2, "{test:?}");
    assert_near(test.shared_wait_s, 3.0, &p);

    let b = req(&["b"], 100);
    let d = at(&b, &f, &loads);
    let test = d.ranked[0]
        .seat_test
        .expect("the node's four running: a test");
    assert!(!test.own && test.bound && test.seats == 4, "{test:?}");

    f.nodes[0].models[0].seats_learned = Some(2);
    let d = at(&a, &f, &loads);
    let p = predicted(&d, 0);
    assert_near(p.wait_s, 3.0, &p);
    assert_eq!(d.winner().unwrap().node_id, "other", "{p:?}");
    assert!(d.ranked.iter().all(|c| c.seat_test.is_none()));
    let d = at(&b, &f, &loads);
    assert_near(predicted(&d, 0).wait_s, 0.0, &predicted(&d, 0));
    assert_eq!(d.winner().unwrap().node_id, "mac");

    // None of `a` running, two of `b`: `a` starts at once and decodes beside the node's two,
    // its own two seats are not the node's.
    let only_b = TableLoads::default()
        .rated(0, "a", seen(100.0))
        .rated(1, "a", seen(50.0))
        .with(0, "b", queue(2, 0))
        .ending(0, "b", &[4.0, 6.0]);
    let d = at(&a, &f, &only_b);
    let p = predicted(&d, 0);
    assert_near(p.wait_s, 0.0, &p);
    assert_eq!(p.concurrency, 3, "{p:?}");
    assert_eq!(d.winner().unwrap().node_id, "mac");
}

/// Nodes that hide their loads (`backend: openai`): `a` answered `m` just now after waiting
/// 1.2 s for a load its list did not show; `b` never served it.
fn hiding_a_and_b() -> (FleetView, TableLoads) {
    let mut f = alike(&["a", "b"], 0.0);
    for n in &mut f.nodes {
        n.hides_loads = true;
    }
    let a = Rates {
        idle_load_s: Some(1.2),
        ..seen(100.0)
    };
    (f, TableLoads::default().rated(0, "m", a))
}

/// The node that loaded the model keeps its requests (the other is expected to load it too,
/// as the model's first tries showed); idle past the keep-alive, it is expected to load it
/// again. A node whose backend says what is loaded is never charged such a load.
#[test]
fn a_load_a_node_hides_is_expected_where_the_model_may_be_out_of_memory() {
    let r = req(&["m"], 500);
    let (f, loads) = hiding_a_and_b();
    let d = at(&r, &f, &loads);
    assert_eq!(d.winner().unwrap().node_id, "a");
    assert_eq!(predicted(&d, 0).load_s, 0.0, "a answered just now");
    assert_near(predicted(&d, 1).load_s, 1.2, &predicted(&d, 1));
    let idle = d.ranked.iter().find(|c| c.node_id == "b").unwrap().idle;
    assert!(idle.is_some(), "b's answer will tell whether it loaded");
    // Idle past the keep-alive (300 s by default): a's request waits for the load again.
    let later = decide(&r, &f, &completion(), &loads, 1_000_000 + 301_000);
    assert_near(predicted(&later, 0).load_s, 1.2, &predicted(&later, 0));
    assert!(later.ranked.iter().all(|c| c.idle.is_some()));
    // Keep-alive 0: never.
    let never = Policy {
        completion_keep_alive_s: 0,
        ..completion()
    };
    let d = decide(&r, &f, &never, &loads, 1_000_000 + 301_000);
    assert_eq!(predicted(&d, 0).load_s, 0.0);
    // A backend that says what it has loaded (Ollama's /api/ps): what it says.
    let mut told = f.clone();
    for n in &mut told.nodes {
        n.hides_loads = false;
    }
    let d = at(&r, &told, &loads);
    assert_eq!(predicted(&d, 1).load_s, 0.0);
    assert!(d.ranked.iter().all(|c| c.idle.is_none()));
}

/// A request sent while one to the idle pair waits for its first byte joins the load the node
/// hides: charged what is left of it (0.5 s into a 1.2 s load: 0.7 s), marked as joining, with
/// the whole load for its first-byte allowance. Past twice the load known the spell is taken as
/// over (a long prefill, a slow start), not as a load that keeps growing.
#[test]
fn a_request_joining_a_hidden_load_is_charged_what_is_left_of_it() {
    let r = req(&["m"], 500);
    let (f, loads) = hiding_a_and_b();
    let now = 1_000_000 + 301_000;
    let joining = |since_ms: u64| {
        loads.clone().with(
            0,
            "m",
            ModelLoad {
                in_flight: 1,
                hidden_load_since_ms: Some(since_ms),
                ..ModelLoad::default()
            },
        )
    };
    let d = decide(&r, &f, &completion(), &joining(now - 500), now);
    let p = predicted(&d, 0);
    assert_near(p.load_s, 0.7, &p);
    let idle = d.ranked.iter().find(|c| c.node_id == "a").unwrap().idle;
    assert!(
        idle.is_some_and(|i| i.joined && i.load_s == Some(1.2)),
        "{idle:?}"
    );
    let d = decide(&r, &f, &completion(), &joining(now - 2_500), now);
    assert_eq!(predicted(&d, 0).load_s, 0.0, "over");
    let idle = d.ranked.iter().find(|c| c.node_id == "a").unwrap().idle;
    assert!(idle.is_none(), "{idle:?}");
}

/// What an answer to an idle pair shows: a first token late by many prefills is a load; a
/// node slower all round (its decode as much slower as its first token) is slow, not loading;
/// a few hundred milliseconds (a new connection after the spell) are not a load.
#[test]
fn a_late_first_token_is_a_load_a_slow_node_is_not() {
    let e = IdleExpect {
        first_s: 0.1,
        spt: 0.01,
        guessed: false,
        prompt_tokens: 1_000,
        joined: false,
        switch: false,
        stalled_since_ms: None,
        load_s: None,
    };
    let none = (0.0, 0.0);
    // 1.3 s to the first token, then 30 tokens at the predicted speed: 1.2 s of load.
    let load = e.load_seen(Some(1.3), 1.6, Some(30), none).unwrap();
    assert!((load - 1.2).abs() < 1e-9, "{load}");
    // Five times slower at both: no load.
    assert_eq!(e.load_seen(Some(0.5), 0.5 + 1.5, Some(30), none), Some(0.0));
    // On time: none.
    assert_eq!(e.load_seen(Some(0.11), 0.41, Some(30), none), Some(0.0));
    // A short prompt (10 ms predicted) 200 ms late: a new connection, not a load.
    let short = IdleExpect { first_s: 0.01, ..e };
    assert_eq!(short.load_seen(Some(0.21), 0.51, Some(30), none), Some(0.0));
    // A whole reply: its end against prefill and decode (0.4 s predicted).
    let whole = e.load_seen(None, 2.4, Some(30), none).unwrap();
    assert!((whole - 2.0).abs() < 1e-9, "{whole}");
    assert_eq!(e.load_seen(None, 0.6, Some(30), none), Some(0.0));
    // Predicted from priors a hundred times off (no sizes): judged from the answer's own
    // decode and the fleet's prefill-to-decode ratio (80x, 30 ms overhead): 1,000 tokens at
    // 0.01 s per token / 80 + 0.03 = 0.155 s of prefill.
    let guess = IdleExpect {
        first_s: 0.002,
        spt: 1e-4,
        guessed: true,
        ..e
    };
    let load = guess
        .load_seen(Some(1.355), 1.655, Some(30), (80.0, 0.03))
        .unwrap();
    assert!((load - 1.2).abs() < 1e-9, "{load}");
    assert_eq!(
        guess.load_seen(Some(0.16), 0.46, Some(30), (80.0, 0.03)),
        Some(0.0)
    );
    // A whole reply on a guess: nothing to judge by, nothing learned.
    assert_eq!(guess.load_seen(None, 3.0, Some(30), (80.0, 0.03)), None);
}

/// A node whose seats nobody said is sent as many as a batching server's default, but priced
/// at twice the streams it was seen to run at once: six sent to it when it was only seen to
/// run one make the seventh wait (the four past two seats wait inside it for the first to
/// free), and an idle node half as fast wins. Seen to run eight, it is priced at sixteen.
#[test]
fn a_burst_is_not_all_priced_onto_seats_nobody_said() {
    let (mut f, loads) = assumed_beside(1, 4, &[0.5; 6]);
    let r = req(&["a"], 100);
    let d = at(&r, &f, &loads);
    let p = predicted(&d, 0);
    assert!(p.wait_s > 2.0, "{p:?}");
    assert_eq!(d.winner().unwrap().node_id, "other", "{p:?}");
    f.nodes[0].seats_seen = 8;
    let d = at(&r, &f, &loads);
    let p = predicted(&d, 0);
    assert_near(p.wait_s, 0.0, &p);
    assert_eq!(d.winner().unwrap().node_id, "vllm");
}

/// Nobody said how big the model is (`backend: openai` lists no sizes): a node never tried
/// whose probe has not answered yet is predicted from the priors at
/// `completion_prior_model_gb`, not as an instant 0 GB model, so the next request goes to the
/// node seen to be fast rather than piling onto the probe.
#[test]
fn a_model_of_unknown_size_is_not_priced_as_instant() {
    let f = alike(&["a", "b"], 0.0);
    let loads = TableLoads::default()
        .rated(0, "m", seen(100.0))
        .with(1, "m", queue(1, 0));
    let d = at(&req(&["m"], 500), &f, &loads);
    let b = predicted(&d, 1);
    assert!(b.decode_tps < 20.0, "8 GB at 100 GB/s: {b:?}");
    assert_eq!(d.winner().unwrap().node_id, "a", "{b:?}");
}

/// Nodes that hide their loads: `a` serves `m` (seen just now) and may swap it out for `n`;
/// `b` serves `m` alone, at the same speed.
fn a_swaps() -> FleetView {
    let mut f = alike(&["a", "b"], 0.0);
    f.nodes[0].models.push(loaded("n", 0.0));
    for n in &mut f.nodes {
        n.hides_loads = true;
    }
    f
}

/// `a`'s `m` learned to swap in for `switch` seconds; `b`'s `m` alike, seen just now.
fn swap_known(switch: Option<f64>) -> TableLoads {
    TableLoads::default()
        .rated(
            0,
            "m",
            Rates {
                switch_load_s: switch,
                ..seen(100.0)
            },
        )
        .rated(1, "m", seen(100.0))
}

/// A server that swaps models (llama-swap, LM Studio, Ollama on a small GPU): once another
/// model was sent to `a` after `m`'s last request, `m`'s next request there waits for the swap
/// its earlier such requests showed (1.5 s), and goes to `b`; its answer will tell whether it
/// did (a swap spell, learned apart from idle ones). A node where the two stay in memory
/// together learned 0 and is charged nothing; before another model was sent, nothing either.
#[test]
fn a_swap_a_node_hides_is_expected_after_another_model_was_sent_there() {
    let r = req(&["m"], 500);
    let f = a_swaps();
    let swapped = |switch: Option<f64>, displaced: bool| {
        swap_known(switch).with(
            0,
            "m",
            ModelLoad {
                displaced,
                ..ModelLoad::default()
            },
        )
    };
    let d = at(&r, &f, &swapped(Some(1.5), true));
    let p = predicted(&d, 0);
    assert_near(p.load_s, 1.5, &p);
    assert_eq!(d.winner().unwrap().node_id, "b");
    let idle = d.ranked.iter().find(|c| c.node_id == "a").unwrap().idle;
    assert!(
        idle.is_some_and(|i| i.switch && !i.joined && i.load_s == Some(1.5)),
        "{idle:?}"
    );
    // Learned to stay in memory beside the other model: no charge, still told apart.
    let d = at(&r, &f, &swapped(Some(0.0), true));
    assert_eq!(predicted(&d, 0).load_s, 0.0);
    assert!(d
        .ranked
        .iter()
        .any(|c| c.node_id == "a" && c.idle.is_some()));
    // `m` was the last model sent there: no swap.
    let d = at(&r, &f, &swapped(Some(1.5), false));
    assert_eq!(predicted(&d, 0).load_s, 0.0);
    assert!(d.ranked.iter().all(|c| c.idle.is_none()));
    // A node that says what it has loaded is charged what it says.
    let mut told = f.clone();
    told.nodes[0].hides_loads = false;
    let d = at(&r, &told, &swapped(Some(1.5), true));
    assert_eq!(predicted(&d, 0).load_s, 0.0);
}

/// A streamed request to `a` sent 800 ms ago has had no first token though one was due in
/// tens of milliseconds (`LiveDecode::stalled_since_ms`): on a node that hides its loads, the
/// node is taken to be loading the model unseen. With no load known, one sent now waits as
/// long again as the stall has lasted (0.8 s) and goes to `b`; with a 2 s swap known, what is
/// left of it (1.2 s). It is marked to join that load (its send starts the spell at the
/// stalled one's). A node that says its loads is left to what it says.
#[test]
fn a_stalled_first_token_on_a_node_that_hides_its_loads_is_a_load_under_way() {
    let r = req(&["m"], 500);
    let f = a_swaps();
    let now = 1_000_000;
    let stalled = |switch: Option<f64>| {
        let live = LiveDecode {
            stalled_since_ms: Some(now - 800),
            ..LiveDecode::default()
        };
        let mut loads = swap_known(switch)
            .with(0, "m", queue(1, 0))
            .ending(0, "m", &[2.0]);
        loads.live.push((0, "m".to_string(), live));
        loads
    };
    let d = at(&r, &f, &stalled(None));
    let p = predicted(&d, 0);
    assert_near(p.load_s, 0.8, &p);
    assert_eq!(d.winner().unwrap().node_id, "b");
    let idle = d.ranked.iter().find(|c| c.node_id == "a").unwrap().idle;
    assert!(
        idle.is_some_and(|i| i.joined && i.switch && i.stalled_since_ms == Some(now - 800)),
        "{idle:?}"
    );
    let d = at(&r, &f, &stalled(Some(2.0)));
    let p = predicted(&d, 0);
    assert!((p.load_s - 1.2).abs() < 1e-9, "{p:?}");
    let mut told = f.clone();
    told.nodes[0].hides_loads = false;
    let d = at(&r, &told, &stalled(None));
    assert_eq!(predicted(&d, 0).load_s, 0.0);
}

/// A node that lists one model swaps nothing: a first token late there more likely queued
/// behind seats nobody said (a llama.cpp or SGLang server by URL only) and is not taken for a
/// load under way: `b` (one model) stalled as `a` did above is charged no load.
#[test]
fn a_stall_on_a_node_that_lists_one_model_is_not_a_load() {
    let r = req(&["m"], 500);
    let live = LiveDecode {
        stalled_since_ms: Some(1_000_000 - 800),
        ..LiveDecode::default()
    };
    let mut loads = swap_known(None)
        .with(1, "m", queue(1, 0))
        .ending(1, "m", &[2.0]);
    loads.live.push((1, "m".to_string(), live));
    let d = at(&r, &a_swaps(), &loads);
    let p = predicted(&d, 1);
    assert_eq!(p.load_s, 0.0, "{p:?}");
    let b = d.ranked.iter().find(|c| c.node_id == "b").unwrap();
    assert!(b.idle.is_none(), "{:?}", b.idle);
}

/// A node three to six times slower than the fleet on the model it served is expected as much
/// slower on one it never served: the laptop's untried `mid` is priced at the model's typical
/// rates over its pace on `small` (against the GPU and the workstation, geometric means; its own
/// rate on `small` is no floor: a bigger model runs slower), not as a typical node of `mid` (150 tokens/s, 4,000
/// prompt tokens/s); an answer it is streaming shows its decode pace before it ends. Before it
/// served anything, or with nobody else on `small`, the typical node.
#[test]
fn an_untried_pair_is_priced_at_its_nodes_pace_against_the_fleet() {
    let f = fleet_of_4_seats(vec![
        node("laptop", vec![loaded("small", 2.0), loaded("mid", 9.0)]),
        node("gpu", vec![loaded("small", 2.0), loaded("mid", 9.0)]),
        node("ws", vec![loaded("small", 2.0), loaded("mid", 9.0)]),
    ]);
    let fleet = TableLoads::default()
        .rated(1, "small", seen(300.0))
        .rated(2, "small", seen(100.0))
        .rated(1, "mid", seen(300.0))
        .rated(2, "mid", seen(100.0));
    let r = req(&["mid"], 2_000);
    let typical = predicted(&at(&r, &f, &fleet), 0);
    assert!((typical.decode_tps - 150.0).abs() < 1e-6, "{typical:?}");
    assert!((typical.prefill_tps - 4_000.0).abs() < 1e-6, "{typical:?}");

    let slow = fleet.clone().rated(0, "small", seen(30.0));
    let p = predicted(&at(&r, &f, &slow), 0);
    // Its pace: sqrt(300 x 100) / 30 = 5.77 times slower, at both (its 30 tokens/s on `small`
    // is no floor for `mid`).
    let pace = (300.0f64 * 100.0).sqrt() / 30.0;
    assert!((p.decode_tps - 150.0 / pace).abs() < 1e-6, "{p:?}");
    assert!((p.prefill_tps - 4_000.0 / pace).abs() < 1e-6, "{p:?}");
    assert_eq!(at(&r, &f, &slow).winner().unwrap().node_id, "gpu");

    // Not answered yet, but streaming `small` at 30 tokens/s: the same decode pace (its
    // prefill, not seen, is the typical node's).
    let streaming = fleet
        .clone()
        .with(0, "small", queue(1, 0))
        .streaming(0, "small", 1.0, 30.0, 1);
    let p = predicted(&at(&r, &f, &streaming), 0);
    // (beside that stream: a little slower still)
    assert!((20.0..=150.0 / pace).contains(&p.decode_tps), "{p:?}");
    assert!((p.prefill_tps - 4_000.0).abs() < 1e-6, "{p:?}");

    // Alone on `small`: nothing to hold it against.
    let alone = TableLoads::default()
        .rated(0, "small", seen(30.0))
        .rated(1, "mid", seen(300.0))
        .rated(2, "mid", seen(100.0));
    let p = predicted(&at(&r, &f, &alone), 0);
    assert!((p.prefill_tps - 4_000.0).abs() < 1e-6, "{p:?}");
}

/// An untried pair is priced at the typical rates of its model times its node's pace against
/// the nodes those rates are from (`decide::pace_for`), not against the whole fleet; and a
/// typical rate read off one prompt length only (a floor, `Rates::prefill_floor`) scaled so is
/// the node's estimate, not a floor of its own to raise back to the typical rate, which undid
/// the pace: by URL only on `rag-agents`, the Mac, which reads 1,200 prompt tokens/s of `llama`
/// where the GPU reads 25,000, was priced for its untried `qwen` at the GPU's 22,000 and sent
/// 12,000-token prompts (10.7 s to the first token).
#[test]
fn an_untried_pair_is_paced_against_the_nodes_its_typical_rates_are_from() {
    let f = fleet_of_4_seats(vec![
        node("mini", vec![loaded("llama", 2.0)]),
        node(
            "mac",
            vec![
                loaded("qwen", 5.0),
                loaded("llama", 2.0),
                loaded("gemma", 17.0),
            ],
        ),
        node(
            "gpu",
            vec![
                loaded("qwen", 5.0),
                loaded("gemma", 17.0),
                loaded("llama", 2.0),
            ],
        ),
    ]);
    let rated = |tps: f64, spt: f64, floor: bool| Rates {
        prefill_tps: Some(tps),
        prefill_floor: floor,
        decode_spt: Some(spt),
        ..seen(100.0)
    };
    let fleet = TableLoads::default()
        .rated(0, "llama", rated(1_500.0, 0.02, false))
        .rated(1, "llama", rated(1_200.0, 0.0053, false))
        .rated(2, "llama", rated(25_000.0, 0.0086, false))
        .rated(2, "qwen", rated(22_000.0, 0.0095, true));
    let d = at(&req(&["qwen"], 3_162), &f, &fleet);
    let mac = predicted(&d, 1);
    // 22,000 over the Mac's pace on `llama` against the GPU, whose rates the typical ones
    // are (25,000 / 1,200), not against the fleet (the mini, as slow as the Mac, would make
    // it 5x slower only: 4,300 prompt tokens/s).
    assert_near(mac.prefill_tps, 22_000.0 * 1_200.0 / 25_000.0, &mac);
    assert_eq!(d.winner().unwrap().node_id, "gpu");
    // Answered once without a prefill rate learned (one prompt length, too short to read
    // one off), it is priced so still.
    let once = fleet.rated(
        1,
        "qwen",
        Rates {
            prefill_tps: None,
            ..rated(1.0, 0.004, false)
        },
    );
    let mac = predicted(&at(&req(&["qwen"], 3_162), &f, &once), 1);
    assert_near(mac.prefill_tps, 22_000.0 * 1_200.0 / 25_000.0, &mac);
}
