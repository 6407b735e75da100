//! Peak memory of a fresh fleetgate holding N concurrent open streams (first chunk received,
//! the node holding the rest), then every stream released and read to its end.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};

use crate::common;
use crate::node::{Node, HOLD_MODEL};
use crate::procs::Proxy;

async fn read_until(s: &mut TcpStream, buf: &mut Vec<u8>, needle: &[u8]) -> bool {
    let mut chunk = [0u8; 4096];
    loop {
        if buf.windows(needle.len()).any(|w| w == needle) {
            return true;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// One client stream: open it and read the first chunk (then count it open), wait for `go`,
/// read to `[DONE]`.
async fn one(
    port: u16,
    req: Arc<Vec<u8>>,
    gate: Arc<Semaphore>,
    opened: Arc<AtomicUsize>,
    mut go: watch::Receiver<bool>,
) -> bool {
    let mut buf = Vec::new();
    let mut s = {
        let _permit = gate.acquire().await;
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await else {
            return false;
        };
        if s.write_all(&req).await.is_err() || !read_until(&mut s, &mut buf, b"data: ").await {
            return false;
        }
        s
    };
    opened.fetch_add(1, Ordering::Relaxed);
    let _ = go.wait_for(|g| *g).await;
    read_until(&mut s, &mut buf, b"[DONE]").await
}

pub fn run(dir: &Path, node: &Node, n: usize) {
    node.hold();
    let port = common::free_port();
    // Seats for all of them: this phase measures memory per open stream, not admission.
    let seats = format!("      capacity: {n}\n      hard_cap: {n}\n");
    // And client connections for all of them (the default cap, 4096, refused the rest).
    let yaml = format!(
        "clients:\n  max_connections: {}\n{}",
        n + 64,
        crate::default_yaml(port, node.port, &seats)
    );
    let fg = Proxy::fleetgate(dir, port, &yaml, "streams", None);
    let body = crate::chat_body(1, true, HOLD_MODEL);
    let req = Arc::new(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    );
    let rt = common::runtime(2, "streams");
    let (go_tx, go_rx) = watch::channel(false);
    let gate = Arc::new(Semaphore::new(256));
    let opened = Arc::new(AtomicUsize::new(0));
    let rss_idle = fg.rss_mb().1;
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            rt.spawn(one(
                fg.port,
                req.clone(),
                gate.clone(),
                opened.clone(),
                go_rx.clone(),
            ))
        })
        .collect();
    let deadline = started + Duration::from_secs(180);
    let mut last = (0, Instant::now());
    while Instant::now() < deadline {
        let o = opened.load(Ordering::Relaxed);
        let finished = tasks.iter().filter(|t| t.is_finished()).count();
        if o + finished >= n {
            break;
        }
        if o != last.0 {
            last = (o, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(20) {
            break; // no progress for 20 s
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let open = opened.load(Ordering::Relaxed);
    let open_s = started.elapsed().as_secs_f64();
    let (_, rss_open) = fg.rss_mb();
    node.release();
    let _ = go_tx.send(true);
    let done = rt.block_on(async {
        let mut ok = 0;
        for t in tasks {
            if tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .is_ok_and(|r| r.unwrap_or(false))
            {
                ok += 1;
            }
        }
        ok
    });
    let (peak, _) = fg.rss_mb();
    println!(
        "\nopen streams through fleetgate (capacity {n}): {open}/{n} open after {open_s:.1} s, \
         {done}/{n} completed; RSS idle {rss_idle:.0} MB, with all open {rss_open:.0} MB, peak \
         (VmHWM) {peak:.0} MB; errors {}",
        n - done
    );
}
