//! Tenants: who a request belongs to (API key -> tenant, see `auth`), their limits (in flight,
//! queued, requests and tokens per minute: 429 with `Retry-After` and `x-ratelimit-*`), their
//! weight in the queues' fair order, and their usage (Prometheus and `/fleet/status`).

pub mod auth;
mod rate;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;

use crate::config::tenants::{Tenancy, TenantFile};
use crate::metrics::TENANT_METRICS;
pub use rate::Window;

/// Live state of one tenant.
#[derive(Debug, Default)]
pub struct TenantState {
    pub id: Arc<str>,
    in_flight: AtomicU32,
    queued: AtomicU32,
    windows: Mutex<(Window, Window)>,
    requests: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    errors: AtomicU64,
    rejected: AtomicU64,
}

/// Every tenant seen by this gateway (bounded: ids come from config, or `default`).
#[derive(Debug, Default)]
pub struct Book {
    tenants: Mutex<HashMap<String, Arc<TenantState>>>,
}

/// A refused request: which limit, when to come back, and the headers that say so.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub limit: &'static str,
    pub message: String,
    pub retry_after_s: u64,
    pub headers: Vec<(&'static str, String)>,
}

/// An admitted request; dropping it ends the request for the tenant's in-flight count.
#[derive(Debug)]
pub struct Pass {
    pub state: Arc<TenantState>,
    pub limits: TenantFile,
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
        TENANT_METRICS
            .in_flight
            .with_label_values(&[&self.state.id])
            .dec();
    }
}

/// Counts the request as waiting for a seat while held.
#[derive(Debug)]
pub struct Queued(Arc<TenantState>);

impl Drop for Queued {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What `/fleet/status` shows of a tenant.
#[derive(Debug, Clone, Serialize)]
pub struct TenantStatus {
    pub tenant: String,
    pub weight: f64,
    pub in_flight: u32,
    pub queued: u32,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub errors: u64,
    pub rejected: u64,
    pub requests_last_min: u64,
    pub tokens_last_min: u64,
    pub limits: TenantLimits,
}

#[derive(Debug, Clone, Serialize)]
pub struct TenantLimits {
    pub max_in_flight: Option<u32>,
    pub max_queued: Option<u32>,
    pub requests_per_min: Option<u32>,
    pub tokens_per_min: Option<u64>,
}

impl Book {
    pub fn state(&self, tenant: &str) -> Arc<TenantState> {
        let mut map = self.tenants.lock();
        if let Some(s) = map.get(tenant) {
            return s.clone();
        }
        crate::metrics::register_tenant(tenant);
        let s = Arc::new(TenantState {
            id: Arc::from(tenant),
            ..TenantState::default()
        });
        map.insert(tenant.to_string(), s.clone());
        s
    }

    /// Admit a request of `tokens` estimated tokens (prompt + output) at `now_ms`, or say which
    /// limit refuses it.
    pub fn admit(
        &self,
        tenancy: &Tenancy,
        tenant: &str,
        tokens: u64,
        now_ms: u64,
    ) -> Result<Pass, Refusal> {
        let state = self.state(tenant);
        let limits = tenancy.limits(tenant);
        let now_s = now_ms / 1000;
        let refuse = |limit: &'static str, message: String, retry: u64, headers| {
            state.rejected.fetch_add(1, Ordering::Relaxed);
            TENANT_METRICS
                .rejections
                .with_label_values(&[tenant, limit])
                .inc();
            Refusal {
                limit,
                message,
                retry_after_s: retry.max(1),
                headers,
            }
        };
        let mut windows = state.windows.lock();
        let (reqs, toks) = &mut *windows;
        let headers = ratelimit_headers(&limits, reqs, toks, now_s, tokens);
        if let Some(limit) = limits.requests_per_min {
            if let Some(wait) = reqs.wait_for(now_s, 1, u64::from(limit)) {
                let msg = format!("tenant '{tenant}' is over its limit of {limit} requests per minute; retry in {wait} s");
                return Err(refuse("requests_per_min", msg, wait, headers));
            }
        }
        if let Some(limit) = limits.tokens_per_min {
            if let Some(wait) = toks.wait_for(now_s, tokens, limit) {
                let msg = format!("tenant '{tenant}' is over its limit of {limit} tokens per minute (this request: about {tokens}); retry in {wait} s");
                return Err(refuse("tokens_per_min", msg, wait, headers));
            }
        }
        let in_flight = state.in_flight.fetch_add(1, Ordering::Relaxed);
        if let Some(max) = limits.max_in_flight {
            if in_flight >= max {
                state.in_flight.fetch_sub(1, Ordering::Relaxed);
                let msg =
                    format!("tenant '{tenant}' already has {max} requests in flight (its limit)");
                return Err(refuse("in_flight", msg, 1, headers));
            }
        }
        reqs.add(now_s, 1);
        toks.add(now_s, tokens);
        drop(windows);
        state.requests.fetch_add(1, Ordering::Relaxed);
        TENANT_METRICS.in_flight.with_label_values(&[tenant]).inc();
        Ok(Pass { state, limits })
    }

