//! Probe one URL: ask the endpoints each known server kind answers (read-only GETs, plus
//! Ollama's `/api/show` per model), then classify what came back. `classify` is pure.

use std::time::Duration;

use serde_json::Value;

use crate::config::Backend;

/// The server kinds `fleetgate init` recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ollama,
    Vllm,
    Sglang,
    Llamacpp,
    LmStudio,
    OpenAI,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ollama => "Ollama",
            Kind::Vllm => "vLLM",
            Kind::Sglang => "SGLang",
            Kind::Llamacpp => "llama.cpp server",
            Kind::LmStudio => "LM Studio",
            Kind::OpenAI => "an OpenAI-compatible server",
        }
    }

    /// The `backend:` the gateway polls it as.
    pub fn backend(self) -> Backend {
        match self {
            Kind::Ollama => Backend::Ollama,
            Kind::Vllm => Backend::Vllm,
            Kind::Llamacpp => Backend::Llamacpp,
            Kind::Sglang | Kind::LmStudio | Kind::OpenAI => Backend::Openai,
        }
    }
}

/// One model as the server reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Found {
    pub name: String,
    pub size_gb: Option<f64>,
    /// Context window: the model's (or server's) maximum.
    pub context: Option<u32>,
    /// The window it is loaded with now, when the server says (Ollama `/api/ps`).
    pub loaded_context: Option<u32>,
    pub loaded: bool,
}

/// What a URL turned out to be.
#[derive(Debug, Clone, PartialEq)]
pub struct Detected {
    pub kind: Kind,
    pub version: Option<String>,
    pub models: Vec<Found>,
    /// Requests served at once, when the server says (llama.cpp slots, SGLang max running).
    pub seats: Option<u32>,
}

/// The answers of the probe endpoints (None: no 2xx JSON/text answer).
#[derive(Debug, Default)]
pub struct Answers {
    pub ollama_version: Option<Value>,
    pub ollama_tags: Option<Value>,
    pub ollama_ps: Option<Value>,
    pub lmstudio_models: Option<Value>,
    pub sglang_model_info: Option<Value>,
    pub sglang_server_info: Option<Value>,
    pub llamacpp_props: Option<Value>,
    pub vllm_version: Option<Value>,
    pub openai_models: Option<Value>,
    pub metrics: Option<String>,
}

/// GET paths asked, in `Answers` order (for the "answers as nothing known" message).
pub const PATHS: [&str; 10] = [
    "/api/version",
    "/api/tags",
    "/api/ps",
    "/api/v0/models",
    "/get_model_info",
    "/get_server_info",
    "/props",
    "/version",
    "/v1/models",
    "/metrics",
];

const GB: f64 = 1_000_000_000.0;

async fn get(client: &reqwest::Client, base: &str, path: &str) -> Option<reqwest::Response> {
    let r = client.get(format!("{base}{path}")).send().await.ok()?;
    r.status().is_success().then_some(r)
}

async fn json(client: &reqwest::Client, base: &str, path: &str) -> Option<Value> {
    let v: Value = get(client, base, path).await?.json().await.ok()?;
    v.is_object().then_some(v)
}

/// Ask every probe endpoint of `base` (e.g. `http://10.0.0.7:11434`) at once. Err when nothing
/// accepts a connection at all.
pub async fn fetch(client: &reqwest::Client, base: &str) -> Result<Answers, String> {
    if let Err(e) = client.get(base).send().await {
        // The innermost cause says it best ("Connection refused (os error 111)").
        let mut cause: &dyn std::error::Error = &e;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        let what = if e.is_timeout() {
            "timed out".to_string()
        } else {
            cause.to_string()
        };
        return Err(format!("cannot connect: {what}"));
    }
    let (a, b, c, d, e, f, g, h, i) = tokio::join!(
        json(client, base, PATHS[0]),
        json(client, base, PATHS[1]),
        json(client, base, PATHS[2]),
        json(client, base, PATHS[3]),
        json(client, base, PATHS[4]),
        json(client, base, PATHS[5]),
        json(client, base, PATHS[6]),
        json(client, base, PATHS[7]),
        json(client, base, PATHS[8]),
    );
    let metrics = match get(client, base, PATHS[9]).await {
        Some(r) => r.text().await.ok(),
        None => None,
    };
    Ok(Answers {
        ollama_version: a,
        ollama_tags: b,
        ollama_ps: c,
        lmstudio_models: d,
        sglang_model_info: e,
        sglang_server_info: f,
        llamacpp_props: g,
        vllm_version: h,
        openai_models: i,
        metrics,
    })
}

/// Ollama's window per model: `model_info["<arch>.context_length"]` from `POST /api/show`.
pub async fn ollama_windows(client: &reqwest::Client, base: &str, models: &mut [Found]) {
    let shows = models.iter().map(|m| {
        let body = serde_json::json!({ "model": m.name });
        async move {
            let r = client
                .post(format!("{base}/api/show"))
                .json(&body)
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .ok()?;
            let v: Value = r.json().await.ok()?;
            context_of_show(&v)
        }
    });
    let windows = futures::future::join_all(shows).await;
    for (m, w) in models.iter_mut().zip(windows) {
        m.context = m.context.or(w);
    }
}

fn context_of_show(v: &Value) -> Option<u32> {
    let info = v.get("model_info")?.as_object()?;
    info.iter()
        .find(|(k, _)| k.ends_with(".context_length"))
        .and_then(|(_, v)| v.as_u64())
        .and_then(|n| u32::try_from(n).ok())
}

fn str_of(v: &Value, key: &str) -> Option<String> {
    v.get(key)?.as_str().map(str::to_string)
}

