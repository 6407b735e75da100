//! Per-node validation: ids, URLs (resolved at load), seats, sim blocks, the agent section.

use std::collections::HashSet;
use std::net::{SocketAddr, ToSocketAddrs};

use super::*;
use crate::routing::Family;

/// Check the `agent:` section (used by `fleetgate agent`; validated with the rest).
pub fn validate_agent(errors: &mut Vec<String>, a: &AgentFile) {
    for (field, url) in [
        ("gateway_url", &a.gateway_url),
        ("backend_url", &a.backend_url),
    ] {
        if let Err(why) = parse_url(url) {
            errors.push(format!("field `agent.{field}`: value {url:?}: {why}"));
        }
    }
    if !valid_id(&a.node_id) {
        errors.push(format!(
            "field `agent.node_id`: value {:?}: expected letters, digits, '-', '_' or '.'",
            a.node_id
        ));
    }
    if a.interval_ms < 100 {
        errors.push(format!(
            "field `agent.interval_ms`: value {}: expected at least 100",
            a.interval_ms
        ));
    }
    for (field, v) in [
        ("memory_gb", a.memory_gb),
        ("bandwidth_gbps", a.bandwidth_gbps),
    ] {
        if v.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
            errors.push(format!(
                "field `agent.{field}`: value {}: expected a positive number",
                v.unwrap_or_default()
            ));
        }
    }
}

/// Node ids: non-empty, letters, digits, '-', '_' or '.' (they become metric labels).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

pub(super) fn validate_node(
    errors: &mut Vec<String>,
    i: usize,
    n: NodeFile,
    seen: &mut HashSet<String>,
) -> Option<NodeConfig> {
    let at = format!("fleet.nodes[{i}]");
    let before = errors.len();
    if !valid_id(&n.id) {
        errors.push(format!(
            "field `{at}.id`: value {:?}: expected letters, digits, '-', '_' or '.'",
            n.id
        ));
    } else if !seen.insert(n.id.clone()) {
        errors.push(format!(
            "field `{at}.id`: value {:?}: expected a unique id (used twice)",
            n.id
        ));
    }
    let (host, addr) = match parse_url(&n.url) {
        Ok(v) => v,
        Err(why) => {
            errors.push(format!("field `{at}.url`: value {:?}: {why}", n.url));
            (String::new(), SocketAddr::from(([127, 0, 0, 1], 0)))
        }
    };
    for (field, v) in [("capacity", n.capacity), ("hard_cap", n.hard_cap)] {
        if v == Some(0) {
            errors.push(format!(
                "field `{at}.{field}`: value 0: expected at least 1"
            ));
        }
    }
    if let (Some(c), Some(h)) = (n.capacity, n.hard_cap) {
        if h < c {
            errors.push(format!(
                "field `{at}.hard_cap`: value {h}: expected at least capacity ({c})"
            ));
        }
    }
    for (field, v) in [
        ("memory_gb", n.memory_gb),
        ("bandwidth_gbps", n.bandwidth_gbps),
        ("prefill_tokens_per_sec", n.prefill_tokens_per_sec),
        ("decode_tokens_per_sec", n.decode_tokens_per_sec),
        ("load_gbps", n.load_gbps),
    ] {
        if v.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
            errors.push(format!(
                "field `{at}.{field}`: value {}: expected a positive number",
                v.unwrap_or_default()
            ));
        }
    }
    match (n.backend, &n.sim) {
        (Backend::Sim, Some(sim)) if sim.models.is_empty() => errors.push(format!(
            "field `{at}.sim.models`: empty: expected at least one model"
        )),
        (b, Some(_)) if b != Backend::Sim => errors.push(format!(
            "field `{at}.sim`: set on backend {b:?}: expected only with backend sim"
        )),
        _ => {}
    }
    for (j, m) in n.models.iter().enumerate() {
        if m.name.is_empty() {
            errors.push(format!(
                "field `{at}.models[{j}].name`: empty: expected a model name"
            ));
        }
    }
    if errors.len() > before {
        return None;
    }
    let protocols_fixed = n.protocols.is_some();
    let families = n.protocols.unwrap_or_else(|| default_families(n.backend));
    let seats = n
        .capacity
        .or_else(|| n.sim.as_ref().map(|s| s.seats.max(1)));
    let memory_gb = n.memory_gb.or_else(|| n.sim.as_ref().map(|s| s.memory_gb));
    Some(NodeConfig {
        id: n.id,
        url: n.url,
        addr,
        host,
        backend: n.backend,
        seats,
        hard_cap: n.hard_cap,
        memory_gb,
        bandwidth_gbps: n.bandwidth_gbps,
        prefill_tps: n.prefill_tokens_per_sec,
        decode_tps: n.decode_tokens_per_sec,
        load_gbps: n.load_gbps,
        tier: n.tier,
        tags: n.tags,
        families,
        protocols_fixed,
        max_context: n.max_context,
        output_reserve: n.output_reserve.unwrap_or(1024),
        overhead_tokens: n.overhead_tokens,
        models: n.models,
        sim: n.sim,
        learning: n.learning,
        dynamic: false,
    })
}

