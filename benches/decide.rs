//! Criterion bench of `routing::decide` at 10, 100 and 1000 nodes with 1 and 4 candidate models,
//! and (`decide_batching`) on 1 and 4 full batching servers: 256 seats, each running 256 requests
//! with predicted ends and 64 waiting, and (`decide_untried`, completion mode) on a fleet where
//! the first model was answered by every fifth node only and streams on every third: the loops
//! that price a pair never observed (its node's other models, its pace against the model's
//! observers, the model's live streams) run for most candidates.
//!
//! `cargo bench --bench decide`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use fleetgate::routing::{
    decide, Family, FleetView, Learning, Loads, Mode, ModelLoad, ModelView, NodeView, Policy,
    Rates, RouteRequest, Tier,
};

const MODELS: [&str; 6] = [
    "llama3:70b",
    "qwen2.5:32b",
    "mistral:7b",
    "phi3:mini",
    "gemma2:9b",
    "qwen3:4b",
];

/// A mixed fleet: each node holds 4 of the 6 models, some loaded, varied hardware and state.
fn fleet(n: usize) -> FleetView {
    let nodes = (0..n)
        .map(|i| {
            let models = (0..4)
                .map(|k| {
                    let name = MODELS[(i + k) % MODELS.len()];
                    let size = [40.0, 19.0, 4.1, 2.3, 5.4, 2.5][(i + k) % MODELS.len()];
                    ModelView {
                        name: name.into(),
                        size_gb: size,
                        resident_gb: (i % 3 == 0).then_some(size * 1.2),
                        loaded: (i + k) % 3 == 0,
                        loaded_context: Some(8_192 << (i % 3)),
                        max_context: 131_072,
                        unloaded_at_ms: (i % 4 == 1).then_some(1_000),
                        on_disk: k < 3,
                        breaker_open: false,
                        not_capable: Vec::new(),
                        ..ModelView::default()
                    }
                })
                .collect();
            NodeView {
                id: format!("node-{i:04}"),
                free_memory_gb: Some([24.0, 48.0, 96.0, 160.0][i % 4]),
                memory_gb: [32.0, 64.0, 128.0, 192.0][i % 4],
                bandwidth_gbps: (i % 5 != 0).then_some([100.0, 273.0, 400.0, 800.0][i % 4]),
                seats: 1 + (i % 4) as u32,
                hard_cap: 8,
                tier: if i % 7 == 0 {
                    Tier::Provisional
                } else {
                    Tier::Pinned
                },
                tags: vec!["vision".into()],
                families: vec![Family::OpenAI, Family::Ollama],
                models,
                output_reserve: 2_048,
                overhead_tokens: 512,
                learning: (i % 6 == 0).then_some(Learning {
                    availability: 0.8,
                    ceiling_gb: Some(64.0),
                    cpu_high_for_s: 0,
                    days_observed: 30.0,
                }),
                ..NodeView::default()
            }
        })
        .collect();
    FleetView { nodes }
}

/// Loads as the proxy keeps them: flat arrays indexed by node (no hashing on the hot path).
struct FlatLoads {
    node: Vec<u32>,
    model: Vec<ModelLoad>,
    rates: Vec<Rates>,
}

impl FlatLoads {
    fn new(n: usize) -> Self {
        let model = (0..n)
            .map(|i| ModelLoad {
                in_flight: (i % 3) as u32,
                pending: (i % 5) as u32 / 2,
                p75_ms: (i % 2 == 0).then_some(4_000.0 + i as f64),
                observed_tps: (i % 3 == 1).then_some(35.0),
                ..ModelLoad::default()
            })
            .collect();
        let rates = (0..n)
            .map(|i| Rates {
                prefill_tps: (i % 4 != 3).then_some(800.0 + i as f64),
                decode_spt: (i % 4 != 3).then_some(0.02 + (i % 7) as f64 * 0.002),
                decode_spt_per_stream: Some(0.003),
                service_s: (i % 4 != 3).then_some(5.0),
                output_tokens: Some(300.0),
                observed: 10,
                last_ms: Some(3_600_000 - (i as u64 % 90) * 1_000),
                ..Rates::default()
            })
            .collect();
        FlatLoads {
            node: (0..n).map(|i| (i % 4) as u32).collect(),
            model,
            rates,
        }
    }
}

impl Loads for FlatLoads {
    fn node_in_flight(&self, node: usize) -> u32 {
        self.node[node]
    }
    fn model(&self, node: usize, _model: &str) -> ModelLoad {
        self.model[node]
    }
    fn rates(&self, node: usize, _model: &str) -> Rates {
        self.rates[node]
    }
}

/// `FlatLoads`, but the first model was answered by every fifth node only, and every third
/// node streams it now (first answers on their way).
struct UntriedLoads(FlatLoads);

