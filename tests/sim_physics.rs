//! Sim node physics over real HTTP: prefill rate, prefix cache, decode contention, the
//! run-time slowdown, and the usage/timings each protocol reports for them.

use serde_json::{json, Value};
use std::time::Duration;

mod common;

use common::simnode::*;

fn ns(v: &Value, k: &str) -> Duration {
    Duration::from_nanos(v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}")))
}

/// A chat of `turns` user turns, each `chars` long, with the assistant's replies between.
fn history(turns: usize, chars: usize) -> Vec<Value> {
    let mut m = vec![json!({"role": "system", "content": "s".repeat(chars)})];
    for t in 0..turns {
        if t > 0 {
            m.push(json!({"role": "assistant", "content": format!("reply {t}")}));
        }
        m.push(json!({"role": "user", "content": format!("{t}").repeat(chars)}));
    }
    m
}

#[tokio::test]
async fn prefill_pays_for_uncached_tokens_only_and_usage_says_so() {
    let mut sp = spec();
    sp.prefill_tokens_per_sec = Some(20_000.0);
    sp.prefix_cache_entries = 4;
    sp.models[0].context = 65_536;
    let (h, base, c) = node(sp).await;
    // Turn 1: 4004 + 4004 prompt tokens, nothing cached: >= 8008 / 20000 s = 400 ms of prefill.
    let chat =
        |msgs: Vec<Value>| json!({"model": "llama3.2:3b", "messages": msgs, "stream": false});
    let (s, one) = post(&c, format!("{base}/api/chat"), chat(history(1, 16_000))).await;
    assert_eq!(s, 200, "{one}");
    assert_eq!(one["prompt_eval_count"], 8008);
    assert!(
        ns(&one, "prompt_eval_duration") >= Duration::from_millis(400),
        "{one}"
    );
    let st = h.control().stats();
    assert_eq!((st.prefix_hits, st.prefix_tokens_reused), (0, 0));
    assert_eq!(st.prompt_tokens_prefilled, 8008);
    // Turn 2 resends turn 1: only the reply and the new turn are prefilled.
    let (s, two) = post(&c, format!("{base}/api/chat"), chat(history(2, 400))).await;
    assert_eq!(s, 200, "{two}");
    assert_eq!(
        two["prompt_eval_count"],
        104 + 104 + 6 + 104,
        "short history: no match"
    );
    let (s, two) = post(&c, format!("{base}/api/chat"), chat(history(2, 16_000))).await;
    assert_eq!(s, 200, "{two}");
    assert_eq!(
        two["prompt_eval_count"],
        6 + 4004,
        "reply + new turn: {two}"
    );
    let st = h.control().stats();
    assert_eq!((st.prefix_hits, st.prefix_tokens_reused), (1, 8008));
    // OpenAI usage: full prompt, the reused part in prompt_tokens_details.
    let body = json!({"model": "llama3.2:3b", "messages": history(3, 16_000)});
    let (s, v) = post(&c, format!("{base}/v1/chat/completions"), body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 8008 + 4010 + 4010);
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"],
        8008 + 4010
    );
    assert_eq!(h.control().stats().prefix_hits, 2);
    // Raw prompts match by leading blocks.
    let doc = "d".repeat(8192);
    let g = |p: String| json!({"model": "llama3.2:3b", "prompt": p, "stream": false});
    let (_, a) = post(&c, format!("{base}/api/generate"), g(doc.clone())).await;
    assert_eq!(a["prompt_eval_count"], 2048);
    let (_, b) = post(&c, format!("{base}/api/generate"), g(format!("{doc} more"))).await;
    assert_eq!(b["prompt_eval_count"], 2, "{b}");
    h.shutdown().await;
}

#[tokio::test]
async fn cache_off_by_default_and_lost_with_the_model() {
    let mut sp = spec();
    sp.prefix_cache_entries = 0;
    let (h, base, c) = node(sp.clone()).await;
    let body = json!({"model": "llama3.2:3b", "messages": history(1, 400), "stream": false});
    for _ in 0..2 {
        let (_, v) = post(&c, format!("{base}/api/chat"), body.clone()).await;
        assert_eq!(v["prompt_eval_count"], 208);
    }
    assert_eq!(h.control().stats().prefix_hits, 0);
    h.shutdown().await;
    sp.prefix_cache_entries = 8;
    let (h, base, c) = node(sp).await;
    post(&c, format!("{base}/api/chat"), body.clone()).await;
    h.control().unload_model("llama3.2:3b");
    let (_, v) = post(&c, format!("{base}/api/chat"), body.clone()).await;
    assert_eq!(
        v["prompt_eval_count"], 208,
        "reloaded model has an empty cache"
    );
    let (_, v) = post(&c, format!("{base}/api/chat"), body).await;
    assert_eq!(v["prompt_eval_count"], 0, "whole prompt reused");
    assert_eq!(h.control().stats().loads, vec!["llama3.2:3b"]);
    h.shutdown().await;
}

