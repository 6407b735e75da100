//! A real Prometheus (Debian's `prometheus`, installed by `scripts/bootstrap.sh --prometheus`)
//! scrapes a test gateway with the shipped `conf/prometheus/prometheus.yml` (target and
//! interval replaced); its HTTP query API must see exactly the requests sent, a latency and
//! a TTFT median in the range the simulated nodes produce, and data for every dashboard query.

mod common;
mod obs;

use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use common::*;
use obs::*;
use serde_json::Value;

/// How long any one condition may take to show up in Prometheus (scrapes are 1 s apart).
const WAIT: Duration = Duration::from_secs(30);
/// `$__rate_interval` in dashboard queries; covers the whole test.
const RATE_INTERVAL: &str = "1m";

/// The `prometheus` binary: `$FLEETGATE_PROMETHEUS`, else `prometheus` on PATH.
fn prometheus_binary() -> PathBuf {
    let found = match std::env::var_os("FLEETGATE_PROMETHEUS") {
        Some(p) => Some(PathBuf::from(p)).filter(|p| p.is_file()),
        None => std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .map(|d| d.join("prometheus"))
            .find(|p| p.is_file()),
    };
    found.unwrap_or_else(|| {
        panic!(
            "`prometheus` is not installed (not on PATH, or FLEETGATE_PROMETHEUS is not a file), \
             and this test needs a real one.\n\
             Install it with `scripts/bootstrap.sh --prometheus` (on Debian/Ubuntu that runs \
             `apt-get update && apt-get install -y prometheus`; scripts/test.sh does it for you), \
             or set FLEETGATE_PROMETHEUS=/path/to/prometheus."
        )
    })
}

/// The shipped scrape config with the target replaced by `target` and a 1 s interval.
fn scrape_config(target: &str) -> String {
    let path = repo_path("conf/prometheus/prometheus.yml");
    let text = std::fs::read_to_string(&path).expect("conf/prometheus/prometheus.yml");
    let mut v: serde_yaml::Value = serde_yaml::from_str(&text).expect("shipped config is YAML");
    let job = &mut v["scrape_configs"][0];
    assert_eq!(job["job_name"].as_str(), Some("fleetgate"));
    assert_eq!(job["metrics_path"].as_str(), Some("/metrics"));
    let targets = &mut job["static_configs"][0]["targets"];
    assert_eq!(
        targets[0].as_str(),
        Some("127.0.0.1:9090"),
        "the shipped config scrapes the default admin_listen"
    );
    *targets = serde_yaml::from_str(&format!("[\"{target}\"]")).unwrap();
    v["global"]["scrape_interval"] = "1s".into();
    v["global"]["scrape_timeout"] = "900ms".into();
    serde_yaml::to_string(&v).expect("serialize")
}

/// A Prometheus server on 127.0.0.1 with its data in a temp dir; killed when dropped (also
/// when the test fails).
struct Prometheus {
    child: Mutex<Child>,
    url: String,
    log: PathBuf,
    _dir: TempDir,
}

