//! Why a model call failed ([`ModelError`]), which failures are retried, and the failure
//! after every attempt ([`ModelFailure`]).

use super::*;

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("the model server answered HTTP {status}: {body}")]
    Status { status: u16, body: String, retry_after: Option<Duration> },
    /// The server answered with a redirect. keel does not follow it: a POST redirected by 301,
    /// 302 or 303 would be resent as a GET without its body, and the key would not go to
    /// another host — the call would fail later with a less clear error.
    #[error(
        "the model server redirected the request (HTTP {status}) to {location}; keel does not follow redirects: point the base URL at the new address"
    )]
    Redirect { status: u16, location: String },
    /// The server answered 404: nothing is served at that address (a base URL without its
    /// `/v1`, most often), or it does not serve the model named. The address asked, and what
    /// to change.
    #[error("the model server answered HTTP 404 to POST {url}: {body}; {hint}")]
    NotFound { url: String, body: String, hint: String },
    #[error("cannot reach the model server: {0}")]
    Transport(String),
    /// No connection could be made to the server at all (refused, no route, no such host):
    /// nothing is listening there, and trying again at once would not change that.
    #[error(
        "cannot connect to the model server at {url} ({reason}); is a server running at {url}?"
    )]
    Unreachable { url: String, reason: String },
    /// The server sent nothing for the longest wait without progress.
    #[error(
        "the model server sent nothing for {} while keel waited for {waiting}; that is the longest wait without progress \
         (--model-timeout, KEEL_MODEL_TIMEOUT or [model] timeout_ms, now {limit_ms} ms; a session keeps the value it was created with)",
        crate::units::format_duration(std::time::Duration::from_millis(*limit_ms))
    )]
    Timeout { waiting: &'static str, limit_ms: u64 },
    /// A 200 whose body is neither JSON nor an event stream (an HTML error page from a proxy,
    /// say): its first bytes, made printable.
    #[error(
        "the model server answered 200 with a body that is neither JSON nor an event stream; it starts: {0}"
    )]
    Garbled(String),
    /// The server refused the request as longer than the model's context window.
    #[error(
        "the request is too long for the model's context window (the server answered HTTP {status}: {body}). \
         The session's history no longer fits: start a new session with a shorter task, or use a model \
         (or a server setting, such as llama-server's --ctx-size) with a larger context"
    )]
    ContextTooLong { status: u16, body: String },
    #[error("the model server answered 200 with an empty body")]
    Empty,
    #[error("the model's stream ended before it finished (no [DONE] or finish_reason)")]
    Truncated,
    #[error("the model server's reply is not understood: {0}")]
    Malformed(String),
    #[error(
        "the model server's reply is larger than {} MiB; refused (a reply this large is not a chat completion)",
        MAX_REPLY_BYTES >> 20
    )]
    TooLarge,
    #[error("the model call was cancelled")]
    Cancelled,
    /// The configuration cannot work (an invalid URL, say): trying again would not help.
    #[error("{0}")]
    Config(String),
}

/// What to change when `url` answered 404 with `body`: the model name, when the body says
/// the model is not there (OpenAI's `model_not_found`, Ollama's "model … not found"); else
/// the base URL, which for an OpenAI-compatible server ends in `/v1`.
pub(super) fn not_found_hint(url: &reqwest::Url, model: &str, body: &str) -> String {
    let lower = body.to_ascii_lowercase();
    if lower.contains("model_not_found")
        || (lower.contains("model") && (lower.contains("not found") || lower.contains("does not exist")))
    {
        return format!(
            "the server does not serve the model `{model}`: set --model (KEEL_MODEL) to one it \
             lists at GET /v1/models (`keel doctor` shows them)"
        );
    }
    let base = url.as_str().trim_end_matches("/chat/completions");
    if !base.trim_end_matches('/').ends_with("/v1") {
        return format!(
            "an OpenAI-compatible server serves the API under /v1: try the base URL {}/v1 \
             (--model-url, KEEL_MODEL_URL)",
            base.trim_end_matches('/')
        );
    }
    "nothing is served at that address: check the base URL (--model-url, KEEL_MODEL_URL); \
     `keel doctor` checks it"
        .to_string()
}

