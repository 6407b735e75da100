//! Observability as a user sees it: the shipped Grafana dashboard is valid and every query in
//! it names series a running gateway exports (checked generically, so panels added later are
//! covered), and the access log writes one JSON line per request with no keys or prompts.

mod common;
mod obs;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use obs::*;
use serde_json::{json, Value};

#[test]
fn dashboard_is_valid_grafana_json() {
    let d = dashboard();
    assert!(
        d["schemaVersion"].as_u64().unwrap_or(0) >= 38,
        "schemaVersion"
    );
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()), "uid");
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()), "title");
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let var = |name: &str| vars.iter().find(|v| v["name"] == name);
    let ds = var("DS_PROMETHEUS").expect("a DS_PROMETHEUS datasource variable");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(ds["query"], "prometheus");
    for v in ["node", "model"] {
        let v = var(v).unwrap_or_else(|| panic!("templating variable ${v}"));
        assert_eq!(v["type"], "query");
        assert_eq!(v["datasource"]["uid"], "${DS_PROMETHEUS}");
    }

    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    for p in all_panels(&d) {
        let at = format!("panel {} {:?}", p["id"], p["title"]);
        match p["id"].as_u64() {
            Some(id) if ids.insert(id) => {}
            Some(id) => problems.push(format!("{at}: id {id} used twice")),
            None => problems.push(format!("{at}: no integer id")),
        }
        if p["type"].as_str().is_none() || p["title"].as_str().is_none() {
            problems.push(format!("{at}: needs a type and a title"));
        }
        match grid(p) {
            Some((x, _, w, h)) if w >= 1 && h >= 1 && x + w <= 24 => {}
            _ => problems.push(format!(
                "{at}: gridPos {} must fit 24 columns",
                p["gridPos"]
            )),
        }
        if p["type"] == "row" {
            let children = p["panels"].as_array().map_or(0, Vec::len);
            if p["collapsed"] == false && children > 0 {
                problems.push(format!(
                    "{at}: an expanded row keeps its panels at top level"
                ));
            }
            continue;
        }
        if p["datasource"]["uid"] != "${DS_PROMETHEUS}" {
            problems.push(format!(
                "{at}: datasource must be {{uid: ${{DS_PROMETHEUS}}}}"
            ));
        }
        let targets = p["targets"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        if targets.is_empty() {
            problems.push(format!("{at}: no targets"));
        }
        let mut refs = BTreeSet::new();
        for t in targets {
            if !t["refId"]
                .as_str()
                .is_some_and(|r| refs.insert(r.to_string()))
            {
                problems.push(format!("{at}: targets need distinct refIds"));
            }
            if t["expr"].as_str().is_none_or(|e| e.trim().is_empty()) {
                problems.push(format!("{at}: target without expr"));
            }
        }
    }
    // Top-level panels must not overlap (a collapsed row's children are laid out on expand).
    let top: Vec<&Value> = d["panels"].as_array().expect("panels").iter().collect();
    for (i, a) in top.iter().enumerate() {
        for b in &top[i + 1..] {
            if let (Some(ga), Some(gb)) = (grid(a), grid(b)) {
                if ga.0 < gb.0 + gb.2
                    && gb.0 < ga.0 + ga.2
                    && ga.1 < gb.1 + gb.3
                    && gb.1 < ga.1 + ga.3
                {
                    problems.push(format!("panels {} and {} overlap", a["id"], b["id"]));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "dashboard problems:\n{}",
        problems.join("\n")
    );
    println!(
        "dashboard: {} panels, {} queries, ids unique, layout fits",
        ids.len(),
        queries(&d).len()
    );
}

fn grid(p: &Value) -> Option<(u64, u64, u64, u64)> {
    let g = &p["gridPos"];
    Some((
        g["x"].as_u64()?,
        g["y"].as_u64()?,
        g["w"].as_u64()?,
        g["h"].as_u64()?,
    ))
}

#[test]
fn every_dashboard_query_uses_series_a_running_gateway_exports() {
    let rt = runtime();
    let f = ObservedFleet::start(&rt, "");
    let scrape = rt.block_on(async {
        let mut sent = mixed_round(&f.gw).await;
        sent.add(fleet_events(&f).await);
        settled_scrape(&f.gw, sent).await
    });
    let dash = dashboard();
    let defined = metrics_rs_names();
    let problems = query_problems(&dash, &scrape, &defined);
    assert!(
        problems.is_empty(),
        "the dashboard queries series the gateway does not export:\n{}",
        problems.join("\n")
    );
    let used: BTreeSet<String> = queries(&dash)
        .iter()
        .flat_map(|q| refs(&q.expr).metrics)
        .map(|m| scrape.family_of(&m))
        .collect();
    let unused: Vec<_> = defined.difference(&used).collect();
    println!(
        "checked {} queries using {} families, all exported; defined in metrics.rs but on no panel: {unused:?}",
        queries(&dash).len(),
        used.len()
    );

    // The check is not vacuous: a misspelt metric, a histogram queried without _bucket, and a
    // wrong label, in a panel nested in a collapsed row, are each reported.
    for (bad, expect) in [
        (
            "sum(rate(fleetgate_proxy_request_total[5m]))",
            "`fleetgate_proxy_request_total` is not exported",
        ),
        (
            "histogram_quantile(0.5, sum by (le) (rate(fleetgate_proxy_request_duration_seconds[5m])))",
            "a histogram: query its _bucket",
        ),
        (
            "sum by (nod) (fleetgate_fleet_node_up)",
            "groups by `nod`",
        ),
        (
            r#"fleetgate_fleet_node_up{nodes="x"}"#,
            "has no label `nodes`",
        ),
    ] {
        let mut d = dash.clone();
        d["panels"].as_array_mut().unwrap().push(json!({
            "id": 999, "type": "row", "title": "later", "collapsed": true,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": 999},
            "panels": [{"id": 1000, "type": "timeseries", "title": "new",
                "gridPos": {"h": 8, "w": 12, "x": 0, "y": 1000},
                "targets": [{"refId": "A", "expr": bad}]}]
        }));
        let found = query_problems(&d, &scrape, &defined);
        assert!(
            found.iter().any(|p| p.contains(expect) && p.contains("panel 1000")),
            "{bad}: expected a problem containing {expect:?}, got {found:?}"
        );
    }
}

#[test]
fn errors_retries_and_build_info_are_exported() {
    let rt = runtime();
    let f = ObservedFleet::start(&rt, "");
    let s = rt.block_on(async {
        let sent = mixed_round(&f.gw).await;
        settled_scrape(&f.gw, sent).await
    });
    let has = |line: &str| {
        assert!(
            s.text.lines().any(|l| l == line),
            "missing `{line}` in:\n{}",
            s.text
        )
    };
    has(&format!(
        "fleetgate_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    ));
    has(r#"fleetgate_proxy_errors_total{code="model_not_found",protocol="openai_chat"} 1"#);
    has(r#"fleetgate_proxy_errors_total{code="no_provider_available",protocol="openai_chat"} 1"#);
    // One retry (from whichever gamma node was tried first); healthy nodes show 0, not nothing.
    assert_eq!(sum(&s, "fleetgate_proxy_retries_total"), 1.0);
    has(r#"fleetgate_proxy_retries_total{node="ob-a"} 0"#);
    has(r#"fleetgate_access_log_dropped_total{reason="full"} 0"#);
    assert_eq!(sum(&s, "fleetgate_proxy_requests_total"), 6.0);
}

#[test]
fn access_log_writes_one_json_line_per_request_without_keys_or_prompts() {
    let rt = runtime();
    let dir = TempDir::new("access-log");
    let path = dir.path("access.log");
    let f = ObservedFleet::start(
        &rt,
        &format!("access_log:\n  enabled: true\n  path: {}\n", path.display()),
    );
    const SECRET: &str = "sk-very-secret-key-0123456789";
    const PROMPT: &str = "PROMPT-MARKER the user's private words";
    let c = client();
    let (ok_in, ok_out, stream_in, stream_out) = rt.block_on(async {
        let body = serde_json::to_vec(&chat("gpt-test", PROMPT)).unwrap();
        let ok_in = body.len();
        let r = c
            .post(f.gw.url("/v1/chat/completions"))
            .header("authorization", format!("Bearer {SECRET}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let ok_out = r.bytes().await.unwrap().len();

        let mut s = chat("alpha:1b", PROMPT);
        s["stream"] = json!(true);
        let body = serde_json::to_vec(&s).unwrap();
        let stream_in = body.len();
        let r = c
            .post(f.gw.url("/v1/chat/completions"))
            .header("x-api-key", SECRET)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let stream_out = r.bytes().await.unwrap().len();

        let r = c
            .post(f.gw.url("/v1/chat/completions"))
            .json(&chat("nope:1b", PROMPT))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        r.bytes().await.unwrap();
        (ok_in, ok_out, stream_in, stream_out)
    });

    // The writer is off the request path: wait (bounded) for its lines to land.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.lines().count() >= 3 || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), 3, "one line per request:\n{text}");
    assert!(!text.contains(SECRET), "the API key leaked:\n{text}");
    assert!(
        !text.contains("PROMPT-MARKER"),
        "the prompt leaked:\n{text}"
    );
    println!("access log:\n{text}");

    let keys = [
        "ts",
        "protocol",
        "requested_model",
        "served_model",
        "node",
        "score",
        "fallback",
        "retries",
        "queue_wait_ms",
        "ttft_ms",
        "total_ms",
        "status",
        "error",
        "tenant",
        "bytes_in",
        "bytes_out",
    ];
    for l in &lines {
        let got: Vec<&str> = l.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(got.len(), keys.len(), "{l}");
        for k in keys {
            assert!(got.contains(&k), "missing {k}: {l}");
        }
        let ts = l["ts"].as_str().unwrap();
        assert!(
            ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
            "{ts}"
        );
    }
    // Lines are in the order requests finished accounting, not necessarily sent.
    let find = |model: &str| {
        lines
            .iter()
            .find(|l| l["requested_model"] == model)
            .unwrap_or_else(|| panic!("no line for {model}:\n{text}"))
    };
    let (ok, stream, missing) = (find("gpt-test"), find("alpha:1b"), find("nope:1b"));

    assert_eq!(ok["protocol"], "openai_chat");
    assert_eq!(ok["requested_model"], "gpt-test");
    assert_eq!(ok["served_model"], "alpha:1b");
    assert!(
        ["ob-a", "ob-b"].contains(&ok["node"].as_str().unwrap()),
        "{ok}"
    );
    assert!(ok["score"].is_number());
    assert_eq!(ok["retries"], 0);
    assert!(
        ok["queue_wait_ms"].as_f64().is_some_and(|w| w >= 0.0),
        "{ok}"
    );
    assert_eq!(ok["status"], 200);
    assert_eq!(ok["error"], Value::Null);
    let tenant = ok["tenant"].as_str().unwrap();
    assert!(
        tenant
            .strip_prefix("key-")
            .is_some_and(|d| d.len() == 12 && d.bytes().all(|b| b.is_ascii_hexdigit())),
        "{tenant}"
    );
    assert_eq!(
        stream["tenant"], tenant,
        "same key, same tenant, any header"
    );
    assert_eq!(ok["bytes_in"], ok_in);
    assert_eq!(ok["bytes_out"], ok_out);
    // The sim waits 30 ms before its first token.
    let (ttft, total) = (
        ok["ttft_ms"].as_f64().unwrap(),
        ok["total_ms"].as_f64().unwrap(),
    );
    assert!(ttft >= 30.0 && total >= ttft, "ttft {ttft} total {total}");

    assert_eq!(stream["requested_model"], "alpha:1b");
    assert_eq!(stream["status"], 200);
    assert_eq!(stream["bytes_in"], stream_in);
    assert_eq!(stream["bytes_out"], stream_out);
    let (ttft, total) = (
        stream["ttft_ms"].as_f64().unwrap(),
        stream["total_ms"].as_f64().unwrap(),
    );
    assert!(
        ttft >= 30.0 && total > ttft,
        "streamed: ttft {ttft} < total {total}"
    );

    assert_eq!(missing["status"], 404);
    assert_eq!(missing["error"], "model_not_found");
    assert_eq!(missing["requested_model"], "nope:1b");
    assert_eq!(missing["served_model"], "-");
    assert_eq!(missing["node"], "-");
    assert_eq!(missing["score"], Value::Null);
    assert_eq!(missing["tenant"], "anonymous");
    assert!(missing["bytes_out"].as_u64().unwrap() > 0);

    // The log and the request counter agree.
    let s = rt.block_on(scrape(&f.gw));
    assert_eq!(sum(&s, "fleetgate_proxy_requests_total"), 3.0);
}

#[test]
fn promql_scanner_finds_names_labels_and_groupings() {
    let r = refs(
        r#"histogram_quantile(0.9, sum by (le, node) (rate(fleetgate_x_bucket{node=~"$node", model!="fleetgate_not_a_metric"}[$__rate_interval]))) or on () vector(0)"#,
    );
    assert_eq!(r.metrics.iter().collect::<Vec<_>>(), ["fleetgate_x_bucket"]);
    let labels: Vec<&str> = r.selector_labels.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(labels, ["node", "model"]);
    assert_eq!(r.grouping_labels.iter().collect::<Vec<_>>(), ["le", "node"]);
    assert_eq!(
        variable_expr(r#"label_values(fleetgate_y{node=~"$node"}, model)"#),
        (
            r#"fleetgate_y{node=~"$node"}"#.to_string(),
            Some("model".to_string())
        )
    );
}
