//! Integration tests of the sim node's three protocols' streaming and whole responses.

use serde_json::{json, Value};

mod common;

use common::simnode::*;

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
