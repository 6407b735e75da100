//! `decide` end to end: fallback chain, no-route causes, pin, provisional cap, explain table.

use super::testkit::*;
use super::*;

fn req(models: &[&str]) -> RouteRequest {
    RouteRequest {
        models: models.iter().map(|m| m.to_string()).collect(),
        ..Default::default()
    }
}

fn reason(d: &Decision, row: usize) -> Option<Reason> {
    match d.table[row].verdict {
        Verdict::Eliminated { reason } => Some(reason),
        Verdict::Scored { .. } | Verdict::Predicted { .. } => None,
    }
}

#[test]
fn loaded_fallback_beats_cold_primary() {
    let f = fleet(vec![
        node("a", vec![model("primary", 8.0)]),
        node("b", vec![loaded("fallback", 8.0)]),
    ]);
    let d = decide(
        &req(&["primary", "fallback"]),
        &f,
        &Policy::default(),
        &TableLoads::default(),
        0,
    );
    let w = d.winner().expect("winner");
    assert_eq!((w.node_id.as_str(), w.model.as_str()), ("b", "fallback"));
    assert!(w.fallback && !w.cold);
    // The cold primary is the runner-up for retries.
    assert_eq!(
        (d.ranked[1].node_id.as_str(), d.ranked[1].model.as_str()),
        ("a", "primary")
    );
    assert!(d.ranked[1].cold && !d.ranked[1].fallback);
}

#[test]
fn first_loaded_model_in_list_order_wins_on_its_best_node() {
    let f = fleet(vec![
        node("a", vec![loaded("m2", 8.0), loaded("m3", 8.0)]),
        node("b", vec![loaded("m2", 8.0)]),
        node("c", vec![model("m1", 8.0)]),
    ]);
    let loads = TableLoads::default().with(0, "m2", queue(3, 0));
    let d = decide(&req(&["m1", "m2", "m3"]), &f, &Policy::default(), &loads, 0);
    let order: Vec<(&str, &str)> = d
        .ranked
        .iter()
        .map(|c| (c.node_id.as_str(), c.model.as_str()))
        .collect();
    // m2 (first loaded) on its best node b, then m2 on a, then m3 (loaded), then cold m1.
    assert_eq!(order, [("b", "m2"), ("a", "m2"), ("a", "m3"), ("c", "m1")]);
}

#[test]
fn nothing_loaded_first_loadable_model_wins() {
    let mut small = node("small", vec![model("m1", 40.0), model("m2", 8.0)]);
    small.free_memory_gb = Some(16.0); // m1 does not fit
    let f = fleet(vec![small, node("big", vec![model("m2", 8.0)])]);
    let d = decide(
        &req(&["m1", "m2"]),
        &f,
        &Policy::default(),
        &TableLoads::default(),
        0,
    );
    assert_eq!(reason(&d, 0), Some(Reason::MemoryFit));
    assert_eq!(reason(&d, 2), Some(Reason::ModelAbsent));
    let w = d.winner().expect("winner");
    assert_eq!(w.model, "m2");
    assert!(w.cold && w.fallback);
}

#[test]
fn cold_idle_node_can_beat_a_saturated_loaded_one_for_the_same_model() {
    let f = fleet(vec![
        node("hot", vec![loaded("m", 8.0)]),
        node("cold", vec![model("m", 8.0)]),
    ]);
    let busy = ModelLoad {
        p75_ms: Some(120_000.0),
        ..queue(1, 5)
    };
    let loads = TableLoads::default().with(0, "m", busy);
    let d = decide(&req(&["m"]), &f, &Policy::default(), &loads, 0);
    // hot: 50 + 20 - 30 - 25 + ... ; cold: 10 + 20 + ...: the queue wins over warmth.
    assert_eq!(d.ranked[0].node_id, "cold");
    assert!(d.ranked[0].cold);
}

