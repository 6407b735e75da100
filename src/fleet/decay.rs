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

pub(super) fn alpha(dt_ms: u64) -> f64 {
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
        if x > 0.0 {
            self.add_any(x, now_ms);
        }
    }

    /// As `add`, zero included (a figure that is often none at all).
    pub(super) fn add_any(&mut self, x: f64, now_ms: u64) {
        if !usable(x) {
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

    /// The weighted mean of y (`None` before any point).
    pub(super) fn mean_y(&self) -> Option<f64> {
        self.moments().map(|m| m.my)
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
            // `origin`: the best line whose intercept is not negative goes through the origin
            // (weighted least squares, y = b x): read off points that spread, so a rate, not a
            // floor. A true intercept near 0 (a backend's own prompt timing) comes out a hair
            // below it half the time.
            if origin && b >= 0.0 && self.sxx > 0.0 {
                let b0 = self.sxy / self.sxx;
                if b0 > 0.0 {
                    return Some((0.0, b0, true));
                }
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

/// Least observations (decayed or not) before a [`Plane`] is read.
const PLANE_MIN_N: u32 = 4;
/// Least coefficient of variation of an input for its slope to be read off the points.
const PLANE_MIN_SPREAD: f64 = 0.2;
/// Above this squared correlation the two inputs move together and the plane is not read
/// (their slopes cannot be told apart).
const PLANE_MAX_R2: f64 = 0.9;

/// Decayed sums for `y = a + b x1 + c x2`, fitted jointly: the time of a whole reply (neither
/// streamed nor timed by its backend) against its prompt and output tokens. It is all that
/// tells such a reply's prefill from its decode; splitting it in the proportion the priors
/// predict kept whatever error they had (identical nodes learned prefill rates 2x apart).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub(super) struct Plane {
    w: f64,
    s1: f64,
    s2: f64,
    sy: f64,
    s11: f64,
    s12: f64,
    s22: f64,
    s1y: f64,
    s2y: f64,
    n: u32,
    at_ms: u64,
}

impl Plane {
    pub(super) fn add(&mut self, x1: f64, x2: f64, y: f64, now_ms: u64) {
        if !(usable(x1) && usable(x2) && usable(y)) {
            return;
        }
        let a = if self.w > 0.0 {
            alpha(now_ms.saturating_sub(self.at_ms))
        } else {
            1.0
        };
        let k = 1.0 - a;
        self.w = k * self.w + a;
        self.s1 = k * self.s1 + a * x1;
        self.s2 = k * self.s2 + a * x2;
        self.sy = k * self.sy + a * y;
        self.s11 = k * self.s11 + a * x1 * x1;
        self.s12 = k * self.s12 + a * x1 * x2;
        self.s22 = k * self.s22 + a * x2 * x2;
        self.s1y = k * self.s1y + a * x1 * y;
        self.s2y = k * self.s2y + a * x2 * y;
        self.n = self.n.saturating_add(1);
        self.at_ms = now_ms;
    }

    /// `y` at (`x1`, `x2`) in two parts, the one that grows with `x1` and the one that grows
    /// with `x2`; the intercept goes with the input whose slope could not be read (with both,
    /// to `x1`'s part: a reply's fixed cost comes before its first token). `None` until the
    /// points spread along at least one input without the two moving together, or when a
    /// slope comes out negative.
    pub(super) fn split(&self, x1: f64, x2: f64) -> Option<(f64, f64)> {
        if self.n < PLANE_MIN_N || self.w <= 0.0 {
            return None;
        }
        let w = self.w;
        let (m1, m2, my) = (self.s1 / w, self.s2 / w, self.sy / w);
        let v1 = self.s11 / w - m1 * m1;
        let v2 = self.s22 / w - m2 * m2;
        let c12 = self.s12 / w - m1 * m2;
        let c1y = self.s1y / w - m1 * my;
        let c2y = self.s2y / w - m2 * my;
        let spread = |v: f64, m: f64| v > 0.0 && m > 0.0 && v.sqrt() / m >= PLANE_MIN_SPREAD;
        let (on1, on2) = (spread(v1, m1), spread(v2, m2));
        if on1 && on2 {
            let det = v1 * v2 - c12 * c12;
            if det > (1.0 - PLANE_MAX_R2) * v1 * v2 {
                let b = (c1y * v2 - c2y * c12) / det;
                let c = (c2y * v1 - c1y * c12) / det;
                if b > 0.0 && c > 0.0 {
                    let a = (my - b * m1 - c * m2).max(0.0);
                    return Some((a + b * x1, c * x2));
                }
            }
        }
        if on1 {
            let b = c1y / v1;
            let a = (my - b * m1).max(0.0);
            let at = if m2 > 0.0 { x2 / m2 } else { 1.0 };
            return (b > 0.0).then_some((b * x1, a * at));
        }
        if on2 {
            let c = c2y / v2;
            let a = (my - c * m2).max(0.0);
            let at = if m1 > 0.0 { x1 / m1 } else { 1.0 };
            return (c > 0.0).then_some((a * at, c * x2));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefill_line_whose_intercept_comes_out_below_zero_goes_through_the_origin_as_a_rate() {
        // Two prompts read at ~2,500 tokens/s with no fixed part (a backend's own prompt
        // timing), the short one 5 ms quicker than the rate says: unconstrained, the line's
        // intercept is -5 ms.
        let mut l = Line::default();
        l.add(300.0, 300.0 / 2_500.0 - 0.005, 1_000);
        l.add(1_200.0, 1_200.0 / 2_500.0, 1_010);
        let (a, b, spread) = l.fit(0.2, true).expect("points");
        assert_eq!(a, 0.0);
        assert!((1.0 / b - 2_500.0).abs() < 125.0, "rate {}", 1.0 / b);
        assert!(
            spread,
            "read off prompts of two lengths: a rate, not a floor"
        );
        // One prompt length: a floor through the origin, as before.
        let mut one = Line::default();
        one.add(300.0, 0.02 + 300.0 / 20_000.0, 1_000);
        let (_, _, spread) = one.fit(0.2, true).expect("a point");
        assert!(!spread);
    }
}
