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
