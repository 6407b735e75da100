//! Side by side on this machine, in one interleaved run: the fake node direct, behind Debian's
//! nginx (`proxy_pass`, upstream keep-alive) and behind fleetgate (default config, one
//! `backend: openai` node; the release binary as its own process). wrk drives each; per
//! scenario (c=1/32/256, non-streaming/streaming, 1/8/64 KiB prompts) it prints medians over
//! rounds of rps, added p50/p99 against direct in the same round, CPU µs per request of the
//! proxy process tree (/proc/<pid>/stat), new upstream connections per 1000 requests (accepts
//! at the node) and the ratios fleetgate/nginx. Then peak RSS of a fresh fleetgate holding
//! 10,000 concurrent open streams.
//!
//! `cargo bench --bench sidebyside` (installs nginx-light and wrk when missing, through
//! `scripts/bootstrap.sh --bench`). `FLEETGATE_BENCH_SCALE=2` doubles rounds and run time;
//! `FLEETGATE_BENCH_STREAMS=N` changes the open-stream count (0 skips that phase);
//! `FLEETGATE_BENCH_CONNS=1,32` runs only those concurrencies (`none`: only the streams);
//! `FLEETGATE_BENCH_WRAP="heaptrack -o /tmp/fg"` runs each fleetgate under that command;
//! `FLEETGATE_BENCH_EXTRA=
//! name=/path/to/fleetgate,...` adds other fleetgate binaries (an older build, another
//! allocator) to the same interleaved run, each with its own table. Exits 1 when a gateway's
//! log shows Pingora's pool race ("failed to acquire reusable stream", issue 16).

#[path = "../common/mod.rs"]
mod common;
mod node;
mod procs;
mod streams;
mod wrk;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{free_port, median, scaled};
use procs::Proxy;

#[derive(Clone, Copy)]
struct Scenario {
    conns: usize,
    stream: bool,
    kib: usize,
}

impl Scenario {
    fn label(&self) -> String {
        let kind = if self.stream { "stream" } else { "plain" };
        format!("c={} {kind} {} KiB", self.conns, self.kib)
    }
}

/// One wrk run through one target.
#[derive(Clone, Copy, Default)]
struct Sample {
    rps: f64,
    p50: f64,
    p99: f64,
    cpu_us: f64,
    conns_per_k: f64,
    errors: u64,
}

/// A chat request of about `kib` KiB.
fn chat_body(kib: usize, stream: bool, model: &str) -> String {
    let head = serde_json::json!({
        "model": model, "max_tokens": 1, "stream": stream,
        "messages": [{"role": "user", "content": ""}],
    })
    .to_string();
    let pad = (kib * 1024).saturating_sub(head.len());
    let words = "lorem ipsum dolor sit amet ".repeat(pad / 27 + 1);
    let content = &words[..pad];
    serde_json::json!({
        "model": model, "max_tokens": 1, "stream": stream,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string()
}

fn ensure_tools() {
    let have = |c: &str| {
        Command::new("sh")
            .args([
                "-c",
                &format!("command -v {c} >/dev/null || test -x /usr/sbin/{c}"),
            ])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !have("nginx") || !have("wrk") {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let ok = Command::new(root.join("scripts/bootstrap.sh"))
            .arg("--bench")
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "scripts/bootstrap.sh --bench failed (nginx-light, wrk)");
    }
}

/// Room for the open streams: the soft open-files limit up to the hard one (children inherit
/// it); returns the limit.
fn raise_nofile() -> usize {
    let hard = Command::new("sh")
        .args(["-c", "ulimit -Hn"])
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<usize>()
                .ok()
        })
        .unwrap_or(1024);
    let pid = std::process::id().to_string();
    let ok = Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={hard}:{hard}")])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("sidebyside: could not raise the open-files limit to {hard} (prlimit)");
    }
    hard
}

fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// fleetgate's default config with one `backend: openai` node: only what must be said.
pub fn default_yaml(port: u16, node_port: u16, extra: &str) -> String {
    format!(
        "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:{}\nfleet:\n  nodes:\n    - id: node\n      url: http://127.0.0.1:{node_port}\n      backend: openai\n{extra}",
        free_port()
    )
}

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fleetgate-sidebyside-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn measure(
    url: &str,
    script: &Path,
    sc: Scenario,
    secs: u32,
    proxy: Option<&Proxy>,
    node: &node::Node,
) -> Sample {
    let cpu0 = proxy.map_or(0.0, Proxy::cpu_secs);
    let acc0 = node.accepts();
    let r = match wrk::run(url, script, sc.conns, secs) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{e}");
            return Sample {
                errors: 1,
                ..Sample::default()
            };
        }
    };
    let cpu = proxy.map_or(0.0, Proxy::cpu_secs) - cpu0;
    let reqs = r.requests.max(1) as f64;
    Sample {
        rps: r.rps,
        p50: r.p50,
        p99: r.p99,
        cpu_us: cpu * 1e6 / reqs,
        conns_per_k: (node.accepts() - acc0) as f64 * 1000.0 / reqs,
        errors: r.errors,
    }
}

fn med(v: &[f64]) -> f64 {
    median(v)
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:.2}", a / b)
    } else {
        "n/a".into()
    }
}

