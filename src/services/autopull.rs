//! Auto-pull (opt-in, `queue.auto_pull`): a model no node has is pulled, once, onto the
//! manageable node with the most free memory, while its request waits in the holding queue.

use std::sync::Arc;

use super::node_api;
use crate::fleet::Fleet;
use crate::metrics::METRICS;
use crate::routing::Health;

/// Called when routing finds no node with `model`. True while a pull for it is running (the
/// request should wait); false when auto-pull is off, was already tried, or has no target.
pub fn request(fleet: &Arc<Fleet>, model: &str) -> bool {
    if !fleet.config().queue.auto_pull {
        return false;
    }
    let key = format!("pull:{model}");
    if fleet.ops.is_running(&key) {
        return true;
    }
    if fleet.ops.was_done(&key) {
        return false;
    }
    let Some(idx) = target(fleet) else {
        return false;
    };
    if !fleet.ops.start(&key) {
        return true;
    }
    let (fleet, model) = (fleet.clone(), model.to_string());
    tokio::spawn(async move {
        let node = fleet.node_config(idx).id.clone();
        let outcome = match node_api::pull(&fleet, idx, &model).await {
            Ok(()) => {
                node_api::refresh(&fleet, idx).await;
                "ok"
            }
            Err(e) => {
                log::warn!("auto-pull {model} on {node}: {e}");
                "failed"
            }
        };
        log::info!("auto-pull {model} on {node}: {outcome}");
        METRICS.pulls.with_label_values(&[&node, outcome]).inc();
        fleet.ops.finish(&key, true);
        fleet.changed.notify_waiters();
    });
    true
}

/// The online Ollama-API node with the most free memory.
fn target(fleet: &Fleet) -> Option<usize> {
    let view = fleet.view();
    view.nodes
        .iter()
        .enumerate()
        .filter(|(i, n)| n.health == Health::Online && node_api::can_manage(fleet, *i))
        .map(|(i, n)| {
            let held: f64 = n
                .models
                .iter()
                .filter(|m| m.loaded)
                .map(|m| m.resident_gb.unwrap_or(m.size_gb))
                .sum();
            (i, n.free_memory_gb.unwrap_or(n.memory_gb - held))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(i, _)| i)
}
