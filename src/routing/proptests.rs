//! Property tests of the routing invariants (STYLE.md habit 1).

use proptest::prelude::*;

use super::testkit::*;
use super::*;

const MODELS: [&str; 3] = ["m0", "m1", "m2"];

fn arb_model(name: &'static str) -> impl Strategy<Value = Option<ModelView>> {
    (
        any::<bool>(),
        any::<bool>(),
        0.5f64..80.0,
        prop::sample::select(vec![0u32, 8_192, 32_768, 131_072]),
        prop::option::of(0u64..7_200_000),
        prop::bool::weighted(0.8),
    )
        .prop_map(move |(present, loaded, size, ctx, unloaded, on_disk)| {
            present.then(|| ModelView {
                name: name.into(),
                size_gb: size,
                resident_gb: None,
                loaded,
                loaded_context: loaded.then_some(ctx / 2),
                max_context: ctx,
                unloaded_at_ms: unloaded,
                on_disk,
                breaker_open: false,
                not_capable: Vec::new(),
                ..ModelView::default()
            })
        })
}

fn arb_node(i: usize) -> impl Strategy<Value = NodeView> {
    (
        (
            arb_model(MODELS[0]),
            arb_model(MODELS[1]),
            arb_model(MODELS[2]),
        ),
        prop::sample::select(vec![
            Health::Online,
            Health::Online,
            Health::Online,
            Health::Offline,
            Health::Warmup,
            Health::Draining,
            Health::Paused,
        ]),
        (
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.1),
        ),
        (
            prop::option::of(1.0f64..256.0),
            prop::option::of(50.0f64..1000.0),
        ),
        (1u32..8, 0u32..12, prop::bool::weighted(0.3)),
        prop::option::of((0.0f64..1.0, 0u64..300, 0.0f64..20.0)),
    )
        .prop_map(move |(models, health, flags, hw, cap, learning)| {
            let (breaker, thermal, critical) = flags;
            let (seats, hard_cap, provisional) = cap;
            let mut n = node(
                &format!("n{i}"),
                [models.0, models.1, models.2]
                    .into_iter()
                    .flatten()
                    .collect(),
            );
            n.health = health;
            n.breaker_open = breaker;
            n.thermal_throttled = thermal;
            n.pressure = if critical {
                Pressure::Critical
            } else {
                Pressure::Normal
            };
            n.free_memory_gb = hw.0;
            n.memory_gb = 256.0;
            n.bandwidth_gbps = hw.1;
            n.seats = seats;
            n.hard_cap = hard_cap;
            n.tier = if provisional {
                Tier::Provisional
            } else {
                Tier::Pinned
            };
            n.learning = learning.map(|(availability, cpu, days)| Learning {
                availability,
                ceiling_gb: None,
                cpu_high_for_s: cpu,
                days_observed: days,
            });
            n
        })
}

fn arb_case() -> impl Strategy<Value = (FleetView, TableLoads, RouteRequest)> {
    (1usize..8)
        .prop_flat_map(|n| {
            (
                (0..n).map(arb_node).collect::<Vec<_>>(),
                prop::collection::vec(
                    (0u32..6, 0u32..6, prop::option::of(1_000.0f64..60_000.0)),
                    n * 3,
                ),
                prop::sample::subsequence(MODELS.to_vec(), 1..=3),
                (
                    0u32..40_000,
                    prop::option::of(any::<u64>()),
                    prop::option::of(0..n),
                ),
            )
        })
        .prop_map(|(nodes, raw, models, (prompt, key, tried))| {
            let mut loads = TableLoads::default();
            for (j, (in_flight, pending, p75)) in raw.into_iter().enumerate() {
                let load = ModelLoad {
                    p75_ms: p75,
                    ..queue(in_flight, pending)
                };
                loads = loads.with(j / 3, MODELS[j % 3], load);
            }
            let req = RouteRequest {
                models: models.into_iter().map(String::from).collect(),
                prompt_tokens: prompt,
                affinity_key: key,
                tried: tried.map(|t| vec![format!("n{t}")]).unwrap_or_default(),
                ..Default::default()
            };
            (fleet(nodes), loads, req)
        })
}

