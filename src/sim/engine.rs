//! Request physics: validation against the model, FIFO seats, shared cold loads, prefill with
//! the prefix cache, token pacing under decode contention and the run-time slowdown.

use super::control::{Gate, Killed, SimControl};
use super::models::KeepAlive;
use super::prefix::Chain;
use super::text::{tokens, SplitMix};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::{sleep, sleep_until, Instant};

/// What a protocol handler asks of the node.
#[derive(Debug, Clone)]
pub(crate) struct Ask {
    pub model: String,
    pub prompt_tokens: u32,
    pub max_tokens: Option<u32>,
    /// Hash of the request content; with the node seed it fixes the output.
    pub hash: u64,
    pub embed: bool,
    pub keep_alive: KeepAlive,
    /// The prompt as cumulative prefix steps (empty: not cacheable).
    pub chain: Chain,
}

/// Why a request is refused before it runs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Reject {
    UnknownModel(String),
    Context {
        context: u32,
        prompt: u32,
        completion: u32,
    },
    /// Text generation asked of an embedding model.
    NotSupported(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Finish {
    Stop,
    Length,
}

/// A validated request.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub idx: usize,
    pub prompt_tokens: u32,
    pub out_tokens: u32,
    pub finish: Finish,
    pub seed: u64,
    pub keep_alive: KeepAlive,
    pub chain: Chain,
    /// The model's rates relative to the node's (`SimModel::speed`).
    pub speed: f64,
}

/// Counts and durations of a finished request.
#[derive(Debug, Clone)]
pub(crate) struct Summary {
    pub prompt_tokens: u32,
    /// Prompt tokens found in the prefix cache (not prefilled).
    pub cached_tokens: u32,
    pub completion_tokens: u32,
    pub finish: Finish,
    pub total: Duration,
    pub load: Duration,
    pub prompt_eval: Duration,
    pub eval: Duration,
}

