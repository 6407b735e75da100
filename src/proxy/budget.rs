//! Output budget fit (spec 003's lease `maxTokens`, opt-in per model with
//! `models.clamp_output`): when prompt + requested output overflow every window but the prompt
//! fits, route on the prompt alone and clamp the output budget to what the chosen node's
//! window leaves, saying so in `X-Fleet-Max-Tokens`, instead of letting the node answer 400.

use bytes::Bytes;
use serde_json::Value;

use crate::protocol::{Endpoint, Family};
use crate::routing::{FleetView, NodeView, RouteRequest};

pub const MAX_TOKENS_HEADER: &str = "x-fleet-max-tokens";

/// The fewest output tokens a clamped request is routed with ("the prompt fits").
const MIN_OUTPUT: u32 = 1;

fn needed(req: &RouteRequest, node: &NodeView, output: u32) -> u64 {
    u64::from(req.prompt_tokens) + u64::from(output) + u64::from(node.overhead_tokens)
}

fn output(req: &RouteRequest, node: &NodeView) -> u32 {
    req.max_output_tokens.unwrap_or(node.output_reserve)
}

/// Whether some node's window for a candidate model fits the request as asked.
fn fits_somewhere(req: &RouteRequest, view: &FleetView) -> bool {
    view.nodes.iter().any(|n| {
        req.models.iter().any(|name| {
            n.model(name).is_some_and(|m| {
                m.max_context == 0 || needed(req, n, output(req, n)) <= u64::from(m.max_context)
            })
        })
    })
}

/// The request to route: `req` itself, or (opt-in, nothing fits as asked) `req` with the
/// smallest output budget, to be clamped once a node is chosen.
pub fn routable(req: &RouteRequest, view: &FleetView, opted_in: bool) -> Option<RouteRequest> {
    if !opted_in || fits_somewhere(req, view) {
        return None;
    }
    Some(RouteRequest {
        max_output_tokens: Some(MIN_OUTPUT),
        ..req.clone()
    })
}

/// The output budget that fits `model`'s window on `node` for `req` (as first asked), when the
/// asked budget does not.
pub fn clamp_for(req: &RouteRequest, node: &NodeView, model: &str) -> Option<u32> {
    let window = u64::from(node.model(model)?.max_context);
    let asked = output(req, node);
    if window == 0 || needed(req, node, asked) <= window {
        return None;
    }
    let room = window.checked_sub(needed(req, node, 0))?;
    u32::try_from(room).ok().filter(|r| *r >= MIN_OUTPUT)
}

/// `body` with its output budget set to `max` in the field its protocol uses.
pub fn rewrite(ep: Endpoint, body: &[u8], max: u32) -> Option<Bytes> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    match ep.family() {
        Family::Ollama => {
            let options = obj
                .entry("options")
                .or_insert_with(|| Value::Object(Default::default()));
            options
                .as_object_mut()?
                .insert("num_predict".into(), max.into());
        }
        Family::Anthropic => {
            obj.insert("max_tokens".into(), max.into());
        }
        Family::OpenAI => {
            let field = if ep == Endpoint::OpenAIResponses {
                "max_output_tokens"
            } else if obj.contains_key("max_completion_tokens") {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            obj.insert(field.into(), max.into());
        }
    }
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::ModelView;

    fn node(window: u32) -> NodeView {
        NodeView {
            id: "n".into(),
            output_reserve: 1024,
            models: vec![ModelView {
                name: "m".into(),
                max_context: window,
                ..ModelView::default()
            }],
            ..NodeView::default()
        }
    }

    fn req(prompt: u32, out: Option<u32>) -> RouteRequest {
        RouteRequest {
            models: vec!["m".into()],
            prompt_tokens: prompt,
            max_output_tokens: out,
            ..RouteRequest::default()
        }
    }

    #[test]
    fn clamps_only_what_overflows_and_only_when_opted_in() {
        let view = FleetView {
            nodes: vec![node(4096)],
        };
        assert!(
            routable(&req(1000, Some(2000)), &view, true).is_none(),
            "fits as asked"
        );
        assert!(
            routable(&req(3000, Some(2000)), &view, false).is_none(),
            "not opted in"
        );
        let r = routable(&req(3000, Some(2000)), &view, true).expect("clamped route");
        assert_eq!(r.max_output_tokens, Some(MIN_OUTPUT));
        assert_eq!(
            clamp_for(&req(3000, Some(2000)), &view.nodes[0], "m"),
            Some(1096)
        );
        assert_eq!(clamp_for(&req(1000, Some(2000)), &view.nodes[0], "m"), None);
        assert_eq!(
            clamp_for(&req(5000, Some(10)), &view.nodes[0], "m"),
            None,
            "prompt alone overflows"
        );
    }

    #[test]
    fn rewrites_the_field_each_protocol_uses() {
        let set = |ep, body: &str| {
            let b = rewrite(ep, body.as_bytes(), 7).expect("json");
            serde_json::from_slice::<Value>(&b).expect("json")
        };
        let chat = set(Endpoint::OpenAIChat, r#"{"model":"m","max_tokens":900}"#);
        assert_eq!(chat["max_tokens"], 7);
        let newer = set(
            Endpoint::OpenAIChat,
            r#"{"model":"m","max_completion_tokens":900}"#,
        );
        assert_eq!(newer["max_completion_tokens"], 7);
        let ollama = set(
            Endpoint::OllamaChat,
            r#"{"model":"m","options":{"temperature":0}}"#,
        );
        assert_eq!(ollama["options"]["num_predict"], 7);
        assert_eq!(ollama["options"]["temperature"], 0);
        let anthropic = set(
            Endpoint::AnthropicMessages,
            r#"{"model":"m","max_tokens":900}"#,
        );
        assert_eq!(anthropic["max_tokens"], 7);
    }
}
