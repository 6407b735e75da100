//! The routing engine on a live simulated fleet: cases where the naive pick is wrong.

mod common;

use common::*;
use serde_json::{json, Value};

/// These tests pin spec 000's point system end to end (`routing.mode: spec`; the default is
/// completion mode, tested in `prefix_affinity.rs` and `routing::completion_tests`).
const QUIET: &str = "health:\n  poll_interval_ms: 600000\nrouting:\n  mode: spec\n";

fn spec(seats: u32, memory_gb: u32, models: &str) -> String {
    format!("seats: {seats}\ntokens_per_sec: 1000\nttft_ms: 1\nmemory_gb: {memory_gb}\nreply_tokens: 4\nmodels:\n{models}")
}

fn chat(model: &str, text: &str) -> Value {
    json!({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": text}]})
}

async fn post(gw: &Gateway, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut r = client().post(gw.url("/v1/chat/completions")).json(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.expect("send")
}

fn node_of(r: &reqwest::Response) -> String {
    r.headers()["x-fleet-node"].to_str().unwrap().to_string()
}

#[test]
fn long_prompt_goes_to_the_large_context_node() {
    let rt = runtime();
    // The small-window node has more seats: least-loaded routing would pick it.
    let small = sim(
        &rt,
        &spec(
            8,
            64,
            "  - {name: qwen:7b, size_gb: 5, context: 8192, loaded: true}\n",
        ),
    );
    let large = sim(
        &rt,
        &spec(
            1,
            64,
            "  - {name: qwen:7b, size_gb: 5, context: 131072, loaded: true}\n",
        ),
    );
    let gw = Gateway::start(&format!(
        "{QUIET}{}",
        fleet(&[node("ctx-small", &small, ""), node("ctx-large", &large, "")])
    ));
    rt.block_on(async {
        let r = post(&gw, &chat("qwen:7b", &"word ".repeat(8000)), &[]).await; // ~10k tokens
        assert_eq!(r.status(), 200);
        assert_eq!(node_of(&r), "ctx-large");
        // Longer than every window: a clear 400, nothing sent.
        let r = post(&gw, &chat("qwen:7b", &"word ".repeat(120_000)), &[]).await;
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "context_length_exceeded");
    });
    assert_eq!(served(&small), 0);
    assert_eq!(served(&large), 1);
}

#[test]
fn busy_hot_node_loses_to_idle_hot_node() {
    let rt = runtime();
    let a = sim(
        &rt,
        &spec(2, 64, "  - {name: m:7b, size_gb: 5, loaded: true}\n"),
    );
    let b = sim(
        &rt,
        &spec(2, 64, "  - {name: m:7b, size_gb: 5, loaded: true}\n"),
    );
    let gw = Gateway::start(&format!(
        "{QUIET}{}",
        fleet(&[node("busy-a", &a, ""), node("busy-b", &b, "")])
    ));
    rt.block_on(async {
        // Equal nodes: the first request goes to busy-a (ties break by node order) and parks.
        a.control().hold_first_token(true);
        b.control().hold_first_token(true);
        let first = tokio::spawn({
            let url = gw.url("/v1/chat/completions");
            async move {
                client()
                    .post(url)
                    .json(&chat("m:7b", "one"))
                    .send()
                    .await
                    .unwrap()
            }
        });
        a.control().wait_parked(1).await;
        b.control().hold_first_token(false);
        // busy-a now has one in flight: the same hot model on idle busy-b wins.
        let r = post(&gw, &chat("m:7b", "two"), &[]).await;
        assert_eq!(r.status(), 200);
        assert_eq!(node_of(&r), "busy-b");
        a.control().release();
        let r = first.await.unwrap();
        assert_eq!(node_of(&r), "busy-a");
    });
}

#[test]
fn small_model_goes_to_the_lighter_node_and_large_to_the_fast_one() {
    let rt = runtime();
    let models = "  - {name: small:3b, size_gb: 2, loaded: true}\n  - {name: large:70b, size_gb: 42, loaded: true}\n";
    let ws = sim(&rt, &spec(4, 512, models));
    let laptop = sim(&rt, &spec(4, 96, models));
    let gw = Gateway::start(&format!(
        "{QUIET}{}",
        fleet(&[
            node("role-ws", &ws, "      bandwidth_gbps: 800\n"),
            node("role-laptop", &laptop, "      bandwidth_gbps: 100\n"),
        ])
    ));
    rt.block_on(async {
        let r = post(&gw, &chat("small:3b", "hi"), &[]).await;
        assert_eq!(node_of(&r), "role-laptop");
        let r = post(&gw, &chat("large:70b", "hi"), &[]).await;
        assert_eq!(node_of(&r), "role-ws");
    });
}

#[test]
fn loaded_fallback_beats_cold_primary_unless_disabled() {
    let rt = runtime();
    let a = sim(
        &rt,
        &spec(
            2,
            256,
            "  - {name: big:70b, size_gb: 42, cold_load_ms: 50}\n",
        ),
    );
    let b = sim(
        &rt,
        &spec(2, 256, "  - {name: mid:32b, size_gb: 20, loaded: true}\n"),
    );
    let gw = Gateway::start(&format!(
        "{QUIET}{}",
        fleet(&[node("fb-a", &a, ""), node("fb-b", &b, "")])
    ));
    rt.block_on(async {
        let mut body = chat("big:70b", "hi");
        body["fallback_models"] = json!(["mid:32b"]);
        let r = post(&gw, &body, &[]).await;
        assert_eq!(r.status(), 200);
        assert_eq!(node_of(&r), "fb-b");
        assert_eq!(r.headers()["x-fleet-fallback"], "true");
        assert_eq!(r.headers()["x-fleet-served-model"], "mid:32b");
        assert_eq!(r.headers()["x-fleet-requested-model"], "big:70b");
        let r = post(&gw, &body, &[("x-fleet-no-fallback", "1")]).await;
        let explain: Value = client()
            .post(gw.admin_url("/fleet/explain"))
            .header("x-fleet-no-fallback", "1")
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{explain:#}");
        assert_eq!(node_of(&r), "fb-a");
        assert_eq!(r.headers()["x-fleet-fallback"], "false");
    });
    assert_eq!(
        b.control().stats().by_model.get("mid:32b"),
        Some(&1),
        "the node saw the fallback's name"
    );
}

#[test]
fn pin_is_strict_and_conversations_stick() {
    let rt = runtime();
    let m = "  - {name: m:7b, size_gb: 5, loaded: true}\n";
    let sims: Vec<_> = (0..3).map(|_| sim(&rt, &spec(4, 64, m))).collect();
    let nodes: Vec<String> = sims
        .iter()
        .enumerate()
        .map(|(i, s)| node(&format!("pc-{i}"), s, ""))
        .collect();
    let gw = Gateway::start(&format!("{QUIET}{}", fleet(&nodes)));
    rt.block_on(async {
        let r = post(&gw, &chat("m:7b", "hi"), &[("x-fleet-pin-node", "pc-2")]).await;
        assert_eq!(node_of(&r), "pc-2");
        let r = post(&gw, &chat("m:7b", "hi"), &[("x-fleet-pin-node", "nowhere")]).await;
        assert_eq!(r.status(), 503);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "no_provider_available");

        // The same conversation lands on the same node every turn, and says so.
        let mut seen = std::collections::BTreeSet::new();
        for turn in 0..4 {
            let r = post(
                &gw,
                &chat("m:7b", &format!("turn {turn}")),
                &[("x-fleet-conversation", "chat-42")],
            )
            .await;
            assert_eq!(r.headers()["x-fleet-affinity"], "matched");
            seen.insert(node_of(&r));
            r.bytes().await.unwrap();
        }
        assert_eq!(
            seen.len(),
            1,
            "one node for the whole conversation: {seen:?}"
        );
        // Different conversations spread over the fleet.
        let mut spread = std::collections::BTreeSet::new();
        for c in 0..12 {
            let r = post(
                &gw,
                &chat("m:7b", "x"),
                &[("x-fleet-conversation", &format!("conv-{c}"))],
            )
            .await;
            spread.insert(node_of(&r));
        }
        assert!(spread.len() >= 2, "conversations spread: {spread:?}");
    });
}

#[test]
fn images_need_a_vision_node() {
    let rt = runtime();
    let m = "  - {name: llava:7b, size_gb: 5, loaded: true}\n";
    let plain = sim(&rt, &spec(8, 64, m));
    let vision = sim(&rt, &spec(1, 64, m));
    let gw = Gateway::start(&format!(
        "{QUIET}{}",
        fleet(&[
            node("vi-plain", &plain, ""),
            node("vi-eyes", &vision, "      tags: [vision]\n")
        ])
    ));
    rt.block_on(async {
        let body = json!({"model": "llava:7b", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
        ]}]});
        let r = post(&gw, &body, &[]).await;
        assert_eq!(r.status(), 200);
        assert_eq!(node_of(&r), "vi-eyes");
    });
}

