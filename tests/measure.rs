//! First measurements (`services::measure`): a fresh gateway in completion mode asks each
//! model a node holds in memory once for a short answer, so the first client request of a
//! small model goes to the fast workstation, not to a laptop priced as a typical node. A model
//! on disk only is not asked (that would load it); spec 000's mode asks nothing.

mod common;

use common::*;
use fleetgate::sim::SimHandle;
use serde_json::{json, Value};

const WORKSTATION: &str = "seats: 8\ntokens_per_sec: 400\nprefill_tokens_per_sec: 20000\nttft_ms: 5\nmemory_gb: 64\nreply_tokens: 40\nmodels:\n  - {name: small:3b, size_gb: 2, loaded: true}\n  - {name: mid:14b, size_gb: 9, cold_load_ms: 300}\n";
const LAPTOP: &str = "seats: 2\ntokens_per_sec: 50\nprefill_tokens_per_sec: 2500\nttft_ms: 5\nmemory_gb: 8\nreply_tokens: 40\nmodels:\n  - {name: small:3b, size_gb: 2, loaded: true}\n";

fn ask(text: &str) -> Value {
    json!({"model": "small:3b", "stream": true, "max_tokens": 40,
        "messages": [{"role": "user", "content": text}]})
}

/// The explain table's row for `node`.
fn row(report: &Value, node: &str) -> Option<Value> {
    report["table"]
        .as_array()?
        .iter()
        .find(|r| r["node"] == node)
        .cloned()
}

fn gateway(mode: &str, sims: &[&SimHandle]) -> Gateway {
    // The laptops first: with nothing known, config order would favour them.
    let nodes = [
        node(
            "laptop-1",
            sims[0],
            "      capacity: 2\n      memory_gb: 8\n",
        ),
        node(
            "laptop-2",
            sims[1],
            "      capacity: 2\n      memory_gb: 8\n",
        ),
        node(
            "workstation",
            sims[2],
            "      capacity: 8\n      memory_gb: 64\n",
        ),
    ];
    Gateway::start(&format!(
        "health:\n  poll_interval_ms: 200\nrouting:\n  mode: {mode}\n  policy:\n    completion_measure: true\n{}",
        fleet(&nodes)
    ))
}

#[test]
fn a_fresh_gateway_measures_each_loaded_model_once_and_sends_the_first_request_to_the_fast_node() {
    let rt = runtime();
    let (l1, l2, ws) = (sim(&rt, LAPTOP), sim(&rt, LAPTOP), sim(&rt, WORKSTATION));
    let gw = gateway("completion", &[&l1, &l2, &ws]);
    rt.block_on(async {
        // No client request yet: every loaded pair is measured by the gateway itself (two
        // prompt lengths: each node read the first within half a second).
        let measured = |r: &Value| {
            ["laptop-1", "laptop-2", "workstation"]
                .iter()
                .all(|n| row(r, n).is_some_and(|x| x["observed"].as_u64() == Some(2)))
        };
        eventually("every loaded pair measured", || async {
            measured(&explain(&gw, "/fleet/explain", &ask("which node?")).await)
        })
        .await;
        let report = explain(&gw, "/fleet/explain", &ask("which node?")).await;
        let rate = |n: &str, what: &str| row(&report, n).unwrap()[what].as_f64().unwrap();
        let (ws_tps, laptop_tps) = (rate("workstation", "decode_tps"), rate("laptop-1", "decode_tps"));
        // The sims decode at 400 and 50 tokens/s ...
        assert!(
            (300.0..=500.0).contains(&ws_tps) && (35.0..=65.0).contains(&laptop_tps),
            "measured decode rates: workstation {ws_tps}, laptop {laptop_tps}: {report:#}"
        );
        // ... and prefill at 20,000 and 2,500: two prompt lengths give the line, not a floor.
        let (ws_pf, laptop_pf) = (rate("workstation", "prefill_tps"), rate("laptop-1", "prefill_tps"));
        assert!(
            (14_000.0..=26_000.0).contains(&ws_pf) && (1_800.0..=3_200.0).contains(&laptop_pf),
            "measured prefill rates: workstation {ws_pf}, laptop {laptop_pf}: {report:#}"
        );
        for (name, s) in [("laptop-1", &l1), ("laptop-2", &l2), ("workstation", &ws)] {
            let by_model = s.control().stats().by_model;
            // Both read the first prompt within half a second: a longer one follows.
            assert_eq!(
                by_model.get("small:3b").copied(),
                Some(2),
                "{name} was asked twice (two prompt lengths) for its loaded model: {by_model:?}"
            );
            assert_eq!(
                by_model.get("mid:14b"),
                None,
                "{name}: a model on disk only is not loaded to be measured"
            );
        }
        let metrics = metrics(&gw).await;
        assert!(
            metrics.contains(r#"fleetgate_routing_measurements_total{model="small:3b",node="workstation",outcome="learned"} 2"#),
            "counted: {}",
            metrics.lines().filter(|l| l.contains("measurements")).collect::<Vec<_>>().join("\n")
        );
        // The first client request goes where it finishes first.
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .json(&ask("hello"))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-fleet-node"], "workstation");
        assert!(r.text().await.unwrap().contains("[DONE]"));
    });
    // Asked once per process: later passes (every poll interval, 200 ms) do not ask again.
    std::thread::sleep(std::time::Duration::from_millis(1000));
    assert_eq!(
        served(&l1),
        2,
        "laptop-1 measured once (two prompts), no client request"
    );
}

#[test]
fn spec_000_mode_sends_the_nodes_nothing_of_its_own() {
    let rt = runtime();
    let (l1, l2, ws) = (sim(&rt, LAPTOP), sim(&rt, LAPTOP), sim(&rt, WORKSTATION));
    let gw = gateway("spec", &[&l1, &l2, &ws]);
    // Several poll intervals (200 ms), nothing asked.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(gw.fleet.nodes().iter().all(|n| n.live.lock().polled));
    for s in [&l1, &l2, &ws] {
        assert_eq!(served(s), 0, "spec 000's mode measures nothing");
    }
}

/// A bare HTTP/1.1 node on 127.0.0.1: each connection's request head goes, with the stream, to
/// `answer`, which writes the reply (`connection: close`).
async fn bare_node<F, Fut>(answer: F) -> std::net::SocketAddr
where
    F: Fn(String, tokio::net::TcpStream) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                answer(String::from_utf8_lossy(&buf).to_string(), s).await;
            });
        }
    });
    addr
}

