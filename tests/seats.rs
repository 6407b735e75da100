//! A node whose models share its seats (one queue for all of them, as the simulated nodes
//! keep; Ollama gives each loaded model its own): the gateway learns it from the answers of
//! requests sent while every seat was taken, says so in `/fleet/status`, and from then on
//! sends it no more than its seats at once, across its models; the rest wait in the gateway.

mod common;

use common::*;
use fleetgate::sim::SimControl;
use serde_json::{json, Value};

const SPEC: &str = "seats: 2\ntokens_per_sec: 1000\nttft_ms: 250\nmemory_gb: 64\nreply_tokens: 4\nmodels:\n  - {name: a:1b, size_gb: 1, loaded: true}\n  - {name: b:1b, size_gb: 1, loaded: true}\n";

fn spawn_chat(gw: &Gateway, model: &str) -> tokio::task::JoinHandle<reqwest::Response> {
    let body: Value =
        json!({"model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let url = gw.url("/v1/chat/completions");
    tokio::spawn(async move { client().post(url).json(&body).send().await.expect("send") })
}

async fn shared(gw: &Gateway) -> bool {
    admin_json(gw, "/fleet/status").await["nodes"][0]["seats_shared"] == true
}

async fn waiting(gw: &Gateway) -> usize {
    admin_json(gw, "/fleet/queue").await["waiting"]
        .as_array()
        .map_or(0, Vec::len)
}

/// Each model answers alone, then rounds of four requests sent one after the other: two take
/// the node's seats, and the two sent while they were taken wait inside the node (as long as
/// routing predicted) if its models share them, or start at once if each model has its own.
/// Until the gateway says the seats are shared, at most `rounds` rounds.
async fn rounds_sent_while_the_seats_are_taken(gw: &Gateway, ctl: &SimControl, rounds: usize) {
    for m in ["a:1b", "b:1b", "a:1b", "b:1b"] {
        assert_eq!(spawn_chat(gw, m).await.unwrap().status(), 200);
    }
    assert!(
        !shared(gw).await,
        "each model's own seats until answers say otherwise"
    );
    for _ in 0..rounds {
        if shared(gw).await {
            break;
        }
        let mut reqs = Vec::new();
        for (i, m) in ["a:1b", "b:1b", "a:1b", "b:1b"].into_iter().enumerate() {
            reqs.push(spawn_chat(gw, m));
            eventually("the node has it", || async {
                let s = ctl.stats();
                (s.in_flight + s.queued) as usize == i + 1
            })
            .await;
        }
        for r in reqs {
            assert_eq!(r.await.unwrap().status(), 200);
        }
    }
}

/// Six requests at once, three per model, held at their first token: what runs on the node
/// and what waits in the gateway once `running` have started.
async fn six_at_once(gw: &Gateway, ctl: &SimControl, running: usize) -> (u32, u32, usize) {
    ctl.hold_first_token(true);
    let reqs: Vec<_> = (0..6)
        .map(|i| spawn_chat(gw, ["a:1b", "b:1b"][i % 2]))
        .collect();
    ctl.wait_parked(running).await;
    let queued_here = 6 - running;
    eventually("the rest waiting in the gateway", || async {
        waiting(gw).await == queued_here
    })
    .await;
    let s = ctl.stats();
    ctl.release();
    for r in reqs {
        assert_eq!(r.await.unwrap().status(), 200);
    }
    (s.in_flight, s.queued, queued_here)
}

#[test]
fn a_node_whose_models_share_its_seats_is_sent_no_more_than_its_seats() {
    let rt = runtime();
    let node_sim = sim(&rt, SPEC);
    let gw = Gateway::start(&fleet(&[node(
        "one-queue",
        &node_sim,
        "      capacity: 2\n",
    )]));
    let ctl = node_sim.control();
    rt.block_on(async {
        rounds_sent_while_the_seats_are_taken(&gw, &ctl, 8).await;
        assert!(
            shared(&gw).await,
            "the answers that waited say the seats are shared"
        );
        let (in_flight, queued, _) = six_at_once(&gw, &ctl, 2).await;
        assert_eq!(
            (in_flight, queued),
            (2, 0),
            "the node holds its seats, no more"
        );
    });
}

/// Ollama's way (`OLLAMA_NUM_PARALLEL` per loaded model): the answers sent while two of one
/// model ran came at once, the node is never taken to share its seats, and each model keeps
/// its own two.
#[test]
fn a_node_whose_models_each_have_their_seats_keeps_them() {
    let rt = runtime();
    let node_sim = sim(&rt, &format!("seats_per_model: true\n{SPEC}"));
    let gw = Gateway::start(&fleet(&[node(
        "per-model",
        &node_sim,
        "      capacity: 2\n",
    )]));
    let ctl = node_sim.control();
    rt.block_on(async {
        rounds_sent_while_the_seats_are_taken(&gw, &ctl, 4).await;
        assert!(
            !shared(&gw).await,
            "answers that did not wait: each model's own seats"
        );
        let (in_flight, queued, _) = six_at_once(&gw, &ctl, 4).await;
        assert_eq!((in_flight, queued), (4, 0), "two of each model at once");
    });
}

/// A node whose seats nobody said (`backend: openai`, no `capacity`: a batching server's 64
/// are assumed) that runs two at once.
const TWO_AT_ONCE: &str = "seats: 2\ntokens_per_sec: 100\nttft_ms: 100\nmemory_gb: 64\nreply_tokens: 30\nmodels:\n  - {name: a:1b, size_gb: 1, loaded: true}\n";

fn spawn_stream(gw: &Gateway) -> tokio::task::JoinHandle<String> {
    let body: Value = json!({"model": "a:1b", "stream": true, "max_tokens": 30,
        "messages": [{"role": "user", "content": "hi"}]});
    let url = gw.url("/v1/chat/completions");
    tokio::spawn(async move {
        let r = client().post(url).json(&body).send().await.expect("send");
        assert_eq!(r.status(), 200);
        r.text().await.expect("the whole stream")
    })
}

async fn node_status(gw: &Gateway) -> Value {
    admin_json(gw, "/fleet/status").await["nodes"][0].clone()
}

/// A gateway over one node known by its URL only (`backend: openai`, no `capacity`).
fn behind_openai(id: &str, node: &fleetgate::sim::SimHandle) -> Gateway {
    Gateway::start(&fleet(&[node_by_url(id, node)]))
}

/// `/fleet/status`'s seats of the node and where they came from.
fn seats_of(st: &Value) -> (Option<u64>, Option<&str>) {
    (st["seats"].as_u64(), st["seats_from"].as_str())
}

/// Three answers alone, then rounds of four streams, the last two sent once the first two
/// decode: as many as the node runs at once decode together, the rest wait inside it. Until `/fleet/status` says
/// where the seats came from is `learned`, at most `rounds` rounds.
async fn rounds_of_four_streams(gw: &Gateway, rounds: usize) {
    for _ in 0..3 {
        assert!(spawn_stream(gw).await.unwrap().contains("[DONE]"));
    }
    for _ in 0..rounds {
        if node_status(gw).await["seats_from"] == "learned" {
            break;
        }
        // Two sent, and once they decode two more: what a steady arrival makes.
        let mut reqs: Vec<_> = (0..2).map(|_| spawn_stream(gw)).collect();
        eventually("two decoding", || async {
            gw.fleet.node(0).decoding.streams() >= 2
        })
        .await;
        reqs.extend((0..2).map(|_| spawn_stream(gw)));
        for r in reqs {
            assert!(r.await.unwrap().contains("[DONE]"));
        }
    }
}

/// In front of a server that runs two at once, the gateway assumes a batching server's 64
/// seats until the streams sent while two decoded waited inside the node as long as two seats
/// predict: then the node's seats are the two it was seen to run (`/fleet/status`
/// `seats_from: learned`), and with six sent at once two run and four wait in the gateway,
/// where they could still go elsewhere.
#[test]
fn a_node_whose_seats_nobody_said_is_found_to_run_the_streams_it_ran_at_once() {
    let rt = runtime();
    let node_sim = sim(&rt, TWO_AT_ONCE);
    let gw = behind_openai("llama", &node_sim);
    let ctl = node_sim.control();
    rt.block_on(async {
        let st = node_status(&gw).await;
        assert_eq!(seats_of(&st), (Some(64), Some("default_batching")), "{st}");
        rounds_of_four_streams(&gw, 8).await;
        let st = node_status(&gw).await;
        assert_eq!(seats_of(&st), (Some(2), Some("learned")), "{st}");
        assert_eq!(st["seats_seen"], 2);
        ctl.hold_first_token(true);
        let reqs: Vec<_> = (0..6).map(|_| spawn_stream(&gw)).collect();
        ctl.wait_parked(2).await;
        eventually("four waiting in the gateway", || async {
            waiting(&gw).await == 4
        })
        .await;
        let s = ctl.stats();
        assert_eq!(
            (s.in_flight, s.queued),
            (2, 0),
            "two run, the rest wait here"
        );
        ctl.release();
        for r in reqs {
            assert!(r.await.unwrap().contains("[DONE]"));
        }
    });
}

/// A server that runs all four at once is never held to fewer: the streams sent while fewer
/// decoded came when their own prediction said, and more decoded at once each round.
#[test]
fn a_node_that_runs_every_stream_it_is_sent_keeps_the_batching_default() {
    let rt = runtime();
    let node_sim = sim(&rt, &TWO_AT_ONCE.replace("seats: 2", "seats: 8"));
    let gw = behind_openai("vllm", &node_sim);
    rt.block_on(async {
        rounds_of_four_streams(&gw, 4).await;
        let st = node_status(&gw).await;
        assert_eq!(seats_of(&st), (Some(64), Some("default_batching")), "{st}");
        assert!(st["seats_seen"].as_u64() >= Some(3), "{st}");
    });
}

/// A Mac behind its URL (`backend: openai`, no `capacity`) whose Ollama runs two requests of
/// each model at once: its own seats per model, not the node's.
const TWO_OF_EACH: &str = "seats: 2\nseats_per_model: true\ntokens_per_sec: 100\nttft_ms: 100\nmemory_gb: 64\nreply_tokens: 60\nmodels:\n  - {name: a:1b, size_gb: 1, loaded: true}\n  - {name: b:1b, size_gb: 1, loaded: true}\n";

/// A stream of `model`, pinned to `node` when given; answers with the node that served it.
fn spawn_stream_of(
    gw: &Gateway,
    model: &str,
    pin: Option<&str>,
) -> tokio::task::JoinHandle<String> {
    let body: Value = json!({"model": model, "stream": true, "max_tokens": 60,
        "messages": [{"role": "user", "content": "hi"}]});
    let mut req = client().post(gw.url("/v1/chat/completions")).json(&body);
    if let Some(node) = pin {
        req = req.header("X-Fleet-Pin-Node", node);
    }
    tokio::spawn(async move {
        let r = req.send().await.expect("send");
        assert_eq!(r.status(), 200);
        let node = r.headers()["x-fleet-node"].to_str().unwrap().to_string();
        assert!(r.text().await.expect("the whole stream").contains("[DONE]"));
        node
    })
}

/// The status row of `model` on node `idx`.
async fn model_status(gw: &Gateway, idx: usize, model: &str) -> Value {
    let st = admin_json(gw, "/fleet/status").await;
    st["nodes"][idx]["models"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == model).cloned())
        .unwrap_or(Value::Null)
}

/// In front of a Mac known by its URL only, whose Ollama runs two of each model at once, with
/// a slower PC beside it: the streams of `a:1b` sent while two of them decoded waited inside
/// the Mac, those of `b:1b` sent beside them did not. The gateway finds that `a:1b` runs two
/// at once there (`/fleet/status`: the model's `seats_learned`), not the node (its seats stay
/// the batching default, not shared), and from then on a third `a:1b` beside two running goes
/// to the PC, which finishes it sooner than the Mac's queue would, where before it was priced
/// at the Mac's four seats and sent there.
#[test]
fn a_models_own_seats_behind_a_url_are_found_from_the_streams_that_waited_for_them() {
    let rt = runtime();
    let mac = sim(&rt, TWO_OF_EACH);
    let pc = sim(
        &rt,
        "seats: 8\ntokens_per_sec: 75\nttft_ms: 100\nmemory_gb: 32\nreply_tokens: 60\nmodels:\n  - {name: a:1b, size_gb: 1, loaded: true}\n",
    );
    let gw = Gateway::start(&fleet(&[node_by_url("mac", &mac), node_by_url("pc", &pc)]));
    let on_mac = |gw: &Gateway, model: &str| spawn_stream_of(gw, model, Some("mac"));
    rt.block_on(async {
        for m in ["a:1b", "b:1b", "a:1b"] {
            on_mac(&gw, m).await.unwrap();
        }
        for _ in 0..2 {
            spawn_stream_of(&gw, "a:1b", Some("pc")).await.unwrap();
        }
        for _ in 0..8 {
            if model_status(&gw, 0, "a:1b").await["seats_learned"] == 2 {
                break;
            }
            // Two of a:1b, and once they decode two more of it and one of b:1b.
            let mut reqs: Vec<_> = (0..2).map(|_| on_mac(&gw, "a:1b")).collect();
            eventually("two decoding", || async {
                gw.fleet.node(0).counters("a:1b").decoding.streams() >= 2
            })
            .await;
            reqs.extend((0..2).map(|_| on_mac(&gw, "a:1b")));
            reqs.push(on_mac(&gw, "b:1b"));
            for r in reqs {
                r.await.unwrap();
            }
        }
        let a = model_status(&gw, 0, "a:1b").await;
        assert_eq!(
            (&a["seats_learned"], &a["seats_seen"]),
            (&json!(2), &json!(2)),
            "{a}"
        );
        let b = model_status(&gw, 0, "b:1b").await;
        assert_eq!(b["seats_learned"], Value::Null, "{b}");
        let st = node_status(&gw).await;
        assert_eq!(seats_of(&st), (Some(64), Some("default_batching")), "{st}");
        assert_eq!(st["seats_shared"], false, "{st}");

        // Two of a:1b decode on the Mac: a third waits for one of them there.
        let running: Vec<_> = (0..2).map(|_| on_mac(&gw, "a:1b")).collect();
        eventually("two decoding", || async {
            gw.fleet.node(0).counters("a:1b").decoding.streams() >= 2
        })
        .await;
        let third = spawn_stream_of(&gw, "a:1b", None).await.unwrap();
        assert_eq!(third, "pc", "the Mac's a:1b seats are taken");
        for r in running {
            assert_eq!(r.await.unwrap(), "mac");
        }
    });
}

/// `shared`: a:1b fast and b:70b at a twentieth of the speed, on two seats its models share
/// (the sim's single queue); `other`: a:1b at a fifth of `shared`'s speed.
const SLOW_B: &str = "seats: 2\ntokens_per_sec: 1000\nttft_ms: 20\nmemory_gb: 64\nreply_tokens: 400\nmodels:\n  - {name: a:1b, size_gb: 1, loaded: true}\n  - {name: b:70b, size_gb: 40, loaded: true, speed: 0.05}\n";
const FIFTH: &str = "seats: 2\ntokens_per_sec: 200\nttft_ms: 20\nmemory_gb: 64\nreply_tokens: 400\nmodels:\n  - {name: a:1b, size_gb: 1, loaded: true}\n";

/// One chat of `model` for `max_tokens`, pinned to `pin` if given: the node that served it,
/// and how long the client waited.
async fn served_by(
    gw: &Gateway,
    model: &str,
    max_tokens: u32,
    pin: Option<&str>,
) -> (String, std::time::Duration) {
    let started = std::time::Instant::now();
    let body = json!({"model": model, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hi"}]});
    let mut req = client().post(gw.url("/v1/chat/completions")).json(&body);
    if let Some(p) = pin {
        req = req.header("X-Fleet-Pin-Node", p);
    }
    let r = req.send().await.expect("send");
    assert_eq!(r.status(), 200);
    let node = r.headers()["x-fleet-node"].to_str().unwrap().to_string();
    r.bytes().await.expect("body");
    (node, started.elapsed())
}

/// Where a short a:1b request goes while two long b:70b answers hold `shared`'s two seats,
/// nothing yet having said whether its models share them, with `prior` the odds they do; and
/// how long it took.
fn small_request_beside_a_slow_model(prior: f64) -> (String, std::time::Duration) {
    let rt = runtime();
    let shared_sim = sim(&rt, SLOW_B);
    let other_sim = sim(&rt, FIFTH);
    let gw = Gateway::start(&format!(
        "routing:\n  policy:\n    completion_seats_shared_prior: {prior}\n{}",
        fleet(&[
            node("shared", &shared_sim, "      capacity: 2\n"),
            node("other", &other_sim, "      capacity: 2\n"),
        ])
    ));
    let ctl = shared_sim.control();
    rt.block_on(async {
        // Rates for every pair: a:1b on both nodes, b:70b (50 tokens/s) on `shared`.
        for _ in 0..2 {
            served_by(&gw, "a:1b", 20, Some("shared")).await;
            served_by(&gw, "a:1b", 20, Some("other")).await;
            served_by(&gw, "b:70b", 20, None).await;
        }
        let body = json!({"model": "b:70b", "max_tokens": 150,
            "messages": [{"role": "user", "content": "hi"}]});
        let long: Vec<_> = (0..2)
            .map(|_| {
                let (url, body) = (gw.url("/v1/chat/completions"), body.clone());
                tokio::spawn(async move { client().post(url).json(&body).send().await })
            })
            .collect();
        eventually("both seats held by b:70b", || async {
            ctl.stats().in_flight == 2
        })
        .await;
        let short = served_by(&gw, "a:1b", 20, None).await;
        for r in long {
            assert_eq!(r.await.unwrap().expect("send").status(), 200);
        }
        short
    })
}

/// With its seats' sharing unknown, the node's two seats held for 3 s more by a slow model: at
/// the default odds (0.2) the 0.6 s that would cost outweighs the 0.1 s the slower node
/// adds, and the request goes there, answered well within a second; taken for each model's
/// own (odds 0), to the full node, where the sim makes it wait for a seat, seconds.
#[test]
fn a_short_request_is_not_sent_behind_a_slow_models_answers_on_a_bet() {
    let (node, took) = small_request_beside_a_slow_model(0.2);
    assert_eq!(node, "other");
    assert!(took < std::time::Duration::from_millis(1_000), "{took:?}");
    let (node, took) = small_request_beside_a_slow_model(0.0);
    assert_eq!(node, "shared");
    assert!(took > std::time::Duration::from_millis(1_500), "{took:?}");
}
