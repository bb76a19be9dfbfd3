//! The model provider: OpenAI-compatible Chat Completions (OpenAI, DeepSeek, vLLM, Ollama,
//! llama.cpp server), streamed (SSE) or not.
//!
//! Owns the HTTP exchange of one model call: sending the exact request bytes it is given,
//! retries with backoff on 429/5xx (honouring `Retry-After`), and parsing the reply — robust to
//! servers' quirks (null vs empty content, ids and names repeated in every delta, arguments split
//! across chunks, the legacy `function_call` field, an empty 200, a stream cut mid-way). It does
//! not assemble requests (SessionEngine does) and commits nothing: a failed call leaves no trace.

pub mod answer;
mod config;
mod error;
mod probe;
mod sse;

use std::time::Duration;
use tracing::Instrument;

use serde::{Deserialize, Serialize};

use crate::cancel::CancelToken;
use crate::config::ConfigError;
use crate::ids::CallId;

pub use config::*;
use error::says_too_long;
pub use error::*;
pub use probe::{ServedModel, ServerProbe, ServerProps};
pub use sse::parse_stream;

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCallRequest {
    pub id: crate::ids::CallId,
    pub name: String,
    /// The raw arguments text (JSON, as the model produced it).
    pub arguments: String,
}

/// The model's reply.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ModelReply {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCallRequest>,
    pub finish_reason: Option<String>,
    /// The tokens the server says the call used, if it said.
    pub usage: Option<Usage>,
    /// The attempts the call took (1 when the first one succeeded).
    pub attempts: u32,
}

/// The tokens one model call used, as the server reported them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens of the request (the whole prompt: system message, history, tool schemas).
    pub prompt_tokens: u64,
    /// Tokens of the reply.
    pub completion_tokens: u64,
    /// Of the prompt tokens, those the server had cached, where it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
}

