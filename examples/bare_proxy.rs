//! The floor under fleetgate's hot path: a Pingora proxy that does nothing but forward to one
//! node (2 threads, Pingora's no-steal runtime; `BARE_STEAL=1` for work stealing). Run by the side-by-side bench as an extra gateway:
//! `FLEETGATE_BENCH_EXTRA=bare=target/release/examples/bare_proxy cargo bench --bench sidebyside`
//! (it reads `listen:` and the first node `url:` from the fleetgate config it is given).

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;
use pingora_proxy::{http_proxy_service, ProxyHttp, Session};

struct Bare {
    node: String,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();
    fn new_ctx(&self) {}
    async fn upstream_peer(&self, _s: &mut Session, _c: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.node.as_str(),
            false,
            String::new(),
        )))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let conf = args
        .iter()
        .position(|a| a == "--config")
        .map(|i| std::fs::read_to_string(&args[i + 1]).expect("config"))
        .expect("--config");
    let field = |name: &str| {
        conf.lines()
            .find_map(|l| l.trim().strip_prefix(name).map(|v| v.trim().to_string()))
            .expect(name)
    };
    let listen = field("listen:");
    let node = field("url:").trim_start_matches("http://").to_string();
    let work_stealing = std::env::var("BARE_STEAL").is_ok();
    let mut server = Server::new_with_opt_and_conf(
        None,
        ServerConf {
            threads: 2,
            work_stealing,
            ..ServerConf::default()
        },
    );
    server.bootstrap();
    let mut svc = http_proxy_service(&server.configuration, Bare { node });
    svc.add_tcp(&listen);
    server.add_service(svc);
    server.run_forever();
}
