//! Endpoint detection by method + path (query string and fragment ignored).

use super::{Endpoint, Local};

/// Strip query/fragment, collapse repeated slashes and drop one trailing slash.
fn normalize(path: &str) -> String {
    let end = path.find(['?', '#']).unwrap_or(path.len());
    let mut out = String::with_capacity(end);
    for c in path[..end].chars() {
        if c == '/' && out.ends_with('/') {
            continue;
        }
        out.push(c);
    }
    if out.len() > 1 && out.ends_with('/') {
        out.pop();
    }
    out
}

/// The proxied endpoint for `method` + `path` (query string ignored), if any.
pub fn detect(method: &str, path: &str) -> Option<Endpoint> {
    if method != "POST" {
        return None;
    }
    let p = normalize(path);
    Endpoint::ALL.into_iter().find(|ep| ep.path() == p)
}

/// The endpoint the gateway answers itself for `method` + `path`, if any.
pub fn detect_local(method: &str, path: &str) -> Option<Local> {
    let p = normalize(path);
    match (method, p.as_str()) {
        ("GET", "/v1/models") => Some(Local::OpenAIModels),
        ("GET", "/api/tags") => Some(Local::OllamaTags),
        ("GET", "/api/ps") => Some(Local::OllamaPs),
        ("GET", "/api/version") => Some(Local::OllamaVersion),
        ("POST", "/api/show") => Some(Local::OllamaShow),
        ("GET" | "HEAD", "/") => Some(Local::Root),
        ("POST", "/v1/messages/count_tokens") => Some(Local::AnthropicCountTokens),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detect_table() {
        let cases: &[(&str, &str, Option<Endpoint>)] = &[
            ("POST", "/v1/chat/completions", Some(Endpoint::OpenAIChat)),
            ("POST", "/v1/completions", Some(Endpoint::OpenAICompletions)),
            ("POST", "/v1/embeddings", Some(Endpoint::OpenAIEmbeddings)),
            ("POST", "/v1/responses", Some(Endpoint::OpenAIResponses)),
            ("POST", "/api/chat", Some(Endpoint::OllamaChat)),
            ("POST", "/api/generate", Some(Endpoint::OllamaGenerate)),
            ("POST", "/api/embed", Some(Endpoint::OllamaEmbed)),
            ("POST", "/api/embeddings", Some(Endpoint::OllamaEmbeddings)),
            ("POST", "/v1/messages", Some(Endpoint::AnthropicMessages)),
            (
                "POST",
                "/v1/messages?beta=true",
                Some(Endpoint::AnthropicMessages),
            ),
            (
                "POST",
                "/v1/chat/completions?api-version=2024-02-01",
                Some(Endpoint::OpenAIChat),
            ),
            ("POST", "/v1/chat/completions/", Some(Endpoint::OpenAIChat)),
            ("POST", "/v1//chat/completions", Some(Endpoint::OpenAIChat)),
            ("POST", "/api/chat#frag", Some(Endpoint::OllamaChat)),
            ("GET", "/v1/chat/completions", None),
            ("PUT", "/api/chat", None),
            ("post", "/api/chat", None),
            ("POST", "/v1/chat", None),
            ("POST", "/v1/chat/completionsx", None),
            ("POST", "/api/chat/extra", None),
            ("POST", "/v1/messages/count_tokens", None),
            ("POST", "", None),
            ("POST", "?", None),
            ("POST", "/", None),
        ];
        for (m, p, want) in cases {
            assert_eq!(detect(m, p), *want, "{m} {p}");
        }
    }

    #[test]
    fn detect_local_table() {
        let cases: &[(&str, &str, Option<Local>)] = &[
            ("GET", "/v1/models", Some(Local::OpenAIModels)),
            ("GET", "/v1/models?x=1", Some(Local::OpenAIModels)),
            ("GET", "/api/tags", Some(Local::OllamaTags)),
            ("GET", "/api/ps", Some(Local::OllamaPs)),
            ("GET", "/api/version", Some(Local::OllamaVersion)),
            ("POST", "/api/show", Some(Local::OllamaShow)),
            ("GET", "/", Some(Local::Root)),
            ("HEAD", "/", Some(Local::Root)),
            ("GET", "/?probe=1", Some(Local::Root)),
            (
                "POST",
                "/v1/messages/count_tokens",
                Some(Local::AnthropicCountTokens),
            ),
            (
                "POST",
                "/v1/messages/count_tokens?beta=true",
                Some(Local::AnthropicCountTokens),
            ),
            ("POST", "/v1/models", None),
            ("GET", "/api/show", None),
            ("POST", "/", None),
            ("HEAD", "/api/tags", None),
            ("GET", "/v1/messages/count_tokens", None),
            ("POST", "/v1/chat/completions", None),
        ];
        for (m, p, want) in cases {
            assert_eq!(detect_local(m, p), *want, "{m} {p}");
        }
    }
}
