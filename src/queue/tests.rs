use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::*;
use crate::fleet::NodeState;

fn node(seats: u32, hard_cap: u32, models: &[&str]) -> Arc<NodeState> {
    let n = Arc::new(NodeState::default());
    n.set_hard_cap(hard_cap);
    for m in models {
        n.counters(m).limit.store(seats, Ordering::Relaxed);
    }
    n
}

fn ready(a: Acquire) -> Lease {
    match a {
        Acquire::Ready(l) => l,
        _ => panic!("expected a seat at once"),
    }
}

fn waiting(a: Acquire) -> Ticket {
    match a {
        Acquire::Wait(t) => t,
        _ => panic!("expected to wait"),
    }
}

#[tokio::test]
async fn seats_then_fifo_queue_then_handover_on_release() {
    let n = node(2, 0, &["m"]);
    let a = ready(acquire(0, &n, "m"));
    let b = ready(acquire(0, &n, "m"));
    let mut t1 = waiting(acquire(0, &n, "m"));
    let mut t2 = waiting(acquire(0, &n, "m"));
    assert_eq!(n.counters("m").load().pending, 2);
    drop(a);
    let l1 = t1
        .granted()
        .await
        .expect("first waiter gets the freed seat");
    assert_eq!(n.counters("m").load().pending, 1);
    assert_eq!(n.counters("m").load().in_flight, 2);
    drop(b);
    let l2 = t2.granted().await.expect("then the second");
    drop((l1, l2));
    assert_eq!(n.in_flight.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_waiter_that_leaves_frees_its_place_and_takes_no_seat() {
    let n = node(1, 0, &["m"]);
    let a = ready(acquire(0, &n, "m"));
    let gone = waiting(acquire(0, &n, "m"));
    let mut next = waiting(acquire(0, &n, "m"));
    drop(gone);
    assert_eq!(n.counters("m").load().pending, 1);
    drop(a);
    let l = next
        .granted()
        .await
        .expect("the seat skips the one who left");
    assert_eq!(n.counters("m").load().in_flight, 1);
    drop(l);
    assert_eq!(n.counters("m").load(), Default::default());
}

#[tokio::test]
async fn hard_cap_holds_across_models_and_frees_the_other_model() {
    let n = node(4, 2, &["x", "y"]);
    let a = ready(acquire(0, &n, "x"));
    let _b = ready(acquire(0, &n, "y"));
    let mut t = waiting(acquire(0, &n, "x"));
    assert_eq!(
        n.in_flight.load(Ordering::Relaxed),
        2,
        "the node cap, not the model's seats"
    );
    drop(a);
    let _l = t
        .granted()
        .await
        .expect("a seat freed on the node goes to the waiter");
    assert_eq!(n.in_flight.load(Ordering::Relaxed), 2);
}

/// Models that share the node's seats (learned): past them a request for any model waits in
/// the gateway, and the seat that frees goes to whoever waited longest, whatever its model
/// (not to the model whose name sorts first).
#[tokio::test]
async fn shared_seats_hold_across_models_and_go_to_the_longest_waiter() {
    let n = node(4, 16, &["a", "b"]);
    n.set_shared_seats(2);
    let b1 = ready(acquire(0, &n, "b"));
    let b2 = ready(acquire(0, &n, "b"));
    let mut first = waiting(acquire(0, &n, "b"));
    let mut second = waiting(acquire(0, &n, "a"));
    assert_eq!(n.in_flight.load(Ordering::Relaxed), 2, "the node's seats");
    let five = std::time::Duration::from_secs(5);
    drop(b1);
    let l1 = tokio::time::timeout(five, first.granted()).await;
    let l1 = l1.ok().flatten().expect("the longest waiter, model b");
    assert_eq!(n.counters("a").load().pending, 1, "a still waits");
    drop(b2);
    let l2 = tokio::time::timeout(five, second.granted()).await;
    let l2 = l2.ok().flatten().expect("then model a");
    assert_eq!(n.in_flight.load(Ordering::Relaxed), 2);
    drop((l1, l2));
    // Not shared (0): each model's own seats, under the hard cap.
    n.set_shared_seats(0);
    let held: Vec<Lease> = (0..6)
        .map(|i| ready(acquire(0, &n, ["a", "b"][i % 2])))
        .collect();
    assert_eq!(n.in_flight.load(Ordering::Relaxed), 6);
    drop(held);
}

/// Learned seats (nobody said how many) are probed: one request past them when a probe is
/// due (every `PROBE_EVERY_MS`, the first that long after the verdict), no more; seats that
/// models merely share are not.
#[tokio::test]
async fn learned_seats_let_one_request_past_them_now_and_then() {
    let n = node(64, 8, &["a"]);
    n.set_shared_seats(2);
    n.set_seats_learned(true);
    let held: Vec<Lease> = (0..2).map(|_| ready(acquire(0, &n, "a"))).collect();
    let now = crate::services::now_ms();
    assert!(!n.probe_due(now), "not right after the verdict");
    let mut w = waiting(acquire(0, &n, "a"));
    n.probe_now();
    pump(0, &n);
    let five = std::time::Duration::from_secs(5);
    let probe = tokio::time::timeout(five, w.granted()).await;
    let probe = probe
        .ok()
        .flatten()
        .expect("the waiter goes past the seats");
    // The probe's time is somewhere in now..=probed (the clock may tick between).
    let probed = crate::services::now_ms();
    assert_eq!(
        n.in_flight.load(Ordering::Relaxed),
        3,
        "one past the two seats"
    );
    let _w2 = waiting(acquire(0, &n, "a"));
    pump(0, &n);
    assert_eq!(n.in_flight.load(Ordering::Relaxed), 3, "one probe a period");
    assert!(!n.probe_due(now + crate::fleet::PROBE_EVERY_MS - 1));
    assert!(n.probe_due(probed + crate::fleet::PROBE_EVERY_MS));
    drop((held, probe));

    let shared = node(64, 8, &["a"]);
    shared.set_shared_seats(2);
    shared.probe_now();
    let _held: Vec<Lease> = (0..2).map(|_| ready(acquire(0, &shared, "a"))).collect();
    let _w3 = waiting(acquire(0, &shared, "a"));
    pump(0, &shared);
    assert_eq!(
        shared.in_flight.load(Ordering::Relaxed),
        2,
        "shared seats: no probe"
    );
}

#[test]
fn the_hard_cap_is_never_exceeded_under_contention() {
    let n = node(64, 3, &["a", "b", "c", "d"]);
    let peak = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let threads: Vec<_> = ["a", "b", "c", "d"]
        .into_iter()
        .map(|m| {
            let (n, peak) = (n.clone(), peak.clone());
            std::thread::spawn(move || {
                for _ in 0..2_000 {
                    if let Some(l) = try_take(0, &n, &n.counters(m)) {
                        peak.fetch_max(n.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
                        drop(l);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        peak.load(Ordering::Relaxed) <= 3,
        "peak {}",
        peak.load(Ordering::Relaxed)
    );
    assert_eq!(n.in_flight.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn rebalance_moves_the_oldest_waiter_to_a_seat_elsewhere() {
    let (busy, idle) = (node(1, 0, &["m"]), node(2, 0, &["m"]));
    let _a = ready(acquire(0, &busy, "m"));
    let mut oldest = waiting(acquire(0, &busy, "m"));
    let _newer = waiting(acquire(0, &busy, "m"));
    let seat = try_take(1, &idle, &idle.counters("m")).expect("idle node has a seat");
    let w = take_waiter(&busy.counters("m")).expect("a waiter");
    assert!(w.grant(seat));
    let moved = oldest.granted().await.expect("moved");
    assert_eq!(moved.node, 1);
    assert_eq!(busy.counters("m").load().pending, 1);
}

#[test]
fn only_one_request_becomes_the_half_open_trial() {
    use crate::fleet::{Fleet, Outcome};
    let yaml = "breaker:\n  failure_threshold: 1\n  cooldown_s: 1\nfleet:\n  nodes:\n    - id: a\n      url: http://127.0.0.1:9\n      backend: ollama\n      capacity: 4\n      models:\n        - {name: m, size_gb: 1, loaded: true}\n";
    let fleet = Fleet::new(Arc::new(crate::config::Config::from_yaml(yaml).unwrap()));
    // One fault long enough ago that the cooldown is over: the breaker is half-open.
    let long_ago = crate::services::now_ms() - 60_000;
    fleet.record_outcome(0, None, Outcome::Fault, long_ago);
    // Two requests decided at the same moment: one is the trial, the other is turned away.
    let trial = ready(fleet.acquire(0, "m"));
    assert!(matches!(fleet.acquire(0, "m"), Acquire::Refused));
    assert!(
        fleet.view().nodes[0].breaker_open,
        "routing now sees the trial out"
    );
    drop(trial);
}

/// A sent request's predicted end is what routing reads for its seat until the lease drops;
/// a later prediction for the same lease replaces it, and one past its end reads 0.
#[test]
fn a_seat_is_predicted_free_at_its_requests_end_until_it_is_freed() {
    let n = node(2, 0, &["m"]);
    let c = n.counters("m");
    let mut a = take_now(0, &n, &c).unwrap();
    let mut b = take_now(0, &n, &c).unwrap();
    a.expect_end(10_000);
    b.expect_end(12_500);
    b.expect_end(11_500);
    let mut ends = Vec::new();
    c.ends.read(10_500, 1.0, &mut ends);
    ends.sort_by(f64::total_cmp);
    assert_eq!(ends, vec![0.0, 1.0]);
    drop(a);
    ends.clear();
    c.ends.read(10_500, 1.0, &mut ends);
    assert_eq!(ends, vec![1.0]);
    drop(b);
    ends.clear();
    c.ends.read(10_500, 1.0, &mut ends);
    assert!(ends.is_empty(), "{ends:?}");
}

/// A running answer's pace is read from its chunks once enough have streamed, and forgotten
/// with its seat; a request not predicted (not completion mode) publishes nothing.
#[test]
fn a_running_answer_shows_its_pace_until_its_seat_is_freed() {
    let n = node(4, 0, &["m"]);
    let c = n.counters("m");
    let mut a = take_now(0, &n, &c).unwrap();
    let plain = take_now(0, &n, &c).unwrap();
    a.expect_end(20_000);
    a.streamed(1, 10_000);
    a.streamed(10, 10_090);
    let live = |per_chunk: f64| c.ends.read(10_400, per_chunk, &mut Vec::new());
    assert_eq!(live(1.0), None, "9 tokens: too few to tell");
    a.streamed(41, 10_400);
    plain.streamed(100, 10_400);
    let seen = live(1.0).expect("40 tokens in 0.4 s");
    assert_eq!((seen.secs, seen.tokens, seen.streams), (0.4, 40.0, 1));
    // A server that sends 3 tokens a chunk (its counts said so at the end of earlier answers).
    c.observe_chunks(300, 100);
    assert_eq!(c.tokens_per_chunk(), 3.0);
    assert_eq!(live(c.tokens_per_chunk()).unwrap().tokens, 120.0);
    drop(a);
    assert_eq!(live(1.0), None);
}

/// A request predicted from priors only has no end to count its seat free at, but its answer's
/// pace is read all the same: right after a start such answers are all there is to show how
/// fast a node streams (before, nothing of it was published).
#[test]
fn an_answer_with_no_predicted_end_shows_its_pace_and_no_seat_end() {
    let n = node(4, 0, &["m"]);
    let c = n.counters("m");
    let mut a = take_now(0, &n, &c).unwrap();
    a.expect_unknown_end(None);
    a.streamed(1, 10_000);
    a.streamed(41, 10_100);
    let mut ends = Vec::new();
    let seen = c
        .ends
        .read(10_100, 1.0, &mut ends)
        .expect("40 tokens in 0.1 s");
    assert_eq!((seen.secs, seen.tokens), (0.1, 40.0));
    assert!(ends.is_empty(), "no seat end from priors: {ends:?}");
    // Priced at 100 tokens: the 60 left at the pace it streams.
    a.expect_unknown_end(Some(100.0));
    c.ends.read(10_100, 1.0, &mut ends);
    assert_eq!(ends.len(), 1);
    assert!((ends[0] - 0.15).abs() < 1e-9, "{ends:?}");
    ends.clear();
    // Predicted later (a retry re-sent with rates): the end counts.
    a.expect_end(12_000);
    ends.clear();
    c.ends.read(10_100, 1.0, &mut ends);
    assert_eq!(ends, [1.9]);
}
