//! Nodes the config describes as the same machine (the same `memory_gb`, `capacity` and
//! backend): the second laptop of a home lab, never tried yet, is priced as the first one
//! (measured 8x slower than the workstation), not as the model's best node, so it is not
//! handed a request while the workstation has seats free. `/fleet/explain` says so.

mod common;

use common::*;
use serde_json::{json, Value};

const WORKSTATION: &str = "seats: 8\ntokens_per_sec: 400\nttft_ms: 5\nmemory_gb: 64\nreply_tokens: 40\nmodels:\n  - {name: small:3b, size_gb: 2, loaded: true}\n";
const LAPTOP: &str = "seats: 2\ntokens_per_sec: 50\nttft_ms: 5\nmemory_gb: 8\nreply_tokens: 40\nmodels:\n  - {name: small:3b, size_gb: 2, loaded: true}\n";

fn ask(text: &str) -> Value {
    json!({"model": "small:3b", "stream": true, "max_tokens": 40,
        "messages": [{"role": "user", "content": text}]})
}

/// Stream one answer (pinned to `pin` when given); the node that served it.
async fn stream(gw: &Gateway, text: &str, pin: Option<&str>) -> String {
    let mut r = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&ask(text));
    if let Some(node) = pin {
        r = r.header("x-fleet-pin-node", node);
    }
    let r = r.send().await.expect("send");
    assert_eq!(r.status(), 200);
    let node = r.headers()["x-fleet-node"].to_str().unwrap().to_string();
    assert!(r.text().await.unwrap().contains("[DONE]"));
    node
}

#[test]
fn an_untried_laptop_is_priced_as_its_twin_not_as_the_workstation() {
    let rt = runtime();
    let ws = sim(&rt, WORKSTATION);
    let (l1, l2) = (sim(&rt, LAPTOP), sim(&rt, LAPTOP));
    let laptop = "      capacity: 2\n      memory_gb: 8\n";
    let gw = Gateway::start(&fleet(&[
        node(
            "workstation",
            &ws,
            "      capacity: 8\n      memory_gb: 64\n",
        ),
        node("laptop-1", &l1, laptop),
        node("laptop-2", &l2, laptop),
    ]));
    rt.block_on(async {
        // What the gateway has seen: the workstation, and the first laptop (8x slower).
        for i in 0..3 {
            stream(&gw, &format!("warm-up {i}"), Some("workstation")).await;
        }
        stream(&gw, "a laptop", Some("laptop-1")).await;
        // The client has [DONE] a moment before the gateway has accounted the answer.
        let learned = |r: &Value| {
            r["table"].as_array().is_some_and(|t| {
                t.iter()
                    .any(|row| row["node"] == "laptop-1" && row["observed"].as_u64() > Some(0))
            })
        };
        eventually("laptop-1's answer learned", || async {
            learned(&explain(&gw, "/fleet/explain", &ask("which node?")).await)
        })
        .await;
        let report = explain(&gw, "/fleet/explain", &ask("which node?")).await;
        let row = |node: &str| {
            report["table"]
                .as_array()
                .and_then(|t| t.iter().find(|r| r["node"] == node))
                .cloned()
                .unwrap_or_else(|| panic!("no row for {node}: {report:#}"))
        };
        let (first, second) = (row("laptop-1"), row("laptop-2"));
        assert_eq!(second["twin"], true, "{second:#}");
        let tps = |r: &Value| r["decode_tps"].as_f64().unwrap();
        assert!(
            (tps(&second) - tps(&first)).abs() < 1e-6,
            "laptop-2 is priced as laptop-1: {second:#} {first:#}"
        );
        // Four at once: the workstation has 8 seats; the untried laptop gets none of them.
        let texts: Vec<String> = (0..4).map(|i| format!("question {i}")).collect();
        let asks = texts.iter().map(|t| stream(&gw, t, None));
        let nodes = futures::future::join_all(asks).await;
        assert!(nodes.iter().all(|n| n == "workstation"), "{nodes:?}");
        assert_eq!(served(&l2), 0, "the untried laptop was not tried");
    });
}
