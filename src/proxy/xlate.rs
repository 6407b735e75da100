//! Protocol translation in the proxy: which endpoint the chosen node is sent, the translated
//! request, and the response hooks (headers, then the body event by event, synchronously).

use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::Result;

use super::dispatch::Dispatch;
use crate::fleet::Fleet;
use crate::protocol::translate::{self, Context, ResponseTranslator, Translation};
use crate::protocol::Endpoint;
use crate::routing::Choice;

/// The endpoint the winner is sent for `ep` (`ep` when it speaks it). Failover candidates
/// that would need another endpoint are dropped: the body is translated once, for the winner.
pub fn plan(fleet: &Fleet, ep: Endpoint, ranked: &mut Vec<Choice>) -> Endpoint {
    let upstream_of = |c: &Choice| translate::upstream_for(ep, &families(fleet, c.node));
    let Some(first) = ranked.first().and_then(upstream_of) else {
        return ep;
    };
    let mut i = 0;
    ranked.retain(|c| {
        i += 1;
        i == 1 || upstream_of(c) == Some(first)
    });
    first
}

/// What node `idx` speaks: probed, else its config (`protocols:` or the backend's default).
fn families(fleet: &Fleet, idx: usize) -> Vec<crate::routing::Family> {
    let probed = fleet.node(idx).live.lock().probed_families.clone();
    probed.unwrap_or_else(|| fleet.node_config(idx).families.clone())
}

/// The body the node is sent; the error is the client's 400.
pub fn request(ep: Endpoint, upstream: Endpoint, body: Bytes) -> Result<Bytes, String> {
    if ep == upstream {
        return Ok(body);
    }
    let t = Translation {
        client: ep,
        upstream,
    };
    translate::request(t, &body)
}

/// The node's request header for a translated request: the node's path, plain JSON both ways.
pub fn upstream_header(h: &mut RequestHeader, d: &Dispatch) -> Result<()> {
    if d.upstream == d.endpoint {
        return Ok(());
    }
    let uri = http::Uri::from_static(d.upstream.path());
    h.set_uri(uri);
    h.insert_header("content-type", "application/json")?;
    // The translator reads the body as it streams: no compression.
    h.remove_header("accept-encoding");
    Ok(())
}

/// Start translating a response: its translator, and the headers the client's protocol has.
pub fn response_header(
    resp: &mut ResponseHeader,
    d: &Dispatch,
    now_s: u64,
) -> Result<Option<ResponseTranslator>> {
    if d.upstream == d.endpoint {
        return Ok(None);
    }
    let t = Translation {
        client: d.endpoint,
        upstream: d.upstream,
    };
    let ctx = Context {
        now_s,
        id_seed: id_seed(d),
        model: d.choice().model.clone(),
    };
    let x = ResponseTranslator::new(t, resp.status.as_u16(), d.stream, ctx);
    resp.remove_header("content-length");
    resp.remove_header("content-encoding");
    resp.insert_header("transfer-encoding", "chunked")?;
    resp.insert_header("content-type", x.content_type())?;
    Ok(Some(x))
}

/// Replace an upstream body chunk by its translation (the end adds what completes it).
pub fn body(x: &mut ResponseTranslator, body: &mut Option<Bytes>, end_of_stream: bool) {
    let mut out = match body.as_ref() {
        Some(b) => x.feed(b).to_vec(),
        None => Vec::new(),
    };
    if end_of_stream {
        out.extend_from_slice(&x.finish());
    }
    *body = Some(Bytes::from(out));
}

/// A per-request seed for response ids: distinct across requests, no clock in the translator.
fn id_seed(d: &Dispatch) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(d as *const Dispatch as usize);
    h.write_u128(d.started.elapsed().as_nanos());
    h.finish()
}
