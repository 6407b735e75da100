//! Host facts the backend cannot report, read from `/proc` and `/sys` under a root directory
//! (`/` normally; tests point it at a fake tree). Parsers are pure and tested on real samples.
//!
//! - memory: `/proc/meminfo` MemTotal / MemAvailable;
//! - pressure: `/proc/pressure/memory` (Linux PSI): `full avg10 >= 10` is critical,
//!   `some avg10 >= 10` is warn; without PSI, MemAvailable below 5 % of total is critical and
//!   below 10 % warn;
//! - CPU: `/proc/stat` busy share between two samples;
//! - thermal: throttled when a thermal zone is at or above its lowest `passive` trip point, or
//!   a `Processor` cooling device is engaged (`cur_state > 0`).

use std::path::{Path, PathBuf};

use crate::routing::Pressure;

const KB: f64 = 1024.0;
const GB: f64 = 1e9;

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Memory {
    pub total_gb: f64,
    pub available_gb: f64,
}

/// `/proc/meminfo` -> total and available, GB.
pub fn parse_meminfo(text: &str) -> Option<Memory> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim_start_matches(':').split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .map(|kb| kb * KB / GB)
    };
    Some(Memory {
        total_gb: field("MemTotal")?,
        available_gb: field("MemAvailable").or_else(|| field("MemFree"))?,
    })
}

/// `/proc/pressure/memory` -> pressure level.
pub fn parse_psi(text: &str) -> Option<Pressure> {
    let avg10 = |kind: &str| {
        text.lines()
            .find(|l| l.starts_with(kind))
            .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("avg10=")))
            .and_then(|v| v.parse::<f64>().ok())
    };
    let some = avg10("some")?;
    let full = avg10("full").unwrap_or(0.0);
    Some(if full >= 10.0 {
        Pressure::Critical
    } else if some >= 10.0 {
        Pressure::Warn
    } else {
        Pressure::Normal
    })
}

/// Pressure from free memory alone (no PSI).
pub fn pressure_from_memory(m: Memory) -> Pressure {
    let share = if m.total_gb > 0.0 {
        m.available_gb / m.total_gb
    } else {
        1.0
    };
    if share < 0.05 {
        Pressure::Critical
    } else if share < 0.10 {
        Pressure::Warn
    } else {
        Pressure::Normal
    }
}

/// (busy, total) jiffies from the `cpu ` line of `/proc/stat`.
pub fn parse_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest is already in user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// CPU utilisation between two `/proc/stat` samples, percent.
pub fn cpu_percent(before: (u64, u64), after: (u64, u64)) -> Option<f64> {
    let busy = after.0.checked_sub(before.0)?;
    let total = after.1.checked_sub(before.1)?;
    (total > 0).then(|| busy as f64 * 100.0 / total as f64)
}

/// Reads the host under `root`.
#[derive(Debug, Clone)]
pub struct Host {
    root: PathBuf,
}

impl Host {
    pub fn new(root: impl Into<PathBuf>) -> Host {
        Host { root: root.into() }
    }

    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.root.join(rel)).ok()
    }

    pub fn memory(&self) -> Option<Memory> {
        parse_meminfo(&self.read("proc/meminfo")?)
    }

    pub fn pressure(&self, mem: Option<Memory>) -> Pressure {
        self.read("proc/pressure/memory")
            .and_then(|t| parse_psi(&t))
            .or_else(|| mem.map(pressure_from_memory))
            .unwrap_or_default()
    }

    pub fn cpu_sample(&self) -> Option<(u64, u64)> {
        parse_stat(&self.read("proc/stat")?)
    }

    pub fn thermal_throttled(&self) -> bool {
        let dir = self.root.join("sys/class/thermal");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return false;
        };
        entries.flatten().any(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let p = e.path();
            if name.starts_with("thermal_zone") {
                zone_throttled(&p)
            } else if name.starts_with("cooling_device") {
                let ty = read_trim(&p.join("type")).unwrap_or_default();
                let state: u64 = read_trim(&p.join("cur_state"))
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                ty == "Processor" && state > 0
            } else {
                false
            }
        })
    }
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
}

