//! Hostile and clumsy clients over raw TCP against a real gateway: slow heads and bodies,
//! connection floods, bodies declared but never sent, heads Pingora cannot parse.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const SIM: &str = "seats: 4\ntokens_per_sec: 2000\nttft_ms: 1\nmemory_gb: 64\nreply_tokens: 4\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true}\n";
const QUIET: &str = "health:\n  poll_interval_ms: 600000\n";

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    s
}

/// Everything the gateway sends until it closes the connection (or the read timeout).
fn read_all(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// (status, JSON body) of a raw HTTP/1.1 response.
fn parse(resp: &str) -> (u16, Value) {
    let status = resp
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

fn chat_with_padding(pad: usize) -> Vec<u8> {
    let mut b = serde_json::to_vec(
        &json!({"model": "m:1b", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .unwrap();
    b.extend(std::iter::repeat_n(b' ', pad));
    b
}

#[test]
fn a_slow_body_gets_408_in_the_clients_shape_within_the_body_deadline() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "clients:\n  body_timeout_ms: 300\n{QUIET}{}",
        fleet(&[node("sb-a", &a, "")])
    ));
    let mut s = connect(gw.addr);
    let t = Instant::now();
    s.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\"")
        .unwrap();
    let resp = read_all(&mut s);
    let (status, body) = parse(&resp);
    assert_eq!(status, 408, "{resp}");
    assert_eq!(body["type"], "error", "Anthropic shape: {resp}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("clients.body_timeout_ms"),
        "{resp}"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(served(&a), 0);
}

#[test]
fn a_slow_head_gets_408_and_an_idle_connection_is_closed() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "clients:\n  head_timeout_ms: 300\n{QUIET}{}",
        fleet(&[node("sh-a", &a, "")])
    ));
    // A head dripped a byte at a time: each read is quick, the whole head is not.
    let mut s = connect(gw.addr);
    let t = Instant::now();
    s.write_all(b"POST /api/chat HTTP/1.1\r\nhost: x\r\n")
        .unwrap();
    for b in b"x-slow: 1" {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(60));
    }
    let resp = read_all(&mut s);
    let (status, body) = parse(&resp);
    assert_eq!(status, 408, "{resp}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("clients.head_timeout_ms"),
        "Ollama shape: {resp}"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // A connection that never sends a byte is closed without an answer.
    let mut idle = connect(gw.addr);
    let t = Instant::now();
    assert_eq!(read_all(&mut idle), "");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // A well-behaved client is unaffected, also on a kept-alive connection.
    rt.block_on(async {
        let c = client();
        for _ in 0..2 {
            let r = c
                .post(gw.url("/v1/chat/completions"))
                .body(chat_with_padding(0))
                .header("content-type", "application/json")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
        }
    });
}

#[test]
fn a_head_pingora_cannot_parse_gets_400_in_the_clients_shape() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!("{QUIET}{}", fleet(&[node("ph-a", &a, "")])));
    for (path, shape) in [
        ("/v1/chat/completions", "openai"),
        ("/v1/messages", "anthropic"),
        ("/api/chat", "ollama"),
    ] {
        let mut s = connect(gw.addr);
        write!(
            s,
            "POST {path} HTTP/1.1\r\nhost: x\r\nthis is not a header\r\n\r\n"
        )
        .unwrap();
        let resp = read_all(&mut s);
        let (status, body) = parse(&resp);
        assert_eq!(status, 400, "{resp}");
        let ok = match shape {
            "openai" => body["error"]["code"] == "invalid_request",
            "anthropic" => body["error"]["type"] == "invalid_request_error",
            _ => body["error"].is_string(),
        };
        assert!(ok, "{shape}: {resp}");
    }
}

#[test]
fn declared_bodies_hold_nothing_and_buffered_bytes_are_capped() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "limits:\n  max_body_bytes: 65536\nclients:\n  max_buffered_body_bytes: 65536\n{QUIET}{}",
        fleet(&[node("bb-a", &a, "")])
    ));
    let head = |len: usize| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        )
    };
    // Twenty clients declare 60 KB and send 10 bytes: they hold what they sent, not what
    // they declared.
    let declared: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = connect(gw.addr);
            s.write_all(head(60_000).as_bytes()).unwrap();
            s.write_all(b"{\"model\":").unwrap();
            s
        })
        .collect();
    let send = |pad: usize| {
        let c = client();
        let url = gw.url("/v1/chat/completions");
        rt.block_on(async move {
            let r = c
                .post(url)
                .header("content-type", "application/json")
                .body(chat_with_padding(pad))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let retry = r.headers().get("retry-after").is_some();
            (
                status,
                retry,
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        })
    };
    rt.block_on(eventually("the declared bodies are being read", || async {
        gw.fleet.clients.budget.used() > 0
    }));
    assert!(
        gw.fleet.clients.budget.used() <= 20 * 64,
        "{} bytes held for 200 bytes sent",
        gw.fleet.clients.budget.used()
    );
    drop(declared);
    rt.block_on(eventually("stalled clients let go", || async {
        gw.fleet.clients.budget.used() == 0
    }));
    assert_eq!(send(0).0, 200);
    // One client sends 40 KB of a body and stalls: another 40 KB body is past the total.
    let mut staller = connect(gw.addr);
    staller.write_all(head(60_000).as_bytes()).unwrap();
    staller.write_all(&vec![b' '; 40_000]).unwrap();
    rt.block_on(eventually("the stalled body is buffered", || async {
        gw.fleet.clients.budget.used() >= 40_000
    }));
    let (status, retry, body) = send(40_000);
    assert_eq!(status, 503, "{body}");
    assert!(retry, "Retry-After");
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    drop(staller);
    rt.block_on(eventually("the stalled body is released", || async {
        gw.fleet.clients.budget.used() == 0
    }));
    assert_eq!(send(40_000).0, 200);
}