/// `usage` as servers send it: OpenAI's fields, with the cached tokens under
/// `prompt_tokens_details` (OpenAI, llama.cpp) or `prompt_cache_hit_tokens` (DeepSeek).
#[derive(Deserialize)]
pub(crate) struct UsageJson {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<UsageDetails>,
    #[serde(default)]
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct UsageDetails {
    cached_tokens: Option<u64>,
}

impl UsageJson {
    /// The usage, if the server gave at least the prompt's tokens.
    pub(crate) fn into_usage(self) -> Option<Usage> {
        Some(Usage {
            prompt_tokens: self.prompt_tokens?,
            completion_tokens: self.completion_tokens.unwrap_or(0),
            cached_tokens: self
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .or(self.prompt_cache_hit_tokens),
        })
    }
}

/// The largest reply body read: a larger one is refused ([`ModelError::TooLarge`]) before it
/// fills the host's memory.
pub const MAX_REPLY_BYTES: usize = 32 << 20;

/// Of an error reply (a non-200 status), only this much is read; the message shows the start.
const MAX_ERROR_BYTES: usize = 64 << 10;

/// Tool calls in one reply at most (real models make a handful): a reply with more, or a
/// stream delta whose call index is past it, is [`ModelError::Malformed`].
pub const MAX_TOOL_CALLS: usize = 256;

/// First retry delay; doubles each attempt, capped by [`MAX_BACKOFF`].
pub const BASE_BACKOFF: Duration = Duration::from_millis(200);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// An OpenAI-compatible client.
#[derive(Clone)]
pub struct ModelClient {
    /// Built at the first request to an `https://` server, not before: building it reads the
    /// system's trust store (some 150 files), which a process that never calls a model —
    /// `keel tool list`, most of the CLI — or calls one over plain HTTP (a server on loopback
    /// or in the same pod) should not pay for.
    https: std::sync::Arc<std::sync::OnceLock<Result<reqwest::Client, String>>>,
    /// Built at the first request to an `http://` server: trusts no certificate, so it reads
    /// none (it never speaks TLS: redirects are not followed).
    plain: std::sync::Arc<std::sync::OnceLock<Result<reqwest::Client, String>>>,
    api_key: Option<String>,
    /// The last endpoint parsed, by base URL: parsing one (with its host's IDNA mapping) was a
    /// few percent of a busy host's CPU, and a host almost always talks to one endpoint.
    endpoint: std::sync::Arc<std::sync::Mutex<Option<(String, reqwest::Url)>>>,
}

/// The `User-Agent` keel sends to model servers.
pub const USER_AGENT: &str = concat!("keel/", env!("CARGO_PKG_VERSION"));

/// A piece of a streamed reply, as it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streamed<'a> {
    /// More of the reply's text.
    Text(&'a str),
    /// The attempt that sent the text so far failed and the call is made again: what was
    /// shown is void, and the text starts over.
    Restart,
}

/// Where a streamed reply's pieces go as they arrive.
pub type OnText<'a> = &'a (dyn Fn(Streamed<'_>) + Send + Sync);

impl ModelClient {
    /// A client using `api_key` (if any) as a bearer token.
    pub fn new(api_key: Option<String>) -> Result<Self, ModelError> {
        Ok(Self {
            https: Default::default(),
            plain: Default::default(),
            api_key: api_key.filter(|k| !k.is_empty()),
            endpoint: Default::default(),
        })
    }

    /// The HTTP client for `url`, built at its first use: one that verifies servers against
    /// the system's trust store for `https://`, one that reads no certificate for `http://`.
    fn http(&self, url: &reqwest::Url) -> Result<&reqwest::Client, ModelError> {
        let plain = url.scheme() == "http";
        let cell = if plain { &self.plain } else { &self.https };
        cell.get_or_init(|| {
            crate::tls::init();
            let builder = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(USER_AGENT);
            let builder = if plain { builder.tls_certs_only([]) } else { builder };
            builder.build().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| ModelError::Transport(e.clone()))
    }

    /// The key from `KEEL_API_KEY`, else `OPENAI_API_KEY`.
    pub fn key_from_env() -> Option<String> {
        crate::config::env("KEEL_API_KEY").or_else(|| crate::config::env("OPENAI_API_KEY"))
    }

    /// Sends `body` (the exact request bytes) and parses the reply, retrying retryable
    /// failures with backoff.
    pub async fn complete(
        &self,
        config: &ModelConfig,
        body: &bytes::Bytes,
        cancel: &CancelToken,
    ) -> Result<ModelReply, ModelFailure> {
        self.complete_with(config, body, cancel, None).await
    }

    /// [`complete`](Self::complete), handing each piece of a streamed reply's text to
    /// `on_text` as it arrives (the reply is still parsed and checked whole at its end).
    ///
    /// The call is a `chat` span with the OpenTelemetry GenAI attributes (the model, the
    /// tokens, the finish reason; the request and the reply only when content is captured,
    /// [`crate::metrics::capture_content`]) and is counted in the model-call metrics.
    pub async fn complete_with(
        &self,
        config: &ModelConfig,
        body: &bytes::Bytes,
        cancel: &CancelToken,
        on_text: Option<OnText<'_>>,
    ) -> Result<ModelReply, ModelFailure> {
        let span = tracing::info_span!(
            "chat",
            otel.name = %format_args!("chat {}", config.model),
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = "openai",
            gen_ai.request.model = %config.model,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.response.finish_reasons = tracing::field::Empty,
            gen_ai.input.messages = tracing::field::Empty,
            gen_ai.output.messages = tracing::field::Empty,
            error.type = tracing::field::Empty,
            keel.attempts = tracing::field::Empty,
        );
        let started = std::time::Instant::now();
        let out =
            self.complete_unobserved(config, body, cancel, on_text).instrument(span.clone()).await;
        let metrics = &crate::metrics::MODEL_CALLS;
        match &out {
            Ok(reply) => {
                metrics.inc(&["ok"]);
                span.record("keel.attempts", reply.attempts);
                if let Some(u) = &reply.usage {
                    span.record("gen_ai.usage.input_tokens", u.prompt_tokens);
                    span.record("gen_ai.usage.output_tokens", u.completion_tokens);
                    let tokens = &crate::metrics::MODEL_TOKENS;
                    tokens.add(&["input"], u.prompt_tokens as f64);
                    tokens.add(&["output"], u.completion_tokens as f64);
                    tokens.add(&["cached"], u.cached_tokens.unwrap_or(0) as f64);
                }
                if let Some(f) = &reply.finish_reason {
                    span.record("gen_ai.response.finish_reasons", f.as_str());
                }
                if crate::metrics::capture_content() {
                    span.record("gen_ai.input.messages", crate::metrics::captured(body));
                    let reply = serde_json::json!({
                        "content": reply.content,
                        "tool_calls": reply.tool_calls.iter()
                            .map(|c| serde_json::json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
                            .collect::<Vec<_>>(),
                    });
                    span.record(
                        "gen_ai.output.messages",
                        crate::metrics::captured(reply.to_string().as_bytes()),
                    );
                }
            }
            Err(f) => {
                metrics.inc(&[f.last.kind()]);
                span.record("keel.attempts", f.attempts);
                span.record("error.type", f.last.kind());
            }
        }
        crate::metrics::MODEL_SECONDS.observe(&[], started.elapsed().as_secs_f64());
        out
    }

    async fn complete_unobserved(
        &self,
        config: &ModelConfig,
        body: &bytes::Bytes,
        cancel: &CancelToken,
        on_text: Option<OnText<'_>>,
    ) -> Result<ModelReply, ModelFailure> {
        let mut attempt = 0;
        let mut previous: Option<ModelError> = None;
        let mut garbled = 0;
        // Whether the current attempt has shown text (a retry then says the text starts over).
        let shown = std::sync::atomic::AtomicBool::new(false);
        let counting = |piece: Streamed<'_>| {
            if matches!(piece, Streamed::Text(t) if !t.is_empty()) {
                shown.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            if let Some(show) = on_text {
                show(piece);
            }
        };
        let on_text: Option<OnText<'_>> = on_text.map(|_| &counting as OnText<'_>);
        loop {
            attempt += 1;
            if attempt > 1
                && let Some(show) = on_text
                && shown.swap(false, std::sync::atomic::Ordering::Relaxed)
            {
                show(Streamed::Restart);
            }
            let result = tokio::select! {
                r = self.attempt(config, body, on_text) => r,
                () = cancel.cancelled() => Err(ModelError::Cancelled),
            };
            let again = |e: &ModelError| {
                e.is_retryable()
                    && attempt <= config.max_retries
                    // The same error twice is the server's answer to these bytes.
                    && !previous.as_ref().is_some_and(|p| e.same_as(p))
                    // A garbled body may be a proxy's hiccup: tried once more, not more.
                    && !(matches!(e, ModelError::Garbled(_)) && garbled >= 1)
            };
            match result {
                Ok(reply) => return Ok(ModelReply { attempts: attempt, ..reply }),
                Err(e) if again(&e) => {
                    if matches!(e, ModelError::Garbled(_)) {
                        garbled += 1;
                    }
                    let backoff = match &e {
                        ModelError::Status { retry_after: Some(d), .. } => *d,
                        _ => BASE_BACKOFF * 2u32.saturating_pow(attempt - 1),
                    }
                    .min(MAX_BACKOFF);
                    tracing::warn!(attempt, ?backoff, error = %e, "model call failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = cancel.cancelled() => {
                            return Err(ModelFailure { attempts: attempt, last: ModelError::Cancelled });
                        }
                    }
                    previous = Some(e);
                }
                Err(last) => return Err(ModelFailure { attempts: attempt, last }),
            }
        }
    }

    /// The endpoint of `config` ([`ModelConfig::endpoint`]), parsed once per base URL.
    fn endpoint(&self, config: &ModelConfig) -> Result<reqwest::Url, ModelError> {
        let mut last = self.endpoint.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((base, url)) = &*last
            && *base == config.base_url
        {
            return Ok(url.clone());
        }
        let url = config.endpoint().map_err(|e| ModelError::Config(e.0))?;
        *last = Some((config.base_url.clone(), url.clone()));
        Ok(url)
    }

    async fn attempt(
        &self,
        config: &ModelConfig,
        body: &bytes::Bytes,
        on_text: Option<OnText<'_>>,
    ) -> Result<ModelReply, ModelError> {
        // No limit on the whole exchange: a long reply that keeps coming is fine. What is
        // bounded is each wait — for the reply's head, then for each part of its body.
        let limit = Duration::from_millis(config.timeout_ms);
        let silent =
            |waiting| move |_| ModelError::Timeout { waiting, limit_ms: config.timeout_ms };
        let url = self.endpoint(config)?;
        let mut req = self
            .http(&url)?
            .post(url)
            .header("content-type", "application/json")
            .body(body.clone());
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        let mut resp = tokio::time::timeout(limit, req.send())
            .await
            .map_err(silent("the reply to begin"))?
            .map_err(|e| match e.is_connect() {
                // The innermost cause alone ("Connection refused (os error 111)"): the URL is
                // in the message already.
                true => {
                    ModelError::Unreachable { url: config.base_url.clone(), reason: innermost(&e) }
                }
                false => ModelError::Transport(transport(&e)),
            })?;
        let status = resp.status().as_u16();
        if (300..400).contains(&status) {
            let location = resp
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(|l| l.chars().filter(|c| !c.is_control()).take(500).collect())
                .unwrap_or_else(|| "an address it did not give".to_string());
            return Err(ModelError::Redirect { status, location });
        }
        if status != 200 {
            let retry_after = resp
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(retry_after);
            // Only the start of an error body is read (and shown).
            let mut start = Vec::new();
            while start.len() < MAX_ERROR_BYTES {
                match tokio::time::timeout(limit, resp.chunk()).await {
                    Ok(Ok(Some(chunk))) => start.extend_from_slice(&chunk),
                    Ok(Ok(None) | Err(_)) | Err(_) => break,
                }
            }
            let body: String = String::from_utf8_lossy(&start).chars().take(2000).collect();
            if says_too_long(status, &body) {
                return Err(ModelError::ContextTooLong { status, body });
            }
            if status == 404 {
                let url = self.endpoint(config)?;
                let hint = error::not_found_hint(&url, &config.model, &body);
                return Err(ModelError::NotFound { url: url.to_string(), body, hint });
            }
            return Err(ModelError::Status { status, body, retry_after });
        }
        let mut bytes = Vec::new();
        // Where the next stream line starts, for showing the text as it arrives.
        let mut line_start = 0;
        let on_text = on_text.filter(|_| config.stream);
        loop {
            let next = tokio::time::timeout(limit, resp.chunk())
                .await
                .map_err(silent("the next part of the reply"))?;
            match next {
                Ok(Some(chunk)) if bytes.len() + chunk.len() > MAX_REPLY_BYTES => {
                    return Err(ModelError::TooLarge);
                }
                Ok(Some(chunk)) => {
                    bytes.extend_from_slice(&chunk);
                    if let Some(show) = on_text {
                        while let Some(end) = bytes[line_start..].iter().position(|b| *b == b'\n') {
                            let line =
                                String::from_utf8_lossy(&bytes[line_start..line_start + end]);
                            if let Some(text) = sse::delta_text(&line) {
                                show(Streamed::Text(&text));
                            }
                            line_start += end + 1;
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    if bytes.is_empty() {
                        return Err(ModelError::Transport(transport(&e)));
                    }
                    // A stream cut mid-way: parse what came, which reports it truncated.
                    break;
                }
            }
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ModelError::Empty);
        }
        if config.stream && looks_like_sse(&bytes) {
            parse_stream(&bytes)
        } else {
            parse_json(&bytes)
        }
    }
}

fn innermost(e: &reqwest::Error) -> String {
    let mut last: &dyn std::error::Error = e;
    while let Some(s) = last.source() {
        last = s;
    }
    last.to_string()
}

fn transport(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A `Retry-After` given in seconds (any other form, such as an HTTP date, is ignored and the
/// usual backoff applies). A value too large for a duration waits the longest backoff; the
/// caller caps every wait at [`MAX_BACKOFF`].
fn retry_after(value: &str) -> Option<Duration> {
    let seconds = value.trim().parse::<f64>().ok().filter(|s| *s >= 0.0)?;
    Some(Duration::try_from_secs_f64(seconds).unwrap_or(MAX_BACKOFF))
}

fn too_many_calls(n: usize) -> ModelError {
    ModelError::Malformed(format!(
        "the reply asks for {n} tool calls; at most {MAX_TOOL_CALLS} are accepted in one reply"
    ))
}

fn looks_like_sse(bytes: &[u8]) -> bool {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(0);
    bytes[start..].starts_with(b"data:")
        || bytes[start..].starts_with(b":")
        || bytes[start..].starts_with(b"event:")
}

#[derive(Deserialize)]
struct Completion {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<UsageJson>,
}

#[derive(Deserialize)]
struct Choice {
    message: Option<Message>,
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Message {
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<FullCall>>,
    function_call: Option<FunctionPart>,
}

#[derive(Deserialize)]
struct FullCall {
    #[serde(default)]
    id: Option<String>,
    function: FunctionPart,
}

#[derive(Deserialize, Default)]
pub(crate) struct FunctionPart {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
}

/// The first bytes of a body, made printable, for an error message.
fn first_bytes(bytes: &[u8]) -> String {
    const SHOWN: usize = 200;
    let text: String = String::from_utf8_lossy(&bytes[..bytes.len().min(SHOWN)])
        .chars()
        .flat_map(char::escape_debug)
        .collect();
    if bytes.len() > SHOWN {
        format!("\"{text}\"… ({} bytes)", bytes.len())
    } else {
        format!("\"{text}\"")
    }
}

/// Parses a non-streamed reply.
pub fn parse_json(bytes: &[u8]) -> Result<ModelReply, ModelError> {
    let c: Completion = serde_json::from_slice(bytes).map_err(|e| {
        // JSON of another shape is a reply not understood; no JSON at all is garbled.
        if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok() {
            ModelError::Malformed(format!("not a chat completion: {e}"))
        } else {
            ModelError::Garbled(first_bytes(bytes))
        }
    })?;
    let usage = c.usage.and_then(UsageJson::into_usage);
    let choice = c
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| ModelError::Malformed("the reply has no choices".into()))?;
    let message = choice.message.unwrap_or_default();
    let mut tool_calls: Vec<ToolCallRequest> = message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .map(|c| ToolCallRequest {
            id: c.id.unwrap_or_default().into(),
            name: c.function.name.unwrap_or_default(),
            arguments: c.function.arguments.unwrap_or_default(),
        })
        .collect();
    if tool_calls.len() > MAX_TOOL_CALLS {
        return Err(too_many_calls(tool_calls.len()));
    }
    if tool_calls.is_empty()
        && let Some(f) = message.function_call
    {
        tool_calls.push(ToolCallRequest {
            id: CallId::default(),
            name: f.name.unwrap_or_default(),
            arguments: f.arguments.unwrap_or_default(),
        });
    }
    Ok(ModelReply {
        content: message.content.filter(|c| !c.is_empty()),
        tool_calls,
        finish_reason: choice.finish_reason,
        usage,
        attempts: 1,
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_url_ending_in_chat_completions_is_refused_with_the_base_url_to_use() {
        let mut c = ModelConfig::new("http://localhost:8080/v1/chat/completions", "m");
        assert_eq!(
            c.validate().map_err(|e| e.to_string()),
            Err("the model URL `http://localhost:8080/v1/chat/completions` already ends in \
                 /chat/completions; give the base URL, the part before it: \
                 `http://localhost:8080/v1`"
                .to_string())
        );
        c.base_url = "http://localhost:8080/v1".into();
        assert_eq!(c.validate(), Ok(()));
    }

    use super::*;

    #[test]
    fn a_refusal_s_window_is_read_from_the_shapes_servers_send() {
        let llama = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":4973,"n_ctx":3072}}"#;
        assert_eq!(window_in_refusal(llama), Some(3072));
        let older = "request (4973 tokens) exceeds the available context size (3072 tokens)";
        assert_eq!(window_in_refusal(older), Some(3072));
        let openai = "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.";
        assert_eq!(window_in_refusal(openai), Some(8192));
        assert_eq!(window_in_refusal("context_length_exceeded"), None);
        assert_eq!(window_in_refusal(r#"{"n_ctx":0}"#), None);
    }

    fn with_calls(n: usize) -> Vec<u8> {
        let calls: Vec<serde_json::Value> = (0..n)
            .map(|i| {
                serde_json::json!({"id": format!("c{i}"), "type": "function",
                    "function": {"name": "echo", "arguments": "{}"}})
            })
            .collect();
        serde_json::json!({"choices": [{"message": {"role": "assistant", "tool_calls": calls}}]})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn what_is_retried() {
        let status = |status, body: &str| ModelError::Status {
            status,
            body: body.into(),
            retry_after: None,
        };
        for code in [408, 429, 500, 502, 503, 504] {
            assert!(status(code, "busy").is_retryable(), "{code}");
        }
        for code in [400, 401, 403, 404, 422] {
            assert!(!status(code, "no").is_retryable(), "{code}");
        }
        let llama =
            r#"{"error":{"code":500,"message":"Failed to parse tool call arguments as JSON"}}"#;
        assert!(!status(500, llama).is_retryable());
        // The same 500 twice is deterministic; the same 503 twice is still load.
        assert!(status(500, "boom").same_as(&status(500, "boom")));
        assert!(!status(500, "boom").same_as(&status(500, "bang")));
        assert!(!status(503, "busy").same_as(&status(503, "busy")));
        assert!(says_too_long(400, r#"{"error":{"type":"exceed_context_size_error"}}"#));
        assert!(says_too_long(400, "This model's maximum context length is 8192 tokens"));
        assert!(!says_too_long(200, "context length"));
        assert!(!says_too_long(400, "bad temperature"));
    }

    #[test]
    fn a_body_that_is_not_json_is_garbled_and_json_of_another_shape_is_malformed() {
        match parse_json(b"<html>\n<h1>502</h1></html>") {
            Err(ModelError::Garbled(start)) => {
                assert_eq!(start, r#""<html>\n<h1>502</h1></html>""#)
            }
            other => panic!("{other:?}"),
        }
        let long = "x".repeat(1000);
        match parse_json(long.as_bytes()) {
            Err(ModelError::Garbled(start)) => {
                assert!(start.ends_with("… (1000 bytes)"), "{start}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse_json(b"{\"choices\": 3}"), Err(ModelError::Malformed(_))));
    }

    #[test]
    fn usage_of_a_json_reply_with_cached_tokens_in_either_form() {
        let reply = |usage: serde_json::Value| {
            serde_json::json!({"choices": [{"message": {"content": "hi"}}], "usage": usage})
                .to_string()
        };
        let r = parse_json(
            reply(serde_json::json!({"prompt_tokens": 10, "completion_tokens": 2,
            "prompt_cache_hit_tokens": 8}))
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(
            r.usage,
            Some(Usage { prompt_tokens: 10, completion_tokens: 2, cached_tokens: Some(8) })
        );
        // No prompt tokens: no usage (a server's empty object says nothing).
        assert_eq!(parse_json(reply(serde_json::json!({})).as_bytes()).unwrap().usage, None);
    }

    #[test]
    fn retry_after_values_never_panic() {
        assert_eq!(retry_after(" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(retry_after("0.5"), Some(Duration::from_millis(500)));
        // Too large for a duration (this used to panic the host): the longest backoff.
        assert_eq!(retry_after("1e20"), Some(MAX_BACKOFF));
        assert_eq!(retry_after("inf"), Some(MAX_BACKOFF));
        for ignored in ["-1", "NaN", "soon", "Wed, 21 Oct 2015 07:28:00 GMT", ""] {
            assert_eq!(retry_after(ignored), None, "{ignored:?}");
        }
    }

    #[test]
    fn a_reply_with_more_tool_calls_than_the_limit_is_refused() {
        assert_eq!(parse_json(&with_calls(MAX_TOOL_CALLS)).map(|r| r.tool_calls.len()), Ok(256));
        match parse_json(&with_calls(MAX_TOOL_CALLS + 1)) {
            Err(ModelError::Malformed(m)) => assert!(m.contains("257 tool calls"), "{m}"),
            other => panic!("expected a malformed reply, got {other:?}"),
        }
    }
}
