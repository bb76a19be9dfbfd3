//! Where and how to call the model ([`ModelConfig`]), checked before any call.

use super::*;

/// Where and how to call the model. Never contains the API key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// The part before `/chat/completions`, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The longest wait without progress, in milliseconds: until the reply's first byte, then
    /// between parts of it. A slow reply that keeps coming is never cut; a server that goes
    /// silent this long is given up on (`--model-timeout`, `KEEL_MODEL_TIMEOUT`,
    /// `[model] timeout_ms`).
    pub timeout_ms: u64,
    /// Stream the reply (SSE).
    pub stream: bool,
    /// When streaming, ask the server for the token usage (`stream_options.include_usage`);
    /// off for a server that rejects the field (`[model] stream_usage = false`).
    #[serde(default = "yes")]
    pub stream_usage: bool,
    /// Retries after the first attempt, for retryable failures.
    pub max_retries: u32,
    /// The model's context window, in tokens (`--context-window`, `[model] context_window`):
    /// with it, a request estimated past [`compact_at`](Self::compact_at) of it is preceded by
    /// a compaction. `None`: compaction only on demand, or when the server refuses a request
    /// as too long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
    /// The fraction of the context window a request may fill before the session is compacted
    /// (`--compact-at`, `[model] compact_at`; default [`DEFAULT_COMPACT_AT`]).
    #[serde(default = "default_compact_at")]
    pub compact_at: f64,
    /// Send what changes from turn to turn (the goals, the plan, the summary, skills and
    /// memories) as a second system message after the stable instructions, so that a local
    /// server's prompt cache keeps the instructions and tool schemas from request to request
    /// (`[model] notes_message`; default on). Off: one system message, for a server whose chat
    /// template refuses a second — which keel also learns from such a refusal.
    #[serde(default = "yes")]
    pub notes_message: bool,
}

/// The smallest context window keel accepts, in tokens.
pub const MIN_CONTEXT_WINDOW: u64 = 512;

/// The default fraction of the context window a request may fill before a compaction.
pub const DEFAULT_COMPACT_AT: f64 = 0.8;

fn default_compact_at() -> f64 {
    DEFAULT_COMPACT_AT
}

/// The base URL of a local OpenAI-compatible server (llama.cpp's default port), for sessions
/// made with no model configured.
pub const DEFAULT_BASE_URL: &str = "http://127.0.0.1:8080/v1";

impl ModelConfig {
    /// One line a person reads: the model, the server's address (when `with_url`), the
    /// longest wait, and the settings given.
    pub fn summary(&self, with_url: bool) -> String {
        let mut parts = vec![match with_url {
            true => format!("{} at {}", self.model, self.base_url),
            false => self.model.clone(),
        }];
        parts.push(format!("wait {} s", self.timeout_ms / 1000));
        if let Some(x) = self.temperature {
            parts.push(format!("temperature {x}"));
        }
        if let Some(x) = self.max_tokens {
            parts.push(format!("max tokens {x}"));
        }
        if let Some(w) = self.context_window {
            parts.push(format!("window {w} (compact at {:.0} %)", self.compact_at * 100.0));
        }
        parts.join(" · ")
    }

    pub fn new(base_url: &str, model: &str) -> Self {
        Self {
            base_url: base_url.trim_end_matches('/').to_string(),
            model: model.to_string(),
            temperature: None,
            max_tokens: None,
            timeout_ms: 120_000,
            stream: true,
            stream_usage: true,
            max_retries: 3,
            context_window: None,
            compact_at: DEFAULT_COMPACT_AT,
            notes_message: true,
        }
    }
}

fn yes() -> bool {
    true
}

impl ModelConfig {
    /// `{base_url}/chat/completions`, parsed and checked to be an http or https URL.
    pub fn endpoint(&self) -> Result<reqwest::Url, ConfigError> {
        let trimmed = self.base_url.trim_end_matches('/');
        if let Some(base) = trimmed.strip_suffix("/chat/completions") {
            return Err(ConfigError(format!(
                "the model URL `{}` already ends in /chat/completions; give the base URL, \
                 the part before it: `{base}`",
                self.base_url
            )));
        }
        let url =
            reqwest::Url::parse(&format!("{}/chat/completions", self.base_url)).map_err(|e| {
                ConfigError(format!("the model URL `{}` is not a valid URL: {e}", self.base_url))
            })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ConfigError(format!(
                "the model URL `{}` is not an http:// or https:// URL",
                self.base_url
            )));
        }
        Ok(url)
    }

    /// Checks what can be checked before any call: the URL, the timeout, the temperature and
    /// the token limit.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.endpoint()?;
        if self.timeout_ms == 0 {
            return Err(ConfigError(
                "the model call timeout (`timeout_ms`) must be at least 1 ms".into(),
            ));
        }
        if let Some(t) = self.temperature
            && !(t.is_finite() && t >= 0.0)
        {
            return Err(ConfigError(format!(
                "the temperature must be a number of 0 or more, not {t}"
            )));
        }
        if self.max_tokens == Some(0) {
            return Err(ConfigError("max_tokens must be at least 1".into()));
        }
        if let Some(w) = self.context_window
            && w < MIN_CONTEXT_WINDOW
        {
            return Err(ConfigError(format!(
                "the context window must be at least {MIN_CONTEXT_WINDOW} tokens, not {w}"
            )));
        }
        if !(self.compact_at > 0.0 && self.compact_at <= 1.0) {
            return Err(ConfigError(format!(
                "compact_at is a fraction of the context window: more than 0 and at most 1, not {}",
                self.compact_at
            )));
        }
        Ok(())
    }
}
