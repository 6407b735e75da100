//! Agent heartbeats: the wire format `fleetgate agent` sends, and what the gateway keeps of the
//! last one (pure: the clock is an argument).

use serde::{Deserialize, Serialize};

use crate::config::Backend;
use crate::routing::Pressure;

/// One heartbeat, `POST /fleet/nodes/heartbeat` with `Authorization: Bearer <token>`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    pub node_id: String,
    /// The node's backend as the gateway should reach it (used when the node registers).
    pub backend_url: String,
    #[serde(default = "default_backend")]
    pub backend: Backend,
    pub free_memory_gb: Option<f64>,
    pub total_memory_gb: Option<f64>,
    #[serde(default)]
    pub pressure: Pressure,
    /// CPU utilisation of the whole machine, 0..=100.
    pub cpu_percent: Option<f64>,
    #[serde(default)]
    pub thermal_throttled: bool,
    pub bandwidth_gbps: Option<f64>,
    /// No new requests; in-flight ones finish (sent on SIGTERM).
    #[serde(default)]
    pub draining: bool,
    /// What the local backend answered the agent.
    #[serde(default)]
    pub backend_report: Option<BackendReport>,
}

fn default_backend() -> Backend {
    Backend::Ollama
}

/// The local backend, as the agent sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct BackendReport {
    pub reachable: bool,
    #[serde(default)]
    pub loaded_models: Vec<String>,
    #[serde(default)]
    pub error: Option<String>,
}

/// What the gateway keeps of a node's agent.
#[derive(Debug, Clone, Default)]
pub struct AgentState {
    pub last: Option<Heartbeat>,
    pub last_ms: Option<u64>,
    /// When heartbeats resumed after a miss (starts warmup).
    pub back_since_ms: Option<u64>,
    pub received: u64,
}

impl AgentState {
    /// True when the agent has been heard from and its last heartbeat is older than `miss_ms`.
    pub fn missed(&self, now_ms: u64, miss_ms: u64) -> bool {
        self.last_ms
            .is_some_and(|t| now_ms.saturating_sub(t) > miss_ms)
    }

    /// Take a heartbeat in. A heartbeat after a miss is a reconnect: warmup starts now.
    pub fn apply(&mut self, hb: Heartbeat, now_ms: u64, miss_ms: u64) {
        if self.missed(now_ms, miss_ms) {
            self.back_since_ms = Some(now_ms);
        }
        self.last = Some(hb);
        self.last_ms = Some(now_ms);
        self.received += 1;
    }

    /// The last heartbeat while it is fresh (facts older than the miss window are not used).
    pub fn fresh(&self, now_ms: u64, miss_ms: u64) -> Option<&Heartbeat> {
        if self.missed(now_ms, miss_ms) {
            None
        } else {
            self.last.as_ref()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn hb(id: &str) -> Heartbeat {
        Heartbeat {
            node_id: id.into(),
            backend_url: "http://127.0.0.1:1".into(),
            backend: Backend::Ollama,
            free_memory_gb: Some(10.0),
            total_memory_gb: Some(16.0),
            pressure: Pressure::Normal,
            cpu_percent: Some(5.0),
            thermal_throttled: false,
            bandwidth_gbps: None,
            draining: false,
            backend_report: None,
        }
    }

    #[test]
    fn miss_and_reconnect() {
        let mut a = AgentState::default();
        assert!(!a.missed(1_000_000, 90_000), "never heard: not missed");
        a.apply(hb("n"), 0, 90_000);
        assert_eq!(a.back_since_ms, None, "first contact is not a reconnect");
        assert!(!a.missed(90_000, 90_000));
        assert!(a.missed(90_001, 90_000));
        assert!(a.fresh(90_001, 90_000).is_none());
        a.apply(hb("n"), 100_000, 90_000);
        assert_eq!(a.back_since_ms, Some(100_000));
        assert!(a.fresh(100_000, 90_000).is_some());
        assert_eq!(a.received, 2);
    }

    #[test]
    fn wire_format_round_trips_and_rejects_unknown_fields() {
        let h = hb("n");
        let text = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<Heartbeat>(&text).unwrap(), h);
        let min: Heartbeat =
            serde_json::from_str(r#"{"node_id":"x","backend_url":"http://1.2.3.4:5"}"#).unwrap();
        assert_eq!(min.pressure, Pressure::Normal);
        assert!(serde_json::from_str::<Heartbeat>(
            r#"{"node_id":"x","backend_url":"http://1.2.3.4:5","bogus":1}"#
        )
        .is_err());
    }
}