/// Whether an error body says the server could not parse the request (llama.cpp answers 500
/// "Failed to parse tool call arguments as JSON" to a history it cannot read): sending the
/// same bytes again fails the same way.
fn says_unparsable(body: &str) -> bool {
    let lower = body.to_ascii_lowercase();
    lower.contains("failed to parse") || lower.contains("parse error")
}

/// Whether an error reply says the request does not fit the model's context window: OpenAI's
/// `context_length_exceeded`, llama.cpp's `exceed_context_size_error` and "exceeds the
/// available context size", vLLM's "maximum context length", and their kin.
pub(super) fn says_too_long(status: u16, body: &str) -> bool {
    if !(400..600).contains(&status) {
        return false;
    }
    let lower = body.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "exceed_context_size",
        "context size",
        "context length",
        "context window",
        "maximum context",
        "too many tokens",
        "prompt is too long",
    ]
    .iter()
    .any(|p| lower.contains(p))
}

/// The context window a refusal names, in tokens: llama.cpp's `n_ctx` (its JSON error, or
/// "available context size (N tokens)"), OpenAI's and vLLM's "maximum context length is N
/// tokens". `None` when the body says no number.
pub fn window_in_refusal(body: &str) -> Option<u64> {
    let re = regex::Regex::new(
        r#"(?i)"n_ctx"\s*:\s*(\d+)|context size \((\d+) tokens\)|maximum context length is (\d+)"#,
    )
    .ok()?;
    let caps = re.captures(body)?;
    (1..=3).find_map(|i| caps.get(i)).and_then(|m| m.as_str().parse().ok()).filter(|n| *n > 0)
}

impl ModelError {
    /// The error's kind, as a name (the metrics' label and the trace's `error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Status { .. } => "status",
            Self::NotFound { .. } => "not_found",
            Self::Redirect { .. } => "redirect",
            Self::Transport(_) => "transport",
            Self::Unreachable { .. } => "unreachable",
            Self::Timeout { .. } => "timeout",
            Self::Garbled(_) => "garbled",
            Self::ContextTooLong { .. } => "context_too_long",
            Self::Empty => "empty",
            Self::Truncated => "truncated",
            Self::Malformed(_) => "malformed",
            Self::TooLarge => "too_large",
            Self::Cancelled => "cancelled",
            Self::Config(_) => "config",
        }
    }

    /// The HTTP status the server answered with, for an error that has one.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. }
            | Self::Redirect { status, .. }
            | Self::ContextTooLong { status, .. } => Some(*status),
            Self::NotFound { .. } => Some(404),
            Self::Empty
            | Self::Truncated
            | Self::Malformed(_)
            | Self::TooLarge
            | Self::Garbled(_) => Some(200),
            _ => None,
        }
    }

    /// Whether `self` is the very failure `previous` was, and one that says nothing of load: a
    /// server that answers the same 500 twice to the same bytes will answer it every time.
    /// Overload and gateway statuses (408, 429, 502, 503, 504) say to come back later, however
    /// often they repeat.
    pub(super) fn same_as(&self, previous: &Self) -> bool {
        match (self, previous) {
            (Self::Status { status: a, body: x, .. }, Self::Status { status: b, body: y, .. }) => {
                a == b && x == y && !matches!(a, 408 | 429 | 502..=504)
            }
            _ => false,
        }
    }
}

impl ModelError {
    /// Whether trying again may succeed: not for a request the server refused as such (a 4xx
    /// other than 408 and 429, a 5xx saying it could not parse the request), nor for a reply
    /// that parsed but makes no sense.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Status { status, body, .. } => match status {
                408 | 429 => true,
                500.. => !says_unparsable(body),
                _ => false,
            },
            Self::Transport(_)
            | Self::Empty
            | Self::Truncated
            | Self::Timeout { .. }
            | Self::Garbled(_) => true,
            Self::ContextTooLong { .. }
            | Self::NotFound { .. }
            | Self::Unreachable { .. }
            | Self::Malformed(_)
            | Self::TooLarge
            | Self::Cancelled
            | Self::Config(_)
            | Self::Redirect { .. } => false,
        }
    }
}

/// A failed call after all its attempts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("model call failed after {attempts} attempt(s): {last}")]
pub struct ModelFailure {
    pub attempts: u32,
    pub last: ModelError,
}
