//! Rates learned online per node:model from each response (completion mode's inputs): prefill
//! time against prompt tokens, decode seconds per token against concurrency, cold-load time,
//! seat time and output length. Pure: time is an argument; persisted as `rates.json`.
//!
//! Every figure is a time-decayed mean: an observation `dt` after the previous one weighs
//! `alpha = max(1 - exp(-dt / DECAY_S), ALPHA_MIN)` against all before it, so a node that
//! slows down is followed within a few responses (or at once after a quiet spell). Prefill and
//! decode are decayed weighted least-squares lines `y = a + b x`: TTFT = overhead + tokens /
//! rate, and seconds per token = single-stream time + per-stream cost x (streams - 1). When the
//! observations do not spread along x, the line goes through the origin (prefill, prompts of
//! at least 256 tokens) or is flat (decode; short prompts: TTFT is overhead, the rate a prior).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::decay::{usable, Line, Mean, Plane};
use crate::routing::Rates;

pub const STATE_FILE: &str = "rates.json";

/// Prompts of one length read in this long on average (seconds) give the rate itself: the
/// fixed part of a TTFT (tens of milliseconds) is a small share of it. Read faster, they give a
/// floor (`Rates::prefill_floor`).
pub const FLOOR_TTFT_S: f64 = 0.5;

/// Gaps between responses kept per pair (their median is the pair's typical gap).
const GAPS: usize = 5;

/// The lower median (of an even count, the smaller middle one: the shorter gap, the higher
/// demand); `None` when empty.
fn median_low(xs: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[(v.len() - 1) / 2])
}

/// What one response tells about its node:model (assembled by `proxy::outcome::account`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Observation {
    pub now_ms: u64,
    /// The model was not loaded when the request was sent.
    pub cold: bool,
    /// Dispatch to end, seconds.
    pub service_s: f64,
    /// Dispatch to first streamed token, seconds (None when the response was not streamed).
    pub ttft_s: Option<f64>,
    /// Prompt tokens the node evaluated (its count, else the estimate minus the cached part;
    /// 0 when that is a guess, and then no prefill rate is learned from the response).
    pub prompt_tokens: u32,
    /// Seconds from this request's send to the first byte of the one sent just before it on
    /// the node (`queue::prefill`; `None`: nobody was ahead): the wait before its own prefill
    /// if the node prefills one prompt at a time.
    pub prefill_ahead_s: Option<f64>,
    pub output_tokens: Option<u32>,
    /// The output tokens the request allowed, if it said: whether the answer ran into it.
    pub max_output_tokens: Option<u32>,
    /// What the backend reports (Ollama `prompt_eval_duration`, `eval_duration`,
    /// `load_duration`), seconds.
    pub prompt_eval_s: Option<f64>,
    pub eval_s: Option<f64>,
    pub load_s: Option<f64>,
    /// Seconds the load this cold request waited for had been under way when it was sent (0:
    /// it started it): a request that joins a load waits for the rest of it only, and the
    /// whole load took this much more.
    pub load_under_way_s: f64,
    /// Sent to the pair idle past the keep-alive on a node that hides its loads: the seconds
    /// its answer showed it waiting for a load (0: none; `routing::IdleExpect::load_seen`).
    /// One that waited is taken as cold, its load as `load_s`.
    pub idle_load_s: Option<f64>,
    /// That spell was a swap (another model was sent to the node since the pair's last
    /// request), not an idle past the keep-alive: its load is learned apart
    /// (`Rates::switch_load_s`).
    pub switch: bool,
    /// Sent while its model had as many requests on the node as it was ever seen to decode at
    /// once, on a node whose seats nobody said that serves several models: it may have waited
    /// inside for one of its model's seats, so a first token timed by the gateway says nothing
    /// of its prefill (what the backend timed itself still does). Such waits taught a Mac with
    /// two seats per model a prefill twice its 1,200 tokens/s.
    pub seat_unsure: bool,
    /// Requests in flight on the node meanwhile (this one included): the mean of the counts
    /// at its send and its end.
    pub concurrency: u32,
    /// Streams that decoded on the node while this one did, on average (this one included;
    /// `queue::decoding`): what its seconds per token were paid at. `None` (not streamed):
    /// `concurrency` stands in.
    pub decode_streams: Option<f64>,
    /// Routing's priors for the pair (prompt tokens/s, seconds per output token; 0: none),
    /// to split the time of a response that was neither streamed nor timed by the backend.
    pub prior_prefill_tps: f64,
    pub prior_spt: f64,
    /// A first measurement (`services::measure`): the gateway's own short request, not a
    /// client's. It teaches the prefill and decode lines only: its seat time, output length
    /// and timing say nothing of what clients ask, so neither the service time, the output
    /// mean nor the gaps between answers hear of it.
    pub measurement: bool,
}

/// The learned rates of one node:model pair.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PairRates {
    /// TTFT (s) against evaluated prompt tokens.
    prefill: Line,
    /// The same TTFTs less `prefill_ahead_s`, against the same tokens: the line that fits
    /// better says whether the node prefills one prompt at a time (this one) or each seat on
    /// its own.
    #[serde(default)]
    prefill_queued: Line,
    /// Responses that had a request ahead (what tells the two lines apart).
    #[serde(default)]
    queued_seen: u32,
    /// Seconds per output token against streams - 1.
    decode: Line,
    /// Whole replies (neither streamed nor timed by the backend): their busy time against
    /// prompt and output tokens, fitted jointly to split the next one.
    #[serde(default)]
    whole: Plane,
    load: Mean,
    /// What requests to the pair idle past the keep-alive waited for a load (zeros count).
    #[serde(default)]
    idle_load: Mean,
    /// What requests to the pair sent after another model was sent to the node waited for a
    /// load (zeros count).
    #[serde(default)]
    switch_load: Mean,
    service: Mean,
    output: Mean,
    /// Of the answers to requests that set an output limit, the share that ran into it (1 or
    /// 0 each, decayed): how much a request's own limit says of its answer's length.
    #[serde(default)]
    capped: Mean,
    /// Seconds between the last [`GAPS`] responses (at least the clock's millisecond), oldest
    /// first; their median is the pair's typical gap, so one long pause (a night, a restart)
    /// does not hide a model that is asked for again every few seconds.
    #[serde(default)]
    gaps: Vec<f64>,
    observed: u32,
    last_ms: Option<u64>,
    /// When it first answered (ms; since this gateway's state was kept).
    #[serde(default)]
    first_ms: Option<u64>,
    /// A cold load's length read at the first byte of the first answer that waited for it
    /// (`came_in`), until an answer that waited for a load ends and tells it (`load`).
    #[serde(default)]
    load_at_first_byte: Option<f64>,
}

