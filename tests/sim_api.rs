//! Integration tests of the simulated inference node over real HTTP.

use serde_json::{json, Value};

mod common;

use common::simnode::*;

#[tokio::test]
async fn tags_ps_version_models_shapes() {
    let (h, base, c) = node(spec()).await;
    let tags = get(&c, format!("{base}/api/tags")).await;
    let models = tags["models"].as_array().expect("models");
    assert_eq!(models.len(), 3);
    let m = &models[0];
    assert_eq!(m["name"], "llama3.2:3b");
    assert_eq!(m["model"], "llama3.2:3b");
    assert_eq!(m["size"], 2_000_000_000u64);
    assert!(m["modified_at"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert_eq!(m["digest"].as_str().map(str::len), Some(64));
    for k in ["format", "family", "parameter_size", "quantization_level"] {
        assert!(m["details"][k].is_string(), "details.{k}");
    }
    let ps = get(&c, format!("{base}/api/ps")).await;
    let loaded = ps["models"].as_array().expect("models");
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0]["name"], "llama3.2:3b");
    assert_eq!(loaded[0]["size"], 2_200_000_000u64);
    assert_eq!(loaded[0]["size_vram"], 2_200_000_000u64);
    assert_eq!(loaded[0]["context_length"], 8192);
    assert!(loaded[0]["expires_at"].is_string());
    assert!(get(&c, format!("{base}/api/version")).await["version"].is_string());
    let v1 = get(&c, format!("{base}/v1/models")).await;
    assert_eq!(v1["object"], "list");
    assert_eq!(v1["data"][1]["id"], "qwen2.5:7b");
    assert_eq!(v1["data"][1]["object"], "model");
    let (s, show) = post(
        &c,
        format!("{base}/api/show"),
        json!({"model": "llama3.2:3b"}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(show["model_info"]["llama.context_length"], 8192);
    let st = h.control().stats();
    assert_eq!(st.requests, 5);
    assert_eq!(st.last_path, "/api/show");
    assert_eq!(st.last_model, "llama3.2:3b");
    h.shutdown().await;
}

#[tokio::test]
async fn cold_load_is_shared_then_shows_in_ps() {
    let mut sp = spec();
    sp.seats = 3; // all three wait on the load at once
    let (h, base, c) = node(sp).await;
    let body = json!({"model": "qwen2.5:7b", "prompt": "hello", "stream": false});
    let reqs = (0..3).map(|_| post(&c, format!("{base}/api/generate"), body.clone()));
    let outs = futures::future::join_all(reqs).await;
    for (s, v) in &outs {
        assert_eq!(*s, 200, "{v}");
        assert_eq!(v["done"], true);
    }
    // The request that triggered the load waited cold_load_ms.
    assert!(outs
        .iter()
        .any(|(_, v)| v["load_duration"].as_u64() >= Some(30_000_000)));
    assert_eq!(h.control().stats().loads, vec!["qwen2.5:7b".to_string()]);
    let ps = get(&c, format!("{base}/api/ps")).await;
    let names: Vec<&str> = ps["models"]
        .as_array()
        .expect("models")
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert_eq!(names, ["qwen2.5:7b", "llama3.2:3b"]);
    h.shutdown().await;
}

#[tokio::test]
async fn prewarm_unload_and_lru_eviction() {
    let mut sp = spec();
    sp.memory_gb = 6.0; // 2.2 + 5.17 > 6: loading qwen evicts llama
    let (h, base, c) = node(sp).await;
    let (s, v) = post(
        &c,
        format!("{base}/api/generate"),
        json!({"model": "qwen2.5:7b"}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(
        (v["done"].clone(), v["done_reason"].clone()),
        (json!(true), json!("load"))
    );
    let ps = get(&c, format!("{base}/api/ps")).await;
    assert_eq!(ps["models"].as_array().map(Vec::len), Some(1));
    assert_eq!(ps["models"][0]["name"], "qwen2.5:7b");
    let (_, v) = post(
        &c,
        format!("{base}/api/chat"),
        json!({"model": "qwen2.5:7b", "messages": [], "keep_alive": 0}),
    )
    .await;
    assert_eq!(v["done_reason"], "unload");
    assert_eq!(get(&c, format!("{base}/api/ps")).await["models"], json!([]));
    h.control().load_model("llama3.2:3b");
    assert_eq!(h.control().stats().loads, vec!["qwen2.5:7b", "llama3.2:3b"]);
    h.shutdown().await;
}

#[tokio::test]
async fn errors_unknown_model_context_and_bad_json() {
    let mut sp = spec();
    sp.models[0].context = 64;
    let (h, base, c) = node(sp).await;
    let (s, v) = post(&c, format!("{base}/api/chat"), chat_body("nope:1b", false)).await;
    assert_eq!((s, v), (404, json!({"error": "model 'nope:1b' not found"})));
    let (s, v) = post(
        &c,
        format!("{base}/v1/chat/completions"),
        chat_body("nope:1b", false),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].clone()),
        (404, json!("model_not_found"))
    );
    let (s, v) = post(
        &c,
        format!("{base}/v1/messages"),
        json!({"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["type"].clone()),
        (404, json!("not_found_error"))
    );
    // 9 prompt tokens + 60 > 64.
    let mut body = chat_body("llama3.2:3b", false);
    body["max_tokens"] = json!(60);
    let (s, v) = post(&c, format!("{base}/v1/chat/completions"), body).await;
    assert_eq!(s, 400);
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("This model's maximum context length is 64 tokens")));
    let long = "x".repeat(400);
    let (s, v) = post(
        &c,
        format!("{base}/api/generate"),
        json!({"model": "llama3.2:3b", "prompt": long, "stream": false}),
    )
    .await;
    assert_eq!(s, 400);
    assert!(v["error"].is_string());
    let (s, v) = post(
        &c,
        format!("{base}/api/chat"),
        chat_body("nomic-embed-text", false),
    )
    .await;
    assert_eq!(
        (s, v["error"].clone()),
        (
            400,
            json!("\"nomic-embed-text:latest\" does not support chat")
        )
    );
    for path in [
        "/api/chat",
        "/api/generate",
        "/v1/chat/completions",
        "/v1/messages",
        "/api/embed",
    ] {
        let r = c
            .post(format!("{base}{path}"))
            .body("{\"model\": ")
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 400, "{path}");
        let v: Value = r.json().await.expect("json error");
        assert!(v.get("error").is_some(), "{path}: {v}");
    }
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .body("[1,2]")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 400);
    assert_eq!(
        c.get(format!("{base}/nowhere"))
            .send()
            .await
            .expect("send")
            .status(),
        404
    );
    h.shutdown().await;
}

