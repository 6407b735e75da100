//! Behind an OpenAI-compatible list (`backend: openai`) every model looks loaded, but Ollama's
//! `/v1`, LM Studio or llama-swap load a model on its first request and unload it after a
//! keep-alive. The gateway reads the load off the first answer (its first token came far later
//! than its prefill explains), keeps the model's requests on the node that now has it in
//! memory rather than making another load it too, and once the pair has been idle past
//! `completion_keep_alive_s` expects the load again: `/fleet/explain` shows it, and the
//! first-byte timeout, which would take the reload for a hung node, waits for it.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// A model on disk, not in memory: its first request waits 1.5 s for the load.
const ON_DEMAND: &str = "seats: 4\ntokens_per_sec: 1000\nttft_ms: 10\nmemory_gb: 64\nreply_tokens: 8\nmodels:\n  - {name: m:1b, size_gb: 1, cold_load_ms: 1500}\n";

fn ask() -> Value {
    ask_for("m:1b")
}

fn ask_for(model: &str) -> Value {
    json!({"model": model, "stream": true, "max_tokens": 8,
        "messages": [{"role": "user", "content": "hello there"}]})
}

/// Stream one answer (pinned to `pin` when given): the node that served it and the retries
/// the gateway made.
async fn stream(gw: &Gateway, pin: Option<&str>) -> (String, String) {
    stream_of(gw, &ask(), pin).await
}

/// As `stream`, for `body`.
async fn stream_of(gw: &Gateway, body: &Value, pin: Option<&str>) -> (String, String) {
    let mut r = client().post(gw.url("/v1/chat/completions")).json(body);
    if let Some(node) = pin {
        r = r.header("x-fleet-pin-node", node);
    }
    let r = r.send().await.expect("send");
    assert_eq!(r.status(), 200);
    let header = |name: &str| {
        r.headers()
            .get(name)
            .map_or(String::new(), |v| v.to_str().unwrap().to_string())
    };
    let (node, retries) = (header("x-fleet-node"), header("x-fleet-retries"));
    assert!(r.text().await.unwrap().contains("[DONE]"));
    (node, retries)
}

/// The load `/fleet/explain` predicts for the request on `node`.
async fn predicted_load(gw: &Gateway, node: &str) -> f64 {
    predicted_load_of(gw, &ask(), node).await
}

/// The load `/fleet/explain` predicts for `body` on `node`.
async fn predicted_load_of(gw: &Gateway, body: &Value, node: &str) -> f64 {
    predicted(gw, body, node, "load_s").await
}

/// The `term` of what `/fleet/explain` predicts for `body` on `node` (`load_s`, `prefill_s`).
async fn predicted(gw: &Gateway, body: &Value, node: &str, term: &str) -> f64 {
    let report = explain(gw, "/fleet/explain", body).await;
    report["table"]
        .as_array()
        .and_then(|t| t.iter().find(|r| r["node"] == node))
        .and_then(|r| r[term].as_f64())
        .unwrap_or_else(|| panic!("no {term} for {node}: {report:#}"))
}

#[test]
fn a_load_hidden_behind_the_model_list_is_learned_and_expected_after_the_keep_alive() {
    let rt = runtime();
    let (a, b) = (sim(&rt, ON_DEMAND), sim(&rt, ON_DEMAND));
    let gw = Gateway::start(&format!(
        "timeouts:\n  first_byte_min_ms: 400\nrouting:\n  policy:\n    completion_keep_alive_s: 2\n{}",
        fleet(&[node_by_url("a", &a), node_by_url("b", &b)])
    ));
    let loads = |id: &str| {
        let node = if id == "a" { &a } else { &b };
        node.control().stats().loads.len()
    };
    rt.block_on(async {
        let (first, _) = stream(&gw, None).await;
        let other = if first == "a" { "b" } else { "a" };
        assert_eq!(loads(&first), 1, "the first request loaded the model");
        // The gateway learns from an answer once it has sent it whole: the client can ask
        // before that.
        let idx = usize::from(first == "b");
        eventually("the first answer learned", || async {
            gw.fleet
                .node(idx)
                .counters("m:1b")
                .rates
                .lock()
                .rates()
                .observed
                >= 1
        })
        .await;
        // The node that has it in memory keeps the model's requests: the other would load it
        // too (its list says loaded, as the first one's did).
        let load = predicted_load(&gw, other).await;
        assert!(
            (1.2..2.0).contains(&load),
            "{other} is expected to load as {first} did: {load}"
        );
        assert_eq!(predicted_load(&gw, &first).await, 0.0);
        for _ in 0..16 {
            assert_eq!(stream(&gw, None).await.0, first);
        }
        assert_eq!(loads(other), 0, "no second load");
        // Idle past the keep-alive, the node unloads the model (as Ollama does after its own).
        if first == "a" { &a } else { &b }
            .control()
            .unload_model("m:1b");
        tokio::time::sleep(Duration::from_millis(2_200)).await;
        let load = predicted_load(&gw, &first).await;
        assert!(
            (1.2..2.0).contains(&load),
            "idle past the keep-alive, {first} is expected to reload: {load}"
        );
        // Its answers came in ~20 ms (an average that has forgotten the first load), so the
        // first-byte timeout is its 400 ms floor: the
        // reload must not read as a hung node and be retried elsewhere.
        let (node, retries) = stream(&gw, Some(&first)).await;
        assert_eq!((node.as_str(), retries.as_str()), (first.as_str(), "0"));
        assert_eq!(loads(&first), 2);
    });
}

