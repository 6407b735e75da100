//! Protocol translation end to end: a real gateway in front of sim nodes that serve only the
//! other protocol (an OpenAI-only node like llama.cpp, an Ollama-only node).

mod common;

use common::*;
use fleetgate::routing::Family;
use fleetgate::sim::SimHandle;
use serde_json::{json, Value};
use tokio::runtime::Runtime;

const SPEC: &str = "seats: 4\ntokens_per_sec: 1000\nttft_ms: 1\nreply_tokens: 6\nmodels:\n  - {name: llama3.2:3b, size_gb: 2, loaded: true}\n  - {name: nomic-embed-text:latest, size_gb: 0.3, loaded: true, embedding: true}\n";

fn sim_serving(rt: &Runtime, serves: &[Family]) -> SimHandle {
    let spec = serde_yaml::from_str(SPEC).expect("sim spec");
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind sim");
    rt.block_on(fleetgate::sim::start_serving(spec, l, serves))
        .expect("start sim")
}

/// A gateway whose one node speaks only OpenAI (polled as an OpenAI-compatible server).
fn openai_only(rt: &Runtime) -> (SimHandle, Gateway) {
    let sim = sim_serving(rt, &[Family::OpenAI]);
    let yaml = format!(
        "fleet:\n  nodes:\n    - id: llamacpp\n      url: http://{}\n      backend: openai\n      capacity: 4\n",
        sim.addr()
    );
    (sim, Gateway::start(&yaml))
}

/// A gateway whose one node speaks only Ollama.
fn ollama_only(rt: &Runtime) -> (SimHandle, Gateway) {
    let sim = sim_serving(rt, &[Family::Ollama]);
    let gw = Gateway::start(&fleet(&[node(
        "ollama",
        &sim,
        "      protocols: [ollama]\n",
    )]));
    (sim, gw)
}

async fn post(gw: &Gateway, path: &str, body: Value) -> (u16, reqwest::header::HeaderMap, String) {
    let r = client()
        .post(gw.url(path))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.text().await.expect("body"))
}

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// (event name, data) of each SSE event.
fn events(text: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for l in text.lines() {
        if let Some(n) = l.strip_prefix("event: ") {
            name = n.to_string();
        } else if let Some(d) = l.strip_prefix("data: ") {
            let v = if d == "[DONE]" {
                json!("[DONE]")
            } else {
                serde_json::from_str(d).expect(d)
            };
            out.push((std::mem::take(&mut name), v));
        }
    }
    out
}

#[test]
fn ollama_client_on_an_openai_only_node() {
    let rt = runtime();
    let (sim, gw) = openai_only(&rt);
    rt.block_on(async {
        let msgs = json!([{"role": "user", "content": "Why is the sky blue?"}]);
        // Streams by default, as Ollama does: NDJSON lines, the last one done with counts.
        let (s, h, text) = post(&gw, "/api/chat", json!({"model": "llama3.2:3b", "messages": msgs})).await;
        assert_eq!(s, 200, "{text}");
        assert_eq!(h["content-type"], "application/x-ndjson");
        assert_eq!(h["x-fleet-node"], "llamacpp");
        let l = lines(&text);
        let (last, parts) = l.split_last().expect("lines");
        assert_eq!(parts.len(), 6, "{text}");
        assert!(parts.iter().all(|p| p["done"] == false && p["message"]["role"] == "assistant"));
        assert_eq!(last["done"], true);
        assert_eq!(last["done_reason"], "stop");
        assert_eq!(last["eval_count"], 6);
        assert!(last["prompt_eval_count"].as_u64().is_some_and(|n| n > 0), "{last}");
        let streamed: String = parts.iter().filter_map(|p| p["message"]["content"].as_str()).collect();
        // Non-streaming: the same text in one object.
        let (s, _, text) = post(&gw, "/api/chat", json!({"model": "llama3.2:3b", "messages": msgs, "stream": false})).await;
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["message"]["content"], streamed.as_str());
        assert_eq!((v["done"].clone(), v["eval_count"].clone()), (json!(true), json!(6)));
        // generate -> completions, num_predict -> max_tokens.
        let body = json!({"model": "llama3.2:3b", "prompt": "hi", "stream": false, "options": {"num_predict": 3}});
        let (s, _, text) = post(&gw, "/api/generate", body).await;
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["done_reason"], "length");
        assert_eq!(v["response"].as_str().map(|t| t.split_whitespace().count()), Some(3));
        let (s, _, text) = post(&gw, "/api/generate", json!({"model": "llama3.2:3b", "prompt": "hi"})).await;
        assert_eq!(s, 200);
        let l = lines(&text);
        assert!(l.len() >= 2 && l.last().is_some_and(|x| x["done"] == true), "{text}");
        // embed and the legacy embeddings.
        let (s, _, text) = post(&gw, "/api/embed", json!({"model": "nomic-embed-text:latest", "input": ["a", "b"]})).await;
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["embeddings"].as_array().map(Vec::len), Some(2), "{text}");
        let (s, _, text) = post(&gw, "/api/embeddings", json!({"model": "nomic-embed-text:latest", "prompt": "a"})).await;
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert!(v["embedding"].as_array().is_some_and(|e| !e.is_empty()), "{text}");
        // The node's error comes back in Ollama's shape.
        let (s, _, text) = post(&gw, "/api/chat", json!({"model": "nomic-embed-text:latest", "messages": msgs, "stream": false})).await;
        assert_eq!(s, 400, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert!(v["error"].is_string(), "{text}");
        // The requests reached the node on its OpenAI paths.
        assert_eq!(sim.control().stats().last_path, "/v1/chat/completions");
        assert_eq!(served(&sim), 7);
    });
}

