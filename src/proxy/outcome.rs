//! After a proxied request: feed the circuit breakers (spec 003) and the observed-performance
//! figures (time to first token, output tokens/s, chars-per-token calibration, the node:model
//! rates completion mode predicts with, and the prefix memory). The one place they are fed.

use std::time::Instant;

use super::dispatch::Dispatch;
use crate::fleet::{Fleet, Observation, Outcome};
use crate::metrics::METRICS;
use crate::services::now_ms;

/// The part of the prompt estimate that does not depend on chars-per-token.
pub fn fixed_tokens(p: &crate::protocol::ParsedRequest) -> u32 {
    use crate::protocol::{IMAGE_TOKENS, MESSAGE_OVERHEAD};
    MESSAGE_OVERHEAD
        .saturating_mul(p.messages)
        .saturating_add(IMAGE_TOKENS.saturating_mul(p.images))
        .saturating_add(p.token_ids)
}

/// What the breaker should hear about the final attempt; None when there is nothing to say
/// (every attempt failed to connect, already fed per attempt, or the node was never asked).
pub fn classify(
    upstream_status: Option<u16>,
    upstream_error: bool,
    unreachable: bool,
) -> Option<Outcome> {
    if unreachable {
        return None;
    }
    match upstream_status {
        // "Not here" (501 embeddings on llama.cpp, 404, 405): not capable, never a fault.
        Some(s) if crate::fleet::capable::says_not_here(s) => None,
        Some(s) if s >= 500 => Some(Outcome::Fault),
        // Headers arrived, then the node broke off: a broken stream.
        Some(_) if upstream_error => Some(Outcome::Fault),
        Some(_) => Some(Outcome::Success),
        // Timeout or reset before any response.
        None if upstream_error => Some(Outcome::Fault),
        None => None,
    }
}

/// Account the outcome of `d` (once per client request, from the client-facing leg).
pub fn account(fleet: &Fleet, d: &Dispatch) {
    let c = d.choice();
    let (status, upstream_error, unreachable, first_byte, observed, overflow, streamed) = {
        let mut st = d.state.lock();
        let overflow = matches!(st.upstream_status, Some(400 | 413))
            .then(|| super::overflow::parse(st.observer.head()))
            .flatten();
        (
            st.upstream_status,
            st.upstream_error,
            st.unreachable,
            st.first_byte,
            st.observer.finish(),
            overflow,
            st.decode_streams.is_some(),
        )
    };
    // Its stream decoded beside more than the node was seen to run at once (or ended below a
    // count seen while it ran).
    if streamed {
        fleet.publish_seats_seen(c.node, &c.model, now_ms());
    }
    if let Some(o) = overflow {
        // The node counted the prompt itself: the estimate learns the real size.
        log::info!(
            "node {}: {} answered a context overflow (prompt {:?} tokens, window {:?})",
            c.node_id,
            c.model,
            o.prompt_tokens,
            o.window
        );
        if let Some(pt) = o.prompt_tokens {
            calibrate(fleet, d, &c.model, pt, true);
        }
    }
    if let Some(outcome) = classify(status, upstream_error, unreachable) {
        fleet.record_outcome(c.node, Some(&c.model), outcome, now_ms());
    }
    if let Some(s) = status.filter(|s| crate::fleet::capable::says_not_here(*s)) {
        fleet.mark_not_capable(c.node, &c.model, d.endpoint.label(), s, now_ms());
    }
    if !status.is_some_and(|s| (200..300).contains(&s)) || upstream_error {
        return;
    }
    let counters = fleet.node(c.node).counters(&c.model);
    let end = Instant::now();
    counters.observe_latency(end.duration_since(d.started).as_secs_f64() * 1000.0);
    if let Some(fb) = first_byte {
        counters.observe_ttft(fb.duration_since(d.started).as_secs_f64() * 1000.0);
    }
    let labels = [c.node_id.as_str(), c.model.as_str()];
    if let Some(tokens) = observed.output_tokens() {
        METRICS
            .tokens
            .with_label_values(&[labels[0], labels[1], "out"])
            .inc_by(u64::from(tokens));
    }
    if let (Some(tokens), true) = (observed.completion_tokens, d.stream) {
        counters.observe_chunks(tokens, observed.chunks);
    }
    if let Some(tokens) = observed.output_tokens().filter(|t| *t >= 2) {
        let secs = match (super::observe::secs(observed.eval_duration_ns), first_byte) {
            (Some(s), _) => s,
            (_, Some(fb)) if observed.chunks >= 2 => end.duration_since(fb).as_secs_f64(),
            _ => end.duration_since(d.started).as_secs_f64(),
        };
        if secs >= 0.001 {
            counters.observe_tps(f64::from(tokens) / secs);
            METRICS
                .tpot
                .with_label_values(&labels)
                .observe(secs / f64::from(tokens));
        }
    }
    learn(fleet, d, &observed, first_byte, end);
    if let Some(pt) = observed.prompt_tokens {
        METRICS
            .tokens
            .with_label_values(&[labels[0], labels[1], "in"])
            .inc_by(u64::from(pt));
        // Without a cache count beside it, the count may be only the part the node prefilled
        // (`fleet::calibrate`): sent where the conversation or its system prompt was
        // credited as cached, it is, and says nothing of the prompt's size.
        let whole = observed.cached_of_whole().is_some();
        let on_cached = d.learn.credited(c).is_some();
        if whole || !on_cached {
            calibrate(fleet, d, &c.model, pt, whole);
        }
    }
}