/// `m:1b` listed on disk and loaded (`/api/tags`, `/api/ps`): what a poll reads.
const LISTED: &str = r#"{"models":[{"name":"m:1b","size":1000000000,"context_length":8192}]}"#;

/// Write a whole reply: 200 with `body` (JSON), or 404 with none.
async fn reply(s: &mut tokio::net::TcpStream, body: Option<&str>) {
    use tokio::io::AsyncWriteExt;
    let head = match body {
        Some(b) => format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}",
            b.len()
        ),
        None => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".into(),
    };
    let _ = s.write_all(head.as_bytes()).await;
}

fn polled(head: &str) -> bool {
    head.starts_with("GET /api/tags") || head.starts_with("GET /api/ps")
}

/// A bare Ollama-speaking node that holds `m:1b` and, asked to chat, streams one token every
/// 5 ms for ever (it ignores `num_predict`); counts the tokens it wrote and whether the
/// client hung up.
async fn endless_node(
    written: std::sync::Arc<std::sync::atomic::AtomicU64>,
    hung_up: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::net::SocketAddr {
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncWriteExt;
    bare_node(move |head: String, mut s: tokio::net::TcpStream| {
        let (written, hung_up) = (written.clone(), hung_up.clone());
        async move {
            if polled(&head) {
                return reply(&mut s, Some(LISTED)).await;
            }
            if !head.starts_with("POST /api/chat") {
                return reply(&mut s, None).await;
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
                .await;
            let line = "{\"model\":\"m:1b\",\"message\":{\"role\":\"assistant\",\"content\":\"x\"},\"done\":false}\n";
            let frame = format!("{:x}\r\n{line}\r\n", line.len());
            loop {
                if s.write_all(frame.as_bytes()).await.is_err() {
                    hung_up.store(true, Ordering::SeqCst);
                    return;
                }
                written.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    })
    .await
}

#[test]
fn a_node_that_ignores_the_token_limit_is_hung_up_on_and_still_measured() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let rt = runtime();
    let (written, hung_up) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let addr = rt.block_on(endless_node(written.clone(), hung_up.clone()));
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 200\nrouting:\n  policy:\n    completion_measure: true\n{}",
        fleet(&[format!(
            "    - id: endless\n      url: http://{addr}\n      backend: ollama\n      capacity: 2\n      memory_gb: 8\n"
        )])
    ));
    rt.block_on(async {
        eventually("the endless answer hung up on", || async {
            hung_up.load(Ordering::SeqCst)
        })
        .await;
        let tokens = written.load(Ordering::SeqCst);
        assert!(
            tokens <= 300,
            "the gateway read {tokens} tokens of an answer it asked 16 of"
        );
        let ask = json!({"model": "m:1b", "messages": [{"role": "user", "content": "hi"}]});
        let report = explain(&gw, "/fleet/explain", &ask).await;
        let r = row(&report, "endless").expect("a row for the node");
        // One token every 5 ms (plus the sleep's slack): ~100-200 tokens/s.
        let tps = r["decode_tps"].as_f64().unwrap_or(0.0);
        assert!(
            r["observed"].as_u64() >= Some(1) && (50.0..=250.0).contains(&tps),
            "measured from what was read: {r:#}"
        );
    });
}

#[test]
fn a_pair_measured_before_a_restart_is_not_asked_again() {
    let rt = runtime();
    let ws = sim(&rt, WORKSTATION);
    let dir = std::env::temp_dir().join(format!("fleetgate-measure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let yaml = format!(
        "health:\n  poll_interval_ms: 200\nlearning:\n  state_dir: {}\n  save_interval_s: 1\nrouting:\n  policy:\n    completion_measure: true\n{}",
        dir.display(),
        fleet(&[node(
            "workstation",
            &ws,
            "      capacity: 8\n      memory_gb: 64\n"
        )])
    );
    {
        let _gw = Gateway::start(&yaml);
        // Both prompts answered and learned, then saved (every second).
        rt.block_on(eventually("the rates saved", || async {
            std::fs::read_to_string(dir.join("rates.json")).is_ok_and(|t| {
                let t = t.replace(' ', "");
                t.contains("workstation/small:3b") && t.contains("\"observed\":2")
            })
        }));
    }
    assert_eq!(
        served(&ws),
        2,
        "measured once (two prompts) by the first gateway"
    );
    let gw = Gateway::start(&yaml);
    rt.block_on(async {
        let report = explain(&gw, "/fleet/explain", &ask("which node?")).await;
        let r = row(&report, "workstation").expect("a row");
        assert!(r["observed"].as_u64() > Some(0), "rates restored: {r:#}");
    });
    // Several passes (200 ms): the restored rates say it was measured.
    std::thread::sleep(std::time::Duration::from_millis(1000));
    assert_eq!(served(&ws), 2, "not asked again after the restart");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A gateway in completion mode over `nodes` given by URL only (`backend: openai`), once each
/// has a measured answer, and several passes (200 ms) later: nothing more is asked once a
/// node has answered.
fn measured_by_url(rt: &tokio::runtime::Runtime, nodes: &[(&str, &SimHandle)]) -> Gateway {
    let by_url: Vec<String> = nodes.iter().map(|(id, s)| node_by_url(id, s)).collect();
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 200\nrouting:\n  policy:\n    completion_measure: true\n{}",
        fleet(&by_url)
    ));
    rt.block_on(async {
        eventually("every node measured", || async {
            let r = explain(&gw, "/fleet/explain", &ask("which node?")).await;
            nodes
                .iter()
                .all(|(n, _)| row(&r, n).is_some_and(|x| x["observed"].as_u64() >= Some(1)))
        })
        .await;
    });
    std::thread::sleep(std::time::Duration::from_millis(1000));
    gw
}

/// A node known by its URL only that lists several models (`backend: openai` hides its loads:
/// asking for each could load each in turn) is measured on one, the model most of the fleet
/// lists, which gives its pace against the others: the workstation on `small:3b`, which the
/// laptop lists too, not on `mid:14b` (first by name, on its disk only: asking would load it).
/// Before, it was not measured at all, and its first requests were priced as the laptop's.
#[test]
fn a_node_known_by_its_url_only_that_lists_several_models_is_measured_on_the_one_the_fleet_shares()
{
    let rt = runtime();
    let (ws, laptop) = (sim(&rt, WORKSTATION), sim(&rt, LAPTOP));
    let _gw = measured_by_url(&rt, &[("laptop", &laptop), ("ws", &ws)]);
    let asked = ws.control().stats().by_model;
    assert_eq!(asked.get("mid:14b"), None, "mid:14b not asked: {asked:?}");
    assert!(ws.control().stats().loads.is_empty(), "nothing loaded");
    assert_eq!(
        asked.get("small:3b"),
        Some(&3),
        "the wake, then two prompt lengths: {asked:?}"
    );
}

/// Two servers known by their URLs only that list the same three models: each holds all as
/// far as the other can tell (such a node hides its loads), so none is the fleet's more.
/// Each is measured on the smallest, `small:3b` (the parameters its name states), not on
/// `mid:14b`, first by name, which asking would load (9 GB, over the model its users run), nor
/// on `assistant`, whose size nothing states (it could be the largest).
#[test]
fn of_models_the_fleet_shares_alike_a_node_known_by_its_url_is_measured_on_the_smallest() {
    let rt = runtime();
    let three = format!("{WORKSTATION}  - {{name: assistant, size_gb: 40, loaded: true}}\n");
    let (a, b) = (sim(&rt, &three), sim(&rt, &three));
    let _gw = measured_by_url(&rt, &[("ws-a", &a), ("ws-b", &b)]);
    for ws in [&a, &b] {
        let stats = ws.control().stats();
        assert_eq!(stats.by_model.get("mid:14b"), None, "{:?}", stats.by_model);
        assert_eq!(
            stats.by_model.get("assistant"),
            None,
            "{:?}",
            stats.by_model
        );
        assert!(stats.loads.is_empty(), "nothing loaded: {:?}", stats.loads);
        assert_eq!(
            stats.by_model.get("small:3b"),
            Some(&3),
            "{:?}",
            stats.by_model
        );
    }
}

/// A server known by its URL only that lists one model, asleep: its first answer waits
/// 1.5 s for the model to load, and nothing says so. The gateway wakes it with a first ask it
/// does not learn from, then measures: the rates are the node's, not the wake's.
#[test]
fn a_single_model_node_known_by_its_url_only_is_woken_then_measured() {
    let rt = runtime();
    let asleep = LAPTOP.replace("loaded: true}", "cold_load_ms: 1500}");
    let node = sim(&rt, &asleep);
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 200\nrouting:\n  policy:\n    completion_measure: true\n{}",
        fleet(&[node_by_url("by-url", &node)])
    ));
    rt.block_on(async {
        let report = || async { explain(&gw, "/fleet/explain", &ask("which node?")).await };
        eventually("the pair measured", || async {
            row(&report().await, "by-url").is_some_and(|x| x["observed"].as_u64() == Some(2))
        })
        .await;
        let r = report().await;
        let rate = |what: &str| row(&r, "by-url").unwrap()[what].as_f64().unwrap();
        // The sim decodes at 50 tokens/s and prefills at 2,500; the wake's 1.5 s taken for a
        // ~490-token prefill would have said ~330.
        let (decode, prefill) = (rate("decode_tps"), rate("prefill_tps"));
        assert!(
            (35.0..=65.0).contains(&decode) && (1_800.0..=3_200.0).contains(&prefill),
            "measured decode {decode}, prefill {prefill}: {r:#}"
        );
    });
    assert_eq!(served(&node), 3, "the wake, then two prompt lengths");
}

