//! Integration tests of the sim node's concurrency (seats, gates) and faults over real HTTP.

use fleetgate::sim::Fault;
use futures::StreamExt;
use serde_json::{json, Value};

mod common;

use common::simnode::*;

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
async fn shutdown_frees_the_port() {
    let (h, _, _) = node(spec()).await;
    let addr = h.addr();
    h.shutdown().await;
    let l = std::net::TcpListener::bind(addr).expect("port is free again");
    drop(l);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seats_hold_on_a_multi_thread_runtime() {
    let mut sp = spec();
    sp.seats = 2;
    let (h, base, c) = node(sp).await;
    let ctl = h.control();
    ctl.hold_first_token(true);
    let reqs: Vec<_> = (0..6)
        .map(|i| {
            let (c, url) = (c.clone(), format!("{base}/v1/chat/completions"));
            let mut body = chat_body("llama3.2:3b", i % 2 == 0);
            body["model"] = json!("llama3.2:3b");
            tokio::spawn(async move {
                let r = c.post(url).json(&body).send().await.expect("send");
                (r.status().as_u16(), r.text().await.is_ok())
            })
        })
        .collect();
    ctl.wait_parked(2).await;
    assert_eq!(ctl.stats().in_flight, 2);
    ctl.release();
    for r in reqs {
        assert_eq!(r.await.expect("join"), (200, true));
    }
    let st = ctl.stats();
    assert_eq!((st.requests, st.in_flight, st.max_in_flight), (6, 0, 2));
    h.shutdown().await;
}
