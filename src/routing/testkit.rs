//! Test fixtures: node and model builders and a plain `Loads` table.

use super::types::{
    Family, FleetView, LiveDecode, Loads, ModelLoad, ModelView, NodeView, PrefillLoad, Rates, Row,
    Signals, Verdict,
};

/// Loads by node index; model loads by (node, model name).
#[derive(Debug, Clone, Default)]
pub struct TableLoads {
    pub node: Vec<u32>,
    pub model: Vec<(usize, String, ModelLoad)>,
    pub rates: Vec<(usize, String, Rates)>,
    /// Prefill queue by node index.
    pub prefilling: Vec<PrefillLoad>,
    /// Background loads in progress, (node, model).
    pub reading: Vec<(usize, String)>,
    /// Seconds until each running request ends, by (node, model).
    pub ends: Vec<(usize, String, Vec<f64>)>,
    /// What the running answers have streamed, by (node, model).
    pub live: Vec<(usize, String, LiveDecode)>,
}

impl TableLoads {
    /// One model with `in_flight` + `pending` on node `idx` (node in-flight follows).
    pub fn with(mut self, idx: usize, model: &str, load: ModelLoad) -> Self {
        if self.node.len() <= idx {
            self.node.resize(idx + 1, 0);
        }
        self.node[idx] += load.in_flight;
        self.model.push((idx, model.to_string(), load));
        self
    }

    /// Learned rates for node `idx`'s `model` (replacing any given before).
    pub fn rated(mut self, idx: usize, model: &str, rates: Rates) -> Self {
        self.rates.retain(|(n, m, _)| !(*n == idx && m == model));
        self.rates.push((idx, model.to_string(), rates));
        self
    }

    /// The requests running on node `idx`'s `model` end in `ends` seconds.
    pub fn ending(mut self, idx: usize, model: &str, ends: &[f64]) -> Self {
        self.ends.push((idx, model.to_string(), ends.to_vec()));
        self
    }

    /// The answers running on node `idx`'s `model` streamed `tokens` in `secs`, `decoding`
    /// streams on the node.
    pub fn streaming(
        mut self,
        idx: usize,
        model: &str,
        secs: f64,
        tokens: f64,
        decoding: u32,
    ) -> Self {
        let live = LiveDecode {
            secs,
            tokens,
            streams: 1,
            node_decoding: decoding,
            stalled_since_ms: None,
            seated: None,
        };
        self.live.push((idx, model.to_string(), live));
        self
    }

    /// A background load of `model` in progress on node `idx`.
    pub fn reading(mut self, idx: usize, model: &str) -> Self {
        self.reading.push((idx, model.to_string()));
        self
    }
}

impl Loads for TableLoads {
    fn node_in_flight(&self, node: usize) -> u32 {
        self.node.get(node).copied().unwrap_or(0)
    }
    fn node_prefilling(&self, node: usize) -> PrefillLoad {
        self.prefilling.get(node).copied().unwrap_or_default()
    }
    fn model(&self, node: usize, model: &str) -> ModelLoad {
        self.model
            .iter()
            .find(|(n, m, _)| *n == node && m == model)
            .map(|(_, _, l)| *l)
            .unwrap_or_default()
    }
    fn rates(&self, node: usize, model: &str) -> Rates {
        self.rates
            .iter()
            .find(|(n, m, _)| *n == node && m == model)
            .map(|(_, _, r)| *r)
            .unwrap_or_default()
    }
    fn loading(&self, node: usize, model: &str) -> bool {
        self.reading.iter().any(|(n, m)| *n == node && m == model)
    }
    fn seat_ends(
        &self,
        node: usize,
        model: &str,
        _now_ms: u64,
        out: &mut Vec<f64>,
    ) -> Option<LiveDecode> {
        for (_, _, e) in self
            .ends
            .iter()
            .filter(|(n, m, _)| *n == node && m == model)
        {
            out.extend(e);
        }
        self.live
            .iter()
            .find(|(n, m, _)| *n == node && m == model)
            .map(|(_, _, l)| *l)
    }
}

/// `in_flight` requests hold a pair whose cold load the first of them started at `since_ms`
/// (`None`: when is not known).
pub fn loading(in_flight: u32, since_ms: Option<u64>) -> ModelLoad {
    ModelLoad {
        in_flight,
        loading_since_ms: since_ms,
        ..ModelLoad::default()
    }
}

pub fn queue(in_flight: u32, pending: u32) -> ModelLoad {
    ModelLoad {
        in_flight,
        pending,
        ..ModelLoad::default()
    }
}

/// A model on disk, not loaded, 32k window.
pub fn model(name: &str, size_gb: f64) -> ModelView {
    ModelView {
        name: name.into(),
        size_gb,
        max_context: 32_768,
        on_disk: true,
        ..ModelView::default()
    }
}

pub fn loaded(name: &str, size_gb: f64) -> ModelView {
    ModelView {
        loaded: true,
        loaded_context: Some(32_768),
        ..model(name, size_gb)
    }
}

/// An online pinned node: 1 seat, 64 GB free of 64, 400 GB/s, every protocol.
pub fn node(id: &str, models: Vec<ModelView>) -> NodeView {
    NodeView {
        id: id.into(),
        free_memory_gb: Some(64.0),
        memory_gb: 64.0,
        bandwidth_gbps: Some(400.0),
        seats: 1,
        hard_cap: 0,
        families: vec![Family::OpenAI, Family::Ollama, Family::Anthropic],
        models,
        output_reserve: 1_024,
        ..NodeView::default()
    }
}

/// `n` with `memory_gb` in all and no free-memory report: what it holds is counted from its
/// loaded models.
pub fn with_memory(n: NodeView, memory_gb: f64) -> NodeView {
    NodeView {
        memory_gb,
        free_memory_gb: None,
        ..n
    }
}

pub fn fleet(nodes: Vec<NodeView>) -> FleetView {
    FleetView { nodes }
}

pub fn signals_of(row: &Row) -> Option<(Signals, f64)> {
    match row.verdict {
        Verdict::Scored { signals, total } => Some((signals, total)),
        Verdict::Eliminated { .. } | Verdict::Predicted { .. } => None,
    }
}
