//! Models on disk and in memory: lookup, LRU eviction, and the /api/tags, /api/ps, /api/show views.

use super::spec::{SimModel, SimSpec};
use super::text::{digest, rfc3339};
use serde_json::{json, Value};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;

/// Resident size of a loaded model relative to its weights.
pub const RESIDENT_FACTOR: f64 = 1.1;
/// Ollama's default keep_alive.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(300);
/// Size of a model added by `/api/pull`.
pub const PULLED_SIZE_GB: f64 = 4.0;
const GB: f64 = 1e9;

/// How long a model stays listed as loaded after a request (display only, no timed expiry).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeepAlive {
    Default,
    Unload,
    For(Duration),
    Forever,
}

pub struct Loaded {
    pub last_used: u64,
    pub expires_at: SystemTime,
}

pub struct Entry {
    pub spec: SimModel,
    pub modified_at: SystemTime,
    pub loaded: Option<Loaded>,
    /// Set while a cold load is in progress; flips to true when it completes.
    pub loading: Option<watch::Receiver<bool>>,
}

pub struct Registry {
    pub entries: Vec<Entry>,
    tick: u64,
    memory_gb: f64,
}

fn expiry(k: KeepAlive) -> SystemTime {
    let now = SystemTime::now();
    match k {
        KeepAlive::Default => now + DEFAULT_KEEP_ALIVE,
        KeepAlive::Unload => now,
        KeepAlive::For(d) => now.checked_add(d).unwrap_or(now),
        // Ollama shows a far-future date for keep_alive < 0.
        KeepAlive::Forever => now + Duration::from_secs(100 * 365 * 86_400),
    }
}

impl Registry {
    /// Build from the spec; models marked `loaded` are loaded (with eviction if they overflow).
    pub fn new(spec: &SimSpec) -> Self {
        let now = SystemTime::now();
        let mut r = Registry {
            entries: spec
                .models
                .iter()
                .map(|m| Entry {
                    spec: m.clone(),
                    modified_at: now,
                    loaded: None,
                    loading: None,
                })
                .collect(),
            tick: 0,
            memory_gb: spec.memory_gb,
        };
        for i in 0..r.entries.len() {
            if r.entries[i].spec.loaded {
                r.mark_loaded(i);
            }
        }
        r
    }

    /// Find a model: exact name, or the same name with/without an implied `:latest` tag.
    pub fn find(&self, name: &str) -> Option<usize> {
        let strip = |n: &str| n.strip_suffix(":latest").map(str::to_string);
        let base = strip(name).unwrap_or_else(|| name.to_string());
        self.entries
            .iter()
            .position(|e| e.spec.name == name)
            .or_else(|| {
                self.entries.iter().position(|e| {
                    let eb = strip(&e.spec.name).unwrap_or_else(|| e.spec.name.clone());
                    eb == base && (!name.contains(':') || name.ends_with(":latest"))
                })
            })
    }

    fn resident_gb(&self, i: usize) -> f64 {
        self.entries[i].spec.size_gb * RESIDENT_FACTOR
    }

    /// Mark loaded (most recently used), evicting LRU models that no longer fit.
    /// Returns (newly loaded, evicted names).
    pub fn mark_loaded(&mut self, i: usize) -> (bool, Vec<String>) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(l) = self.entries[i].loaded.as_mut() {
            l.last_used = tick;
            return (false, Vec::new());
        }
        let mut evicted = Vec::new();
        loop {
            let used: f64 = (0..self.entries.len())
                .filter(|&j| j != i && self.entries[j].loaded.is_some())
                .map(|j| self.resident_gb(j))
                .sum();
            if used + self.resident_gb(i) <= self.memory_gb + 1e-9 {
                break;
            }
            let victim = (0..self.entries.len())
                .filter(|&j| j != i)
                .filter_map(|j| self.entries[j].loaded.as_ref().map(|l| (l.last_used, j)))
                .min();
            match victim {
                Some((_, j)) => {
                    self.entries[j].loaded = None;
                    evicted.push(self.entries[j].spec.name.clone());
                }
                None => break, // too big even alone: load anyway (CPU offload)
            }
        }
        self.entries[i].loaded = Some(Loaded {
            last_used: tick,
            expires_at: expiry(KeepAlive::Default),
        });
        (true, evicted)
    }

    /// Record use of a loaded model and apply the request's keep_alive.
    pub fn touch(&mut self, i: usize, keep: KeepAlive) {
        self.tick += 1;
        let tick = self.tick;
        if keep == KeepAlive::Unload {
            self.entries[i].loaded = None;
            return;
        }
        if let Some(l) = self.entries[i].loaded.as_mut() {
            l.last_used = tick;
            l.expires_at = expiry(keep);
        }
    }

    pub fn unload(&mut self, i: usize) {
        self.entries[i].loaded = None;
    }

    /// Add a model to disk (pull); returns its index.
    pub fn add(&mut self, name: &str, size_gb: f64) -> usize {
        if let Some(i) = self.find(name) {
            self.entries[i].modified_at = SystemTime::now();
            return i;
        }
        let mut spec = SimModel::new(name, size_gb);
        spec.embedding = name.contains("embed");
        self.entries.push(Entry {
            spec,
            modified_at: SystemTime::now(),
            loaded: None,
            loading: None,
        });
        self.entries.len() - 1
    }

    pub fn tags_json(&self) -> Value {
        let models: Vec<Value> = self
            .entries
            .iter()
            .map(|e| {
                json!({
                    "name": e.spec.name,
                    "model": e.spec.name,
                    "modified_at": rfc3339(e.modified_at),
                    "size": bytes(e.spec.size_gb),
                    "digest": digest(&e.spec.name),
                    "details": details(&e.spec),
                })
            })
            .collect();
        json!({ "models": models })
    }

    pub fn ps_json(&self) -> Value {
        let mut loaded: Vec<&Entry> = self.entries.iter().filter(|e| e.loaded.is_some()).collect();
        loaded.sort_by_key(|e| std::cmp::Reverse(e.loaded.as_ref().map_or(0, |l| l.last_used)));
        let models: Vec<Value> = loaded
            .iter()
            .map(|e| {
                let resident = bytes(e.spec.size_gb * RESIDENT_FACTOR);
                let expires = e
                    .loaded
                    .as_ref()
                    .map_or(SystemTime::now(), |l| l.expires_at);
                json!({
                    "name": e.spec.name,
                    "model": e.spec.name,
                    "size": resident,
                    "digest": digest(&e.spec.name),
                    "details": details(&e.spec),
                    "expires_at": rfc3339(expires),
                    "size_vram": resident,
                    "context_length": e.spec.context,
                })
            })
            .collect();
        json!({ "models": models })
    }

    pub fn show_json(&self, i: usize) -> Value {
        let e = &self.entries[i];
        let fam = family(&e.spec);
        let caps: Vec<&str> = if e.spec.embedding {
            vec!["embedding"]
        } else {
            vec!["completion"]
        };
        let mut info = serde_json::Map::new();
        info.insert("general.architecture".into(), json!(fam));
        info.insert(
            "general.parameter_count".into(),
            json!(param_count(&e.spec)),
        );
        info.insert(format!("{fam}.context_length"), json!(e.spec.context));
        info.insert(format!("{fam}.embedding_length"), json!(4096));
        json!({
            "license": "",
            "modelfile": format!("# Modelfile generated by \"ollama show\"\nFROM {}\n", e.spec.name),
            "parameters": "",
            "template": "{{ .Prompt }}",
            "details": details(&e.spec),
            "model_info": info,
            "capabilities": caps,
            "modified_at": rfc3339(e.modified_at),
        })
    }
}

