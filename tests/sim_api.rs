//! Integration tests of the simulated inference node over real HTTP.

use fleetgate::sim::{start, Fault, SimHandle, SimModel, SimSpec};
use futures::StreamExt;
use serde_json::{json, Value};

fn spec() -> SimSpec {
    let mut small = SimModel::new("llama3.2:3b", 2.0);
    small.loaded = true;
    let mut big = SimModel::new("qwen2.5:7b", 4.7);
    big.cold_load_ms = 30;
    let mut emb = SimModel::new("nomic-embed-text:latest", 0.3);
    emb.embedding = true;
    emb.cold_load_ms = 0;
    SimSpec {
        seed: 7,
        ttft_ms: 1,
        tokens_per_sec: 2000.0,
        reply_tokens: 12,
        models: vec![small, big, emb],
        ..SimSpec::default()
    }
}

async fn node(spec: SimSpec) -> (SimHandle, String, reqwest::Client) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let h = start(spec, l).await.expect("start");
    let base = format!("http://{}", h.addr());
    let c = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    (h, base, c)
}

async fn post(c: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = c.post(url).json(&body).send().await.expect("send");
    let s = r.status().as_u16();
    (s, r.json().await.expect("json body"))
}

async fn get(c: &reqwest::Client, url: String) -> Value {
    let r = c.get(url).send().await.expect("send");
    assert_eq!(r.status(), 200);
    r.json().await.expect("json body")
}

/// Read a body to its end; returns the bytes and whether the stream ended in an error.
async fn drain(r: reqwest::Response) -> (String, bool) {
    let mut s = r.bytes_stream();
    let mut out = Vec::new();
    while let Some(item) = s.next().await {
        match item {
            Ok(b) => out.extend_from_slice(&b),
            Err(_) => return (String::from_utf8_lossy(&out).into_owned(), true),
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), false)
}

fn ndjson(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).expect("ndjson line"))
        .collect()
}

fn sse_data(s: &str) -> Vec<String> {
    s.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

fn chat_body(model: &str, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Why is the sky blue?"}], "stream": stream})
}

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
    let (h, base, c) = node(spec()).await;
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
async fn ollama_chat_streams_ndjson_and_matches_non_stream() {
    let (h, base, c) = node(spec()).await;
    let r = c.post(format!("{base}/api/chat")).json(&json!({"model": "llama3.2:3b", "messages": [{"role": "user", "content": "Why is the sky blue?"}]})).send().await.expect("send");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let (text, cut) = drain(r).await;
    assert!(!cut);
    let lines = ndjson(&text);
    let (last, chunks) = lines.split_last().expect("lines");
    assert_eq!(chunks.len(), 12);
    assert!(chunks
        .iter()
        .all(|l| l["done"] == false && l["message"]["role"] == "assistant"));
    assert_eq!(last["done"], true);
    assert_eq!(last["done_reason"], "stop");
    assert_eq!(last["eval_count"], 12);
    assert_eq!(last["prompt_eval_count"], 5 + 4);
    for k in [
        "total_duration",
        "load_duration",
        "prompt_eval_duration",
        "eval_duration",
    ] {
        assert!(last[k].is_u64(), "{k}");
    }
    let streamed: String = chunks
        .iter()
        .filter_map(|l| l["message"]["content"].as_str())
        .collect();
    let (s, whole) = post(
        &c,
        format!("{base}/api/chat"),
        chat_body("llama3.2:3b", false),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(whole["message"]["content"], streamed.as_str());
    assert_eq!(streamed.split_whitespace().count(), 12);
    // generate: `response` field; num_predict caps output.
    let (_, g) = post(&c, format!("{base}/api/generate"), json!({"model": "llama3.2:3b", "prompt": "hi", "stream": false, "options": {"num_predict": 3}})).await;
    assert_eq!(g["eval_count"], 3);
    assert_eq!(g["done_reason"], "length");
    assert_eq!(
        g["response"].as_str().map(|t| t.split_whitespace().count()),
        Some(3)
    );
    h.shutdown().await;
}

#[tokio::test]
async fn openai_chat_sse_ends_with_done_and_usage() {
    let (h, base, c) = node(spec()).await;
    let mut body = chat_body("llama3.2:3b", true);
    body["stream_options"] = json!({"include_usage": true});
    body["max_tokens"] = json!(5);
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let (text, cut) = drain(r).await;
    assert!(!cut);
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk"))
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .filter(|t| !t.is_empty())
        .collect();
    assert_eq!(content.len(), 5);
    let fin = &chunks[chunks.len() - 2];
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert_eq!(usage["usage"]["prompt_tokens"], 9);
    assert_eq!(usage["usage"]["total_tokens"], 14);
    // Non-stream.
    let (s, v) = post(
        &c,
        format!("{base}/v1/chat/completions"),
        chat_body("llama3.2:3b", false),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 12);
    assert!(v["choices"][0]["message"]["content"]
        .as_str()
        .is_some_and(|t| t.starts_with(content.concat().as_str())));
    // Legacy completions, streaming without usage.
    let r = c
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "llama3.2:3b", "prompt": "Once", "stream": true}))
        .send()
        .await
        .expect("send");
    let data = sse_data(&drain(r).await.0);
    assert_eq!(data.len(), 12 + 2);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    h.shutdown().await;
}

