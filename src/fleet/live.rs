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

#[derive(Debug, Clone, Default)]
pub struct NodeLive {
    pub health: Health,
    /// At least one poll answered.
    pub polled: bool,
    pub consecutive_failures: u32,
    pub last_error: Option<String>,
    pub last_ok_ms: Option<u64>,
    pub models: Vec<LiveModel>,
    pub seats: Option<u32>,
    pub free_memory_gb: Option<f64>,
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
                    return true;
                }
                false
            }
        }
    }
}
