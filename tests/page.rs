//! The fleet page in a real browser: headless Debian chromium (through chromedriver) loads the
//! admin listener's page against a running gateway with sim nodes, sees the node rows, watches
//! the served counter move as traffic flows (live refresh, same page load), opens a decision's
//! explain table, pauses a node through the token dialog, and saves a screenshot.

mod browser;
mod common;

use common::*;
use serde_json::{json, Value};

const SIM: &str = "seats: 2\ntokens_per_sec: 400\nttft_ms: 15\nmemory_gb: 64\nreply_tokens: 12\nmodels:\n  - {name: llama3.2:3b, size_gb: 2, loaded: true, context: 8192}\n  - {name: qwen2.5:7b, size_gb: 4.7, context: 32768, cold_load_ms: 20}\n";
const TOKEN: &str = "page-secret";

async fn chat(gw: &Gateway, model: &str) -> u16 {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "Hello fleet"}]});
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("chat");
    let status = r.status().as_u16();
    let _ = r.bytes().await;
    status
}

fn text_of(css: &str) -> String {
    format!("const e = document.querySelector({css:?}); return e ? e.textContent : null;")
}

#[test]
fn the_fleet_page_shows_nodes_live_traffic_decisions_and_pauses_a_node() {
    let rt = runtime();
    let (a, b) = (sim(&rt, SIM), sim(&rt, SIM));
    let gw = Gateway::start(&format!(
        "  admin_token: {TOKEN}\nhealth:\n  poll_interval_ms: 200\n{}",
        fleet(&[
            node("workstation", &a, "      tags: [vision]\n"),
            node("laptop", &b, "      tier: provisional\n"),
        ])
    ));
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fleet-page.png");
    rt.block_on(async {
        let br = browser::Browser::start(1400, 1100).await;
        br.goto(&gw.admin_url("/")).await;
        let rows = br
            .wait_for(
                "two node rows, both online",
                "const r = [...document.querySelectorAll('tr.node')];
                 return r.length === 2 && r.every(x => x.querySelector('.state').textContent.startsWith('online'))
                   ? r.map(x => x.dataset.node) : null;",
            )
            .await;
        assert_eq!(rows, json!(["workstation", "laptop"]));
        let tier = br
            .eval(&text_of("tr.node[data-node=laptop] td.tier"))
            .await;
        assert_eq!(tier, "provisional");
        assert_eq!(br.eval(&text_of("#served-total")).await, "0");

        // Traffic while the page stays open: the counter moves by itself.
        for model in ["llama3.2:3b", "llama3.2:3b", "llama3.2:3b", "qwen2.5:7b"] {
            assert_eq!(chat(&gw, model).await, 200);
        }
        br.wait_for(
            "served counter at 4",
            "return document.querySelector('#served-total').textContent === '4';",
        )
        .await;
        let served: u32 = br
            .eval(
                "return [...document.querySelectorAll('tr.traffic td.served')]
                   .reduce((a, td) => a + Number(td.textContent), 0);",
            )
            .await
            .as_u64()
            .expect("served cells") as u32;
        assert_eq!(served, 4, "per node:model traffic rows add up");

        // The newest decision, opened: an explain row per node for its model.
        br.click("details.decision summary").await;
        let explain = br
            .wait_for(
                "the explain table of the newest decision",
                "const d = document.querySelector('details.decision');
                 if (!d || !d.open) return null;
                 return [...d.querySelectorAll('table.explain tbody tr')].map(tr => tr.cells[0].textContent + ' ' + tr.cells[2].textContent);",
            )
            .await;
        let rows: Vec<String> = serde_json::from_value(explain).expect("rows");
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert!(rows.iter().any(|r| r.ends_with("winner")), "{rows:?}");

        // Pause the laptop: a wrong token is refused and changes nothing, the right one pauses.
        br.click("tr.node[data-node=laptop] button.pause").await;
        br.type_into("#token-input", "wrong").await;
        br.click("#token-ok").await;
        br.wait_for(
            "the refusal",
            "const t = document.querySelector('#toast'); return !t.hidden && t.textContent.includes('refused');",
        )
        .await;
        let laptop = |s: Value| s["nodes"][1]["control"]["paused"].clone();
        assert_eq!(laptop(admin_json(&gw, "/fleet/status").await), false);
        br.click("tr.node[data-node=laptop] button.pause").await;
        br.type_into("#token-input", TOKEN).await;
        br.click("#token-ok").await;
        br.wait_for(
            "the laptop shown paused",
            "const s = document.querySelector('tr.node[data-node=laptop] .state');
             return s && s.textContent.startsWith('paused');",
        )
        .await;
        assert_eq!(laptop(admin_json(&gw, "/fleet/status").await), true);
        // After the toast is gone from the shot's way, one more request for the picture.
        assert_eq!(chat(&gw, "llama3.2:3b").await, 200);
        br.wait_for(
            "served counter at 5",
            "return document.querySelector('#served-total').textContent === '5';",
        )
        .await;
        br.screenshot(&shot).await;
    });
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    println!("screenshot: {}", shot.display());
}