#[test]
fn past_max_connections_a_new_connection_is_refused_clearly_and_admin_answers() {
    let rt = runtime();
    let a = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "clients:\n  max_connections: 3\n{QUIET}{}",
        fleet(&[node("mc-a", &a, "")])
    ));
    // `server::spawn` waits for its readiness probe to be closed; its slot may drop just after.
    rt.block_on(eventually(
        "the readiness probe's connection closed",
        || async { gw.fleet.clients.open() == 0 },
    ));
    let idle: Vec<TcpStream> = (0..3).map(|_| connect(gw.addr)).collect();
    rt.block_on(eventually("three connections counted", || async {
        gw.fleet.clients.open() == 3
    }));
    let mut fourth = connect(gw.addr);
    let t = Instant::now();
    let resp = read_all(&mut fourth);
    let (status, body) = parse(&resp);
    assert_eq!(status, 503, "{resp}");
    assert!(resp.to_ascii_lowercase().contains("retry-after:"), "{resp}");
    assert_eq!(body["error"]["code"], "overloaded", "{resp}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    rt.block_on(async {
        let st = admin_json(&gw, "/fleet/status").await;
        assert!(st["nodes"].is_array(), "admin answers: {st}");
        let m = metrics(&gw).await;
        assert!(
            m.contains("fleetgate_client_refusals_total{reason=\"connections\"}"),
            "{m}"
        );
    });
    drop(idle);
    rt.block_on(eventually(
        "closed connections free their slots",
        || async { gw.fleet.clients.open() == 0 },
    ));
    rt.block_on(async {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(chat_with_padding(0))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    });
}

/// Kills the child gateway when the test ends, pass or fail.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn under_a_low_open_files_limit_a_flood_of_idle_connections_leaves_admin_and_proxy_answering() {
    let (port, admin, sim_port) = (free_port(), free_port(), free_port());
    let dir = scratch_dir("nofile");
    let sim_spec = SIM.replace('\n', "\n        ");
    let path = config_file(
        &dir,
        &format!(
            "server:\n  listen: 127.0.0.1:{port}\n  admin_listen: 127.0.0.1:{admin}\n  threads: 1\n{QUIET}fleet:\n  nodes:\n    - id: nf-a\n      url: http://127.0.0.1:{sim_port}\n      backend: sim\n      sim:\n        {sim_spec}\n"
        ),
    );
    // `ulimit -n` in the shell sets soft and hard: the gateway cannot raise it.
    let _child = Child(
        std::process::Command::new("sh")
            .arg("-c")
            .arg("ulimit -n 256 && exec \"$0\" run --config \"$1\"")
            .arg(env!("CARGO_BIN_EXE_fleetgate"))
            .arg(&path)
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("spawn fleetgate"),
    );
    let proxy: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(proxy).is_err() {
        assert!(Instant::now() < deadline, "child gateway did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ask = |addr: SocketAddr, req: &str| {
        let mut s = connect(addr);
        s.write_all(req.as_bytes()).unwrap();
        parse(&read_all(&mut s))
    };
    let status = "GET /fleet/status HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n";
    let body = String::from_utf8(chat_with_padding(0)).unwrap();
    let chat = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(ask(proxy, &chat).0, 200);
    // 300 idle connections: more than the process has descriptors for.
    let idle: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(proxy).ok())
        .collect();
    assert!(idle.len() >= 250, "{} connected", idle.len());
    let (st, v) = ask(admin, status);
    assert_eq!(st, 200, "admin answers under the flood: {v}");
    let (st, v) = ask(proxy, &chat);
    assert_eq!(st, 503, "a clear refusal, not a hang: {v}");
    assert_eq!(v["error"]["code"], "overloaded", "{v}");
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (st, v) = ask(proxy, &chat);
        if st == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not served after the flood: {st} {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
