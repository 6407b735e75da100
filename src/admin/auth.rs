//! Bearer-token check for admin endpoints that change state. With no token configured they
//! are refused (403) rather than open; a missing or wrong token is 401.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// Ok when the request carries one of `accepted` (unset tokens are skipped).
#[allow(clippy::result_large_err)]
pub fn require(headers: &HeaderMap, accepted: &[Option<&str>]) -> Result<(), Response> {
    let tokens: Vec<&str> = accepted.iter().flatten().copied().collect();
    if tokens.is_empty() {
        return Err(error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "no admin token is configured (server.admin_token / FLEETGATE_ADMIN_TOKEN): state-changing admin endpoints are disabled",
        ));
    }
    let given = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(g) if tokens.iter().any(|t| same(t.as_bytes(), g.as_bytes())) => Ok(()),
        _ => Err(error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        )),
    }
}

/// The bearer token of node `node_id`'s agent: `fga1.` + HMAC-SHA256(`fleet.agent_token`,
/// node id), hex. It is good for that node only; `fleetgate agent-token ID` prints it.
pub fn node_token(secret: &str, node_id: &str) -> String {
    use hmac::{Hmac, Mac};
    // HMAC takes keys of any length.
    let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()) else {
        return String::new();
    };
    mac.update(b"fleetgate-agent:");
    mac.update(node_id.as_bytes());
    let tag = mac.finalize().into_bytes();
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    format!("fga1.{hex}")
}

/// Ok when the request carries the admin token or `node_id`'s own agent token. The shared
/// `fleet.agent_token` itself is a signing secret, not a credential: a token for one node
/// cannot speak for another.
#[allow(clippy::result_large_err)]
pub fn require_node(
    headers: &HeaderMap,
    admin: Option<&str>,
    agent_secret: Option<&str>,
    node_id: &str,
) -> Result<(), Response> {
    let own = agent_secret.map(|s| node_token(s, node_id));
    require(headers, &[admin, own.as_deref()])
}

/// Constant-time comparison (the token is a secret; do not leak its prefix by timing).
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A JSON error body `{"error": {"code", "message"}}` with `status`.
pub fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(axum::http::header::AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    #[test]
    fn statuses() {
        let st = |h: HeaderMap, acc: &[Option<&str>]| require(&h, acc).err().map(|r| r.status());
        assert_eq!(
            st(headers(Some("Bearer s3")), &[None]),
            Some(StatusCode::FORBIDDEN)
        );
        assert_eq!(
            st(headers(None), &[Some("s3")]),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            st(headers(Some("Bearer nope")), &[Some("s3")]),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            st(headers(Some("s3")), &[Some("s3")]),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(st(headers(Some("Bearer s3")), &[Some("s3")]), None);
        assert_eq!(
            st(headers(Some("Bearer ag")), &[Some("s3"), Some("ag")]),
            None
        );
    }

    #[test]
    fn node_tokens_speak_for_their_node_only() {
        let a = node_token("secret", "node-a");
        assert!(a.starts_with("fga1.") && a.len() == 5 + 64, "{a}");
        assert_eq!(a, node_token("secret", "node-a"), "stable");
        assert_ne!(a, node_token("secret", "node-b"));
        assert_ne!(a, node_token("other", "node-a"));
        let bearer = |t: &str| headers(Some(&format!("Bearer {t}")));
        let st = |h: HeaderMap, id: &str| {
            require_node(&h, Some("adm"), Some("secret"), id)
                .err()
                .map(|r| r.status())
        };
        assert_eq!(st(bearer(&a), "node-a"), None);
        assert_eq!(st(bearer(&a), "node-b"), Some(StatusCode::UNAUTHORIZED));
        assert_eq!(
            st(bearer("secret"), "node-a"),
            Some(StatusCode::UNAUTHORIZED),
            "the shared secret is not a token"
        );
        assert_eq!(
            st(bearer("adm"), "node-b"),
            None,
            "the operator speaks for all"
        );
    }
}
