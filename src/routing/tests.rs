//! Table-driven tests: every worked number of spec 000, then `decide` end to end.

use super::signals::{self, context_fit, memory_fit, queue_depth, role_affinity, session_affinity};
use super::testkit::*;
use super::*;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

#[test]
fn signal1_warmth() {
    let p = Policy::default();
    let now = 10 * 3_600_000;
    let m = model("m", 4.0);
    let cases = [
        (loaded("m", 4.0), 50.0),
        (
            ModelView {
                unloaded_at_ms: Some(now - 20 * 60_000),
                ..m.clone()
            },
            30.0,
        ),
        (
            ModelView {
                unloaded_at_ms: Some(now - 30 * 60_000),
                ..m.clone()
            },
            30.0,
        ),
        (
            ModelView {
                unloaded_at_ms: Some(now - 31 * 60_000),
                ..m.clone()
            },
            10.0,
        ),
        (m.clone(), 10.0),
        (
            ModelView {
                on_disk: false,
                ..m.clone()
            },
            0.0,
        ),
    ];
    for (i, (mv, want)) in cases.iter().enumerate() {
        assert_eq!(signals::warmth(&p, mv, now), *want, "case {i}");
    }
}

#[test]
fn signal2_memory_fit_bands() {
    let p = Policy::default();
    let cases = [
        (f64::INFINITY, 20.0), // already loaded
        (2.5, 20.0),
        (2.0, 15.0),
        (1.6, 15.0),
        (1.5, 15.0),
        (1.3, 8.0),
        (1.2, 8.0),
        (1.1, 3.0),
        (1.0, 3.0),
    ];
    for (ratio, want) in cases {
        assert_eq!(memory_fit(&p, ratio), want, "ratio {ratio}");
    }
}

#[test]
fn signal2_learned_ceiling_and_elimination() {
    // A 128 GB laptop in learned-low mode has a 16 GB ceiling: a 20 GB model does not fit.
    let mut n = node("laptop", vec![model("big", 20.0)]);
    n.memory_gb = 128.0;
    n.free_memory_gb = Some(100.0);
    n.learning = Some(Learning {
        availability: 0.9,
        ceiling_gb: Some(16.0),
        cpu_high_for_s: 0,
        days_observed: 30.0,
    });
    let req = RouteRequest {
        models: vec!["big".into()],
        ..Default::default()
    };
    let d = decide(
        &req,
        &fleet(vec![n]),
        &Policy::default(),
        &TableLoads::default(),
        0,
    );
    assert!(matches!(
        d.table[0].verdict,
        Verdict::Eliminated {
            reason: Reason::MemoryFit
        }
    ));
    assert_eq!(d.no_route, Some(NoRoute::NoProvider));
}

#[test]
fn signal3_queue_depth() {
    let p = Policy::default();
    let cases = [
        (0.0, 0.0),
        (1.0, -6.0),
        (2.0, -12.0),
        (4.0, -24.0),
        (5.0, -30.0),
        (9.0, -30.0),
    ];
    for (depth, want) in cases {
        assert_eq!(queue_depth(&p, depth), want, "depth {depth}");
    }
}

#[test]
fn signal3_depth_is_normalised_by_seats() {
    // 4 requests on a 2-seat node count as depth 2; on a 16-seat node as 0.25 (spec 003).
    let mut wide = node("wide", vec![loaded("m", 4.0)]);
    wide.seats = 16;
    let mut narrow = node("narrow", vec![loaded("m", 4.0)]);
    narrow.seats = 2;
    let loads = TableLoads::default()
        .with(0, "m", queue(4, 0))
        .with(1, "m", queue(2, 2));
    let req = RouteRequest {
        models: vec!["m".into()],
        ..Default::default()
    };
    let d = decide(
        &req,
        &fleet(vec![wide, narrow]),
        &Policy::default(),
        &loads,
        0,
    );
    let (w, _) = signals_of(&d.table[0]).expect("scored");
    let (n, _) = signals_of(&d.table[1]).expect("scored");
    assert_eq!(w.queue_depth, -1.5);
    assert_eq!(n.queue_depth, -12.0);
    assert_eq!(d.ranked[0].node_id, "wide");
}

#[test]
fn signal4_wait_time() {
    let p = Policy::default();
    // depth x p75 seconds / 10, capped at 25.
    let cases = [
        (0.0, 30.0, 0.0),
        (3.0, 20.0, -6.0),
        (1.0, 100.0, -10.0),
        (5.0, 100.0, -25.0),
    ];
    for (depth, p75_s, want) in cases {
        assert!(
            close(signals::wait_time(&p, depth, p75_s), want, 1e-9),
            "{depth} x {p75_s}"
        );
    }
}

