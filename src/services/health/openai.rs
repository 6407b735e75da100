//! OpenAI-compatible servers: `/v1/models` (every listed model is served, i.e. loaded).

use serde::Deserialize;

use super::{get_json, BackendPoll, GB};
use crate::fleet::LiveModel;

#[derive(Deserialize)]
pub(super) struct OpenAIList {
    #[serde(default)]
    pub data: Vec<OpenAIModel>,
}

#[derive(Deserialize)]
pub(super) struct OpenAIModel {
    pub id: String,
    /// vLLM
    #[serde(default)]
    pub max_model_len: Option<u32>,
    /// llama.cpp: `meta.n_ctx_train`, `meta.size`
    #[serde(default)]
    pub meta: Option<Meta>,
}

#[derive(Deserialize)]
pub(super) struct Meta {
    #[serde(default)]
    pub n_ctx_train: Option<u32>,
    /// The model file's bytes: what a (re)load reads, e.g. when a sleeping server wakes.
    #[serde(default)]
    pub size: Option<u64>,
}

pub(super) async fn models(client: &reqwest::Client, base: &str) -> Result<Vec<LiveModel>, String> {
    let list = get_json::<OpenAIList>(client, format!("{base}/v1/models")).await?;
    Ok(to_models(list))
}

pub(super) fn to_models(list: OpenAIList) -> Vec<LiveModel> {
    let mut models: Vec<LiveModel> = list
        .data
        .into_iter()
        .map(|m| LiveModel {
            name: m.id,
            context: m
                .max_model_len
                .or_else(|| m.meta.as_ref().and_then(|x| x.n_ctx_train)),
            size_gb: m.meta.and_then(|x| x.size).map_or(0.0, |b| b as f64 / GB),
            loaded: true,
            on_disk: true,
            ..LiveModel::default()
        })
        .collect();
    models.sort_by(|a, b| a.name.cmp(&b.name));
    models
}

pub(super) async fn poll(client: &reqwest::Client, base: &str) -> Result<BackendPoll, String> {
    Ok(BackendPoll {
        models: models(client, base).await?,
        seats: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llamacpp_models_carry_their_window_and_file_size() {
        // As llama.cpp's server sends it (vLLM has `max_model_len` and no `meta`).
        let list: OpenAIList = serde_json::from_str(
            r#"{"object":"list","data":[{"id":"qwen","object":"model","owned_by":"llamacpp","meta":{"vocab_type":2,"n_vocab":152064,"n_ctx_train":32768,"n_embd":3584,"n_params":7615616512,"size":4677120000}},{"id":"plain","object":"model"}]}"#,
        )
        .unwrap();
        let m = to_models(list);
        assert_eq!(m[1].name, "qwen");
        assert_eq!(m[1].context, Some(32768));
        assert!((m[1].size_gb - 4.67712).abs() < 1e-9, "{}", m[1].size_gb);
        assert_eq!(m[0].size_gb, 0.0, "no meta: size unknown");
    }
}