#[test]
fn no_route_causes() {
    let p = Policy::default();
    let none = TableLoads::default();
    let f = fleet(vec![node("a", vec![model("m", 8.0)])]);
    let d = decide(&req(&["nope"]), &f, &p, &none, 0);
    assert_eq!(d.no_route, Some(NoRoute::ModelNotFound));
    assert!(d.ranked.is_empty());

    let long = RouteRequest {
        prompt_tokens: 40_000,
        ..req(&["m"])
    };
    let d = decide(&long, &f, &p, &none, 0);
    assert_eq!(d.no_route, Some(NoRoute::ContextTooLong));
    assert_eq!(reason(&d, 0), Some(Reason::Context));

    let mut off = f.clone();
    off.nodes[0].health = Health::Offline;
    assert_eq!(
        decide(&req(&["m"]), &off, &p, &none, 0).no_route,
        Some(NoRoute::NoProvider)
    );
    // Offline nodes whose window would not fit either: still a client error.
    assert_eq!(
        decide(&long, &off, &p, &none, 0).no_route,
        Some(NoRoute::ContextTooLong)
    );

    let pinned = RouteRequest {
        pin: Some("a".into()),
        ..req(&["m"])
    };
    assert_eq!(
        decide(&pinned, &off, &p, &none, 0).no_route,
        Some(NoRoute::PinUnavailable)
    );
    let ghost = RouteRequest {
        pin: Some("ghost".into()),
        ..req(&["m"])
    };
    let d = decide(&ghost, &f, &p, &none, 0);
    assert_eq!(d.no_route, Some(NoRoute::PinUnavailable));
    assert_eq!(reason(&d, 0), Some(Reason::PinnedElsewhere));
}

#[test]
fn pin_is_strict_and_trumps_sticky() {
    let f = fleet(vec![
        node("a", vec![loaded("m", 8.0)]),
        node("b", vec![model("m", 8.0)]),
    ]);
    let sticky = RouteRequest {
        pin: Some("b".into()),
        affinity_key: Some(7),
        ..req(&["m"])
    };
    let d = decide(&sticky, &f, &Policy::default(), &TableLoads::default(), 0);
    assert_eq!(d.ranked.len(), 1);
    assert_eq!(d.ranked[0].node_id, "b");
    assert_eq!(d.affinity, AffinityKind::None);
    assert_eq!(reason(&d, 0), Some(Reason::PinnedElsewhere));
}

#[test]
fn affinity_new_when_the_rendezvous_node_is_out() {
    let f = fleet(vec![
        node("a", vec![loaded("m", 8.0)]),
        node("b", vec![loaded("m", 8.0)]),
    ]);
    let key = 42;
    let owner = if rendezvous_weight(key, "a") > rendezvous_weight(key, "b") {
        0
    } else {
        1
    };
    let mut r = RouteRequest {
        affinity_key: Some(key),
        ..req(&["m"])
    };
    let d = decide(&r, &f, &Policy::default(), &TableLoads::default(), 0);
    assert_eq!(
        (d.affinity, d.ranked[0].node),
        (AffinityKind::Matched, owner)
    );
    r.tried = vec![f.nodes[owner].id.clone()];
    let d = decide(&r, &f, &Policy::default(), &TableLoads::default(), 0);
    assert_eq!(
        (d.affinity, d.ranked[0].node),
        (AffinityKind::New, 1 - owner)
    );
    assert_eq!(reason(&d, owner), Some(Reason::Tried));
}

#[test]
fn require_warm_and_hard_cap() {
    let mut capped = node("capped", vec![loaded("m", 8.0)]);
    capped.hard_cap = 2;
    let f = fleet(vec![capped, node("cold", vec![model("m", 8.0)])]);
    let warm = RouteRequest {
        require_warm: true,
        ..req(&["m"])
    };
    let loads = TableLoads::default().with(0, "m", queue(2, 0));
    let d = decide(&warm, &f, &Policy::default(), &loads, 0);
    assert_eq!(reason(&d, 0), Some(Reason::HardCap));
    assert_eq!(reason(&d, 1), Some(Reason::NotWarm));
    assert_eq!(d.no_route, Some(NoRoute::NoProvider));
}

