//! Config reload (SIGHUP or `POST /fleet/reload`): swap in a new validated config without
//! dropping a request. Nodes keep their index and live state; changed nodes take their new
//! settings, new nodes join, nodes gone from the file are drained (in-flight requests finish).

use std::sync::Arc;

use serde::Serialize;

use super::state::Control;
use super::Fleet;
use crate::config::Config;
use crate::metrics::METRICS;

/// What a reload changed.
#[derive(Debug, Default, Serialize)]
pub struct ReloadReport {
    pub changed: Vec<String>,
    pub added: Vec<String>,
    /// In the old file, not in the new one: drained.
    pub drained: Vec<String>,
    /// Settings that only take effect after a restart (listeners, threads).
    pub restart_needed: Vec<&'static str>,
}

impl Fleet {
    /// Apply `new` (already validated). Always succeeds; counted in
    /// `fleetgate_config_reloads_total{result="ok"}`.
    pub fn reload(&self, new: Config) -> ReloadReport {
        let old = self.config();
        let mut report = ReloadReport::default();
        // Against what is running, not the last file: a change reverted needs no restart.
        let running = self.started_config();
        for (field, differs) in [
            ("server.listen", running.listen != new.listen),
            (
                "server.admin_listen",
                running.admin_listen != new.admin_listen,
            ),
            ("server.threads", running.threads != new.threads),
            (
                "server.work_stealing",
                running.work_stealing != new.work_stealing,
            ),
        ] {
            if differs {
                report.restart_needed.push(field);
            }
        }
        for n in &new.nodes {
            match self.index_of(&n.id) {
                Some(idx) => {
                    if format!("{:?}", self.node_config(idx)) != format!("{n:?}") {
                        self.replace_node_config(idx, n.clone());
                        report.changed.push(n.id.clone());
                    }
                    // A node back in the file after being dropped from it serves again.
                    if old.node(&n.id).is_none() || self.node(idx).control.lock().retired {
                        self.node(idx).control.lock().retired = false;
                        self.control(idx, Control::Resume);
                    }
                }
                None => {
                    crate::metrics::register_nodes([n.id.as_str()]);
                    self.register(n.clone());
                    report.added.push(n.id.clone());
                }
            }
        }
        for n in &old.nodes {
            if new.node(&n.id).is_none() {
                if let Some(idx) = self.index_of(&n.id) {
                    self.node(idx).control.lock().retired = true;
                    self.control(idx, Control::Drain);
                    report.drained.push(n.id.clone());
                }
            }
        }
        self.store_config(Arc::new(new));
        METRICS.config_reloads.with_label_values(&["ok"]).inc();
        log::info!(
            "config reloaded: {} changed, {} added, {} drained{}",
            report.changed.len(),
            report.added.len(),
            report.drained.len(),
            if report.restart_needed.is_empty() {
                String::new()
            } else {
                format!("; restart needed for {:?}", report.restart_needed)
            }
        );
        report
    }

    /// Re-read the config file this fleet was started from and apply it. A file that does not
    /// validate changes nothing; its errors are returned (and counted as `result="error"`).
    pub fn reload_from_file(&self) -> Result<ReloadReport, Vec<String>> {
        let Some(path) = self.config_path() else {
            return Err(vec!["the gateway was not started from a config file".into()]);
        };
        match Config::load(&path) {
            Ok(c) => Ok(self.reload(c)),
            Err(e) => {
                METRICS.config_reloads.with_label_values(&["error"]).inc();
                log::warn!(
                    "config reload from {} refused: {}",
                    path.display(),
                    e.0.join("; ")
                );
                Err(e.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(listen: &str) -> Config {
        let yaml = format!(
            "server:\n  listen: {listen}\nfleet:\n  nodes:\n    - {{id: a, url: 'http://127.0.0.1:1', backend: ollama}}\n"
        );
        Config::from_yaml(&yaml).expect("valid")
    }

    #[test]
    fn a_reverted_listen_change_needs_no_restart() {
        let fleet = Fleet::new(Arc::new(config("127.0.0.1:8080")));
        let changed = fleet.reload(config("127.0.0.1:8081"));
        assert_eq!(changed.restart_needed, vec!["server.listen"]);
        let again = fleet.reload(config("127.0.0.1:8081"));
        assert_eq!(
            again.restart_needed,
            vec!["server.listen"],
            "still not applied"
        );
        let reverted = fleet.reload(config("127.0.0.1:8080"));
        assert!(reverted.restart_needed.is_empty(), "{reverted:?}");
    }
}