#[test]
fn explain_shows_every_node_and_sends_nothing() {
    let rt = runtime();
    let a = sim(
        &rt,
        &spec(
            2,
            64,
            "  - {name: m:7b, size_gb: 5, context: 4096, loaded: true}\n",
        ),
    );
    let b = sim(
        &rt,
        &spec(2, 64, "  - {name: m:7b, size_gb: 5, context: 65536}\n"),
    );
    let c = sim(
        &rt,
        &spec(2, 64, "  - {name: other:1b, size_gb: 1, loaded: true}\n"),
    );
    let gw = Gateway::start(&format!(
        "{QUIET}{}",
        fleet(&[
            node("ex-a", &a, ""),
            node("ex-b", &b, ""),
            node("ex-c", &c, "")
        ])
    ));
    rt.block_on(async {
        let body = json!({"model": "m:7b", "messages": [{"role": "user", "content": "word ".repeat(6000)}]});
        let v: Value = explain(&gw, "/fleet/explain/v1/chat/completions", &body).await;
        let table = v["table"].as_array().unwrap();
        let row = |n: &str| table.iter().find(|r| r["node"] == n).unwrap().clone();
        assert_eq!(row("ex-a")["verdict"], "eliminated");
        assert_eq!(row("ex-a")["reason"], "context");
        // The window and what the request needs there: ~7500 prompt tokens + 1024 reserved.
        assert_eq!(row("ex-a")["context"]["window"], 4096);
        let needed = row("ex-a")["context"]["needed_tokens"].as_u64().unwrap();
        assert!((8_000..10_000).contains(&needed), "{needed}");
        assert!(row("ex-b").get("context").is_none(), "only on context eliminations");
        assert_eq!(row("ex-c")["reason"], "model_absent");
        assert_eq!(row("ex-b")["verdict"], "scored", "{v:#}");
        assert!(row("ex-b")["signals"]["warmth"].as_f64().unwrap() > 0.0);
        assert_eq!(v["winner"]["node_id"], "ex-b");
        assert_eq!(v["winner"]["cold"], true);
        // Ollama-shaped body on its own path.
        let v: Value = explain(&gw, "/fleet/explain/api/generate", &json!({"model": "other:1b", "prompt": "hi"})).await;
        assert_eq!(v["winner"]["node_id"], "ex-c");
    });
    assert_eq!(served(&a) + served(&b) + served(&c), 0);
}

