//! The official Python SDKs (openai, ollama, anthropic), unmodified, against a real gateway.
//! `scripts/test.sh` installs them into `.venv` and sets FLEETGATE_TEST_PYTHON.

mod common;

use common::*;

#[test]
fn official_sdks_work_with_only_the_base_url_changed() {
    let python = std::env::var("FLEETGATE_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("FLEETGATE_TEST_PYTHON is not set: run scripts/test.sh, which installs the SDKs into .venv")
    });
    let rt = runtime();
    let a = sim(
        &rt,
        "seats: 4\ntokens_per_sec: 500\nttft_ms: 5\nreply_tokens: 6\nmodels:\n  - {name: llama3.2:3b, size_gb: 2, loaded: true}\n",
    );
    let gw = Gateway::start(&fleet(&[node("sdk-a", &a, "")]));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/clients.py");
    let out = std::process::Command::new(python)
        .args([script, &format!("http://{}", gw.addr), "llama3.2:3b"])
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all SDK checks passed"), "{stdout}");
    assert_eq!(
        served(&a),
        6,
        "two OpenAI, two Ollama, two Anthropic requests reached the node"
    );
}

/// A node that serves only `serves`; `node_yaml` says how the gateway sees it.
fn translated(serves: &[fleetgate::routing::Family], backend: &str, mode: &str) {
    let python = std::env::var("FLEETGATE_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("FLEETGATE_TEST_PYTHON is not set: run scripts/test.sh, which installs the SDKs into .venv")
    });
    let rt = runtime();
    let spec = serde_yaml::from_str(
        "seats: 4\ntokens_per_sec: 500\nttft_ms: 5\nreply_tokens: 6\nmodels:\n  - {name: llama3.2:3b, size_gb: 2, loaded: true}\n  - {name: nomic-embed-text:latest, size_gb: 0.3, loaded: true, embedding: true}\n",
    )
    .expect("spec");
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let sim = rt
        .block_on(fleetgate::sim::start_serving(spec, l, serves))
        .expect("sim");
    let yaml = format!(
        "fleet:\n  nodes:\n    - id: only\n      url: http://{}\n{backend}",
        sim.addr()
    );
    let gw = Gateway::start(&yaml);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/translated.py");
    let out = std::process::Command::new(python)
        .args([
            script,
            &format!("http://{}", gw.addr),
            "llama3.2:3b",
            "nomic-embed-text:latest",
            mode,
        ])
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all SDK checks passed"), "{stdout}");
    assert!(served(&sim) > 0);
}

#[test]
fn ollama_anthropic_and_responses_sdks_on_an_openai_only_node() {
    use fleetgate::routing::Family;
    translated(
        &[Family::OpenAI],
        "      backend: openai\n      capacity: 4\n",
        "openai-node",
    );
}

#[test]
fn openai_sdk_on_an_ollama_only_node() {
    use fleetgate::routing::Family;
    translated(
        &[Family::Ollama],
        "      backend: sim\n      protocols: [ollama]\n",
        "ollama-node",
    );
}