    pub fn status(&self, tenancy: &Tenancy, now_ms: u64) -> Vec<TenantStatus> {
        let mut names: Vec<String> = tenancy.tenants.keys().cloned().collect();
        names.extend(self.tenants.lock().keys().cloned());
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|name| {
                let s = self.state(&name);
                let l = tenancy.limits(&name);
                let (reqs, toks) = {
                    let w = s.windows.lock();
                    (w.0.total(now_ms / 1000), w.1.total(now_ms / 1000))
                };
                TenantStatus {
                    tenant: name,
                    weight: l.weight,
                    in_flight: s.in_flight.load(Ordering::Relaxed),
                    queued: s.queued.load(Ordering::Relaxed),
                    requests: s.requests.load(Ordering::Relaxed),
                    prompt_tokens: s.prompt_tokens.load(Ordering::Relaxed),
                    completion_tokens: s.completion_tokens.load(Ordering::Relaxed),
                    errors: s.errors.load(Ordering::Relaxed),
                    rejected: s.rejected.load(Ordering::Relaxed),
                    requests_last_min: reqs,
                    tokens_last_min: toks,
                    limits: TenantLimits {
                        max_in_flight: l.max_in_flight,
                        max_queued: l.max_queued,
                        requests_per_min: l.requests_per_min,
                        tokens_per_min: l.tokens_per_min,
                    },
                }
            })
            .collect()
    }
}

impl Pass {
    pub fn tenant(&self) -> &Arc<str> {
        &self.state.id
    }

    /// The request is about to wait for a seat: refused past the tenant's `max_queued`.
    pub fn queue(&self) -> Result<Queued, Refusal> {
        let n = self.state.queued.fetch_add(1, Ordering::Relaxed);
        let queued = Queued(self.state.clone());
        if let Some(max) = self.limits.max_queued {
            if n >= max {
                self.state.rejected.fetch_add(1, Ordering::Relaxed);
                TENANT_METRICS
                    .rejections
                    .with_label_values(&[&*self.state.id, "queued"])
                    .inc();
                return Err(Refusal {
                    limit: "queued",
                    message: format!(
                        "tenant '{}' already has {max} requests waiting for a seat (its limit)",
                        self.state.id
                    ),
                    retry_after_s: 1,
                    headers: Vec::new(),
                });
            }
        }
        Ok(queued)
    }

    /// Count what the request used: the node's usage when it reported one, else estimates.
    pub fn record(&self, status: u16, error_code: Option<&str>, prompt: u64, completion: u64) {
        let s = &self.state;
        s.prompt_tokens.fetch_add(prompt, Ordering::Relaxed);
        s.completion_tokens.fetch_add(completion, Ordering::Relaxed);
        let t = &*TENANT_METRICS;
        t.requests
            .with_label_values(&[&*s.id, &status.to_string()])
            .inc();
        t.tokens
            .with_label_values(&[&s.id, "prompt"])
            .inc_by(prompt);
        t.tokens
            .with_label_values(&[&s.id, "completion"])
            .inc_by(completion);
        if let Some(code) = error_code {
            s.errors.fetch_add(1, Ordering::Relaxed);
            t.errors.with_label_values(&[&s.id, code]).inc();
        }
    }
}