/// A request sent while another waits for a hidden reload (the pair is busy, so not idle)
/// waits for the rest of that load too: explain charges it what is left, and its first-byte
/// timeout allows for it. Before, it was priced and timed as warm: its 400 ms floor ran out
/// during the reload and a pinned request got a 502.
#[test]
fn a_request_that_joins_a_hidden_reload_waits_for_it_too() {
    joins_a_hidden_reload(true);
}

/// The same behind a reply that is not streamed (its first byte is its end: the spell is
/// taken as over past twice the known load, not at its first byte).
#[test]
fn a_request_that_joins_a_hidden_reload_behind_a_whole_reply_waits_for_it_too() {
    joins_a_hidden_reload(false);
}

fn joins_a_hidden_reload(opener_streams: bool) {
    let rt = runtime();
    let a = sim(&rt, ON_DEMAND);
    let gw = Gateway::start(&format!(
        "timeouts:\n  first_byte_min_ms: 400\nrouting:\n  policy:\n    completion_keep_alive_s: 2\n{}",
        fleet(&[node_by_url("a", &a)])
    ));
    rt.block_on(async {
        // The first answer shows the 1.5 s load; the warm ones after it make the first-byte
        // timeout its 400 ms floor (an average of ~20 ms that has forgotten the load).
        for _ in 0..17 {
            stream(&gw, None).await;
        }
        a.control().unload_model("m:1b");
        tokio::time::sleep(Duration::from_millis(2_200)).await;
        // One request reloads it; 300 ms in, another joins.
        let first = tokio::spawn({
            let gw_url = gw.url("/v1/chat/completions");
            let mut body = ask();
            body["stream"] = json!(opener_streams);
            async move {
                let r = client().post(gw_url).json(&body).send().await.unwrap();
                (r.status().as_u16(), r.text().await.unwrap())
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let left = predicted_load(&gw, "a").await;
        assert!(
            (0.8..1.6).contains(&left),
            "a request now waits for the rest of the reload: {left}"
        );
        let (node, retries) = stream(&gw, Some("a")).await;
        assert_eq!((node.as_str(), retries.as_str()), ("a", "0"));
        let (status, body) = first.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(a.control().stats().loads.len(), 2, "one reload, shared");
        // Loaded again: nothing more is expected.
        assert_eq!(predicted_load(&gw, "a").await, 0.0);
    });
}

/// Behind a server that swaps models (llama-swap, LM Studio, Ollama on a small GPU): `a` holds
/// one of `x:1b` and `y:1b` at a time (2 GB), each load 1 s; `b` serves `x:1b` alone.
const SWAPS: &str = "seats: 4\ntokens_per_sec: 1000\nttft_ms: 10\nmemory_gb: 2\nreply_tokens: 8\nmodels:\n  - {name: x:1b, size_gb: 1, cold_load_ms: 1000}\n  - {name: y:1b, size_gb: 1, cold_load_ms: 1000}\n";
const ONLY_X: &str = "seats: 4\ntokens_per_sec: 1000\nttft_ms: 10\nmemory_gb: 64\nreply_tokens: 8\nmodels:\n  - {name: x:1b, size_gb: 1, cold_load_ms: 1000}\n";

/// Stream one answer for `model` pinned to `node`: its retries.
async fn pinned(gw: &Gateway, model: &str, node: &str) -> String {
    stream_of(gw, &ask_for(model), Some(node)).await.1
}

/// Once the answers showed that `a` swaps `x:1b` out when `y:1b` is sent there, a request for
/// `x:1b` after one for `y:1b` is expected to wait for the swap on `a` (explain's `load_s`) and
/// goes to `b`, which has it in memory; one pinned to `a` waits for the swap without its
/// first-byte timeout taking it for a hung node. Before, every model behind the list looked
/// loaded everywhere: `x:1b` went back to `a` and waited a second for each swap.
#[test]
fn a_swap_behind_the_model_list_is_learned_and_expected_after_another_model_ran() {
    let rt = runtime();
    let (a, b) = (sim(&rt, SWAPS), sim(&rt, ONLY_X));
    let gw = Gateway::start(&format!(
        "timeouts:\n  first_byte_min_ms: 400\n{}",
        fleet(&[node_by_url("a", &a), node_by_url("b", &b)])
    ));
    rt.block_on(async {
        pinned(&gw, "x:1b", "b").await;
        // Loads x, swaps to y, swaps back to x, swaps to y: the swaps teach what they cost.
        for model in ["x:1b", "y:1b", "x:1b", "y:1b"] {
            assert_eq!(pinned(&gw, model, "a").await, "0");
        }
        assert_eq!(a.control().stats().loads.len(), 4, "every one a load");
        let x = ask_for("x:1b");
        let on_a = predicted_load_of(&gw, &x, "a").await;
        assert!(
            (0.8..1.5).contains(&on_a),
            "x:1b on a waits for the swap back: {on_a}"
        );
        assert_eq!(predicted_load_of(&gw, &x, "b").await, 0.0);
        for _ in 0..4 {
            assert_eq!(stream_of(&gw, &x, None).await.0, "b");
        }
        assert_eq!(a.control().stats().loads.len(), 4, "no swap for x:1b");
        // Pinned there, it waits for the swap (1 s, past its 400 ms first-byte floor).
        assert_eq!(pinned(&gw, "x:1b", "a").await, "0");
        assert_eq!(a.control().stats().loads.len(), 5);
    });
}

/// A model a node that serves several drops from memory unseen (another client's request
/// swapped it out, the server's own memory pressure) makes the next request wait for a load
/// nothing foresaw: its first token comes a second and a half late. That wait is learned as
/// what a swap there costs, not as the pair's prefill: before, one such answer made `a` read
/// a 10-token prompt in ~0.23 s (0.013 before the stall).
#[test]
fn a_stalled_first_token_teaches_a_load_not_a_slow_prefill() {
    let rt = runtime();
    let two = ON_DEMAND.replace(
        "cold_load_ms: 1500}",
        "cold_load_ms: 1500}\n  - {name: n:1b, size_gb: 1, cold_load_ms: 1500}",
    );
    let (a, b) = (sim(&rt, &two), sim(&rt, &two));
    let gw = Gateway::start(&fleet(&[node_by_url("a", &a), node_by_url("b", &b)]));
    rt.block_on(async {
        // Both load the model once, then answer warm.
        for node in ["a", "b", "a", "b", "a", "b"] {
            assert_eq!(stream(&gw, Some(node)).await.1, "0");
        }
        let warm = predicted(&gw, &ask(), "a", "prefill_s").await;
        assert!(warm < 0.1, "a reads a short prompt quickly: {warm}");
        a.control().unload_model("m:1b");
        assert_eq!(stream(&gw, Some("a")).await.1, "0");
        assert_eq!(
            a.control().stats().loads.len(),
            2,
            "the pinned request waited for a load"
        );
        let after = predicted(&gw, &ask(), "a", "prefill_s").await;
        assert!(
            after < warm + 0.05,
            "a still reads a short prompt quickly: {after} against {warm} before the stall"
        );
        // What it waited is what a swap there costs: once another model ran on `a`, `m:1b`'s
        // next request there is expected to wait as long.
        assert_eq!(pinned(&gw, "n:1b", "a").await, "0");
        let swap = predicted(&gw, &ask(), "a", "load_s").await;
        assert!(
            (1.2..2.0).contains(&swap),
            "a swap back to m:1b on a: {swap}"
        );
    });
}

/// A server that runs one request per model at a time (Ollama's per-model seats, its count
/// unsaid behind the list) queues the rest: a request sent while others for its model run
/// there gets its first token late by their answers, not by a swap (the model was serving).
/// Nothing is learned as a swap: once another model ran there, the model is still expected
/// loaded. Before, each queued answer taught a swap (on a Mac at 1,200 prompt tokens/s, 9 s
/// of queue was taken for a load, and every request after another model expected it).
#[test]
fn a_first_token_late_behind_its_models_own_requests_is_no_swap() {
    let rt = runtime();
    let one_each = "seats: 1\nseats_per_model: true\ntokens_per_sec: 20\nttft_ms: 10\nmemory_gb: 64\nreply_tokens: 20\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true}\n  - {name: n:1b, size_gb: 1, loaded: true}\n";
    let a = sim(&rt, one_each);
    let gw = Gateway::start(&fleet(&[node_by_url("a", &a)]));
    let long = json!({"model": "m:1b", "stream": true, "max_tokens": 20,
        "messages": [{"role": "user", "content": "hello there"}]});
    rt.block_on(async {
        for _ in 0..2 {
            assert_eq!(pinned(&gw, "m:1b", "a").await, "0");
        }
        // Both models at once: the node is seen running two.
        for _ in 0..2 {
            let (m, n) = tokio::join!(pinned(&gw, "m:1b", "a"), pinned(&gw, "n:1b", "a"));
            assert_eq!((m.as_str(), n.as_str()), ("0", "0"));
        }
        // Three of m:1b at once: the second waits ~1 s for the first, the third ~2 s.
        let three = (0..3).map(|_| stream_of(&gw, &long, Some("a")));
        for (node, retries) in futures::future::join_all(three).await {
            assert_eq!((node.as_str(), retries.as_str()), ("a", "0"));
        }
        assert_eq!(pinned(&gw, "n:1b", "a").await, "0");
        let load = predicted(&gw, &ask(), "a", "load_s").await;
        // (Before, the queue was learned as a swap: ~0.1-0.2 s expected here, ~1 s of queue
        // averaged with the warm-up's swaps between the two models, none real.)
        assert_eq!(load, 0.0, "m:1b expected in memory on a after n:1b ran");
    });
    assert!(
        a.control().stats().loads.is_empty(),
        "nothing was ever loaded"
    );
}
