//! Placement quality end to end: scenarios from `benches/scenarios/*.yaml` (simulated fleets
//! with prefill, prefix caches, decode contention, cold loads, LRU eviction, run-time
//! slowdowns), each replayed as one seeded trace (Poisson arrivals, bursts, multi-turn chats
//! without a conversation header) under seven policies in the same run:
//! - `completion`: fleetgate, `routing.mode: completion` (predicted completion time);
//! - `spec-000`: fleetgate, `routing.mode: spec` (spec 000's points);
//! - `round-robin`: fleetgate, `routing.mode: round-robin` (the survivors take turns);
//! - `least-busy`: fleetgate, `routing.mode: least-busy` (fewest running and waiting);
//! - `rr-direct`: client-side, per model over the nodes that have it on disk;
//! - `lb-direct`: client-side, fewest requests in flight (counted by the client);
//! - `ct-oracle`: client-side, the least estimated completion time from the sims' true
//!   physics and state (`placement/oracle.rs`): what placement could reach knowing what
//!   completion mode has to learn.
//!
//! The first four pay the same gateway hop and keep the same hard rules (a window that fits,
//! capabilities, breakers): they differ only in placement, and the checks compare
//! completion with them. The direct two go straight to the nodes, with a retry elsewhere after
//! a context-overflow answer (as LiteLLM's fallbacks do): what a client gets without any
//! gateway, printed for reference with completion's ratio to them. `ct-oracle` is a
//! yardstick, not judged: where completion is far above it, placement leaves time on the
//! table that better learning could win (it also skips the gateway hop, ~0.2 ms).
//!
//! The gateway config gives fleetgate only URLs, `backend: ollama`, seats and memory.
//! Prints per scenario mean / p50 / p99 total time, TTFT, errors (context overflows apart),
//! model loads, prefix-cache reuse and per-node utilisation, medians over runs (run `i` uses
//! trace seed `seed + i`; the policy order rotates per run), then a summary with the
//! issue's "done when" checks.
//!
//! `cargo bench --bench placement`  (3 runs per scenario);
//! `cargo bench --bench placement -- --quick` (or `FLEETGATE_BENCH_QUICK=1`): one run;
//! `-- --only home-lab,slowdown` some scenarios, `-- --policies completion,spec-000` some
//! policies (the others show zeros); `-- --run 2` starts at run 2 (trace seed + 2: with
//! `--quick`, that run alone); `-- --trace` (or `FLEETGATE_BENCH_TRACE=1`)
//! also prints every request (node, cached tokens, load, TTFT, total);
//! `FLEETGATE_BENCH_CLIENT=openai` sends OpenAI chat completions (streamed) instead of Ollama
//! `/api/chat` streams, `=openai-whole` OpenAI replies whole (no node timings, no TTFT);
//! `FLEETGATE_BENCH_STRETCH=10` runs every scenario 10x slower (life's pace, see
//! `Scenario::stretch`); `FLEETGATE_BENCH_BACKEND=openai` configures every node as `backend:
//! openai` with nothing but its URL (no seats, no memory: a user in front of vLLM, SGLang or
//! llama.cpp servers).

mod common;
#[path = "placement/drive.rs"]
mod drive;
#[path = "placement/oracle.rs"]
mod oracle;
#[path = "placement/report.rs"]
mod report;
#[path = "placement/scenario.rs"]
mod scenario;
#[path = "placement/trace.rs"]
mod trace;

use std::path::PathBuf;

use drive::Policy;
use report::Figures;
use scenario::{Mode, Scenario};

struct Args {
    runs: usize,
    /// Run index of the first run (its trace seed is the scenario's `seed` + this).
    first: usize,
    only: Option<Vec<String>>,
    policies: Option<Vec<String>>,
    trace: bool,
}

fn args() -> Args {
    let argv: Vec<String> = std::env::args().collect();
    let env_on = |k: &str| std::env::var(k).is_ok_and(|v| v != "0" && !v.is_empty());
    let quick = argv.iter().any(|a| a == "--quick") || env_on("FLEETGATE_BENCH_QUICK");
    let list = |flag: &str| {
        argv.iter()
            .position(|a| a == flag)
            .and_then(|i| argv.get(i + 1))
            .map(|s| s.split(',').map(str::to_string).collect())
    };
    Args {
        runs: if quick { 1 } else { common::scaled(3, 1) },
        first: list("--run")
            .and_then(|v: Vec<String>| v.first()?.parse().ok())
            .unwrap_or(0),
        only: list("--only"),
        policies: list("--policies"),
        trace: argv.iter().any(|a| a == "--trace") || env_on("FLEETGATE_BENCH_TRACE"),
    }
}

