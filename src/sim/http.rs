//! Shared handler plumbing: request intake (stats, Hang fault), JSON/streaming responses, execution.

use super::control::{Fault, SimControl};
use super::engine::{admit, Plan, Summary};
use super::stream::{body, dead_body, Framer};
use super::text::fnv1a;
use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::Value;
use std::io;
use std::sync::Arc;
use tokio::time::Instant;

pub(crate) const NDJSON: &str = "application/x-ndjson";
pub(crate) const SSE: &str = "text/event-stream";

/// A received request: its JSON (or the parse error) and when it arrived.
pub(crate) struct Intake {
    pub json: Result<Value, String>,
    pub started: Instant,
}

/// Count the request in stats, then honour the Hang fault. `Err` carries the response to send
/// (only when a hung request is cut off).
pub(crate) async fn intake(
    ctl: &Arc<SimControl>,
    path: &str,
    body: &[u8],
) -> Result<Intake, Response> {
    let started = Instant::now();
    let json = if body.is_empty() {
        Err("EOF while parsing a value at line 1 column 0".to_string())
    } else {
        serde_json::from_slice::<Value>(body).map_err(|e| e.to_string())
    };
    let model = json
        .as_ref()
        .ok()
        .and_then(|v| v.get("model").or_else(|| v.get("name")))
        .and_then(Value::as_str)
        .unwrap_or("");
    ctl.record(path, body.len(), model);
    hang_if_faulted(ctl).await?;
    if let Fault::SlowFirstByte(ms) = ctl.fault() {
        let slow = tokio::time::sleep(std::time::Duration::from_millis(ms));
        if ctl.until_killed(slow).await.is_err() {
            return Err(gone());
        }
    }
    Ok(Intake { json, started })
}

/// The Hang fault: never answer (until the node cuts connections).
pub(crate) async fn hang_if_faulted(ctl: &Arc<SimControl>) -> Result<(), Response> {
    if ctl.fault() == Fault::Hang {
        let _ = ctl.until_killed(std::future::pending::<()>()).await;
        return Err(gone());
    }
    Ok(())
}

/// Response for a request whose connection the node has cut (never actually delivered).
pub(crate) fn gone() -> Response {
    StatusCode::SERVICE_UNAVAILABLE.into_response()
}

pub(crate) fn json(status: StatusCode, v: Value) -> Response {
    (status, axum::Json(v)).into_response()
}

pub(crate) fn streaming<S>(content_type: &'static str, s: S) -> Response
where
    S: Stream<Item = io::Result<Bytes>> + Send + 'static,
{
    let mut r = Response::new(Body::from_stream(s));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    r
}

/// Deserialize the intake JSON into a protocol's request type.
pub(crate) fn typed<T: serde::de::DeserializeOwned>(
    json: &Result<Value, String>,
) -> Result<T, String> {
    match json {
        Ok(v) => serde_json::from_value(v.clone()).map_err(|e| e.to_string()),
        Err(e) => Err(e.clone()),
    }
}

/// Text of a message content: a string, or an array of parts (`{"type":"text","text":..}` or strings).
pub(crate) fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p {
                Value::String(s) => s.as_str(),
                other => other.get("text").and_then(Value::as_str).unwrap_or(""),
            })
            .collect(),
        Value::Object(_) => v
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        _ => String::new(),
    }
}

/// Seed-relevant hash of a request's content.
pub(crate) fn content_hash(model: &str, parts: &[&str]) -> u64 {
    let mut all = Vec::with_capacity(parts.len() + 1);
    all.push(model);
    all.extend_from_slice(parts);
    fnv1a(&all)
}

/// Run a planned text request: stream it with `framer`, or build one JSON object with `whole`.
pub(crate) async fn execute<F, W>(
    ctl: &Arc<SimControl>,
    plan: Plan,
    started: Instant,
    stream: Option<(F, &'static str)>,
    whole: W,
) -> Response
where
    F: Framer,
    W: FnOnce(String, &Summary) -> Value,
{
    let Ok(mut gen) = admit(ctl.clone(), plan, started).await else {
        return gone();
    };
    if let Some((framer, content_type)) = stream {
        return streaming(content_type, body(gen, framer));
    }
    let Ok(text) = ctl.until_killed(gen.rest_text()).await else {
        return gone();
    };
    let summary = gen.finish();
    match ctl.fault() {
        Fault::DieMidStream => streaming("application/json", dead_body()),
        Fault::CutChunked => cut_json(whole(text, &summary), false),
        Fault::CutLength => cut_json(whole(text, &summary), true),
        _ => json(StatusCode::OK, whole(text, &summary)),
    }
}

/// A 200 JSON reply of which only the first half arrives before the connection is cut:
/// chunked, or with the whole body's Content-Length declared.
fn cut_json(v: Value, declare_length: bool) -> Response {
    let full = serde_json::to_vec(&v).unwrap_or_default();
    let len = full.len();
    let half = Bytes::from(full).slice(..len / 2);
    // The cut comes a moment later, so the first half is flushed to the client.
    let cut = futures::stream::once(async {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        Err(super::stream::cut())
    });
    let parts = futures::stream::once(async { Ok(half) }).chain(cut);
    let mut r = streaming("application/json", parts);
    if declare_length {
        r.headers_mut()
            .insert(header::CONTENT_LENGTH, header::HeaderValue::from(len));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_of_shapes() {
        assert_eq!(text_of(&json!("hi")), "hi");
        assert_eq!(
            text_of(&json!([{"type":"text","text":"a"}, {"type":"image_url"}, "b"])),
            "ab"
        );
        assert_eq!(text_of(&json!(null)), "");
        assert_eq!(text_of(&json!(3)), "");
    }

    #[test]
    fn typed_reports_errors() {
        #[derive(serde::Deserialize)]
        struct R {
            #[allow(dead_code)]
            model: String,
        }
        assert!(typed::<R>(&Ok(json!({"model": 3}))).is_err());
        assert!(typed::<R>(&Err("bad".into())).is_err());
        assert!(typed::<R>(&Ok(json!({"model": "m"}))).is_ok());
    }
}