#[test]
fn a_cold_load_makes_the_node_hot_at_once() {
    let rt = runtime();
    let m = "  - {name: big:32b, size_gb: 20, cold_load_ms: 30}\n";
    let a = sim(&rt, &spec(2, 128, m));
    let b = sim(&rt, &spec(2, 128, m));
    let gw = Gateway::start(&format!(
        "{QUIET}{}",
        fleet(&[
            node("cl-a", &a, "      bandwidth_gbps: 100\n"),
            node("cl-b", &b, "      bandwidth_gbps: 800\n"),
        ])
    ));
    rt.block_on(async {
        // Cold everywhere, the faster node is preferred for a 20 GB model ...
        let v: Value = explain(&gw, "/fleet/explain", &chat("big:32b", "x")).await;
        assert_eq!(v["winner"]["node_id"], "cl-b");
        // ... but once cl-a has loaded it (no poll in between), cl-a is the hot one.
        let r = post(&gw, &chat("big:32b", "x"), &[("x-fleet-pin-node", "cl-a")]).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
        let r = post(&gw, &chat("big:32b", "y"), &[]).await;
        assert_eq!(node_of(&r), "cl-a");
    });
    assert_eq!(b.control().stats().loads.len(), 0, "no second cold load");
}

/// A cold load is read when the model comes in (the first token of the answer that waited for
/// it), not when that answer ends: a peer with the model cold is priced at that speed while the
/// answer still streams.
#[test]
fn a_cold_loads_speed_is_known_from_its_first_token_while_its_answer_streams() {
    let rt = runtime();
    // 20 GB read in 0.3 s; answers of 60 tokens at 20 tokens/s: 3 s each.
    let m = "  - {name: big:32b, size_gb: 20, cold_load_ms: 300}\n";
    let slow = |m| {
        format!("seats: 2\ntokens_per_sec: 20\nttft_ms: 1\nmemory_gb: 128\nreply_tokens: 60\nmodels:\n{m}")
    };
    let (a, b) = (sim(&rt, &slow(m)), sim(&rt, &slow(m)));
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 600000\nrouting:\n  mode: completion\n  policy:\n    completion_spare_loads: false\n{}",
        fleet(&[node("fl-a", &a, ""), node("fl-b", &b, "")])
    ));
    let ask = json!({"model": "big:32b", "max_tokens": 60, "stream": true,
        "messages": [{"role": "user", "content": "x"}]});
    let load_on_b = |report: Value| {
        report["table"]
            .as_array()
            .and_then(|t| t.iter().find(|r| r["node"] == "fl-b"))
            .and_then(|r| r["load_s"].as_f64())
            .unwrap_or_else(|| panic!("no load for fl-b: {report:#}"))
    };
    rt.block_on(async {
        // Nothing loaded anywhere yet: 20 GB at the prior's 2 GB/s.
        let before = load_on_b(explain(&gw, "/fleet/explain", &ask).await);
        assert!(before > 5.0, "priced at the prior: {before}");
        let mut r = post(&gw, &ask, &[("x-fleet-pin-node", "fl-a")]).await;
        assert_eq!(r.status(), 200);
        r.chunk().await.unwrap().expect("first token");
        let first = std::time::Instant::now();
        let now = load_on_b(explain(&gw, "/fleet/explain", &ask).await);
        // Read well before the 3 s answer could have ended.
        assert!(
            first.elapsed().as_secs_f64() < 2.0,
            "explain took {:?}",
            first.elapsed()
        );
        assert!(
            now < 1.5,
            "priced at fl-a's load ({now} s; {before} s before)"
        );
        while r.chunk().await.unwrap().is_some() {}
        assert!(
            first.elapsed().as_secs_f64() > 2.0,
            "the answer streamed for seconds"
        );
    });
}

