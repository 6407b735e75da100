//! llama.cpp server: `/v1/models`, `/props` (context size, slots) and `/slots` (which slots are
//! busy; often disabled, then only `/props` counts).

use serde::Deserialize;

use super::{get_json, openai, BackendPoll};

#[derive(Deserialize, Default)]
pub(super) struct Props {
    #[serde(default)]
    total_slots: Option<u32>,
    #[serde(default)]
    n_ctx: Option<u32>,
    #[serde(default)]
    default_generation_settings: Option<GenSettings>,
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

pub(super) async fn poll(client: &reqwest::Client, base: &str) -> Result<BackendPoll, String> {
    let (models, props, slots) = tokio::join!(
        openai::models(client, base),
        get_json::<Props>(client, format!("{base}/props")),
        get_json::<Vec<Slot>>(client, format!("{base}/slots")),
    );
    let mut models = models?;
    let props = props.unwrap_or_default();
    let ctx = props
        .default_generation_settings
        .as_ref()
        .and_then(|g| g.n_ctx)
        .or(props.n_ctx);
    let busy = slots.ok().map(|s| busy_slots(&s));
    let seats = props.total_slots.filter(|n| *n > 0);
    for m in &mut models {
        // One model per llama.cpp server: the slots' context is what it is loaded with.
        if let Some(c) = ctx {
            m.context = Some(c);
        }
        if let Some(b) = busy {
            m.running = Some(b);
            m.waiting = Some(0);
        }
    }
    Ok(BackendPoll { models, seats })
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
}