#[test]
fn signal4_uses_p75_else_tps_else_bandwidth_heuristic() {
    let p = Policy::default();
    let req = RouteRequest::default();
    let n = node("n", vec![]);
    let m = model("m", 40.0);
    let pair = |load| signals::Pair {
        req: &req,
        node: &n,
        model: &m,
        load,
        node_in_flight: 0,
        fit_ratio: 2.0,
        needed_tokens: 1,
        now_ms: 0,
    };
    let with_p75 = ModelLoad {
        p75_ms: Some(12_000.0),
        ..queue(1, 0)
    };
    assert_eq!(signals::per_request_s(&p, &pair(with_p75)), 12.0);
    let with_tps = ModelLoad {
        observed_tps: Some(32.0),
        ..queue(1, 0)
    };
    assert_eq!(signals::per_request_s(&p, &pair(with_tps)), 8.0); // 256 tokens / 32 tok/s
                                                                  // 40 GB / 400 GB/s = 0.1 s per token x 256 tokens.
    assert!(close(
        signals::per_request_s(&p, &pair(queue(1, 0))),
        25.6,
        1e-9
    ));
}

#[test]
fn signal5_role_affinity_bandwidth() {
    let p = Policy::default();
    let with_bw = |bw: f64| NodeView {
        bandwidth_gbps: Some(bw),
        ..node("n", vec![])
    };
    // Large model: the full bandwidth bonus, 100/400/800 GB/s -> ~7.5 / ~15 / 25.
    for (bw, want) in [(100.0, 7.5), (400.0, 15.0), (800.0, 25.0), (1600.0, 25.0)] {
        assert!(
            close(role_affinity(&p, &with_bw(bw), 40.0), want, 1e-9),
            "{bw}"
        );
    }
    // Small model: 18 - 0.6 x bonus, at least 3 (slower nodes win).
    for (bw, want) in [(100.0, 13.5), (400.0, 9.0), (800.0, 3.0)] {
        assert!(
            close(role_affinity(&p, &with_bw(bw), 4.0), want, 1e-9),
            "{bw}"
        );
    }
    // In between: 0.6 x bonus.
    for (bw, want) in [(100.0, 4.5), (400.0, 9.0), (800.0, 15.0)] {
        assert!(
            close(role_affinity(&p, &with_bw(bw), 14.0), want, 1e-9),
            "{bw}"
        );
    }
}

#[test]
fn signal5_role_affinity_memory_tiers() {
    let p = Policy::default();
    let with_mem = |gb: f64| NodeView {
        bandwidth_gbps: None,
        memory_gb: gb,
        ..node("n", vec![])
    };
    let cases = [
        // (node GB, model GB, points)
        (192.0, 40.0, 15.0),
        (128.0, 40.0, 15.0),
        (64.0, 40.0, 5.0),
        (32.0, 40.0, 5.0),
        (16.0, 40.0, 0.0),
        (16.0, 4.0, 15.0),
        (32.0, 4.0, 15.0),
        (64.0, 4.0, 8.0),
        (128.0, 4.0, 8.0),
        (192.0, 4.0, 3.0),
        (64.0, 14.0, 0.0),
    ];
    for (mem, size, want) in cases {
        assert_eq!(
            role_affinity(&p, &with_mem(mem), size),
            want,
            "{mem} GB node, {size} GB model"
        );
    }
}

#[test]
fn signal6_availability_only_for_learning_nodes() {
    let p = Policy::default();
    let plain = node("n", vec![]);
    assert_eq!(signals::availability(&p, &plain), 0.0);
    let learning = NodeView {
        learning: Some(Learning {
            availability: 0.73,
            days_observed: 9.0,
            ..Learning::default()
        }),
        ..plain
    };
    assert!(close(signals::availability(&p, &learning), 7.3, 1e-9));
}

