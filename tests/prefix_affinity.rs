//! Completion mode with header-less prefix affinity, end to end: a multi-turn chat without any
//! conversation header stays on the node that holds its prefix while that node has room,
//! spills when its queue deepens, and a second gateway over the same fleet picks the same node.

mod common;

use common::*;
use serde_json::{json, Value};

const MODEL: &str = "m:7b";

/// Three equal nodes with prefix caches; the chat's ~750-token system prompt takes 250 ms to
/// prefill, far more than the scheduling noise of a loaded test machine.
fn spec() -> String {
    format!(
        "seats: 2\ntokens_per_sec: 100\nttft_ms: 20\nprefill_tokens_per_sec: 3000\nprefix_cache_entries: 16\nmemory_gb: 64\nreply_tokens: 8\nmodels:\n  - {{name: {MODEL}, size_gb: 5, loaded: true}}\n"
    )
}

fn config(sims: &[fleetgate::sim::SimHandle]) -> String {
    let nodes: Vec<String> = sims
        .iter()
        .enumerate()
        .map(|(i, s)| node(&format!("n{i}"), s, "      capacity: 2\n"))
        .collect();
    format!(
        "health:\n  poll_interval_ms: 600000\nrouting:\n  mode: completion\n{}",
        fleet(&nodes)
    )
}

/// The first `turns` turns of one chat: a long system prompt, then user / assistant turns.
fn chat(turns: usize) -> Value {
    chat_of("You are terse. ", turns)
}

fn chat_of(system: &str, turns: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": system.repeat(200)})];
    for t in 0..turns {
        if t > 0 {
            messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
        }
        messages.push(json!({"role": "user", "content": format!("question {t} about the plan")}));
    }
    json!({"model": MODEL, "max_tokens": 8, "messages": messages})
}

async fn send(gw: &Gateway, body: &Value, pin: Option<&str>) -> (String, String) {
    let mut rq = client().post(gw.url("/v1/chat/completions")).json(body);
    if let Some(p) = pin {
        rq = rq.header("x-fleet-pin-node", p);
    }
    let r = rq.send().await.expect("request");
    assert_eq!(r.status(), 200);
    let node = r.headers()["x-fleet-node"].to_str().unwrap().to_string();
    let affinity = r
        .headers()
        .get("x-fleet-affinity")
        .map_or("-", |v| v.to_str().unwrap())
        .to_string();
    r.bytes().await.expect("body");
    (node, affinity)
}