/// A bare Ollama-speaking node that lists `m:1b` as loaded and answers a chat with a reply
/// whose final line says it waited `load_ms` for a load (`/api/ps` was stale).
async fn loading_node(load_ms: u64) -> std::net::SocketAddr {
    bare_node(move |head: String, mut s: tokio::net::TcpStream| async move {
        if polled(&head) {
            return reply(&mut s, Some(LISTED)).await;
        }
        if !head.starts_with("POST /api/chat") {
            return reply(&mut s, None).await;
        }
        let mut lines = String::new();
        for _ in 0..16 {
            lines.push_str("{\"model\":\"m:1b\",\"message\":{\"role\":\"assistant\",\"content\":\"x\"},\"done\":false}\n");
        }
        lines.push_str(&format!(
            "{{\"model\":\"m:1b\",\"done\":true,\"load_duration\":{},\"prompt_eval_count\":300,\"prompt_eval_duration\":10000000,\"eval_count\":16,\"eval_duration\":80000000}}\n",
            load_ms * 1_000_000
        ));
        reply(&mut s, Some(&lines)).await
    })
    .await
}

#[test]
fn an_answer_that_waited_for_a_load_teaches_nothing() {
    let rt = runtime();
    let addr = rt.block_on(loading_node(2_500));
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 200\nrouting:\n  policy:\n    completion_measure: true\n{}",
        fleet(&[format!(
            "    - id: stale\n      url: http://{addr}\n      backend: ollama\n      capacity: 2\n      memory_gb: 8\n"
        )])
    ));
    rt.block_on(async {
        let counted = || async {
            metrics(&gw).await.contains(r#"fleetgate_routing_measurements_total{model="m:1b",node="stale",outcome="load"} 1"#)
        };
        eventually("the measurement counted as a load", counted).await;
        let ask = json!({"model": "m:1b", "messages": [{"role": "user", "content": "hi"}]});
        let report = explain(&gw, "/fleet/explain", &ask).await;
        let r = row(&report, "stale").expect("a row for the node");
        assert_eq!(r["observed"].as_u64(), Some(0), "nothing learned: {r:#}");
    });
    // Not asked again: a load is an answer, only not one to learn from.
    std::thread::sleep(std::time::Duration::from_millis(800));
    let text = rt.block_on(metrics(&gw));
    assert!(
        text.contains(
            r#"fleetgate_routing_measurements_total{model="m:1b",node="stale",outcome="load"} 1"#
        ),
        "asked once"
    );
}

