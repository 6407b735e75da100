//! Background services: node health/state polling, the fleet clock (time-driven state),
//! capacity-learner persistence, pre-warm, rebalance, auto-pull, start-up settling.

pub mod autopull;
pub mod clock;
pub mod health;
pub mod learning;
pub mod node_api;
pub mod ops;
pub mod prewarm;
pub mod rebalance;
pub mod reload;
pub mod settle;
pub mod shutdown;

/// Milliseconds since the Unix epoch: the clock every `*_ms` timestamp in fleet state uses.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Routing's ranking for `model` with node `idx` left out: the runner-up to a busy node (the
/// pre-warm target, the rebalance destinations).
pub fn decide_elsewhere(
    fleet: &crate::fleet::Fleet,
    view: &crate::routing::FleetView,
    idx: usize,
    model: &str,
) -> crate::routing::Decision {
    let req = crate::routing::RouteRequest {
        models: vec![model.to_string()],
        tried: vec![view.nodes[idx].id.clone()],
        ..Default::default()
    };
    crate::routing::decide(&req, view, &fleet.config().routing.policy, fleet, now_ms())
}