#[test]
fn provisional_pool_cap() {
    let prov = |id: &str| NodeView {
        tier: Tier::Provisional,
        ..node(id, vec![loaded("m", 8.0)])
    };
    let f = fleet(vec![
        node("pin", vec![loaded("m", 8.0)]),
        prov("p1"),
        prov("p2"),
    ]);
    let p = Policy {
        provisional_pool_cap: Some(1),
        ..Policy::default()
    };
    // p1 in use: the pool is full, the idle p2 is out while the pinned node has a seat.
    let loads = TableLoads::default().with(1, "m", queue(1, 0));
    let d = decide(&req(&["m"]), &f, &p, &loads, 0);
    assert_eq!(reason(&d, 1), None);
    assert_eq!(reason(&d, 2), Some(Reason::ProvisionalCap));
    assert_eq!(d.ranked.len(), 2);
    // The pinned node full: provisional nodes absorb the load again.
    let loads = loads.with(0, "m", queue(1, 0));
    let d = decide(&req(&["m"]), &f, &p, &loads, 0);
    assert_eq!(reason(&d, 2), None);
    // No cap configured: nothing is removed.
    let loads = TableLoads::default().with(1, "m", queue(1, 0));
    let d = decide(&req(&["m"]), &f, &Policy::default(), &loads, 0);
    assert_eq!(reason(&d, 2), None);
}

#[test]
fn explain_table_names_every_pair() {
    let mut off = node("b", vec![loaded("m", 8.0)]);
    off.health = Health::Draining;
    let f = fleet(vec![node("a", vec![loaded("m", 8.0)]), off]);
    let r = req(&["m", "x"]);
    let d = decide(&r, &f, &Policy::default(), &TableLoads::default(), 0);
    let rows = d.explain(&r, &f);
    let names: Vec<(&str, &str)> = rows.iter().map(|e| (e.node, e.model)).collect();
    assert_eq!(names, [("a", "m"), ("a", "x"), ("b", "m"), ("b", "x")]);
    let json = serde_json::to_value(&rows).expect("serialisable");
    assert_eq!(json[1]["verdict"], "eliminated");
    assert_eq!(json[1]["reason"], "model_absent");
    assert_eq!(json[2]["reason"], "draining");
    assert_eq!(json[0]["verdict"], "scored");
    assert_eq!(json[0]["signals"]["warmth"], 50.0);
}

#[test]
fn ranked_is_capped_by_policy() {
    let nodes = (0..40)
        .map(|i| node(&format!("n{i}"), vec![loaded("m", 8.0)]))
        .collect();
    let f = fleet(nodes);
    let mut loads = TableLoads::default();
    for i in 0..40 {
        loads = loads.with(i, "m", queue((i % 5) as u32, 0));
    }
    let all = Policy {
        max_ranked: 0,
        ..Policy::default()
    };
    let full = decide(&req(&["m"]), &f, &all, &loads, 0);
    let capped = decide(&req(&["m"]), &f, &Policy::default(), &loads, 0);
    assert_eq!(full.ranked.len(), 40);
    assert_eq!(capped.ranked.len(), 16);
    for (a, b) in full.ranked.iter().zip(&capped.ranked) {
        assert_eq!((a.node, a.score), (b.node, b.score));
    }
}