impl PairRates {
    /// The first answer of a cold pair to stream: its first byte came `first_s` after its
    /// send, `joined_s` into a load under way (0 for the one that started it), and its prompt
    /// was predicted to take `prefill_s`. Until an answer that waited for a load ends and tells
    /// it whole, the load is taken as that wait less the prefill. Read only where the prefill
    /// is at most half of the wait (a long prompt's first token says little of the load) and
    /// what is left reads as a load (`IdleExpect::MIN_LOAD_S`: a model found in, a request
    /// flagged cold on a stale view, tells none); once per load (the next cold answer's end
    /// clears it). Returns whether what routing reads changed.
    pub fn came_in(&mut self, first_s: f64, joined_s: f64, prefill_s: f64) -> bool {
        let since_start = first_s + if usable(joined_s) { joined_s } else { 0.0 };
        let known = self.load.get().is_some() || self.load_at_first_byte.is_some();
        if known || !usable(since_start) || !usable(prefill_s) || prefill_s > since_start / 2.0 {
            return false;
        }
        let load = since_start - prefill_s;
        if load < crate::routing::IdleExpect::MIN_LOAD_S {
            return false;
        }
        self.load_at_first_byte = Some(load);
        true
    }

    /// Learn from one response.
    pub fn observe(&mut self, o: &Observation) {
        let now = o.now_ms;
        // An idle pair's answer that waited for a load the node hid: learned as a cold one. One
        // that joined such a load (sent before the pair's first byte) waited for the rest of
        // it: the whole is that plus the time it had been under way; if it showed none, the
        // load was over by its turn, which says nothing of its length.
        if let Some(l) = o.idle_load_s {
            let under_way = Some(o.load_under_way_s).filter(|u| u.is_finite() && *u > 0.0);
            let mean = if o.switch {
                &mut self.switch_load
            } else {
                &mut self.idle_load
            };
            match (l > 0.0, under_way) {
                (true, u) => mean.add_any(l + u.unwrap_or(0.0), now),
                (false, None) => mean.add_any(0.0, now),
                (false, Some(_)) => {}
            }
        }
        let o = &match o.idle_load_s {
            Some(l) if l > 0.0 => Observation {
                cold: true,
                load_s: Some(l),
                ..*o
            },
            _ => *o,
        };
        let before = self.rates();
        if !o.measurement {
            self.service.add(o.service_s, now);
            if let Some(out) = o.output_tokens {
                self.output.add(f64::from(out), now);
                if let Some(cap) = o.max_output_tokens.filter(|c| *c > 0) {
                    self.capped.add_any(f64::from(u8::from(out >= cap)), now);
                }
            }
        }
        let tokens = f64::from(o.prompt_tokens);
        let ahead_s = o.prefill_ahead_s.filter(|a| usable(*a)).unwrap_or(0.0);
        let queued_s = if before.prefill_shared == Some(true) {
            ahead_s
        } else {
            0.0
        };
        let prefill_est = before.prefill_tps.map_or(0.0, |tps| {
            queued_s + before.prefill_overhead_s + tokens / tps
        });
        // Time to first token splits into load (cold) and prefill.
        let first = o.ttft_s.filter(|t| usable(*t));
        let load = if o.cold {
            // The answer's end tells the load (or that there was none): what its first byte
            // suggested is done.
            self.load_at_first_byte = None;
            let seen = o.load_s.filter(|s| *s > 0.0);
            let inferred = first
                .or(Some(o.service_s))
                .map(|t| (t - prefill_est).max(0.0));
            let l = seen.or(inferred);
            if let Some(l) = l {
                let before = o.load_under_way_s;
                self.load.add(
                    l + if before.is_finite() {
                        before.max(0.0)
                    } else {
                        0.0
                    },
                    now,
                );
            }
            l.unwrap_or(0.0)
        } else {
            o.load_s.unwrap_or(0.0)
        };
        let out = o.output_tokens.filter(|t| *t >= 2).map(f64::from);
        let streams = o
            .decode_streams
            .filter(|s| s.is_finite())
            .map_or(f64::from(o.concurrency.max(1) - 1), |s| (s - 1.0).max(0.0));
        let (mut prefill_s, mut gen_s) = match (o.prompt_eval_s, first) {
            (Some(p), _) if p > 0.0 => (Some(p), None),
            (_, Some(t)) if !o.cold => (Some((t - load).max(0.0)), Some(o.service_s - t)),
            (_, Some(t)) => (None, Some(o.service_s - t)),
            _ => (None, None),
        };
        if let Some(e) = o.eval_s.filter(|s| *s > 0.0) {
            gen_s = Some(e);
        }
        // Neither streamed nor timed by the backend: split the seat time between prefill and
        // decode in the proportion that the earlier such replies, fitted jointly against their
        // prompt and output tokens, predict; until they can tell, as the current rates (else
        // the priors) predict.
        if prefill_s.is_none() && gen_s.is_none() {
            let busy = o.service_s - load;
            let n_out = out.unwrap_or(0.0);
            let (est_p, est_d) = match self.whole.split(tokens, n_out) {
                Some(parts) => parts,
                None => {
                    let spt = before
                        .decode_spt
                        .map(|a| a + before.decode_spt_per_stream.unwrap_or(0.0) * streams)
                        .unwrap_or(o.prior_spt);
                    let est_p = match before.prefill_tps {
                        Some(_) => prefill_est,
                        None if o.prior_prefill_tps > 0.0 => tokens / o.prior_prefill_tps,
                        None => 0.0,
                    };
                    (est_p, n_out * spt)
                }
            };
            if est_p + est_d > 0.0 && busy > 0.0 {
                let k = busy / (est_p + est_d);
                prefill_s = (est_p > 0.0).then_some(est_p * k);
                gen_s = (est_d > 0.0).then_some(est_d * k);
            }
            // A cold reply's load is itself inferred: it would teach the plane that guess.
            if !o.cold && !o.measurement && busy > 0.0 && o.prompt_tokens > 0 && out.is_some() {
                self.whole.add(tokens, n_out, busy, now);
            }
        }
        let timed_by_node = o.prompt_eval_s.is_some_and(|p| p > 0.0);
        if let Some(p) =
            prefill_s.filter(|_| o.prompt_tokens > 0 && (timed_by_node || !o.seat_unsure))
        {
            self.prefill.add(tokens, p, now);
            // The wait for the one ahead is measured on the gateway's clock: it comes off the
            // streamed TTFT (a backend's own prompt timing may leave the wait out). Without
            // one, both lines get the same point.
            let ttft_prefill = first.filter(|_| !o.cold).map(|t| (t - load).max(0.0));
            let queued = match ttft_prefill {
                Some(t) if ahead_s > 0.0 => {
                    self.queued_seen = self.queued_seen.saturating_add(1);
                    (t - ahead_s).max(0.0)
                }
                Some(t) => t,
                None => p,
            };
            self.prefill_queued.add(tokens, queued, now);
        }
        if let (Some(n), Some(g)) = (out, gen_s.filter(|g| *g > 0.0)) {
            self.decode.add(streams, g / n, now);
        }
        // Gaps between clients' answers only (`first_ms` is the first of those).
        if let (Some(last), Some(_), false) = (self.last_ms, self.first_ms, o.measurement) {
            if self.gaps.len() >= GAPS {
                self.gaps.remove(0);
            }
            self.gaps
                .push((now.saturating_sub(last) as f64 / 1000.0).max(0.001));
        }
        self.observed = self.observed.saturating_add(1);
        self.last_ms = Some(now);
        if !o.measurement {
            self.first_ms.get_or_insert(now);
        }
    }