#[test]
fn replicas_agree_on_conversation_affinity_without_shared_state() {
    let rt = runtime();
    let m = "  - {name: m:7b, size_gb: 5, loaded: true}\n";
    let sims: Vec<_> = (0..4).map(|_| sim(&rt, &spec(4, 64, m))).collect();
    let nodes: Vec<String> = sims
        .iter()
        .enumerate()
        .map(|(i, s)| node(&format!("rep-{i}"), s, ""))
        .collect();
    let yaml = format!("{QUIET}{}", fleet(&nodes));
    let (one, two) = (Gateway::start(&yaml), Gateway::start(&yaml));
    rt.block_on(async {
        for c in 0..8 {
            let tag = format!("conversation-{c}");
            let h = [
                ("x-fleet-conversation", tag.as_str()),
                ("authorization", "Bearer team-a"),
            ];
            let a = post(&one, &chat("m:7b", "x"), &h).await;
            let b = post(&two, &chat("m:7b", "x"), &h).await;
            assert_eq!(
                node_of(&a),
                node_of(&b),
                "{tag}: both replicas pick the same node"
            );
        }
    });
}

/// `fleetgate explain --config`: the context row names the window and the tokens needed, a
/// node whose models only a live poll can tell is called out (not silently `model_absent`),
/// and the exit status says whether any node could take the request.
#[test]
fn offline_explain_names_windows_unknown_models_and_exits_by_outcome() {
    let dir = std::env::temp_dir().join(format!("fleetgate-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("fleet.yaml");
    std::fs::write(
        &config,
        "fleet:\n  nodes:\n    - id: lc\n      url: http://127.0.0.1:9\n      backend: llamacpp\n    - id: small\n      url: http://127.0.0.1:10\n      backend: ollama\n      models:\n        - { name: m:7b, size_gb: 5, context: 2048 }\n",
    )
    .unwrap();
    let run = |words: usize| {
        let req = dir.join(format!("req-{words}.json"));
        let body = json!({"model": "m:7b", "max_tokens": 16, "messages": [{"role": "user", "content": "word ".repeat(words)}]});
        std::fs::write(&req, body.to_string()).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fleetgate"))
            .args(["explain", "--config"])
            .arg(&config)
            .arg("--request")
            .arg(&req)
            .output()
            .expect("run fleetgate explain");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
        )
    };
    let (code, text) = run(4_000);
    assert_eq!(code, Some(1), "no node fits: {text}");
    assert!(
        text.contains("out: context (window 2048, needs ~"),
        "{text}"
    );
    assert!(text.contains("the models of lc are unknown"), "{text}");
    let (code, text) = run(10);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("winner: small"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Resolves once a request holds a seat on `sim` (it is prefilling there).
async fn holding_a_seat(sim: &fleetgate::sim::SimHandle) {
    while sim.control().stats().in_flight == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// Completion mode learns that a node prefills one prompt at a time (a request's time to first
/// token is its wait for the one sent before plus its own), then sends a short request to a
/// slower node rather than behind a long prefill, and `/fleet/explain` shows the queue.
#[test]
fn a_short_prompt_does_not_wait_behind_a_long_prefill() {
    let rt = runtime();
    let sim_spec = |decode: u32| {
        format!(
            "seats: 4\ntokens_per_sec: {decode}\nttft_ms: 1\nmemory_gb: 64\nreply_tokens: 200\n\
             prefill_tokens_per_sec: 20000\nprefill_parallel: 1\nmodels:\n\
             - {{name: m:7b, size_gb: 5, context: 131072, loaded: true}}\n"
        )
    };
    let fast = sim(&rt, &sim_spec(2000));
    let slow = sim(&rt, &sim_spec(500));
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 600000\n{}",
        fleet(&[
            node("pf-fast", &fast, "      capacity: 4\n"),
            node("pf-slow", &slow, "      capacity: 4\n")
        ])
    ));
    let ask = |words: usize| {
        json!({"model": "m:7b", "max_tokens": 200, "stream": true,
            "messages": [{"role": "user", "content": "word ".repeat(words)}]})
    };
    let send = |body: Value, pin: &'static str| {
        let url = gw.url("/v1/chat/completions");
        async move {
            let mut r = client().post(url).json(&body);
            if !pin.is_empty() {
                r = r.header("x-fleet-pin-node", pin);
            }
            let r = r.send().await.unwrap();
            let node = node_of(&r);
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
            node
        }
    };
    rt.block_on(async {
        // Teach: on pf-fast, a 6,400-token prompt (0.3 s of prefill) and, 50 ms later, a shorter
        // one that waits for it; on pf-slow, one at a time (its decode speed).
        for words in [1_000, 2_000, 3_000] {
            let first = send(ask(5_000), "pf-fast");
            let second = async {
                holding_a_seat(&fast).await;
                send(ask(words), "pf-fast").await
            };
            tokio::join!(first, second);
            send(ask(words), "pf-slow").await;
        }
        // ~40,000 prompt tokens on pf-fast: 2 s of prefill.
        let long = tokio::spawn(send(ask(32_000), "pf-fast"));
        holding_a_seat(&fast).await;
        let short = ask(10);
        let e = explain(&gw, "/fleet/explain/v1/chat/completions", &short).await;
        let row = |id: &str| {
            e["table"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["node"] == id)
                .cloned()
                .unwrap()
        };
        let queued = row("pf-fast")["prefill_queue_tokens"].as_u64().unwrap();
        assert!(queued > 10_000, "the long prompt is ahead: {e:#}");
        assert!(row("pf-fast")["wait_s"].as_f64().unwrap() > 0.5, "{e:#}");
        assert_eq!(row("pf-slow")["prefill_queue_tokens"], 0, "{e:#}");
        assert_eq!(send(short.clone(), "").await, "pf-slow", "{e:#}");
        assert_eq!(long.await.unwrap(), "pf-fast");
        // Answered: nothing is ahead any more, and the faster node wins again.
        assert_eq!(send(short, "").await, "pf-fast");
    });
}

/// The models a sim node has loaded (its `/api/ps`), sorted.
async fn loaded_on(sim: &fleetgate::sim::SimHandle) -> Vec<String> {
    let ps = get_json(&format!("http://{}/api/ps", sim.addr())).await;
    let mut loaded: Vec<String> = ps["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_string())
        .collect();
    loaded.sort();
    loaded
}

/// Node `id`, 36 GB, holding `small` (5 GB) and `large` (20 GB) loaded, with new:14b (10 GB)
/// on disk: 5.5 + 22 resident leave 8.5, new needs 11, so one of the two must go. The
/// gateway (completion mode, the default) polls it once.
fn crowded(
    rt: &tokio::runtime::Runtime,
    id: &str,
    small: &str,
    large: &str,
) -> (fleetgate::sim::SimHandle, Gateway) {
    let models = [
        format!("{{name: {small}, size_gb: 5, loaded: true, cold_load_ms: 10}}"),
        format!("{{name: {large}, size_gb: 20, loaded: true, cold_load_ms: 10}}"),
        "{name: new:14b, size_gb: 10, cold_load_ms: 10}".to_string(),
    ]
    .map(|m| format!("  - {m}\n"))
    .concat();
    let node_sim = sim(rt, &spec(4, 36, &models));
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 600000\n{}",
        fleet(&[node(id, &node_sim, "      memory_gb: 36\n")])
    ));
    (node_sim, gw)
}