fn bytes(gb: f64) -> u64 {
    (gb * GB).round().max(0.0) as u64
}

fn family(m: &SimModel) -> String {
    if m.embedding {
        return "bert".into();
    }
    let base = m.name.rsplit('/').next().unwrap_or(&m.name);
    let f: String = base
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect();
    if f.is_empty() {
        "llama".into()
    } else {
        f.to_ascii_lowercase()
    }
}

/// Parameters: from a `:<n>b` tag if present, else estimated from a Q4 size (~0.55 bytes/param).
fn param_count(m: &SimModel) -> u64 {
    let tag = m.name.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
    let num = tag.split('-').next().unwrap_or("");
    if let Some(n) = num
        .strip_suffix(['b', 'B'])
        .and_then(|n| n.parse::<f64>().ok())
    {
        return (n * 1e9) as u64;
    }
    (m.size_gb * GB / 0.55) as u64
}

fn details(m: &SimModel) -> Value {
    let fam = family(m);
    let params = param_count(m) as f64;
    let size = if params >= 1e9 {
        format!("{:.1}B", params / 1e9)
    } else {
        format!("{:.0}M", params / 1e6)
    };
    json!({
        "parent_model": "",
        "format": "gguf",
        "family": fam,
        "families": [fam],
        "parameter_size": size,
        "quantization_level": if m.embedding { "F16" } else { "Q4_K_M" },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(models: Vec<SimModel>, mem: f64) -> SimSpec {
        SimSpec {
            memory_gb: mem,
            models,
            ..SimSpec::default()
        }
    }

    #[test]
    fn lru_eviction_respects_memory() {
        let r = &mut Registry::new(&spec(
            vec![
                SimModel::new("a:1b", 5.0),
                SimModel::new("b:1b", 5.0),
                SimModel::new("c:1b", 5.0),
            ],
            12.0,
        ));
        assert_eq!(r.mark_loaded(0), (true, vec![]));
        assert_eq!(r.mark_loaded(1), (true, vec![])); // 11.0 <= 12
        r.touch(0, KeepAlive::Default); // b is now LRU
        assert_eq!(r.mark_loaded(2), (true, vec!["b:1b".to_string()]));
        assert!(r.entries[0].loaded.is_some() && r.entries[1].loaded.is_none());
        assert_eq!(r.mark_loaded(2), (false, vec![]));
        r.touch(2, KeepAlive::Unload);
        assert!(r.entries[2].loaded.is_none());
    }

    #[test]
    fn find_handles_latest_tag() {
        let r = Registry::new(&spec(
            vec![
                SimModel::new("llama3.2:latest", 1.0),
                SimModel::new("qwen", 1.0),
            ],
            16.0,
        ));
        assert_eq!(r.find("llama3.2"), Some(0));
        assert_eq!(r.find("llama3.2:latest"), Some(0));
        assert_eq!(r.find("qwen:latest"), Some(1));
        assert_eq!(r.find("qwen:7b"), None);
        assert_eq!(r.find("llama3.2:3b"), None);
    }

    #[test]
    fn views_have_ollama_fields() {
        let mut m = SimModel::new("llama3.2:3b", 2.0);
        m.loaded = true;
        let r = Registry::new(&spec(vec![m], 16.0));
        let t = r.tags_json();
        let e = &t["models"][0];
        assert_eq!(e["size"], 2_000_000_000u64);
        assert_eq!(e["details"]["parameter_size"], "3.0B");
        assert_eq!(e["details"]["family"], "llama");
        assert_eq!(e["digest"].as_str().map(str::len), Some(64));
        let p = r.ps_json();
        assert_eq!(p["models"][0]["size"], 2_200_000_000u64);
        assert_eq!(p["models"][0]["context_length"], 8192);
        assert!(p["models"][0]["expires_at"].is_string());
    }
}
