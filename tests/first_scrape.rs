//! Metrics from the first scrape: on a fresh gateway that has served nothing, every counter
//! and histogram family already has a zero-valued series for each node and each model a node
//! reports, so dashboards show 0 rather than "No data".

mod common;

use common::*;

const SIM: &str = "seats: 2\ntokens_per_sec: 2000\nttft_ms: 2\nmemory_gb: 64\nreply_tokens: 8\nmodels:\n  - {name: m:1b, size_gb: 1, loaded: true}\n  - {name: m:7b, size_gb: 4}\n";

/// The value of the series `name{labels}` in `text`, where every `k="v"` of `labels` must
/// appear among the series' labels.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            (n == name
                && labels
                    .iter()
                    .all(|(k, val)| rest.contains(&format!("{k}=\"{val}\""))))
            .then(|| v.parse().ok())?
        })
        .next()
}

#[test]
fn a_fresh_gateways_first_scrape_has_every_family_at_zero() {
    let rt = runtime();
    let polled = sim(&rt, SIM);
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 100\n{}",
        fleet(&[
            // Models come from its polls.
            node("polled", &polled, ""),
            // Models from static config; a learning node; never answers (port 9 is discard).
            "    - id: static\n      url: http://127.0.0.1:9\n      backend: openai\n      learning: true\n      models:\n        - {name: big:70b, size_gb: 40}\n".to_string(),
        ])
    ));
    rt.block_on(async {
        // Readiness through /fleet/status (not a scrape): the polled node reported its models.
        eventually("the polled node's models", || async {
            let s = admin_json(&gw, "/fleet/status").await;
            s["nodes"][0]["models"].as_array().map_or(0, Vec::len) == 2
        })
        .await;
        let text = metrics(&gw).await;
        let mut missing = Vec::new();
        let mut want = |name: &str, labels: &[(&str, &str)]| match value(&text, name, labels) {
            Some(0.0) => {}
            Some(v) => missing.push(format!("{name}{labels:?} = {v}, expected 0")),
            None => missing.push(format!("{name}{labels:?} absent")),
        };
        let pairs = [
            ("polled", "m:1b"),
            ("polled", "m:7b"),
            ("static", "big:70b"),
        ];
        for node in ["polled", "static"] {
            let n = [("node", node)];
            want("fleetgate_proxy_retries_total", &n);
            want(
                "fleetgate_admin_heartbeats_total",
                &[("node", node), ("result", "ok")],
            );
            want(
                "fleetgate_fleet_breaker_transitions_total",
                &[("node", node), ("model", "-"), ("to", "open")],
            );
            want(
                "fleetgate_queue_pulls_total",
                &[("node", node), ("outcome", "ok")],
            );
        }
        for (node, model) in pairs {
            let nm = [("node", node), ("model", model)];
            want("fleetgate_queue_prewarms_total", &nm);
            want("fleetgate_routing_evictions_total", &nm);
            for outcome in ["learned", "failed", "load"] {
                want(
                    "fleetgate_routing_measurements_total",
                    &[("node", node), ("model", model), ("outcome", outcome)],
                );
            }
            want("fleetgate_fleet_breaker_state", &nm);
            for to in ["open", "half_open", "closed"] {
                want(
                    "fleetgate_fleet_breaker_transitions_total",
                    &[("node", node), ("model", model), ("to", to)],
                );
            }
            want("fleetgate_proxy_request_duration_seconds_count", &nm);
            want("fleetgate_proxy_time_to_first_token_seconds_count", &nm);
            want("fleetgate_proxy_time_per_output_token_seconds_count", &nm);
            want("fleetgate_queue_wait_seconds_count", &nm);
            want("fleetgate_queue_client_aborts_total", &nm);
            want("fleetgate_queue_timeouts_total", &nm);
            want(
                "fleetgate_proxy_requests_total",
                &[("node", node), ("model", model), ("status", "200")],
            );
            want(
                "fleetgate_proxy_tokens_total",
                &[("node", node), ("model", model), ("direction", "out")],
            );
        }
        // Rebalance pairs exist only between nodes that share a model: none here (asked by
        // node: under `cargo test` the other test's gateway shares this process's registry).
        for node in ["polled", "static"] {
            assert!(
                value(
                    &text,
                    "fleetgate_queue_rebalance_moves_total",
                    &[("from", node)]
                )
                .is_none(),
                "no rebalance pair without a shared model"
            );
        }
        assert!(
            value(
                &text,
                "fleetgate_fleet_node_availability_ratio",
                &[("node", "static")]
            )
            .is_some(),
            "availability of the learning node"
        );
        for (name, labels) in [
            (
                "fleetgate_routing_eliminations_total",
                ("reason", "breaker_open"),
            ),
            ("fleetgate_routing_decisions_total", ("kind", "cold_load")),
            (
                "fleetgate_admin_heartbeats_total",
                ("result", "unauthorized"),
            ),
            (
                "fleetgate_proxy_errors_total",
                ("code", "no_provider_available"),
            ),
        ] {
            if value(&text, name, &[labels]).is_none() {
                missing.push(format!("{name}{{{}={}}} absent", labels.0, labels.1));
            }
        }
        assert!(missing.is_empty(), "first scrape:\n{}", missing.join("\n"));
    });
}

#[test]
fn nodes_sharing_a_model_have_rebalance_pairs_both_ways() {
    let rt = runtime();
    let (a, b) = (sim(&rt, SIM), sim(&rt, SIM));
    let gw = Gateway::start(&format!(
        "health:\n  poll_interval_ms: 100\n{}",
        fleet(&[node("a", &a, ""), node("b", &b, "")])
    ));
    rt.block_on(async {
        eventually("both nodes report their models", || async {
            let s = admin_json(&gw, "/fleet/status").await;
            (0..2).all(|i| s["nodes"][i]["models"].as_array().map_or(0, Vec::len) == 2)
        })
        .await;
        let text = metrics(&gw).await;
        for (from, to) in [("a", "b"), ("b", "a")] {
            for model in ["m:1b", "m:7b"] {
                let v = value(
                    &text,
                    "fleetgate_queue_rebalance_moves_total",
                    &[("from", from), ("to", to), ("model", model)],
                );
                assert_eq!(v, Some(0.0), "rebalance {from} -> {to} {model}");
            }
        }
    });
}
