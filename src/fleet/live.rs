//! What the last polls of a node's backend reported, and how a new poll changes it.

use crate::routing::Health;

/// One model as the backend reported it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiveModel {
    pub name: String,
    pub size_gb: f64,
    pub resident_gb: Option<f64>,
    pub context: Option<u32>,
    pub loaded: bool,
    pub on_disk: bool,
    pub unloaded_at_ms: Option<u64>,
    /// Requests the backend says it is running / has waiting for this model (vLLM, llama.cpp).
    pub running: Option<u32>,
    pub waiting: Option<u32>,
}

/// The outcome of one poll of a node.
#[derive(Debug, Clone)]
pub enum PollReport {
    Ok {
        models: Vec<LiveModel>,
        seats: Option<u32>,
        now_ms: u64,
    },
    Failed {
        error: String,
    },
}

/// Whether a server behind `backend: openai` was asked how many requests it runs at once.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum SeatsAsked {
    /// Not yet; again once the node was offline or its config replaced (it may be another
    /// server now).
    #[default]
    Unasked,
    /// A poll is asking; the others meanwhile take what the node reported last.
    Asking,
    /// Asked this many times without an answer (no connection, a timeout, a 5xx); asked again
    /// at the next poll, up to `MAX_SEATS_ASKS`.
    Failed(u8),
    /// It answered: the seats it said, or none (no such endpoint, no count in it).
    Answered(Option<u32>),
}

/// Asks of a server's seats that may go unanswered before the gateway stops asking.
pub const MAX_SEATS_ASKS: u8 = 3;

#[derive(Debug, Clone, Default)]
pub struct NodeLive {
    /// Wire protocols learned by probing (nodes without `protocols:`), once answered.
    pub probed_families: Option<Vec<crate::routing::Family>>,
    /// `backend: openai`: whether the server was asked for its seats, and what it said
    /// (`services::health::probe::seats`).
    pub seats_asked: SeatsAsked,
    pub health: Health,
    /// At least one poll answered.
    pub polled: bool,
    pub consecutive_failures: u32,
    pub last_error: Option<String>,
    pub last_ok_ms: Option<u64>,
    /// When polls answered again after the node was offline (starts warmup).
    pub back_since_ms: Option<u64>,
    pub models: Vec<LiveModel>,
    pub seats: Option<u32>,
    pub free_memory_gb: Option<f64>,
    /// Tries of a first measurement per model (`services::measure`); `MAX_TRIES`: done
    /// (answered, or a refusal that asking again would not change).
    pub measured: std::collections::BTreeMap<String, u32>,
    /// A first-measurement pass over the node is under way.
    pub measuring: bool,
    /// A first-measurement pass over the node, online, has ended at least once with every
    /// model it had to measure tried (nothing to measure counts): what a bench waits for
    /// before its trace.
    pub measure_passed: bool,
}

/// What an operator wants to hear about when it changes: health and which models are loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    polled: bool,
    health: Health,
    last_error: Option<String>,
    loaded: Vec<String>,
}

impl Seen {
    pub fn of(l: &NodeLive) -> Seen {
        Seen {
            polled: l.polled,
            health: l.health,
            last_error: l.last_error.clone(),
            loaded: l
                .models
                .iter()
                .filter(|m| m.loaded)
                .map(|m| m.name.clone())
                .collect(),
        }
    }

    /// Log lines for what changed from `self` to `now` (first poll: not a change of models).
    pub fn changes(&self, now: &Seen) -> Vec<String> {
        let mut out = Vec::new();
        if self.health != now.health {
            let why = match (&now.last_error, now.health) {
                (Some(e), Health::Offline) => format!(": {e}"),
                _ => String::new(),
            };
            out.push(format!(
                "poll health {:?} -> {:?}{why}",
                self.health, now.health
            ));
        }
        if self.polled {
            for m in now.loaded.iter().filter(|m| !self.loaded.contains(m)) {
                out.push(format!("model {m} loaded (hot)"));
            }
            for m in self.loaded.iter().filter(|m| !now.loaded.contains(m)) {
                out.push(format!(
                    "model {m} no longer loaded (unloaded or asleep: cold)"
                ));
            }
        }
        out
    }
}