/// A node that holds nothing in memory (nobody uses it) but has on disk a model the fleet is
/// asked for is loaded with it in the background once a request for it comes, and timed, so
/// routing learns it is the fast one: before, it was priced as the slow node that had been
/// measured plus a load guessed from the model's size, and every request stayed on the slow
/// node until its queue cost more than that guess. A node that holds another model is not
/// loaded to be timed (that model's answers time it; spare loads, which would load it there
/// as the faster node, are off here).
#[test]
fn an_empty_node_with_the_model_on_disk_is_loaded_and_timed_once_the_model_is_asked_for() {
    const SLOW: &str = "seats: 4\ntokens_per_sec: 40\nprefill_tokens_per_sec: 1000\nttft_ms: 5\nmemory_gb: 16\nreply_tokens: 40\nmodels:\n  - {name: mid:14b, size_gb: 9, loaded: true}\n";
    const FAST: &str = "seats: 4\ntokens_per_sec: 400\nprefill_tokens_per_sec: 20000\nttft_ms: 5\nmemory_gb: 32\nreply_tokens: 40\nmodels:\n  - {name: mid:14b, size_gb: 9, cold_load_ms: 300}\n";
    const BUSY: &str = "seats: 4\ntokens_per_sec: 400\nprefill_tokens_per_sec: 20000\nttft_ms: 5\nmemory_gb: 32\nreply_tokens: 40\nmodels:\n  - {name: small:3b, size_gb: 2, loaded: true}\n  - {name: mid:14b, size_gb: 9, cold_load_ms: 300}\n";
    let rt = runtime();
    let (slow, fast, other) = (sim(&rt, SLOW), sim(&rt, FAST), sim(&rt, BUSY));
    let nodes = [
        node("slow", &slow, "      capacity: 4\n      memory_gb: 16\n"),
        node("fast", &fast, "      capacity: 4\n      memory_gb: 32\n"),
        node("other", &other, "      capacity: 4\n      memory_gb: 32\n"),
    ];
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 200\nrouting:\n  mode: completion\n  policy:\n    completion_measure: true\n    completion_spare_loads: false\n{}",
        fleet(&nodes)
    ));
    let mid = |text: &str| {
        json!({"model": "mid:14b", "stream": true, "max_tokens": 40,
            "messages": [{"role": "user", "content": text}]})
    };
    let send = |body: Value| {
        let gw = &gw;
        async move {
            let r = client()
                .post(gw.url("/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .expect("send");
            assert_eq!(r.status(), 200);
            let node = r.headers()["x-fleet-node"].to_str().unwrap().to_string();
            r.text().await.unwrap();
            node
        }
    };
    rt.block_on(async {
        eventually("the slow node measured", || async {
            let r = explain(&gw, "/fleet/explain", &mid("which node?")).await;
            row(&r, "slow").is_some_and(|x| x["observed"].as_u64() >= Some(1))
        })
        .await;
        assert!(
            fast.control().stats().loads.is_empty(),
            "not loaded unasked"
        );
        assert_eq!(send(mid("first")).await, "slow", "the only node known");
        eventually("the empty node loaded and timed", || async {
            let r = explain(&gw, "/fleet/explain", &mid("which node?")).await;
            row(&r, "fast").is_some_and(|x| x["observed"].as_u64() >= Some(1))
        })
        .await;
        assert_eq!(send(mid("second")).await, "fast", "where it finishes first");
    });
    let loads = other.control().stats().loads;
    assert!(loads.is_empty(), "a node holding another model: {loads:?}");
}
