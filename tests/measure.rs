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
        // No client request yet: every loaded pair is measured by the gateway itself.
        let measured = |r: &Value| {
            ["laptop-1", "laptop-2", "workstation"]
                .iter()
                .all(|n| row(r, n).is_some_and(|x| x["observed"].as_u64() > Some(0)))
        };
        eventually("every loaded pair measured", || async {
            measured(&explain(&gw, "/fleet/explain", &ask("which node?")).await)
        })
        .await;
        let report = explain(&gw, "/fleet/explain", &ask("which node?")).await;
        let tps = |n: &str| row(&report, n).unwrap()["decode_tps"].as_f64().unwrap();
        let (ws_tps, laptop_tps) = (tps("workstation"), tps("laptop-1"));
        // The sims decode at 400 and 50 tokens/s.
        assert!(
            (300.0..=500.0).contains(&ws_tps) && (35.0..=65.0).contains(&laptop_tps),
            "measured decode rates: workstation {ws_tps}, laptop {laptop_tps}: {report:#}"
        );
        for (name, s) in [("laptop-1", &l1), ("laptop-2", &l2), ("workstation", &ws)] {
            let by_model = s.control().stats().by_model;
            assert_eq!(
                by_model.get("small:3b").copied(),
                Some(1),
                "{name} was asked once for its loaded model: {by_model:?}"
            );
            assert_eq!(
                by_model.get("mid:14b"),
                None,
                "{name}: a model on disk only is not loaded to be measured"
            );
        }
        let metrics = client()
            .get(gw.admin_url("/metrics"))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains(r#"fleetgate_routing_measurements_total{model="small:3b",node="workstation",outcome="learned"} 1"#),
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
    assert_eq!(served(&l1), 1, "laptop-1 asked once, no client request");
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
