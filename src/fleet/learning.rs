//! Capacity learning (spec 000, Adaptive Capacity): a node's own CPU and memory use per hour of
//! the week, learned from its agent's heartbeats, turned into an availability score and a
//! memory ceiling. Pure: time is an argument; persisted as JSON (see [`LearnerStore`]).
//!
//! Formulas (all inputs are fractions 0..=1):
//! - `baseline` = mean CPU use learned for this hour of the week (current CPU until learned);
//! - `current` = max(current CPU, owner's memory use) where the owner's memory is what is used
//!   beyond the backend's resident models;
//! - `trend` = 1 - (CPU slope over the last 5 minutes, points per minute, if rising) / 10,
//!   clamped to 0..=1: +10 points a minute or faster gives 0, flat or falling gives 1;
//! - `availability = 0.4 (1 - baseline) + 0.4 (1 - current) + 0.2 trend`;
//! - `ceiling_gb = total × clamp(1 - owner memory (max of learned and current) - 0.10, 1/8, 1)`,
//!   and `total / 8` in learned-low mode (availability below 0.5): a 128 GB laptop whose owner
//!   is at work on it gets 16 GB.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;

use super::statefile::StoreError;
use serde::{Deserialize, Serialize};

use crate::routing::Learning;

pub const HOURS_PER_WEEK: usize = 168;
const TREND_WINDOW_MS: u64 = 5 * 60 * 1000;
const CPU_HIGH_PERCENT: f64 = 85.0;
/// A bucket's mean moves like a running mean up to this many samples, then like an EWMA.
const MAX_WEIGHT: u32 = 2_000;
const LOW_MODE_AVAILABILITY: f64 = 0.5;
const MIN_CEILING_FRACTION: f64 = 0.125;
const CEILING_MARGIN: f64 = 0.10;
pub const STATE_FILE: &str = "capacity.json";

/// One heartbeat's worth of what the learner needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// 0..=100
    pub cpu_percent: f64,
    /// Memory used by the machine's owner (not the backend's models), fraction of total.
    pub owner_mem_fraction: f64,
    pub total_gb: f64,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
struct Bucket {
    mean: f64,
    n: u32,
}

impl Bucket {
    fn add(&mut self, x: f64) {
        self.n = self.n.saturating_add(1).min(MAX_WEIGHT);
        self.mean += (x - self.mean) / f64::from(self.n);
    }

    fn get(&self) -> Option<f64> {
        (self.n > 0).then_some(self.mean)
    }
}

/// The learned state of one node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Learner {
    first_seen_ms: Option<u64>,
    cpu: Vec<Bucket>,
    owner_mem: Vec<Bucket>,
    #[serde(skip)]
    recent: VecDeque<(u64, f64)>,
    #[serde(skip)]
    cpu_high_since_ms: Option<u64>,
    #[serde(skip)]
    last: Option<Sample>,
}

impl Default for Learner {
    fn default() -> Self {
        Learner {
            first_seen_ms: None,
            cpu: vec![Bucket::default(); HOURS_PER_WEEK],
            owner_mem: vec![Bucket::default(); HOURS_PER_WEEK],
            recent: VecDeque::new(),
            cpu_high_since_ms: None,
            last: None,
        }
    }
}

/// Hour of the week, Monday 00:00 UTC = 0.
pub fn hour_of_week(now_ms: u64) -> usize {
    let hours = now_ms / 3_600_000;
    let days = hours / 24;
    // 1970-01-01 was a Thursday (Monday-based weekday 3).
    (((days + 3) % 7) * 24 + hours % 24) as usize
}