/// A chat for `model` answered 200, read to the end, and its seat freed (the gateway frees it
/// just after the client has the reply; a model with a request running is never unloaded).
async fn served_ok(gw: &Gateway, model: &str) {
    let r = post(gw, &chat(model, "x"), &[]).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.unwrap();
    eventually(&format!("{model}'s seat freed"), || async {
        let s = admin_json(gw, "/fleet/status").await;
        s["nodes"].as_array().unwrap().iter().all(|n| {
            n["models"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["name"] == model)
                .all(|m| m["in_flight"] == 0)
        })
    })
    .await;
}

/// Completion mode chooses what a cold load throws out. The node holds a model that is cheap
/// to reload and one that is dear (20 GB) and in demand, the dear one used least recently:
/// left to the node, loading a third model evicts the dear one (LRU). The gateway unloads the
/// cheap one instead, so the next request for the dear model finds it loaded.
#[test]
fn a_cold_load_unloads_the_model_cheapest_to_reload_not_the_least_recent() {
    let rt = runtime();
    let (node_sim, gw) = crowded(&rt, "ev", "cheap:7b", "dear:30b");
    rt.block_on(async {
        // Dear asked for four times in a row, then (most recently) cheap once.
        for model in ["dear:30b", "dear:30b", "dear:30b", "dear:30b", "cheap:7b"] {
            served_ok(&gw, model).await;
        }
        let e = explain(&gw, "/fleet/explain", &chat("new:14b", "x")).await;
        assert_eq!(e["evicts"], json!(["cheap:7b"]), "{e:#}");
        served_ok(&gw, "new:14b").await;
        assert_eq!(loaded_on(&node_sim).await, ["dear:30b", "new:14b"]);
        let text = metrics(&gw).await;
        assert!(
            text.contains(r#"fleetgate_routing_evictions_total{model="cheap:7b",node="ev"} 1"#),
            "{text}"
        );
        served_ok(&gw, "dear:30b").await;
    });
    assert_eq!(
        node_sim.control().stats().loads,
        ["new:14b"],
        "one cold load, nothing reloaded"
    );
}

/// The gateway undoes its own eviction once it pays: a 20 GB model asked for again and again
/// is unloaded for a one-off request's model (they cannot share the node's 30 GB); when that
/// request is done, the gateway reads the busy model back in unasked, so the next request for
/// it does not pay the reload.
#[test]
fn a_model_unloaded_for_a_one_off_comes_back_when_the_one_off_is_done() {
    let rt = runtime();
    let models = "  - {name: often:30b, size_gb: 20, loaded: true, cold_load_ms: 10}\n  - {name: rare:14b, size_gb: 10, cold_load_ms: 10}\n";
    let node_sim = sim(&rt, &spec(4, 30, models));
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 600000\nqueue:\n  prewarm_interval_ms: 100\n{}",
        fleet(&[node("back", &node_sim, "      memory_gb: 30\n")])
    ));
    rt.block_on(async {
        for _ in 0..4 {
            served_ok(&gw, "often:30b").await;
        }
        served_ok(&gw, "rare:14b").await;
        eventually("often:30b read back in", || async {
            loaded_on(&node_sim).await == ["often:30b"]
        })
        .await;
        let text = metrics(&gw).await;
        assert!(
            text.contains(r#"fleetgate_queue_prewarms_total{model="often:30b",node="back"} 1"#),
            "{text}"
        );
        served_ok(&gw, "often:30b").await;
    });
    assert_eq!(
        node_sim.control().stats().loads,
        ["rare:14b", "often:30b"],
        "the one-off's load, then the restore: the last request found it loaded"
    );
}