#[test]
fn anthropic_and_responses_clients_on_an_openai_only_node() {
    let rt = runtime();
    let (_sim, gw) = openai_only(&rt);
    rt.block_on(async {
        let body = json!({"model": "llama3.2:3b", "max_tokens": 4, "system": "Be brief.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]});
        let (s, _, text) = post(&gw, "/v1/messages", body.clone()).await;
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["type"], "message");
        assert_eq!(v["stop_reason"], "max_tokens", "4 tokens asked, the node stopped on length");
        assert_eq!(v["usage"]["output_tokens"], 4);
        let whole = v["content"][0]["text"].as_str().expect("text").to_string();
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        let (s, h, text) = post(&gw, "/v1/messages", sbody).await;
        assert_eq!(s, 200, "{text}");
        assert_eq!(h["content-type"], "text/event-stream");
        let ev = events(&text);
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.first(), Some(&"message_start"));
        assert_eq!(names[1], "content_block_start");
        assert_eq!(&names[names.len() - 3..], ["content_block_stop", "message_delta", "message_stop"]);
        let streamed: String = ev.iter().filter_map(|(_, d)| d["delta"]["text"].as_str()).collect();
        assert_eq!(streamed, whole);
        let delta = &ev[ev.len() - 2].1;
        assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
        assert_eq!(delta["usage"]["output_tokens"], 4);

        // Responses -> chat, whole and streamed.
        let body = json!({"model": "llama3.2:3b", "instructions": "Be brief.", "input": "Hi", "max_output_tokens": 50});
        let (s, _, text) = post(&gw, "/v1/responses", body.clone()).await;
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!((v["object"].clone(), v["status"].clone()), (json!("response"), json!("completed")));
        let whole = v["output"][0]["content"][0]["text"].as_str().expect("text").to_string();
        assert_eq!(whole.split_whitespace().count(), 6);
        let mut sbody = body.clone();
        sbody["stream"] = json!(true);
        let (s, _, text) = post(&gw, "/v1/responses", sbody).await;
        assert_eq!(s, 200, "{text}");
        let ev = events(&text);
        assert_eq!(ev[0].0, "response.created");
        let streamed: String = ev
            .iter()
            .filter(|(n, _)| n == "response.output_text.delta")
            .filter_map(|(_, d)| d["delta"].as_str())
            .collect();
        assert_eq!(streamed, whole);
        let (name, last) = ev.last().expect("events");
        assert_eq!(name, "response.completed");
        assert_eq!(last["response"]["output"][0]["content"][0]["text"], whole.as_str());
        assert_eq!(last["response"]["usage"]["output_tokens"], 6);
        // Stored state is refused, clearly, before any node is asked.
        let (s, _, text) = post(&gw, "/v1/responses", json!({"model": "llama3.2:3b", "input": "more", "previous_response_id": "resp_1"})).await;
        assert_eq!(s, 400, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("previous_response_id")), "{text}");
    });
}