#[test]
fn header_less_chat_stays_spills_and_agrees_across_gateways() {
    let rt = runtime();
    let sims: Vec<_> = (0..3).map(|_| sim(&rt, &spec())).collect();
    let gw = Gateway::start(&config(&sims));
    let gw2 = Gateway::start(&config(&sims));
    rt.block_on(async {
        // Every node answers a request of another chat first, so each has learned rates.
        for i in 0..3 {
            send(&gw, &chat_of("Warm up. ", 1), Some(&format!("n{i}"))).await;
        }
        // Six turns, no conversation header: one node, and it says so.
        let (home, affinity) = send(&gw, &chat(1), None).await;
        assert_eq!(affinity, "matched");
        for turns in 2..=6 {
            let (node, affinity) = send(&gw, &chat(turns), None).await;
            assert_eq!(
                (node.as_str(), affinity.as_str()),
                (home.as_str(), "matched")
            );
        }
        // A second gateway that never saw the chat picks the same node for its next turn.
        let (node, affinity) = send(&gw2, &chat(7), None).await;
        assert_eq!(
            (node.as_str(), affinity.as_str()),
            (home.as_str(), "matched")
        );
        // The home node's prefix cache served turns 2..7; the others never saw the chat.
        let idx: usize = home[1..].parse().expect("node index");
        let stats: Vec<_> = sims.iter().map(|s| s.control().stats()).collect();
        assert!(
            stats[idx].prefix_hits >= 6,
            "home hits: {}",
            stats[idx].prefix_hits
        );
        assert!(stats[idx].prefix_tokens_reused >= 6 * 700);
        for (i, s) in stats.iter().enumerate().filter(|(i, _)| *i != idx) {
            assert_eq!(s.prefix_hits, 0, "n{i} never held the chat");
        }

        // The home node's seats fill and six more wait behind them (a cached turn takes
        // ~0.1 s, the cache saves ~0.25 s): the next turn spills.
        let ctl = control(&sims[idx]);
        ctl.hold_first_token(true);
        let mut parked = Vec::new();
        for _ in 0..8 {
            let url = gw.url("/v1/chat/completions");
            let pin = home.clone();
            parked.push(tokio::spawn(async move {
                let body = json!({"model": MODEL, "max_tokens": 8,
                    "messages": [{"role": "user", "content": "filler"}]});
                client()
                    .post(url)
                    .header("x-fleet-pin-node", pin)
                    .json(&body)
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            }));
        }
        let counters = gw.fleet.node(idx).counters(MODEL);
        eventually("home node: 2 in flight, 6 waiting", || {
            let c = counters.clone();
            async move {
                c.in_flight.load(std::sync::atomic::Ordering::Relaxed) == 2
                    && c.pending.load(std::sync::atomic::Ordering::Relaxed) == 6
            }
        })
        .await;
        let explain: Value = explain(&gw, "/fleet/explain/v1/chat/completions", &chat(7)).await;
        let (node, affinity) = send(&gw, &chat(7), None).await;
        assert_ne!(node, home, "a busy home node is passed over: {explain:#}");
        assert_eq!(affinity, "spilled", "{explain:#}");
        ctl.release();
        for p in parked {
            assert_eq!(p.await.expect("join").expect("parked request"), 200);
        }
    });
}

/// An Ollama that counts only what it prefilled (`prompt_eval_count` before it had a cached
/// count beside it): a chat's later turns report a few dozen tokens for ~3,000 characters of
/// history. The gateway's prompt estimate stays the prompt's size: taken as whole counts,
/// they had capped it near their count, and the next turn's prefill was priced at nothing.
#[test]
fn a_chat_on_a_node_that_counts_only_what_it_prefilled_keeps_its_prompt_estimate() {
    let (counts, _) = chat_estimate(false);
    assert!(
        counts[1..].iter().all(|(c, _)| *c < counts[0].0 / 4),
        "later turns count only their new part: {counts:?}"
    );
}

/// A newer Ollama counts the whole prompt and says what its cache held
/// (`prompt_eval_cached_count`): the same estimate.
#[test]
fn a_chat_on_a_node_that_counts_its_cache_keeps_its_prompt_estimate() {
    let (counts, prefill_tps) = chat_estimate(true);
    assert!(
        counts[1..].iter().all(|(c, cached)| *cached * 10 > *c * 8),
        "later turns are mostly cached: {counts:?}"
    );
    // What the node prefilled is the count less its cache: ~3,000 tokens/s. Taken whole, the
    // ~2,400 tokens of a later turn in its few ms of prefill read as 100,000 and more.
    assert!(
        prefill_tps.is_none_or(|t| t < 10_000.0),
        "prefill learned at {prefill_tps:?} tokens/s"
    );
}

