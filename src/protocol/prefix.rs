//! The stable prefix of a request: what every later turn of the same conversation starts with,
//! hashed, so header-less turns can return to the node that caches it (prefix affinity).
//!
//! Chats (OpenAI chat, Ollama chat, Anthropic messages, Responses with an item list): the
//! system / developer messages (Anthropic and Ollama `system` fields too), the tools declared
//! (`tools`, OpenAI's older `functions`) and the first user message. The system part alone
//! is what other conversations may share; a first turn's includes its tools: chat templates
//! render them ahead of a lone question (Qwen and Hermes in the system block, Llama 3 at the
//! head of the user message, Mistral before it), and an agent sends the same ones every time.
//! A later turn's does not: Llama 3 and Mistral move them to the last user message. Raw completions (OpenAI completions, Ollama generate, Responses with a string): the
//! `system` field and the prompt's leading block, its first [`LEADING_BLOCK_CHARS`] characters
//! (a shorter prompt is its own leading block). Embeddings and token-id prompts: none. The hash
//! is a fixed function (XXH3-64, seed 0: a published algorithm, so every replica and version
//! computes the same; the key built from it is an HMAC with the affinity secret); of a part
//! longer than 16 KiB it covers the length and the first and last 8 KiB.

use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

use super::fields::{get, JsonText, Obj};
use super::Endpoint;

/// Characters of a raw prompt that make its leading block.
pub const LEADING_BLOCK_CHARS: usize = 1024;

/// Bytes hashed from each end of a part longer than twice this (SHA-256 of a whole 64 KiB
/// prompt was 4 % of the gateway's CPU at c=32; SHA-256 of 16 KiB still 2.5 %, so the hash
/// is XXH3 now).
const HASHED_END_BYTES: usize = 8 * 1024;

/// Hash and length (characters) of the stable prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    pub hash: u64,
    pub chars: usize,
    /// More follows the prefix: a chat with messages after its first user message, a raw
    /// prompt longer than its leading block. A later turn, whose earlier ones some gateway
    /// (this one, a replica, this one before a restart) may have placed.
    pub continues: bool,
    /// Hash and characters of the system part alone (system / developer messages, `system`
    /// and `instructions` fields, the tools declared), 0 chars when there is none: what
    /// requests of other conversations may share (an agent's or an app's system prompt and
    /// tools), cached wherever one of them was served.
    pub system_hash: u64,
    pub system_chars: usize,
}

struct Acc<'a> {
    /// The request's non-empty `tools`, hashed where the system part ends.
    tools: Option<&'a Value>,
    hasher: Xxh3,
    chars: usize,
    continues: bool,
    system: (u64, usize),
}

impl Acc<'_> {
    fn part(&mut self, tag: &str, v: &Value) {
        let owned;
        let text = match v {
            Value::String(s) => s.as_str(),
            other => {
                owned = other.to_string();
                owned.as_str()
            }
        };
        self.chars += text.chars().count();
        self.hasher.update(tag.as_bytes());
        self.hasher.update(&[0]);
        let bytes = text.as_bytes();
        if bytes.len() <= 2 * HASHED_END_BYTES {
            self.hasher.update(bytes);
        } else {
            // A long part: its length, its first and its last bytes. Parts that differ only
            // in between share a key, and a node's cache holds their common start anyway.
            self.hasher.update(&(bytes.len() as u64).to_be_bytes());
            self.hasher.update(&bytes[..HASHED_END_BYTES]);
            self.hasher.update(&bytes[bytes.len() - HASHED_END_BYTES..]);
        }
        self.hasher.update(&[0]);
    }

    /// The system part ends here: what was hashed so far is it, and the tools declared, which
    /// join it on a first turn only (`continues` set before; module doc). The conversation's
    /// own hash takes them either way.
    fn end_system(&mut self) {
        let alone = (self.hasher.digest(), self.chars);
        if let Some(tools) = self.tools.take() {
            // Hashed and counted as serialized, without building the text (a coding agent's
            // tools run to tens of KB).
            self.hasher.update(b"tools\0");
            let mut text = JsonText {
                chars: 0,
                hasher: Some(&mut self.hasher),
            };
            if serde_json::to_writer(&mut text, tools).is_ok() {
                self.chars += text.chars;
            }
            self.hasher.update(&[0]);
        }
        let system = if self.continues {
            alone
        } else {
            (self.hasher.digest(), self.chars)
        };
        if system.1 > 0 {
            self.system = system;
        }
    }

    fn done(self) -> Prefix {
        Prefix {
            hash: self.hasher.digest(),
            chars: self.chars,
            continues: self.continues,
            system_hash: self.system.0,
            system_chars: self.system.1,
        }
    }
}

