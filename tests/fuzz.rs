//! Fuzzing on stable Rust: every protocol parser and the config loader fed random bytes and
//! mutations of the seed corpus in `tests/corpus/`. Nothing may panic, every rejection is a
//! typed error that says something, and what is accepted keeps its invariants.
//!
//! Brief in CI (200 cases per target); longer:
//! `PROPTEST_CASES=20000 cargo nextest run --test fuzz`.

use std::path::Path;

use fleetgate::config::Config;
use fleetgate::fleet::Heartbeat;
use fleetgate::protocol::{self, Endpoint};
use fleetgate::proxy::observe::StreamObserver;
use proptest::prelude::*;

fn corpus(dir: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(dir);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files
        .iter()
        .map(|p| std::fs::read(p).expect("corpus file"))
        .collect();
    assert!(!seeds.is_empty(), "empty corpus {}", dir.display());
    seeds
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// Tokens worth inserting: JSON and YAML structure, extreme numbers, bad UTF-8, controls.
const DICT: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"null",
    b"true",
    b"-0",
    b"1e999",
    b"18446744073709551616",
    b"-1",
    b"\\u0000",
    b"\\ud800",
    b"\xff\xfe",
    b"\xc3",
    b"\x00",
    b"\x1b[31m",
    b"\r\n",
    b"\n  ",
    b"- ",
    b"&a ",
    b"*a",
    b"!!binary ",
    b"\"model\":",
    b"\"messages\":[",
    b"\"content\":",
    b"\"stream\":true",
    b"\"max_tokens\":",
];

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, usize),
    Delete(usize, usize),
    Duplicate(usize, usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), 0..DICT.len()).prop_map(|(i, d)| Mutation::Insert(i, d)),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<usize>(), 1usize..256).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(seed: &[u8], muts: &[Mutation]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for m in muts {
        let at = |i: usize, len: usize| if len == 0 { 0 } else { i % (len + 1) };
        match *m {
            Mutation::Flip(i, x) if !b.is_empty() => {
                let i = i % b.len();
                b[i] ^= x;
            }
            Mutation::Flip(..) => {}
            Mutation::Insert(i, d) => {
                let i = at(i, b.len());
                b.splice(i..i, DICT[d].iter().copied());
            }
            Mutation::Delete(i, n) => {
                let i = at(i, b.len());
                let end = (i + n).min(b.len());
                b.drain(i..end);
            }
            Mutation::Duplicate(i, n) => {
                let i = at(i, b.len());
                let end = (i + n).min(b.len());
                let part = b[i..end].to_vec();
                b.splice(i..i, part);
            }
            Mutation::Truncate(i) => {
                let i = at(i, b.len());
                b.truncate(i);
            }
        }
    }
    b
}

/// Mutated seeds from `dir`, and now and then plain random bytes.
fn inputs(dir: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = corpus(dir);
    let n = seeds.len();
    prop_oneof![
        8 => (0..n, prop::collection::vec(mutation(), 0..8))
            .prop_map(move |(i, muts)| apply(&seeds[i], &muts)),
        1 => prop::collection::vec(any::<u8>(), 0..512),
    ]
}

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn request_parsers_accept_or_name_the_problem(body in inputs("requests")) {
        for ep in Endpoint::ALL {
            match protocol::parse(ep, &body) {
                Ok(p) => {
                    prop_assert!(!p.model.trim().is_empty());
                    prop_assert!(!has_control(&p.model), "{ep:?}: model {:?}", p.model);
                    for f in &p.fallback_models {
                        prop_assert!(!has_control(f), "{ep:?}: fallback {f:?}");
                    }
                    let _ = p.estimated_prompt_tokens(4.0);
                }
                Err(e) => prop_assert!(!e.message.is_empty()),
            }
        }
    }

    #[test]
    fn model_rewrite_keeps_the_body_json_and_sets_the_model(body in inputs("requests")) {
        // The proxy rewrites only bodies that parsed.
        let valid = serde_json::from_slice::<serde_json::Value>(&body).is_ok();
        if let Some(out) = protocol::rewrite_model(&body, "other:1b").filter(|_| valid) {
            let v: serde_json::Value = serde_json::from_slice(&out)
                .map_err(|e| TestCaseError::fail(format!("rewritten body is not JSON: {e}")))?;
            prop_assert_eq!(&v["model"], "other:1b");
        }
    }

    #[test]
    fn ollama_show_answers_or_fails_with_a_code(body in inputs("requests")) {
        if let Err((code, msg)) = protocol::ollama_show(&body, &[]) {
            prop_assert!(code.status() >= 400 && !msg.is_empty());
        }
    }

    #[test]
    fn heartbeats_parse_or_fail_cleanly(body in inputs("heartbeat")) {
        if let Ok(hb) = serde_json::from_slice::<Heartbeat>(&body) {
            // What parses serialises back to the same heartbeat.
            let again: Heartbeat = serde_json::from_slice(&serde_json::to_vec(&hb).unwrap()).unwrap();
            prop_assert_eq!(again.node_id, hb.node_id);
        }
    }

    #[test]
    fn the_stream_observer_reads_alike_however_the_body_is_cut(
        body in inputs("stream"),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let mut whole = StreamObserver::default();
        whole.feed(&body);
        let mut pieces = StreamObserver::default();
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        at.sort_unstable();
        let mut from = 0;
        for to in at.into_iter().chain([body.len()]) {
            pieces.feed(&body[from..to]);
            from = to;
        }
        prop_assert_eq!(whole.finish(), pieces.finish());
    }

    #[test]
    fn the_config_loader_accepts_or_names_every_problem(text in inputs("config")) {
        let text = String::from_utf8_lossy(&text);
        match Config::from_yaml(&text) {
            Ok(c) => prop_assert!(c.clients.max_connections >= 1),
            Err(e) => {
                prop_assert!(!e.0.is_empty());
                for line in &e.0 {
                    prop_assert!(!line.trim().is_empty());
                }
            }
        }
    }

    #[test]
    fn endpoint_detection_never_panics(method in "[A-Z]{0,8}", path in "\\PC{0,64}") {
        let _ = protocol::detect(&method, &path);
        let _ = protocol::detect_local(&method, &path);
    }
}

#[test]
fn every_seed_is_accepted_unmutated() {
    for body in corpus("requests") {
        let ok = Endpoint::ALL
            .iter()
            .any(|ep| protocol::parse(*ep, &body).is_ok());
        assert!(ok, "no endpoint parses {}", String::from_utf8_lossy(&body));
    }
    for text in corpus("config") {
        let text = String::from_utf8_lossy(&text);
        Config::from_yaml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    }
    for body in corpus("heartbeat") {
        serde_json::from_slice::<Heartbeat>(&body).expect("heartbeat seed");
    }
}
