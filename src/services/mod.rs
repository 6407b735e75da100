//! Background services: node health/state polling (more land with later stages).

pub mod autopull;
pub mod health;
pub mod node_api;
pub mod ops;
pub mod prewarm;
pub mod rebalance;

/// Milliseconds since the Unix epoch: the clock every `*_ms` timestamp in fleet state uses.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