    /// Seconds a cold load of the model took on the node: observed at the end of an answer that
    /// waited for one, else read at the first byte of one (`came_in`); `None`: neither.
    pub fn load_s(&self) -> Option<f64> {
        self.load.get().or(self.load_at_first_byte)
    }

    /// What routing reads.
    pub fn rates(&self) -> Rates {
        // Queued only when the prompts ahead explain the TTFTs strictly better: with nothing
        // ever ahead the two lines are the same, and each seat prefills on its own.
        // Queued when the wait for the one ahead explains the TTFTs strictly better (a line
        // rising with the prompt, closer to the points), whatever its intercept: one that comes
        // out a millisecond below zero is still the better explanation.
        let residuals = (self.prefill_queued.residual(), self.prefill.residual());
        // Undecided until a response had one ahead and both lines have spread.
        let decided = self.queued_seen > 0 && residuals.0.is_some() && residuals.1.is_some();
        let shared = match residuals {
            (Some(q), Some(own)) => q < own && self.prefill_queued.slope() > 0.0,
            _ => false,
        };
        let line = if shared {
            &self.prefill_queued
        } else {
            &self.prefill
        };
        let prefill = line.fit(0.2, true);
        // Read off one prompt length: a floor while those prompts were read fast (their fixed
        // part may be most of it), the rate once they took `FLOOR_TTFT_S` or more.
        let quick = line.mean_y().is_some_and(|y| y < FLOOR_TTFT_S);
        let decode = self.decode.fit(0.2, false);
        Rates {
            prefill_tps: prefill.and_then(|(_, b, _)| (b > 0.0).then(|| 1.0 / b)),
            prefill_overhead_s: prefill.map_or(0.0, |(a, _, _)| a),
            prefill_floor: quick && prefill.is_some_and(|(_, b, spread)| b > 0.0 && !spread),
            prefill_shared: decided.then_some(shared),
            decode_spt: decode.map(|(a, _, _)| a).filter(|a| *a > 0.0),
            // Seen only at one concurrency: the cost of further streams is not known yet.
            decode_spt_per_stream: decode.and_then(|(_, b, spread)| spread.then_some(b)),
            load_s: self.load_s(),
            idle_load_s: self.idle_load.get(),
            switch_load_s: self.switch_load.get(),
            service_s: self.service.get(),
            output_tokens: self.output.get(),
            capped_share: self.capped.get(),
            observed: self.observed,
            last_ms: self.last_ms,
            first_ms: self.first_ms,
            gap_s: median_low(&self.gaps),
        }
    }
}

/// Every pair's rates, as written to `<state_dir>/rates.json`, keyed `node/model`; and per
/// node id what its answers said of its seats (`sharing`: shared by its models; `SeatBound`:
/// how many, when nobody said).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RatesStore {
    pub version: u32,
    pub pairs: BTreeMap<String, PairRates>,
    #[serde(default)]
    pub seats: BTreeMap<String, super::SeatSharing>,
    /// Per node id whose seats nobody said, what its answers said of them (`SeatBound`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub seat_bounds: BTreeMap<String, super::SeatBound>,
    /// Per pair (`node/model`) of such a node serving several models, what its answers said
    /// of the model's own seats.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub own_seat_bounds: BTreeMap<String, super::SeatBound>,
    /// Per pair, how many prompts back its prefix cache was learned to reach, where it is
    /// not [`super::prefix::INITIAL_REACH`].
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "lenient"
    )]
    pub prefix_reach: BTreeMap<String, u64>,
    /// Per model, the prompt-token calibration's samples (`fleet::calibrate`), oldest first.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "lenient"
    )]
    pub calibration: BTreeMap<String, Vec<super::calibrate::Sample>>,
}

