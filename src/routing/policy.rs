//! Scoring and elimination parameters: every weight and threshold routing uses, spec defaults.

use serde::{Deserialize, Serialize};

/// Tunables of Stage 1 and Stage 2. `Default` holds the numbers of spec 000 / 003 / 004.
///
/// Deserialised from the YAML `routing:` block: every field is optional (missing fields keep
/// their default) and unknown fields are an error. Call [`Policy::validate`] after loading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    // ---- Stage 1 -------------------------------------------------------------------------
    /// Capacity learning: eliminate when CPU has been above 85 % for at least this long, s.
    pub learning_cpu_high_s: u64,
    /// Capacity learning: eliminate when the availability score is below this.
    pub learning_min_availability: f64,
    /// Capacity learning: eliminate during the first days of observation.
    pub learning_min_days: f64,
    /// Spec 004: most provisional nodes used at once (used = with requests in flight). When
    /// reached, idle provisional nodes are eliminated (`provisional_cap`) for a model while a
    /// surviving pinned node has a spare seat. `None`: no cap.
    pub provisional_pool_cap: Option<u32>,
    /// Spec 004 "require_warm for the tier": provisional nodes only serve loaded models.
    pub require_warm_provisional: bool,

    // ---- Signal 1: model warmth ---------------------------------------------------------
    pub warmth_loaded: f64,
    /// Unloaded within `warmth_recent_window_s` (page cache still warm).
    pub warmth_recent: f64,
    pub warmth_recent_window_s: u64,
    pub warmth_on_disk: f64,
    /// Not on disk, pullable.
    pub warmth_pullable: f64,

    // ---- Signal 2: memory fit (fit_ratio = available / model GB) -----------------------
    /// Points for a model already loaded on the node.
    pub fit_loaded: f64,
    /// fit_ratio > this: `fit_comfortable` points.
    pub fit_comfortable_ratio: f64,
    pub fit_comfortable: f64,
    /// fit_ratio >= this (and not comfortable): `fit_good` points.
    pub fit_good_ratio: f64,
    pub fit_good: f64,
    /// fit_ratio >= this: `fit_ok` points; below it (but >= 1.0): `fit_tight`.
    pub fit_ok_ratio: f64,
    pub fit_ok: f64,
    pub fit_tight: f64,

    // ---- Signal 3: queue depth (depth = (in_flight + pending) / seats) -------------------
    pub queue_per_request: f64,
    pub queue_max: f64,

    // ---- Signal 4: estimated wait (depth x p75) -----------------------------------------
    /// Penalty = est_wait_s / this, capped at `wait_max`.
    pub wait_divisor_s: f64,
    pub wait_max: f64,
    /// Heuristic without p75 history: expected output tokens per request (the request's
    /// `max_tokens` when smaller).
    pub wait_heuristic_output_tokens: u32,
    /// Heuristic: bandwidth assumed for a node whose bandwidth is unknown, GB/s.
    pub wait_heuristic_bandwidth_gbps: f64,

    // ---- Signal 5: role affinity ----------------------------------------------------------
    /// Model over this (GB): large, fast nodes win (FLEET_SCORE_ROLE_LARGE_THRESHOLD_GB).
    pub role_large_threshold_gb: f64,
    /// Model under this (GB): small, slower nodes win (FLEET_SCORE_ROLE_SMALL_THRESHOLD_GB).
    pub role_small_threshold_gb: f64,
    /// bandwidth bonus = base + GB/s / divisor, capped.
    pub role_bw_base: f64,
    pub role_bw_divisor: f64,
    pub role_bw_cap: f64,
    /// Small model: small_base - small_factor x bonus, at least small_min.
    pub role_small_base: f64,
    pub role_small_factor: f64,
    pub role_small_min: f64,
    /// In-between model: medium_factor x bonus.
    pub role_medium_factor: f64,
    /// Memory-tier fallback (bandwidth unknown): node memory >= this is a "large" node ...
    pub role_mem_large_node_gb: f64,
    /// ... >= this (and for small models: <= this) a "mid" node.
    pub role_mem_mid_node_gb: f64,
    pub role_mem_large_model_on_large: f64,
    pub role_mem_large_model_on_mid: f64,
    pub role_mem_large_model_on_small: f64,
    /// Small model on a node with memory <= `role_mem_mid_node_gb`.
    pub role_mem_small_model_on_small: f64,
    /// Small model on a node with memory <= `role_mem_large_node_gb`.
    pub role_mem_small_model_on_mid: f64,
    pub role_mem_small_model_on_large: f64,
    /// In-between model, bandwidth unknown (spec 000 gives no number: 0).
    pub role_mem_medium_model: f64,

    // ---- Signal 6: availability trend (learning nodes only) -----------------------------
    pub availability_weight: f64,

    // ---- Signal 7: context fit (ratio = window / needed tokens) --------------------------
    pub ctx_roomy_ratio: f64,
    pub ctx_roomy: f64,
    pub ctx_good_ratio: f64,
    pub ctx_good: f64,
    pub ctx_ok_ratio: f64,
    pub ctx_ok: f64,
    /// ratio >= 1.0 but below `ctx_ok_ratio`.
    pub ctx_tight: f64,
    /// Subtracted when the loaded window is too small but `max_context` fits (reload).
    pub ctx_resize_penalty: f64,

    // ---- Signal 8: session affinity: max / (1 + depth / divisor) -------------------------
    pub session_max: f64,
    pub session_depth_divisor: f64,

    // ---- Tier (spec 004) and load tie-breaker (spec 003/004) ------------------------------
    /// Points for a node whose tier is `pinned` over a `provisional` one (spec 004).
    pub tier_pinned_bonus: f64,
    /// Load: minus this x min(1, in flight of the node's *other* models / seats).
    pub load_inflight_weight: f64,
    /// Load: plus this x tps / (tps + `load_tps_ref`) for the model's observed TPS.
    pub load_tps_weight: f64,
    pub load_tps_ref: f64,

    // ---- Completion mode (`routing.mode: completion`, see `completion.rs`) -----------------
    /// Set from `routing.mode` (not part of the `routing.policy` block).
    #[serde(skip)]
    pub mode: super::types::Mode,
    /// Prior model-load read speed, GB/s, for a node without `load_gbps` and no observed load,
    /// while no other node's load was observed either (`NodeView::peer_load_gbps`; spec 000: a
    /// 40 GB model cold-loads in 15-30 s).
    pub completion_load_gbps: f64,
    /// Prior pull speed, GB/s, for a model not on the node's disk.
    pub completion_pull_gbps: f64,
    /// Prior prompt tokens/s as a multiple of a node's decode tokens/s (no prefill prior).
    pub completion_prefill_per_decode: f64,
    /// Model size, GB, the decode prior assumes when nobody said one (`backend: openai` lists
    /// no sizes). Without it the prior read 0 GB as instant (10,000 tokens/s), and a node
    /// never tried looked faster than every node seen.
    pub completion_prior_model_gb: f64,
    /// Prior cost of each further concurrent stream, relative to one stream's seconds per
    /// token, until some pair of the model is seen at several concurrencies (its own, then the
    /// fleet's measured figure replace it). Zero made a node running three streams look as
    /// fast as an idle one, and a 2 % difference in a rate learned from two responses sent a
    /// 41k-token prompt to the busy one.
    pub completion_contention_prior: f64,
    /// How likely a node's models are taken to share its seats until its answers say
    /// (`fleet::SeatSharing::belief`): the wait for a node-wide seat is ranked weighed by it
    /// (`completion::Prediction::risk_s`). Ollama keeps each loaded model's own seats
    /// (`OLLAMA_NUM_PARALLEL` is per model), which a node of several models most likely is; a
    /// server with one queue for all its models is the exception, but sending a small request
    /// behind a 70b model's 10 s answers costs more than the little this gives up.
    pub completion_seats_shared_prior: f64,
    /// A pair not observed for this long is explored: its compute terms are multiplied by
    /// `completion_explore_factor`, so a node slow once is tried again; one never observed
    /// is, once its model has been served this long (until then it is a typical node).
    pub completion_explore_after_s: u64,
    pub completion_explore_factor: f64,
    /// On a node that hides its loads (`backend: openai`, `NodeView::hides_loads`): a model
    /// not asked for in this long may have been unloaded, and its next request is expected to
    /// wait for the load the pair's earlier answers showed after such a spell (Ollama's
    /// default keep-alive is 5 minutes). 0: never (swaps, after another model was sent to the
    /// node, and stalls are still learned and expected: they are not about time).
    pub completion_keep_alive_s: u64,
    /// Before a cold load on a node the gateway manages (Ollama), unload the idle models
    /// cheapest to reload (`evict.rs`) instead of leaving the choice to the backend's own
    /// least-recently-used rule.
    pub completion_choose_evictions: bool,
    /// A request's model is loaded, in the background, on a node the gateway manages (Ollama)
    /// that has it on disk, fits it in free memory (nothing unloaded) and would finish the
    /// request sooner with it loaded than the node it goes to, whether that one has a seat
    /// free or not (`services::prewarm::spare_room`).
    pub completion_spare_loads: bool,
    /// A model a node holds in memory that no answer has measured yet is asked once, when
    /// the gateway first sees it, for a short answer (`services::measure`): its prefill and
    /// decode rates are the node's own before clients' requests would teach them.
    pub completion_measure: bool,

    // ---- Output ---------------------------------------------------------------------------
    /// Most entries kept in `Decision::ranked` (winner + runners-up for retries / pre-warm).
    /// 0: keep every surviving (node, model) pair.
    pub max_ranked: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            learning_cpu_high_s: 120,
            learning_min_availability: 0.20,
            learning_min_days: 7.0,
            provisional_pool_cap: None,
            require_warm_provisional: false,

            warmth_loaded: 50.0,
            warmth_recent: 30.0,
            warmth_recent_window_s: 30 * 60,
            warmth_on_disk: 10.0,
            warmth_pullable: 0.0,

            fit_loaded: 20.0,
            fit_comfortable_ratio: 2.0,
            fit_comfortable: 20.0,
            fit_good_ratio: 1.5,
            fit_good: 15.0,
            fit_ok_ratio: 1.2,
            fit_ok: 8.0,
            fit_tight: 3.0,

            queue_per_request: 6.0,
            queue_max: 30.0,

            wait_divisor_s: 10.0,
            wait_max: 25.0,
            wait_heuristic_output_tokens: 256,
            wait_heuristic_bandwidth_gbps: 100.0,

            role_large_threshold_gb: 20.0,
            role_small_threshold_gb: 8.0,
            role_bw_base: 5.0,
            role_bw_divisor: 40.0,
            role_bw_cap: 25.0,
            role_small_base: 18.0,
            role_small_factor: 0.6,
            role_small_min: 3.0,
            role_medium_factor: 0.6,
            role_mem_large_node_gb: 128.0,
            role_mem_mid_node_gb: 32.0,
            role_mem_large_model_on_large: 15.0,
            role_mem_large_model_on_mid: 5.0,
            role_mem_large_model_on_small: 0.0,
            role_mem_small_model_on_small: 15.0,
            role_mem_small_model_on_mid: 8.0,
            role_mem_small_model_on_large: 3.0,
            role_mem_medium_model: 0.0,

            availability_weight: 10.0,

            ctx_roomy_ratio: 8.0,
            ctx_roomy: 15.0,
            ctx_good_ratio: 3.0,
            ctx_good: 12.0,
            ctx_ok_ratio: 1.5,
            ctx_ok: 7.5,
            ctx_tight: 3.0,
            ctx_resize_penalty: 15.0,

            session_max: 20.0,
            session_depth_divisor: 2.0,

            tier_pinned_bonus: 5.0,
            load_inflight_weight: 1.0,
            load_tps_weight: 1.0,
            load_tps_ref: 50.0,

            mode: super::types::Mode::Spec,
            completion_load_gbps: 2.0,
            completion_pull_gbps: 0.1,
            completion_prefill_per_decode: 20.0,
            completion_prior_model_gb: 8.0,
            completion_contention_prior: 0.03,
            completion_seats_shared_prior: 0.2,
            completion_explore_after_s: 60,
            completion_explore_factor: 0.5,
            completion_keep_alive_s: 300,
            completion_choose_evictions: true,
            completion_spare_loads: true,
            completion_measure: true,

            max_ranked: 16,
        }
    }
}

