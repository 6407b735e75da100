//! The seeded trace of a run: Poisson arrivals of the mix, bursts, and conversation scripts;
//! and the request bodies (text sized so the sim and the gateway count the intended tokens).

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::scenario::{Class, Scenario};

/// One single-shot request.
#[derive(Debug, Clone)]
pub struct Shot {
    pub at: Duration,
    pub model: String,
    /// The user message's tokens (the system prompt's apart).
    pub prompt_tokens: u32,
    pub output: u32,
    /// The shared system prompt drawn (its index in the class and its tokens).
    pub system: Option<(u32, u32)>,
    /// The shared part is sent as tools, not as a system message.
    pub as_tools: bool,
}

/// One conversation: when it starts, its turns' sizes and pauses.
#[derive(Debug, Clone)]
pub struct Chat {
    pub start: Duration,
    pub model: String,
    pub system_tokens: u32,
    pub turns: Vec<(u32, u32, Duration)>, // (user tokens, output, think after)
}

#[derive(Debug, Clone)]
pub struct Trace {
    pub shots: Vec<Shot>,
    pub chats: Vec<Chat>,
}

fn draw_class<'a>(rng: &mut SmallRng, mix: &'a [Class]) -> &'a Class {
    let total: f64 = mix.iter().map(|c| c.weight).sum();
    let mut x = rng.gen::<f64>() * total;
    for c in mix {
        if x < c.weight {
            return c;
        }
        x -= c.weight;
    }
    &mix[mix.len() - 1]
}

/// Log-uniform in [lo, hi]: heavy-tailed like real prompt lengths.
fn log_uniform(rng: &mut SmallRng, [lo, hi]: [u32; 2]) -> u32 {
    let (lo, hi) = (f64::from(lo.max(1)), f64::from(hi.max(lo.max(1))));
    (lo.ln() + rng.gen::<f64>() * (hi.ln() - lo.ln()))
        .exp()
        .round() as u32
}

fn uniform(rng: &mut SmallRng, [lo, hi]: [u32; 2]) -> u32 {
    rng.gen_range(lo..=hi.max(lo))
}

fn shot(rng: &mut SmallRng, at: Duration, c: &Class) -> Shot {
    Shot {
        at,
        model: c.model.clone(),
        prompt_tokens: log_uniform(rng, c.prompt),
        output: uniform(rng, c.output),
        // Drawn last, and only for a class that has one: other scenarios' traces stay as
        // they were.
        system: c
            .system
            .map(|sys| (rng.gen_range(0..sys.prompts.max(1)), sys.tokens)),
        as_tools: c.system.is_some_and(|sys| sys.as_tools),
    }
}

pub fn trace(s: &Scenario, seed: u64) -> Trace {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut shots = Vec::new();
    if s.rate_per_s > 0.0 {
        let mut t = 0.0f64;
        loop {
            t += -(1.0 - rng.gen::<f64>()).ln() / s.rate_per_s;
            if t >= s.duration_s {
                break;
            }
            let c = draw_class(&mut rng, &s.mix);
            shots.push(shot(&mut rng, Duration::from_secs_f64(t), c));
        }
    }
    for b in &s.bursts {
        for _ in 0..b.count {
            shots.push(shot(&mut rng, Duration::from_secs_f64(b.at_s), &b.class));
        }
    }
    shots.sort_by_key(|x| x.at);
    let chats = s
        .conversations
        .iter()
        .flat_map(|c| {
            (0..c.count)
                .map(|_| Chat {
                    start: Duration::from_secs_f64(rng.gen::<f64>() * c.start_within_s),
                    model: c.model.clone(),
                    system_tokens: c.system,
                    turns: (0..c.turns)
                        .map(|_| {
                            let think =
                                rng.gen_range(c.think_ms[0]..=c.think_ms[1].max(c.think_ms[0]));
                            (
                                uniform(&mut rng, c.turn),
                                uniform(&mut rng, c.output),
                                Duration::from_millis(think),
                            )
                        })
                        .collect(),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    Trace { shots, chats }
}

/// Text the sim counts as `tokens` (4 chars a token) in a message, starting with `tag` so no
/// two requests share a prefix by accident. A chat message costs 4 tokens more.
pub fn text(tag: &str, tokens: u32) -> String {
    const FILL: &str = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do ";
    let want = tokens as usize * 4;
    let mut s = format!("[{tag}] ");
    while s.len() < want {
        s.push_str(FILL);
    }
    s.truncate(want.max(tag.len() + 3));
    s
}