fn main() {
    if !common::benchmarking() {
        return;
    }
    ensure_tools();
    let nofile = raise_nofile();
    let dir = scratch_dir();
    let rounds = scaled(3, 2);
    let secs = scaled(2, 1) as u32;
    let rt = common::runtime(2, "node");
    let node = node::start(&rt);
    let nginx = Proxy::nginx(&dir, free_port(), node.port, 2);
    let mut gateways = Vec::new();
    let extra = std::env::var("FLEETGATE_BENCH_EXTRA").unwrap_or_default();
    let bins = std::iter::once(("this build".to_string(), None)).chain(
        extra
            .split(',')
            .filter_map(|e| e.split_once('='))
            .map(|(n, p)| (n.to_string(), Some(PathBuf::from(p)))),
    );
    for (i, (name, bin)) in bins.enumerate() {
        let port = free_port();
        let yaml = default_yaml(port, node.port, "");
        let mut p = Proxy::fleetgate(&dir, port, &yaml, &format!("default{i}"), bin.as_deref());
        p.name = name;
        gateways.push(p);
    }
    let mut targets: Vec<(&str, u16, Option<&Proxy>)> = vec![
        ("direct", node.port, None),
        ("nginx", nginx.port, Some(&nginx)),
    ];
    targets.extend(gateways.iter().map(|g| (g.name.as_str(), g.port, Some(g))));
    let nt = targets.len();
    // FLEETGATE_BENCH_CONNS=none: only the open-streams phase.
    let conns_list: Vec<usize> = match std::env::var("FLEETGATE_BENCH_CONNS") {
        Ok(v) if v.trim() == "none" => Vec::new(),
        v => v
            .ok()
            .map(|v| v.split(',').filter_map(|c| c.trim().parse().ok()).collect())
            .filter(|v: &Vec<usize>| !v.is_empty())
            .unwrap_or_else(|| vec![1, 32, 256]),
    };
    let mut scenarios = Vec::new();
    for conns in conns_list {
        for stream in [false, true] {
            for kib in [1, 8, 64] {
                scenarios.push(Scenario { conns, stream, kib });
            }
        }
    }
    let scripts: Vec<PathBuf> = scenarios
        .iter()
        .enumerate()
        .map(|(i, s)| {
            wrk::script(
                &dir,
                &format!("s{i}"),
                &chat_body(s.kib, s.stream, node::MODEL),
            )
        })
        .collect();
    println!(
        "sidebyside: {} scenarios x {nt} targets x {rounds} rounds, {secs} s each; nginx and \
         fleetgate 2 workers; load before: {}",
        scenarios.len(),
        uptime()
    );
    for &(_, port, proxy) in targets.iter().take_while(|_| !scripts.is_empty()) {
        let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
        let warm = Scenario {
            conns: 32,
            stream: false,
            kib: 1,
        };
        measure(&url, &scripts[0], warm, 1, proxy, &node);
    }
    // samples[scenario][target][round]
    let mut samples = vec![vec![Vec::<Sample>::new(); nt]; scenarios.len()];
    for round in 0..rounds {
        for (si, sc) in scenarios.iter().enumerate() {
            for k in 0..nt {
                let ti = (k + round + si) % nt;
                let (_, port, proxy) = targets[ti];
                let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
                let s = measure(&url, &scripts[si], *sc, secs, proxy, &node);
                samples[si][ti].push(s);
            }
        }
        eprintln!(
            "sidebyside: round {}/{rounds} done, load {}",
            round + 1,
            uptime()
        );
    }
    let mut pool_race: u64 = 0;
    for (gi, g) in gateways.iter().enumerate() {
        println!("\nfleetgate: {}", g.name);
        report(&scenarios, &samples, 2 + gi);
        let lost = g.log_count("failed to acquire reusable stream");
        pool_race += lost as u64 + g.log_dropped("pingora_core::connectors");
        println!(
            "fleetgate ({}) log: {lost} x 'failed to acquire reusable stream', {} ERROR lines, {} lines of pingora_core::connectors left out by the log rate limit",
            g.name,
            g.log_count("ERROR"),
            g.log_dropped("pingora_core::connectors"),
        );
    }
    println!("load after: {}", uptime());
    drop(gateways);
    drop(nginx);
    // Each stream is two sockets in this process (client and node side) and two in the
    // gateway: 10,000 unless the open-files limit holds fewer.
    let fit = nofile.saturating_sub(1000) / 2;
    let n = std::env::var("FLEETGATE_BENCH_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000.min(fit));
    if n < 10_000 {
        println!("\nopen-files limit {nofile}: {n} streams instead of 10,000");
    }
    if n > 0 {
        streams::run(&dir, &node, n);
    }
    let _ = std::fs::remove_dir_all(&dir);
    // The regression check for issue 16: Pingora's pool race (patched in vendor/pingora-core)
    // shows only under release-build load like this, never in the debug test suite.
    if pool_race > 0 {
        eprintln!(
            "REGRESSION (issue 16): {pool_race} pooled upstream connections lost to the pool race; see vendor/README.md"
        );
        std::process::exit(1);
    }
}

/// The table for the fleetgate at target index `fg` against nginx (index 1) and direct (0).
fn report(scenarios: &[Scenario], samples: &[Vec<Vec<Sample>>], fg: usize) {
    println!(
        "| scenario | direct rps | nginx rps | fleetgate rps | fg/nginx rps | nginx +p50 µs | fg +p50 µs | fg/nginx | nginx +p99 µs | fg +p99 µs | nginx CPU µs/req | fg CPU µs/req | fg/nginx CPU | new conns/1k nginx | new conns/1k fg | errors nginx/fg |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (si, sc) in scenarios.iter().enumerate() {
        let s = &samples[si];
        let pick = |t: usize, f: fn(&Sample) -> f64| med(&s[t].iter().map(f).collect::<Vec<_>>());
        // Added latency: against direct in the same round, then the median over rounds.
        let added = |t: usize, f: fn(&Sample) -> f64| {
            med(&s[t]
                .iter()
                .zip(&s[0])
                .map(|(x, d)| f(x) - f(d))
                .collect::<Vec<_>>())
        };
        let errs = |t: usize| s[t].iter().map(|x| x.errors).sum::<u64>();
        let (n_rps, f_rps) = (pick(1, |x| x.rps), pick(fg, |x| x.rps));
        let (n_p50, f_p50) = (added(1, |x| x.p50), added(fg, |x| x.p50));
        let (n_p99, f_p99) = (added(1, |x| x.p99), added(fg, |x| x.p99));
        let (n_cpu, f_cpu) = (pick(1, |x| x.cpu_us), pick(fg, |x| x.cpu_us));
        println!(
            "| {} | {:.0} | {n_rps:.0} | {f_rps:.0} | {} | {n_p50:.0} | {f_p50:.0} | {} | {n_p99:.0} | {f_p99:.0} | {n_cpu:.0} | {f_cpu:.0} | {} | {:.2} | {:.2} | {}/{} |",
            sc.label(),
            pick(0, |x| x.rps),
            ratio(f_rps, n_rps),
            ratio(f_p50, n_p50),
            ratio(f_cpu, n_cpu),
            pick(1, |x| x.conns_per_k),
            pick(fg, |x| x.conns_per_k),
            errs(1),
            errs(fg),
        );
    }
}
