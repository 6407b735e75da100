//! API key -> tenant. A client presents its key the way its SDK does: OpenAI and Ollama send
//! `Authorization: Bearer <key>` (Ollama also bare `Authorization: <key>`), Anthropic sends
//! `x-api-key: <key>` (Claude Code with an auth token sends `Authorization: Bearer`). Any of
//! them is accepted for any protocol. The key is never logged or stored, only its digest.

use pingora::http::RequestHeader;

use crate::config::tenants::{Tenancy, DEFAULT_TENANT};

/// The key a request presents, if any.
pub fn presented_key(h: &RequestHeader) -> Option<&str> {
    let get = |name: &str| {
        h.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    get("x-api-key").or_else(|| {
        get("authorization").map(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
                .unwrap_or(v)
                .trim()
        })
    })
}

/// The tenant of a request: `default` with auth off; with auth on, the tenant of a valid key,
/// else the message of a 401 (which never repeats the key).
pub fn identify<'a>(tenancy: &'a Tenancy, h: &RequestHeader) -> Result<&'a str, String> {
    if !tenancy.auth_enabled() {
        return Ok(DEFAULT_TENANT);
    }
    match presented_key(h) {
        None => {
            Err("missing API key: send `Authorization: Bearer <key>` or `x-api-key: <key>`".into())
        }
        Some(key) => tenancy
            .tenant_of(key)
            .ok_or_else(|| "invalid API key".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashMap};

    fn header(pairs: &[(&str, &str)]) -> RequestHeader {
        let mut h = RequestHeader::build("POST", b"/v1/chat/completions", None).expect("header");
        for (k, v) in pairs {
            h.insert_header(k.to_string(), v.to_string())
                .expect("insert");
        }
        h
    }

    #[test]
    fn every_sdk_way_of_sending_a_key_is_read() {
        let t = Tenancy {
            keys: HashMap::from([(crate::config::tenants::digest("sk-good-key"), "a".into())]),
            tenants: BTreeMap::new(),
        };
        for h in [
            header(&[("authorization", "Bearer sk-good-key")]),
            header(&[("authorization", "sk-good-key")]),
            header(&[("x-api-key", "sk-good-key")]),
        ] {
            assert_eq!(identify(&t, &h), Ok("a"));
        }
        assert!(identify(&t, &header(&[]))
            .unwrap_err()
            .contains("missing API key"));
        let bad = identify(&t, &header(&[("x-api-key", "sk-bad-key")])).unwrap_err();
        assert!(!bad.contains("sk-bad-key"), "{bad}");
        assert_eq!(
            identify(&Tenancy::default(), &header(&[])),
            Ok(DEFAULT_TENANT)
        );
    }
}
