//! `ct-oracle`: a client-side router that knows each simulated node's true physics and sends
//! each request where its estimated completion time is least. What the issue's "~200-line
//! completion-time router" does, with perfect knowledge in place of learning: the nodes'
//! seats, decode and prefill rates, model speeds, cold-load times and context windows (their
//! `sim` specs), which models are loaded or loading now and the run-time slowdown (read off
//! the sims). Its estimate: the wait for a seat (from the predicted ends of what it sent
//! there itself), the rest of a cold load, the uncached prefill (a conversation's earlier
//! turn counts as cached on the node that served it while that node's prefix cache holds
//! it), the decode at the node's concurrency. Greedy: it does not weigh the evictions a cold
//! load causes, nor the prefill queue of `prefill_parallel`. A yardstick for what placement
//! could know, not a policy a gateway could run.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use fleetgate::sim::{SimControl, SimSpec};

/// What the oracle is told about a request (what the client knows).
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub model: &'a str,
    pub prompt: u32,
    pub output: u32,
    /// Conversation index and the prompt tokens of its previous turn (what a node that
    /// served that turn holds in its prefix cache).
    pub chat: Option<(usize, u32)>,
}

pub struct Oracle {
    t0: Instant,
    nodes: Vec<Known>,
    state: Mutex<State>,
}

struct Known {
    spec: SimSpec,
    ctl: Arc<SimControl>,
}

#[derive(Default)]
struct State {
    next: u64,
    /// Per node: what it runs (ticket, model, predicted end s), its prefix cache (one LRU for
    /// the node, as the sim keeps: (model, request key), most recent first), cold loads it
    /// started (model, start s).
    running: Vec<Vec<(u64, String, f64)>>,
    prefixes: Vec<VecDeque<(String, u64)>>,
    loads: Vec<Vec<(String, f64)>>,
}

impl Oracle {
    pub fn new(nodes: Vec<(SimSpec, Arc<SimControl>)>) -> Oracle {
        let n = nodes.len();
        Oracle {
            t0: Instant::now(),
            nodes: nodes
                .into_iter()
                .map(|(spec, ctl)| Known { spec, ctl })
                .collect(),
            state: Mutex::new(State {
                running: vec![Vec::new(); n],
                prefixes: vec![VecDeque::new(); n],
                loads: vec![Vec::new(); n],
                ..State::default()
            }),
        }
    }

    /// The node among `on` that finishes `want` first (`start` rotates ties), and the ticket
    /// to hand back to [`Oracle::done`].
    pub fn pick(&self, want: &Want<'_>, on: &[usize], start: usize) -> (usize, u64) {
        let now = self.t0.elapsed().as_secs_f64();
        let mut st = self.state.lock().expect("oracle lock");
        let order = (0..on.len()).map(|j| on[(start + j) % on.len()]);
        let best = order
            .clone()
            .filter_map(|i| self.estimate(&st, i, want, now).map(|t| (i, t)))
            .min_by(|a, b| a.1 .0.total_cmp(&b.1 .0));
        // No node's window holds it: the first, which answers with the error.
        let (i, (secs, wait)) = best.unwrap_or((on[start % on.len()], (0.0, 0.0)));
        st.next += 1;
        let ticket = st.next;
        st.running[i].push((ticket, want.model.to_string(), now + secs));
        let key = want.chat.map_or(u64::MAX - ticket, |(c, _)| c as u64);
        let cap = self.nodes[i].spec.prefix_cache_entries as usize;
        let lru = &mut st.prefixes[i];
        lru.retain(|(m, k)| !(m == want.model && *k == key));
        lru.push_front((want.model.to_string(), key));
        lru.truncate(cap);
        // The sim starts a cold load once the request has a seat.
        if let Some((false, false)) = self.nodes[i].ctl.model_state(want.model) {
            st.loads[i].retain(|(m, _)| m != want.model);
            st.loads[i].push((want.model.to_string(), now + wait));
        }
        (i, ticket)
    }

    /// The request with `ticket` on node `i` ended.
    pub fn done(&self, i: usize, ticket: u64) {
        let mut st = self.state.lock().expect("oracle lock");
        st.running[i].retain(|(t, _, _)| *t != ticket);
    }

    /// Predicted seconds to finish `want` on node `i` from `now`, and of that the wait for a
    /// seat; `None` when the node's window for the model does not hold it.
    fn estimate(&self, st: &State, i: usize, want: &Want<'_>, now: f64) -> Option<(f64, f64)> {
        let k = &self.nodes[i];
        let spec = &k.spec;
        let m = spec.models.iter().find(|m| m.name == want.model)?;
        let needed = want.prompt + want.output + spec.template_tokens;
        if m.context > 0 && needed > m.context {
            return None;
        }
        let (loaded, loading) = k.ctl.model_state(&m.name)?;
        let slow = k.ctl.slowdown();
        let seats = spec.seats.max(1) as usize;
        let mut ends: Vec<f64> = st.running[i]
            .iter()
            .filter(|(_, model, _)| !spec.seats_per_model || *model == m.name)
            .map(|(_, _, end)| (end - now).max(0.0))
            .collect();
        ends.sort_by(f64::total_cmp);
        let wait = if ends.len() < seats {
            0.0
        } else {
            ends[ends.len() - seats]
        };
        let load_s = m.cold_load_ms as f64 / 1000.0;
        let load = if loaded {
            0.0
        } else if loading {
            let began = st.loads[i]
                .iter()
                .find(|(name, _)| *name == m.name)
                .map_or(now, |(_, t)| *t);
            (began + load_s - now - wait).max(0.0)
        } else {
            load_s
        };
        let cached = match want.chat {
            Some((c, prev)) => {
                let holds = st.prefixes[i]
                    .iter()
                    .any(|(name, k)| *name == m.name && *k == c as u64);
                if holds {
                    prev.min(want.prompt)
                } else {
                    0
                }
            }
            None => 0,
        };
        let speed = m.speed;
        let prefill = spec.ttft_ms as f64 / 1000.0
            + spec
                .prefill_tokens_per_sec
                .map_or(0.0, |r| f64::from(want.prompt - cached) / (r * speed));
        // Streams decoding beside it: the node's, each model's up to its own seats with
        // `seats_per_model`.
        let decoding = if spec.seats_per_model {
            let mut per: Vec<(&str, usize)> = Vec::new();
            for (_, model, _) in &st.running[i] {
                match per.iter_mut().find(|(name, _)| *name == model.as_str()) {
                    Some((_, n)) => *n += 1,
                    None => per.push((model.as_str(), 1)),
                }
            }
            per.iter()
                .map(|(name, n)| {
                    if *name == m.name {
                        (*n).min(seats - 1)
                    } else {
                        (*n).min(seats)
                    }
                })
                .sum::<usize>()
        } else {
            st.running[i].len().min(seats - 1)
        } as f64;
        let rate = spec.tokens_per_sec * speed / (1.0 + spec.decode_contention * decoding);
        let decode = f64::from(want.output.min(spec.reply_tokens)) / rate;
        Some((wait + load + (prefill + decode) * slow, wait))
    }
}
