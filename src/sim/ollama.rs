//! Ollama `/api/chat` and `/api/generate`: NDJSON streams by default, pre-warm and unload requests.

use super::control::{Fault, SimControl};
use super::engine::{ensure_loaded, plan, Ask, Finish, Reject, Summary};
use super::http::{content_hash, execute, intake, json, text_of, typed, Intake, NDJSON};
use super::models::KeepAlive;
use super::prefix::{chain_tokens, message_chain, raw_chain, tools_text};
use super::stream::Framer;
use super::text::{est_tokens, rfc3339};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::SystemTime;

#[derive(Deserialize, Default)]
pub(crate) struct Options {
    #[serde(default)]
    num_predict: Option<i64>,
}

#[derive(Deserialize)]
struct Msg {
    #[serde(default)]
    role: String,
    #[serde(default)]
    content: Value,
}

#[derive(Deserialize)]
struct ChatReq {
    #[serde(default)]
    model: String,
    #[serde(default)]
    messages: Vec<Msg>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    keep_alive: Option<Value>,
    #[serde(default)]
    options: Option<Options>,
    #[serde(default)]
    tools: Option<Value>,
}

#[derive(Deserialize)]
struct GenReq {
    #[serde(default)]
    model: String,
    #[serde(default)]
    prompt: String,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    keep_alive: Option<Value>,
    #[serde(default)]
    options: Option<Options>,
}

/// Ollama's error body.
pub(crate) fn err(status: StatusCode, msg: &str) -> Response {
    json(status, json!({ "error": msg }))
}

pub(crate) fn not_found(model: &str) -> Response {
    err(StatusCode::NOT_FOUND, &format!("model '{model}' not found"))
}

pub(crate) fn server_error() -> Response {
    err(
        StatusCode::INTERNAL_SERVER_ERROR,
        "llama runner process has terminated: exit status 2",
    )
}

fn reject(r: Reject, what: &str) -> Response {
    match r {
        Reject::UnknownModel(m) => not_found(&m),
        Reject::Context { context, prompt, completion } => err(
            StatusCode::BAD_REQUEST,
            &format!(
                "input length exceeds the context length: {prompt} prompt + {completion} predict tokens > {context}"
            ),
        ),
        Reject::NotSupported(m) => err(StatusCode::BAD_REQUEST, &format!("\"{m}\" does not support {what}")),
    }
}

/// Ollama keep_alive: seconds as a number, or a Go duration string ("5m", "1h30m", "0", "-1").
pub(crate) fn keep_alive(v: Option<&Value>) -> Result<KeepAlive, String> {
    let secs = match v {
        None | Some(Value::Null) => return Ok(KeepAlive::Default),
        Some(Value::Number(n)) => n.as_f64().unwrap_or(0.0),
        Some(Value::String(s)) => {
            parse_duration(s).ok_or_else(|| format!("time: invalid duration \"{s}\""))?
        }
        Some(other) => return Err(format!("invalid keep_alive: {other}")),
    };
    Ok(if secs < 0.0 {
        KeepAlive::Forever
    } else if secs == 0.0 {
        KeepAlive::Unload
    } else {
        KeepAlive::For(std::time::Duration::from_secs_f64(secs.min(1e12)))
    })
}

fn parse_duration(s: &str) -> Option<f64> {
    let s = s.trim();
    if let Ok(n) = s.parse::<f64>() {
        return n.is_finite().then_some(n);
    }
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest[..n_end].parse().ok()?;
        rest = &rest[n_end..];
        let u_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * unit;
        rest = &rest[u_end..];
    }
    Some(if neg { -total } else { total })
}

fn max_tokens(o: &Option<Options>) -> Option<u32> {
    let n = o.as_ref()?.num_predict?;
    (n >= 0).then(|| u32::try_from(n).unwrap_or(u32::MAX))
}

fn done_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
    }
}

