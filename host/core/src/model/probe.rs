//! What a model server says of itself, for `keel doctor`: the models it serves
//! (`GET {base}/models`) and, from a llama.cpp server, its properties (`GET /props`): the
//! context size, and whether its chat template takes tools — a template that silently drops
//! them is the most common failure of a local model.

use super::*;

/// The most of a probe's reply read: a model list or a props object is small.
const MAX_PROBE_BYTES: usize = 4 << 20;

/// How long each probe request may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the server answered to the probes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerProbe {
    /// The model list, or why it could not be read.
    pub models: Result<Vec<ServedModel>, String>,
    /// llama.cpp's `/props`; `None` for a server without it (not llama.cpp, or one that
    /// does not say).
    pub props: Option<ServerProps>,
}

/// One model of the server's list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServedModel {
    pub id: String,
    /// The context it serves, in tokens, where the list says (llama.cpp's `meta.n_ctx`,
    /// vLLM's `max_model_len`).
    pub context: Option<u64>,
}

/// A llama.cpp server's `/props`, the parts keel checks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerProps {
    /// `default_generation_settings.n_ctx`: the context of a slot, in tokens.
    pub context: Option<u64>,
    /// Whether the chat template takes tools (`chat_template_caps.supports_tools` or
    /// `supports_tool_calls`); `None` when the server does not say.
    pub tools: Option<bool>,
}

impl ModelClient {
    /// Asks the server of `config` for its models and its properties. Never fails: what
    /// could not be read is said in the answer.
    pub async fn probe(&self, config: &ModelConfig) -> ServerProbe {
        let base = config.base_url.trim_end_matches('/').trim_end_matches("/chat/completions");
        let models = match self.get_json(&format!("{base}/models")).await {
            Ok(v) => Ok(models_in(&v)),
            Err(e) => Err(e),
        };
        // `/props` is at the server's root, beside `/v1`.
        let root = base.strip_suffix("/v1").unwrap_or(base);
        let props = self.get_json(&format!("{root}/props")).await.ok().and_then(|v| props_in(&v));
        ServerProbe { models, props }
    }

    /// `GET url` (with the key), its JSON body; an error says what went wrong, in words.
    async fn get_json(&self, url: &str) -> Result<serde_json::Value, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("GET {url}: {e}"))?;
        let mut req = match self.http(&parsed) {
            Ok(http) => http.get(parsed),
            Err(e) => return Err(format!("GET {url}: {e}")),
        };
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let mut resp = match tokio::time::timeout(PROBE_TIMEOUT, req.send()).await {
            Err(_) => return Err(format!("GET {url}: no answer in {} s", PROBE_TIMEOUT.as_secs())),
            Ok(Err(e)) if e.is_connect() => {
                return Err(format!("GET {url}: cannot connect ({})", innermost(&e)));
            }
            Ok(Err(e)) => return Err(format!("GET {url}: {}", transport(&e))),
            Ok(Ok(r)) => r,
        };
        let status = resp.status().as_u16();
        let mut bytes = Vec::new();
        loop {
            match tokio::time::timeout(PROBE_TIMEOUT, resp.chunk()).await {
                Ok(Ok(Some(chunk))) if bytes.len() + chunk.len() <= MAX_PROBE_BYTES => {
                    bytes.extend_from_slice(&chunk);
                }
                Ok(Ok(Some(_))) => {
                    return Err(format!("GET {url}: a reply larger than {} MiB", MAX_PROBE_BYTES >> 20));
                }
                Ok(Ok(None)) => break,
                Ok(Err(e)) => return Err(format!("GET {url}: {}", transport(&e))),
                Err(_) => return Err(format!("GET {url}: the reply stopped coming")),
            }
        }
        if status != 200 {
            let start: String = String::from_utf8_lossy(&bytes).chars().take(200).collect();
            return Err(format!("GET {url}: HTTP {status} {}", start.trim()));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("GET {url}: not JSON ({e})"))
    }
}

/// The models of an OpenAI-style list (`{"data": [{"id": …}]}`; Ollama's and others' alike).
fn models_in(v: &serde_json::Value) -> Vec<ServedModel> {
    let list = v["data"].as_array().or_else(|| v["models"].as_array());
    list.into_iter()
        .flatten()
        .filter_map(|m| {
            let id = m["id"].as_str().or_else(|| m["name"].as_str())?;
            let context = m["meta"]["n_ctx"]
                .as_u64()
                .or_else(|| m["max_model_len"].as_u64())
                .or_else(|| m["context_length"].as_u64());
            Some(ServedModel { id: id.to_string(), context })
        })
        .collect()
}

/// llama.cpp's properties, if `v` is them.
fn props_in(v: &serde_json::Value) -> Option<ServerProps> {
    let context = v["default_generation_settings"]["n_ctx"].as_u64();
    let caps = &v["chat_template_caps"];
    let tools = caps["supports_tools"].as_bool().or_else(|| caps["supports_tool_calls"].as_bool());
    let tools = match (tools, caps["supports_tool_calls"].as_bool()) {
        (Some(a), Some(b)) => Some(a && b),
        (t, _) => t,
    };
    (context.is_some() || tools.is_some()).then_some(ServerProps { context, tools })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_lists_and_props_are_read_from_each_server_kind() {
        let llama = serde_json::json!({"object": "list", "data": [
            {"id": "qwen.gguf", "meta": {"n_ctx": 8192, "n_ctx_train": 32768}}]});
        assert_eq!(
            models_in(&llama),
            vec![ServedModel { id: "qwen.gguf".into(), context: Some(8192) }]
        );
        let vllm = serde_json::json!({"data": [{"id": "m", "max_model_len": 4096}, {"no": 1}]});
        assert_eq!(models_in(&vllm), vec![ServedModel { id: "m".into(), context: Some(4096) }]);
        let props = serde_json::json!({"default_generation_settings": {"n_ctx": 4096},
            "chat_template_caps": {"supports_tools": true, "supports_tool_calls": false}});
        assert_eq!(props_in(&props), Some(ServerProps { context: Some(4096), tools: Some(false) }));
        assert_eq!(props_in(&serde_json::json!({"other": 1})), None);
    }
}