/// One prompt-token calibration sample: the node counted `tokens` for `d`'s prompt on `model`
/// (`whole`: all of it, not only what it prefilled; `fleet::calibrate`).
fn calibrate(fleet: &Fleet, d: &Dispatch, model: &str, tokens: u32, whole: bool) {
    let default = fleet.config().routing.chars_per_token;
    fleet.calibration.observe(
        model,
        d.prompt_chars,
        tokens,
        d.prompt_fixed_tokens,
        default,
        whole,
    );
}

/// Count `d` in the fleet page's per node:model traffic (status, time to first byte).
pub fn recent(fleet: &Fleet, d: &Dispatch) {
    let c = d.choice();
    let (ok, ttft_ms) = {
        let st = d.state.lock();
        let ok = st.status.is_some_and(|s| (200..300).contains(&s)) && !st.upstream_error;
        let ttft = st
            .first_byte
            .map(|fb| fb.duration_since(d.started).as_secs_f64() * 1000.0);
        (ok, ttft)
    };
    fleet
        .recent
        .served(&c.node_id, &c.model, ok, ttft_ms, now_ms());
}

/// Feed the node:model rates and the prefix memory from one successful response.
fn learn(
    fleet: &Fleet,
    d: &Dispatch,
    observed: &super::observe::Observed,
    first_byte: Option<Instant>,
    end: Instant,
) {
    let c = d.choice();
    let l = &d.learn;
    let now = now_ms();
    let secs = super::observe::secs;
    // The cached prefix was where it was credited: the node this gateway remembers serving
    // the conversation, or one routing credited with the shared system prompt
    // (`LearnInput::uncached`). A first turn (nothing remembered) is taken as uncached even on its
    // rendezvous node: if another replica had served it there, the node only looks faster
    // for a while (and gets the traffic that corrects it); taking a first turn as cached made
    // a 2,190-token prefill count as 8 tokens and shut a node out for good.
    let base = observed.prompt_tokens.unwrap_or(l.prompt_tokens);
    let left_out = observed.prompt_left_out();
    let (evaluated, counted) =
        evaluated_tokens(base, observed.cached_of_whole(), l.credited(c), left_out);
    let (prior_prefill_tps, prior_spt) = fleet.rate_priors(c.node, &c.model);
    let node = fleet.node(c.node);
    let counters = node.counters(&c.model);
    let now_in_flight = node.in_flight.load(std::sync::atomic::Ordering::Relaxed) + 1;
    let st = d.state.lock();
    let (prefill_ahead_s, decode_streams, load_under_way_s, seat_freed_s, hidden, cold) = (
        st.prefill_ahead_s,
        st.decode_streams,
        st.load_under_way_s,
        st.seat_freed_s,
        d.hidden_load(&st),
        d.cold(&st),
    );
    // A retry's TTFT counts the failed attempt; one sent beside others of its model found it
    // serving. No load it waited for outlasted another answer of its model streaming first.
    let not_alone = !st.tried.is_empty() || st.pair_in_flight_at_send > 1;
    let (pair_at_send, served_meanwhile_s) = (st.pair_in_flight_at_send, st.served_meanwhile_s);
    drop(st);
    // Beside as many of its model as were ever seen decoding at once (or as its learned seats),
    // on a node whose seats nobody said that serves several models (whose seats may be each
    // model's, as Ollama keeps them): its first token may have waited for one of its model's
    // seats. (On a node with one model, a wait behind the prompts sent before is what tells
    // its prefill queue, `Rates::prefill_shared`: those answers still teach it.)
    let seat_unsure = fleet.view().nodes.get(c.node).is_some_and(|n| {
        let pair_seats = n
            .model(&c.model)
            .map_or(0, |m| m.seats_seen.max(m.seats_learned.unwrap_or(0)));
        n.own_seats_unknown() && pair_at_send > pair_seats.max(1)
    });
    // A wait cut below what reads as a load is none.
    let at_most = |load: f64| match served_meanwhile_s.map_or(load, |s| load.min(s)) {
        l if l < crate::routing::IdleExpect::MIN_LOAD_S => 0.0,
        l => l,
    };
    let mut o = Observation {
        now_ms: now,
        cold,
        service_s: end.duration_since(d.started).as_secs_f64(),
        ttft_s: first_byte
            .filter(|_| observed.chunks >= 2)
            .map(|fb| fb.duration_since(d.started).as_secs_f64()),
        prompt_tokens: if counted { evaluated.max(1) } else { 0 },
        prefill_ahead_s,
        output_tokens: observed.output_tokens(),
        max_output_tokens: d.learn.max_output_tokens,
        prompt_eval_s: secs(observed.prompt_eval_duration_ns),
        eval_s: secs(observed.eval_duration_ns),
        load_s: secs(observed.load_duration_ns),
        load_under_way_s,
        concurrency: (l.concurrency.max(1) + now_in_flight).div_ceil(2),
        decode_streams,
        prior_prefill_tps,
        prior_spt,
        idle_load_s: None,
        switch: false,
        measurement: false,
        seat_unsure,
    };
    // Sent in a spell (idle past the keep-alive, displaced, stalled) on a node that hides its
    // loads: did the node load the model first? (A node that does once is expected to after
    // each such spell.)
    if let Some(idle) = hidden {
        let ratio = if idle.guessed {
            let prior = fleet.config().routing.policy.completion_prefill_per_decode;
            fleet.prefill_per_decode(prior)
        } else {
            (0.0, 0.0)
        };
        let load = idle
            .load_seen(o.ttft_s, o.service_s, o.output_tokens, ratio)
            .map(at_most);
        if let Some(load) = load.filter(|l| *l > 0.0) {
            log::info!(
                "node {}: waited {load:.2} s for a load of {} (its list said it was loaded; {}, the next request there expects it)",
                c.node_id,
                c.model,
                if idle.switch {
                    "another model was sent there since"
                } else {
                    "idle past the keep-alive"
                }
            );
        }
        // Nothing to tell it by (a whole reply predicted from priors): nothing learned.
        o.idle_load_s = load;
        o.switch = idle.switch;
    } else if let Some(late) = stalled_first_token(fleet, c, (d.stream, cold), &o, not_alone)
        .map(at_most)
        .filter(|late| *late > 0.0)
    {
        // Stalled with no load foreseen, on a node that hides its loads: what routing took it
        // for while it waited (a swap under way since its send, `routing::completion`'s
        // spells) is what it teaches, not a prefill seconds long.
        log::info!(
            "node {}: the first token of {} came {late:.2} s late (a load the node hid; the next swap there expects it)",
            c.node_id,
            c.model,
        );
        o.idle_load_s = Some(late);
        o.switch = true;
    }
    let loaded_first = cold || o.idle_load_s.is_some_and(|l| l > 0.0);
    if let Some(t) = c.seat_test.filter(|_| !loaded_first) {
        // How much later than its own prediction it came: its first token (streamed), else
        // its end.
        let waited = match o.ttft_s {
            Some(first) => first - t.first_s,
            None => o.service_s - t.first_s - t.decode_s,
        };
        log::debug!(
            target: "fleetgate::learn",
            "{} {}: sent to the full {}, {waited:.3} s later than predicted ({:.3} s were its {} seats {})",
            c.node_id,
            c.model,
            if t.own { "model" } else { "node" },
            t.shared_wait_s,
            t.seats,
            if t.bound { "all it was seen to run at once" } else { "shared" }
        );
        // A node whose seats nobody said: whether it (or the model, of its own seats) runs no
        // more than it was seen to at once. Streamed, its wait is held against when a seat did
        // free (a stream on the node, or of the model, ended after its send), not against the
        // predicted ends, which a loaded server makes late; none freed before its first
        // token: against the prediction (it did not wait).
        let freed = seat_freed_s.filter(|_| o.ttft_s.is_some());
        let wait = freed.unwrap_or(t.shared_wait_s);
        // Of the model's own seats, its pair's line; else the node's.
        let bound = if t.own {
            &counters.seat_bound
        } else {
            &node.seat_bound
        };
        // The odds routing ranks the node's full seats at (`NodeView::seats_shared_p`) move with
        // every answer until the line decides: routing sees them at once.
        // (A model's own line, `t.own`, does not price the node.)
        let prior = fleet.config().routing.policy.completion_seats_shared_prior;
        let seen = node.decoding.seen(now);
        let odds = || {
            (!t.own).then(|| match t.bound {
                true => bound.lock().belief(prior, seen),
                false => node.seat_sharing.lock().belief(prior),
            })
        };
        let before = odds();
        let flipped = if t.bound {
            bound.lock().observe(t.seats, wait, waited, now)
        } else {
            node.seat_sharing
                .lock()
                .observe(t.shared_wait_s, waited, now)
        };
        let moved = odds() != before;
        if flipped {
            if t.bound {
                let whose = if t.own {
                    format!("{} ", c.model)
                } else {
                    String::new()
                };
                log::info!(
                    "node {}: {whose}{} (answers sent while it ran {} at once)",
                    c.node_id,
                    match bound.lock().seats() {
                        Some(_) => "runs no more requests at once than that: its seats",
                        None => "runs more requests at once than seen",
                    },
                    t.seats
                );
            } else {
                let yes = node.seat_sharing.lock().shared();
                log::info!(
                    "node {}: its models {} its seats (answers sent while they were all taken)",
                    c.node_id,
                    if yes { "share" } else { "do not share" }
                );
            }
        }
        if flipped || moved {
            fleet.publish();
        }
    }
    let mut rates = counters.rates.lock();
    rates.observe(&o);
    // `RUST_LOG=fleetgate::learn=debug`: what each response taught (beside the decisions'
    // log, what to read when a pair's rates look wrong).
    log::debug!(target: "fleetgate::learn", "{} {}: {o:?} -> {:?}", c.node_id, c.model, rates.rates());
    drop(rates);
    // What the answer says of the node's cache for the system prompt it prefilled before (of
    // the primary model: a fallback's cache is another): the node's count of it (OpenAI,
    // newer Ollama), else, from a node spoken to in Ollama's API, its older count of what it
    // prefilled only, short of the estimate by half the system prompt or more, or left out (a
    // bare count elsewhere may be the whole prompt: it tells a hit only). A hit is news
    // however long the request waited (the cache reached at least that far); a miss only for
    // one routing credited (a seat was free) that did not wait in the gateway's queue: the
    // prompts prefilled while one waits are not counted.
    let seen = l.shared_seen.iter().find(|(n, _)| *n == c.node);
    if let Some(&(_, ago)) = seen.filter(|_| !c.fallback) {
        let half = l.shared_tokens / 2;
        let ollama = matches!(
            fleet.node_config(c.node).backend,
            crate::config::Backend::Ollama | crate::config::Backend::Sim
        );
        let hit = match (observed.cached_of_whole(), observed.prompt_tokens) {
            (Some(cached), _) => Some(cached >= half),
            (None, Some(counted)) => {
                let short = counted.saturating_add(half) < l.prompt_tokens;
                (short || ollama).then_some(short)
            }
            (None, None) => left_out.then_some(true),
        };
        let unwaited = l.shared_credited(c) && d.queue_wait < std::time::Duration::from_millis(1);
        if let Some(hit) = hit.filter(|h| *h || unwaited) {
            fleet.prefixes.cache_seen(c.node, &c.model, ago, hit);
            log::debug!(
                target: "fleetgate::learn",
                "{} {}: its cache {} the system prompt it prefilled {ago} prompts before (reach now {})",
                c.node_id,
                c.model,
                if hit { "held" } else { "had lost" },
                fleet.prefixes.reach(c.node, &c.model)
            );
        }
    }
    if let Some(key) = l.affinity_key {
        // A count without a cache count beside it may be only what was prefilled
        // (`fleet::calibrate`): the node holds at least the prompt as estimated.
        let prompt = match observed.cached_of_whole() {
            Some(_) => base,
            None => base.max(l.prompt_tokens),
        };
        let held = prompt.saturating_add(observed.output_tokens().unwrap_or(0));
        fleet.prefixes.remember(key, c.node, held, now);
    }
}