/// Demand outweighs reload time: a 20 GB model nobody has asked for goes before a 5 GB one in
/// use, although the node (LRU) would throw out the small one (touched longest ago) and the
/// large one takes four times as long to read back in.
#[test]
fn a_cold_load_unloads_the_model_nobody_asks_for_though_dearer_to_reload() {
    let rt = runtime();
    let (node_sim, gw) = crowded(&rt, "ev2", "hot:7b", "idle:30b");
    rt.block_on(async {
        for _ in 0..4 {
            served_ok(&gw, "hot:7b").await;
        }
        // Someone at the node's own console touches idle:30b: the most recently used now.
        node_sim.control().load_model("idle:30b");
        served_ok(&gw, "new:14b").await;
        assert_eq!(loaded_on(&node_sim).await, ["hot:7b", "new:14b"]);
    });
}

/// Completion mode adds seats where the demand is. Requests for a 20 GB model wait for the
/// one seat of each of the two nodes that hold it; two more nodes have it on disk. Priced at
/// 10 s to read in (20 GB at the default 2 GB/s), no request would wait for that load, so none
/// goes there cold, and the runner-up of each busy node holds it already (no pre-warm for a
/// queue); the gateway loads it unasked where it fits in free memory, and requests are then
/// served there too. The other, listed first and faster, would have to unload its idle model
/// to take it: it is left alone.
#[test]
fn a_model_whose_requests_wait_is_loaded_where_it_fits_in_free_memory() {
    spare_loads(true);
}

