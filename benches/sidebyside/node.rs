//! The fake node behind every proxy in the side-by-side bench: an instant OpenAI server that
//! counts the TCP connections it accepts (new upstream connections) and can hold streams open.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use tokio::runtime::Runtime;
use tokio::sync::watch;

pub const MODEL: &str = "bench:1b";
/// Streams for this model send their first chunk, then wait for `Node::release`.
pub const HOLD_MODEL: &str = "bench:hold";

const REPLY: &str = r#"{"id":"chatcmpl-0","object":"chat.completion","created":0,"model":"bench:1b","choices":[{"index":0,"message":{"role":"assistant","content":"Paris"},"finish_reason":"length"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}"#;
const CHUNK1: &str = "data: {\"id\":\"chatcmpl-0\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench:1b\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Paris\"},\"finish_reason\":null}]}\n\n";
const CHUNK2: &str = "data: {\"id\":\"chatcmpl-0\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"bench:1b\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1,\"total_tokens\":10}}\n\n";
const DONE: &str = "data: [DONE]\n\n";
const MODELS: &str = r#"{"object":"list","data":[{"id":"bench:1b","object":"model","created":0,"owned_by":"bench","max_model_len":4000000},{"id":"bench:hold","object":"model","created":0,"owned_by":"bench","max_model_len":4000000}]}"#;

#[derive(serde::Deserialize)]
struct Chat {
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    model: String,
}

#[derive(Clone)]
struct Shared {
    release: watch::Receiver<bool>,
}

pub struct Node {
    pub port: u16,
    accepts: Arc<AtomicU64>,
    release: watch::Sender<bool>,
}

impl Node {
    /// TCP connections accepted so far.
    pub fn accepts(&self) -> u64 {
        self.accepts.load(Ordering::Relaxed)
    }

    /// Let every held stream finish (and any later one pass straight through).
    pub fn release(&self) {
        let _ = self.release.send(true);
    }

    /// Hold new `HOLD_MODEL` streams again.
    pub fn hold(&self) {
        let _ = self.release.send(false);
    }
}

async fn chat(State(s): State<Shared>, body: Bytes) -> Response {
    let Ok(c) = serde_json::from_slice::<Chat>(&body) else {
        return (axum::http::StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    if !c.stream {
        return ([("content-type", "application/json")], REPLY).into_response();
    }
    let mut release = s.release.clone();
    let hold = c.model == HOLD_MODEL;
    let chunks = async_stream(hold, move || async move {
        let _ = release.wait_for(|r| *r).await;
    });
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(chunks),
    )
        .into_response()
}

/// Three SSE chunks (so the response is chunked, as real servers stream); a held stream
/// waits after the first.
fn async_stream<F, Fut>(
    hold: bool,
    wait: F,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use futures::StreamExt;
    let first = futures::stream::once(async { Ok(Bytes::from_static(CHUNK1.as_bytes())) });
    let rest = futures::stream::once(async move {
        if hold {
            wait().await;
        }
        Ok(Bytes::from_static(CHUNK2.as_bytes()))
    });
    let done = futures::stream::once(async { Ok(Bytes::from_static(DONE.as_bytes())) });
    first.chain(rest).chain(done)
}

async fn models() -> Response {
    ([("content-type", "application/json")], MODELS).into_response()
}

/// Serve on an ephemeral port of 127.0.0.1 until the runtime stops.
pub fn start(rt: &Runtime) -> Node {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind fake node");
    l.set_nonblocking(true).expect("nonblocking");
    let port = l.local_addr().expect("addr").port();
    let accepts = Arc::new(AtomicU64::new(0));
    let (tx, rx) = watch::channel(false);
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .layer(DefaultBodyLimit::max(64 << 20))
        .with_state(Shared { release: rx });
    let count = accepts.clone();
    rt.spawn(async move {
        let l = tokio::net::TcpListener::from_std(l)
            .expect("tokio listener")
            .tap_io(move |s| {
                count.fetch_add(1, Ordering::Relaxed);
                let _ = s.set_nodelay(true);
            });
        let _ = axum::serve(l, app).await;
    });
    Node {
        port,
        accepts,
        release: tx,
    }
}