impl Prometheus {
    fn start(bin: &PathBuf, target: &str) -> Prometheus {
        let dir = TempDir::new("prometheus");
        let config = dir.path("prometheus.yml");
        std::fs::write(&config, scrape_config(target)).expect("write config");
        let log = dir.path("prometheus.log");
        let out = std::fs::File::create(&log).expect("log file");
        let port = free_port();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        Prometheus {
            child: Mutex::new(child),
            url: format!("http://127.0.0.1:{port}"),
            log,
            _dir: dir,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fail the test with Prometheus's own log when it exited.
    fn assert_running(&self) {
        let exited = self.child.lock().map(|mut c| c.try_wait());
        if let Ok(Ok(Some(status))) = exited {
            panic!("prometheus exited ({status}):\n{}", self.log_text());
        }
    }

    /// Run an instant query: `Err` for an API error (bad PromQL) or an unreachable server.
    async fn query(&self, q: &str) -> Result<Vec<(Value, f64)>, String> {
        let r = client()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", q)])
            .send()
            .await
            .map_err(|e| format!("query {q}: {e}"))?;
        let v: Value = r.json().await.map_err(|e| format!("query {q}: {e}"))?;
        if v["status"] != "success" {
            return Err(format!("query {q}: {v}"));
        }
        let value = |pair: &Value| {
            pair[1]
                .as_str()
                .and_then(|s| s.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        let data = &v["data"];
        Ok(match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| (s["metric"].clone(), value(&s["value"])))
                .collect(),
            Some("scalar") => vec![(Value::Null, value(&data["result"]))],
            _ => Vec::new(),
        })
    }

    /// The single value of a query that aggregates to one series.
    async fn value(&self, q: &str) -> Result<f64, String> {
        match self.query(q).await?.as_slice() {
            [(_, v)] => Ok(*v),
            other => Err(format!("{q}: expected one series, got {other:?}")),
        }
    }

    /// Poll `check` until it passes; fail with its last complaint and Prometheus's log.
    async fn eventually<T, F, Fut>(&self, what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        let deadline = Instant::now() + WAIT;
        loop {
            self.assert_running();
            match check().await {
                Ok(v) => return v,
                Err(e) if Instant::now() > deadline => panic!(
                    "{what}: not within {WAIT:?}: {e}\n--- prometheus log ---\n{}",
                    self.log_text()
                ),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let c = self.child.get_mut().unwrap_or_else(PoisonError::into_inner);
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn equals(want: f64) -> impl Fn(f64) -> Result<f64, String> {
    move |got| {
        if got == want {
            Ok(got)
        } else {
            Err(format!("{got}, want {want}"))
        }
    }
}

#[test]
fn real_prometheus_sees_the_requests_and_latency_and_every_dashboard_query() {
    let begun = Instant::now();
    let bin = prometheus_binary();
    if let Some(promtool) = bin
        .parent()
        .map(|d| d.join("promtool"))
        .filter(|p| p.is_file())
    {
        let out = Command::new(promtool)
            .args(["check", "config"])
            .arg(repo_path("conf/prometheus/prometheus.yml"))
            .output()
            .expect("promtool");
        assert!(
            out.status.success(),
            "promtool rejects the shipped config: {}",
            String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr)
        );
    }
    let rt = runtime();
    let f = ObservedFleet::start(&rt, "");
    let prom = Prometheus::start(&bin, &f.gw.admin.to_string());
    rt.block_on(async {
        // Prometheus scrapes the gateway before any traffic, so the first traffic is seen as
        // an increase by rate().
        let up = prom
            .eventually("the gateway is scraped", || async {
                prom.value(r#"up{job="fleetgate"}"#)
                    .await
                    .and_then(equals(1.0))
            })
            .await;
        println!("up{{job=\"fleetgate\"}} = {up} after {:?}", begun.elapsed());

        // Round 1 and the fleet events make every series exist; round 2 (and 40 chats) moves
        // the traffic series again.
        let mut sent = mixed_round(&f.gw).await;
        sent.add(fleet_events(&f).await);
        let first = sent.total() as f64;
        prom.eventually("round 1 is scraped", || async {
            prom.value("sum(fleetgate_proxy_requests_total)")
                .await
                .and_then(equals(first))
        })
        .await;
        sent.add(mixed_round(&f.gw).await);
        sent.add(chats(&f.gw, 40).await);

        let (total, ok, routed) = (sent.total() as f64, sent.ok as f64, sent.routed() as f64);
        let counted = prom
            .eventually("every request is counted", || async {
                prom.value("sum(fleetgate_proxy_requests_total)")
                    .await
                    .and_then(equals(total))
            })
            .await;
        println!("sum(fleetgate_proxy_requests_total) = {counted} (sent {total})");
        for (q, want) in [
            (r#"sum(fleetgate_proxy_requests_total{status="200"})"#, ok),
            (
                "sum(fleetgate_proxy_request_duration_seconds_count)",
                routed,
            ),
        ] {
            let got = prom
                .eventually(q, || async { prom.value(q).await.and_then(equals(want)) })
                .await;
            println!("{q} = {got}");
        }

        // The sim waits 30 ms before its first token: both medians lie in or above the
        // (0.025, 0.05] bucket, and far below a second on an idle loopback.
        for (name, family) in [
            ("latency", "fleetgate_proxy_request_duration_seconds"),
            ("TTFT", "fleetgate_proxy_time_to_first_token_seconds"),
        ] {
            let q = format!(
                "histogram_quantile(0.5, sum by (le) (rate({family}_bucket[{RATE_INTERVAL}])))"
            );
            let p50 = prom
                .eventually(&format!("{name} p50"), || async {
                    let v = prom.value(&q).await?;
                    if v.is_finite() && (0.025..=1.0).contains(&v) {
                        Ok(v)
                    } else {
                        Err(format!("{q} = {v}"))
                    }
                })
                .await;
            println!("{q} = {p50:.4}");
        }

        // Every dashboard query is valid PromQL for a real Prometheus and has data.
        let dash = dashboard();
        let all = queries(&dash);
        for query in &all {
            let q = expand_variables(&query.expr, RATE_INTERVAL);
            let series = prom
                .eventually(&format!("{}: data", query.at), || async {
                    let res = prom.query(&q).await?;
                    if res.iter().any(|(_, v)| v.is_finite()) {
                        Ok(res.len())
                    } else {
                        Err(format!("{q} returned no finite value: {res:?}"))
                    }
                })
                .await;
            println!("{}: {series} series", query.at);
        }
        println!(
            "{} dashboard queries have data; whole test {:?}",
            all.len(),
            begun.elapsed()
        );
    });
}
