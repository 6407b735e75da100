//! "Not here" answers per node:model:endpoint: a node that answered 501, 404 or 405 for an
//! endpoint (llama.cpp without `--embeddings` answers 501 on `/v1/embeddings`) is not capable
//! of it. That is no fault (the breakers never hear of it): routing eliminates the pair for
//! that endpoint with reason `not_capable` until [`RECHECK_MS`] passes, then tries again.

use parking_lot::Mutex;

/// How long a "not here" answer keeps the endpoint off the node:model.
pub const RECHECK_MS: u64 = 10 * 60 * 1000;

/// Whether an upstream status says the node does not offer the endpoint (or the model there).
pub fn says_not_here(status: u16) -> bool {
    matches!(status, 404 | 405 | 501)
}

/// Endpoints a node:model answered "not here" for, each until a recheck time.
#[derive(Debug, Default)]
pub struct NotCapable {
    until: Mutex<Vec<(&'static str, u64)>>,
}

impl NotCapable {
    /// Mark `endpoint` not capable from `now_ms`; true when it was not marked before.
    pub fn mark(&self, endpoint: &'static str, now_ms: u64) -> bool {
        let mut v = self.until.lock();
        let until = now_ms + RECHECK_MS;
        match v.iter_mut().find(|(e, _)| *e == endpoint) {
            Some(slot) => {
                let was_active = slot.1 > now_ms;
                slot.1 = until;
                !was_active
            }
            None => {
                v.push((endpoint, until));
                true
            }
        }
    }

    /// Endpoints not capable at `now_ms`.
    pub fn active(&self, now_ms: u64) -> Vec<&'static str> {
        self.until
            .lock()
            .iter()
            .filter(|(_, t)| *t > now_ms)
            .map(|(e, _)| *e)
            .collect()
    }

    /// When the next mark runs out (the view changes then), after `now_ms`.
    pub fn next_expiry(&self, now_ms: u64) -> Option<u64> {
        self.until
            .lock()
            .iter()
            .map(|(_, t)| *t)
            .filter(|t| *t > now_ms)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_expire_for_a_recheck() {
        let n = NotCapable::default();
        assert!(n.mark("openai_embeddings", 1_000));
        assert!(!n.mark("openai_embeddings", 2_000), "already marked");
        assert_eq!(n.active(2_000), vec!["openai_embeddings"]);
        assert_eq!(n.next_expiry(2_000), Some(2_000 + RECHECK_MS));
        assert!(n.active(2_000 + RECHECK_MS).is_empty(), "rechecked later");
        assert!(
            n.mark("openai_embeddings", 3_000 + RECHECK_MS),
            "marked anew"
        );
        assert!(says_not_here(501) && says_not_here(404) && !says_not_here(500));
        assert!(!says_not_here(400) && !says_not_here(200));
    }
}
