//! llama.cpp server: `/v1/models`, `/props` (context per slot, slot count, `is_sleeping`) and
//! `/metrics` (requests processing / deferred). None of these wakes a server started with
//! `--sleep-idle-seconds`; `GET /slots` does (it reloads the model), so it is read only from a
//! server that has neither `/metrics` nor a sleep state (an older build), for its busy slots.

use serde::Deserialize;

use super::{get_json, get_text, openai, BackendPoll};

#[derive(Deserialize, Default)]
pub(super) struct Props {
    #[serde(default)]
    total_slots: Option<u32>,
    #[serde(default)]
    n_ctx: Option<u32>,
    #[serde(default)]
    default_generation_settings: Option<GenSettings>,
    /// Present on servers that can sleep (`--sleep-idle-seconds`): true while the model is
    /// unloaded; the next request reloads it.
    #[serde(default)]
    is_sleeping: Option<bool>,
}

#[derive(Deserialize, Default)]
struct GenSettings {
    #[serde(default)]
    n_ctx: Option<u32>,
}

#[derive(Deserialize)]
pub(super) struct Slot {
    /// Newer servers.
    #[serde(default)]
    is_processing: Option<bool>,
    /// Older servers: 0 idle, 1 processing.
    #[serde(default)]
    state: Option<u32>,
}

/// Running and waiting requests from `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Load {
    pub running: u32,
    pub waiting: u32,
}

pub(super) async fn poll(client: &reqwest::Client, base: &str) -> Result<BackendPoll, String> {
    let (models, props, metrics) = tokio::join!(
        openai::models(client, base),
        get_json::<Props>(client, format!("{base}/props")),
        get_text(client, format!("{base}/metrics")),
    );
    let mut models = models?;
    let props = props.unwrap_or_default();
    let mut load = metrics.ok().and_then(|t| parse_metrics(&t));
    if load.is_none() && props.is_sleeping.is_none() {
        let slots = get_json::<Vec<Slot>>(client, format!("{base}/slots")).await;
        load = slots.ok().map(|s| Load {
            running: busy_slots(&s),
            waiting: 0,
        });
    }
    let ctx = props
        .default_generation_settings
        .as_ref()
        .and_then(|g| g.n_ctx)
        .or(props.n_ctx);
    let sleeping = props.is_sleeping == Some(true);
    let seats = props.total_slots.filter(|n| *n > 0);
    for m in &mut models {
        // One model per llama.cpp server: the slots' context is what it is loaded with.
        if let Some(c) = ctx {
            m.context = Some(c);
        }
        // Asleep: the weights are unloaded and the next request pays the reload (cold).
        m.loaded = !sleeping;
        if let Some(l) = load {
            m.running = Some(l.running);
            m.waiting = Some(l.waiting);
        }
    }
    Ok(BackendPoll { models, seats })
}

/// `llamacpp:requests_processing` and `llamacpp:requests_deferred`; None when neither is there.
pub(super) fn parse_metrics(text: &str) -> Option<Load> {
    let value = |name: &str| {
        text.lines().find_map(|l| {
            let v = l.strip_prefix(name)?.strip_prefix(' ')?;
            let v: f64 = v.split_whitespace().next()?.parse().ok()?;
            Some(if v.is_finite() && v > 0.0 {
                v as u32
            } else {
                0
            })
        })
    };
    let running = value("llamacpp:requests_processing");
    let waiting = value("llamacpp:requests_deferred");
    if running.is_none() && waiting.is_none() {
        return None;
    }
    Some(Load {
        running: running.unwrap_or(0),
        waiting: waiting.unwrap_or(0),
    })
}

pub(super) fn busy_slots(slots: &[Slot]) -> u32 {
    slots
        .iter()
        .filter(|s| s.is_processing.unwrap_or(s.state == Some(1)))
        .count() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn props_and_slots_shapes() {
        let p: Props = serde_json::from_str(
            r#"{"default_generation_settings":{"n_ctx":4096,"temperature":0.8},"total_slots":4,"model_path":"/m/x.gguf","chat_template":"..."}"#,
        )
        .unwrap();
        assert_eq!(p.total_slots, Some(4));
        assert_eq!(p.default_generation_settings.unwrap().n_ctx, Some(4096));
        assert_eq!(p.is_sleeping, None);
        let new: Vec<Slot> = serde_json::from_str(
            r#"[{"id":0,"n_ctx":4096,"is_processing":true},{"id":1,"is_processing":false}]"#,
        )
        .unwrap();
        assert_eq!(busy_slots(&new), 1);
        let old: Vec<Slot> =
            serde_json::from_str(r#"[{"id":0,"state":1},{"id":1,"state":1},{"id":2,"state":0}]"#)
                .unwrap();
        assert_eq!(busy_slots(&old), 2);
    }

    #[test]
    fn sleeping_props_and_metrics_as_a_real_server_sends_them() {
        // Trimmed from xllamacpp 2026.10 (llama.cpp server) with --sleep-idle-seconds.
        let p: Props = serde_json::from_str(
            r#"{"default_generation_settings":{"params":{"seed":1},"n_ctx":1024},"total_slots":2,"model_alias":"smollm2","is_sleeping":true,"endpoint_slots":true}"#,
        )
        .unwrap();
        assert_eq!(p.is_sleeping, Some(true));
        assert_eq!(p.default_generation_settings.unwrap().n_ctx, Some(1024));
        let text = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed\n\
            # TYPE llamacpp:prompt_tokens_total counter\n\
            llamacpp:prompt_tokens_total 31\n\
            llamacpp:requests_processing 2\n\
            llamacpp:requests_deferred 3\n\
            llamacpp:n_busy_slots_per_decode 0\n";
        assert_eq!(
            parse_metrics(text),
            Some(Load {
                running: 2,
                waiting: 3
            })
        );
        assert_eq!(parse_metrics("llamacpp:prompt_tokens_total 1\n"), None);
    }
}
