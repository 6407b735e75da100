//! `fleetgate init`: probing a sim node (it answers as Ollama) and tiny fakes of vLLM, SGLang,
//! llama.cpp, LM Studio and a plain OpenAI-compatible server (bodies shaped like the real
//! servers'), writing a config that `fleetgate check` accepts, and refusing a URL that answers
//! as nothing known or not at all.

mod common;

use std::process::Command;

use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use common::*;
use fleetgate::init::{probe_url, Kind};
use serde_json::{json, Value};

const SIM: &str = "seats: 2\nmodels:\n  - {name: llama3.2:3b, size_gb: 2, context: 131072, loaded: true}\n  - {name: qwen2.5:32b, size_gb: 20, context: 32768}\n";

/// A fake server answering `routes` (path -> JSON or text body), 404 elsewhere.
fn fake(rt: &tokio::runtime::Runtime, routes: Vec<(&'static str, Value)>) -> String {
    let mut app = Router::new();
    for (path, body) in routes {
        app = app.route(
            path,
            get(move || {
                let body = body.clone();
                async move {
                    match body {
                        Value::String(s) => s.into_response(),
                        v => axum::Json(v).into_response(),
                    }
                }
            }),
        );
    }
    rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        format!("http://{addr}")
    })
}

fn vllm(rt: &tokio::runtime::Runtime) -> String {
    fake(rt, vec![
        ("/version", json!({"version": "0.6.3.post1"})),
        ("/v1/models", json!({"object": "list", "data": [{"id": "meta-llama/Llama-3.1-8B-Instruct", "object": "model", "created": 1730000000, "owned_by": "vllm", "root": "meta-llama/Llama-3.1-8B-Instruct", "parent": null, "max_model_len": 32768, "permission": []}]})),
        ("/metrics", json!("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.0\n")),
    ])
}

