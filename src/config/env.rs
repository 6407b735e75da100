//! `FLEETGATE_*` environment overrides, applied to the file config before validation.

use super::{ConfigError, FileConfig};

/// Apply overrides; `get` reads a variable (injected so tests need not touch the process env).
pub fn apply_env(
    f: &mut FileConfig,
    get: impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let mut errors = Vec::new();
    if let Some(v) = get("FLEETGATE_LISTEN") {
        f.server.listen = v;
    }
    if let Some(v) = get("FLEETGATE_ADMIN_LISTEN") {
        f.server.admin_listen = v;
    }
    if let Some(v) = get("FLEETGATE_ADMIN_TOKEN") {
        f.server.admin_token = Some(v);
    }
    number(
        &get,
        "FLEETGATE_THREADS",
        &mut f.server.threads,
        &mut errors,
    );
    number(
        &get,
        "FLEETGATE_MAX_BODY_BYTES",
        &mut f.limits.max_body_bytes,
        &mut errors,
    );
    number(
        &get,
        "FLEETGATE_POLL_INTERVAL_MS",
        &mut f.health.poll_interval_ms,
        &mut errors,
    );
    number(
        &get,
        "FLEETGATE_RETRIES",
        &mut f.routing.retries,
        &mut errors,
    );
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigError(errors))
    }
}

fn number<T: std::str::FromStr>(
    get: &impl Fn(&str) -> Option<String>,
    var: &str,
    slot: &mut T,
    errors: &mut Vec<String>,
) {
    if let Some(v) = get(var) {
        match v.trim().parse() {
            Ok(n) => *slot = n,
            Err(_) => errors.push(format!(
                "env `{var}`: value {v:?}: expected a non-negative integer"
            )),
        }
    }
}
