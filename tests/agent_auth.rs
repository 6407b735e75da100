//! Forged heartbeats: agent tokens speak for one node, a heartbeat never moves a configured
//! node, the operator can clear an agent's state, and the gateway will not register itself.

mod common;

use common::*;
use fleetgate::admin::auth::node_token;
use serde_json::{json, Value};

const SIM: &str = "seats: 2\ntokens_per_sec: 2000\nttft_ms: 1\nmemory_gb: 64\nreply_tokens: 4\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true}\n";
const SECRET: &str = "agent-secret";
const ADMIN: &str = "admin-secret";

async fn heartbeat(gw: &Gateway, token: &str, body: Value) -> (u16, Value) {
    let r = client()
        .post(gw.admin_url("/fleet/nodes/heartbeat"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn hb(id: &str, url: &str, pressure: &str) -> Value {
    json!({"node_id": id, "backend_url": url, "backend": "sim", "pressure": pressure})
}

/// A chat pinned to `node`: (status, serving node).
async fn ask(gw: &Gateway, node: &str) -> (u16, String) {
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("x-fleet-pin-node", node)
        .json(&json!({"model": "m:1b", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let node = r
        .headers()
        .get("x-fleet-node")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (r.status().as_u16(), node)
}

#[test]
fn a_token_speaks_for_its_own_node_only_and_the_operator_can_clear_agent_state() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let b = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "  admin_token: {ADMIN}\n{}",
        fleet(&[node("fa-a", &a, ""), node("fa-b", &b, "")])
            .replace("fleet:\n", &format!("fleet:\n  agent_token: {SECRET}\n"))
    ));
    let b_token = node_token(SECRET, "fa-b");
    let bogus = "http://127.0.0.1:1";
    rt.block_on(async {
        // b's agent (or the shared secret) forging a critical heartbeat for a: refused.
        for forged in [b_token.as_str(), SECRET] {
            let (st, _) = heartbeat(&gw, forged, hb("fa-a", bogus, "critical")).await;
            assert_eq!(st, 401, "token {forged} for fa-a");
        }
        assert_eq!(ask(&gw, "fa-a").await, (200, "fa-a".into()));
        // b's own heartbeat with its token is taken, and a wrong backend_url moves nothing.
        let (st, body) = heartbeat(&gw, &b_token, hb("fa-b", bogus, "normal")).await;
        assert_eq!(st, 200, "{body}");
        assert_eq!(ask(&gw, "fa-b").await, (200, "fa-b".into()));
        // The operator's token speaks for any node; then the node stops heartbeating and is
        // out (pressure critical) until the operator clears its agent state.
        let (st, _) = heartbeat(&gw, ADMIN, hb("fa-a", bogus, "critical")).await;
        assert_eq!(st, 200);
        assert_eq!(ask(&gw, "fa-a").await.0, 503);
        let forget = |token: &'static str| {
            client()
                .post(gw.admin_url("/fleet/nodes/fa-a/forget-agent"))
                .bearer_auth(token)
                .send()
        };
        assert_eq!(forget(SECRET).await.unwrap().status(), 401);
        let r = forget(ADMIN).await.unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["forgotten_heartbeats"], 1, "{v}");
        assert_eq!(ask(&gw, "fa-a").await, (200, "fa-a".into()));
    });
}

#[test]
fn registering_the_gateways_own_listener_is_refused() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "  admin_token: {ADMIN}\nfleet:\n  allow_registration: true\n  nodes:\n{}",
        node("ol-a", &a, "")
    ));
    rt.block_on(async {
        for (id, addr) in [("loop-proxy", gw.addr), ("loop-admin", gw.admin)] {
            let url = format!("http://127.0.0.1:{}", addr.port());
            let (st, body) = heartbeat(&gw, ADMIN, hb(id, &url, "normal")).await;
            assert_eq!(st, 400, "{body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("own listener"),
                "{body}"
            );
        }
        let st = admin_json(&gw, "/fleet/status").await;
        assert_eq!(st["nodes"].as_array().unwrap().len(), 1, "{st}");
        // A real node registers.
        let url = format!("http://{}", a.addr());
        let (st, body) = heartbeat(&gw, ADMIN, hb("ol-new", &url, "normal")).await;
        assert_eq!(st, 200, "{body}");
    });
}