/// Six turns of one chat through `/api/chat` on a node with `ollama_cached_count`; then the
/// gateway's prompt estimate for the seventh is within 10 % of what the node counts. The
/// answers' (prompt_eval_count, prompt_eval_cached_count), and the prefill rate learned.
fn chat_estimate(cached_count: bool) -> (Vec<(u64, u64)>, Option<f64>) {
    let rt = runtime();
    let sims = [sim(
        &rt,
        &format!("{}ollama_cached_count: {cached_count}\n", spec()),
    )];
    let gw = Gateway::start(&config(&sims));
    rt.block_on(async {
        let mut counts = Vec::new();
        for turns in 1..=6 {
            let mut body = chat(turns);
            body["stream"] = false.into();
            body["options"] = json!({"num_predict": 8});
            let r = client()
                .post(gw.url("/api/chat"))
                .json(&body)
                .send()
                .await
                .expect("request");
            assert_eq!(r.status(), 200);
            let answer: Value = r.json().await.expect("answer");
            counts.push((
                answer["prompt_eval_count"]
                    .as_u64()
                    .expect("prompt_eval_count"),
                answer["prompt_eval_cached_count"].as_u64().unwrap_or(0),
            ));
        }
        eventually("six answers learned", || async {
            gw.fleet
                .node(0)
                .counters(MODEL)
                .rates
                .lock()
                .rates()
                .observed
                >= 6
        })
        .await;
        // What the node counts for the seventh turn (the sim: ceil(chars / 4) + 4 per message).
        let next = chat(7);
        let messages = next["messages"].as_array().expect("messages");
        let real: u64 = messages
            .iter()
            .map(|m| m["content"].as_str().unwrap().len().div_ceil(4) as u64 + 4)
            .sum();
        let report = explain(&gw, "/fleet/explain/api/chat", &next).await;
        let estimate = report["prompt_tokens"].as_u64().expect("prompt_tokens");
        assert!(
            estimate.abs_diff(real) * 10 <= real,
            "estimated {estimate} tokens, the node counts {real} (answers counted {counts:?})"
        );
        let rates = gw.fleet.node(0).counters(MODEL).rates.lock().rates();
        (counts, rates.prefill_tps)
    })
}

/// One-shot requests that share a system prompt (an agent's), each with its own question and
/// no header: after the first, they go where that system prompt is cached, and the node's
/// prefix cache shows the reuse.
#[test]
fn requests_that_share_a_system_prompt_go_where_it_is_cached() {
    one_shot_questions_gather_where_their_shared_part_is_cached(|q| {
        json!({"model": MODEL, "max_tokens": 8, "messages": [
            {"role": "system", "content": "You are the build agent. ".repeat(120)},
            {"role": "user", "content": format!("question {q}: why did the build break?")}]})
    });
}

/// The same with no system prompt at all, only the tools an agent declares with every request
/// (which chat templates render ahead of the first message: the sim caches them so).
#[test]
fn requests_that_declare_the_same_tools_go_where_they_are_cached() {
    let tools: Vec<Value> = (0..16)
        .map(|i| {
            json!({"type": "function", "function": {
                "name": format!("tool_{i}"),
                "description": "Reads a file of the build and says what broke in it.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}})
        })
        .collect();
    assert!(Value::from(tools.clone()).to_string().len() > 2_800);
    one_shot_questions_gather_where_their_shared_part_is_cached(|q| {
        json!({"model": MODEL, "max_tokens": 8, "tools": tools, "messages": [
            {"role": "user", "content": format!("question {q}: why did the build break?")}]})
    });
}

/// Three equal nodes; six one-shot questions (`ask(q)`) that share a ~750-token part: all go
/// to the first one's node, whose prefix cache shows five hits.
fn one_shot_questions_gather_where_their_shared_part_is_cached(ask: impl Fn(usize) -> Value) {
    let rt = runtime();
    let sims: Vec<_> = (0..3).map(|_| sim(&rt, &spec())).collect();
    let gw = Gateway::start(&config(&sims));
    rt.block_on(async {
        for i in 0..3 {
            send(&gw, &chat_of("Warm up. ", 1), Some(&format!("n{i}"))).await;
        }
        let (home, _) = send(&gw, &ask(0), None).await;
        let idx: usize = home[1..].parse().expect("node index");
        for q in 1..=5 {
            // Each question is priced with the rates the last answer taught, learned once the
            // gateway has sent it whole: the client can ask before.
            eventually("the last answer learned", || async {
                // The warm-up and questions 0..q.
                let rates = gw.fleet.node(idx).counters(MODEL).rates.lock().rates();
                rates.observed > q as u32
            })
            .await;
            let (node, _) = send(&gw, &ask(q), None).await;
            assert_eq!(
                node, home,
                "question {q} went where the shared part is cached"
            );
        }
        let stats = sims[idx].control().stats();
        assert!(stats.prefix_hits >= 5, "home hits: {}", stats.prefix_hits);
        assert!(stats.prefix_tokens_reused >= 5 * 700);
    });
}
