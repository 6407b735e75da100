//! The sim's fault switches over HTTP (`POST /_sim/fault`, `GET /_sim/fault`), for harnesses
//! that drive a sim node in another process (`fleetgate sim`). Not counted in [`SimStats`].
//!
//! Body: `{"fault": "none" | "refuse" | "status500" | "hang" | "die_mid_stream" |
//! "cut_chunked" | "cut_length" | "slow_first_byte" | "flap", "ms": N}` (`ms`: the delay of
//! `slow_first_byte`, the period of `flap`; for `refuse`, when given, the node listens again
//! after `ms` — nothing can reach it over HTTP to lift the fault).
//!
//! [`SimStats`]: super::SimStats

use super::control::{Fault, SimControl};
use super::http::json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json as j, Value};
use std::sync::Arc;

/// Parse the body of `POST /_sim/fault`.
pub(crate) fn parse(body: &[u8]) -> Result<Fault, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("body: {e}"))?;
    let name = v
        .get("fault")
        .and_then(Value::as_str)
        .ok_or("body: expected {\"fault\": NAME}")?;
    let ms = v.get("ms").and_then(Value::as_u64);
    let need_ms = |what: &str| ms.ok_or(format!("fault {what:?}: expected \"ms\": N"));
    Ok(match name {
        "none" => Fault::None,
        "refuse" => Fault::Refuse,
        "status500" => Fault::Status500,
        "hang" => Fault::Hang,
        "die_mid_stream" => Fault::DieMidStream,
        "cut_chunked" => Fault::CutChunked,
        "cut_length" => Fault::CutLength,
        "slow_first_byte" => Fault::SlowFirstByte(need_ms(name)?),
        "flap" => Fault::Flap(need_ms(name)?.max(1)),
        other => return Err(format!("unknown fault {other:?}")),
    })
}

/// The name and parameter of a fault, as `GET /_sim/fault` shows it.
pub(crate) fn describe(f: Fault) -> Value {
    let (name, ms) = match f {
        Fault::None => ("none", None),
        Fault::Refuse => ("refuse", None),
        Fault::Status500 => ("status500", None),
        Fault::Hang => ("hang", None),
        Fault::DieMidStream => ("die_mid_stream", None),
        Fault::CutChunked => ("cut_chunked", None),
        Fault::CutLength => ("cut_length", None),
        Fault::SlowFirstByte(ms) => ("slow_first_byte", Some(ms)),
        Fault::Flap(ms) => ("flap", Some(ms)),
    };
    j!({"fault": name, "ms": ms})
}

pub(crate) async fn set(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    let f = match parse(&body) {
        Ok(f) => f,
        Err(e) => return json(StatusCode::BAD_REQUEST, j!({"error": e})),
    };
    let restore = match (f, serde_json::from_slice::<Value>(&body)) {
        (Fault::Refuse, Ok(v)) => v.get("ms").and_then(Value::as_u64),
        _ => None,
    };
    // Answer first: `refuse` cuts this very connection.
    let reply = json(StatusCode::OK, describe(f));
    let c = ctl.clone();
    tokio::spawn(async move {
        tokio::task::yield_now().await;
        c.set_fault(f);
        if let Some(ms) = restore {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            if c.fault() == Fault::Refuse {
                c.set_fault(Fault::None);
            }
        }
    });
    reply
}

pub(crate) async fn get(State(ctl): State<Arc<SimControl>>) -> Response {
    json(StatusCode::OK, describe(ctl.fault()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in [
            Fault::None,
            Fault::Refuse,
            Fault::Status500,
            Fault::Hang,
            Fault::DieMidStream,
            Fault::CutChunked,
            Fault::CutLength,
            Fault::SlowFirstByte(250),
            Fault::Flap(40),
        ] {
            let body = serde_json::to_vec(&describe(f)).unwrap();
            assert_eq!(parse(&body), Ok(f));
        }
        assert!(parse(br#"{"fault":"slow_first_byte"}"#)
            .unwrap_err()
            .contains("ms"));
        assert!(parse(br#"{"fault":"melt"}"#).unwrap_err().contains("melt"));
        assert!(parse(b"nope").is_err());
    }
}
