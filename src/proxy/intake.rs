//! Request intake: read the body (bounded), and turn body + `X-Fleet-*` headers into a
//! `RouteRequest`.

use bytes::Bytes;
use pingora::http::RequestHeader;
use pingora::Result;
use pingora_proxy::Session;

use crate::clients::{count_refusal, BodyBuf, Refusal, Refused};
use crate::config::Config;
use crate::fleet::Fleet;
use crate::protocol::{self, Endpoint, ErrorCode, ParsedRequest};
use crate::routing::{conversation_key, prefix_key, RouteRequest};

pub const PIN_HEADER: &str = "x-fleet-pin-node";
pub const CONVERSATION_HEADER: &str = "x-fleet-conversation";
pub const TAGS_HEADER: &str = "x-fleet-tags";
pub const NO_FALLBACK_HEADER: &str = "x-fleet-no-fallback";

/// Read the whole request body: at most `limits.max_body_bytes` (413), within
/// `clients.body_timeout_ms` (408), its buffer growing with what arrives and counted against
/// `clients.max_buffered_body_bytes` until the last copy of the body is dropped (503).
/// The outer `Result` is an I/O failure talking to the client.
pub async fn read_body(
    session: &mut Session,
    fleet: &Fleet,
) -> Result<Result<Bytes, (ErrorCode, String)>> {
    let config = fleet.config();
    let max = config.limits.max_body_bytes;
    let clients = &config.clients;
    let declared =
        header_str(session.req_header(), "content-length").and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > max) {
        session.set_keepalive(None);
        return Ok(Err(too_large(max)));
    }
    let expects_continue = header_str(session.req_header(), "expect")
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    if expects_continue {
        // The client waits for this before sending the body: answer at once.
        session
            .as_downstream_mut()
            .write_continue_response()
            .await?;
    }
    let mut buf = BodyBuf::new(fleet.clients.budget.clone());
    let read = async {
        while let Some(chunk) = session.read_request_body().await? {
            match buf.push(&chunk, max, clients.max_buffered_body_bytes) {
                Ok(()) => {}
                Err(Refused::TooLarge) => return Ok(Err(too_large(max))),
                Err(Refused::Budget) => {
                    count_refusal(Refusal::BodyBudget);
                    return Ok(Err((
                        ErrorCode::Overloaded,
                        format!(
                            "the gateway is holding its limit of request body bytes \
                             (clients.max_buffered_body_bytes = {}); retry shortly",
                            clients.max_buffered_body_bytes
                        ),
                    )));
                }
            }
        }
        Result::<Result<(), (ErrorCode, String)>>::Ok(Ok(()))
    };
    let outcome = match tokio::time::timeout(clients.body_timeout, read).await {
        Ok(r) => r?,
        Err(_) => {
            count_refusal(Refusal::BodyTimeout);
            Err((
                ErrorCode::RequestTimeout,
                format!(
                    "request body not complete within {} ms (clients.body_timeout_ms)",
                    clients.body_timeout.as_millis()
                ),
            ))
        }
    };
    match outcome {
        Ok(()) => Ok(Ok(buf.freeze())),
        Err(e) => {
            // The rest of the body is not read: the connection cannot carry another request.
            session.set_keepalive(None);
            Ok(Err(e))
        }
    }
}

fn too_large(max: usize) -> (ErrorCode, String) {
    (
        ErrorCode::RequestTooLarge,
        format!("request body exceeds the gateway limit of {max} bytes"),
    )
}

pub fn header_str<'a>(h: &'a RequestHeader, name: &str) -> Option<&'a str> {
    h.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

fn truthy(v: Option<&str>) -> bool {
    v.is_some_and(|v| {
        !matches!(
            v.to_ascii_lowercase().as_str(),
            "0" | "false" | "no" | "off"
        )
    })
}

/// Resolve a client-facing model name through the configured aliases.
pub fn resolve<'a>(config: &'a Config, model: &'a str) -> &'a str {
    config.aliases.get(model).map_or(model, String::as_str)
}

/// The tenant a request belongs to: a stable digest of its API key (`Authorization: Bearer`
/// or `x-api-key`), never the key itself; "anonymous" without one.
pub fn tenant(h: &RequestHeader) -> String {
    use sha2::{Digest, Sha256};
    let key = header_str(h, "authorization")
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim())
        .or_else(|| header_str(h, "x-api-key"));
    match key {
        Some(k) if !k.is_empty() => {
            let d = Sha256::digest(k.as_bytes());
            format!(
                "key-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
                d[0], d[1], d[2], d[3], d[4], d[5]
            )
        }
        _ => "anonymous".into(),
    }
}

