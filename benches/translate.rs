//! Criterion bench of streaming protocol translation: a 256-token response translated event by
//! event, fed in 1460-byte pieces (one TCP segment each), as the proxy's body filter does.
//!
//! Also the observer every proxied response passes through (`proxy::observe`, counting chunks
//! and keeping the tail that `usage` is read from), fed one event per chunk as a node sends them.
//!
//! `cargo bench --bench translate` (per-stream time; divide by 256 for the cost per token)

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use fleetgate::protocol::translate::{Context, ResponseTranslator, Translation};
use fleetgate::protocol::Endpoint;
use fleetgate::proxy::observe::StreamObserver;

const TOKENS: usize = 256;

fn openai_sse() -> Vec<u8> {
    let mut s = String::new();
    for i in 0..TOKENS {
        s.push_str(&format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"qwen2.5:7b\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" word{i}\"}},\"finish_reason\":null}}]}}\n\n"
        ));
    }
    s.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":256,\"total_tokens\":268}}\n\ndata: [DONE]\n\n");
    s.into_bytes()
}

fn ollama_ndjson() -> Vec<u8> {
    let mut s = String::new();
    for i in 0..TOKENS {
        s.push_str(&format!(
            "{{\"model\":\"qwen2.5:7b\",\"created_at\":\"2024-11-30T20:53:20Z\",\"message\":{{\"role\":\"assistant\",\"content\":\" word{i}\"}},\"done\":false}}\n"
        ));
    }
    s.push_str("{\"model\":\"qwen2.5:7b\",\"created_at\":\"2024-11-30T20:53:20Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done_reason\":\"stop\",\"done\":true,\"prompt_eval_count\":12,\"eval_count\":256}\n");
    s.into_bytes()
}

fn translate(t: Translation, body: &[u8]) -> usize {
    let ctx = Context {
        now_s: 1_733_000_000,
        id_seed: 7,
        model: "qwen2.5:7b".into(),
    };
    let mut x = ResponseTranslator::new(t, 200, true, ctx);
    let mut n = 0;
    for piece in body.chunks(1460) {
        n += x.feed(piece).len();
    }
    n + x.finish().len()
}

fn bench(c: &mut Criterion) {
    let sse = openai_sse();
    let nd = ollama_ndjson();
    let mut g = c.benchmark_group("translate_stream_256_tokens");
    g.throughput(Throughput::Elements(TOKENS as u64));
    let cases = [
        (
            "openai_sse_to_ollama",
            Endpoint::OllamaChat,
            Endpoint::OpenAIChat,
            &sse,
        ),
        (
            "openai_sse_to_anthropic",
            Endpoint::AnthropicMessages,
            Endpoint::OpenAIChat,
            &sse,
        ),
        (
            "openai_sse_to_responses",
            Endpoint::OpenAIResponses,
            Endpoint::OpenAIChat,
            &sse,
        ),
        (
            "ollama_ndjson_to_openai",
            Endpoint::OpenAIChat,
            Endpoint::OllamaChat,
            &nd,
        ),
    ];
    for (name, client, upstream, body) in cases {
        let t = Translation { client, upstream };
        assert!(
            translate(t, body) > body.len() / 4,
            "{name} produced output"
        );
        g.bench_function(name, |b| {
            b.iter(|| black_box(translate(t, black_box(body))))
        });
    }
    g.finish();
    let mut g = c.benchmark_group("observe_stream_256_tokens");
    g.throughput(Throughput::Elements(TOKENS as u64));
    for (name, body, end) in [("openai_sse", &sse, "\n\n"), ("ollama_ndjson", &nd, "\n")] {
        // One event per chunk, its terminator included, as a node sends them.
        let text = std::str::from_utf8(body).expect("UTF-8");
        let events: Vec<&[u8]> = text.split_inclusive(end).map(str::as_bytes).collect();
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut o = StreamObserver::default();
                for e in &events {
                    o.feed(black_box(e));
                }
                black_box(o.finish())
            })
        });
        let mut o = StreamObserver::default();
        for e in &events {
            o.feed(e);
        }
        assert_eq!(o.finish().completion_tokens, Some(256), "{name} usage read");
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