/// The same with `completion_spare_loads: false`: nothing is loaded, every request waits on
/// the nodes that hold the model.
#[test]
fn spare_loads_off_loads_nothing_unasked() {
    spare_loads(false);
}

/// Completion mode also loads a model where it would be served faster, not only where its
/// requests wait. One request at a time for a 20 GB model: `held` has it loaded and a seat
/// always free; `fast`, three times its speed on the model both were measured on, has it on
/// disk and room to spare. Priced at 10 s to read in (the default 2 GB/s), no request goes
/// there cold; the gateway loads it there unasked, and the requests after that are served
/// there.
#[test]
fn a_model_is_loaded_unasked_where_it_would_be_served_faster() {
    let rt = runtime();
    let other = "  - {name: other:7b, size_gb: 5, loaded: true}\n";
    let held = format!("  - {{name: m:20b, size_gb: 20, loaded: true}}\n{other}");
    let on_disk = format!("  - {{name: m:20b, size_gb: 20, cold_load_ms: 300}}\n{other}");
    let held = sim(&rt, &four_seats(100, 64, &held));
    let fast = sim(&rt, &four_seats(300, 64, &on_disk));
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 200\nrouting:\n  policy:\n    completion_measure: true\n{}",
        fleet(&[
            node("held", &held, "      memory_gb: 64\n"),
            node("fast", &fast, "      memory_gb: 64\n"),
        ])
    ));
    let ask = ask_20b();
    rt.block_on(async {
        loaded_pairs_measured(&gw).await;
        let first = post(&gw, &ask, &[]).await;
        assert_eq!(
            (first.status().as_u16(), node_of(&first)),
            (200, "held".into())
        );
        first.bytes().await.unwrap();
        eventually("m:20b loaded on fast", || async {
            loaded_on(&fast).await.contains(&"m:20b".to_string())
        })
        .await;
        eventually("a request for m:20b served on fast", || async {
            let r = post(&gw, &ask, &[]).await;
            assert_eq!(r.status(), 200);
            node_of(&r) == "fast"
        })
        .await;
    });
    assert_eq!(fast.control().stats().loads, ["m:20b"]);
}