/// How late (s) a streamed answer's first token came, when that makes it a stall
/// (`fleet::is_stall`, against the wait predicted at its send, past the prompts it was seen to
/// queue behind, and stretched as much as its decode came slower than the pair's) on a node
/// that hides its loads and lists several models: one that lists one swaps nothing (late, it
/// more likely queued behind seats nobody said; its idle spells cover its wakes). Not for a
/// request that tested a full node's seats (late, it waited inside), a cold one, nor one
/// `not_alone`: a retry (its TTFT counts the failed attempt), or one sent while requests for
/// its model were running or waiting on the node (the model was serving, not swapped out: a
/// server that runs so many of a model at once, Ollama's per-model seats, queues the rest,
/// and 9 s of queue on a Mac were taken for a swap).
fn stalled_first_token(
    fleet: &Fleet,
    c: &crate::routing::Choice,
    (stream, cold): (bool, bool),
    o: &Observation,
    not_alone: bool,
) -> Option<f64> {
    if !stream || not_alone || cold || c.seat_test.is_some() {
        return None;
    }
    let (first, due) = (o.ttft_s?, c.predicted_first_s?.max(0.0));
    let ahead = o.prefill_ahead_s.filter(|a| a.is_finite()).unwrap_or(0.0);
    let ms = |s: f64| (s.max(0.0) * 1000.0) as u64;
    // Most answers are on time: nothing more is read for them (the stretch below only makes
    // a stall harder to reach).
    if !crate::fleet::is_stall(ms(first - ahead - due), ms(due)) {
        return None;
    }
    let seen_spt = match o.output_tokens {
        Some(out) if out >= 2 => (o.service_s - first) / f64::from(out),
        _ => 0.0,
    };
    let pair_spt = fleet
        .node(c.node)
        .peek(&c.model)
        .and_then(|x| x.rates.lock().rates().decode_spt)
        .unwrap_or(0.0);
    let slower = if pair_spt > 0.0 && seen_spt > 0.0 {
        (seen_spt / pair_spt).max(1.0)
    } else {
        1.0
    };
    let late = first - ahead - due * slower;
    if !crate::fleet::is_stall(ms(late), ms(due * slower)) {
        return None;
    }
    let view = fleet.view();
    let node = view.nodes.get(c.node)?;
    (node.hides_loads && node.models.len() >= 2).then_some(late)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_qualifying_outcomes() {
        assert_eq!(classify(Some(200), false, false), Some(Outcome::Success));
        assert_eq!(
            classify(Some(404), false, false),
            None,
            "not here: no fault"
        );
        assert_eq!(classify(Some(501), false, false), None);
        assert_eq!(classify(Some(400), false, false), Some(Outcome::Success));
        assert_eq!(classify(Some(500), false, false), Some(Outcome::Fault));
        assert_eq!(classify(Some(200), true, false), Some(Outcome::Fault));
        assert_eq!(classify(None, true, false), Some(Outcome::Fault));
        assert_eq!(classify(None, false, false), None);
        assert_eq!(classify(None, true, true), None);
    }
}

