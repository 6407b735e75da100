//! Criterion bench of request intake's parse: an OpenAI chat body (a system prompt and one
//! user message of 1, 8 and 64 KiB) read into what routing needs — model, prompt characters,
//! the stable prefix's hash (`protocol::parse`, which the proxy runs on every request).
//!
//! `cargo bench --bench intake`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fleetgate::protocol::{parse, Endpoint};

fn chat_body(kib: usize) -> Vec<u8> {
    const FILL: &str = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do ";
    let text: String = FILL.chars().cycle().take(kib * 1024).collect();
    serde_json::to_vec(&serde_json::json!({
        "model": "qwen2.5:7b",
        "stream": true,
        "max_tokens": 256,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": text},
        ],
    }))
    .expect("a JSON body")
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse_openai_chat");
    for kib in [1, 8, 64] {
        let body = chat_body(kib);
        let parsed = parse(Endpoint::OpenAIChat, &body).expect("the body parses");
        assert!(parsed.prefix.is_some() && parsed.prompt_chars >= kib * 1024);
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{kib}KiB")),
            &body,
            |b, body| b.iter(|| black_box(parse(Endpoint::OpenAIChat, black_box(body)))),
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