#[test]
fn openai_client_on_an_ollama_only_node() {
    let rt = runtime();
    let (sim, gw) = ollama_only(&rt);
    rt.block_on(async {
        let msgs = json!([{"role": "user", "content": "Why is the sky blue?"}]);
        let (s, h, text) = post(
            &gw,
            "/v1/chat/completions",
            json!({"model": "llama3.2:3b", "messages": msgs}),
        )
        .await;
        assert_eq!(s, 200, "{text}");
        assert_eq!(h["content-type"], "application/json");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["usage"]["completion_tokens"], 6);
        let whole = v["choices"][0]["message"]["content"]
            .as_str()
            .expect("text")
            .to_string();
        let (s, h, text) = post(
            &gw,
            "/v1/chat/completions",
            json!({"model": "llama3.2:3b", "messages": msgs, "stream": true}),
        )
        .await;
        assert_eq!(s, 200, "{text}");
        assert_eq!(h["content-type"], "text/event-stream");
        let ev = events(&text);
        assert_eq!(ev.last().map(|(_, d)| d.clone()), Some(json!("[DONE]")));
        let streamed: String = ev
            .iter()
            .filter_map(|(_, d)| d["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(streamed, whole);
        let (s, _, text) = post(
            &gw,
            "/v1/completions",
            json!({"model": "llama3.2:3b", "prompt": "Once", "max_tokens": 2}),
        )
        .await;
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        let (s, _, text) = post(
            &gw,
            "/v1/embeddings",
            json!({"model": "nomic-embed-text:latest", "input": "a"}),
        )
        .await;
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert!(
            v["data"][0]["embedding"]
                .as_array()
                .is_some_and(|e| !e.is_empty()),
            "{text}"
        );
        assert_eq!(sim.control().stats().last_path, "/api/embed");
    });
}

/// Claude Code and Codex against a fleet that has none of their models: `models.resolve`
/// maps their ids by tier; `count_tokens` never reaches a node.
#[test]
fn coding_agent_model_ids_resolve_by_tier() {
    let rt = runtime();
    let spec = "seats: 4\ntokens_per_sec: 1000\nttft_ms: 1\nreply_tokens: 6\nmodels:\n  - {name: qwen2.5-coder:7b, size_gb: 4.7, loaded: true}\n  - {name: qwen2.5-coder:32b, size_gb: 20, loaded: true}\n  - {name: qwen3-coder:480b, size_gb: 250}\n";
    let spec = serde_yaml::from_str(spec).expect("spec");
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let sim = rt
        .block_on(fleetgate::sim::start_serving(spec, l, &[Family::OpenAI]))
        .expect("sim");
    let yaml = format!(
        "models:\n  resolve:\n    fast: {{match: [\"claude-*haiku*\", \"gpt-*-mini\"]}}\n    balanced: {{match: [\"claude-*sonnet*\", \"gpt-5-codex\"]}}\n    strongest: {{match: [\"claude-*opus*\"], prefer: [\"qwen3-coder:*\", \"qwen2.5-coder:32b\"]}}\nfleet:\n  nodes:\n    - id: coder\n      url: http://{}\n      backend: openai\n      capacity: 4\n",
        sim.addr()
    );
    let gw = Gateway::start(&yaml);
    rt.block_on(async {
        let ask = |model: &str| json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]});
        for (id, served) in [
            ("claude-3-5-haiku-latest", "qwen2.5-coder:7b"),
            // Two loaded models: balanced takes the larger of the two.
            ("claude-sonnet-4-5", "qwen2.5-coder:32b"),
            // The first preference is on disk only (/v1/models lists it as served, so it is
            // "loaded" for an OpenAI node): it serves.
            ("claude-opus-4-1", "qwen3-coder:480b"),
        ] {
            let (s, h, text) = post(&gw, "/v1/messages", ask(id)).await;
            assert_eq!(s, 200, "{id}: {text}");
            assert_eq!(h["x-fleet-served-model"], served, "{id}");
            assert_eq!(h["x-fleet-requested-model"], id);
            assert_eq!(sim.control().stats().last_model, served, "the node was asked for it");
        }
        let (s, h, text) = post(&gw, "/v1/responses", json!({"model": "gpt-5-codex", "input": "Hi"})).await;
        assert_eq!(s, 200, "{text}");
        assert_eq!(h["x-fleet-served-model"], "qwen2.5-coder:32b");
        // An id no tier matches is still not found.
        let (s, _, text) = post(&gw, "/v1/messages", ask("mistral-large")).await;
        assert_eq!(s, 404, "{text}");
        // count_tokens is answered by the gateway.
        let before = sim.control().stats().requests;
        let (s, _, text) = post(&gw, "/v1/messages/count_tokens", ask("claude-sonnet-4-5")).await;
        assert_eq!(s, 200, "{text}");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert!(v["input_tokens"].as_u64().is_some_and(|n| n > 0), "{text}");
        assert_eq!(sim.control().stats().requests, before, "no node was asked");
    });
}

