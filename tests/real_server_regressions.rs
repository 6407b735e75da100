//! Regressions for what real llama.cpp servers showed (issue 15), over simulated nodes that
//! reproduce the behaviour: a chat template that adds tokens to every prompt.

mod common;

use common::*;
use serde_json::{json, Value};

fn chat(text: &str, max_tokens: u32) -> Value {
    json!({"model": "smol", "max_tokens": max_tokens,
           "messages": [{"role": "user", "content": text}]})
}

/// Item 1: short chats ("hi N", ~34 reported tokens of which ~25 are template) used to drag
/// chars-per-token from 4.0 to 1.0, and a long prompt the node can serve got a false 400.
#[test]
fn short_chats_do_not_collapse_the_token_estimate() {
    let rt = runtime();
    let node = sim(
        &rt,
        "seats: 4\ntokens_per_sec: 2000\nttft_ms: 1\nreply_tokens: 2\ntemplate_tokens: 25\nmodels:\n  - {name: smol, size_gb: 0.1, context: 4096, loaded: true}\n",
    );
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 600000\n{}",
        fleet(&[node_yaml(&node)])
    ));
    rt.block_on(async {
        let url = gw.url("/v1/chat/completions");
        for n in 0..40 {
            let r = client()
                .post(&url)
                .json(&chat(&format!("hi {n}"), 1))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let v: Value = r.json().await.unwrap();
            assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() >= 30, "{v}");
        }
        let status = admin_json(&gw, "/fleet/status").await;
        let cpt = status["chars_per_token"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e[0] == "smol"))
            .map(|e| e[1].as_f64().unwrap());
        assert!(cpt.is_none_or(|c| c > 3.5), "rate collapsed: {status:#}");
        // 13,847 characters: ~3,495 tokens on this node, inside its 4,096 window.
        let long = "abcd ".repeat(2769) + "xy";
        assert_eq!(long.len(), 13_847);
        let r = client()
            .post(&url)
            .json(&chat(&long, 8))
            .send()
            .await
            .unwrap();
        let st = r.status();
        assert_eq!(st, 200, "{}", r.text().await.unwrap());
        let v: Value = r.json().await.unwrap();
        let served = v["usage"]["prompt_tokens"].as_u64().unwrap();
        // The same prompt again is never estimated above what the node just served.
        let explain: Value = client()
            .post(gw.admin_url("/fleet/explain"))
            .json(&chat(&long, 8))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let est = explain["prompt_tokens"].as_u64().unwrap();
        assert!(est <= served, "estimated {est} > served {served}");
        assert!(est + 64 >= served, "estimated {est}, served {served}");
    });
}

fn node_yaml(s: &fleetgate::sim::SimHandle) -> String {
    node("tmpl", s, "")
}
