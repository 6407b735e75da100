//! Drive `wrk` (Debian's) with a POST body and read its summary: requests, rps, p50/p99.

use std::path::Path;
use std::process::Command;

/// What one wrk run reported.
#[derive(Default, Clone, Copy, Debug)]
pub struct Run {
    pub requests: u64,
    pub rps: f64,
    /// Latency percentiles in µs.
    pub p50: f64,
    pub p99: f64,
    /// Non-2xx answers plus socket errors (connect, read, write, timeout).
    pub errors: u64,
}

/// Write the Lua script that makes wrk POST `body` as JSON.
pub fn script(dir: &Path, name: &str, body: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.lua"));
    let lua = format!(
        "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = [==[{body}]==]\n"
    );
    std::fs::write(&path, lua).expect("write wrk script");
    path
}

/// Run wrk against `url` with `conns` connections for `secs` seconds.
pub fn run(url: &str, script: &Path, conns: usize, secs: u32) -> Result<Run, String> {
    let threads = conns.clamp(1, 2);
    let out = Command::new("wrk")
        .args([
            "-t",
            &threads.to_string(),
            "-c",
            &conns.to_string(),
            "-d",
            &format!("{secs}s"),
            "--timeout",
            "10s",
            "--latency",
            "-s",
        ])
        .arg(script)
        .arg(url)
        .output()
        .map_err(|e| format!("wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "wrk failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    parse(&text).ok_or_else(|| format!("cannot read wrk output:\n{text}"))
}

/// "123.45us" / "1.20ms" / "2.00s" in µs.
fn duration_us(s: &str) -> Option<f64> {
    let (num, mul) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|v| v * mul)
}

fn parse(text: &str) -> Option<Run> {
    let mut run = Run::default();
    let mut seen = (false, false, false);
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["50%", v] => {
                run.p50 = duration_us(v)?;
                seen.0 = true;
            }
            ["99%", v] => {
                run.p99 = duration_us(v)?;
                seen.1 = true;
            }
            ["Requests/sec:", v] => run.rps = v.parse().ok()?,
            [n, "requests", "in", ..] => {
                run.requests = n.parse().ok()?;
                seen.2 = true;
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => run.errors += n.parse::<u64>().ok()?,
            ["Socket", "errors:", rest @ ..] => {
                run.errors += rest
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>();
            }
            _ => {}
        }
    }
    (seen.0 && seen.1 && seen.2).then_some(run)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_wrk_summary() {
        let text = "Running 2s test @ http://127.0.0.1:1/\n  1 threads and 1 connections\n  Latency Distribution\n     50%   81.00us\n     75%  100.00us\n     90%    1.20ms\n     99%    2.50ms\n  15000 requests in 2.00s, 3.00MB read\n  Socket errors: connect 0, read 1, write 0, timeout 2\n  Non-2xx or 3xx responses: 4\nRequests/sec:   7499.50\n";
        let r = super::parse(text).unwrap();
        assert_eq!(r.requests, 15000);
        assert_eq!(r.p50, 81.0);
        assert_eq!(r.p99, 2500.0);
        assert_eq!(r.errors, 7);
        assert_eq!(r.rps, 7499.5);
    }
}
