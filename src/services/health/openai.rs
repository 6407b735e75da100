//! OpenAI-compatible servers: `/v1/models` (every listed model is served, i.e. loaded).

use serde::Deserialize;

use super::{get_json, BackendPoll};
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
    /// llama.cpp: `meta.n_ctx_train`
    #[serde(default)]
    pub meta: Option<Meta>,
}

#[derive(Deserialize)]
pub(super) struct Meta {
    #[serde(default)]
    pub n_ctx_train: Option<u32>,
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
                .or_else(|| m.meta.and_then(|x| x.n_ctx_train)),
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