/// Wire protocols a backend speaks when the config does not say.
pub fn default_families(b: Backend) -> Vec<Family> {
    match b {
        Backend::Ollama => vec![Family::OpenAI, Family::Ollama],
        Backend::Openai | Backend::Vllm => vec![Family::OpenAI],
        // llama.cpp's server also answers Anthropic's `/v1/messages` itself.
        Backend::Llamacpp => vec![Family::OpenAI, Family::Anthropic],
        Backend::Sim => vec![Family::OpenAI, Family::Ollama, Family::Anthropic],
    }
}

impl NodeConfig {
    /// A node that registered through a heartbeat: what the agent told us, defaults for the rest.
    pub fn dynamic(
        id: &str,
        url: &str,
        backend: Backend,
        memory_gb: Option<f64>,
        bandwidth_gbps: Option<f64>,
        output_reserve: u32,
    ) -> Result<NodeConfig, String> {
        if !valid_id(id) {
            return Err(format!(
                "node id {id:?}: expected letters, digits, '-', '_' or '.'"
            ));
        }
        let (host, addr) = parse_url(url).map_err(|why| format!("backend_url {url:?}: {why}"))?;
        Ok(NodeConfig {
            id: id.to_string(),
            url: url.to_string(),
            addr,
            host,
            backend,
            seats: None,
            hard_cap: None,
            memory_gb: memory_gb.filter(|v| v.is_finite() && *v > 0.0),
            bandwidth_gbps: bandwidth_gbps.filter(|v| v.is_finite() && *v > 0.0),
            prefill_tps: None,
            decode_tps: None,
            load_gbps: None,
            tier: Tier::Provisional,
            tags: Vec::new(),
            families: default_families(backend),
            protocols_fixed: false,
            max_context: None,
            output_reserve,
            overhead_tokens: 0,
            models: Vec::new(),
            sim: None,
            learning: false,
            dynamic: true,
        })
    }
}

/// `http://host:port` -> (Host header value, resolved address).
pub fn parse_url(url: &str) -> Result<(String, SocketAddr), String> {
    let rest = match url.split_once("://") {
        Some(("http", rest)) => rest,
        Some(("https", _)) => {
            return Err("expected an http:// URL (TLS upstreams are not supported yet)".into())
        }
        _ => return Err("expected a URL such as http://192.168.1.20:11434".into()),
    };
    let host = rest.split('/').next().unwrap_or_default();
    if rest.len() > host.len() + 1 {
        return Err(
            "expected no path after host:port (the gateway keeps the client's path)".into(),
        );
    }
    if host.is_empty() {
        return Err("expected a host after http://".into());
    }
    let with_port = if host
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.chars().all(|c| c.is_ascii_digit()))
    {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    let addr = with_port
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {with_port}: {e}"))?
        .next()
        .ok_or_else(|| format!("{with_port} resolves to no address"))?;
    Ok((host.to_string(), addr))
}
