//! Client connections on the proxy port: a cap with a clear 503 refusal, a deadline for the
//! whole request head, and Pingora's own empty 400 replaced by one in the client's error shape.
//!
//! `Guarded` wraps the Pingora HTTP app: every accepted connection takes a slot (or is refused)
//! and its stream is wrapped in `ClientStream`, whose reads fail once a request head is not
//! complete by its deadline. The head deadline runs from the accept, or from the first byte of
//! the next request on a kept-alive connection, until `request_filter` sees the head
//! (`head_done`); `request_done` re-arms it for the next request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::apps::ServerApp;
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, Ssl, Stream, UniqueID,
    UniqueIDType,
};
use pingora::server::ShutdownWatch;
use pingora_proxy::Session;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::respond::family_of_path;
use crate::clients::{count_refusal, Refusal};
use crate::fleet::Fleet;
use crate::protocol::{self, ErrorCode, Family};

/// The Pingora HTTP app `A`, behind the connection cap and head deadline.
pub struct Guarded<A> {
    inner: Arc<A>,
    fleet: Arc<Fleet>,
}

impl<A> Guarded<A> {
    pub fn new(inner: A, fleet: Arc<Fleet>) -> Guarded<A> {
        Guarded {
            inner: Arc::new(inner),
            fleet,
        }
    }
}

#[async_trait]
impl<A: ServerApp + Send + Sync + 'static> ServerApp for Guarded<A> {
    async fn process_new(
        self: &Arc<Self>,
        mut stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let config = self.fleet.config();
        let configured = config.clients.max_connections;
        let Some(_slot) = self.fleet.clients.connect(configured) else {
            count_refusal(Refusal::Connections);
            let cap = self.fleet.clients.cap(configured);
            let msg = format!(
                "the gateway is at its limit of {cap} client connections (clients.max_connections); retry shortly"
            );
            let reply = raw_response(503, Family::OpenAI, ErrorCode::Overloaded, &msg);
            let write = async {
                let _ = stream.write_all(&reply).await;
                let _ = stream.flush().await;
                Shutdown::shutdown(&mut *stream).await;
            };
            let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
            return None;
        };
        let wrapped: Stream = Box::new(ClientStream::new(stream, config.clients.head_timeout));
        let mut next = self.inner.process_new(wrapped, shutdown).await;
        while let Some(s) = next {
            next = self.inner.process_new(s, shutdown).await;
        }
        None
    }

    async fn cleanup(&self) {
        self.inner.cleanup().await;
    }
}