/// A map whose entries that do not read as `V` are skipped (a hand-edited or older file loses
/// those, not every rate learned).
fn lenient<'de, D, V>(d: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: serde::Deserializer<'de>,
    V: serde::de::DeserializeOwned,
{
    let serde_json::Value::Object(raw) = serde_json::Value::deserialize(d)? else {
        return Ok(BTreeMap::new());
    };
    Ok(raw
        .into_iter()
        .filter_map(|(k, v)| Some((k, serde_json::from_value(v).ok()?)))
        .collect())
}

impl RatesStore {
    pub fn key(node: &str, model: &str) -> String {
        format!("{node}/{model}")
    }

    /// Take out everything saved of node `id` (its seats, and its pairs `id/<model>`).
    pub fn take_node(&mut self, id: &str) -> RatesStore {
        fn take<V>(
            map: &mut BTreeMap<String, V>,
            mine: impl Fn(&str) -> bool,
        ) -> BTreeMap<String, V> {
            let keys: Vec<String> = map.keys().filter(|k| mine(k)).cloned().collect();
            keys.into_iter()
                .filter_map(|k| map.remove_entry(&k))
                .collect()
        }
        let pair = |k: &str| k.split_once('/').is_some_and(|(node, _)| node == id);
        RatesStore {
            version: self.version,
            pairs: take(&mut self.pairs, pair),
            seats: take(&mut self.seats, |k| k == id),
            seat_bounds: take(&mut self.seat_bounds, |k| k == id),
            own_seat_bounds: take(&mut self.own_seat_bounds, pair),
            prefix_reach: take(&mut self.prefix_reach, pair),
            calibration: BTreeMap::new(),
        }
    }

