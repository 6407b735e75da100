use super::*;

const MINIMAL: &str = r#"
fleet:
  nodes:
    - id: box1
      url: http://127.0.0.1:11434
      backend: ollama
"#;

#[test]
fn minimal_config_gets_defaults() {
    let c = Config::from_yaml(MINIMAL).expect("valid");
    assert_eq!(c.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(c.admin_listen.to_string(), "127.0.0.1:9090");
    assert_eq!(c.nodes[0].families, vec![Family::OpenAI, Family::Ollama]);
    assert_eq!(c.nodes[0].host, "127.0.0.1:11434");
    assert_eq!(c.limits.max_body_bytes, 32 * 1024 * 1024);
}

#[test]
fn unknown_field_is_named() {
    let err = Config::from_yaml("server:\n  lisen: 1.2.3.4:1\n").unwrap_err();
    assert!(err.to_string().contains("lisen"), "{err}");
}

#[test]
fn errors_name_field_value_and_expectation() {
    let yaml = r#"
server:
  listen: "nope"
fleet:
  nodes:
    - id: a
      url: ftp://x
      backend: openai
      capacity: 0
    - id: a
      url: http://127.0.0.1:1
      backend: sim
"#;
    let err = Config::from_yaml(yaml).unwrap_err().0;
    let all = err.join("\n");
    assert!(
        all.contains("field `server.listen`: value \"nope\""),
        "{all}"
    );
    assert!(
        all.contains("field `fleet.nodes[0].url`: value \"ftp://x\""),
        "{all}"
    );
    assert!(
        all.contains("field `fleet.nodes[0].capacity`: value 0: expected at least 1"),
        "{all}"
    );
    assert!(
        all.contains("field `fleet.nodes[1].id`: value \"a\": expected a unique id"),
        "{all}"
    );
}

#[test]
fn env_overrides_apply_and_bad_numbers_are_named() {
    let mut f = Config::parse(MINIMAL).unwrap();
    apply_env(&mut f, |k| match k {
        "FLEETGATE_LISTEN" => Some("127.0.0.1:7000".into()),
        "FLEETGATE_THREADS" => Some("3".into()),
        _ => None,
    })
    .unwrap();
    let c = validate(f).unwrap();
    assert_eq!(c.listen.port(), 7000);
    assert_eq!(c.threads, 3);

    let mut f = Config::parse(MINIMAL).unwrap();
    let err = apply_env(&mut f, |k| {
        (k == "FLEETGATE_RETRIES").then(|| "many".into())
    })
    .unwrap_err();
    assert!(err.to_string().contains("FLEETGATE_RETRIES"), "{err}");
}

#[test]
fn url_forms() {
    assert!(parse_url("http://127.0.0.1:8000").is_ok());
    assert_eq!(parse_url("http://localhost").unwrap().1.port(), 80);
    assert!(parse_url("https://x:1").unwrap_err().contains("TLS"));
    assert!(parse_url("http://127.0.0.1:8000/v1")
        .unwrap_err()
        .contains("no path"));
}

#[test]
fn reference_config_documents_the_real_defaults() {
    let text = include_str!("../../conf/fleetgate.yaml");
    let f = Config::parse(text).expect("reference config parses");
    assert_eq!(
        f.routing.policy,
        Policy::default(),
        "conf/fleetgate.yaml policy block = defaults"
    );
    let q = QueueFile::default();
    assert_eq!(
        (
            f.queue.holding_timeout_s,
            f.queue.holding_max,
            f.queue.prewarm_threshold,
            f.queue.rebalance_threshold
        ),
        (
            q.holding_timeout_s,
            q.holding_max,
            q.prewarm_threshold,
            q.rebalance_threshold
        )
    );
    let l = LimitsFile::default();
    assert_eq!(f.limits.max_body_bytes, l.max_body_bytes);
}

#[test]
fn access_log_is_off_by_default_and_goes_to_stdout_or_a_file() {
    let c = Config::from_yaml(MINIMAL).expect("valid");
    assert_eq!(c.access_log.target, None);
    let c = Config::from_yaml(&format!("access_log:\n  enabled: true\n{MINIMAL}")).expect("valid");
    assert_eq!(c.access_log.target, Some(AccessLogTarget::Stdout));
    let yaml = format!("access_log:\n  enabled: true\n  path: /tmp/a.log\n{MINIMAL}");
    let c = Config::from_yaml(&yaml).expect("valid");
    assert_eq!(
        c.access_log.target,
        Some(AccessLogTarget::File("/tmp/a.log".into()))
    );
    let err = Config::from_yaml(&format!("access_log:\n  path: \"\"\n{MINIMAL}")).unwrap_err();
    assert!(err.to_string().contains("access_log.path"), "{err}");
    let err = Config::from_yaml(&format!("access_log:\n  enable: true\n{MINIMAL}")).unwrap_err();
    assert!(err.to_string().contains("enable"), "{err}");
}

#[test]
fn models_resolve_section() {
    let base = "server: {listen: 127.0.0.1:0}\nfleet:\n  nodes:\n    - {id: a, url: http://127.0.0.1:1, backend: openai}\n";
    let ok = format!("{base}models:\n  resolve:\n    fast: {{match: [\"claude-*haiku*\"]}}\n    strongest: {{match: [\"claude-*opus*\"], prefer: [\"qwen3-coder:*\"]}}\n");
    let c = Config::from_yaml(&ok).expect("valid");
    let tiers: Vec<_> = c.resolve.rules.iter().map(|r| r.tier).collect();
    assert_eq!(
        tiers,
        [
            crate::routing::ModelTier::Fast,
            crate::routing::ModelTier::Strongest
        ]
    );
    assert_eq!(c.resolve.rules[1].prefer, ["qwen3-coder:*"]);
    let empty = format!("{base}models:\n  resolve:\n    balanced: {{match: []}}\n");
    let e = Config::from_yaml(&empty).unwrap_err().to_string();
    assert!(
        e.contains("field `models.resolve.balanced.match`: empty"),
        "{e}"
    );
    let unknown = format!("{base}models:\n  resolve:\n    medium: {{match: [\"x\"]}}\n");
    assert!(Config::from_yaml(&unknown).is_err());
}

#[test]
fn work_stealing_is_on_unless_turned_off() {
    let c = validate(Config::parse(MINIMAL).unwrap()).unwrap();
    assert!(c.work_stealing);
    let yaml = format!("server:\n  work_stealing: false\n{MINIMAL}");
    let c = validate(Config::parse(&yaml).unwrap()).unwrap();
    assert!(!c.work_stealing);
}

#[test]
fn routing_mode_names_every_mode_and_rejects_a_misspelt_one() {
    for (name, mode) in [
        ("completion", crate::routing::Mode::Completion),
        ("spec", crate::routing::Mode::Spec),
        ("least-busy", crate::routing::Mode::LeastBusy),
        ("round-robin", crate::routing::Mode::RoundRobin),
    ] {
        let c = Config::from_yaml(&format!("{MINIMAL}routing:\n  mode: {name}\n")).expect(name);
        assert_eq!(c.routing.policy.mode, mode, "{name}");
    }
    let err = Config::from_yaml(&format!("{MINIMAL}routing:\n  mode: leastbusy\n")).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("leastbusy") && msg.contains("least-busy"),
        "{msg}"
    );
}
