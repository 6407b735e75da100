//! SIGHUP reloads the config file (Pingora leaves SIGHUP alone; without this it would end the
//! process). Same effect as `POST /fleet/reload`.

use std::sync::Arc;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::fleet::{Fleet, ReloadReport};

/// Reload the config file, then poll the nodes it added or changed so routing knows what they
/// have before the next request.
pub async fn reload(fleet: &Arc<Fleet>) -> Result<ReloadReport, Vec<String>> {
    let report = fleet.reload_from_file()?;
    let touched = report.added.iter().chain(&report.changed);
    let polls = touched
        .filter_map(|id| fleet.index_of(id))
        .map(|idx| super::node_api::refresh(fleet, idx));
    futures::future::join_all(polls).await;
    Ok(report)
}

pub struct ReloadOnHangup {
    fleet: Arc<Fleet>,
}

impl ReloadOnHangup {
    pub fn new(fleet: Arc<Fleet>) -> ReloadOnHangup {
        ReloadOnHangup { fleet }
    }
}

#[async_trait]
impl BackgroundService for ReloadOnHangup {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(s) => s,
            Err(e) => {
                log::warn!("SIGHUP reload unavailable: {e}");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = hangup.recv() => {
                    if let Err(errors) = reload(&self.fleet).await {
                        log::warn!("SIGHUP: config not reloaded: {}", errors.join("; "));
                    }
                }
            }
        }
    }
}
