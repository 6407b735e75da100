//! Bad input over every client endpoint, over raw TCP: the status and the error body in the
//! endpoint's own protocol shape, and the node never bothered.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use serde_json::Value;

const SIM: &str = "seats: 2\ntokens_per_sec: 2000\nttft_ms: 1\nmemory_gb: 64\nreply_tokens: 4\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true}\n";

/// Every path a client may POST a JSON body to.
const PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/api/chat",
    "/api/generate",
    "/api/embed",
    "/api/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/api/show",
];

fn exchange(addr: SocketAddr, raw: &[u8]) -> (u16, Value, String) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    s.write_all(raw).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    (
        status,
        serde_json::from_str(body).unwrap_or(Value::Null),
        text,
    )
}

fn request(path: &str, extra_headers: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n{extra_headers}\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// The body is an error in the shape of the API `path` belongs to.
fn native_error(path: &str, v: &Value) -> bool {
    if path.starts_with("/api/") {
        v["error"].is_string()
    } else if path.starts_with("/v1/messages") {
        v["type"] == "error" && v["error"]["type"].is_string() && v["error"]["message"].is_string()
    } else {
        v["error"]["message"].is_string() && v["error"]["type"].is_string()
    }
}

#[test]
fn bad_bodies_get_a_native_error_on_every_endpoint() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "limits:\n  max_body_bytes: 65536\nhealth:\n  poll_interval_ms: 600000\n{}",
        fleet(&[node("bi-a", &a, "")])
    ));
    let deep = format!(
        "{{\"model\":\"m:1b\",\"x\":{}{}}}",
        "[".repeat(300),
        "]".repeat(300)
    );
    let huge = format!(
        "{{\"model\":\"m:1b\",\"prompt\":\"{}\"}}",
        "x".repeat(70_000)
    );
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        ("malformed", b"{\"model\": ".to_vec(), 400),
        ("empty", Vec::new(), 400),
        ("not an object", b"[1,2]".to_vec(), 400),
        ("model of the wrong type", b"{\"model\": 5}".to_vec(), 400),
        (
            "messages of the wrong type",
            b"{\"model\":\"m:1b\",\"messages\":\"hi\",\"input\":7,\"prompt\":{}}".to_vec(),
            400,
        ),
        ("invalid UTF-8", b"{\"model\":\"m\xff\xfe\"}".to_vec(), 400),
        ("too deep", deep.into_bytes(), 400),
        (
            "control character in the model",
            b"{\"model\":\"m:1b\\u0000\"}".to_vec(),
            400,
        ),
        ("huge", huge.into_bytes(), 413),
    ];
    let mut failures = Vec::new();
    for path in PATHS {
        for (what, body, want) in &cases {
            let show = *path == "/api/show";
            if show && what.ends_with("wrong type") {
                continue; // show reads only `model`
            }
            let (status, v, raw) = exchange(gw.addr, &request(path, "", body));
            // Show answers a model name it cannot know with Ollama's 404.
            let fine = status == *want || (show && status == 404 && what.starts_with("control"));
            if !fine || !native_error(path, &v) {
                failures.push(format!("{path} {what}: want {want}, got {status}: {raw}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(served(&a), 0, "no bad body reached the node");
}

#[test]
fn smuggling_pairs_and_broken_framing_are_refused_in_the_native_shape() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 600000\n{}",
        fleet(&[node("sm-a", &a, "")])
    ));
    let body = br#"{"model":"m:1b","messages":[{"role":"user","content":"hi"}]}"#;
    for path in ["/v1/chat/completions", "/api/chat", "/v1/messages"] {
        for (what, raw) in [
            (
                "content-length and transfer-encoding",
                request(path, "transfer-encoding: chunked\r\n", body),
            ),
            (
                "two different content-lengths",
                request(path, "content-length: 3\r\n", body),
            ),
            (
                "a bad content-length",
                format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 12abc\r\n\r\n")
                    .into_bytes(),
            ),
            (
                "an unknown transfer-encoding",
                format!("POST {path} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked, x\r\n\r\n0\r\n\r\n")
                    .into_bytes(),
            ),
        ] {
            let (status, v, text) = exchange(gw.addr, &raw);
            assert_eq!(status, 400, "{path} {what}: {text}");
            assert!(native_error(path, &v), "{path} {what}: {text}");
        }
    }
    assert_eq!(served(&a), 0, "nothing smuggled through");
}
