//! `clients:` — what one client connection may hold: connections, time for the request head
//! and body, and bytes of request bodies buffered across all requests at once.

use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientsFile {
    /// Concurrent client connections on `server.listen`; past it a new connection gets a
    /// 503 (`Retry-After`) and is closed. Lowered at start to fit the open-files limit.
    pub max_connections: usize,
    /// The whole request head (request line + headers) must arrive within this, counted from
    /// the connection's accept or the head's first byte; else 408 and the connection closes.
    pub head_timeout_ms: u64,
    /// The whole request body must arrive within this once the head is in; else 408.
    pub body_timeout_ms: u64,
    /// Bytes of request bodies buffered at once across all requests; a body that would pass
    /// it gets 503 with `Retry-After` (at least `limits.max_body_bytes`).
    pub max_buffered_body_bytes: usize,
}

impl Default for ClientsFile {
    fn default() -> Self {
        ClientsFile {
            max_connections: 4096,
            head_timeout_ms: 10_000,
            body_timeout_ms: 60_000,
            max_buffered_body_bytes: 256 * 1024 * 1024,
        }
    }
}

/// The validated `clients:` section.
#[derive(Debug, Clone)]
pub struct Clients {
    pub max_connections: usize,
    pub head_timeout: Duration,
    pub body_timeout: Duration,
    pub max_buffered_body_bytes: usize,
}

impl ClientsFile {
    /// Check the section against the body limit; problems are appended to `errors`.
    pub fn validate(&self, max_body_bytes: usize, errors: &mut Vec<String>) -> Clients {
        if self.max_connections == 0 {
            errors.push("field `clients.max_connections`: value 0: expected at least 1".into());
        }
        for (field, v) in [
            ("clients.head_timeout_ms", self.head_timeout_ms),
            ("clients.body_timeout_ms", self.body_timeout_ms),
        ] {
            if v < 10 {
                errors.push(format!("field `{field}`: value {v}: expected at least 10"));
            }
        }
        if self.max_buffered_body_bytes < max_body_bytes {
            errors.push(format!(
                "field `clients.max_buffered_body_bytes`: value {}: expected at least \
                 limits.max_body_bytes ({max_body_bytes})",
                self.max_buffered_body_bytes
            ));
        }
        Clients {
            max_connections: self.max_connections,
            head_timeout: Duration::from_millis(self.head_timeout_ms),
            body_timeout: Duration::from_millis(self.body_timeout_ms),
            max_buffered_body_bytes: self.max_buffered_body_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        let mut errors = Vec::new();
        let c = ClientsFile::default().validate(32 << 20, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(c.head_timeout, Duration::from_secs(10));
        let bad = ClientsFile {
            max_connections: 0,
            head_timeout_ms: 1,
            body_timeout_ms: 5,
            max_buffered_body_bytes: 1024,
        };
        bad.validate(4096, &mut errors);
        let all = errors.join("\n");
        assert!(all.contains("`clients.max_connections`: value 0"), "{all}");
        assert!(all.contains("`clients.head_timeout_ms`: value 1"), "{all}");
        assert!(all.contains("`clients.body_timeout_ms`: value 5"), "{all}");
        assert!(
            all.contains("`clients.max_buffered_body_bytes`: value 1024: expected at least limits.max_body_bytes (4096)"),
            "{all}"
        );
    }
}
