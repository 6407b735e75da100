//! Structured access log: one JSON line per routed request, written by its own thread so the
//! proxy never waits on a disk; when the writer falls behind, lines are dropped and counted
//! (`fleetgate_access_log_dropped_total`). Never holds API keys or prompts: the tenant is a
//! digest of the key (`intake::tenant`), and only sizes of bodies are logged.

use std::fs::OpenOptions;
use std::io::{self, BufWriter, Write};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pingora::http::RequestHeader;
use serde::Serialize;

use super::dispatch::{Attempts, Dispatch};
use crate::config::AccessLogTarget;
use crate::metrics::METRICS;
use crate::protocol::ErrorCode;

/// Lines buffered between the proxy and the writer thread; beyond this, lines are dropped.
pub const BUFFER_LINES: usize = 8192;

/// The log handle the proxy holds; a disabled log costs one branch per request.
#[derive(Clone, Default)]
pub struct AccessLog {
    tx: Option<SyncSender<Vec<u8>>>,
}

impl AccessLog {
    /// Open the target (a file is created or appended to) and start the writer thread.
    pub fn open(target: Option<&AccessLogTarget>) -> io::Result<AccessLog> {
        let Some(target) = target else {
            return Ok(AccessLog::default());
        };
        let out: Box<dyn Write + Send> = match target {
            AccessLogTarget::Stdout => Box::new(io::stdout()),
            AccessLogTarget::File(path) => Box::new(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?,
            ),
        };
        let (tx, rx) = sync_channel(BUFFER_LINES);
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || write_lines(rx, out))?;
        Ok(AccessLog { tx: Some(tx) })
    }

    pub fn enabled(&self) -> bool {
        self.tx.is_some()
    }

    /// Hand one entry to the writer; never blocks. The entry is only built when the log is
    /// on (it is off by default, and the timestamp alone was ~2 % of a request's CPU).
    pub fn write<'a>(&self, entry: impl FnOnce() -> Entry<'a>) {
        let Some(tx) = &self.tx else { return };
        let Ok(mut line) = serde_json::to_vec(&entry()) else {
            return;
        };
        line.push(b'\n');
        let reason = match tx.try_send(line) {
            Ok(()) => return,
            Err(TrySendError::Full(_)) => "full",
            Err(TrySendError::Disconnected(_)) => "write_error",
        };
        METRICS
            .access_log_dropped
            .with_label_values(&[reason])
            .inc();
    }
}

/// Write lines as they come, flushing whenever the queue is momentarily empty.
fn write_lines(rx: Receiver<Vec<u8>>, out: Box<dyn Write + Send>) {
    let mut out = BufWriter::new(out);
    let write = |out: &mut BufWriter<_>, line: Vec<u8>| {
        if out.write_all(&line).is_err() {
            METRICS
                .access_log_dropped
                .with_label_values(&["write_error"])
                .inc();
        }
    };
    while let Ok(line) = rx.recv() {
        write(&mut out, line);
        while let Ok(line) = rx.try_recv() {
            write(&mut out, line);
        }
        let _ = out.flush();
    }
}

/// What the log knows about a request from its arrival, filled in as intake goes.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub arrived: SystemTime,
    pub started: Instant,
    pub tenant: String,
    /// `Endpoint::label()`, or "-" for a path no protocol owns.
    pub protocol: &'static str,
    /// The model the client asked for ("-" until the body parsed).
    pub requested_model: String,
    pub bytes_in: usize,
}

impl Arrival {
    pub fn new(h: &RequestHeader) -> Arrival {
        Arrival {
            arrived: SystemTime::now(),
            started: Instant::now(),
            tenant: super::intake::tenant(h),
            protocol: "-",
            requested_model: "-".into(),
            bytes_in: 0,
        }
    }

    /// The line for an error the gateway answered itself.
    pub fn local(&self, code: ErrorCode, bytes_out: usize) -> Entry<'_> {
        Entry {
            ts: rfc3339_ms(self.arrived),
            protocol: self.protocol,
            requested_model: &self.requested_model,
            served_model: "-",
            node: "-",
            score: None,
            fallback: false,
            retries: 0,
            queue_wait_ms: 0.0,
            ttft_ms: None,
            total_ms: ms(self.started.elapsed()),
            status: code.status(),
            error: Some(code.as_str()),
            tenant: &self.tenant,
            bytes_in: self.bytes_in,
            bytes_out,
        }
    }

    /// The line for a request that was routed to a node; `total` is what the latency
    /// histogram observed.
    pub fn routed<'a>(&'a self, d: &'a Dispatch, st: &Attempts, total: Duration) -> Entry<'a> {
        let c = &d.ranked[st.current];
        let status = st.status.unwrap_or(502);
        Entry {
            ts: rfc3339_ms(self.arrived),
            protocol: self.protocol,
            requested_model: &self.requested_model,
            served_model: &c.model,
            node: &c.node_id,
            score: Some((c.score * 100.0).round() / 100.0),
            fallback: c.fallback,
            retries: st.retries,
            queue_wait_ms: ms(d.queue_wait),
            ttft_ms: st.first_byte.map(|t| ms(t.duration_since(d.started))),
            total_ms: ms(total),
            status,
            error: st.code.map(ErrorCode::as_str),
            tenant: &self.tenant,
            bytes_in: self.bytes_in,
            bytes_out: st.body_bytes,
        }
    }
}

/// One access-log line. Field order is the JSON key order.
#[derive(Debug, Serialize)]
pub struct Entry<'a> {
    /// Arrival time, RFC 3339 UTC with milliseconds.
    pub ts: String,
    pub protocol: &'a str,
    pub requested_model: &'a str,
    pub served_model: &'a str,
    pub node: &'a str,
    pub score: Option<f64>,
    pub fallback: bool,
    pub retries: u32,
    pub queue_wait_ms: f64,
    pub ttft_ms: Option<f64>,
    pub total_ms: f64,
    pub status: u16,
    /// The stable error code when the gateway answered with an error.
    pub error: Option<&'a str>,
    /// `intake::tenant`: a digest of the API key (`key-` + 12 hex digits), or "anonymous".
    pub tenant: &'a str,
    pub bytes_in: usize,
    pub bytes_out: usize,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

/// `2024-05-01T12:34:56.789Z`.
pub fn rfc3339_ms(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let t = |s: u64, ms: u64| {
            rfc3339_ms(UNIX_EPOCH + Duration::from_secs(s) + Duration::from_millis(ms))
        };
        assert_eq!(t(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(t(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(t(1_709_251_199, 999), "2024-02-29T23:59:59.999Z");
        assert_eq!(t(4_102_444_800, 0), "2100-01-01T00:00:00.000Z");
    }
}
