//! HTTP corners a client or a node can hit: HTTP/1.0, pipelining, `Expect: 100-continue`,
//! control characters in model names, node errors that are not JSON, a node that hangs up,
//! a client that goes away mid-stream.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const SIM: &str = "seats: 4\ntokens_per_sec: 2000\nttft_ms: 1\nmemory_gb: 64\nreply_tokens: 6\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true}\n";
const QUIET: &str = "health:\n  poll_interval_ms: 600000\n";

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    s
}

fn read_all(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn post(path: &str, version: &str, body: &Value, extra: &str) -> String {
    let b = body.to_string();
    format!(
        "POST {path} {version}\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n{b}",
        b.len()
    )
}

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream})
}

#[test]
fn http10_streams_close_delimited_and_pipelined_requests_are_all_answered() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!("{QUIET}{}", fleet(&[node("h1-a", &a, "")])));
    let mut s = connect(gw.addr);
    s.write_all(post("/v1/chat/completions", "HTTP/1.0", &chat("m:1b", true), "").as_bytes())
        .unwrap();
    let resp = read_all(&mut s);
    let (head, body) = resp.split_once("\r\n\r\n").expect("a response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(!head.to_ascii_lowercase().contains("chunked"), "{head}");
    assert!(body.starts_with("data: "), "no chunk-size lines: {body:?}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    // Three requests in one write: three answers, in order.
    let mut s = connect(gw.addr);
    let one = post("/v1/chat/completions", "HTTP/1.1", &chat("m:1b", false), "");
    let last = post(
        "/v1/chat/completions",
        "HTTP/1.1",
        &chat("m:1b", false),
        "connection: close\r\n",
    );
    s.write_all(format!("{one}{one}{last}").as_bytes()).unwrap();
    let all = read_all(&mut s);
    assert_eq!(all.matches("HTTP/1.1 200").count(), 3, "{all}");
    assert_eq!(served(&a), 4);
}

#[test]
fn expect_100_continue_is_answered_before_the_body_and_once() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!("{QUIET}{}", fleet(&[node("ex-a", &a, "")])));
    let body = chat("m:1b", false).to_string();
    let mut s = connect(gw.addr);
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    let t = Instant::now();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 100"), "{line}");
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    s.write_all(body.as_bytes()).unwrap();
    let mut rest = String::new();
    let _ = r.read_to_string(&mut rest);
    assert!(!rest.contains(" 100 "), "one 100 only: {rest}");
    let (head, _) = rest.split_once("HTTP/1.1 200").expect("then a 200");
    assert!(!head.to_ascii_lowercase().contains("x-fleet"), "{head}");
}

#[test]
fn control_characters_in_model_names_are_refused_at_intake() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!("{QUIET}{}", fleet(&[node("cc-a", &a, "")])));
    rt.block_on(async {
        for body in [
            json!({"model": "m:1b\n", "messages": [{"role": "user", "content": "hi"}]}),
            json!({"model": "nope", "fallback_models": ["m:1b\u{1b}[0m"],
                   "messages": [{"role": "user", "content": "hi"}]}),
        ] {
            let r = client()
                .post(gw.url("/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 400);
            let v: Value = r.json().await.unwrap();
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("control characters"),
                "{v}"
            );
        }
    });
    assert_eq!(served(&a), 0, "the node did no work");
}

/// A node that answers what a real server might: models as JSON, errors as bare text, or
/// hangs up. Handles each connection on its own thread.
fn rude_node() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || rude_conn(s));
        }
    });
    addr
}

fn rude_conn(s: TcpStream) {
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let len = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap_or(0))
            })
            .unwrap_or(0usize);
        let mut body = vec![0u8; len];
        let _ = r.read_exact(&mut body);
        let body = String::from_utf8_lossy(&body);
        let reply = if head.starts_with("GET /v1/models") {
            let v = json!({"object": "list", "data": [
                {"id": "text404", "object": "model"}, {"id": "bare431", "object": "model"},
                {"id": "hangup", "object": "model"}]})
            .to_string();
            format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{v}", v.len())
        } else if body.contains("text404") {
            "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\ncontent-length: 19\r\n\r\n404 page not found\n".into()
        } else if body.contains("bare431") {
            "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n".into()
        } else {
            return; // hang up without an answer
        };
        if w.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

#[test]
fn node_errors_reach_clients_in_their_shape_and_a_502_names_the_node() {
    let addr = rude_node();
    let gw = Gateway::start(&format!(
        "routing:\n  retries: 0\n{QUIET}fleet:\n  nodes:\n    - id: rude\n      url: http://{addr}\n      backend: openai\n      capacity: 4\n"
    ));
    let rt = runtime();
    rt.block_on(async {
        let ask = |path: &'static str, model: &'static str| {
            client()
                .post(gw.url(path))
                .json(&json!({"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
                .send()
        };
        let r = ask("/v1/chat/completions", "text404").await.unwrap();
        assert_eq!(r.status(), 404);
        assert_eq!(r.headers()["x-fleet-node"], "rude");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "not_found", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("404 page not found"), "{v}");
        let r = ask("/v1/chat/completions", "bare431").await.unwrap();
        assert_eq!(r.status(), 431);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "request_too_large", "{v}");
        let r = ask("/v1/chat/completions", "hangup").await.unwrap();
        assert_eq!(r.status(), 502);
        assert_eq!(r.headers()["x-fleet-node"], "rude");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "upstream_error", "{v}");
    });
}

#[test]
fn a_client_that_goes_away_mid_stream_is_not_an_upstream_error() {
    let rt = runtime();
    let a = sim(&rt, "seats: 4\ntokens_per_sec: 20\nttft_ms: 1\nmemory_gb: 64\nreply_tokens: 200\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true}\n");
    let gw = Gateway::start(&format!("{QUIET}{}", fleet(&[node("ab-a", &a, "")])));
    rt.block_on(async {
        for _ in 0..3 {
            let mut r = client()
                .post(gw.url("/v1/chat/completions"))
                .json(&chat("m:1b", true))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.chunk().await.unwrap().expect("first chunk");
            drop(r);
        }
        eventually("the three streams are accounted", || async {
            metrics(&gw).await.contains(
                "fleetgate_proxy_requests_total{model=\"m:1b\",node=\"ab-a\",protocol=\"openai_chat\",status=\"200\"} 3",
            )
        })
        .await;
        let m = metrics(&gw).await;
        // Every error series exists from the first scrape (at zero): none may have counted.
        let counted: Vec<&str> = m
            .lines()
            .filter(|l| l.contains("code=\"upstream_error\"") && !l.ends_with(" 0"))
            .collect();
        assert!(counted.is_empty(), "{counted:?}");
        let st = admin_json(&gw, "/fleet/status").await;
        let breaker = &st["nodes"][0]["breaker"];
        assert_eq!(breaker["state"], "closed", "{breaker}");
    });
}