fn clamp01(x: f64) -> f64 {
    if x.is_finite() {
        x.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

impl Learner {
    pub fn observe(&mut self, now_ms: u64, s: Sample) {
        let cpu = if s.cpu_percent.is_finite() {
            s.cpu_percent.clamp(0.0, 100.0)
        } else {
            0.0
        };
        let s = Sample {
            cpu_percent: cpu,
            owner_mem_fraction: clamp01(s.owner_mem_fraction),
            total_gb: s.total_gb,
        };
        self.first_seen_ms.get_or_insert(now_ms);
        let h = hour_of_week(now_ms);
        if self.cpu.len() != HOURS_PER_WEEK || self.owner_mem.len() != HOURS_PER_WEEK {
            self.cpu = vec![Bucket::default(); HOURS_PER_WEEK];
            self.owner_mem = vec![Bucket::default(); HOURS_PER_WEEK];
        }
        self.cpu[h].add(cpu / 100.0);
        self.owner_mem[h].add(s.owner_mem_fraction);
        self.recent.push_back((now_ms, cpu));
        while self
            .recent
            .front()
            .is_some_and(|(t, _)| now_ms.saturating_sub(*t) > TREND_WINDOW_MS)
        {
            self.recent.pop_front();
        }
        self.cpu_high_since_ms = if cpu > CPU_HIGH_PERCENT {
            self.cpu_high_since_ms.or(Some(now_ms))
        } else {
            None
        };
        self.last = Some(s);
    }

    /// CPU slope over the trend window, percentage points per minute (0 with under 2 samples).
    pub fn cpu_slope_per_min(&self) -> f64 {
        let n = self.recent.len();
        if n < 2 {
            return 0.0;
        }
        let t0 = self.recent[0].0;
        let pts: Vec<(f64, f64)> = self
            .recent
            .iter()
            .map(|(t, c)| ((t - t0) as f64 / 60_000.0, *c))
            .collect();
        let mx = pts.iter().map(|p| p.0).sum::<f64>() / n as f64;
        let my = pts.iter().map(|p| p.1).sum::<f64>() / n as f64;
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
        if sxx <= f64::EPSILON {
            return 0.0;
        }
        pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / sxx
    }

    /// What routing sees now.
    pub fn output(&self, now_ms: u64) -> Learning {
        let days_observed = self
            .first_seen_ms
            .map_or(0.0, |t| now_ms.saturating_sub(t) as f64 / 86_400_000.0);
        let cpu_high_for_s = self
            .cpu_high_since_ms
            .map_or(0, |t| now_ms.saturating_sub(t) / 1000);
        let Some(last) = self.last else {
            return Learning {
                availability: 0.0,
                ceiling_gb: None,
                cpu_high_for_s,
                days_observed,
            };
        };
        let h = hour_of_week(now_ms);
        let current_cpu = last.cpu_percent / 100.0;
        let baseline = self.cpu.get(h).and_then(Bucket::get).unwrap_or(current_cpu);
        let current = current_cpu.max(last.owner_mem_fraction);
        let slope = self.cpu_slope_per_min();
        let trend = clamp01(1.0 - slope.max(0.0) / 10.0);
        let availability = clamp01(0.4 * (1.0 - baseline) + 0.4 * (1.0 - current) + 0.2 * trend);
        let owner = self
            .owner_mem
            .get(h)
            .and_then(Bucket::get)
            .unwrap_or(0.0)
            .max(last.owner_mem_fraction);
        let fraction = if availability < LOW_MODE_AVAILABILITY {
            MIN_CEILING_FRACTION
        } else {
            (1.0 - owner - CEILING_MARGIN).clamp(MIN_CEILING_FRACTION, 1.0)
        };
        let ceiling_gb =
            (last.total_gb.is_finite() && last.total_gb > 0.0).then_some(last.total_gb * fraction);
        Learning {
            availability,
            ceiling_gb,
            cpu_high_for_s,
            days_observed,
        }
    }
}

/// Every learning node's state, as written to `<state_dir>/capacity.json`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LearnerStore {
    pub version: u32,
    pub nodes: BTreeMap<String, Learner>,
}

impl LearnerStore {
    /// Read the state file; a missing file is an empty store.
    pub fn load(dir: &Path) -> Result<LearnerStore, StoreError> {
        super::statefile::read(dir, STATE_FILE)
    }

    /// Write atomically.
    pub fn save(&self, dir: &Path) -> Result<(), StoreError> {
        let store = LearnerStore {
            version: 1,
            nodes: self.nodes.clone(),
        };
        super::statefile::write(dir, STATE_FILE, &store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;
    const HOUR: u64 = 60 * MIN;
    const DAY: u64 = 24 * HOUR;
    /// Monday 1970-01-05 00:00 UTC.
    const MONDAY: u64 = 4 * DAY;

    fn s(cpu: f64, owner: f64) -> Sample {
        Sample {
            cpu_percent: cpu,
            owner_mem_fraction: owner,
            total_gb: 128.0,
        }
    }

    #[test]
    fn hour_of_week_starts_monday() {
        assert_eq!(hour_of_week(MONDAY), 0);
        assert_eq!(hour_of_week(MONDAY + 9 * HOUR + 59 * MIN), 9);
        assert_eq!(hour_of_week(MONDAY + 6 * DAY + 23 * HOUR), 167);
        assert_eq!(hour_of_week(MONDAY + 7 * DAY), 0);
        assert_eq!(hour_of_week(0), 3 * 24, "epoch was a Thursday");
    }

    /// Two weeks of an office laptop: busy (70 % CPU, owner uses 60 % of RAM) weekdays 9-17,
    /// idle otherwise; one sample every 5 minutes.
    fn office_laptop() -> (Learner, u64) {
        let mut l = Learner::default();
        let mut t = MONDAY;
        let end = MONDAY + 14 * DAY;
        while t < end {
            let h = hour_of_week(t);
            let (day, hour) = (h / 24, h % 24);
            let busy = day < 5 && (9..17).contains(&hour);
            l.observe(t, if busy { s(70.0, 0.6) } else { s(3.0, 0.05) });
            t += 5 * MIN;
        }
        (l, end)
    }

    #[test]
    fn learns_the_owner_and_lowers_availability_and_ceiling_in_working_hours() {
        let (mut l, end) = office_laptop();
        // Week 3, Monday 03:00, idle now.
        let night = end + 3 * HOUR;
        l.observe(night, s(3.0, 0.05));
        let o = l.output(night);
        assert!(o.days_observed >= 14.0);
        assert!(o.availability > 0.85, "{o:?}");
        assert!(o.ceiling_gb.unwrap() > 100.0, "{o:?}");
        // Week 3, Monday 10:00: the owner has not sat down yet (idle now), but the baseline
        // for this hour is busy.
        let morning = end + 10 * HOUR;
        l.observe(morning, s(3.0, 0.05));
        let o = l.output(morning);
        assert!(o.availability < 0.75 && o.availability > 0.5, "{o:?}");
        let ceiling = o.ceiling_gb.unwrap();
        assert!(
            (35.0..45.0).contains(&ceiling),
            "128 x (1 - 0.6 - 0.1): {o:?}"
        );
    }

    #[test]
    fn rising_cpu_lowers_availability_and_low_mode_caps_the_ceiling() {
        let (mut l, end) = office_laptop();
        let t0 = end + 10 * HOUR;
        // The owner sits down: CPU climbs 5 -> 95 over five minutes.
        for i in 0..=10u64 {
            l.observe(t0 + i * 30_000, s(5.0 + 9.0 * i as f64, 0.6));
        }
        let now = t0 + 300_000;
        assert!(l.cpu_slope_per_min() > 15.0);
        let o = l.output(now);
        assert!(o.availability < 0.2, "{o:?}");
        assert_eq!(o.ceiling_gb, Some(16.0), "learned-low: 128 GB / 8");
        assert_eq!(o.cpu_high_for_s, 30, "above 85 % since the 10th sample");
    }

    #[test]
    fn cpu_high_duration_resets() {
        let mut l = Learner::default();
        for i in 0..5 {
            l.observe(i * 30_000, s(90.0, 0.1));
        }
        assert_eq!(l.output(150_000).cpu_high_for_s, 150);
        l.observe(150_000, s(50.0, 0.1));
        assert_eq!(l.output(150_000).cpu_high_for_s, 0);
    }

    #[test]
    fn fresh_learner_is_in_its_first_days() {
        let l = Learner::default();
        let o = l.output(1_000);
        assert_eq!(o.days_observed, 0.0);
        assert_eq!(o.availability, 0.0);
        let mut l = Learner::default();
        l.observe(0, s(f64::NAN, f64::INFINITY));
        let o = l.output(DAY);
        assert!((o.days_observed - 1.0).abs() < 1e-9);
        assert!(o.availability.is_finite());
    }

    #[test]
    fn store_round_trips_atomically() {
        let dir = std::env::temp_dir().join(format!("fleetgate-learn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(LearnerStore::load(&dir).unwrap(), LearnerStore::default());
        let (l, end) = office_laptop();
        let mut store = LearnerStore::default();
        store.nodes.insert("laptop".into(), l.clone());
        store.save(&dir).unwrap();
        assert!(!dir.join("capacity.json.tmp").exists());
        let back = LearnerStore::load(&dir).unwrap();
        let mut restored = back.nodes["laptop"].clone();
        // Baselines and first-seen survive; the last sample does not (a restart knows nothing
        // current until the next heartbeat).
        let t = end + 10 * HOUR;
        restored.observe(t, s(3.0, 0.05));
        let mut original = l;
        original.observe(t, s(3.0, 0.05));
        assert_eq!(
            restored.output(t).days_observed,
            original.output(t).days_observed
        );
        assert!((restored.output(t).availability - original.output(t).availability).abs() < 0.05);
        std::fs::write(dir.join(STATE_FILE), "not json").unwrap();
        assert!(matches!(
            LearnerStore::load(&dir),
            Err(StoreError::Format { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
