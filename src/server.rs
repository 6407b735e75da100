//! Server bootstrap: fleet state, in-process simulated nodes, the Pingora proxy service and the
//! background services, assembled from a validated `Config`.

use std::net::TcpListener;
use std::sync::Arc;

use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use pingora_core::listeners::{L4BufferSettings, ListenerConfig};
use pingora_proxy::http_proxy;

use crate::admin::AdminService;
use crate::config::{Backend, Config};
use crate::fleet::Fleet;
use crate::proxy::access_log::AccessLog;
use crate::proxy::conn::Guarded;
use crate::proxy::Gateway;
use crate::services::clock::FleetClock;
use crate::services::health::HealthPoller;
use crate::services::learning::LearnerSaver;
use crate::services::prewarm::Prewarm;
use crate::services::rebalance::Rebalance;

/// Read buffer of each client connection. Pingora's default is 64 KiB, held for as long as
/// the connection is open: with 2,000 open streams it was 44 % of the gateway's heap
/// (heaptrack, `benches/sidebyside` streams phase). 2 KiB takes a request head and a 1 KiB
/// prompt in one read; a read larger than the buffer (Pingora's body reads) bypasses it, so
/// 16 KiB bought nothing measurable and cost 12 KB per open connection, and 4 KiB held 2 KB
/// more per open stream than 2 (benches/README.md, stops 24 and 37).
const CLIENT_READ_BUFFER: usize = 2 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("admin_listen {addr}: {source}")]
    AdminBind {
        addr: String,
        source: std::io::Error,
    },
    #[error("sim node {id} on {addr}: {source}")]
    Sim {
        id: String,
        addr: String,
        source: std::io::Error,
    },
    #[error("access_log: {0}")]
    AccessLog(std::io::Error),
    #[error("runtime: {0}")]
    Runtime(std::io::Error),
}

/// A gateway ready to `run`: the Pingora server plus the fleet it routes over.
pub struct Prepared {
    pub server: Server,
    pub fleet: Arc<Fleet>,
    pub admin_addr: std::net::SocketAddr,
}

/// Build everything, start `backend: sim` nodes that carry a `sim:` block, and poll the fleet
/// once so the first request is routed on real state.
pub fn prepare(config: Config) -> Result<Prepared, StartError> {
    prepare_with(config, false)
}

/// As `prepare`; with `upgrade`, take the listening sockets from the running process over
/// `server.upgrade_sock` (Pingora's zero-downtime upgrade: start this, then SIGQUIT the old
/// one). The admin listener is bound once the old process has let it go.
pub fn prepare_with(config: Config, upgrade: bool) -> Result<Prepared, StartError> {
    let config = Arc::new(config);
    start_sim_nodes(&config)?;
    let fleet = Fleet::new(config.clone());
    match fleet.load_learners() {
        Ok(0) => {}
        Ok(n) => log::info!("capacity learner: restored {n} node(s)"),
        Err(e) => log::warn!("capacity learner: starting fresh: {e}"),
    }
    match fleet.load_rates() {
        Ok(0) => {}
        Ok(n) => log::info!("learned rates: restored {n} node:model pair(s)"),
        Err(e) => log::warn!("learned rates: starting from priors: {e}"),
    }
    let access_log =
        AccessLog::open(config.access_log.target.as_ref()).map_err(StartError::AccessLog)?;
    crate::metrics::register_nodes(config.nodes.iter().map(|n| n.id.as_str()));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;
    rt.block_on(HealthPoller::new(fleet.clone()).poll_all());
    drop(rt);

    let conf = ServerConf {
        threads: config.threads,
        // `false` measured faster at c=1 (benches/README.md, stop 21) but is not the default:
        // a gateway started after another in one process once spun in its accept loop.
        work_stealing: config.work_stealing,
        upgrade_sock: config.upgrade_sock.clone(),
        // `services::shutdown::Drain` ends what is left at the grace period; Pingora's own
        // (a plain sleep) is the backstop after it.
        grace_period_seconds: Some(config.grace_period_s + 2),
        graceful_shutdown_timeout_seconds: Some(5),
        ..ServerConf::default()
    };
    let opt = pingora::server::configuration::Opt {
        upgrade,
        ..Default::default()
    };
    let mut server = Server::new_with_opt_and_conf(Some(opt), conf);
    server.bootstrap();

    crate::clients::register_metrics();
    let ceiling = crate::clients::connection_ceiling();
    fleet.clients.set_ceiling(ceiling);
    if ceiling < config.clients.max_connections {
        log::warn!(
            "clients.max_connections {} lowered to {ceiling}: the open-files limit leaves room for no more",
            config.clients.max_connections
        );
    }
    let nodes = pingora_core::connectors::http::v1::Connector::new(Some(
        pingora_core::connectors::ConnectorOptions::from_server_conf(&server.configuration),
    ));
    let app = http_proxy(
        &server.configuration,
        Gateway::new(fleet.clone(), access_log, nodes),
    );
    let mut proxy = Service::new("fleetgate".into(), Guarded::new(app, fleet.clone()));
    proxy.add_listener(
        ListenerConfig::tcp(config.listen.to_string())
            .l4_buffer(L4BufferSettings::default().read(CLIENT_READ_BUFFER)),
    );
    server.add_service(proxy);

    server.add_service(background_service(
        "health poller",
        HealthPoller::new(fleet.clone()),
    ));
    server.add_service(background_service(
        "start-up settle",
        crate::services::settle::Settle::new(fleet.clone()),
    ));
    server.add_service(background_service(
        "fleet clock",
        FleetClock::new(fleet.clone()),
    ));
    if let Some(dir) = config.learning.state_dir.clone() {
        server.add_service(background_service(
            "capacity learner",
            LearnerSaver::new(fleet.clone(), dir),
        ));
    }
    server.add_service(background_service(
        "first measurement",
        crate::services::measure::Measure::new(fleet.clone()),
    ));
    server.add_service(background_service("pre-warm", Prewarm::new(fleet.clone())));
    server.add_service(background_service(
        "rebalance",
        Rebalance::new(fleet.clone()),
    ));
    server.add_service(background_service(
        "reload on SIGHUP",
        crate::services::reload::ReloadOnHangup::new(fleet.clone()),
    ));

    let admin = if upgrade {
        AdminService::when_free(fleet.clone(), config.admin_listen)
    } else {
        let l = TcpListener::bind(config.admin_listen).map_err(|source| StartError::AdminBind {
            addr: config.admin_listen.to_string(),
            source,
        })?;
        AdminService::new(fleet.clone(), l)
    };
    let admin_addr = admin.addr().map_err(StartError::Runtime)?;
    fleet.clients.set_listeners(vec![config.listen, admin_addr]);
    server.add_service(background_service("admin", admin));

    Ok(Prepared {
        server,
        fleet,
        admin_addr,
    })
}

