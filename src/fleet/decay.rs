//! Time-decayed means and weighted least-squares lines, the building blocks of the learned
//! rates (`rates.rs`): an observation `dt` after the previous one weighs
//! `alpha = max(1 - exp(-dt / DECAY_S), ALPHA_MIN)` against all before it.

use serde::{Deserialize, Serialize};

/// Time constant of the decay, seconds.
pub const DECAY_S: f64 = 10.0;
/// Least weight a new observation gets, however soon it follows the last.
pub const ALPHA_MIN: f64 = 0.1;
/// Prompts this long on average (tokens) are needed to read a prefill rate off TTFTs that do
/// not spread: below it, TTFT is taken as fixed overhead.
const MIN_ORIGIN_X: f64 = 256.0;

fn alpha(dt_ms: u64) -> f64 {
    let a = 1.0 - (-(dt_ms as f64) / 1000.0 / DECAY_S).exp();
    a.max(ALPHA_MIN)
}

pub(super) fn usable(x: f64) -> bool {
    x.is_finite() && x >= 0.0
}

/// A time-decayed mean.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub(super) struct Mean {
    value: f64,
    at_ms: u64,
    n: u32,
}

impl Mean {
    pub(super) fn add(&mut self, x: f64, now_ms: u64) {
        if !(x.is_finite() && x > 0.0) {
            return;
        }
        if self.n == 0 {
            self.value = x;
        } else {
            self.value += alpha(now_ms.saturating_sub(self.at_ms)) * (x - self.value);
        }
        self.at_ms = now_ms;
        self.n = self.n.saturating_add(1);
    }

    pub(super) fn get(&self) -> Option<f64> {
        (self.n > 0).then_some(self.value)
    }
}

/// Decayed sums for a weighted least-squares line.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub(super) struct Line {
    w: f64,
    sx: f64,
    sy: f64,
    sxx: f64,
    sxy: f64,
    /// For the residual (absent from state written before it: read as 0).
    #[serde(default)]
    syy: f64,
    at_ms: u64,
}

impl Line {
    pub(super) fn add(&mut self, x: f64, y: f64, now_ms: u64) {
        if !(usable(x) && usable(y)) {
            return;
        }
        let a = if self.w > 0.0 {
            alpha(now_ms.saturating_sub(self.at_ms))
        } else {
            1.0
        };
        let keep = 1.0 - a;
        self.w = keep * self.w + a;
        self.sx = keep * self.sx + a * x;
        self.sy = keep * self.sy + a * y;
        self.sxx = keep * self.sxx + a * x * x;
        self.sxy = keep * self.sxy + a * x * y;
        self.syy = keep * self.syy + a * y * y;
        self.at_ms = now_ms;
    }

    /// Weighted means of x and y, variance of x and covariance; `None` before any point.
    fn moments(&self) -> Option<Moments> {
        (self.w > 0.0).then(|| {
            let (mx, my) = (self.sx / self.w, self.sy / self.w);
            Moments {
                mx,
                my,
                var: self.sxx / self.w - mx * mx,
                cov: self.sxy / self.w - mx * my,
            }
        })
    }

    /// Weighted mean squared distance of the observations from the fitted line (`None`
    /// without spread along x): what tells two explanations of the same `y` apart.
    pub(super) fn residual(&self) -> Option<f64> {
        let m = self.moments()?;
        // A line written before `syy` was kept has none: no residual until it decays.
        let unknown = self.syy == 0.0 && self.sy != 0.0;
        let var_y = self.syy / self.w - m.my * m.my;
        (m.var > 0.0 && !unknown).then(|| (var_y - m.cov * m.cov / m.var).max(0.0))
    }

    /// The least-squares slope (0 without spread along x).
    pub(super) fn slope(&self) -> f64 {
        self.moments()
            .filter(|m| m.var > 0.0)
            .map_or(0.0, |m| m.cov / m.var)
    }

    /// (a, b) of `y = a + b x`, and whether the slope was read off observations that spread
    /// along x; `origin`: without spread, through the origin (else flat, the slope unknown).
    pub(super) fn fit(&self, min_spread: f64, origin: bool) -> Option<(f64, f64, bool)> {
        let Moments { mx, my, var, cov } = self.moments()?;
        let spread = if origin {
            var.sqrt() / mx.max(1e-9)
        } else {
            var
        };
        if spread >= min_spread && var > 0.0 {
            let b = cov / var;
            let a = my - b * mx;
            if b >= 0.0 && a >= 0.0 {
                return Some((a, b, true));
            }
        }
        if origin && mx >= MIN_ORIGIN_X {
            Some((0.0, my / mx, false))
        } else {
            // Flat: too few tokens to tell a rate from fixed overhead (the rate stays a prior).
            Some((my, 0.0, false))
        }
    }
}

struct Moments {
    mx: f64,
    my: f64,
    var: f64,
    cov: f64,
}