#[tokio::test]
async fn anthropic_messages_stream_and_whole() {
    let (h, base, c) = node(spec()).await;
    let body = json!({"model": "llama3.2:3b", "max_tokens": 4, "system": "be brief", "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}], "stream": true});
    let r = c
        .post(format!("{base}/v1/messages"))
        .json(&body)
        .send()
        .await
        .expect("send");
    let (text, cut) = drain(r).await;
    assert!(!cut);
    let events: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(
        events[..3],
        ["message_start", "content_block_start", "ping"]
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| **e == "content_block_delta")
            .count(),
        4
    );
    assert_eq!(
        events[events.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let delta: Value = sse_data(&text)
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["type"] == "message_delta")
        .expect("message_delta");
    assert_eq!(delta["usage"]["output_tokens"], 4);
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    whole["max_tokens"] = json!(100);
    let (s, v) = post(&c, format!("{base}/v1/messages"), whole).await;
    assert_eq!(s, 200);
    assert_eq!(v["type"], "message");
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"]["output_tokens"], 12);
    assert_eq!(v["usage"]["input_tokens"], 2 + 2 + 4);
    let mut no_max = body.clone();
    no_max.as_object_mut().map(|o| o.remove("max_tokens"));
    let (s, v) = post(&c, format!("{base}/v1/messages"), no_max).await;
    assert_eq!(
        (s, v["type"].clone(), v["error"]["type"].clone()),
        (400, json!("error"), json!("invalid_request_error"))
    );
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
async fn seats_bound_concurrency_and_backlog_is_fifo() {
    let mut sp = spec();
    sp.seats = 2;
    let (h, base, c) = node(sp).await;
    let ctl = h.control();
    ctl.hold_first_token(true);
    let url = format!("{base}/api/chat");
    let reqs: Vec<_> = (0..4)
        .map(|_| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move { post(&c, url, chat_body("llama3.2:3b", false)).await })
        })
        .collect();
    ctl.wait_parked(2).await;
    ctl.wait_requests(4).await;
    let st = ctl.stats();
    assert_eq!((st.in_flight, st.queued), (2, 2));
    ctl.release();
    for r in reqs {
        assert_eq!(r.await.expect("join").0, 200);
    }
    let st = ctl.stats();
    assert_eq!((st.in_flight, st.max_in_flight, st.queued), (0, 2, 0));
    h.shutdown().await;

    // FIFO with one seat: B queued before C finishes before C.
    let (h, base, c) = node(spec()).await;
    let ctl = h.control();
    ctl.hold_first_token(true);
    let order = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let run = |tag: &'static str| {
        let (c, url, order) = (c.clone(), format!("{base}/api/chat"), order.clone());
        tokio::spawn(async move {
            let (s, _) = post(&c, url, chat_body("llama3.2:3b", false)).await;
            order.lock().push((tag, s));
        })
    };
    let a = run("a");
    ctl.wait_parked(1).await;
    let b = run("b");
    ctl.wait_requests(2).await;
    let cc = run("c");
    ctl.wait_requests(3).await;
    assert_eq!(ctl.stats().queued, 2);
    ctl.release();
    for t in [a, b, cc] {
        t.await.expect("join");
    }
    assert_eq!(*order.lock(), vec![("a", 200), ("b", 200), ("c", 200)]);
    h.shutdown().await;
}

#[tokio::test]
async fn fault_refuse_then_back_on_same_port() {
    let (h, base, c) = node(spec()).await;
    assert!(c.get(format!("{base}/api/tags")).send().await.is_ok());
    h.control().set_fault(Fault::Refuse);
    // The pooled connection was cut; a new one is refused.
    assert!(c.get(format!("{base}/api/tags")).send().await.is_err());
    let fresh = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let e = fresh
        .get(format!("{base}/api/tags"))
        .send()
        .await
        .expect_err("refused");
    assert!(e.is_connect(), "{e:?}");
    let raw = tokio::net::TcpStream::connect(h.addr())
        .await
        .expect_err("refused");
    assert_eq!(raw.kind(), std::io::ErrorKind::ConnectionRefused);
    h.control().set_fault(Fault::None);
    let v = get(&c, format!("{base}/api/tags")).await;
    assert_eq!(v["models"].as_array().map(Vec::len), Some(3));
    h.shutdown().await;
}

