//! What clients may hold of this gateway: connections (a cap fitted to the open-files limit)
//! and bytes of buffered request bodies. The proxy's connection guard is `proxy::conn`.

pub mod budget;
mod nofile;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use once_cell::sync::Lazy;
use prometheus::{opts, IntCounterVec, IntGauge};

pub use budget::{BodyBudget, BodyBuf, Refused};
pub use nofile::{connection_ceiling, raise_nofile_limit};

use crate::metrics::{CLIENT_CONNECTIONS, CLIENT_REFUSALS_TOTAL, METRICS};

/// Shared by every request and connection of one gateway.
#[derive(Debug)]
pub struct ClientGuards {
    pub budget: Arc<BodyBudget>,
    open: AtomicUsize,
    /// The most connections the open-files limit leaves room for.
    ceiling: AtomicUsize,
    /// This gateway's own listeners as bound (proxy, admin): never a node's address.
    listeners: parking_lot::Mutex<Vec<std::net::SocketAddr>>,
    /// Client requests being served (read, routed, proxied) now.
    requests: AtomicUsize,
    /// Set when a shutdown's grace period is over: what is in flight ends now.
    grace_over: tokio::sync::watch::Sender<bool>,
}

impl Default for ClientGuards {
    fn default() -> Self {
        ClientGuards {
            budget: Arc::default(),
            open: AtomicUsize::new(0),
            ceiling: AtomicUsize::new(usize::MAX),
            listeners: Default::default(),
            requests: AtomicUsize::new(0),
            grace_over: tokio::sync::watch::channel(false).0,
        }
    }
}

/// One open client connection; counted until dropped.
#[derive(Debug)]
pub struct Slot(Arc<ClientGuards>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        METRICS_CLIENTS.connections.dec();
    }
}

/// One client request in flight; counted until dropped.
#[derive(Debug)]
pub struct InFlight(Arc<ClientGuards>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.requests.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ClientGuards {
    /// Count a client request as in flight until the guard is dropped.
    pub fn request(self: &Arc<Self>) -> InFlight {
        self.requests.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    pub fn in_flight(&self) -> usize {
        self.requests.load(Ordering::Acquire)
    }

    /// The shutdown grace period is over: requests still in flight end now.
    pub fn end_grace(&self) {
        self.grace_over.send_replace(true);
    }

    /// Resolves once `end_grace` was called (never, in normal operation).
    pub async fn grace_over(&self) {
        let mut rx = self.grace_over.subscribe();
        let _ = rx.wait_for(|over| *over).await;
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// The cap in force: the configured one, lowered to what the open-files limit allows.
    pub fn cap(&self, configured: usize) -> usize {
        configured.min(self.ceiling.load(Ordering::Relaxed))
    }

    pub fn set_listeners(&self, addrs: Vec<std::net::SocketAddr>) {
        *self.listeners.lock() = addrs;
    }

    pub fn listeners(&self) -> Vec<std::net::SocketAddr> {
        self.listeners.lock().clone()
    }

    pub fn set_ceiling(&self, n: usize) {
        self.ceiling.store(n.max(1), Ordering::Relaxed);
    }

    /// A slot for a new connection, or None when `cap(configured)` are open.
    pub fn connect(self: &Arc<Self>, configured: usize) -> Option<Slot> {
        let cap = self.cap(configured);
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .ok()?;
        METRICS_CLIENTS.connections.inc();
        Some(Slot(self.clone()))
    }
}

/// Why the gateway turned a client away before routing (metric label).
#[derive(Debug, Clone, Copy)]
pub enum Refusal {
    Connections,
    BodyBudget,
    HeadTimeout,
    BodyTimeout,
}

impl Refusal {
    pub const ALL: [Refusal; 4] = [
        Refusal::Connections,
        Refusal::BodyBudget,
        Refusal::HeadTimeout,
        Refusal::BodyTimeout,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Connections => "connections",
            Refusal::BodyBudget => "body_budget",
            Refusal::HeadTimeout => "head_timeout",
            Refusal::BodyTimeout => "body_timeout",
        }
    }
}

pub fn count_refusal(r: Refusal) {
    METRICS_CLIENTS
        .refusals
        .with_label_values(&[r.as_str()])
        .inc();
}

struct ClientMetrics {
    connections: IntGauge,
    refusals: IntCounterVec,
}

static METRICS_CLIENTS: Lazy<ClientMetrics> = Lazy::new(|| {
    let m = ClientMetrics {
        connections: IntGauge::with_opts(opts!(
            CLIENT_CONNECTIONS,
            "Client connections open on the proxy listener"
        ))
        .expect("valid gauge"),
        refusals: IntCounterVec::new(
            opts!(
                CLIENT_REFUSALS_TOTAL,
                "Clients turned away before routing, by reason"
            ),
            &["reason"],
        )
        .expect("valid counter"),
    };
    // Registering twice is impossible: this runs once per process.
    let _ = METRICS.registry.register(Box::new(m.connections.clone()));
    let _ = METRICS.registry.register(Box::new(m.refusals.clone()));
    for r in Refusal::ALL {
        m.refusals.with_label_values(&[r.as_str()]);
    }
    m
});

/// Create the client metric series (zero-valued) so they are scraped before the first event.
pub fn register_metrics() {
    Lazy::force(&METRICS_CLIENTS);
}
