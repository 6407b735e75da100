//! Simulated inference node: Ollama, OpenAI and Anthropic APIs with load/latency physics.
//! TEMPORARY STUB until the sim branch lands.

#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SimSpec {
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub seats: u32,
    #[serde(default)]
    pub tokens_per_sec: f64,
    #[serde(default)]
    pub ttft_ms: u64,
    #[serde(default)]
    pub memory_gb: f64,
    #[serde(default)]
    pub reply_tokens: u32,
    pub models: Vec<SimModel>,
}

#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct SimModel {
    pub name: String,
    pub size_gb: f64,
    #[serde(default)]
    pub context: u32,
    #[serde(default)]
    pub loaded: bool,
    #[serde(default)]
    pub cold_load_ms: u64,
    #[serde(default)]
    pub embedding: bool,
}
pub struct SimHandle;
pub async fn start(_spec: SimSpec, _l: std::net::TcpListener) -> std::io::Result<SimHandle> {
    Err(std::io::Error::other("stub"))
}
pub async fn run_cli(_s: Vec<(String, std::net::SocketAddr, SimSpec)>) -> anyhow::Result<()> {
    Ok(())
}