/// A `routing:` value that cannot work; names the field, the value and what was expected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("routing.{field}: {value} is invalid, expected {expected}")]
pub struct PolicyError {
    pub field: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl Policy {
    /// Check what serde cannot: finite non-negative weights, positive divisors, ordered bands.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let non_negative = [
            ("learning_min_availability", self.learning_min_availability),
            ("learning_min_days", self.learning_min_days),
            ("warmth_loaded", self.warmth_loaded),
            ("warmth_recent", self.warmth_recent),
            ("warmth_on_disk", self.warmth_on_disk),
            ("warmth_pullable", self.warmth_pullable),
            ("fit_loaded", self.fit_loaded),
            ("fit_comfortable", self.fit_comfortable),
            ("fit_good", self.fit_good),
            ("fit_ok", self.fit_ok),
            ("fit_tight", self.fit_tight),
            ("queue_per_request", self.queue_per_request),
            ("queue_max", self.queue_max),
            ("wait_max", self.wait_max),
            ("role_bw_base", self.role_bw_base),
            ("role_bw_cap", self.role_bw_cap),
            ("role_small_base", self.role_small_base),
            ("role_small_factor", self.role_small_factor),
            ("role_small_min", self.role_small_min),
            ("role_medium_factor", self.role_medium_factor),
            ("availability_weight", self.availability_weight),
            ("ctx_roomy", self.ctx_roomy),
            ("ctx_good", self.ctx_good),
            ("ctx_ok", self.ctx_ok),
            ("ctx_tight", self.ctx_tight),
            ("ctx_resize_penalty", self.ctx_resize_penalty),
            ("session_max", self.session_max),
            ("tier_pinned_bonus", self.tier_pinned_bonus),
            ("load_inflight_weight", self.load_inflight_weight),
            ("load_tps_weight", self.load_tps_weight),
        ];
        for (field, value) in non_negative {
            check(
                field,
                value,
                value.is_finite() && value >= 0.0,
                "a finite number >= 0",
            )?;
        }
        let positive = [
            ("wait_divisor_s", self.wait_divisor_s),
            (
                "wait_heuristic_bandwidth_gbps",
                self.wait_heuristic_bandwidth_gbps,
            ),
            ("role_bw_divisor", self.role_bw_divisor),
            ("session_depth_divisor", self.session_depth_divisor),
            ("load_tps_ref", self.load_tps_ref),
            ("completion_load_gbps", self.completion_load_gbps),
            ("completion_pull_gbps", self.completion_pull_gbps),
            (
                "completion_prefill_per_decode",
                self.completion_prefill_per_decode,
            ),
            ("completion_prior_model_gb", self.completion_prior_model_gb),
            ("role_small_threshold_gb", self.role_small_threshold_gb),
            ("role_mem_mid_node_gb", self.role_mem_mid_node_gb),
        ];
        for (field, value) in positive {
            check(
                field,
                value,
                value.is_finite() && value > 0.0,
                "a finite number > 0",
            )?;
        }
        let ordered = [
            ("fit_ok_ratio", self.fit_ok_ratio, 1.0, "at least 1.0"),
            (
                "fit_good_ratio",
                self.fit_good_ratio,
                self.fit_ok_ratio,
                "at least fit_ok_ratio",
            ),
            (
                "fit_comfortable_ratio",
                self.fit_comfortable_ratio,
                self.fit_good_ratio,
                "at least fit_good_ratio",
            ),
            ("ctx_ok_ratio", self.ctx_ok_ratio, 1.0, "at least 1.0"),
            (
                "ctx_good_ratio",
                self.ctx_good_ratio,
                self.ctx_ok_ratio,
                "at least ctx_ok_ratio",
            ),
            (
                "ctx_roomy_ratio",
                self.ctx_roomy_ratio,
                self.ctx_good_ratio,
                "at least ctx_good_ratio",
            ),
            (
                "role_large_threshold_gb",
                self.role_large_threshold_gb,
                self.role_small_threshold_gb,
                "at least role_small_threshold_gb",
            ),
            (
                "role_mem_large_node_gb",
                self.role_mem_large_node_gb,
                self.role_mem_mid_node_gb,
                "at least role_mem_mid_node_gb",
            ),
        ];
        let c = self.completion_contention_prior;
        check(
            "completion_contention_prior",
            c,
            c.is_finite() && c >= 0.0,
            "a finite number >= 0",
        )?;
        let s = self.completion_seats_shared_prior;
        check(
            "completion_seats_shared_prior",
            s,
            (0.0..=1.0).contains(&s),
            "a number in [0, 1]",
        )?;
        let f = self.completion_explore_factor;
        check(
            "completion_explore_factor",
            f,
            f.is_finite() && f > 0.0 && f <= 1.0,
            "a number in (0, 1]",
        )?;
        for (field, value, min, expected) in ordered {
            check(field, value, value.is_finite() && value >= min, expected)?;
        }
        Ok(())
    }
}

