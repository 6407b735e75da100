//! Ollama: `/api/tags` (models on disk, sizes) and `/api/ps` (loaded, resident size, context).

use serde::Deserialize;

use super::{get_json, BackendPoll, GB};
use crate::fleet::LiveModel;

#[derive(Deserialize)]
pub(super) struct OllamaList {
    #[serde(default)]
    pub models: Vec<OllamaModel>,
}

#[derive(Deserialize)]
pub(super) struct OllamaModel {
    pub name: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub context_length: Option<u32>,
}

pub(super) async fn poll(client: &reqwest::Client, base: &str) -> Result<BackendPoll, String> {
    let (tags, ps) = tokio::join!(
        get_json::<OllamaList>(client, format!("{base}/api/tags")),
        get_json::<OllamaList>(client, format!("{base}/api/ps")),
    );
    Ok(BackendPoll {
        models: merge(tags?, ps?),
        seats: None,
    })
}

/// On-disk models from `tags`, marked loaded (with resident size and context) from `ps`.
pub(super) fn merge(tags: OllamaList, ps: OllamaList) -> Vec<LiveModel> {
    let mut models: Vec<LiveModel> = tags
        .models
        .into_iter()
        .map(|m| LiveModel {
            name: m.name,
            size_gb: m.size as f64 / GB,
            on_disk: true,
            ..LiveModel::default()
        })
        .collect();
    for p in ps.models {
        let idx = match models.iter().position(|m| m.name == p.name) {
            Some(i) => i,
            None => {
                models.push(LiveModel {
                    name: p.name.clone(),
                    ..LiveModel::default()
                });
                models.len() - 1
            }
        };
        let m = &mut models[idx];
        m.loaded = true;
        m.resident_gb = Some(p.size as f64 / GB);
        m.context = p.context_length;
    }
    models.sort_by(|a, b| a.name.cmp(&b.name));
    models
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ps_marks_loaded_with_resident_size() {
        let tags: OllamaList = serde_json::from_str(
            r#"{"models":[{"name":"b:1b","size":1000000000},{"name":"a:7b","size":4000000000}]}"#,
        )
        .unwrap();
        let ps: OllamaList = serde_json::from_str(
            r#"{"models":[{"name":"a:7b","size":5500000000,"context_length":8192,"expires_at":"2030-01-01T00:00:00Z"}]}"#,
        )
        .unwrap();
        let m = merge(tags, ps);
        assert_eq!(m[0].name, "a:7b");
        assert!(m[0].loaded && m[0].on_disk);
        assert_eq!(m[0].resident_gb, Some(5.5));
        assert_eq!(m[0].context, Some(8192));
        assert!(!m[1].loaded);
        assert_eq!(m[1].size_gb, 1.0);
    }
}