#[tokio::test]
async fn one_mib_body_arrives_whole() {
    let (h, base, c) = node(spec()).await;
    let big = "a".repeat(1 << 20);
    let body = serde_json::to_vec(&json!({"model": "llama3.2:3b", "messages": [{"role": "user", "content": big}], "stream": false})).expect("json");
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .body(body.clone())
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 400); // 262148 prompt tokens > 8192
    let st = h.control().stats();
    assert_eq!(st.last_body_len, body.len());
    assert_eq!(st.last_path, "/v1/chat/completions");
    assert_eq!(st.by_model.get("llama3.2:3b"), Some(&1));
    h.shutdown().await;
}

#[tokio::test]
async fn same_seed_same_text_other_seed_differs() {
    let mut texts = Vec::new();
    for seed in [7, 7, 8] {
        let mut sp = spec();
        sp.seed = seed;
        let (h, base, c) = node(sp).await;
        let (_, v) = post(
            &c,
            format!("{base}/api/chat"),
            chat_body("llama3.2:3b", false),
        )
        .await;
        texts.push(
            v["message"]["content"]
                .as_str()
                .map(str::to_string)
                .expect("content"),
        );
        h.shutdown().await;
    }
    assert_eq!(texts[0], texts[1]);
    assert_ne!(texts[0], texts[2]);
}

#[tokio::test]
async fn embeddings_and_pull() {
    let (h, base, c) = node(spec()).await;
    let (s, v) = post(
        &c,
        format!("{base}/api/embed"),
        json!({"model": "nomic-embed-text", "input": ["a", "b"]}),
    )
    .await;
    assert_eq!(s, 200);
    let e = v["embeddings"].as_array().expect("embeddings");
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].as_array().map(Vec::len), Some(384));
    assert_ne!(e[0], e[1]);
    let (_, v) = post(
        &c,
        format!("{base}/api/embeddings"),
        json!({"model": "nomic-embed-text", "prompt": "a"}),
    )
    .await;
    assert_eq!(v["embedding"], e[0]);
    let (_, v) = post(
        &c,
        format!("{base}/v1/embeddings"),
        json!({"model": "nomic-embed-text", "input": "a"}),
    )
    .await;
    assert_eq!(v["data"][0]["embedding"], e[0]);
    assert_eq!(v["usage"]["prompt_tokens"], 1);
    let r = c
        .post(format!("{base}/api/pull"))
        .json(&json!({"model": "mistral:7b"}))
        .send()
        .await
        .expect("send");
    let lines = ndjson(&drain(r).await.0);
    assert_eq!(
        lines.last().map(|l| l["status"].clone()),
        Some(json!("success"))
    );
    let tags = get(&c, format!("{base}/api/tags")).await;
    assert!(tags["models"]
        .as_array()
        .expect("models")
        .iter()
        .any(|m| m["name"] == "mistral:7b"));
    h.shutdown().await;
}

/// A node set to say its seats answers llama.cpp's `GET /props` with them (what a gateway
/// given only its URL asks); by default it has no such endpoint, as Ollama and vLLM do not.
#[tokio::test]
async fn a_node_that_says_its_seats_answers_props() {
    let (_h, base, c) = node(spec()).await;
    let r = c.get(format!("{base}/props")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let (_h, base, c) = node(fleetgate::sim::SimSpec {
        seats: 6,
        says_seats: true,
        ..spec()
    })
    .await;
    assert_eq!(get(&c, format!("{base}/props")).await["total_slots"], 6);
}