fn check(
    field: &'static str,
    value: f64,
    ok: bool,
    expected: &'static str,
) -> Result<(), PolicyError> {
    if ok {
        Ok(())
    } else {
        Err(PolicyError {
            field,
            value: value.to_string(),
            expected,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate() {
        assert_eq!(Policy::default().validate(), Ok(()));
    }

    #[test]
    fn yaml_overrides_one_field_and_keeps_the_rest() {
        let p: Policy = serde_yaml::from_str("queue_per_request: 4\nprovisional_pool_cap: 2\n")
            .expect("valid routing block");
        assert_eq!(p.queue_per_request, 4.0);
        assert_eq!(p.provisional_pool_cap, Some(2));
        assert_eq!(p.warmth_loaded, 50.0);
    }

    #[test]
    fn yaml_rejects_unknown_fields() {
        let err = serde_yaml::from_str::<Policy>("queue_per_reqest: 4\n").unwrap_err();
        assert!(err.to_string().contains("queue_per_reqest"), "{err}");
    }

    #[test]
    fn validate_names_the_field() {
        let p = Policy {
            fit_good_ratio: 3.0,
            ..Policy::default()
        };
        let err = p.validate().unwrap_err();
        assert_eq!(err.field, "fit_comfortable_ratio");
        let p = Policy {
            session_depth_divisor: 0.0,
            ..Policy::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "session_depth_divisor");
    }
}
