//! Table tests on recorded bodies (shapes as the real servers send them), per direction.

use serde_json::{json, Value};

use super::*;
use crate::protocol::Endpoint::*;

fn t(client: Endpoint, upstream: Endpoint) -> Translation {
    Translation { client, upstream }
}

fn ctx() -> Context {
    Context {
        now_s: 1_733_000_000,
        id_seed: 0xabc,
        model: "qwen2.5:7b".into(),
    }
}

fn req(tr: Translation, body: Value) -> Value {
    let out = request(tr, body.to_string().as_bytes()).expect("translates");
    serde_json::from_slice(&out).expect("json")
}

/// Run a recorded upstream body through the translator, split at every `step` bytes.
fn run(tr: Translation, status: u16, stream: bool, body: &str, step: usize) -> String {
    let mut x = ResponseTranslator::new(tr, status, stream, ctx());
    let mut out = Vec::new();
    for piece in body.as_bytes().chunks(step) {
        out.extend_from_slice(&x.feed(piece));
    }
    out.extend_from_slice(&x.finish());
    String::from_utf8(out).expect("utf8")
}

/// The SSE events a 200 stream `body` becomes, fed `step` bytes at a time.
fn streamed(tr: Translation, body: &str, step: usize) -> Vec<(String, Value)> {
    sse_data(&run(tr, 200, true, body, step))
}

fn sse_data(text: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut name = String::new();
    for l in text.lines() {
        if let Some(n) = l.strip_prefix("event: ") {
            name = n.into();
        } else if let Some(d) = l.strip_prefix("data: ") {
            let v = serde_json::from_str(d).unwrap_or(json!(d));
            out.push((std::mem::take(&mut name), v));
        }
    }
    out
}

/// A llama.cpp-style chat stream: role chunk, two words, finish, usage chunk, [DONE].
const OPENAI_CHAT_SSE: &str = concat!(
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen2.5:7b\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen2.5:7b\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen2.5:7b\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen2.5:7b\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen2.5:7b\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":2,\"total_tokens\":14}}\n\n",
    "data: [DONE]\n\n",
);

/// A vLLM-style tool-call stream: the call's id and name first, then the arguments in pieces.
const OPENAI_TOOL_SSE: &str = concat!(
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"tool_calls\":[{\"index\":0,\"id\":\"call_9\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"city\\\":\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"Paris\\\"}\"}}]},\"finish_reason\":null}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":9,\"total_tokens\":39}}\n\n",
    "data: [DONE]\n\n",
);

/// A whole OpenAI chat answer with a tool call.
fn openai_tool_whole() -> Value {
    json!({"id": "chatcmpl-2", "object": "chat.completion", "created": 1, "model": "qwen2.5:7b",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}})
}

#[test]
fn upstream_choice_by_what_the_node_speaks() {
    use Family::*;
    let cases: &[(Endpoint, &[Family], Option<Endpoint>)] = &[
        (OllamaChat, &[OpenAI, Ollama], Some(OllamaChat)),
        (OllamaChat, &[OpenAI], Some(OpenAIChat)),
        (OllamaGenerate, &[OpenAI], Some(OpenAICompletions)),
        (OllamaEmbed, &[OpenAI], Some(OpenAIEmbeddings)),
        (OllamaEmbeddings, &[OpenAI], Some(OpenAIEmbeddings)),
        (AnthropicMessages, &[OpenAI], Some(OpenAIChat)),
        (
            AnthropicMessages,
            &[Anthropic, OpenAI],
            Some(AnthropicMessages),
        ),
        (AnthropicMessages, &[Ollama], None),
        (OpenAIChat, &[Ollama], Some(OllamaChat)),
        (OpenAICompletions, &[Ollama], Some(OllamaGenerate)),
        (OpenAIEmbeddings, &[Ollama], Some(OllamaEmbed)),
        (OpenAIResponses, &[OpenAI], Some(OpenAIChat)),
        (OpenAIResponses, &[Ollama], None),
        (OpenAIChat, &[Anthropic], None),
    ];
    for (ep, families, want) in cases {
        assert_eq!(upstream_for(*ep, families), *want, "{ep:?} {families:?}");
        // Stage 1 keeps exactly the nodes a translation exists for.
        let reachable = families.contains(&ep.family())
            || translatable(*ep).iter().any(|f| families.contains(f));
        assert_eq!(reachable, want.is_some(), "{ep:?} {families:?}");
    }
}

