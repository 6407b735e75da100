//! Listening socket that can be closed and re-bound (Refuse fault), and connections that can be cut.

use futures::task::AtomicWaker;
use parking_lot::Mutex;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The node's listening socket, shared between the accept loop and the control handle.
pub(crate) struct ListenSlot {
    addr: SocketAddr,
    inner: Mutex<Option<TcpListener>>,
    waker: AtomicWaker,
    rt: tokio::runtime::Handle,
    stopped: AtomicBool,
    /// Bumped to cut every open connection.
    kill: watch::Sender<u64>,
}

impl ListenSlot {
    /// Take over an already-bound std listener. Must run inside a tokio runtime.
    pub(crate) fn new(l: std::net::TcpListener) -> io::Result<Self> {
        l.set_nonblocking(true)?;
        let addr = l.local_addr()?;
        let l = TcpListener::from_std(l)?;
        Ok(ListenSlot {
            addr,
            inner: Mutex::new(Some(l)),
            waker: AtomicWaker::new(),
            rt: tokio::runtime::Handle::current(),
            stopped: AtomicBool::new(false),
            kill: watch::channel(0).0,
        })
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Close the socket (connects now get ECONNREFUSED) and cut every open connection.
    pub(crate) fn close_and_kill(&self) {
        let mut g = self.inner.lock();
        *g = None;
        self.kill.send_modify(|e| *e += 1);
        drop(g);
        self.waker.wake();
    }

    /// Bind the same address again (after a Refuse fault is lifted).
    pub(crate) fn reopen(&self) -> io::Result<()> {
        if self.stopped.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut g = self.inner.lock();
        if g.is_none() {
            let _rt = self.rt.enter();
            let l = std::net::TcpListener::bind(self.addr)?;
            l.set_nonblocking(true)?;
            *g = Some(TcpListener::from_std(l)?);
        }
        drop(g);
        self.waker.wake();
        Ok(())
    }

    /// Final stop: close, cut connections, never re-bind.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.close_and_kill();
    }

    /// A receiver that sees the kill epoch change.
    pub(crate) fn kill_watch(&self) -> watch::Receiver<u64> {
        self.kill.subscribe()
    }

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(TcpStream, SocketAddr, u64)>> {
        self.waker.register(cx.waker());
        let g = self.inner.lock();
        match g.as_ref() {
            Some(l) => match l.poll_accept(cx) {
                Poll::Ready(Ok((s, a))) => Poll::Ready(Ok((s, a, *self.kill.borrow()))),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            },
            None => Poll::Pending,
        }
    }
}

/// Resolves once the kill epoch differs from `seen` (or the node is gone).
pub(crate) async fn killed(mut rx: watch::Receiver<u64>, seen: u64) {
    let _ = rx.wait_for(|e| *e != seen).await;
}

/// The axum listener over a [`ListenSlot`].
pub(crate) struct SimListener {
    slot: Arc<ListenSlot>,
}

impl SimListener {
    pub(crate) fn new(slot: Arc<ListenSlot>) -> Self {
        SimListener { slot }
    }
}

impl axum::serve::Listener for SimListener {
    type Io = KillableStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let slot = self.slot.clone();
            match std::future::poll_fn(|cx| slot.poll_accept(cx)).await {
                Ok((s, a, epoch)) => {
                    let _ = s.set_nodelay(true);
                    let rx = self.slot.kill_watch();
                    return (KillableStream::new(s, rx, epoch), a);
                }
                Err(e) => {
                    log::warn!("sim: accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.slot.addr)
    }
}

/// A TCP stream that fails every read and write once the node cuts connections.
pub(crate) struct KillableStream {
    inner: TcpStream,
    kill: Pin<Box<dyn Future<Output = ()> + Send>>,
    dead: bool,
}

impl KillableStream {
    fn new(inner: TcpStream, rx: watch::Receiver<u64>, epoch: u64) -> Self {
        KillableStream {
            inner,
            kill: Box::pin(killed(rx, epoch)),
            dead: false,
        }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.dead && self.kill.as_mut().poll(cx).is_ready() {
            self.dead = true;
        }
        if self.dead {
            Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "sim: connection cut",
            ))
        } else {
            Ok(())
        }
    }
}

impl AsyncRead for KillableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