fn scenarios(only: &Option<Vec<String>>) -> Vec<Scenario> {
    // `FLEETGATE_BENCH_SCENARIOS`: another directory of scenario files (generated fleets, a
    // user's own).
    let dir = std::env::var_os("FLEETGATE_BENCH_SCENARIOS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/scenarios"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let stretch = std::env::var("FLEETGATE_BENCH_STRETCH").map_or(1.0, |v| {
        v.parse::<f64>()
            .ok()
            .filter(|k| k.is_finite() && *k > 0.0)
            .unwrap_or_else(|| panic!("FLEETGATE_BENCH_STRETCH={v}: expected a factor > 0"))
    });
    files
        .iter()
        .map(|p| Scenario::load(p).unwrap_or_else(|e| panic!("scenario {e}")))
        .filter(|s| only.as_ref().is_none_or(|o| o.contains(&s.name)))
        .map(|mut s| {
            s.stretch(stretch);
            s
        })
        .collect()
}

fn main() {
    if !common::benchmarking() {
        return;
    }
    // Silent unless asked: `RUST_LOG=fleetgate::decisions=debug` prints every candidate's
    // predicted terms (what to read when completion mode sends a request somewhere odd).
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("off")).init();
    let a = args();
    let client = drive::Client::from_env().unwrap_or_else(|e| panic!("{e}"));
    println!(
        "placement bench ({} build), {} run(s) per scenario, clients: {}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        a.runs,
        client.name()
    );
    let supported = scenario::modes_supported();
    if !supported {
        println!(
            "note: this build has no `routing.mode`; both fleetgate rows run its default placement"
        );
    }
    let policies = [
        Policy::Fleetgate(Mode::Completion, supported),
        Policy::Fleetgate(Mode::Spec, supported),
        Policy::Fleetgate(Mode::RoundRobin, supported),
        Policy::Fleetgate(Mode::LeastBusy, supported),
        Policy::RoundRobin,
        Policy::LeastBusy,
        Policy::Oracle,
    ];
    let rt = common::runtime(2, "placement");
    let mut summary: Vec<(String, Vec<Figures>, Vec<f64>)> = Vec::new();
    for sc in scenarios(&a.only) {
        let nodes = sc.nodes();
        println!("\n== {} ({} nodes): {}", sc.name, nodes.len(), sc.about);
        let mut per: Vec<Vec<Figures>> = vec![Vec::new(); policies.len()];
        for run in 0..a.runs {
            let tr = trace::trace(&sc, sc.seed + (a.first + run) as u64);
            let turns: usize = tr.chats.iter().map(|c| c.turns.len()).sum();
            let mut line = format!(
                "  run {run}: {} requests + {turns} turns | mean s:",
                tr.shots.len()
            );
            for k in 0..policies.len() {
                let pi = (k + run) % policies.len();
                let name = policies[pi].name().to_string();
                if a.policies.as_ref().is_some_and(|p| !p.contains(&name)) {
                    per[pi].push(Figures::default());
                    continue;
                }
                let d = drive::run(&rt, &sc, &tr, policies[pi], client);
                if a.trace {
                    for l in report::trace_lines(policies[pi].name(), &d) {
                        println!("{l}");
                    }
                }
                let f = report::figures(&d);
                line += &format!(" {} {:.3}", policies[pi].name(), f.mean_s);
                per[pi].push(f);
            }
            println!("{line}");
        }
        let ids: Vec<String> = nodes.iter().map(|n| n.id.clone()).collect();
        println!("  medians of {} run(s):", a.runs);
        println!("{}", report::header(&ids));
        let med: Vec<Figures> = per.iter().map(|r| report::medians(r)).collect();
        for (p, f) in policies.iter().zip(&med) {
            println!("{}", report::row(p.name(), f));
        }
        // Completion against each other policy on the requests both served, median over runs.
        let like: Vec<f64> = (1..policies.len())
            .map(|pi| {
                let r: Vec<f64> = (0..a.runs)
                    .map(|run| report::common_ratio(&per[0][run], &per[pi][run]))
                    .filter(|r| r.is_finite())
                    .collect();
                if r.is_empty() {
                    f64::NAN
                } else {
                    common::median(&r)
                }
            })
            .collect();
        summary.push((sc.name.clone(), med, like));
    }
    print_summary(&summary);
}

/// Policies the checks compare completion with: those behind the same gateway hop.
const JUDGED: usize = 4;

/// One markdown row per scenario: mean total per policy, completion / each other policy on
/// the requests both served, checks (against the policies behind the gateway; the direct
/// ones are for reference).
fn print_summary(summary: &[(String, Vec<Figures>, Vec<f64>)]) {
    println!("\nmean total time of the requests that succeeded, medians over runs; c/x: completion's mean over x's on the requests both served (median over runs); done-when (against the policies behind the gateway: spec-000, round-robin, least-busy): c/x <= 1, no context-overflow answer, no more failed requests than any of them (home-lab*: also c/spec <= 0.6); rr-direct / lb-direct: the client routes itself, no gateway hop (reference); ct-oracle: a client-side router that knows the sims' true physics and picks the least estimated completion time (a yardstick, not judged)");
    println!("| scenario | completion | spec-000 | round-robin | least-busy | rr-direct | lb-direct | ct-oracle | c/spec | c/rr | c/lb | c/rr-direct | c/lb-direct | c/oracle | failed (c/s/rr/lb/rrd/lbd/o) | ctx answers (c/s/rr/lb/rrd/lbd/o) | done-when |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, med, like) in summary {
        let fewest_errors = med[1..JUDGED]
            .iter()
            .map(|f| f.errors)
            .fold(f64::INFINITY, f64::min);
        let mut ok = like[..JUDGED - 1].iter().all(|r| *r <= 1.0)
            && med[0].context_errors == 0.0
            && med[0].errors <= fewest_errors;
        if name.starts_with("home-lab") {
            ok &= like[0] <= 0.6;
        }
        let means: Vec<String> = med.iter().map(|f| format!("{:.3} s", f.mean_s)).collect();
        let ratios: Vec<String> = like.iter().map(|r| format!("{r:.2}x")).collect();
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            means.join(" | "),
            ratios.join(" | "),
            med.iter()
                .map(|f| f.errors.to_string())
                .collect::<Vec<_>>()
                .join("/"),
            med.iter()
                .map(|f| f.context_errors.to_string())
                .collect::<Vec<_>>()
                .join("/"),
            if ok { "pass" } else { "FAIL" }
        );
    }
}
