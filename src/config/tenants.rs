//! `auth:` (API keys -> tenants) and `tenants:` (weights and limits): the YAML types and their
//! validation into [`Tenancy`], which the proxy uses. Keys are kept only as SHA-256 digests.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The tenant every request belongs to when auth is off.
pub const DEFAULT_TENANT: &str = "default";

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AuthFile {
    /// Keys written in the file or read from environment variables.
    pub keys: Vec<KeyFile>,
    /// A file of `tenant key` lines (`#` comments), re-read on every config reload.
    pub key_file: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyFile {
    pub tenant: String,
    /// The key itself ...
    pub key: Option<String>,
    /// ... or the name of the environment variable that holds it.
    pub key_env: Option<String>,
}

/// Weight and limits of one tenant; every limit is off when absent.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TenantFile {
    /// Share of the seats when requests wait (weighted fair order), relative to other tenants.
    pub weight: f64,
    /// Requests at once (running or waiting); past it: 429.
    pub max_in_flight: Option<u32>,
    /// Requests waiting for a seat at once; past it: 429.
    pub max_queued: Option<u32>,
    pub requests_per_min: Option<u32>,
    /// Estimated prompt + output tokens per minute.
    pub tokens_per_min: Option<u64>,
}

impl Default for TenantFile {
    fn default() -> Self {
        TenantFile {
            weight: 1.0,
            max_in_flight: None,
            max_queued: None,
            requests_per_min: None,
            tokens_per_min: None,
        }
    }
}

/// Validated tenancy: who a key is, and each tenant's weight and limits.
#[derive(Debug, Clone, Default)]
pub struct Tenancy {
    /// SHA-256 of each key -> tenant. Empty: auth is off.
    pub keys: HashMap<[u8; 32], String>,
    /// Every tenant named in `tenants:` or by a key (limits default to none).
    pub tenants: BTreeMap<String, TenantFile>,
}

impl Tenancy {
    pub fn auth_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The tenant a presented key belongs to. The lookup is by digest, so its time does not
    /// depend on how much of the key matches; the digests are compared in constant time.
    pub fn tenant_of(&self, key: &str) -> Option<&str> {
        let d = digest(key);
        let (stored, tenant) = self.keys.get_key_value(&d)?;
        constant_time_eq(stored, &d).then_some(tenant.as_str())
    }

    pub fn limits(&self, tenant: &str) -> TenantFile {
        self.tenants.get(tenant).cloned().unwrap_or_default()
    }
}

pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Check `auth:` and `tenants:`, reading env vars and the key file through `env` / `read`.
pub fn validate(
    errors: &mut Vec<String>,
    auth: AuthFile,
    tenants: BTreeMap<String, TenantFile>,
    env: impl Fn(&str) -> Option<String>,
    read: impl Fn(&str) -> std::io::Result<String>,
) -> Tenancy {
    let mut out = Tenancy::default();
    for (name, t) in &tenants {
        if !valid_name(name) {
            errors.push(format!(
                "field `tenants.{name}`: expected a tenant id of letters, digits, '-', '_' or '.' (1-64 chars)"
            ));
        }
        if !(t.weight.is_finite() && t.weight > 0.0) {
            errors.push(format!(
                "field `tenants.{name}.weight`: value {}: expected a positive number",
                t.weight
            ));
        }
        for (field, v) in [
            ("max_in_flight", t.max_in_flight.map(u64::from)),
            ("max_queued", t.max_queued.map(u64::from)),
            ("requests_per_min", t.requests_per_min.map(u64::from)),
            ("tokens_per_min", t.tokens_per_min),
        ] {
            if v == Some(0) {
                errors.push(format!(
                    "field `tenants.{name}.{field}`: value 0: expected at least 1 (or no limit)"
                ));
            }
        }
    }
    out.tenants = tenants;
    let mut add = |errors: &mut Vec<String>, field: String, tenant: &str, key: &str| {
        if key.len() < 8 {
            errors.push(format!(
                "field `{field}`: a key of {} characters: expected at least 8",
                key.len()
            ));
            return;
        }
        if !valid_name(tenant) {
            errors.push(format!(
                "field `{field}`: tenant {tenant:?}: expected letters, digits, '-', '_' or '.' (1-64 chars)"
            ));
            return;
        }
        if out.keys.insert(digest(key), tenant.to_string()).is_some() {
            errors.push(format!("field `{field}`: the same key is listed twice"));
        }
        out.tenants.entry(tenant.to_string()).or_default();
    };
    for (i, k) in auth.keys.iter().enumerate() {
        let field = format!("auth.keys[{i}]");
        let key = match (&k.key, &k.key_env) {
            (Some(key), None) => Some(key.clone()),
            (None, Some(var)) => match env(var) {
                Some(v) if !v.trim().is_empty() => Some(v.trim().to_string()),
                _ => {
                    errors.push(format!(
                        "field `{field}.key_env`: value {var:?}: the environment variable is not set"
                    ));
                    None
                }
            },
            _ => {
                errors.push(format!(
                    "field `{field}`: expected exactly one of `key` or `key_env`"
                ));
                None
            }
        };
        if let Some(key) = key {
            add(errors, field, &k.tenant, &key);
        }
    }
    if let Some(path) = &auth.key_file {
        match read(path) {
            Err(e) => errors.push(format!(
                "field `auth.key_file`: value {path:?}: cannot read: {e}"
            )),
            Ok(text) => {
                for (n, line) in text.lines().enumerate() {
                    let line = line.trim();
                    if line.is_empty() || line.starts_with('#') {
                        continue;
                    }
                    let field = format!("auth.key_file line {}", n + 1);
                    match line.split_once(char::is_whitespace) {
                        Some((tenant, key)) => add(errors, field, tenant, key.trim()),
                        None => errors.push(format!(
                            "field `{field}`: expected `tenant key` (the key is not shown)"
                        )),
                    }
                }
            }
        }
    }
    out
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(yaml: &str, env: &[(&str, &str)], file: &str) -> (Tenancy, Vec<String>) {
        #[derive(Deserialize)]
        struct Both {
            #[serde(default)]
            auth: AuthFile,
            #[serde(default)]
            tenants: BTreeMap<String, TenantFile>,
        }
        let b: Both = serde_yaml::from_str(yaml).expect("yaml");
        let mut errors = Vec::new();
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let file = file.to_string();
        let t = validate(
            &mut errors,
            b.auth,
            b.tenants,
            |k| env.get(k).cloned(),
            |_| Ok(file.clone()),
        );
        (t, errors)
    }

    #[test]
    fn keys_from_file_env_and_key_file_map_to_tenants() {
        let (t, errors) = run(
            "auth:\n  keys:\n    - { key: sk-alpha-123, tenant: team-a }\n    - { key_env: KEY_B, tenant: team-b }\n  key_file: keys.txt\ntenants:\n  team-a: { weight: 2, max_in_flight: 4 }\n",
            &[("KEY_B", "sk-bravo-456")],
            "# comment\nteam-c sk-charlie-789\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert!(t.auth_enabled());
        assert_eq!(t.tenant_of("sk-alpha-123"), Some("team-a"));
        assert_eq!(t.tenant_of("sk-bravo-456"), Some("team-b"));
        assert_eq!(t.tenant_of("sk-charlie-789"), Some("team-c"));
        assert_eq!(t.tenant_of("sk-alpha-12"), None);
        assert_eq!(t.limits("team-a").weight, 2.0);
        assert_eq!(t.limits("team-a").max_in_flight, Some(4));
        assert_eq!(t.limits("team-c"), TenantFile::default());
    }

    #[test]
    fn bad_entries_name_the_field_and_never_the_key() {
        let (_, errors) = run(
            "auth:\n  keys:\n    - { key: short, tenant: a }\n    - { key_env: MISSING, tenant: b }\n    - { tenant: c }\n  key_file: k\ntenants:\n  x: { weight: 0, tokens_per_min: 0 }\n",
            &[],
            "lonelysecretvalue\n",
        );
        let all = errors.join("\n");
        assert!(all.contains("auth.keys[0]"), "{all}");
        assert!(all.contains("auth.keys[1].key_env"), "{all}");
        assert!(all.contains("auth.keys[2]"), "{all}");
        assert!(all.contains("auth.key_file line 1"), "{all}");
        assert!(all.contains("tenants.x.weight"), "{all}");
        assert!(all.contains("tenants.x.tokens_per_min"), "{all}");
        assert!(
            !all.contains("short") && !all.contains("lonelysecretvalue"),
            "{all}"
        );
    }
}
