//! `fleetgate init URL...`: probe each URL (Ollama, vLLM, SGLang, llama.cpp, LM Studio, any
//! OpenAI-compatible server), detect its kind, models, windows and seats, and write a commented
//! config that `fleetgate check` accepts. A URL that answers as nothing known is an error that
//! names what was asked.

pub mod probe;
mod render;

use std::path::Path;
use std::time::Duration;

pub use probe::{Detected, Found, Kind};
pub use render::render;

/// One probed URL.
#[derive(Debug, Clone)]
pub struct Probed {
    /// The URL as given, normalised to `scheme://host:port` (no trailing slash).
    pub url: String,
    pub detected: Detected,
}

/// `http://host[:port][/][v1]` -> `http://host:port`; the port defaults from the scheme (an
/// OpenAI base URL's `/v1` is the server's root plus the API prefix, so it is dropped).
pub fn normalise(url: &str) -> Result<String, String> {
    let with_scheme = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    let u = reqwest::Url::parse(&with_scheme).map_err(|e| format!("{url}: not a URL ({e})"))?;
    if u.scheme() != "http" {
        return Err(format!(
            "{url}: only http:// node URLs are supported (got {}://)",
            u.scheme()
        ));
    }
    let host = u.host_str().ok_or_else(|| format!("{url}: no host"))?;
    let port = u.port_or_known_default().unwrap_or(80);
    let path = u.path().trim_end_matches('/');
    if !path.is_empty() && path != "/v1" {
        return Err(format!(
            "{url}: give the server's root URL (without {})",
            u.path()
        ));
    }
    Ok(format!("http://{host}:{port}"))
}

/// Probe one URL: what kind of server it is, its models with windows, and its seats.
pub async fn probe_url(client: &reqwest::Client, url: &str) -> Result<Probed, String> {
    let base = normalise(url)?;
    let answers = probe::fetch(client, &base)
        .await
        .map_err(|e| format!("{base}: {e}"))?;
    let Some(mut detected) = probe::classify(&answers) else {
        return Err(format!(
            "{base}: answers HTTP, but as nothing fleetgate knows (asked {}; none answered like Ollama, vLLM, SGLang, llama.cpp, LM Studio or an OpenAI-compatible /v1/models)",
            probe::PATHS.join(", ")
        ));
    };
    if detected.kind == Kind::Ollama {
        probe::ollama_windows(client, &base, &mut detected.models).await;
    }
    Ok(Probed {
        url: base,
        detected,
    })
}

/// Probe every URL concurrently; Ok with all of them, or Err with every failure.
pub async fn probe_all(urls: &[String]) -> Result<Vec<Probed>, Vec<String>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(3))
        .build()
        .unwrap_or_default();
    let results = futures::future::join_all(urls.iter().map(|u| probe_url(&client, u))).await;
    let (ok, errors): (Vec<_>, Vec<_>) = results.into_iter().partition(Result::is_ok);
    if errors.is_empty() {
        Ok(ok.into_iter().flatten().collect())
    } else {
        Err(errors.into_iter().filter_map(Result::err).collect())
    }
}

/// `fleetgate init`: probe, render, validate, write; returns the exit code (64: refusing to
/// overwrite, 1: a URL failed or the file could not be written).
pub fn cli(urls: &[String], output: Option<&Path>, force: bool) -> u8 {
    if let Some(out) = output.filter(|o| o.exists() && !force) {
        eprintln!(
            "fleetgate init: {} exists (use --force to overwrite)",
            out.display()
        );
        return 64;
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fleetgate init: {e}");
            return 1;
        }
    };
    let probed = match rt.block_on(probe_all(urls)) {
        Ok(p) => p,
        Err(errors) => {
            for e in errors {
                eprintln!("fleetgate init: {e}");
            }
            eprintln!("fleetgate init: no config written");
            return 1;
        }
    };
    for p in &probed {
        let d = &p.detected;
        eprintln!(
            "{}: {}{}, {} model(s)",
            p.url,
            d.kind.name(),
            d.version
                .as_deref()
                .map(|v| format!(" {v}"))
                .unwrap_or_default(),
            d.models.len()
        );
    }
    let text = render(&probed, &format!("fleetgate init {}", urls.join(" ")));
    // What `fleetgate check` will say: the file must load.
    if let Err(e) = crate::config::Config::from_yaml(&text) {
        eprintln!(
            "fleetgate init: the written config does not validate (a bug): {}",
            e.0.join("; ")
        );
        return 1;
    }
    match output {
        None => {
            print!("{text}");
            0
        }
        Some(out) => match std::fs::write(out, &text) {
            Ok(()) => {
                eprintln!("wrote {}", out.display());
                0
            }
            Err(e) => {
                eprintln!("fleetgate init: {}: {e}", out.display());
                1
            }
        },
    }
}