/// The stable prefix of a parsed body for `ep`; None when it has none.
pub fn stable_prefix(ep: Endpoint, obj: &Obj) -> Option<Prefix> {
    let declared = |key| get(obj, key).filter(|t| t.as_array().is_some_and(|a| !a.is_empty()));
    let tools = match ep {
        Endpoint::OpenAIChat => declared("tools").or_else(|| declared("functions")),
        Endpoint::OllamaChat | Endpoint::AnthropicMessages | Endpoint::OpenAIResponses => {
            declared("tools")
        }
        _ => None,
    };
    let mut acc = Acc {
        tools,
        hasher: Xxh3::new(),
        chars: 0,
        continues: false,
        system: (0, 0),
    };
    if let Some(sys) = get(obj, "system") {
        acc.part("system", sys);
    }
    let found = match ep {
        Endpoint::OpenAIChat | Endpoint::OllamaChat | Endpoint::AnthropicMessages => {
            messages(&mut acc, get(obj, "messages")?)
        }
        Endpoint::OpenAIResponses => {
            if let Some(i) = get(obj, "instructions") {
                acc.part("system", i);
            }
            match get(obj, "input")? {
                Value::String(s) => leading(&mut acc, s),
                items => messages(&mut acc, items),
            }
        }
        Endpoint::OpenAICompletions | Endpoint::OllamaGenerate => match get(obj, "prompt")? {
            Value::String(s) => leading(&mut acc, s),
            Value::Array(a) => match a.first() {
                Some(Value::String(s)) => leading(&mut acc, s),
                _ => false,
            },
            _ => false,
        },
        Endpoint::OpenAIEmbeddings | Endpoint::OllamaEmbed | Endpoint::OllamaEmbeddings => false,
    };
    found.then(|| acc.done())
}

fn leading(acc: &mut Acc, s: &str) -> bool {
    if s.is_empty() {
        return false;
    }
    let block: String = s.chars().take(LEADING_BLOCK_CHARS).collect();
    acc.continues = block.len() < s.len();
    acc.end_system();
    acc.part("prompt", &Value::String(block));
    true
}

