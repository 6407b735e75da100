//! Simulated inference node: Ollama, OpenAI and Anthropic APIs with load/latency physics.