#[tokio::test]
async fn concurrent_decodes_share_the_node_and_seat_time_is_counted() {
    let mut sp = spec();
    sp.seats = 2;
    sp.tokens_per_sec = 200.0;
    sp.reply_tokens = 20;
    sp.decode_contention = 1.0;
    let (h, base, c) = node(sp).await;
    let ctl = h.control();
    // Both park before their first token, then decode side by side at 100 tokens/s each.
    ctl.hold_first_token(true);
    let body = json!({"model": "llama3.2:3b", "prompt": "hi", "stream": false});
    let reqs = futures::future::join_all(
        (0..2).map(|_| post(&c, format!("{base}/api/generate"), body.clone())),
    );
    let release = async {
        ctl.wait_parked(2).await;
        ctl.release();
    };
    let (outs, ()) = tokio::join!(reqs, release);
    for (s, v) in outs {
        assert_eq!(s, 200, "{v}");
        // 19 token times at half of 200/s: ~190 ms (alone it would be 95 ms); the two start
        // and end a step apart, when each runs alone.
        assert!(ns(&v, "eval_duration") >= Duration::from_millis(150), "{v}");
    }
    assert!(ctl.stats().seat_seconds >= 0.3, "{:?}", ctl.stats());
    h.shutdown().await;
}

#[tokio::test]
async fn slowdown_switches_at_run_time() {
    let mut sp = spec();
    sp.ttft_ms = 60;
    let (h, base, c) = node(sp).await;
    let ctl = h.control();
    assert_eq!(ctl.slowdown(), 1.0);
    ctl.set_slowdown(5.0);
    ctl.set_slowdown(f64::NAN); // ignored
    assert_eq!(ctl.slowdown(), 5.0);
    let body = json!({"model": "llama3.2:3b", "prompt": "hi", "stream": false});
    let (_, v) = post(&c, format!("{base}/api/generate"), body.clone()).await;
    assert!(
        ns(&v, "prompt_eval_duration") >= Duration::from_millis(300),
        "{v}"
    );
    // 12 tokens at 2000/5 per second: >= 11 x 2.5 ms.
    assert!(
        ns(&v, "eval_duration") >= Duration::from_micros(27_500),
        "{v}"
    );
    ctl.set_slowdown(1.0);
    let (s, _) = post(&c, format!("{base}/api/generate"), body).await;
    assert_eq!(s, 200);
    h.shutdown().await;
}

#[tokio::test]
async fn prefill_parallel_makes_prompts_wait_their_turn() {
    let mut sp = spec();
    sp.seats = 4;
    sp.prefill_tokens_per_sec = Some(20_000.0);
    sp.prefill_parallel = 1;
    sp.models[0].context = 65_536;
    let (h, base, c) = node(sp).await;
    // ~4,000 prompt tokens each: 200 ms of prefill alone. Two at once on a node that prefills
    // one prompt at a time: the second waits for the first, ~400 ms to its first token.
    let body = json!({"model": "llama3.2:3b", "prompt": "w".repeat(16_000), "stream": false});
    let (a, b) = tokio::join!(
        post(&c, format!("{base}/api/generate"), body.clone()),
        async {
            // Once the first holds its seat (is prefilling).
            while h.control().stats().in_flight == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            post(&c, format!("{base}/api/generate"), body.clone()).await
        }
    );
    assert_eq!((a.0, b.0), (200, 200), "{} {}", a.1, b.1);
    let (first, second) = (
        ns(&a.1, "prompt_eval_duration"),
        ns(&b.1, "prompt_eval_duration"),
    );
    assert!(first >= Duration::from_millis(200), "{}", a.1);
    assert!(
        second >= Duration::from_millis(300),
        "waited its turn: {second:?}"
    );
    h.shutdown().await;
    // Without the limit (the default) the two prefill side by side.
    let mut sp = spec();
    sp.seats = 4;
    sp.prefill_tokens_per_sec = Some(20_000.0);
    sp.models[0].context = 65_536;
    let (h, base, c) = node(sp).await;
    let (a, b) = tokio::join!(
        post(&c, format!("{base}/api/generate"), body.clone()),
        post(&c, format!("{base}/api/generate"), body.clone())
    );
    assert_eq!((a.0, b.0), (200, 200));
    for v in [a.1, b.1] {
        assert!(
            ns(&v, "prompt_eval_duration") < Duration::from_millis(350),
            "{v}"
        );
    }
    h.shutdown().await;
}

/// A model's `speed` scales the node's rates for it: at 0.1, 4,000 prompt tokens at the
/// node's 40,000/s take >= 1 s to prefill and 12 tokens at its 2,000/s take >= 11 x 5 ms;
/// the node's other model runs at the node's rates.
#[tokio::test]
async fn a_models_speed_scales_the_nodes_rates_for_it() {
    let mut sp = spec();
    sp.prefill_tokens_per_sec = Some(40_000.0);
    sp.models[0].context = 65_536;
    sp.models[1].speed = 0.1;
    sp.models[1].context = 65_536;
    let (h, base, c) = node(sp).await;
    let ask =
        |model: &str| json!({"model": model, "prompt": "word ".repeat(4_000), "stream": false});
    let (s, slow) = post(&c, format!("{base}/api/generate"), ask("qwen2.5:7b")).await;
    assert_eq!(s, 200, "{slow}");
    assert!(
        ns(&slow, "prompt_eval_duration") >= Duration::from_secs(1),
        "{slow}"
    );
    assert!(
        ns(&slow, "eval_duration") >= Duration::from_millis(55),
        "{slow}"
    );
    let (s, fast) = post(&c, format!("{base}/api/generate"), ask("llama3.2:3b")).await;
    assert_eq!(s, 200, "{fast}");
    assert!(
        ns(&fast, "prompt_eval_duration") < Duration::from_millis(500),
        "{fast}"
    );
    assert!(
        ns(&fast, "eval_duration") < Duration::from_millis(50),
        "{fast}"
    );
    h.shutdown().await;
}