/// Without `protocols:`, what a node speaks is learned by asking it: an `openai` node that
/// also answers Anthropic's and Ollama's endpoints gets those requests natively.
#[test]
fn protocols_are_probed_when_not_configured() {
    let rt = runtime();
    let sim = sim_serving(&rt, &[Family::OpenAI, Family::Anthropic, Family::Ollama]);
    let yaml = format!(
        "fleet:\n  nodes:\n    - id: multi\n      url: http://{}\n      backend: openai\n      capacity: 4\n",
        sim.addr()
    );
    let gw = Gateway::start(&yaml);
    rt.block_on(async {
        let body = json!({"model": "llama3.2:3b", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]});
        let (s, _, text) = post(&gw, "/v1/messages", body).await;
        assert_eq!(s, 200, "{text}");
        assert_eq!(sim.control().stats().last_path, "/v1/messages", "sent natively");
        let body = json!({"model": "llama3.2:3b", "stream": false, "messages": [{"role": "user", "content": "Hi"}]});
        let (s, _, text) = post(&gw, "/api/chat", body).await;
        assert_eq!(s, 200, "{text}");
        assert_eq!(sim.control().stats().last_path, "/api/chat", "sent natively");
    });
    // The same node with `protocols: [openai]` is taken at its word: translated.
    let yaml = format!(
        "fleet:\n  nodes:\n    - id: multi\n      url: http://{}\n      backend: openai\n      protocols: [openai]\n",
        sim.addr()
    );
    let gw = Gateway::start(&yaml);
    rt.block_on(async {
        let body = json!({"model": "llama3.2:3b", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]});
        let (s, _, text) = post(&gw, "/v1/messages", body).await;
        assert_eq!(s, 200, "{text}");
        assert_eq!(sim.control().stats().last_path, "/v1/chat/completions", "translated");
    });
}

/// Read the response until `want` shows up; fails after 10 s (the node is parked, so only a
/// forwarded first token can satisfy it).
async fn read_until(r: &mut reqwest::Response, want: &str) -> String {
    let mut got = String::new();
    let read = async {
        while !got.contains(want) {
            match r.chunk().await.expect("chunk") {
                Some(c) => got.push_str(&String::from_utf8_lossy(&c)),
                None => break,
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), read).await;
    got
}

/// The first token reaches the client, translated, while the node is still generating.
#[test]
fn translated_first_token_arrives_before_the_node_finishes() {
    let rt = runtime();
    let (sim, gw) = openai_only(&rt);
    let ctl = sim.control();
    rt.block_on(async {
        for (path, body, want, end) in [
            (
                "/api/chat",
                json!({"model": "llama3.2:3b", "messages": [{"role": "user", "content": "Hi"}]}),
                "\"done\":false",
                "\"done\":true",
            ),
            (
                "/v1/messages",
                json!({"model": "llama3.2:3b", "max_tokens": 8, "stream": true, "messages": [{"role": "user", "content": "Hi"}]}),
                "text_delta",
                "message_stop",
            ),
            (
                "/v1/responses",
                json!({"model": "llama3.2:3b", "input": "Hi", "stream": true}),
                "response.output_text.delta",
                "response.completed",
            ),
        ] {
            ctl.hold_after_first_chunk(true);
            let mut r = client().post(gw.url(path)).json(&body).send().await.expect("send");
            assert_eq!(r.status(), 200, "{path}");
            let first = read_until(&mut r, want).await;
            assert!(first.contains(want), "{path}: no token while the node is parked: {first}");
            assert!(!first.contains(end), "{path}: the stream cannot be complete yet: {first}");
            assert_eq!(ctl.stats().in_flight, 1, "{path}: node still generating");
            ctl.release();
            let rest = read_until(&mut r, end).await;
            assert!(rest.contains(end), "{path}: {rest}");
        }
    });
}
