//! A node's effective health from its sources: backend polls, agent heartbeats, admin controls
//! and warmup after a reconnect. Pure: the clock is an argument.

use serde::Serialize;

use crate::routing::Health;

/// Admin controls (`POST /fleet/nodes/{id}/pause|resume|drain`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct AdminControl {
    pub paused: bool,
    pub draining: bool,
    /// Dropped from the config file by a reload (and drained); back in it: resumed.
    pub retired: bool,
}

/// Everything the effective health depends on.
#[derive(Debug, Clone, Copy, Default)]
pub struct HealthInputs {
    /// The backend stopped answering polls (`health.failures_before_offline` in a row).
    pub poll_offline: bool,
    /// Polls answered again after being offline, since (ms).
    pub poll_back_since_ms: Option<u64>,
    /// The agent has heartbeated and its last heartbeat is older than `heartbeat_miss`.
    pub heartbeat_missed: bool,
    /// Heartbeats resumed after a miss, since (ms).
    pub heartbeat_back_since_ms: Option<u64>,
    /// The agent's last heartbeat says draining (SIGTERM).
    pub agent_draining: bool,
    pub admin: AdminControl,
}

/// Offline beats everything (nothing can reach it), then the operator's pause, then draining,
/// then warmup after a reconnect (`warmup_ms` from the latest comeback).
pub fn effective_health(i: &HealthInputs, now_ms: u64, warmup_ms: u64) -> Health {
    if i.poll_offline || i.heartbeat_missed {
        return Health::Offline;
    }
    if i.admin.paused {
        return Health::Paused;
    }
    if i.admin.draining || i.agent_draining {
        return Health::Draining;
    }
    let back = i.poll_back_since_ms.max(i.heartbeat_back_since_ms);
    if back.is_some_and(|t| now_ms < t.saturating_add(warmup_ms)) {
        return Health::Warmup;
    }
    Health::Online
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence_and_warmup_window() {
        let base = HealthInputs::default();
        assert_eq!(effective_health(&base, 0, 90_000), Health::Online);
        let back = HealthInputs {
            poll_back_since_ms: Some(1_000),
            ..base
        };
        assert_eq!(effective_health(&back, 1_000, 90_000), Health::Warmup);
        assert_eq!(effective_health(&back, 90_999, 90_000), Health::Warmup);
        assert_eq!(effective_health(&back, 91_000, 90_000), Health::Online);
        let hb_back = HealthInputs {
            poll_back_since_ms: Some(1_000),
            heartbeat_back_since_ms: Some(50_000),
            ..base
        };
        assert_eq!(
            effective_health(&hb_back, 100_000, 90_000),
            Health::Warmup,
            "the latest comeback counts"
        );
        let all = HealthInputs {
            poll_offline: true,
            agent_draining: true,
            admin: AdminControl {
                paused: true,
                draining: true,
                retired: false,
            },
            poll_back_since_ms: Some(0),
            ..base
        };
        assert_eq!(effective_health(&all, 0, 90_000), Health::Offline);
        let paused = HealthInputs {
            poll_offline: false,
            ..all
        };
        assert_eq!(effective_health(&paused, 0, 90_000), Health::Paused);
        let draining = HealthInputs {
            admin: AdminControl {
                paused: false,
                draining: false,
                retired: false,
            },
            ..paused
        };
        assert_eq!(effective_health(&draining, 0, 90_000), Health::Draining);
        let missed = HealthInputs {
            heartbeat_missed: true,
            ..base
        };
        assert_eq!(effective_health(&missed, 0, 90_000), Health::Offline);
    }
}