impl Loads for UntriedLoads {
    fn node_in_flight(&self, node: usize) -> u32 {
        self.0.node_in_flight(node)
    }
    fn model(&self, node: usize, model: &str) -> ModelLoad {
        self.0.model(node, model)
    }
    fn rates(&self, node: usize, model: &str) -> Rates {
        if model == MODELS[0] && !node.is_multiple_of(5) {
            return Rates::default();
        }
        let r = self.0.rates(node, model);
        // The other models' rates differ by model, so a node's best is read among them.
        let k = MODELS.iter().position(|m| *m == model).unwrap_or(0) as f64;
        Rates {
            decode_spt: r.decode_spt.map(|s| s * (1.0 + 0.1 * k)),
            ..r
        }
    }
    fn seat_ends(
        &self,
        node: usize,
        model: &str,
        _now_ms: u64,
        out: &mut Vec<f64>,
    ) -> Option<fleetgate::routing::LiveDecode> {
        if model != MODELS[0] || !node.is_multiple_of(3) {
            return None;
        }
        out.extend([0.4, 1.2]);
        Some(fleetgate::routing::LiveDecode {
            secs: 1.5,
            tokens: 40.0,
            streams: 2,
            node_decoding: 2,
            ..Default::default()
        })
    }
}

/// Full batching servers (vLLM, SGLang): every seat taken by one model, the running requests'
/// ends known, requests waiting in the gateway.
struct FullLoads {
    model: String,
    ends: Vec<f64>,
    pending: u32,
}

impl Loads for FullLoads {
    fn node_in_flight(&self, _node: usize) -> u32 {
        self.ends.len() as u32
    }
    fn model(&self, _node: usize, model: &str) -> ModelLoad {
        if model != self.model {
            return ModelLoad::default();
        }
        ModelLoad {
            in_flight: self.ends.len() as u32,
            pending: self.pending,
            ..ModelLoad::default()
        }
    }
    fn rates(&self, node: usize, _model: &str) -> Rates {
        Rates {
            prefill_tps: Some(8_000.0 + node as f64),
            decode_spt: Some(0.02),
            decode_spt_per_stream: Some(0.0001),
            service_s: Some(6.0),
            output_tokens: Some(300.0),
            observed: 10,
            last_ms: Some(3_600_000),
            ..Rates::default()
        }
    }
    fn seat_ends(
        &self,
        _node: usize,
        model: &str,
        _now_ms: u64,
        out: &mut Vec<f64>,
    ) -> Option<fleetgate::routing::LiveDecode> {
        if model == self.model {
            out.extend(&self.ends);
        }
        None
    }
}

fn bench_batching(c: &mut Criterion) {
    let policy = completion_policy();
    let seats = 256;
    let loads = FullLoads {
        model: MODELS[0].to_string(),
        ends: (0..seats)
            .map(|i| 0.05 + f64::from(i % 97) * 0.07)
            .collect(),
        pending: 64,
    };
    let mut group = c.benchmark_group("decide_batching");
    for &n in &[1usize, 4] {
        // Every node holds the model, loaded (the mixed fleet gives it to every third).
        let mut fleet = fleet(n);
        for node in &mut fleet.nodes {
            node.seats = seats;
            node.hard_cap = 0;
            node.models.retain(|m| m.name != MODELS[0]);
            node.models.insert(
                0,
                ModelView {
                    name: MODELS[0].into(),
                    size_gb: 40.0,
                    loaded: true,
                    on_disk: true,
                    max_context: 131_072,
                    ..ModelView::default()
                },
            );
        }
        let req = first_model_request();
        group.bench_with_input(BenchmarkId::new("1_model", n), &n, |b, _| {
            b.iter(|| decide(black_box(&req), &fleet, &policy, &loads, 3_600_000))
        });
    }
    group.finish();
}

/// A chat for the first model, 3,000 prompt tokens.
fn first_model_request() -> RouteRequest {
    RouteRequest {
        models: vec![MODELS[0].to_string()],
        family: Some(Family::OpenAI),
        prompt_tokens: 3_000,
        ..RouteRequest::default()
    }
}

fn completion_policy() -> Policy {
    Policy {
        mode: Mode::Completion,
        ..Policy::default()
    }
}

fn bench_decide(c: &mut Criterion) {
    bench_mode(c, "decide", Mode::Spec);
    bench_mode(c, "decide_completion", Mode::Completion);
    bench_batching(c);
    bench_untried(c);
}

fn bench_untried(c: &mut Criterion) {
    let policy = completion_policy();
    let mut group = c.benchmark_group("decide_untried");
    for &n in &[10usize, 100] {
        let fleet = fleet(n);
        let loads = UntriedLoads(FlatLoads::new(n));
        let req = first_model_request();
        group.bench_with_input(BenchmarkId::new("1_model", n), &n, |b, _| {
            b.iter(|| decide(black_box(&req), &fleet, &policy, &loads, 3_600_000))
        });
    }
    group.finish();
}

fn bench_mode(c: &mut Criterion, name: &str, mode: Mode) {
    let policy = Policy {
        provisional_pool_cap: Some(2),
        mode,
        ..Policy::default()
    };
    let mut group = c.benchmark_group(name);
    for &n in &[10usize, 100, 1000] {
        let fleet = fleet(n);
        let loads = FlatLoads::new(n);
        for &m in &[1usize, 4] {
            let req = RouteRequest {
                models: MODELS[..m].iter().map(|s| s.to_string()).collect(),
                family: Some(Family::OpenAI),
                prompt_tokens: 3_000,
                affinity_key: Some(0x5eed),
                cached_prefix_tokens: 2_000,
                ..RouteRequest::default()
            };
            group.bench_with_input(BenchmarkId::new(format!("{m}_models"), n), &n, |b, _| {
                b.iter(|| decide(black_box(&req), &fleet, &policy, &loads, 3_600_000))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_decide);
criterion_main!(benches);