fn final_fields(obj: &mut serde_json::Map<String, Value>, s: &Summary, cached_count: bool) {
    obj.insert("done_reason".into(), json!(done_reason(s.finish)));
    obj.insert("done".into(), json!(true));
    obj.insert("total_duration".into(), json!(Summary::ns(s.total)));
    obj.insert("load_duration".into(), json!(Summary::ns(s.load)));
    if cached_count {
        // Newer Ollama: the whole prompt, and the part its cache held.
        obj.insert("prompt_eval_count".into(), json!(s.prompt_tokens));
        obj.insert("prompt_eval_cached_count".into(), json!(s.cached_tokens));
    } else {
        // Older Ollama: the tokens evaluated, without those reused from its prompt cache.
        obj.insert(
            "prompt_eval_count".into(),
            json!(s.prompt_tokens - s.cached_tokens),
        );
    }
    obj.insert(
        "prompt_eval_duration".into(),
        json!(Summary::ns(s.prompt_eval)),
    );
    obj.insert("eval_count".into(), json!(s.completion_tokens));
    obj.insert("eval_duration".into(), json!(Summary::ns(s.eval)));
}

/// Chat puts text in `message.content`, generate in `response`.
struct OllamaFramer {
    model: String,
    chat: bool,
    /// `SimSpec::ollama_cached_count`.
    cached_count: bool,
}

impl OllamaFramer {
    fn object(&self, text: &str, done: bool) -> serde_json::Map<String, Value> {
        let mut o = serde_json::Map::new();
        o.insert("model".into(), json!(self.model));
        o.insert("created_at".into(), json!(rfc3339(SystemTime::now())));
        if self.chat {
            o.insert(
                "message".into(),
                json!({"role": "assistant", "content": text}),
            );
        } else {
            o.insert("response".into(), json!(text));
        }
        o.insert("done".into(), json!(done));
        o
    }
}

impl Framer for OllamaFramer {
    fn token(&mut self, _index: usize, text: &str) -> String {
        format!("{}\n", Value::Object(self.object(text, false)))
    }
    fn tail(&mut self, s: &Summary) -> String {
        let mut o = self.object("", true);
        final_fields(&mut o, s, self.cached_count);
        format!("{}\n", Value::Object(o))
    }
}

/// Empty prompt / messages: load (or with keep_alive 0, unload) and answer at once.
async fn load_or_unload(
    ctl: &Arc<SimControl>,
    model: &str,
    keep: KeepAlive,
    chat: bool,
) -> Response {
    let idx = ctl.models.lock().find(model);
    let Some(idx) = idx else {
        return not_found(model);
    };
    let reason = if keep == KeepAlive::Unload {
        ctl.models.lock().unload(idx);
        "unload"
    } else {
        if ctl.until_killed(ensure_loaded(ctl, idx)).await.is_err() {
            return super::http::gone();
        }
        ctl.models.lock().touch(idx, keep);
        "load"
    };
    let f = OllamaFramer {
        model: model.to_string(),
        chat,
        cached_count: false,
    };
    let mut o = f.object("", true);
    o.insert("done_reason".into(), json!(reason));
    json(StatusCode::OK, Value::Object(o))
}

/// What every Ollama inference endpoint does first: count the request, apply a 500 fault,
/// parse the body into `T`, require a model and read `keep_alive`. `fields` gives the model
/// and the keep_alive value of a `T`. An error comes back as the response to send.
pub(crate) async fn ollama_request<T: serde::de::DeserializeOwned>(
    ctl: &Arc<SimControl>,
    path: &str,
    body: &[u8],
    fields: fn(&T) -> (&str, Option<&Value>),
) -> Result<(T, KeepAlive, tokio::time::Instant), Response> {
    let Intake { json: v, started } = intake(ctl, path, body).await?;
    if ctl.fault() == Fault::Status500 {
        return Err(server_error());
    }
    let req: T = typed(&v).map_err(|e| err(StatusCode::BAD_REQUEST, &e))?;
    let (model, keep) = fields(&req);
    if model.is_empty() {
        return Err(err(StatusCode::BAD_REQUEST, "model is required"));
    }
    let keep = keep_alive(keep).map_err(|e| err(StatusCode::BAD_REQUEST, &e))?;
    Ok((req, keep, started))
}

