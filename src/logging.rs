//! The process logger: `env_logger` (`RUST_LOG`, default `info`) behind a rate limit for the
//! errors and warnings of Pingora's own crates. Pingora logs one ERROR line per client
//! connection whose request head broke or timed out, so a hostile or flaky client could fill
//! the log at the rate it opens connections; past [`BURST`] such lines per target in a
//! [`WINDOW`], the rest are counted and reported in one line when the window ends.
//! fleetgate's own lines are never dropped.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use log::{Level, Log, Metadata, Record};
use parking_lot::Mutex;

/// Lines of one target let through per window.
pub const BURST: u32 = 20;
pub const WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Count {
    since: Instant,
    passed: u32,
    dropped: u64,
}

/// A logger that passes everything to `inner` except Pingora's errors and warnings past the
/// rate limit.
pub struct Limited<L> {
    inner: L,
    counts: Mutex<HashMap<String, Count>>,
}

impl<L: Log> Limited<L> {
    pub fn new(inner: L) -> Limited<L> {
        Limited {
            inner,
            counts: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `record` may be written now; ends the target's window when due (and says how
    /// many of its lines were dropped in it).
    fn admit(&self, record: &Record<'_>, now: Instant) -> bool {
        if record.level() > Level::Warn || !record.target().starts_with("pingora") {
            return true;
        }
        let mut counts = self.counts.lock();
        let c = counts.entry(record.target().to_string()).or_insert(Count {
            since: now,
            passed: 0,
            dropped: 0,
        });
        if now.duration_since(c.since) >= WINDOW {
            if c.dropped > 0 {
                self.inner.log(
                    &Record::builder()
                        .level(Level::Warn)
                        .target(record.target())
                        .args(format_args!(
                            "{} more lines like these from {} in the last {} s were not logged",
                            c.dropped,
                            record.target(),
                            now.duration_since(c.since).as_secs()
                        ))
                        .build(),
                );
            }
            *c = Count {
                since: now,
                passed: 0,
                dropped: 0,
            };
        }
        if c.passed < BURST {
            c.passed += 1;
            true
        } else {
            c.dropped += 1;
            false
        }
    }
}

impl<L: Log> Log for Limited<L> {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if self.inner.enabled(record.metadata()) && self.admit(record, Instant::now()) {
            self.inner.log(record);
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// Install the logger for the process (once, at start).
pub fn init() {
    let inner =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let max = inner.filter();
    if log::set_boxed_logger(Box::new(Limited::new(inner))).is_ok() {
        log::set_max_level(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[derive(Default, Clone)]
    struct Lines(Arc<Mutex<Vec<String>>>);

    impl Log for Lines {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &Record<'_>) {
            self.0
                .lock()
                .push(format!("{} {}", record.target(), record.args()));
        }
        fn flush(&self) {}
    }

    fn line(l: &Limited<Lines>, level: Level, target: &str, now: Instant) {
        let r = Record::builder()
            .level(level)
            .target(target)
            .args(format_args!("Fail to proxy"))
            .build();
        if l.admit(&r, now) {
            l.inner.log(&r);
        }
    }

    #[test]
    fn pingora_errors_are_limited_per_window_and_the_drop_is_reported() {
        let out = Lines::default();
        let l = Limited::new(out.clone());
        let t0 = Instant::now();
        for _ in 0..100 {
            line(&l, Level::Error, "pingora_proxy", t0);
            line(&l, Level::Error, "fleetgate::proxy", t0);
            line(&l, Level::Info, "pingora_core::server", t0);
        }
        let count = |prefix: &str| {
            out.0
                .lock()
                .iter()
                .filter(|s| s.starts_with(prefix))
                .count()
        };
        assert_eq!(count("pingora_proxy"), BURST as usize);
        assert_eq!(
            count("fleetgate::proxy"),
            100,
            "our own lines are never dropped"
        );
        assert_eq!(count("pingora_core::server"), 100, "info is not limited");
        // The next window reports the 80 dropped, then lets lines through again.
        line(&l, Level::Error, "pingora_proxy", t0 + WINDOW);
        let lines = out.0.lock().clone();
        assert!(
            lines
                .iter()
                .any(|s| s.contains("80 more lines like these from pingora_proxy")),
            "{lines:?}"
        );
        assert_eq!(count("pingora_proxy"), BURST as usize + 2);
    }
}
