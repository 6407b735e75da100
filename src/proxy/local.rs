//! Endpoints the gateway answers from fleet state: model lists, version, show, count_tokens.

use bytes::Bytes;
use pingora::Result;
use pingora_proxy::Session;

use super::{intake, respond};
use crate::fleet::Fleet;
use crate::protocol::{self, Endpoint, ErrorCode, Family, Local, ModelInfo};
use crate::routing::FleetView;

const GB: f64 = 1_000_000_000.0;

/// Every model the live fleet has, aggregated by name over the nodes that are up.
pub fn models(view: &FleetView) -> Vec<ModelInfo> {
    let mut out: Vec<ModelInfo> = Vec::new();
    for node in view
        .nodes
        .iter()
        .filter(|n| n.health != crate::routing::Health::Offline)
    {
        for m in &node.models {
            let info = match out.iter_mut().find(|i| i.name == m.name) {
                Some(i) => i,
                None => {
                    out.push(ModelInfo {
                        name: m.name.clone(),
                        size_bytes: 0,
                        context_length: 0,
                        loaded: false,
                        resident_bytes: 0,
                        nodes: Vec::new(),
                        embedding: crate::routing::embedding_name(&m.name),
                    });
                    out.last_mut().expect("just pushed")
                }
            };
            info.size_bytes = info.size_bytes.max((m.size_gb * GB) as u64);
            info.context_length = info.context_length.max(m.max_context);
            info.loaded |= m.loaded;
            if m.loaded {
                let resident = m.resident_gb.unwrap_or(m.size_gb);
                info.resident_bytes = info.resident_bytes.max((resident * GB) as u64);
            }
            info.nodes.push(node.id.clone());
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Answer a local endpoint.
pub async fn answer(session: &mut Session, fleet: &Fleet, local: Local) -> Result<()> {
    let view = fleet.view();
    let models = models(&view);
    let body = match local {
        Local::OpenAIModels => protocol::openai_models(&models, crate::services::now_ms() / 1000),
        Local::OllamaTags => protocol::ollama_tags(&models),
        Local::OllamaPs => protocol::ollama_ps(&models),
        Local::OllamaVersion => protocol::ollama_version(env!("CARGO_PKG_VERSION")),
        Local::Root => Bytes::from_static(b"Ollama is running"),
        Local::OllamaShow => {
            let body = match intake::read_body(session, fleet).await? {
                Ok(b) => b,
                Err((code, msg)) => {
                    return respond::error(session, Family::Ollama, code, &msg).await
                }
            };
            match protocol::ollama_show(&body, &models) {
                Ok(b) => b,
                Err((code, msg)) => {
                    return respond::error(session, Family::Ollama, code, &msg).await
                }
            }
        }
        Local::AnthropicCountTokens => {
            let body = match intake::read_body(session, fleet).await? {
                Ok(b) => b,
                Err((code, msg)) => {
                    return respond::error(session, Family::Anthropic, code, &msg).await
                }
            };
            match protocol::parse(Endpoint::AnthropicMessages, &body) {
                Ok(p) => protocol::count_tokens_body(
                    p.estimated_prompt_tokens(intake::chars_per_token(fleet, &p.model)),
                ),
                Err(e) => {
                    return respond::error(
                        session,
                        Family::Anthropic,
                        ErrorCode::InvalidRequest,
                        &e.message,
                    )
                    .await
                }
            }
        }
    };
    if local == Local::Root {
        let mut h = pingora::http::ResponseHeader::build(200, Some(2))?;
        h.insert_header("content-type", "text/plain; charset=utf-8")?;
        h.insert_header("content-length", body.len().to_string())?;
        let head = session.req_header().method == http::Method::HEAD;
        session.write_response_header(Box::new(h), head).await?;
        if !head {
            session.write_response_body(Some(body), true).await?;
        }
        return Ok(());
    }
    respond::json(session, 200, body, None).await
}