#[test]
fn ollama_chat_request_to_openai() {
    let body = json!({"model": "qwen2.5:7b", "keep_alive": "5m",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is this?", "images": ["iVBORw0KGgo="]},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "content": "18C", "tool_name": "get_weather"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        "format": "json",
        "options": {"temperature": 0.2, "num_predict": 64, "stop": ["\n\n"], "num_ctx": 8192}});
    let v = req(t(OllamaChat, OpenAIChat), body);
    assert_eq!(v["stream"], true, "Ollama streams unless told not to");
    assert_eq!(v["stream_options"]["include_usage"], true);
    assert_eq!(
        (v["max_tokens"].clone(), v["temperature"].clone()),
        (json!(64), json!(0.2))
    );
    assert_eq!(v["stop"], json!(["\n\n"]));
    assert_eq!(v["response_format"]["type"], "json_object");
    assert!(v.get("keep_alive").is_none() && v.get("options").is_none());
    let m = &v["messages"];
    assert_eq!(
        m[1]["content"][1]["image_url"]["url"],
        "data:image/png;base64,iVBORw0KGgo="
    );
    assert_eq!(
        m[2]["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Paris\"}"
    );
    assert_eq!(m[3]["tool_call_id"], m[2]["tool_calls"][0]["id"]);
    assert_eq!(v["tools"][0]["function"]["name"], "get_weather");
}

#[test]
fn ollama_generate_and_embed_requests() {
    let v = req(
        t(OllamaGenerate, OpenAICompletions),
        json!({"model": "m", "system": "S", "prompt": "P", "stream": false}),
    );
    assert_eq!(
        (v["prompt"].clone(), v["stream"].clone()),
        (json!("S\n\nP"), json!(false))
    );
    let e = request(
        t(OllamaGenerate, OpenAICompletions),
        br#"{"model":"m","prompt":"p","images":["AAAA"]}"#,
    );
    assert!(e.unwrap_err().contains("/api/chat"));
    let v = req(
        t(OllamaEmbeddings, OpenAIEmbeddings),
        json!({"model": "m", "prompt": "a"}),
    );
    assert_eq!(v["input"], "a");
    let v = req(
        t(OllamaEmbed, OpenAIEmbeddings),
        json!({"model": "m", "input": ["a", "b"]}),
    );
    assert_eq!(v["input"], json!(["a", "b"]));
}

#[test]
fn openai_stream_to_ollama_ndjson_at_any_chunk_boundary() {
    for step in [1, 7, 64, 4096] {
        let out = run(t(OllamaChat, OpenAIChat), 200, true, OPENAI_CHAT_SSE, step);
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).expect(l))
            .collect();
        assert_eq!(lines.len(), 3, "two words then done: {out}");
        assert_eq!(lines[0]["message"]["content"], "Hello");
        assert_eq!(lines[1]["message"]["content"], " there");
        assert_eq!(lines[0]["created_at"], "2024-11-30T20:53:20Z");
        let last = &lines[2];
        assert_eq!(
            (last["done"].clone(), last["done_reason"].clone()),
            (json!(true), json!("stop"))
        );
        assert_eq!(
            (
                last["prompt_eval_count"].clone(),
                last["eval_count"].clone()
            ),
            (json!(12), json!(2))
        );
    }
    // The first token goes out with the chunk that carried it, before the stream ends.
    let mut x = ResponseTranslator::new(t(OllamaChat, OpenAIChat), 200, true, ctx());
    let (first, _) = OPENAI_CHAT_SSE.split_at(OPENAI_CHAT_SSE.find("\" there").expect("2nd"));
    assert!(String::from_utf8_lossy(&x.feed(first.as_bytes())).contains("Hello"));
    // Tool calls arrive in pieces and leave whole, with arguments as an object.
    let out = run(t(OllamaChat, OpenAIChat), 200, true, OPENAI_TOOL_SSE, 5);
    let last: Value = serde_json::from_str(out.lines().last().expect("line")).expect("json");
    assert_eq!(
        last["message"]["tool_calls"][0]["function"],
        json!({"name": "get_weather", "arguments": {"city": "Paris"}})
    );
}

