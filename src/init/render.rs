//! The config `fleetgate init` writes: YAML with a comment on every choice, one node per URL.

use std::collections::HashSet;
use std::fmt::Write;

use super::{Kind, Probed};

/// A node id from the URL's host (`gpu-box.lan` -> `gpu-box`, `10.0.0.7` -> `node-10-0-0-7`),
/// made unique with the port, then a counter.
fn node_id(url: &str, taken: &mut HashSet<String>) -> String {
    let hostport = url.trim_start_matches("http://");
    let (host, port) = hostport.rsplit_once(':').unwrap_or((hostport, ""));
    let host = host.trim_matches(['[', ']']);
    let is_ip = host.parse::<std::net::IpAddr>().is_ok();
    let base = if is_ip {
        format!("node-{host}")
    } else {
        host.split('.').next().unwrap_or(host).to_string()
    };
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .collect::<String>()
            .split('-')
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join("-")
            .to_ascii_lowercase()
    };
    let mut id = clean(&base);
    if id.is_empty() {
        id = "node".into();
    }
    if taken.contains(&id) {
        id = format!("{id}-{port}");
    }
    let stem = id.clone();
    let mut n = 2;
    while taken.contains(&id) {
        id = format!("{stem}-{n}");
        n += 1;
    }
    taken.insert(id.clone());
    id
}

/// A YAML-safe scalar (JSON strings are YAML).
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

fn seats_comment(kind: Kind) -> &'static str {
    match kind {
        Kind::Ollama => "Ollama does not report them (OLLAMA_NUM_PARALLEL)",
        Kind::Vllm => "vLLM does not report max_num_seqs",
        Kind::LmStudio => "LM Studio does not report them",
        _ => "the server does not report them",
    }
}

fn window(n: Option<u32>) -> String {
    n.map_or("unknown".into(), |n| n.to_string())
}

fn node(out: &mut String, p: &Probed, id: &str) {
    let d = &p.detected;
    let loaded = d.models.iter().filter(|m| m.loaded).count();
    let version = d
        .version
        .as_deref()
        .map(|v| format!(" {v}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "\n    # {}: {}{version}; {} model(s), {loaded} loaded.",
        p.url,
        d.kind.name(),
        d.models.len()
    );
    let _ = writeln!(out, "    - id: {id}");
    let _ = writeln!(out, "      url: {}", p.url);
    let backend = serde_json::to_value(d.kind.backend())
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "openai".into());
    let why = match d.kind {
        Kind::Sglang | Kind::LmStudio => format!("   # {} speaks the OpenAI API", d.kind.name()),
        _ => String::new(),
    };
    let _ = writeln!(out, "      backend: {backend}{why}");
    match d.seats {
        Some(n) => {
            let src = if d.kind == Kind::Llamacpp {
                "llama.cpp /props total_slots"
            } else {
                "SGLang /get_server_info max_running_requests"
            };
            let _ = writeln!(out, "      capacity: {n}   # seats, from {src}");
        }
        None => {
            let _ = writeln!(
                out,
                "      # capacity: 4   # seats: {}; default: derived from memory_gb, else 1",
                seats_comment(d.kind)
            );
        }
    }
    let _ = writeln!(
        out,
        "      # memory_gb: 64   # RAM/VRAM for models: memory fit and derived seats"
    );
    if d.models.is_empty() {
        let _ = writeln!(
            out,
            "      # no models reported yet: the gateway polls for them"
        );
        return;
    }
    if d.kind == Kind::Ollama {
        // Ollama reports a window only for loaded models: the static list gives the others'.
        let _ = writeln!(
            out,
            "      models:   # windows from /api/show; remove a line when the model leaves the node"
        );
        for m in &d.models {
            let mut fields = format!("name: {}", quoted(&m.name));
            if let Some(s) = m.size_gb {
                let _ = write!(fields, ", size_gb: {:.1}", (s * 10.0).round() / 10.0);
            }
            if let Some(c) = m.context {
                let _ = write!(fields, ", context: {c}");
            }
            let state = match (m.loaded, m.loaded_context) {
                (true, Some(c)) => format!("   # loaded, window {c} now"),
                (true, None) => "   # loaded".into(),
                _ => String::new(),
            };
            let _ = writeln!(out, "        - {{ {fields} }}{state}");
        }
    } else {
        let _ = writeln!(
            out,
            "      # models (the server reports them at every poll; for reference):"
        );
        for m in &d.models {
            let _ = writeln!(
                out,
                "      #   {}  window {}{}",
                m.name,
                window(m.loaded_context.or(m.context)),
                if m.loaded { "" } else { "  (not loaded)" }
            );
        }
    }
}

/// The whole config file for the probed URLs; `command` is quoted in the header.
pub fn render(probed: &[Probed], command: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# fleetgate config written by `{command}`.");
    let _ = writeln!(
        out,
        "# Validate it with `fleetgate check FILE`, run it with `fleetgate run --config FILE`;"
    );
    let _ = writeln!(
        out,
        "# every key is documented in conf/fleetgate.yaml. Clients use http://THIS-HOST:8080."
    );
    out.push_str(concat!(
        "server:\n",
        "  listen: 0.0.0.0:8080          # clients' base URL (OpenAI, Ollama, Anthropic APIs)\n",
        "  admin_listen: 127.0.0.1:9090  # fleet page (/), /metrics, /fleet/status\n",
        "  # admin_token: change-me      # enables pause/drain/resume (or FLEETGATE_ADMIN_TOKEN)\n",
        "\n",
        "health:\n",
        "  poll_interval_ms: 5000        # how often each node is asked what it has loaded\n",
        "\n",
        "fleet:\n",
        "  nodes:\n",
    ));
    let mut taken = HashSet::new();
    for p in probed {
        let id = node_id(&p.url, &mut taken);
        node(&mut out, p, &id);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_from_hosts_are_unique_and_clean() {
        let mut t = HashSet::new();
        assert_eq!(node_id("http://gpu-box.lan:8000", &mut t), "gpu-box");
        assert_eq!(node_id("http://gpu-box.lan:8001", &mut t), "gpu-box-8001");
        assert_eq!(node_id("http://10.0.0.7:11434", &mut t), "node-10-0-0-7");
        assert_eq!(
            node_id("http://10.0.0.7:11434", &mut t),
            "node-10-0-0-7-11434"
        );
        assert_eq!(
            node_id("http://10.0.0.7:11434", &mut t),
            "node-10-0-0-7-11434-2"
        );
        assert_eq!(node_id("http://[::1]:80", &mut t), "node-1");
    }
}