impl Summary {
    pub fn ns(d: Duration) -> u64 {
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Validate an ask against the node's models.
pub(crate) fn plan(ctl: &SimControl, ask: &Ask) -> Result<Plan, Reject> {
    let reg = ctl.models.lock();
    let idx = reg
        .find(&ask.model)
        .ok_or_else(|| Reject::UnknownModel(ask.model.clone()))?;
    let m = &reg.entries[idx].spec;
    if m.embedding && !ask.embed {
        return Err(Reject::NotSupported(m.name.clone()));
    }
    let reply = ctl.spec.reply_tokens;
    let completion = if ask.embed {
        0
    } else {
        ask.max_tokens.unwrap_or(reply)
    };
    let prompt_tokens = ask.prompt_tokens.saturating_add(ctl.spec.template_tokens);
    if u64::from(prompt_tokens) + u64::from(completion) > u64::from(m.context) {
        return Err(Reject::Context {
            context: m.context,
            prompt: prompt_tokens,
            completion,
        });
    }
    let (out_tokens, finish) = match ask.max_tokens {
        _ if ask.embed => (0, Finish::Stop),
        Some(mx) if mx < reply => (mx, Finish::Length),
        _ => (reply, Finish::Stop),
    };
    Ok(Plan {
        idx,
        prompt_tokens,
        out_tokens,
        finish,
        seed: SplitMix::new(ctl.spec.seed ^ ask.hash).next_u64(),
        keep_alive: ask.keep_alive,
        chain: ask.chain.clone(),
        speed: m.speed,
    })
}

/// Make sure model `idx` is loaded; concurrent callers share one cold load. Returns the wait.
pub(crate) async fn ensure_loaded(ctl: &Arc<SimControl>, idx: usize) -> Duration {
    let t0 = Instant::now();
    let mut rx = {
        let mut reg = ctl.models.lock();
        if reg.entries[idx].loaded.is_some() {
            reg.mark_loaded(idx); // refresh LRU position
            return Duration::ZERO;
        }
        match &reg.entries[idx].loading {
            Some(rx) => rx.clone(),
            None => {
                let (tx, rx) = watch::channel(false);
                reg.entries[idx].loading = Some(rx.clone());
                let ms = reg.entries[idx].spec.cold_load_ms;
                // A task of its own, so a client hanging up cannot abandon the load.
                tokio::spawn(cold_load(ctl.clone(), idx, ms, tx));
                rx
            }
        }
    };
    let _ = rx.wait_for(|done| *done).await;
    t0.elapsed()
}

async fn cold_load(ctl: Arc<SimControl>, idx: usize, ms: u64, tx: watch::Sender<bool>) {
    sleep(Duration::from_millis(ms)).await;
    let loaded = {
        let mut reg = ctl.models.lock();
        reg.entries[idx].loading = None;
        let (fresh, evicted) = reg.mark_loaded(idx);
        if !evicted.is_empty() {
            log::debug!(
                "sim: loading {} evicted {:?}",
                reg.entries[idx].spec.name,
                evicted
            );
        }
        fresh.then(|| reg.entries[idx].spec.name.clone())
    };
    if let Some(name) = loaded {
        ctl.prefix.lock().forget_model(idx);
        ctl.record_load(&name);
    }
    let _ = tx.send(true);
}

struct Queued(Arc<SimControl>);

impl Queued {
    fn new(ctl: &Arc<SimControl>) -> Self {
        ctl.queued_delta(true);
        Queued(ctl.clone())
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.queued_delta(false);
    }
}

struct Seat {
    _permit: OwnedSemaphorePermit,
    ctl: Arc<SimControl>,
    since: Instant,
}

impl Seat {
    fn new(ctl: Arc<SimControl>, permit: OwnedSemaphorePermit) -> Self {
        ctl.in_flight_delta(true);
        Seat {
            _permit: permit,
            ctl,
            since: Instant::now(),
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.ctl.in_flight_delta(false);
        self.ctl.seat_time(self.since.elapsed());
    }
}

/// Counts a request among those decoding (for contention) while it lives.
struct Decoding(Arc<SimControl>);

impl Decoding {
    fn new(ctl: &Arc<SimControl>) -> Self {
        ctl.decoding_delta(true);
        Decoding(ctl.clone())
    }
}

impl Drop for Decoding {
    fn drop(&mut self) {
        self.0.decoding_delta(false);
    }
}

/// A request holding a seat, past its first-token delay.
pub(crate) struct Generation {
    ctl: Arc<SimControl>,
    pub plan: Plan,
    tokens: Vec<String>,
    next: usize,
    seat: Option<Seat>,
    decoding: Option<Decoding>,
    started: Instant,
    load: Duration,
    prompt_eval: Duration,
    cached_tokens: u32,
    first_at: Instant,
    /// When the last token was due; the next is due one (current) token time later.
    due: Instant,
}

/// Time to first token once loaded: `ttft_ms` plus the uncached prompt at the prefill rate
/// (times the model's `speed`), both stretched by the run-time slowdown.
fn prefill_time(ctl: &SimControl, uncached: u32, speed: f64) -> Duration {
    let slow = ctl.slowdown();
    let mut secs = ctl.spec.ttft_ms as f64 / 1000.0;
    if let Some(rate) = ctl.spec.prefill_tokens_per_sec {
        secs += f64::from(uncached) / (rate * speed);
    }
    Duration::from_secs_f64(secs * slow)
}

/// Wait for a seat (FIFO), load the model, prefill what the prefix cache does not hold, wait
/// the first-token gate.
pub(crate) async fn admit(
    ctl: Arc<SimControl>,
    mut plan: Plan,
    started: Instant,
) -> Result<Generation, Killed> {
    let c = ctl.clone();
    let work = async move {
        let queued = Queued::new(&c);
        let permit = c
            .seats_for(plan.idx)
            .acquire_owned()
            .await
            .map_err(|_| Killed)?;
        drop(queued);
        let seat = Seat::new(c.clone(), permit);
        let load = ensure_loaded(&c, plan.idx).await;
        let t = Instant::now();
        let chain = std::mem::take(&mut plan.chain);
        let cached = if chain.is_empty() {
            0
        } else {
            c.prefix.lock().lookup(plan.idx, &chain)
        }
        .min(plan.prompt_tokens);
        let uncached = plan.prompt_tokens - cached;
        // Its turn at the node's prefill compute (FIFO), when that is limited.
        let turn = match &c.prefill {
            Some(p) => Some(p.clone().acquire_owned().await.map_err(|_| Killed)?),
            None => None,
        };
        sleep(prefill_time(&c, uncached, plan.speed)).await;
        drop(turn);
        c.prefix.lock().insert(plan.idx, chain);
        c.record_prefill(cached, uncached);
        c.park(Gate::FirstToken).await?;
        let now = Instant::now();
        Ok(Generation {
            tokens: tokens(plan.seed, plan.out_tokens),
            decoding: Some(Decoding::new(&c)),
            ctl: c,
            plan,
            next: 0,
            seat: Some(seat),
            started,
            load,
            prompt_eval: t.elapsed(),
            cached_tokens: cached,
            first_at: now,
            due: now,
        })
    };
    ctl.until_killed(work).await?
}

impl Generation {
    pub fn control(&self) -> &Arc<SimControl> {
        &self.ctl
    }

    /// Prompt tokens read from the prefix cache.
    pub fn cached_tokens(&self) -> u32 {
        self.cached_tokens
    }

    /// Time of one token now: `tokens_per_sec` times the model's `speed`, slowed by the
    /// requests decoding alongside (`decode_contention`) and by the run-time slowdown.
    fn per_token(&self) -> Duration {
        let others = f64::from(self.ctl.decoding().saturating_sub(1));
        let rate = self.ctl.spec.tokens_per_sec * self.plan.speed
            / (1.0 + self.ctl.spec.decode_contention * others)
            / self.ctl.slowdown();
        Duration::from_secs_f64(1.0 / rate)
    }

    /// The next token; the first is immediate, each later one due one token time after the
    /// previous one was due (so timer lateness does not accumulate).
    pub async fn next_token(&mut self) -> Option<String> {
        let i = self.next;
        let tok = self.tokens.get(i)?.clone();
        if i > 0 {
            self.due += self.per_token();
            sleep_until(self.due).await;
        }
        self.next += 1;
        Some(tok)
    }

    /// After a pause (gate), pace the following tokens from now rather than bursting.
    pub fn rebase(&mut self) {
        self.due = Instant::now();
    }

    /// All remaining tokens as one text (non-streaming); sleeps in steps of ~10 ms of tokens
    /// rather than one timer per token.
    pub async fn rest_text(&mut self) -> String {
        let mut s = String::new();
        if let Some(t) = self.next_token().await {
            s.push_str(&t);
        }
        while self.next < self.tokens.len() {
            let per = self.per_token();
            let batch =
                ((0.010 / per.as_secs_f64()) as usize).clamp(1, self.tokens.len() - self.next);
            self.due += per.mul_f64(batch as f64);
            sleep_until(self.due).await;
            for t in &self.tokens[self.next..self.next + batch] {
                s.push_str(t);
            }
            self.next += batch;
        }
        s
    }

    /// Free the seat, apply keep_alive, and report counts and timings.
    pub fn finish(&mut self) -> Summary {
        self.decoding.take();
        self.seat.take();
        self.ctl
            .models
            .lock()
            .touch(self.plan.idx, self.plan.keep_alive);
        Summary {
            prompt_tokens: self.plan.prompt_tokens,
            cached_tokens: self.cached_tokens,
            completion_tokens: self.plan.out_tokens,
            finish: self.plan.finish,
            total: self.started.elapsed(),
            load: self.load,
            prompt_eval: self.prompt_eval,
            eval: self.first_at.elapsed(),
        }
    }
}