pub(crate) async fn chat(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    fn fields(r: &ChatReq) -> (&str, Option<&Value>) {
        (r.model.as_str(), r.keep_alive.as_ref())
    }
    let (req, keep, started) = match ollama_request(&ctl, "/api/chat", &body, fields).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if req.messages.is_empty() {
        return load_or_unload(&ctl, &req.model, keep, true).await;
    }
    let texts: Vec<(String, String)> = req
        .messages
        .iter()
        .map(|m| (m.role.clone(), text_of(&m.content)))
        .collect();
    let parts: Vec<&str> = texts
        .iter()
        .flat_map(|(r, t)| [r.as_str(), t.as_str()])
        .collect();
    let tools = tools_text(req.tools.as_ref());
    let chain = message_chain(&req.model, None, &texts, tools.as_deref());
    let ask = Ask {
        model: req.model.clone(),
        prompt_tokens: chain_tokens(&chain),
        max_tokens: max_tokens(&req.options),
        hash: content_hash(&req.model, &parts),
        embed: false,
        keep_alive: keep,
        chain,
    };
    run(&ctl, ask, started, req.stream.unwrap_or(true), true).await
}

pub(crate) async fn generate(State(ctl): State<Arc<SimControl>>, body: Bytes) -> Response {
    fn fields(r: &GenReq) -> (&str, Option<&Value>) {
        (r.model.as_str(), r.keep_alive.as_ref())
    }
    let (req, keep, started) = match ollama_request(&ctl, "/api/generate", &body, fields).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if req.prompt.is_empty() {
        return load_or_unload(&ctl, &req.model, keep, false).await;
    }
    let system = req.system.unwrap_or_default();
    let ask = Ask {
        model: req.model.clone(),
        prompt_tokens: est_tokens(&system).saturating_add(est_tokens(&req.prompt)),
        max_tokens: max_tokens(&req.options),
        hash: content_hash(&req.model, &[&system, &req.prompt]),
        embed: false,
        keep_alive: keep,
        chain: raw_chain(&req.model, &system, &req.prompt),
    };
    run(&ctl, ask, started, req.stream.unwrap_or(true), false).await
}

async fn run(
    ctl: &Arc<SimControl>,
    ask: Ask,
    started: tokio::time::Instant,
    stream: bool,
    chat: bool,
) -> Response {
    let what = if chat { "chat" } else { "generate" };
    let p = match plan(ctl, &ask) {
        Ok(p) => p,
        Err(r) => return reject(r, what),
    };
    let cached_count = ctl.spec.ollama_cached_count;
    let framer = OllamaFramer {
        model: ask.model.clone(),
        chat,
        cached_count,
    };
    let whole = {
        let f = OllamaFramer {
            model: ask.model.clone(),
            chat,
            cached_count,
        };
        move |text: String, s: &Summary| {
            let mut o = f.object(&text, true);
            final_fields(&mut o, s, cached_count);
            Value::Object(o)
        }
    };
    execute(ctl, p, started, stream.then_some((framer, NDJSON)), whole).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_forms() {
        assert_eq!(keep_alive(None), Ok(KeepAlive::Default));
        assert_eq!(keep_alive(Some(&json!(0))), Ok(KeepAlive::Unload));
        assert_eq!(keep_alive(Some(&json!("0"))), Ok(KeepAlive::Unload));
        assert_eq!(keep_alive(Some(&json!("0s"))), Ok(KeepAlive::Unload));
        assert_eq!(keep_alive(Some(&json!(-1))), Ok(KeepAlive::Forever));
        assert_eq!(keep_alive(Some(&json!("-1m"))), Ok(KeepAlive::Forever));
        assert_eq!(
            keep_alive(Some(&json!("1h30m"))),
            Ok(KeepAlive::For(std::time::Duration::from_secs(5400)))
        );
        assert!(keep_alive(Some(&json!("5 parsecs"))).is_err());
        assert!(keep_alive(Some(&json!("m"))).is_err());
        assert!(keep_alive(Some(&json!([1]))).is_err());
    }
}