/// A zone at or above its lowest passive trip point.
fn zone_throttled(zone: &Path) -> bool {
    let Some(temp) = read_trim(&zone.join("temp")).and_then(|t| t.parse::<i64>().ok()) else {
        return false;
    };
    let passive = (0..16)
        .filter(|i| {
            read_trim(&zone.join(format!("trip_point_{i}_type"))).as_deref() == Some("passive")
        })
        .filter_map(|i| {
            read_trim(&zone.join(format!("trip_point_{i}_temp")))
                .and_then(|t| t.parse::<i64>().ok())
        })
        .filter(|t| *t > 0)
        .min();
    passive.is_some_and(|trip| temp >= trip)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const MEMINFO: &str = "MemTotal:       32768000 kB\nMemFree:         1000000 kB\nMemAvailable:   16384000 kB\nBuffers:          100 kB\n";
    pub(crate) const PSI_NORMAL: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=12345\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=2345\n";
    pub(crate) const PSI_CRITICAL: &str = "some avg10=62.10 avg60=40.00 avg300=10.00 total=99999999\nfull avg10=35.50 avg60=20.00 avg300=5.00 total=8888888\n";

    #[test]
    fn meminfo_and_psi() {
        let m = parse_meminfo(MEMINFO).unwrap();
        assert!((m.total_gb - 33.554432).abs() < 1e-6);
        assert!((m.available_gb - 16.777216).abs() < 1e-6);
        assert_eq!(parse_psi(PSI_NORMAL), Some(Pressure::Normal));
        assert_eq!(parse_psi(PSI_CRITICAL), Some(Pressure::Critical));
        assert_eq!(
            parse_psi("some avg10=12.00 avg60=1 avg300=1 total=1\nfull avg10=0.50 avg60=0 avg300=0 total=1\n"),
            Some(Pressure::Warn)
        );
        assert_eq!(parse_psi("garbage"), None);
        let low = Memory {
            total_gb: 100.0,
            available_gb: 4.0,
        };
        assert_eq!(pressure_from_memory(low), Pressure::Critical);
    }

    #[test]
    fn cpu_between_samples() {
        let a = parse_stat("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n").unwrap();
        let b = parse_stat("cpu  250 0 150 800 100 0 0 0 0 0\n").unwrap();
        assert_eq!(a, (200, 1000));
        assert_eq!(cpu_percent(a, b), Some(200.0 * 100.0 / 300.0));
        assert_eq!(cpu_percent(b, a), None);
    }

    /// A fake `/proc` + `/sys` tree.
    pub(crate) fn fake_root(name: &str, psi: &str, zone_temp: i64) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("fleetgate-host-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("proc/pressure")).unwrap();
        std::fs::write(root.join("proc/meminfo"), MEMINFO).unwrap();
        std::fs::write(root.join("proc/pressure/memory"), psi).unwrap();
        std::fs::write(root.join("proc/stat"), "cpu  100 0 100 700 100 0 0 0\n").unwrap();
        let z = root.join("sys/class/thermal/thermal_zone0");
        std::fs::create_dir_all(&z).unwrap();
        std::fs::write(z.join("temp"), format!("{zone_temp}\n")).unwrap();
        std::fs::write(z.join("trip_point_0_type"), "critical\n").unwrap();
        std::fs::write(z.join("trip_point_0_temp"), "105000\n").unwrap();
        std::fs::write(z.join("trip_point_1_type"), "passive\n").unwrap();
        std::fs::write(z.join("trip_point_1_temp"), "95000\n").unwrap();
        root
    }

    #[test]
    fn reads_a_tree() {
        let cool = Host::new(fake_root("cool", PSI_NORMAL, 45_000));
        let mem = cool.memory();
        assert!(mem.is_some());
        assert_eq!(cool.pressure(mem), Pressure::Normal);
        assert!(!cool.thermal_throttled());
        assert_eq!(cool.cpu_sample(), Some((200, 1000)));
        let hot = Host::new(fake_root("hot", PSI_CRITICAL, 96_000));
        assert_eq!(hot.pressure(hot.memory()), Pressure::Critical);
        assert!(hot.thermal_throttled());
        let none = Host::new("/nonexistent-root");
        assert_eq!(none.pressure(None), Pressure::Normal);
        assert!(!none.thermal_throttled());
    }
}