fn row_of(d: &Decision, n_models: usize, c: &Choice, req: &RouteRequest) -> Row {
    let pos = req
        .models
        .iter()
        .position(|m| *m == c.model)
        .expect("candidate model");
    d.table[c.node * n_models + pos].clone()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn eliminated_pairs_are_never_chosen((f, loads, req) in arb_case(), cap in prop::option::of(0u32..3)) {
        let p = Policy { provisional_pool_cap: cap, max_ranked: 0, ..Policy::default() };
        let d = decide(&req, &f, &p, &loads, 3_600_000);
        let scored = d.table.iter().filter(|r| signals_of(r).is_some()).count();
        prop_assert_eq!(d.ranked.len(), scored);
        prop_assert_eq!(d.no_route.is_some(), d.ranked.is_empty());
        for c in &d.ranked {
            let row = row_of(&d, req.models.len(), c, &req);
            let (_, total) = signals_of(&row).expect("a ranked pair is scored");
            prop_assert_eq!(total, c.score);
        }
    }

    #[test]
    fn decisions_are_deterministic((f, loads, req) in arb_case()) {
        let p = Policy::default();
        let a = decide(&req, &f, &p, &loads, 1_000);
        let b = decide(&req, &f, &p, &loads, 1_000);
        prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    #[test]
    fn more_depth_never_scores_better(
        (f, loads, req) in arb_case(),
        node in 0usize..8,
        extra_running in any::<bool>(),
    ) {
        let node = node % f.nodes.len();
        let model = req.models[0].as_str();
        let mut deeper = loads.clone();
        let mut load = loads.model(node, model);
        if extra_running {
            load.in_flight += 1;
            // A request running for this model also runs on the node.
            deeper.node[node] += 1;
        } else {
            load.pending += 1;
        }
        deeper.model.retain(|(n, m, _)| !(*n == node && m == model));
        deeper.model.push((node, model.to_string(), load));
        let p = Policy::default();
        let before = decide(&req, &f, &p, &loads, 0);
        let after = decide(&req, &f, &p, &deeper, 0);
        let idx = node * req.models.len();
        if let (Some((_, t0)), Some((_, t1))) =
            (signals_of(&before.table[idx]), signals_of(&after.table[idx]))
        {
            prop_assert!(t1 <= t0, "deeper queue scored {} > {}", t1, t0);
        }
    }

    #[test]
    fn a_loaded_fallback_beats_a_cold_primary(
        (mut f, loads, mut req) in arb_case(),
        host in 0usize..8,
    ) {
        // Make the primary cold everywhere and the fallback loaded on one healthy node.
        req.models = vec!["m0".into(), "m1".into()];
        req.tried.clear();
        req.prompt_tokens = 100;
        let host = host % f.nodes.len();
        for n in &mut f.nodes {
            for m in &mut n.models {
                if m.name == "m0" {
                    m.loaded = false;
                }
            }
        }
        let h = &mut f.nodes[host];
        *h = NodeView { models: h.models.clone(), ..node(&h.id, vec![]) };
        h.models.retain(|m| m.name != "m1");
        h.models.push(loaded("m1", 8.0));
        let d = decide(&req, &f, &Policy::default(), &loads, 0);
        let w = d.winner().expect("the loaded fallback survives");
        prop_assert_eq!(w.model.as_str(), "m1");
        prop_assert!(w.fallback);
    }

    #[test]
    fn pin_beats_sticky((f, loads, mut req) in arb_case(), pin in 0usize..8, key in any::<u64>()) {
        let pin = pin % f.nodes.len();
        req.pin = Some(f.nodes[pin].id.clone());
        req.affinity_key = Some(key);
        let d = decide(&req, &f, &Policy::default(), &loads, 0);
        prop_assert_eq!(d.affinity, AffinityKind::None);
        match d.winner() {
            Some(w) => prop_assert_eq!(w.node, pin),
            None => prop_assert!(matches!(
                d.no_route,
                Some(NoRoute::PinUnavailable | NoRoute::ModelNotFound | NoRoute::ContextTooLong)
            )),
        }
        prop_assert!(d.ranked.iter().all(|c| c.node == pin));
    }
}