fn sglang(rt: &tokio::runtime::Runtime) -> String {
    fake(
        rt,
        vec![
            (
                "/get_model_info",
                json!({"model_path": "Qwen/Qwen2.5-7B-Instruct", "tokenizer_path": "Qwen/Qwen2.5-7B-Instruct", "is_generation": true}),
            ),
            (
                "/get_server_info",
                json!({"context_length": 32768, "max_running_requests": 48, "max_total_num_tokens": 400000, "version": "0.4.1"}),
            ),
            (
                "/v1/models",
                json!({"object": "list", "data": [{"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "created": 1730000000, "owned_by": "sglang", "root": "Qwen/Qwen2.5-7B-Instruct"}]}),
            ),
        ],
    )
}

fn llamacpp(rt: &tokio::runtime::Runtime) -> String {
    fake(
        rt,
        vec![
            (
                "/props",
                json!({"default_generation_settings": {"n_ctx": 8192, "temperature": 0.8}, "total_slots": 4, "model_path": "/models/qwen2.5-7b-instruct-q4_k_m.gguf", "chat_template": "...", "build_info": "b4520-3edfa7d3"}),
            ),
            ("/health", json!({"status": "ok"})),
            (
                "/v1/models",
                json!({"object": "list", "data": [{"id": "/models/qwen2.5-7b-instruct-q4_k_m.gguf", "object": "model", "created": 1730000000, "owned_by": "llamacpp", "meta": {"vocab_type": 2, "n_vocab": 152064, "n_ctx_train": 32768, "n_embd": 3584, "n_params": 7615616512u64, "size": 4677120000u64}}]}),
            ),
        ],
    )
}

fn lmstudio(rt: &tokio::runtime::Runtime) -> String {
    fake(
        rt,
        vec![
            (
                "/api/v0/models",
                json!({"object": "list", "data": [
            {"id": "qwen2.5-7b-instruct", "object": "model", "type": "llm", "publisher": "lmstudio-community", "arch": "qwen2", "compatibility_type": "gguf", "quantization": "Q4_K_M", "state": "loaded", "max_context_length": 32768, "loaded_context_length": 4096},
            {"id": "text-embedding-nomic-embed-text-v1.5", "object": "model", "type": "embeddings", "publisher": "nomic-ai", "arch": "nomic-bert", "compatibility_type": "gguf", "quantization": "Q4_K_M", "state": "not-loaded", "max_context_length": 2048}]}),
            ),
            (
                "/v1/models",
                json!({"object": "list", "data": [{"id": "qwen2.5-7b-instruct", "object": "model", "owned_by": "organization_owner"}]}),
            ),
        ],
    )
}

fn plain_openai(rt: &tokio::runtime::Runtime) -> String {
    fake(
        rt,
        vec![(
            "/v1/models",
            json!({"object": "list", "data": [{"id": "gpt-oss-20b", "object": "model", "created": 0, "owned_by": "organization-owner"}]}),
        )],
    )
}

fn unknown(rt: &tokio::runtime::Runtime) -> String {
    fake(
        rt,
        vec![("/", json!("<html><body>It works!</body></html>"))],
    )
}

#[test]
fn each_kind_is_detected_with_models_windows_and_seats() {
    let rt = runtime();
    let sim_node = sim(&rt, SIM);
    let urls = [
        format!("http://{}", sim_node.addr()),
        vllm(&rt),
        sglang(&rt),
        llamacpp(&rt),
        lmstudio(&rt),
        plain_openai(&rt),
    ];
    let c = client();
    let got: Vec<_> = rt.block_on(async {
        let mut v = Vec::new();
        for u in &urls {
            v.push(
                probe_url(&c, u)
                    .await
                    .unwrap_or_else(|e| panic!("{u}: {e}")),
            );
        }
        v
    });
    let kinds: Vec<Kind> = got.iter().map(|p| p.detected.kind).collect();
    assert_eq!(
        kinds,
        [
            Kind::Ollama,
            Kind::Vllm,
            Kind::Sglang,
            Kind::Llamacpp,
            Kind::LmStudio,
            Kind::OpenAI
        ]
    );
    let ollama = &got[0].detected;
    assert_eq!(ollama.version.as_deref(), Some("0.6.8"));
    let names: Vec<_> = ollama
        .models
        .iter()
        .map(|m| (m.name.as_str(), m.context, m.loaded))
        .collect();
    assert_eq!(
        names,
        [
            ("llama3.2:3b", Some(131072), true),
            ("qwen2.5:32b", Some(32768), false)
        ],
        "windows from /api/show, loaded from /api/ps"
    );
    assert!(ollama.models[1]
        .size_gb
        .is_some_and(|s| (s - 20.0).abs() < 0.5));
    let one = |i: usize| {
        let d = &got[i].detected;
        (d.models[0].name.clone(), d.models[0].context, d.seats)
    };
    assert_eq!(
        one(1),
        ("meta-llama/Llama-3.1-8B-Instruct".into(), Some(32768), None)
    );
    assert_eq!(got[1].detected.version.as_deref(), Some("0.6.3.post1"));
    assert_eq!(
        one(2),
        ("Qwen/Qwen2.5-7B-Instruct".into(), Some(32768), Some(48))
    );
    assert_eq!(
        one(3),
        (
            "/models/qwen2.5-7b-instruct-q4_k_m.gguf".into(),
            Some(8192),
            Some(4)
        ),
        "llama.cpp: the slots' window and total_slots"
    );
    let lms = &got[4].detected;
    assert_eq!(lms.models.len(), 2);
    assert_eq!(
        (lms.models[0].loaded, lms.models[0].loaded_context),
        (true, Some(4096))
    );
    assert!(!lms.models[1].loaded);
    assert_eq!(one(5), ("gpt-oss-20b".into(), None, None));
}

fn fleetgate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fleetgate"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run fleetgate")
}

#[test]
fn init_writes_a_config_that_check_accepts_and_refuses_what_it_cannot_tell() {
    let rt = runtime();
    let sim_node = sim(&rt, SIM);
    // As users paste it: an OpenAI base URL.
    let sim_url = format!("http://{}/v1", sim_node.addr());
    let (v, l, o) = (vllm(&rt), llamacpp(&rt), plain_openai(&rt));
    let dir = std::env::temp_dir().join(format!("fleetgate-init-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fleet.yaml");
    let _ = std::fs::remove_file(&file);
    let file_s = file.to_str().unwrap();

    let out = fleetgate(&["init", &sim_url, &v, &l, &o, "--output", file_s]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "init failed: {stderr}");
    assert!(stderr.contains("Ollama 0.6.8, 2 model(s)"), "{stderr}");
    let text = std::fs::read_to_string(&file).expect("config written");
    let check = fleetgate(&["check", file_s]);
    assert!(
        check.status.success(),
        "check refused what init wrote:\n{}\n{text}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(String::from_utf8_lossy(&check.stdout).contains("(4 nodes)"));
    let yaml: Value = serde_yaml::from_str(&text).expect("YAML");
    let nodes = yaml["fleet"]["nodes"].as_array().expect("nodes");
    let backends: Vec<_> = nodes
        .iter()
        .map(|n| n["backend"].as_str().unwrap())
        .collect();
    assert_eq!(backends, ["ollama", "vllm", "llamacpp", "openai"]);
    // All on 127.0.0.1: ids made unique by port.
    let ids: std::collections::BTreeSet<_> =
        nodes.iter().map(|n| n["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert_eq!(nodes[0]["url"], sim_url.trim_end_matches("/v1"));
    assert_eq!(
        nodes[0]["models"][0],
        json!({"name": "llama3.2:3b", "size_gb": 2.0, "context": 131072})
    );
    assert_eq!(nodes[2]["capacity"], 4, "llama.cpp slots");
    assert!(
        text.contains("# capacity: 4   # seats: vLLM does not report max_num_seqs"),
        "{text}"
    );
    // Writing over an existing file needs --force.
    let again = fleetgate(&["init", &sim_url, "--output", file_s]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));

    // A web server that is no inference server, and a closed port: clear errors, nothing written.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let bad_file = dir.join("bad.yaml");
    let out = fleetgate(&[
        "init",
        &unknown(&rt),
        &closed,
        &sim_url,
        "-o",
        bad_file.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("answers HTTP, but as nothing fleetgate knows (asked /api/version"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{closed}: cannot connect: Connection refused")),
        "{stderr}"
    );
    assert!(stderr.contains("no config written"), "{stderr}");
    assert!(!bad_file.exists());
    let _ = std::fs::remove_dir_all(&dir);
}