/// System messages up to and including the first user message; false without a user message.
fn messages(acc: &mut Acc, v: &Value) -> bool {
    let Value::Array(list) = v else { return false };
    for (i, m) in list.iter().enumerate() {
        let Some(m) = m.as_object() else { return false };
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let content = m.get("content").unwrap_or(&Value::Null);
        match role {
            "system" | "developer" => acc.part("system", content),
            "user" => {
                acc.continues = i + 1 < list.len();
                acc.end_system();
                acc.part("user", content);
                return true;
            }
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn prefix(ep: Endpoint, v: Value) -> Option<Prefix> {
        match v {
            Value::Object(o) => stable_prefix(ep, &o),
            _ => None,
        }
    }

    #[test]
    fn a_long_first_message_is_keyed_by_its_length_and_ends() {
        let chat = |text: String| {
            let v = json!({"model":"m","messages":[{"role":"user","content":text}]});
            prefix(Endpoint::OpenAIChat, v).expect("prefix")
        };
        let base = "a".repeat(40_000);
        let mut start = base.clone();
        start.replace_range(100..101, "b");
        let mut end = base.clone();
        end.replace_range(39_900..39_901, "b");
        let mut middle = base.clone();
        middle.replace_range(20_000..20_001, "b");
        let longer = "a".repeat(40_001);
        let k = chat(base.clone()).hash;
        assert_ne!(k, chat(start).hash);
        assert_ne!(k, chat(end).hash);
        assert_ne!(k, chat(longer).hash);
        assert_eq!(k, chat(middle).hash);
        assert_eq!(chat(base).chars, 40_000);
    }

    #[test]
    fn later_turns_share_the_first_turns_prefix() {
        let t1 = json!({"model":"m","messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":"hello"}]});
        let t3 = json!({"model":"m","messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":"hello"},
            {"role":"assistant","content":"hi"},
            {"role":"user","content":"more"}]});
        let other = json!({"model":"m","messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":"goodbye"}]});
        let a = prefix(Endpoint::OpenAIChat, t1).expect("chat has a prefix");
        let later = prefix(Endpoint::OpenAIChat, t3).expect("chat has a prefix");
        assert_eq!(a.hash, later.hash);
        let other = prefix(Endpoint::OpenAIChat, other).expect("chat has a prefix");
        assert_ne!(a.hash, other.hash);
        assert_eq!(a.chars, "be brief".len() + "hello".len());
        // Only the later turn continues a conversation.
        assert!(!a.continues && later.continues);
        // Another conversation with the same system prompt shares its system part.
        assert_eq!(
            (a.system_hash, a.system_chars),
            (other.system_hash, "be brief".len())
        );
        let bare = json!({"model":"m","messages":[{"role":"user","content":"hello"}]});
        let bare = prefix(Endpoint::OpenAIChat, bare).expect("chat has a prefix");
        assert_eq!(bare.system_chars, 0, "no system part");
        let longer = json!({"model":"m","messages":[
            {"role":"system","content":"be brief and kind"},
            {"role":"user","content":"hello"}]});
        let longer = prefix(Endpoint::OpenAIChat, longer).expect("chat has a prefix");
        assert_ne!(longer.system_hash, a.system_hash);
    }

    /// An agent's requests declare the same tools, which templates render ahead of a first
    /// turn's question: they are part of what other conversations share, with or without a
    /// system message, and tools of another agent are another prefix. A later turn shares its
    /// system messages alone (templates may move the tools to its last message), and keeps
    /// its conversation's hash.
    #[test]
    fn the_tools_declared_are_part_of_a_first_turns_system_part() {
        let tools = json!([{"type":"function","function":{"name":"read_file",
            "parameters":{"type":"object","properties":{"path":{"type":"string"}}}}}]);
        let ask = |tools: &Value, q: &str| {
            let v = json!({"model":"m","tools":tools,"messages":[{"role":"user","content":q}]});
            prefix(Endpoint::OpenAIChat, v).expect("chat has a prefix")
        };
        let (a, b) = (ask(&tools, "fix the build"), ask(&tools, "why is it slow?"));
        assert_eq!(a.system_chars, tools.to_string().len());
        assert_eq!(a.system_hash, b.system_hash);
        assert_ne!(a.hash, b.hash, "each its own conversation");
        let other = json!([{"type":"function","function":{"name":"write_file"}}]);
        assert_ne!(ask(&other, "fix the build").system_hash, a.system_hash);
        assert_eq!(
            ask(&json!([]), "fix the build").system_chars,
            0,
            "none declared"
        );
        let functions = json!({"model":"m","functions":tools,
            "messages":[{"role":"user","content":"fix the build"}]});
        let f = prefix(Endpoint::OpenAIChat, functions).expect("prefix");
        assert_eq!(f.system_chars, a.system_chars, "OpenAI's older name");
        let generate = json!({"model":"m","tools":tools,"prompt":"fix the build"});
        let g = prefix(Endpoint::OllamaGenerate, generate).expect("prefix");
        assert_eq!(
            g.system_chars, 0,
            "not read where the prompt does not count them"
        );

        let turn = |messages: Value| {
            let v = json!({"model":"m","tools":tools,"system":"be brief","messages":messages});
            prefix(Endpoint::AnthropicMessages, v).expect("prefix")
        };
        let first = turn(json!([{"role":"user","content":"fix the build"}]));
        let later = turn(json!([{"role":"user","content":"fix the build"},
            {"role":"assistant","content":"done"},{"role":"user","content":"and the tests?"}]));
        assert_eq!(
            first.system_chars,
            "be brief".len() + tools.to_string().len()
        );
        assert_eq!(later.system_chars, "be brief".len());
        assert_eq!(first.hash, later.hash, "one conversation");
        let bare = json!({"model":"m","system":"be brief",
            "messages":[{"role":"user","content":"something else"}]});
        let bare = prefix(Endpoint::AnthropicMessages, bare).expect("prefix");
        assert_eq!(
            later.system_hash, bare.system_hash,
            "the system prompt alone"
        );
    }

    #[test]
    fn anthropic_system_field_and_raw_prompts() {
        let a = json!({"model":"c","system":"sys","messages":[{"role":"user","content":"q"}]});
        let b = json!({"model":"c","system":"other","messages":[{"role":"user","content":"q"}]});
        assert_ne!(
            prefix(Endpoint::AnthropicMessages, a),
            prefix(Endpoint::AnthropicMessages, b)
        );
        let long = "x".repeat(3000);
        let grown = format!("{long} and then more");
        let raw = |p: &str| prefix(Endpoint::OllamaGenerate, json!({"model":"m","prompt":p}));
        assert_eq!(raw(&long).map(|p| p.hash), raw(&grown).map(|p| p.hash));
        assert!(
            raw(&long).unwrap().continues,
            "longer than its leading block"
        );
        assert!(!raw("short").unwrap().continues);
        assert_eq!(
            prefix(Endpoint::OpenAIEmbeddings, json!({"model":"m","input":"x"})),
            None
        );
        assert_eq!(
            prefix(Endpoint::OpenAIChat, json!({"model":"m","messages":[]})),
            None
        );
    }
}
