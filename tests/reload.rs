//! Config reload (POST /fleet/reload and SIGHUP): aliases, nodes added and drained, a bad file
//! changes nothing.

mod common;

use common::*;
use serde_json::{json, Value};

fn config(port: u16, alias_to: &str, nodes: &[String]) -> String {
    format!(
        "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:0\n  admin_token: secret\nhealth:\n  poll_interval_ms: 600000\nmodels:\n  aliases:\n    fast: {alias_to}\n{}",
        fleet(nodes)
    )
}

async fn ask(gw: &Gateway, model: &str) -> reqwest::Response {
    let body =
        json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    client()
        .post(gw.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn reload(gw: &Gateway) -> (u16, Value) {
    let r = client()
        .post(gw.admin_url("/fleet/reload"))
        .bearer_auth("secret")
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

fn health(status: &Value, id: &str) -> String {
    let n = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == id)
        .unwrap();
    n["health"].as_str().unwrap().to_string()
}

#[test]
fn reload_swaps_aliases_adds_and_drains_nodes_and_refuses_bad_files() {
    let rt = runtime();
    let spec = |m: &str| {
        format!("seats: 2\ntokens_per_sec: 1000\nttft_ms: 1\nreply_tokens: 4\nmodels:\n  - {{name: {m}, size_gb: 1, loaded: true}}\n")
    };
    let a = sim(&rt, &spec("one:1b"));
    let b = sim(&rt, &spec("two:1b"));
    let dir = std::env::temp_dir().join(format!("fleetgate-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fleetgate.yaml");
    let port = free_port();
    std::fs::write(&path, config(port, "one:1b", &[node("rl-a", &a, "")])).unwrap();
    let gw = Gateway::start_file(&path);
    rt.block_on(async {
        let r = ask(&gw, "fast").await;
        assert_eq!(r.headers()["x-fleet-node"], "rl-a");

        // No token: refused, nothing changes.
        let r = client()
            .post(gw.admin_url("/fleet/reload"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);

        // New file: the alias points elsewhere, rl-b joins, rl-a leaves (drained).
        std::fs::write(&path, config(port, "two:1b", &[node("rl-b", &b, "")])).unwrap();
        let (code, v) = reload(&gw).await;
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["report"]["added"], json!(["rl-b"]));
        assert_eq!(v["report"]["drained"], json!(["rl-a"]));
        // rl-b was polled as it joined: its model is known at once.
        let status = admin_json(&gw, "/fleet/status").await;
        assert_eq!(health(&status, "rl-a"), "draining");
        let r = ask(&gw, "fast").await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-fleet-node"], "rl-b");
        assert_eq!(r.headers()["x-fleet-served-model"], "two:1b");

        // A file that does not validate: 400 naming the field, the running config stays.
        std::fs::write(&path, "server:\n  lisen: nowhere\n").unwrap();
        let (code, v) = reload(&gw).await;
        assert_eq!(code, 400);
        assert!(v["errors"][0].as_str().unwrap().contains("lisen"), "{v}");
        assert_eq!(ask(&gw, "fast").await.headers()["x-fleet-node"], "rl-b");

        // SIGHUP does the same as the endpoint: rl-a is back, and serves the alias again.
        std::fs::write(
            &path,
            config(
                port,
                "one:1b",
                &[node("rl-a", &a, ""), node("rl-b", &b, "")],
            ),
        )
        .unwrap();
        let pid = std::process::id().to_string();
        assert!(std::process::Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success());
        eventually("rl-a online again after SIGHUP", || async {
            health(&admin_json(&gw, "/fleet/status").await, "rl-a") == "online"
        })
        .await;
        assert_eq!(ask(&gw, "fast").await.headers()["x-fleet-node"], "rl-a");

        let metrics = metrics(&gw).await;
        assert!(
            metrics.contains(r#"fleetgate_config_reloads_total{result="ok"} 2"#),
            "{metrics}"
        );
        assert!(metrics.contains(r#"fleetgate_config_reloads_total{result="error"} 1"#));
    });
    let _ = std::fs::remove_dir_all(&dir);
}