/// The tenant that conversation keys are HMAC'd with: the configured tenant id with auth on
/// (all of a tenant's keys share its conversations), else the digest of the key (`tenant`).
pub fn affinity_tenant(config: &Config, h: &RequestHeader) -> String {
    if config.tenancy.auth_enabled() {
        crate::tenant::auth::identify(&config.tenancy, h)
            .unwrap_or("unauthenticated")
            .to_string()
    } else {
        tenant(h)
    }
}

/// Build what routing sees from the parsed body and the request headers.
/// `chars_per_token` is the primary model's, calibrated from what the nodes report.
pub fn route_request(
    config: &Config,
    ep: Endpoint,
    parsed: &ParsedRequest,
    h: &RequestHeader,
    chars_per_token: f64,
) -> RouteRequest {
    let primary = resolve(config, &parsed.model).to_string();
    let mut models = vec![primary.clone()];
    if !truthy(header_str(h, NO_FALLBACK_HEADER)) {
        let fallbacks = if parsed.fallback_models.is_empty() {
            config.fallbacks.get(&primary).cloned().unwrap_or_default()
        } else {
            parsed.fallback_models.clone()
        };
        for f in fallbacks {
            let f = resolve(config, &f).to_string();
            if !models.contains(&f) {
                models.push(f);
            }
        }
    }
    let mut required_tags: Vec<String> = header_str(h, TAGS_HEADER)
        .map(|v| {
            v.split(',')
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if parsed.images > 0 && !required_tags.iter().any(|t| t == "vision") {
        required_tags.push("vision".into());
    }
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    RouteRequest {
        models,
        seq: SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        family: Some(ep.family()),
        translatable: protocol::translate::translatable(ep).to_vec(),
        prompt_tokens: parsed.estimated_prompt_tokens(chars_per_token),
        // An embedding produces no output tokens: no reserve for them.
        max_output_tokens: if ep.is_embedding() {
            Some(0)
        } else {
            parsed.max_tokens
        },
        required_tags,
        pin: header_str(h, PIN_HEADER).map(str::to_string),
        affinity_key: affinity_key(config, parsed, h, &primary),
        require_warm: config.routing.require_warm || config.require_warm.contains(&primary),
        endpoint: Some(ep.label()),
        ..RouteRequest::default()
    }
}

/// The conversation key: `X-Fleet-Conversation` when given, else (completion mode with
/// `routing.prefix_affinity`) one derived from tenant + model + the stable prefix's hash.
/// Spec mode keeps spec 000's behaviour exactly: only header conversations are sticky.
fn affinity_key(
    config: &Config,
    parsed: &ParsedRequest,
    h: &RequestHeader,
    model: &str,
) -> Option<u64> {
    let secret = config.routing.affinity_secret.as_bytes();
    let tenant = affinity_tenant(config, h);
    if let Some(tag) = header_str(h, CONVERSATION_HEADER) {
        return Some(conversation_key(secret, &tenant, tag));
    }
    let implicit = config.routing.prefix_affinity
        && config.routing.policy.mode == crate::routing::Mode::Completion;
    let prefix = parsed.prefix.filter(|_| implicit)?;
    Some(prefix_key(secret, &tenant, model, prefix.hash))
}

/// Tokens of the conversation a node already caches, and which node: what this gateway saw
/// it serve last (prompt + output), else the stable prefix on the key's rendezvous node. That
/// last credit is what makes replicas agree on a conversation's node; it is whole for a later
/// turn or a declared conversation (`X-Fleet-Conversation`), and for a first turn scaled by
/// `PrefixMemory::first_turn_share`: the share of conversations that came back, times the
/// share of later turns this gateway did not remember placing. A one-shot request caches
/// nothing anyone will reuse (crediting its whole prompt piled one-shot traffic onto
/// rendezvous nodes), and a gateway that places every turn itself finds them by memory (the
/// credit sent a home lab's first prompts to a laptop 4x slower than the idle workstation,
/// and RAG prompts beside chats to whichever node their key named).
fn cached_prefix(
    fleet: &Fleet,
    parsed: &ParsedRequest,
    h: &RequestHeader,
    req: &mut RouteRequest,
    cpt: f64,
) {
    let Some(key) = req.affinity_key else { return };
    let stable = parsed.prefix.map_or(0, |p| tokens_of(p.chars, cpt));
    let (node, tokens) = match fleet.prefixes.recall(key, crate::services::now_ms()) {
        Some((idx, tokens)) if idx < fleet.len() => {
            (Some(fleet.node_config(idx).id.clone()), tokens.max(stable))
        }
        _ => {
            let declared = header_str(h, CONVERSATION_HEADER).is_some();
            let later = parsed.prefix.is_some_and(|p| p.continues);
            let share = if declared || later {
                1.0
            } else {
                fleet.prefixes.first_turn_share()
            };
            (None, (f64::from(stable) * share) as u32)
        }
    };
    req.cached_on = node;
    req.cached_prefix_tokens = tokens.min(req.prompt_tokens);
}

/// Parse a body read for `ep` and build its `RouteRequest`, with the prompt estimate using
/// the chars-per-token calibrated for the primary model; the error is a client's 400. The
/// proxy and both explain paths call this, so they estimate alike.
pub fn prepare(
    fleet: &Fleet,
    ep: Endpoint,
    body: &[u8],
    h: &RequestHeader,
) -> Result<(ParsedRequest, RouteRequest), String> {
    let parsed = protocol::parse(ep, body).map_err(|e| e.message)?;
    let config = fleet.config();
    let tiered = tier_model(fleet, &config, resolve(&config, &parsed.model));
    let primary = tiered
        .as_deref()
        .unwrap_or_else(|| resolve(&config, &parsed.model));
    let cpt = fleet
        .calibration
        .chars_per_token(primary, config.routing.chars_per_token);
    let mut req = route_request(&config, ep, &parsed, h, cpt);
    // The calibrated estimate: fitted template overhead + rate, never above what was served.
    let text =
        fleet
            .calibration
            .text_tokens(primary, parsed.prompt_chars, config.routing.chars_per_token);
    let fixed = u64::from(super::outcome::fixed_tokens(&parsed));
    req.prompt_tokens = u32::try_from(text.saturating_add(fixed)).unwrap_or(u32::MAX);
    if let Some(m) = tiered {
        req.require_warm |= config.require_warm.contains(&m);
        req.models[0] = m;
    }
    cached_prefix(fleet, &parsed, h, &mut req, cpt);
    if config.routing.prefix_affinity
        && config.routing.policy.mode == crate::routing::Mode::Completion
    {
        shared_prefix(fleet, &parsed, &mut req, cpt);
    }
    Ok((parsed, req))
}

/// A system prompt shorter than this is not looked for in caches: it saves little prefill,
/// and engines cache whole blocks (vLLM 16 tokens, OpenAI from 1,024), so a short one reads as
/// a miss and would teach a node's cache a reach too short for its long ones.
const MIN_SHARED_TOKENS: u32 = 128;

/// `chars` of prompt text in tokens, at `cpt` characters per token.
fn tokens_of(chars: usize, cpt: f64) -> u32 {
    (chars as f64 / cpt.max(0.5)) as u32
}

/// The request's system prompt, as cached on the nodes that last served it
/// (`fleet::prefix`): its key, its tokens, and those nodes.
fn shared_prefix(fleet: &Fleet, parsed: &ParsedRequest, req: &mut RouteRequest, cpt: f64) {
    let Some(p) = parsed.prefix else { return };
    let tokens = tokens_of(p.system_chars, cpt).min(req.prompt_tokens);
    let Some(model) = req.models.first().filter(|_| tokens >= MIN_SHARED_TOKENS) else {
        return;
    };
    let key = xxhash_rust::xxh3::xxh3_64_with_seed(model.as_bytes(), p.system_hash);
    req.shared_key = Some(key);
    req.shared_prefix_tokens = tokens;
    let served = fleet
        .prefixes
        .shared_on(key, model, crate::services::now_ms());
    for s in served.iter().filter(|s| s.node < fleet.len()) {
        req.shared_seen.push((s.node, s.since));
        if s.cached {
            req.shared_on.push(fleet.node_config(s.node).id.clone());
        }
    }
}

/// `models.resolve`: a model id no node has (`claude-sonnet-4-5`, `gpt-5-codex` ...) that a
/// tier rule matches, mapped to the fleet model serving that tier.
pub fn tier_model(fleet: &Fleet, config: &Config, model: &str) -> Option<String> {
    if config.resolve.rules.is_empty() {
        return None;
    }
    let view = fleet.view();
    if view.nodes.iter().any(|n| n.model(model).is_some()) {
        return None;
    }
    config.resolve.resolve(model, &view)
}

/// Chars per token for counting a prompt for `model` (alias and tier resolved, calibrated).
pub fn chars_per_token(fleet: &Fleet, model: &str) -> f64 {
    let config = fleet.config();
    let name = resolve(&config, model);
    let name = tier_model(fleet, &config, name).unwrap_or_else(|| name.to_string());
    fleet
        .calibration
        .chars_per_token(&name, config.routing.chars_per_token)
}