/// A sim node of 4 seats decoding at `decode` tokens/s, with `memory_gb` and `models`.
fn four_seats(decode: u32, memory_gb: u32, models: &str) -> String {
    format!("seats: 4\ntokens_per_sec: {decode}\nttft_ms: 1\nmemory_gb: {memory_gb}\nreply_tokens: 50\nmodels:\n{models}")
}

/// A chat for m:20b of up to 50 tokens.
fn ask_20b() -> Value {
    json!({"model": "m:20b", "max_tokens": 50, "messages": [{"role": "user", "content": "x"}]})
}

/// Every node polled and its loaded models measured (before that, every pair is priced at
/// the priors' 5 tokens/s, whose waits outlast any load).
async fn loaded_pairs_measured(gw: &Gateway) {
    eventually("the loaded pairs measured", || async {
        gw.fleet.nodes().iter().all(|n| {
            let live = n.live.lock();
            live.polled && live.measure_passed && !live.measuring
        })
    })
    .await;
}

fn spare_loads(on: bool) {
    let rt = runtime();
    let held = "  - {name: m:20b, size_gb: 20, loaded: true}\n";
    let on_disk = "  - {name: m:20b, size_gb: 20, cold_load_ms: 1500}\n  - {name: other:7b, size_gb: 5, loaded: true}\n";
    let busy = sim(&rt, &four_seats(100, 64, held));
    let slow = sim(&rt, &four_seats(40, 64, held));
    let full = sim(&rt, &four_seats(150, 25, on_disk));
    let spare = sim(&rt, &four_seats(100, 64, on_disk));
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 200\nrouting:\n  policy:\n    completion_measure: true\n    completion_spare_loads: {on}\nqueue:\n  prewarm_interval_ms: 100\n{}",
        fleet(&[
            node("busy", &busy, "      capacity: 1\n      memory_gb: 64\n"),
            node("slow", &slow, "      capacity: 1\n      memory_gb: 64\n"),
            // 5.5 GB held, 22 more needed: other:7b would have to go.
            node("full", &full, "      memory_gb: 25\n"),
            node("spare", &spare, "      memory_gb: 64\n"),
        ])
    ));
    let ask = ask_20b();
    let prewarms = |text: &str, node: &str| {
        let key = format!(r#"fleetgate_queue_prewarms_total{{model="m:20b",node="{node}"}} "#);
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .map_or(0, |v| v.trim().parse::<u32>().unwrap())
    };
    rt.block_on(async {
        loaded_pairs_measured(&gw).await;
        let sent: Vec<_> = (0..6)
            .map(|_| {
                let (url, body) = (gw.url("/v1/chat/completions"), ask.clone());
                tokio::spawn(async move {
                    let r = client().post(url).json(&body).send().await.unwrap();
                    assert_eq!(r.status(), 200);
                    r.bytes().await.unwrap();
                })
            })
            .collect();
        if !on {
            for s in sent {
                s.await.unwrap();
            }
            let text = metrics(&gw).await;
            assert_eq!((prewarms(&text, "spare"), prewarms(&text, "full")), (0, 0));
            return;
        }
        eventually("a pre-warm of m:20b on spare", || async {
            prewarms(&metrics(&gw).await, "spare") == 1
        })
        .await;
        assert_eq!(prewarms(&metrics(&gw).await, "full"), 0);
        for s in sent {
            s.await.unwrap();
        }
        eventually("m:20b loaded on spare", || async {
            loaded_on(&spare).await.contains(&"m:20b".to_string())
        })
        .await;
        // Warm now, it takes requests: of two at once (busy, as fast, has one seat), one.
        let (r1, r2) = tokio::join!(post(&gw, &ask, &[]), post(&gw, &ask, &[]));
        let served: Vec<_> = [&r1, &r2]
            .iter()
            .map(|r| (r.status().as_u16(), node_of(r)))
            .collect();
        assert!(
            served.iter().all(|(s, _)| *s == 200) && served.iter().any(|(_, n)| n == "spare"),
            "{served:?}"
        );
    });
    let expected: &[&str] = if on { &["m:20b"] } else { &[] };
    assert_eq!(spare.control().stats().loads, expected);
    let full_stats = full.control().stats();
    assert!(
        full_stats.loads.is_empty(),
        "full kept other:7b: {full_stats:?}"
    );
}
