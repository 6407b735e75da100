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
}