#[test]
fn openai_whole_bodies_to_ollama() {
    let tr = t(OllamaChat, OpenAIChat);
    let v: Value = serde_json::from_str(&run(tr, 200, false, &openai_tool_whole().to_string(), 9))
        .expect("json");
    assert_eq!(
        v["message"]["tool_calls"][0]["function"]["arguments"]["city"],
        "Paris"
    );
    assert_eq!(
        (v["done"].clone(), v["eval_count"].clone()),
        (json!(true), json!(9))
    );
    let emb = json!({"object": "list", "model": "e", "data": [
        {"object": "embedding", "index": 1, "embedding": [0.3]},
        {"object": "embedding", "index": 0, "embedding": [0.1]}], "usage": {"prompt_tokens": 2, "total_tokens": 2}});
    let v: Value = serde_json::from_str(&run(
        t(OllamaEmbed, OpenAIEmbeddings),
        200,
        false,
        &emb.to_string(),
        3,
    ))
    .expect("json");
    assert_eq!(v["embeddings"], json!([[0.1], [0.3]]), "in input order");
    let v: Value = serde_json::from_str(&run(
        t(OllamaEmbeddings, OpenAIEmbeddings),
        200,
        false,
        &emb.to_string(),
        3,
    ))
    .expect("json");
    assert_eq!(v["embedding"], json!([0.1]));
}

#[test]
fn node_errors_keep_the_clients_shape() {
    let openai_err = r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    let v: Value = serde_json::from_str(&run(t(OllamaChat, OpenAIChat), 400, true, openai_err, 10))
        .expect("json");
    assert_eq!(
        v,
        json!({"error": "This model's maximum context length is 8192 tokens."})
    );
    let v: Value = serde_json::from_str(&run(
        t(AnthropicMessages, OpenAIChat),
        400,
        true,
        openai_err,
        10,
    ))
    .expect("json");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let ollama_err = r#"{"error":"model \"llama9\" not found, try pulling it first"}"#;
    let v: Value = serde_json::from_str(&run(t(OpenAIChat, OllamaChat), 404, false, ollama_err, 4))
        .expect("json");
    assert_eq!(v["error"]["code"], "model_not_found");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("llama9")));
    // llama.cpp's plain-text 404 still becomes a JSON error.
    let v: Value = serde_json::from_str(&run(
        t(OllamaChat, OpenAIChat),
        404,
        true,
        "File Not Found",
        4,
    ))
    .expect("json");
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|m| m.contains("File Not Found")),
        "{v}"
    );
    // An error event inside a stream becomes the client's stream error.
    let out = run(
        t(OllamaChat, OpenAIChat),
        200,
        true,
        "data: {\"error\":{\"message\":\"boom\"}}\n\n",
        3,
    );
    assert!(out.contains("\"error\":\"boom\""), "{out}");
}

/// Ollama NDJSON as a real server sends it (the last line carries the counts).
const OLLAMA_CHAT_NDJSON: &str = concat!(
    "{\"model\":\"qwen2.5:7b\",\"created_at\":\"2024-11-30T20:53:20Z\",\"message\":{\"role\":\"assistant\",\"content\":\"Hello\"},\"done\":false}\n",
    "{\"model\":\"qwen2.5:7b\",\"created_at\":\"2024-11-30T20:53:20Z\",\"message\":{\"role\":\"assistant\",\"content\":\" there\"},\"done\":false}\n",
    "{\"model\":\"qwen2.5:7b\",\"created_at\":\"2024-11-30T20:53:20Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done_reason\":\"length\",\"done\":true,\"total_duration\":5000000,\"prompt_eval_count\":12,\"eval_count\":2,\"eval_duration\":400000}\n",
);