/// Count a request refused before it was admitted (auth or a limit).
pub fn record_refused(tenant: &str, status: u16, code: &str) {
    let t = &*TENANT_METRICS;
    t.requests
        .with_label_values(&[tenant, &status.to_string()])
        .inc();
    t.errors.with_label_values(&[tenant, code]).inc();
}

/// OpenAI's rate-limit headers for the limits that are set, as of before this request.
fn ratelimit_headers(
    limits: &TenantFile,
    reqs: &Window,
    toks: &Window,
    now_s: u64,
    tokens: u64,
) -> Vec<(&'static str, String)> {
    let mut h = Vec::new();
    if let Some(limit) = limits.requests_per_min {
        let used = reqs.total(now_s);
        let reset = reqs.wait_for(now_s, 1, u64::from(limit)).unwrap_or(0);
        h.push(("x-ratelimit-limit-requests", limit.to_string()));
        h.push((
            "x-ratelimit-remaining-requests",
            u64::from(limit).saturating_sub(used).to_string(),
        ));
        h.push(("x-ratelimit-reset-requests", format!("{reset}s")));
    }
    if let Some(limit) = limits.tokens_per_min {
        let used = toks.total(now_s);
        let reset = toks.wait_for(now_s, tokens, limit).unwrap_or(0);
        h.push(("x-ratelimit-limit-tokens", limit.to_string()));
        h.push((
            "x-ratelimit-remaining-tokens",
            limit.saturating_sub(used).to_string(),
        ));
        h.push(("x-ratelimit-reset-tokens", format!("{reset}s")));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn tenancy(t: TenantFile) -> Tenancy {
        Tenancy {
            keys: HashMap::new(),
            tenants: BTreeMap::from([("a".to_string(), t)]),
        }
    }

    #[test]
    fn in_flight_limit_refuses_then_frees_on_drop() {
        let t = tenancy(TenantFile {
            max_in_flight: Some(2),
            ..TenantFile::default()
        });
        let book = Book::default();
        let p1 = book.admit(&t, "a", 10, 0).expect("first");
        let _p2 = book.admit(&t, "a", 10, 0).expect("second");
        let r = book
            .admit(&t, "a", 10, 0)
            .expect_err("third is over the limit");
        assert_eq!(r.limit, "in_flight");
        assert!(
            book.admit(&t, "b", 10, 0).is_ok(),
            "other tenants unaffected"
        );
        drop(p1);
        assert!(book.admit(&t, "a", 10, 0).is_ok());
    }

    #[test]
    fn tokens_per_minute_refuse_with_retry_after_and_headers() {
        let t = tenancy(TenantFile {
            tokens_per_min: Some(1000),
            ..TenantFile::default()
        });
        let book = Book::default();
        drop(book.admit(&t, "a", 600, 5_000).expect("fits"));
        let r = book.admit(&t, "a", 600, 20_000).expect_err("over 1000/min");
        assert_eq!(r.limit, "tokens_per_min");
        assert_eq!(r.retry_after_s, 45, "second 5 leaves the window at 65");
        assert!(r
            .headers
            .contains(&("x-ratelimit-remaining-tokens", "400".to_string())));
        assert!(book.admit(&t, "a", 600, 65_000).is_ok(), "a minute later");
    }

    #[test]
    fn queued_limit() {
        let t = tenancy(TenantFile {
            max_queued: Some(1),
            ..TenantFile::default()
        });
        let book = Book::default();
        let p = book.admit(&t, "a", 1, 0).expect("admitted");
        let q = p.queue().expect("one may wait");
        assert_eq!(p.queue().expect_err("two may not").limit, "queued");
        drop(q);
        assert!(p.queue().is_ok());
    }
}
