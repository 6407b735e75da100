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