impl NodeLive {
    /// Apply a poll; true when routing-relevant state changed.
    pub fn apply(&mut self, report: PollReport, failures_before_offline: u32) -> bool {
        match report {
            PollReport::Ok {
                mut models,
                seats,
                now_ms,
            } => {
                // A model that was loaded and no longer is: remember when (page-cache warmth).
                for m in &mut models {
                    let before = self.models.iter().find(|o| o.name == m.name);
                    m.unloaded_at_ms = match before {
                        Some(o) if o.loaded && !m.loaded => Some(now_ms),
                        Some(o) if !m.loaded => o.unloaded_at_ms,
                        _ => None,
                    };
                }
                // A comeback (not a first answer: a node that was never up is not reconnecting).
                if self.health == Health::Offline && self.polled {
                    self.back_since_ms = Some(now_ms);
                }
                let changed = self.health != Health::Online
                    || !self.polled
                    || self.models != models
                    || self.seats != seats;
                self.health = Health::Online;
                self.polled = true;
                self.consecutive_failures = 0;
                self.last_error = None;
                self.last_ok_ms = Some(now_ms);
                self.models = models;
                self.seats = seats;
                changed
            }
            PollReport::Failed { error } => {
                self.consecutive_failures += 1;
                self.last_error = Some(error);
                if self.consecutive_failures >= failures_before_offline
                    && self.health != Health::Offline
                {
                    self.health = Health::Offline;
                    // What answers when it comes back may be another server.
                    self.seats_asked = SeatsAsked::Unasked;
                    return true;
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(now_ms: u64, loaded: bool) -> PollReport {
        PollReport::Ok {
            models: vec![LiveModel {
                name: "m".into(),
                loaded,
                on_disk: true,
                ..LiveModel::default()
            }],
            seats: None,
            now_ms,
        }
    }

    fn failed() -> PollReport {
        PollReport::Failed {
            error: "refused".into(),
        }
    }

    #[test]
    fn changes_name_health_and_models() {
        let mut l = NodeLive::default();
        l.apply(ok(0, true), 1);
        let up = Seen::of(&l);
        l.apply(ok(1, false), 1);
        let asleep = Seen::of(&l);
        assert_eq!(
            up.changes(&asleep),
            vec!["model m no longer loaded (unloaded or asleep: cold)".to_string()]
        );
        l.apply(failed(), 1);
        let down = Seen::of(&l);
        assert_eq!(
            asleep.changes(&down),
            vec!["poll health Online -> Offline: refused".to_string()]
        );
        assert!(down.changes(&down).is_empty());
    }

    #[test]
    fn offline_after_n_failures_and_back_since_on_return() {
        let mut l = NodeLive::default();
        assert!(l.apply(ok(0, true), 2));
        assert_eq!(l.back_since_ms, None, "first answer is not a comeback");
        assert!(!l.apply(failed(), 2));
        assert_eq!(l.health, Health::Online);
        assert!(l.apply(failed(), 2));
        assert_eq!(l.health, Health::Offline);
        assert!(l.apply(ok(5_000, true), 2));
        assert_eq!(l.health, Health::Online);
        assert_eq!(l.back_since_ms, Some(5_000));
    }

    #[test]
    fn first_answer_after_failing_from_the_start_is_no_comeback() {
        let mut l = NodeLive::default();
        l.apply(failed(), 1);
        assert_eq!(l.health, Health::Offline);
        l.apply(ok(7, true), 1);
        assert_eq!((l.health, l.back_since_ms), (Health::Online, None));
    }

    #[test]
    fn unload_is_remembered() {
        let mut l = NodeLive::default();
        l.apply(ok(0, true), 2);
        assert!(l.apply(ok(1_000, false), 2));
        assert_eq!(l.models[0].unloaded_at_ms, Some(1_000));
        l.apply(ok(2_000, false), 2);
        assert_eq!(
            l.models[0].unloaded_at_ms,
            Some(1_000),
            "kept, not refreshed"
        );
        l.apply(ok(3_000, true), 2);
        assert_eq!(l.models[0].unloaded_at_ms, None);
    }
}