fn u32_of(v: &Value, key: &str) -> Option<u32> {
    v.get(key)?.as_u64().and_then(|n| u32::try_from(n).ok())
}

fn list<'a>(v: &'a Option<Value>, key: &str) -> Option<&'a Vec<Value>> {
    v.as_ref()?.get(key)?.as_array()
}

/// What the answers say the server is; None when they match no known kind.
pub fn classify(a: &Answers) -> Option<Detected> {
    if let (Some(ver), Some(tags)) = (&a.ollama_version, list(&a.ollama_tags, "models")) {
        return Some(ollama(ver, tags, list(&a.ollama_ps, "models")));
    }
    if let Some(data) = list(&a.lmstudio_models, "data") {
        if data
            .iter()
            .all(|m| m.get("state").is_some() || m.get("type").is_some())
        {
            return Some(lmstudio(data));
        }
    }
    let openai = list(&a.openai_models, "data");
    let owned_by = |who: &str| openai.is_some_and(|d| d.iter().any(|m| m["owned_by"] == who));
    if a.sglang_model_info
        .as_ref()
        .is_some_and(|v| v.get("model_path").is_some())
        || owned_by("sglang")
    {
        return Some(sglang(a, openai));
    }
    let props = a.llamacpp_props.as_ref().filter(|p| {
        p.get("default_generation_settings").is_some() || p.get("total_slots").is_some()
    });
    if let Some(p) = props {
        return Some(llamacpp(p, openai));
    }
    let vllm_metrics = a.metrics.as_deref().is_some_and(|m| m.contains("vllm:"));
    if owned_by("vllm") || vllm_metrics {
        let version = a.vllm_version.as_ref().and_then(|v| str_of(v, "version"));
        return Some(from_openai(Kind::Vllm, version, openai?, None));
    }
    openai.map(|d| from_openai(Kind::OpenAI, None, d, None))
}

fn ollama(ver: &Value, tags: &[Value], ps: Option<&Vec<Value>>) -> Detected {
    let mut models: Vec<Found> = tags
        .iter()
        .filter_map(|m| {
            Some(Found {
                name: str_of(m, "name").or_else(|| str_of(m, "model"))?,
                size_gb: m.get("size").and_then(Value::as_f64).map(|b| b / GB),
                ..Found::default()
            })
        })
        .collect();
    for p in ps.into_iter().flatten() {
        let Some(name) = str_of(p, "name").or_else(|| str_of(p, "model")) else {
            continue;
        };
        if let Some(m) = models.iter_mut().find(|m| m.name == name) {
            m.loaded = true;
            m.loaded_context = u32_of(p, "context_length");
        }
    }
    Detected {
        kind: Kind::Ollama,
        version: str_of(ver, "version"),
        models,
        seats: None,
    }
}

fn lmstudio(data: &[Value]) -> Detected {
    let models = data
        .iter()
        .filter_map(|m| {
            let loaded = m["state"] == "loaded";
            Some(Found {
                name: str_of(m, "id")?,
                size_gb: None,
                context: u32_of(m, "max_context_length"),
                loaded_context: u32_of(m, "loaded_context_length").filter(|_| loaded),
                loaded,
            })
        })
        .collect();
    Detected {
        kind: Kind::LmStudio,
        version: None,
        models,
        seats: None,
    }
}

fn sglang(a: &Answers, openai: Option<&Vec<Value>>) -> Detected {
    let info = a.sglang_server_info.as_ref();
    let context = info.and_then(|i| u32_of(i, "context_length"));
    let seats = info.and_then(|i| u32_of(i, "max_running_requests"));
    let version = info.and_then(|i| str_of(i, "version"));
    let mut d = match openai {
        Some(data) => from_openai(Kind::Sglang, version, data, context),
        None => Detected {
            kind: Kind::Sglang,
            version,
            models: a
                .sglang_model_info
                .as_ref()
                .and_then(|i| str_of(i, "model_path"))
                .map(|name| Found {
                    name,
                    context,
                    loaded: true,
                    ..Found::default()
                })
                .into_iter()
                .collect(),
            seats: None,
        },
    };
    d.seats = seats;
    d
}

fn llamacpp(props: &Value, openai: Option<&Vec<Value>>) -> Detected {
    let ctx = props
        .get("default_generation_settings")
        .and_then(|g| u32_of(g, "n_ctx"))
        .or_else(|| u32_of(props, "n_ctx"));
    let mut d = match openai {
        Some(data) => from_openai(Kind::Llamacpp, None, data, ctx),
        None => Detected {
            kind: Kind::Llamacpp,
            version: None,
            models: vec![],
            seats: None,
        },
    };
    d.version = str_of(props, "build_info");
    d.seats = u32_of(props, "total_slots").filter(|n| *n > 0);
    d
}

/// Models from an OpenAI `/v1/models` list: every listed model is served (loaded); the window
/// from `max_model_len` (vLLM, SGLang), llama.cpp's `meta.n_ctx_train`, or `context`.
fn from_openai(
    kind: Kind,
    version: Option<String>,
    data: &[Value],
    context: Option<u32>,
) -> Detected {
    let models = data
        .iter()
        .filter_map(|m| {
            Some(Found {
                name: str_of(m, "id")?,
                size_gb: None,
                context: context
                    .or_else(|| u32_of(m, "max_model_len"))
                    .or_else(|| m.get("meta").and_then(|x| u32_of(x, "n_ctx_train"))),
                loaded_context: None,
                loaded: true,
            })
        })
        .collect();
    Detected {
        kind,
        version,
        models,
        seats: None,
    }
}