/// Start the simulated nodes described in the config on their own runtime thread; they live
/// as long as the process.
fn start_sim_nodes(config: &Config) -> Result<(), StartError> {
    let specs: Vec<_> = config
        .nodes
        .iter()
        .filter(|n| n.backend == Backend::Sim)
        .filter_map(|n| n.sim.clone().map(|s| (n.id.clone(), n.addr, s)))
        .collect();
    if specs.is_empty() {
        return Ok(());
    }
    let mut listeners = Vec::new();
    for (id, addr, spec) in specs {
        let l = TcpListener::bind(addr).map_err(|source| StartError::Sim {
            id: id.clone(),
            addr: addr.to_string(),
            source,
        })?;
        listeners.push((spec, l));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sim")
        .enable_all()
        .build()
        .map_err(StartError::Runtime)?;
    std::thread::spawn(move || {
        rt.block_on(async move {
            let mut handles = Vec::new();
            for (spec, l) in listeners {
                match crate::sim::start(spec, l).await {
                    Ok(h) => handles.push(h),
                    Err(e) => log::error!("sim node: {e}"),
                }
            }
            std::future::pending::<()>().await;
            drop(handles);
        });
    });
    Ok(())
}

/// A gateway serving on its own thread, for tests, benches and embedding; stops when dropped.
pub struct Running {
    /// The client-facing listener (`server.listen`).
    pub addr: std::net::SocketAddr,
    pub admin_addr: std::net::SocketAddr,
    pub fleet: Arc<Fleet>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Pingora's shutdown signal, from a oneshot instead of Unix signals.
struct StopSignal(parking_lot::Mutex<Option<tokio::sync::oneshot::Receiver<()>>>);

#[async_trait::async_trait]
impl pingora::server::ShutdownSignalWatch for StopSignal {
    async fn recv(&self) -> pingora::server::ShutdownSignal {
        let rx = self.0.lock().take();
        if let Some(rx) = rx {
            let _ = rx.await;
        }
        pingora::server::ShutdownSignal::FastShutdown
    }
}

impl Prepared {
    /// Run the server on a thread; returns once the listener accepts connections and has
    /// closed the probe it was tested with (or after 10 s, with the error of the last attempt).
    pub fn spawn(self, listen: std::net::SocketAddr) -> std::io::Result<Running> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let server = self.server;
        let thread = std::thread::spawn(move || {
            server.run(pingora::server::RunArgs {
                shutdown_signal: Box::new(StopSignal(parking_lot::Mutex::new(Some(rx)))),
            })
        });
        let running = Running {
            addr: listen,
            admin_addr: self.admin_addr,
            fleet: self.fleet,
            stop: Some(tx),
            thread: Some(thread),
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match std::net::TcpStream::connect(listen) {
                Ok(probe) => {
                    // The kernel completes the handshake before the server accepts: wait for
                    // the server to close the probe, so it holds no connection slot after
                    // `spawn` returns (a `max_connections: 3` gateway then takes three).
                    use std::io::Read;
                    let _ = probe.shutdown(std::net::Shutdown::Write);
                    let _ = probe.set_read_timeout(Some(std::time::Duration::from_secs(2)));
                    let _ = (&probe).read(&mut [0u8; 256]);
                    return Ok(running);
                }
                Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
    }
}

impl Running {
    /// Stop the server and wait for its thread.
    pub fn stop(mut self) {
        self.signal_stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    fn signal_stop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.signal_stop();
    }
}