#[tokio::test]
async fn fault_status500_only_on_inference() {
    let (h, base, c) = node(spec()).await;
    h.control().set_fault(Fault::Status500);
    let (s, v) = post(
        &c,
        format!("{base}/api/chat"),
        chat_body("llama3.2:3b", true),
    )
    .await;
    assert_eq!(s, 500);
    assert!(v["error"].is_string());
    let (s, v) = post(
        &c,
        format!("{base}/v1/chat/completions"),
        chat_body("llama3.2:3b", false),
    )
    .await;
    assert_eq!(
        (s, v["error"]["type"].clone()),
        (500, json!("server_error"))
    );
    let (s, v) = post(
        &c,
        format!("{base}/v1/messages"),
        json!({"model": "llama3.2:3b", "max_tokens": 3, "messages": []}),
    )
    .await;
    assert_eq!((s, v["error"]["type"].clone()), (500, json!("api_error")));
    get(&c, format!("{base}/api/tags")).await;
    h.control().set_fault(Fault::None);
    assert_eq!(
        post(
            &c,
            format!("{base}/api/chat"),
            chat_body("llama3.2:3b", false)
        )
        .await
        .0,
        200
    );
    h.shutdown().await;
}

#[tokio::test]
async fn fault_die_mid_stream_truncates() {
    let (h, base, c) = node(spec()).await;
    h.control().set_fault(Fault::DieMidStream);
    let r = c
        .post(format!("{base}/api/chat"))
        .json(&chat_body("llama3.2:3b", true))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let (text, cut) = drain(r).await;
    assert!(cut, "stream should end in an error");
    let lines = ndjson(&text);
    assert!(
        !lines.is_empty() && lines.iter().all(|l| l["done"] == false),
        "{text}"
    );
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat_body("llama3.2:3b", true))
        .send()
        .await
        .expect("send");
    let (text, cut) = drain(r).await;
    assert!(cut && !text.contains("[DONE]") && text.contains("chat.completion.chunk"));
    h.control().set_fault(Fault::None);
    let r = c
        .post(format!("{base}/v1/chat/completions"))
        .json(&chat_body("llama3.2:3b", true))
        .send()
        .await
        .expect("send");
    let (text, cut) = drain(r).await;
    assert!(!cut && text.ends_with("data: [DONE]\n\n"));
    h.shutdown().await;
}

#[tokio::test]
async fn hold_after_first_chunk_then_die_while_parked() {
    let (h, base, c) = node(spec()).await;
    let ctl = h.control();
    ctl.hold_after_first_chunk(true);
    let r = c
        .post(format!("{base}/api/generate"))
        .json(&json!({"model": "llama3.2:3b", "prompt": "hi"}))
        .send()
        .await
        .expect("send");
    let mut s = r.bytes_stream();
    let first = s.next().await.expect("first chunk").expect("ok chunk");
    let first: Value = serde_json::from_slice(&first).expect("one ndjson line");
    assert_eq!(first["done"], false);
    ctl.wait_parked(1).await;
    assert_eq!(ctl.stats().in_flight, 1);
    ctl.set_fault(Fault::DieMidStream);
    ctl.release();
    let mut cut = false;
    while let Some(item) = s.next().await {
        if item.is_err() {
            cut = true;
        }
    }
    assert!(cut);
    ctl.set_fault(Fault::None);
    h.shutdown().await;
}

#[tokio::test]
async fn fault_hang_never_answers() {
    let (h, base, c) = node(spec()).await;
    h.control().set_fault(Fault::Hang);
    let url = format!("{base}/api/tags");
    let req = tokio::spawn(async move { c.get(url).send().await.map(|r| r.status().as_u16()) });
    h.control().wait_requests(1).await;
    // A hung request only ends when the node cuts the connection.
    h.control().set_fault(Fault::Refuse);
    assert!(req.await.expect("join").is_err());
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

#[tokio::test]
async fn shutdown_frees_the_port() {
    let (h, _, _) = node(spec()).await;
    let addr = h.addr();
    h.shutdown().await;
    let l = std::net::TcpListener::bind(addr).expect("port is free again");
    drop(l);
}