#[test]
fn translated_node_is_a_candidate_and_a_native_one_wins_the_tie() {
    let openai_only = |id: &str| NodeView {
        families: vec![Family::OpenAI],
        ..node(id, vec![loaded("m", 8.0)])
    };
    // Node "a" (index 0) would win a plain tie on index; it needs translation, "b" does not.
    let f = fleet(vec![openai_only("a"), node("b", vec![loaded("m", 8.0)])]);
    let ollama = RouteRequest {
        family: Some(Family::Ollama),
        translatable: vec![Family::OpenAI],
        ..req(&["m"])
    };
    let d = decide(&ollama, &f, &Policy::default(), &TableLoads::default(), 0);
    assert_eq!(d.ranked[0].score, d.ranked[1].score, "same score");
    let order: Vec<&str> = d.ranked.iter().map(|c| c.node_id.as_str()).collect();
    assert_eq!(
        order,
        ["b", "a"],
        "native first, the translated node is the runner-up"
    );
    // Alone, the translated node serves.
    let f = fleet(vec![openai_only("a")]);
    let d = decide(&ollama, &f, &Policy::default(), &TableLoads::default(), 0);
    assert_eq!(d.winner().map(|w| w.node_id.as_str()), Some("a"));
    // Without a translation path, Stage 1 says `protocol`.
    let anthropic = RouteRequest {
        family: Some(Family::Anthropic),
        translatable: vec![],
        ..req(&["m"])
    };
    let d = decide(
        &anthropic,
        &f,
        &Policy::default(),
        &TableLoads::default(),
        0,
    );
    assert_eq!(reason(&d, 0), Some(Reason::Protocol));
    // A busier native node still loses to an idle translated one: the tie-break is only a tie-break.
    let f = fleet(vec![openai_only("a"), node("b", vec![loaded("m", 8.0)])]);
    let loads = TableLoads::default().with(1, "m", queue(1, 2));
    let d = decide(&ollama, &f, &Policy::default(), &loads, 0);
    assert_eq!(d.winner().map(|w| w.node_id.as_str()), Some("a"));
}

/// The baseline modes over the same survivors: `least-busy` takes the node with the fewest
/// requests running on it and waiting for the pair; `round-robin` gives each request the next
/// survivor in turn. Both skip what Stage 1 eliminated, as every mode does.
#[test]
fn least_busy_and_round_robin_take_turns_among_the_survivors() {
    let mut capped = node("capped", vec![loaded("m", 8.0)]);
    capped.hard_cap = 1;
    let f = fleet(vec![
        node("a", vec![loaded("m", 8.0)]),
        capped,
        node("b", vec![loaded("m", 8.0)]),
        node("c", vec![loaded("m", 8.0)]),
    ]);
    let loads = TableLoads::default()
        .with(0, "m", queue(2, 0))
        .with(1, "m", queue(1, 0))
        .with(2, "m", queue(0, 0))
        .with(3, "m", queue(0, 1));
    let pick = |mode: Mode, seq: u64| {
        let policy = Policy {
            mode,
            ..Policy::default()
        };
        let d = decide(&RouteRequest { seq, ..req(&["m"]) }, &f, &policy, &loads, 0);
        assert_eq!(reason(&d, 1), Some(Reason::HardCap), "{d:?}");
        d.winner().expect("winner").node_id.clone()
    };
    // b: nothing running or waiting; c has one waiting, a two running.
    for seq in 0..3 {
        assert_eq!(pick(Mode::LeastBusy, seq), "b");
    }
    let turns: Vec<String> = (0..6).map(|seq| pick(Mode::RoundRobin, seq)).collect();
    assert_eq!(turns, ["a", "b", "c", "a", "b", "c"]);
    // Equally busy, least-busy takes turns too.
    let idle = TableLoads::default().with(1, "m", queue(1, 0));
    let policy = Policy {
        mode: Mode::LeastBusy,
        ..Policy::default()
    };
    let turns: Vec<String> = (0..3)
        .map(|seq| {
            let r = RouteRequest { seq, ..req(&["m"]) };
            decide(&r, &f, &policy, &idle, 0)
                .winner()
                .unwrap()
                .node_id
                .clone()
        })
        .collect();
    assert_eq!(turns, ["a", "b", "c"]);
}
