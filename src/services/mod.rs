//! Background services: node health/state polling, the fleet clock (time-driven state),
//! capacity-learner persistence.

pub mod clock;
pub mod health;
pub mod learning;

/// Milliseconds since the Unix epoch: the clock every `*_ms` timestamp in fleet state uses.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