    /// Add what `other` holds that this store does not.
    pub fn keep_from(&mut self, other: &RatesStore) {
        fn add<V: Clone>(map: &mut BTreeMap<String, V>, from: &BTreeMap<String, V>) {
            for (k, v) in from {
                map.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        add(&mut self.pairs, &other.pairs);
        add(&mut self.seats, &other.seats);
        add(&mut self.seat_bounds, &other.seat_bounds);
        add(&mut self.own_seat_bounds, &other.own_seat_bounds);
        add(&mut self.prefix_reach, &other.prefix_reach);
        add(&mut self.calibration, &other.calibration);
    }

    /// Read the state file; a missing file is an empty store.
    pub fn load(dir: &Path) -> Result<RatesStore, super::StoreError> {
        super::statefile::read(dir, STATE_FILE)
    }

    /// Write atomically.
    pub fn save(&self, dir: &Path) -> Result<(), super::StoreError> {
        super::statefile::write(dir, STATE_FILE, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One warm streamed response of a node with `prefill_tps` and single-stream `decode_tps`
    /// (each further stream adds `per_stream` s/token), 50 ms fixed TTFT overhead.
    fn response(
        now_ms: u64,
        prompt: u32,
        streams: u32,
        prefill_tps: f64,
        decode_tps: f64,
        per_stream: f64,
    ) -> Observation {
        let ttft = 0.05 + f64::from(prompt) / prefill_tps;
        let spt = 1.0 / decode_tps + per_stream * f64::from(streams - 1);
        let out = 200;
        Observation {
            now_ms,
            cold: false,
            service_s: ttft + f64::from(out) * spt,
            ttft_s: Some(ttft),
            prompt_tokens: prompt,
            output_tokens: Some(out),
            concurrency: streams,
            ..Observation::default()
        }
    }

    /// A node whose seats nobody said reads 1,200 prompt tokens/s. Answers sent while it was
    /// seen to run all it had at once, whose first tokens came after seconds in its queue,
    /// teach no prefill from those first tokens; one the node timed itself (Ollama's
    /// `prompt_eval_duration`) still does; decode is learned from all of them.
    #[test]
    fn a_first_token_that_may_have_waited_for_a_seat_teaches_no_prefill() {
        let mut p = PairRates::default();
        let mut t = 1_000_000u64;
        for prompt in [300u32, 4_000, 1_200, 9_000] {
            p.observe(&response(t, prompt, 1, 1_200.0, 100.0, 0.0));
            t += 1_000;
        }
        let before = p.rates().prefill_tps.expect("learned");
        assert!(within(before, 1_200.0, 0.01), "{before}");
        for (i, prompt) in [500u32, 6_000, 2_000, 8_000].into_iter().enumerate() {
            let queued = response(t, prompt, 2, 1_200.0, 100.0, 0.0);
            let wait = 3.0 + i as f64;
            p.observe(&Observation {
                ttft_s: queued.ttft_s.map(|f| f + wait),
                service_s: queued.service_s + wait,
                seat_unsure: true,
                ..queued
            });
            t += 1_000;
        }
        let r = p.rates();
        assert_eq!(r.prefill_tps, Some(before), "{r:?}");
        assert_eq!(r.observed, 8);
        let timed = response(t, 2_400, 2, 600.0, 100.0, 0.0);
        p.observe(&Observation {
            ttft_s: timed.ttft_s.map(|f| f + 5.0),
            prompt_eval_s: Some(4.0),
            seat_unsure: true,
            ..timed
        });
        assert!(p.rates().prefill_tps.expect("learned") < before * 0.99);
    }

    fn within(est: f64, truth: f64, tol: f64) -> bool {
        (est - truth).abs() <= tol * truth
    }

    /// Prefill of a `prompt`-token request and decode speed at `streams`, as predicted.
    fn predicted(r: &Rates, prompt: f64, streams: f64) -> (f64, f64) {
        let prefill = r.prefill_overhead_s + prompt / r.prefill_tps.expect("prefill learned");
        let spt = r.decode_spt.expect("decode learned")
            + r.decode_spt_per_stream.unwrap_or(0.0) * (streams - 1.0);
        (prefill, 1.0 / spt)
    }

    #[test]
    fn converges_within_ten_percent_and_follows_a_step_change() {
        let mut p = PairRates::default();
        let prompts = [400u32, 2_500, 900, 4_000, 1_600];
        let mut t = 1_000_000u64;
        // 20 responses, one a second, at 1-4 concurrent streams: 1000 tok/s prefill, 40 tok/s
        // decode alone, each further stream +5 ms/token.
        for i in 0..20u32 {
            let o = response(t, prompts[i as usize % 5], 1 + i % 4, 1_000.0, 40.0, 0.005);
            p.observe(&o);
            t += 1_000;
        }
        let r = p.rates();
        let (prefill, tps1) = predicted(&r, 2_000.0, 1.0);
        assert!(
            within(prefill, 2.05, 0.10),
            "prefill {prefill} vs 2.05: {r:?}"
        );
        assert!(within(tps1, 40.0, 0.10), "decode {tps1} vs 40: {r:?}");
        let (_, tps4) = predicted(&r, 0.0, 4.0);
        assert!(
            within(tps4, 1.0 / 0.04, 0.10),
            "decode at 4 streams {tps4}: {r:?}"
        );
        assert!(within(r.output_tokens.unwrap(), 200.0, 0.01));
        // The node slows to half speed (thermal throttling, another user): within 20 more
        // responses over 20 s the estimates follow.
        for i in 0..20u32 {
            let o = response(t, prompts[i as usize % 5], 1 + i % 4, 500.0, 20.0, 0.010);
            p.observe(&o);
            t += 1_000;
        }
        let r = p.rates();
        let (prefill, tps1) = predicted(&r, 2_000.0, 1.0);
        assert!(
            within(prefill, 4.05, 0.10),
            "prefill {prefill} vs 4.05: {r:?}"
        );
        assert!(within(tps1, 20.0, 0.10), "decode {tps1} vs 20: {r:?}");
        assert_eq!(r.observed, 40);
    }

    /// Whole replies (not streamed, no backend timings, as an OpenAI client that does not
    /// stream gets them): only their lengths tell prefill from decode. A node that prefills
    /// 50,000 tokens/s and decodes 200 tokens/s (5 % slower per further stream, 1-4 streams),
    /// each reply off by up to 12 % (waits, other streams' prefills), priors that say 4,000 and
    /// 100, eight short prompts (whose prefill is lost in their decode) before four long ones:
    /// after the long ones the rates are within 15 %. Split in the proportion the current
    /// rates predict, each long reply moved them only part of the way (38,300 and 249 here;
    /// two identical nodes of the placement bench learned prefill rates 2x apart).
    #[test]
    fn whole_replies_teach_prefill_and_decode_apart() {
        let mut p = PairRates::default();
        let mut t = 1_000_000u64;
        // Short prompts first (their prefill is lost in the decode), then long ones.
        let prompts = [
            900u32, 300, 2_900, 160, 1_600, 270, 440, 470, 19_000, 5_600, 9_600, 12_700,
        ];
        let outs = [60u32, 25, 80, 40, 70, 30, 50, 20];
        let noise = [0.10, -0.05, 0.08, -0.10, 0.0, 0.12, -0.07, 0.03, 0.05];
        for i in 0..12usize {
            let (prompt, out) = (prompts[i], outs[(i * 3) % 8]);
            let streams = 1 + (i * 5) % 4;
            let spt = (1.0 + 0.05 * (streams - 1) as f64) / 200.0;
            let busy = 0.02 + f64::from(prompt) / 50_000.0 + f64::from(out) * spt;
            p.observe(&Observation {
                now_ms: t,
                service_s: busy * (1.0 + noise[i % 9]),
                prompt_tokens: prompt,
                output_tokens: Some(out),
                concurrency: streams as u32,
                prior_prefill_tps: 4_000.0,
                prior_spt: 0.01,
                ..Observation::default()
            });
            t += 300;
        }
        let r = p.rates();
        let tps = r.prefill_tps.expect("prefill learned");
        assert!(within(tps, 50_000.0, 0.15), "prefill {tps} tok/s: {r:?}");
        let spt = r.decode_spt.expect("decode learned");
        assert!(
            within(1.0 / spt, 200.0, 0.15),
            "decode {} tok/s: {r:?}",
            1.0 / spt
        );
    }

    /// A node that prefills one prompt at a time: TTFT is the wait for the request ahead plus
    /// its own prefill. One that prefills each seat on its own, with the same waits measured:
    /// its own only.
    #[test]
    fn tells_a_node_that_prefills_one_at_a_time_from_one_that_does_not() {
        let prompts = [400u32, 2_500, 900, 4_000, 1_600, 7_000];
        let aheads = [
            None,
            Some(1.5),
            None,
            Some(4.0),
            Some(0.6),
            Some(0.0),
            Some(2.5),
        ];
        let (mut serial, mut parallel, mut alone) = (
            PairRates::default(),
            PairRates::default(),
            PairRates::default(),
        );
        for i in 0..30usize {
            let t = 1_000_000 + i as u64 * 1_000;
            let (prompt, ahead) = (prompts[i % 6], aheads[i % 7]);
            let own = response(t, prompt, 1, 2_000.0, 40.0, 0.0);
            let extra = ahead.unwrap_or(0.0);
            serial.observe(&Observation {
                prefill_ahead_s: ahead,
                ttft_s: own.ttft_s.map(|x| x + extra),
                service_s: own.service_s + extra,
                ..own
            });
            // On a node that does not queue, the one ahead answers while this one prefills.
            parallel.observe(&Observation {
                prefill_ahead_s: ahead.map(|a| a.min(own.ttft_s.unwrap() * 0.5)),
                ..own
            });
            alone.observe(&own);
        }
        let r = serial.rates();
        assert_eq!(r.prefill_shared, Some(true), "{r:?}");
        assert!(within(r.prefill_tps.unwrap(), 2_000.0, 0.05), "{r:?}");
        assert!(within(r.prefill_overhead_s, 0.05, 0.10), "{r:?}");
        let r = parallel.rates();
        assert_eq!(r.prefill_shared, Some(false), "{r:?}");
        assert!(within(r.prefill_tps.unwrap(), 2_000.0, 0.05), "{r:?}");
        // Nobody ever ahead: undecided (routing takes the fleet's majority meanwhile).
        assert_eq!(alone.rates().prefill_shared, None);
    }

    #[test]
    fn contention_is_learned_against_the_streams_that_decoded_not_the_requests_in_flight() {
        // 5 % per further stream (the sim's `decode_contention`), 200 tok/s alone. Four in
        // flight every time (long prompts prefilling beside), 1 to 4 of them decoding.
        let (spt1, per) = (1.0 / 200.0, 0.05 / 200.0);
        let mut by_streams = PairRates::default();
        let mut by_flight = PairRates::default();
        for i in 0..24u64 {
            let decoding = 1.0 + (i % 4) as f64 + 0.3 * ((i % 3) as f64 - 1.0).abs();
            let spt = spt1 + per * (decoding - 1.0);
            let o = Observation {
                service_s: 0.05 + 100.0 * spt,
                ttft_s: Some(0.05),
                output_tokens: Some(100),
                concurrency: 4,
                ..response(1_000_000 + i * 300, 500, 4, 10_000.0, 200.0, 0.0)
            };
            by_flight.observe(&o);
            by_streams.observe(&Observation {
                decode_streams: Some(decoding),
                ..o
            });
        }
        let r = by_streams.rates();
        assert!(within(r.decode_spt.unwrap(), spt1, 0.02), "{r:?}");
        assert!(within(r.decode_spt_per_stream.unwrap(), per, 0.10), "{r:?}");
        // In-flight counts that never change tell nothing about contention.
        let r = by_flight.rates();
        assert!(r.decode_spt_per_stream.unwrap_or(0.0) < per * 0.5, "{r:?}");
    }

    #[test]
    fn after_a_quiet_spell_one_response_is_enough() {
        let mut p = PairRates::default();
        for i in 0..10 {
            p.observe(&response(i * 1_000, 1_000, 1, 1_000.0, 40.0, 0.0));
        }
        // A minute later the node is 3x slower: alpha ~ 1, the next response dominates.
        p.observe(&response(70_000, 1_000, 1, 333.0, 13.3, 0.0));
        let (_, tps) = predicted(&p.rates(), 1_000.0, 1.0);
        assert!(within(tps, 13.3, 0.10), "{tps}");
    }

    /// `response`'s request at 1 s, sent cold: it waited `wait_s` for the model first.
    fn cold_response(wait_s: f64) -> Observation {
        let mut o = response(1_000, 1_000, 1, 1_000.0, 40.0, 0.0);
        o.cold = true;
        o.ttft_s = o.ttft_s.map(|t| t + wait_s);
        o.service_s += wait_s;
        o
    }

    #[test]
    fn cold_responses_teach_the_load_time_not_the_prefill() {
        let mut p = PairRates::default();
        p.observe(&response(0, 1_000, 1, 1_000.0, 40.0, 0.0));
        let before = p.rates().prefill_tps;
        let mut cold = cold_response(12.0);
        p.observe(&cold);
        let r = p.rates();
        assert!(within(r.load_s.unwrap(), 12.0, 0.02), "{r:?}");
        assert_eq!(r.prefill_tps, before);
        // Ollama's own load_duration wins over the inference.
        cold.load_s = Some(9.0);
        let mut q = PairRates::default();
        q.observe(&cold);
        assert_eq!(q.rates().load_s, Some(9.0));
    }

    /// A cold answer's first byte tells the load before its end does: its wait less the
    /// prompt's prefill (the prior's rate on a pair never seen), plus a load it joined; a long
    /// prompt's first byte tells nothing; the answer that ends replaces it.
    #[test]
    fn a_cold_load_is_read_at_the_first_byte_until_an_answer_tells_it_whole() {
        let mut p = PairRates::default();
        // A prompt predicted at 0.5 s of a 1.5 s wait.
        assert!(p.came_in(1.5, 0.0, 0.5));
        assert_eq!(p.rates().load_s, Some(1.0));
        // Once per load: a later first byte says nothing.
        assert!(!p.came_in(0.9, 0.0, 0.1));
        assert_eq!(p.load_s(), Some(1.0));
        // One that joined the load 0.4 s in: the load ran from before its send.
        let mut joined = PairRates::default();
        assert!(joined.came_in(1.3, 0.4, 0.2));
        assert!(within(joined.load_s().unwrap(), 1.5, 0.01), "{joined:?}");
        // A prompt predicted at 2.5 s of a 3 s wait, or one found in (0.1 s left): nothing.
        let mut none = PairRates::default();
        assert!(!none.came_in(3.0, 0.0, 2.5));
        assert!(!none.came_in(0.3, 0.0, 0.1 + 0.05));
        assert_eq!(none.load_s(), None);
        // The answer that ends tells it whole.
        p.observe(&Observation {
            load_s: Some(3.0),
            ..cold_response(3.0)
        });
        assert!(within(p.load_s().unwrap(), 3.0, 0.02), "{p:?}");
        // A cold answer whose end shows no load clears what a first byte suggested.
        let mut found_in = PairRates::default();
        found_in.observe(&response(0, 1_000, 1, 1_000.0, 40.0, 0.0));
        assert!(found_in.came_in(1.5, 0.0, 0.5));
        found_in.observe(&cold_response(0.0));
        assert!(found_in.load_s().is_none_or(|l| l < 0.1), "{found_in:?}");
    }

    /// A response at `now_ms` to an idle pair whose first token (and end) came `load_s` late:
    /// the load it was seen to wait for.
    fn waited_for_load(now_ms: u64, load_s: f64) -> Observation {
        let mut o = response(now_ms, 1_000, 1, 1_000.0, 40.0, 0.0);
        o.ttft_s = o.ttft_s.map(|t| t + load_s);
        o.service_s += load_s;
        o.idle_load_s = Some(load_s);
        o
    }

    /// A request to an idle pair on a node that hides its loads: one that waited for a load
    /// teaches it (as a cold one does: not as prefill) and the idle pair's expected load; one
    /// that found the model in memory teaches its prefill and a zero.
    #[test]
    fn an_idle_pair_teaches_the_load_it_waited_for_or_none() {
        let mut p = PairRates::default();
        p.observe(&response(0, 1_000, 1, 1_000.0, 40.0, 0.0));
        let before = p.rates().prefill_tps;
        p.observe(&waited_for_load(400_000, 1.5));
        let r = p.rates();
        assert_eq!((r.idle_load_s, r.load_s), (Some(1.5), Some(1.5)), "{r:?}");
        assert_eq!(r.prefill_tps, before);
        assert_eq!(r.observed, 2);
        let mut warm = response(800_000, 1_000, 1, 1_000.0, 40.0, 0.0);
        warm.idle_load_s = Some(0.0);
        p.observe(&warm);
        let after = p.rates().idle_load_s.unwrap();
        assert!(after < 1e-6, "the last spell's: none ({after})");
    }

    /// A request sent after another model was sent to the node (a swap spell) teaches the
    /// swap's load, apart from the load after an idle spell: a node whose models stay in memory
    /// together swaps for nothing, however long it takes to load one after the keep-alive.
    #[test]
    fn a_swap_teaches_its_own_load_not_the_idle_one() {
        let mut p = PairRates::default();
        p.observe(&response(0, 1_000, 1, 1_000.0, 40.0, 0.0));
        p.observe(&waited_for_load(400_000, 1.5));
        let swap = Observation {
            switch: true,
            ..waited_for_load(401_000, 2.5)
        };
        p.observe(&swap);
        let r = p.rates();
        assert_eq!(
            (r.idle_load_s, r.switch_load_s),
            (Some(1.5), Some(2.5)),
            "{r:?}"
        );
        let mut stayed = response(402_000, 1_000, 1, 1_000.0, 40.0, 0.0);
        stayed.idle_load_s = Some(0.0);
        stayed.switch = true;
        p.observe(&stayed);
        let r = p.rates();
        assert_eq!(r.idle_load_s, Some(1.5));
        assert!(r.switch_load_s.unwrap() < 2.5, "{r:?}");
    }

    /// A request that joined a hidden load 0.5 s in waited 1 s for the rest: the load took
    /// 1.5 s, and its TTFT is not a prefill. One that joined and waited for none says nothing
    /// of the load's length.
    #[test]
    fn a_request_that_joined_a_hidden_load_teaches_the_whole_load() {
        let mut p = PairRates::default();
        p.observe(&response(0, 1_000, 1, 1_000.0, 40.0, 0.0));
        let before = p.rates().prefill_tps;
        let joined = Observation {
            load_under_way_s: 0.5,
            ..waited_for_load(400_000, 1.0)
        };
        p.observe(&joined);
        let r = p.rates();
        assert_eq!((r.idle_load_s, r.load_s), (Some(1.5), Some(1.5)), "{r:?}");
        assert_eq!(r.prefill_tps, before);
        let mut late = response(800_000, 1_000, 1, 1_000.0, 40.0, 0.0);
        late.idle_load_s = Some(0.0);
        late.load_under_way_s = 1.2;
        p.observe(&late);
        assert_eq!(p.rates().idle_load_s, Some(1.5));
    }

    /// A request sent 8 s into a load waits 4 s for the rest of it: the load took 12 s, and
    /// its prefill is still what is left of its TTFT after its own 4 s wait.
    #[test]
    fn a_request_that_joined_a_load_under_way_teaches_the_whole_load() {
        let mut p = PairRates::default();
        p.observe(&response(0, 1_000, 1, 1_000.0, 40.0, 0.0));
        let before = p.rates().prefill_tps;
        let mut joined = cold_response(4.0);
        joined.load_under_way_s = 8.0;
        p.observe(&joined);
        let r = p.rates();
        assert!(within(r.load_s.unwrap(), 12.0, 0.02), "{r:?}");
        assert_eq!(r.prefill_tps, before);
    }

    /// A state file whose calibration or cache reach holds something that does not read (a
    /// hand edit, another version) loses those entries, not the rates beside them.
    #[test]
    fn unreadable_calibration_and_reach_entries_are_skipped() {
        let text = r#"{"version":1,"pairs":{},
            "prefix_reach":{"a/m":12,"a/n":-3,"b/m":"far"},
            "calibration":{"m":[{"chars":400.0,"tokens":100.0,"whole":true}],"n":[{"chars":"x"}]}}"#;
        let store: RatesStore = serde_json::from_str(text).expect("the file reads");
        assert_eq!(store.prefix_reach.len(), 1);
        assert_eq!(store.prefix_reach["a/m"], 12);
        assert_eq!(store.calibration.len(), 1);
        assert_eq!(store.calibration["m"].len(), 1);
        let odd: RatesStore =
            serde_json::from_str(r#"{"version":1,"pairs":{},"calibration":5}"#).expect("reads");
        assert!(odd.calibration.is_empty());
    }

    /// Of the answers to requests that set an output limit, the share that ran into it;
    /// answers to requests without one, and the gateway's own measurements, say nothing of it.
    #[test]
    fn the_share_of_answers_that_ran_into_their_limit_is_learned() {
        let answer = |at: u64, out: u32, cap: Option<u32>| Observation {
            now_ms: at,
            service_s: 1.0,
            output_tokens: Some(out),
            max_output_tokens: cap,
            concurrency: 1,
            ..Observation::default()
        };
        let mut p = PairRates::default();
        p.observe(&answer(1_000, 50, None));
        assert_eq!(p.rates().capped_share, None);
        p.observe(&answer(1_001, 300, Some(300)));
        assert_eq!(p.rates().capped_share, Some(1.0));
        p.observe(&Observation {
            measurement: true,
            ..answer(1_002, 10, Some(16))
        });
        assert_eq!(
            p.rates().capped_share,
            Some(1.0),
            "a measurement says nothing"
        );
        for t in 0..50 {
            p.observe(&answer(2_000 + t, 120, Some(4_096)));
        }
        assert!(p.rates().capped_share.is_some_and(|s| s < 0.1));
    }

    #[test]
    fn store_round_trips_atomically() {
        let dir = std::env::temp_dir().join(format!("fleetgate-rates-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(RatesStore::load(&dir).unwrap(), RatesStore::default());
        let mut p = PairRates::default();
        p.observe(&response(5, 1_000, 2, 1_000.0, 40.0, 0.0));
        let mut store = RatesStore {
            version: 1,
            ..RatesStore::default()
        };
        store.pairs.insert(RatesStore::key("a", "m"), p.clone());
        let mut shared = super::super::SeatSharing::default();
        for t in 0..3 {
            shared.observe(0.5, 0.5, t * 100);
        }
        assert!(shared.shared());
        store.seats.insert("a".into(), shared);
        let mut bound = super::super::SeatBound::default();
        for t in 0..3 {
            bound.observe(2, 0.5, 0.5, t * 100);
        }
        store.seat_bounds.insert("b".into(), bound);
        store
            .own_seat_bounds
            .insert(RatesStore::key("a", "m"), bound);
        store.save(&dir).unwrap();
        assert!(!dir.join("rates.json.tmp").exists());
        let back = RatesStore::load(&dir).unwrap();
        assert_eq!(back.pairs["a/m"].rates(), p.rates());
        assert!(
            back.seats["a"].shared(),
            "what the node's answers said survives"
        );
        assert_eq!(back.seat_bounds["b"].seats(), Some(2));
        assert_eq!(back.own_seat_bounds["a/m"].seats(), Some(2));
        // A file written before seats were learned reads as none learned.
        std::fs::write(dir.join(STATE_FILE), r#"{"version":1,"pairs":{}}"#).unwrap();
        assert!(RatesStore::load(&dir).unwrap().seats.is_empty());
        std::fs::write(dir.join(STATE_FILE), "{").unwrap();
        assert!(RatesStore::load(&dir).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// How often a pair is asked for follows its last few gaps: an 8-hour pause (a night, a
    /// restart) is one gap among five, so three responses 2 s apart after it read as 2 s.
    #[test]
    fn a_long_pause_does_not_hide_a_model_asked_for_again() {
        let mut r = PairRates::default();
        let mut at = 1_000_000;
        for _ in 0..3 {
            r.observe(&response(at, 500, 1, 2_000.0, 50.0, 0.0));
            at += 2_000;
        }
        assert_eq!(r.rates().gap_s, Some(2.0));
        at += 8 * 3_600 * 1_000;
        r.observe(&response(at, 500, 1, 2_000.0, 50.0, 0.0));
        for _ in 0..3 {
            at += 2_000;
            r.observe(&response(at, 500, 1, 2_000.0, 50.0, 0.0));
        }
        assert_eq!(r.rates().gap_s, Some(2.0));
        let demand = r.rates().demand_per_s(0, at + 500);
        assert!((demand - 0.5).abs() < 1e-9, "{demand}");
        // Quiet for a minute: at most one per minute.
        assert!((r.rates().demand_per_s(0, at + 60_000) - 1.0 / 60.0).abs() < 1e-9);
    }

    #[test]
    fn a_first_measurement_teaches_the_rates_but_not_what_clients_ask() {
        let mut p = PairRates::default();
        // The gateway's own short request: 300 prompt tokens, 16 out, at 1000 / 40 tokens/s.
        let m = Observation {
            output_tokens: Some(16),
            service_s: 0.05 + 0.3 + 16.0 / 40.0,
            measurement: true,
            ..response(1_000_000, 300, 1, 1_000.0, 40.0, 0.0)
        };
        p.observe(&m);
        let r = p.rates();
        assert_eq!(r.observed, 1, "a measured pair is no longer untried");
        assert!(within(1.0 / r.decode_spt.unwrap(), 40.0, 0.02), "{r:?}");
        assert!(r.prefill_tps.is_some(), "{r:?}");
        assert_eq!(
            r.last_ms,
            Some(1_000_000),
            "measured now: not explored at once"
        );
        assert_eq!(
            (r.service_s, r.output_tokens, r.first_ms, r.gap_s),
            (None, None, None, None),
            "its seat time, its 16 tokens and its time say nothing of clients' requests"
        );
        // Clients' answers then teach the rest; the gap from the measurement is no demand.
        p.observe(&response(1_030_000, 2_000, 1, 1_000.0, 40.0, 0.0));
        p.observe(&response(1_032_000, 2_000, 1, 1_000.0, 40.0, 0.0));
        let r = p.rates();
        assert_eq!(r.output_tokens, Some(200.0));
        assert_eq!(r.first_ms, Some(1_030_000));
        assert_eq!(r.gap_s, Some(2.0), "{r:?}");
    }

    #[test]
    fn one_prompt_length_read_slowly_is_the_rate_read_fast_a_floor() {
        // A CPU box reads 300-token prompts at 150 tokens/s (2 s each, 20 ms of it fixed).
        let mut slow = PairRates::default();
        let mut fast = PairRates::default();
        for i in 0..3u64 {
            slow.observe(&Observation {
                ttft_s: Some(0.02 + 300.0 / 150.0),
                ..response(1_000_000 + i * 5_000, 300, 1, 150.0, 20.0, 0.0)
            });
            // A GPU reads them in 35 ms, 20 of them fixed: 300 / 0.035 is no rate.
            fast.observe(&Observation {
                ttft_s: Some(0.02 + 300.0 / 20_000.0),
                ..response(1_000_000 + i * 5_000, 300, 1, 20_000.0, 20.0, 0.0)
            });
        }
        let (s, f) = (slow.rates(), fast.rates());
        assert!(!s.prefill_floor, "{s:?}");
        assert!(within(s.prefill_tps.unwrap(), 150.0, 0.02), "{s:?}");
        assert!(f.prefill_floor, "{f:?}");
    }
}
