//! vLLM: `/v1/models` plus `/metrics` (`vllm:num_requests_running` / `_waiting` per model), so
//! load from other clients of the same server counts.

use std::collections::HashMap;

use super::{get_text, openai, BackendPoll};

pub(super) async fn poll(client: &reqwest::Client, base: &str) -> Result<BackendPoll, String> {
    let (models, metrics) = tokio::join!(
        openai::models(client, base),
        get_text(client, format!("{base}/metrics")),
    );
    let mut models = models?;
    // `/metrics` is optional (it can be disabled); the model list decides whether the node is up.
    if let Ok(text) = metrics {
        let load = parse_metrics(&text);
        for m in &mut models {
            if let Some((running, waiting)) = load.get(&m.name) {
                m.running = Some(*running);
                m.waiting = Some(*waiting);
            }
        }
    }
    Ok(BackendPoll {
        models,
        seats: None,
    })
}

/// Running and waiting requests per `model_name` label (summed over engines).
pub(super) fn parse_metrics(text: &str) -> HashMap<String, (u32, u32)> {
    let mut out: HashMap<String, (u32, u32)> = HashMap::new();
    for line in text.lines() {
        let (running, rest) = if let Some(r) = line.strip_prefix("vllm:num_requests_running{") {
            (true, r)
        } else if let Some(r) = line.strip_prefix("vllm:num_requests_waiting{") {
            (false, r)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once('}') else {
            continue;
        };
        let Some(model) = label(labels, "model_name") else {
            continue;
        };
        let Ok(v) = value.split_whitespace().next().unwrap_or("").parse::<f64>() else {
            continue;
        };
        let v = if v.is_finite() && v > 0.0 {
            v as u32
        } else {
            0
        };
        let slot = out.entry(model.to_string()).or_default();
        if running {
            slot.0 += v;
        } else {
            slot.1 += v;
        }
    }
    out
}

/// The value of `name="..."` in a Prometheus label set.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let end = labels[start..].find('"')?;
    Some(&labels[start..start + end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_and_waiting_per_model() {
        let text = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
vllm:num_requests_waiting{model_name="other"} NaN
vllm:gpu_cache_usage_perc{model_name="x"} 0.5
"#;
        let m = parse_metrics(text);
        assert_eq!(m["meta-llama/Llama-3.1-8B-Instruct"], (4, 7));
        assert_eq!(m["other"], (0, 0));
        assert!(!m.contains_key("x"));
    }
}