/// Prompt tokens a node evaluated, and whether that is known: `base` less what the node
/// reported taking from its cache, else less what this gateway `credited` to it (a guess:
/// the node may have evicted the prefix; `false` then, and no prefill rate is learned).
/// Nothing is known when the node counted its output and `left_out` the prompt, as Ollama
/// does when its cache held all of it: `base` is then the gateway's estimate, and timing it
/// as prefilled taught a rate as fast as a cache read.
fn evaluated_tokens(
    base: u32,
    reported_cached: Option<u32>,
    credited: Option<u32>,
    left_out: bool,
) -> (u32, bool) {
    match (reported_cached, credited) {
        _ if left_out => (0, false),
        (Some(cached), _) => (base.saturating_sub(cached), true),
        (None, Some(credited)) => (base.saturating_sub(credited), false),
        (None, None) => (base, true),
    }
}

#[cfg(test)]
mod evaluated_tests {
    use super::evaluated_tokens;

    #[test]
    fn only_a_reported_or_uncredited_count_teaches_the_prefill_rate() {
        // A first turn: nothing credited, all 2190 tokens were evaluated.
        assert_eq!(evaluated_tokens(2190, None, None, false), (2190, true));
        // A later turn on the node that served the conversation: a guess, not learned from.
        assert_eq!(
            evaluated_tokens(2400, None, Some(2182), false),
            (218, false)
        );
        // The node said what it reused (OpenAI usage `cached_tokens`).
        assert_eq!(
            evaluated_tokens(2400, Some(2300), Some(2182), false),
            (100, true)
        );
        // Ollama counted the output and not the prompt: its cache held all 2190.
        assert_eq!(evaluated_tokens(2190, None, None, true), (0, false));
    }
}