#[test]
fn openai_client_on_ollama_requests_and_stream() {
    let body = json!({"model": "m", "max_tokens": 20, "stop": "END", "response_format": {"type": "json_object"},
        "messages": [{"role": "developer", "content": "D"},
            {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/AA"}}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]});
    let v = req(t(OpenAIChat, OllamaChat), body);
    assert_eq!(v["stream"], false, "OpenAI does not stream unless asked");
    assert_eq!(v["options"], json!({"num_predict": 20, "stop": ["END"]}));
    assert_eq!(v["format"], "json");
    assert_eq!(v["messages"][0]["role"], "system");
    assert_eq!(v["messages"][1]["images"], json!(["/9j/AA"]));
    assert_eq!(
        v["messages"][2]["tool_calls"][0]["function"]["arguments"],
        json!({"a": 1})
    );
    let e = request(t(OpenAIChat, OllamaChat), br#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}"#);
    assert!(e.unwrap_err().contains("base64"));
    let v = req(
        t(OpenAICompletions, OllamaGenerate),
        json!({"model": "m", "prompt": ["p"]}),
    );
    assert_eq!(
        (v["prompt"].clone(), v["raw"].clone()),
        (json!("p"), json!(true))
    );
    assert!(request(
        t(OpenAIEmbeddings, OllamaEmbed),
        br#"{"model":"m","input":[[1,2]]}"#
    )
    .is_err());
    for step in [1, 13, 4096] {
        let ev = streamed(t(OpenAIChat, OllamaChat), OLLAMA_CHAT_NDJSON, step);
        let text: String = ev
            .iter()
            .filter_map(|(_, d)| d["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello there");
        assert_eq!(ev[0].1["choices"][0]["delta"]["role"], "assistant");
        let fin = &ev[ev.len() - 2].1;
        assert_eq!(fin["choices"][0]["finish_reason"], "length");
        assert_eq!(fin["usage"]["completion_tokens"], 2);
        assert_eq!(ev.last().map(|e| e.1.clone()), Some(json!("[DONE]")));
    }
}

#[test]
fn anthropic_request_to_openai_chat() {
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "stop_sequences": ["###"],
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
        "tool_choice": {"type": "any"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Open main.rs"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "…", "signature": "x"},
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"path": "main.rs"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "fn main() {}"}]},
                {"type": "text", "text": "Explain it"}]}],
        "stream": true});
    let v = req(t(AnthropicMessages, OpenAIChat), body);
    let m = &v["messages"];
    assert_eq!(
        m[0],
        json!({"role": "system", "content": "You are Claude Code."})
    );
    assert_eq!(
        m[1]["content"][1]["image_url"]["url"],
        "data:image/png;base64,iVBOR"
    );
    assert_eq!(m[2]["content"], "Reading.");
    assert_eq!(
        m[2]["tool_calls"][0]["function"],
        json!({"name": "Read", "arguments": "{\"path\":\"main.rs\"}"})
    );
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "toolu_01", "content": "fn main() {}"})
    );
    assert_eq!(m[4], json!({"role": "user", "content": "Explain it"}));
    assert_eq!(v["tools"][0]["function"]["parameters"]["type"], "object");
    assert_eq!(
        (v["tool_choice"].clone(), v["stop"].clone()),
        (json!("required"), json!(["###"]))
    );
    assert_eq!(v["stream_options"]["include_usage"], true);
}