/// A complete HTTP/1.1 error response that closes the connection.
fn raw_response(status: u16, family: Family, code: ErrorCode, msg: &str) -> Vec<u8> {
    let body = protocol::error_body(family, code, msg);
    let reason = match status {
        400 => "Bad Request",
        408 => "Request Timeout",
        _ => "Service Unavailable",
    };
    let retry = if status == 503 {
        "retry-after: 1\r\n"
    } else {
        ""
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{retry}connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Pingora's own 400 (empty body), not one of the gateway's JSON answers.
fn is_bare_400(buf: &[u8]) -> bool {
    if !buf.starts_with(b"HTTP/1.1 400 ") {
        return false;
    }
    let head = String::from_utf8_lossy(&buf[..buf.len().min(1024)]).to_ascii_lowercase();
    head.contains("content-length: 0\r\n") && !head.contains("application/json")
}

/// Where a connection is between requests.
#[derive(Debug, Default)]
struct Phase {
    /// The current head must be complete by then.
    deadline: Option<Instant>,
    /// Between `head_done` and `request_done`: the head deadline does not apply.
    in_request: bool,
    /// The start of the current head, to answer in the right protocol family.
    head_start: Vec<u8>,
}

/// How much of a head is kept to tell the family (`POST /v1/messages ...`).
const HEAD_SNIFF: usize = 64;

/// A client's stream with a head deadline; see the module doc.
#[derive(Debug)]
pub struct ClientStream {
    inner: Stream,
    head_timeout: Duration,
    phase: Mutex<Phase>,
    sleep: Pin<Box<Sleep>>,
    /// Pingora's own 400 being replaced: (our response, bytes of it written).
    replacing: Option<(Vec<u8>, usize)>,
    /// After a replaced or timed-out answer: the rest Pingora writes is dropped.
    closing: bool,
}

impl ClientStream {
    fn new(inner: Stream, head_timeout: Duration) -> ClientStream {
        let deadline = Instant::now() + head_timeout;
        ClientStream {
            inner,
            head_timeout,
            phase: Mutex::new(Phase {
                deadline: Some(deadline),
                ..Phase::default()
            }),
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
            replacing: None,
            closing: false,
        }
    }

    fn family(&self) -> Family {
        let p = self.phase.lock();
        let head = String::from_utf8_lossy(&p.head_start);
        let path = head.split(' ').nth(1).unwrap_or("/");
        family_of_path(path)
    }
}

fn client_stream(session: &Session) -> Option<&ClientStream> {
    session
        .as_downstream()
        .stream()?
        .as_any()
        .downcast_ref::<ClientStream>()
}

/// The head of a request has been read: its deadline no longer applies.
pub fn head_done(session: &Session) {
    if let Some(s) = client_stream(session) {
        let mut p = s.phase.lock();
        p.in_request = true;
        p.deadline = None;
        p.head_start.clear();
    }
}

/// The request is answered: the next bytes on this connection start a new head deadline.
pub fn request_done(session: &Session) {
    if let Some(s) = client_stream(session) {
        s.phase.lock().in_request = false;
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let (deadline, seen) = {
            let p = this.phase.lock();
            (p.deadline, !p.head_start.is_empty())
        };
        if let Some(d) = deadline {
            if this.sleep.deadline() != d {
                this.sleep.as_mut().reset(d);
            }
            if this.sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(this.head_timed_out(cx, seen)));
            }
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &r {
            let got = &buf.filled()[before..];
            if !got.is_empty() {
                let mut p = this.phase.lock();
                if !p.in_request {
                    if p.deadline.is_none() {
                        p.deadline = Some(Instant::now() + this.head_timeout);
                    }
                    let room = HEAD_SNIFF.saturating_sub(p.head_start.len());
                    p.head_start.extend_from_slice(&got[..got.len().min(room)]);
                }
            }
        }
        r
    }
}

impl ClientStream {
    /// The head deadline passed: answer 408 (when the client sent anything) and fail the read.
    fn head_timed_out(&mut self, cx: &mut Context<'_>, seen: bool) -> std::io::Error {
        count_refusal(Refusal::HeadTimeout);
        let ms = self.head_timeout.as_millis();
        if seen && !self.closing {
            let msg = format!("request head not complete within {ms} ms (clients.head_timeout_ms)");
            let reply = raw_response(408, self.family(), ErrorCode::RequestTimeout, &msg);
            // Best effort: a short reply fits the socket buffer; the connection closes anyway.
            let _ = Pin::new(&mut self.inner).poll_write(cx, &reply);
        }
        self.closing = true;
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("request head not complete within {ms} ms"),
        )
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.replacing.is_none() && !this.closing && is_bare_400(buf) {
            let before_request = !this.phase.lock().in_request;
            if before_request {
                // Pingora's own 400 for a head it cannot parse: empty body. Say why, natively.
                let msg = "malformed HTTP request head";
                let reply = raw_response(400, this.family(), ErrorCode::InvalidRequest, msg);
                this.replacing = Some((reply, 0));
            }
        }
        if let Some((reply, off)) = &mut this.replacing {
            while *off < reply.len() {
                match Pin::new(&mut this.inner).poll_write(cx, &reply[*off..]) {
                    Poll::Ready(Ok(0)) => break,
                    Poll::Ready(Ok(n)) => *off += n,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            this.replacing = None;
            this.closing = true;
            return Poll::Ready(Ok(buf.len()));
        }
        if this.closing {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[async_trait]
impl Shutdown for ClientStream {
    async fn shutdown(&mut self) {
        Shutdown::shutdown(&mut *self.inner).await;
    }
}

impl UniqueID for ClientStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for ClientStream {}

impl GetTimingDigest for ClientStream {
    fn get_timing_digest(&self) -> Vec<Option<pingora::protocols::TimingDigest>> {
        self.inner.get_timing_digest()
    }
}

impl GetProxyDigest for ClientStream {
    fn get_proxy_digest(&self) -> Option<Arc<pingora::protocols::raw_connect::ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
}

impl GetSocketDigest for ClientStream {
    fn get_socket_digest(&self) -> Option<Arc<pingora::protocols::SocketDigest>> {
        self.inner.get_socket_digest()
    }
}

#[async_trait]
impl Peek for ClientStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> std::io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}