#[test]
fn signal7_context_fit() {
    let p = Policy::default();
    let m = |loaded_ctx: Option<u32>, max: u32| ModelView {
        loaded: loaded_ctx.is_some(),
        loaded_context: loaded_ctx,
        max_context: max,
        ..model("m", 4.0)
    };
    let cases = [
        (m(Some(32_768), 131_072), 4_096, 15.0),   // ratio 8
        (m(Some(32_768), 131_072), 4_097, 12.0),   // ratio < 8
        (m(Some(32_768), 131_072), 10_922, 12.0),  // ratio 3.0002
        (m(Some(32_768), 131_072), 16_384, 7.5),   // ratio 2
        (m(Some(32_768), 131_072), 30_000, 3.0),   // ratio 1.09
        (m(Some(32_768), 131_072), 40_000, -15.0), // loaded window too small: resize
        (m(None, 131_072), 40_000, 12.0),          // not loaded: the max window counts (ratio 3.3)
        (m(None, 0), 40_000, 0.0),                 // unknown window
    ];
    for (i, (mv, needed, want)) in cases.iter().enumerate() {
        assert_eq!(context_fit(&p, mv, *needed), *want, "case {i}");
    }
}

#[test]
fn signal8_session_affinity_formula() {
    let p = Policy::default();
    assert_eq!(session_affinity(&p, 0.0), 20.0);
    assert!(close(session_affinity(&p, 1.0), 13.33, 0.01));
    assert_eq!(session_affinity(&p, 2.0), 10.0);
}

/// Spec 000: "between two otherwise identical nodes the session's node leads by 20 with an
/// empty queue, by 7.3 with one request, and trails by 2 once two requests are running or
/// waiting there."
#[test]
fn signal8_session_node_leads_by_20_then_7_3_then_trails_by_2() {
    let key = 0xfeed_u64;
    let nodes = vec![
        node("a", vec![loaded("m", 0.5)]),
        node("b", vec![loaded("m", 0.5)]),
    ];
    let f = fleet(nodes);
    let owner = (0..2)
        .max_by_key(|&i| rendezvous_weight(key, &f.nodes[i].id))
        .expect("two nodes");
    let other = 1 - owner;
    let req = RouteRequest {
        models: vec!["m".into()],
        affinity_key: Some(key),
        ..Default::default()
    };
    // p75 of 0 isolates Signals 3 and 8, as the spec's example does.
    for (depth, lead) in [(0u32, 20.0), (1, 7.33), (2, -2.0)] {
        let load = ModelLoad {
            p75_ms: Some(0.0),
            ..queue(depth.min(1), depth.saturating_sub(1))
        };
        let idle = ModelLoad {
            p75_ms: Some(0.0),
            ..queue(0, 0)
        };
        let loads = TableLoads::default()
            .with(owner, "m", load)
            .with(other, "m", idle);
        let d = decide(&req, &f, &Policy::default(), &loads, 0);
        let (_, t_owner) = signals_of(&d.table[owner]).expect("scored");
        let (_, t_other) = signals_of(&d.table[other]).expect("scored");
        assert!(
            close(t_owner - t_other, lead, 0.01),
            "depth {depth}: {}",
            t_owner - t_other
        );
        let want = if lead > 0.0 {
            AffinityKind::Matched
        } else {
            AffinityKind::Spilled
        };
        assert_eq!(d.affinity, want, "depth {depth}");
    }
}

#[test]
fn tier_and_load_tie_breakers() {
    let mut prov = node("prov", vec![loaded("m", 4.0)]);
    prov.tier = Tier::Provisional;
    let pinned = node("pinned", vec![loaded("m", 4.0)]);
    let req = RouteRequest {
        models: vec!["m".into()],
        ..Default::default()
    };
    let d = decide(
        &req,
        &fleet(vec![prov, pinned]),
        &Policy::default(),
        &TableLoads::default(),
        0,
    );
    assert_eq!(d.ranked[0].node_id, "pinned");
    let (s, _) = signals_of(&d.table[1]).expect("scored");
    assert_eq!(s.tier, 5.0);

    // Equal nodes: the faster one (observed TPS) and the one without other work win.
    let f = fleet(vec![
        node("a", vec![loaded("m", 4.0)]),
        node("b", vec![loaded("m", 4.0)]),
    ]);
    let fast = ModelLoad {
        observed_tps: Some(50.0),
        ..queue(0, 0)
    };
    let loads = TableLoads::default().with(1, "m", fast);
    let d = decide(&req, &f, &Policy::default(), &loads, 0);
    assert_eq!(d.ranked[0].node_id, "b");
    assert!(close(d.ranked[0].score - d.ranked[1].score, 0.5, 1e-9));
    let mut busy = TableLoads::default().with(0, "other", queue(1, 0));
    busy.node.resize(2, 0);
    let d = decide(&req, &f, &Policy::default(), &busy, 0);
    assert_eq!(d.ranked[0].node_id, "b");
    assert!(close(d.ranked[0].score - d.ranked[1].score, 1.0, 1e-9));
}