#[test]
fn openai_chat_to_anthropic_whole_and_streamed() {
    let v: Value = serde_json::from_str(&run(
        t(AnthropicMessages, OpenAIChat),
        200,
        false,
        &openai_tool_whole().to_string(),
        11,
    ))
    .expect("json");
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(
        v["content"][0],
        json!({"type": "tool_use", "id": "call_9", "name": "get_weather", "input": {"city": "Paris"}})
    );
    assert_eq!(v["usage"], json!({"input_tokens": 30, "output_tokens": 9}));
    for step in [1, 50, 4096] {
        let ev = streamed(t(AnthropicMessages, OpenAIChat), OPENAI_CHAT_SSE, step);
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(
            ev[3].1["delta"],
            json!({"type": "text_delta", "text": " there"})
        );
        assert_eq!(ev[5].1["delta"]["stop_reason"], "end_turn");
        assert_eq!(ev[5].1["usage"]["output_tokens"], 2);
    }
    let ev = streamed(t(AnthropicMessages, OpenAIChat), OPENAI_TOOL_SSE, 3);
    let start = ev
        .iter()
        .find(|(n, _)| n == "content_block_start")
        .expect("start");
    assert_eq!(
        start.1["content_block"],
        json!({"type": "tool_use", "id": "call_9", "name": "get_weather", "input": {}})
    );
    let json_parts: String = ev
        .iter()
        .filter_map(|(_, d)| d["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(json_parts, "{\"city\":\"Paris\"}");
    assert_eq!(ev[ev.len() - 2].1["delta"]["stop_reason"], "tool_use");
}

#[test]
fn responses_request_and_refusals() {
    let body = json!({"model": "gpt-5-codex", "instructions": "Be brief.", "max_output_tokens": 100,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": "{\"cmd\":\"pwd\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {"type": "function_call_output", "call_id": "c2", "output": "/"}],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}}});
    let v = req(t(OpenAIResponses, OpenAIChat), body);
    let m = &v["messages"];
    assert_eq!(m[0]["role"], "system");
    assert_eq!(
        m[1]["content"][1]["image_url"]["url"],
        "data:image/png;base64,AA"
    );
    assert_eq!(
        m[2]["tool_calls"].as_array().map(Vec::len),
        Some(2),
        "consecutive calls: one turn"
    );
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt"})
    );
    assert_eq!(v["max_tokens"], 100);
    assert_eq!(v["tools"][0]["function"]["name"], "shell");
    assert_eq!(v["response_format"]["json_schema"]["name"], "out");
    let e = request(
        t(OpenAIResponses, OpenAIChat),
        br#"{"model":"m","input":"x","previous_response_id":"resp_1"}"#,
    );
    assert!(e.unwrap_err().contains("stateless"));
    let e = request(
        t(OpenAIResponses, OpenAIChat),
        br#"{"model":"m","input":"x","tools":[{"type":"web_search"}]}"#,
    );
    assert!(e.unwrap_err().contains("function tools"));
}

#[test]
fn openai_chat_to_responses_whole_and_streamed() {
    let v: Value = serde_json::from_str(&run(
        t(OpenAIResponses, OpenAIChat),
        200,
        false,
        &openai_tool_whole().to_string(),
        8,
    ))
    .expect("json");
    assert_eq!(
        (v["object"].clone(), v["status"].clone()),
        (json!("response"), json!("completed"))
    );
    assert_eq!(v["output"][0]["type"], "function_call");
    assert_eq!(
        (
            v["output"][0]["call_id"].clone(),
            v["output"][0]["arguments"].clone()
        ),
        (json!("call_9"), json!("{\"city\":\"Paris\"}"))
    );
    assert_eq!(v["usage"]["total_tokens"], 39);
    for step in [1, 33, 4096] {
        let ev = streamed(t(OpenAIResponses, OpenAIChat), OPENAI_CHAT_SSE, step);
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let seq: Vec<u64> = ev
            .iter()
            .filter_map(|(_, d)| d["sequence_number"].as_u64())
            .collect();
        assert_eq!(seq, (0..10).collect::<Vec<_>>());
        assert_eq!(ev[6].1["text"], "Hello there");
        assert_eq!(ev[9].1["response"]["usage"]["output_tokens"], 2);
    }
    let ev = streamed(t(OpenAIResponses, OpenAIChat), OPENAI_TOOL_SSE, 6);
    let args: String = ev
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect();
    assert_eq!(args, "{\"city\":\"Paris\"}");
    let done = &ev.last().expect("completed").1["response"]["output"][0];
    assert_eq!(
        (done["name"].clone(), done["arguments"].clone()),
        (json!("get_weather"), json!(args))
    );
}

#[test]
fn ollama_tool_call_stream_to_openai() {
    let nd = concat!(
        "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}}]},\"done\":false}\n",
        "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done_reason\":\"stop\",\"done\":true,\"prompt_eval_count\":5,\"eval_count\":3}\n",
    );
    let ev = streamed(t(OpenAIChat, OllamaChat), nd, 4);
    let call = &ev[0].1["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(call["function"]["arguments"], "{\"city\":\"Paris\"}");
    assert_eq!(call["id"], "call_0");
    assert_eq!(ev[1].1["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(ev[2].1, json!("[DONE]"));
}
