//! A call's result as the model sees it and the journal keeps it: a [`ToolResult`] — the
//! content (redacted, capped) and, when the call failed, its [`FailureKind`]. A failed call's
//! content is `{"error": {"kind": KIND, "message": MESSAGE}}`. One builder for every writer of
//! a tool result — the turn loop, direct calls, a turn closed without its runner, recovery —
//! so the shape the model reads is the same whoever wrote it.

use serde_json::{Value, json};

pub use crate::failure::FailureKind;

use super::{CallOutcome, ToolServiceError};

/// A call's result: what the model reads, and why the call failed if it did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolResult {
    /// The text the model reads (and the journal stores): the tool's output, or the error
    /// object of a failed call.
    pub content: String,
    /// Why the call failed; `None` when it succeeded.
    pub error: Option<FailureKind>,
}

impl ToolResult {
    /// The result of a call that failed (or was refused) with `kind` and `message`.
    pub fn failed(kind: FailureKind, message: &str) -> Self {
        ToolResult { content: error_content(kind, message), error: Some(kind) }
    }

    /// The result of a call the ToolService ran or refused: redacted by `policy`, then capped
    /// at `cap` bytes with a marker that says how to read more.
    pub fn of(
        outcome: &Result<CallOutcome, ToolServiceError>,
        cap: usize,
        policy: &crate::policy::Policy,
    ) -> Self {
        let (text, error) = match outcome {
            Ok(o) => match &o.report.result {
                Ok(v) => {
                    let text = match &o.changes {
                        Some(ch) if !ch.is_empty() => {
                            json!({"output": v, "changes": ch}).to_string()
                        }
                        _ => v.to_string(),
                    };
                    (text, None)
                }
                Err(e) => {
                    let mut error = error_value(e.failure(), &e.to_string());
                    // Why keel refused a request: the tool only saw HTTP-request-denied.
                    let refused: Vec<String> = o
                        .report
                        .net
                        .records
                        .iter()
                        .filter(|r| r.outcome != "ok")
                        .filter_map(|r| {
                            r.reason.as_ref().map(|why| {
                                format!(
                                    "{} {}://{}:{}{}: {why}",
                                    r.method, r.scheme, r.host, r.port, r.path
                                )
                            })
                        })
                        .collect();
                    if !refused.is_empty() {
                        error["error"]["network"] = json!(refused);
                    }
                    (error.to_string(), Some(e.failure()))
                }
            },
            Err(e) => (error_content(e.failure(), &e.to_string()), Some(e.failure())),
        };
        ToolResult { content: cap_text(policy.redact(&text).into_owned(), cap), error }
    }

    /// Whether the call succeeded.
    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }
}

/// The error object of a failed call, to which a writer may add fields of its own (the
/// refused network requests, say).
pub fn error_value(kind: FailureKind, message: &str) -> Value {
    json!({"error": {"kind": kind.as_str(), "message": message}})
}

/// The error object of a failed call, as the text stored and shown to the model.
pub fn error_content(kind: FailureKind, message: &str) -> String {
    error_value(kind, message).to_string()
}

/// `text` cut at `cap` bytes (on a character boundary) with a marker saying how much was
/// shown and how to read the rest.
pub fn cap_text(text: String, cap: usize) -> String {
    if text.len() <= cap {
        return text;
    }
    let mut cut = cap;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(
        "{}\n[output truncated: {} of {} bytes shown. Ask for less at a time — use offset/limit, a narrower path or fewer results — to read the rest.]",
        &text[..cut],
        cut,
        text.len()
    )
}

/// Bytes of what a call's tool wrote to its log, stderr and stdout that its journal entry
/// keeps, at most.
pub const LOGS_KEPT: usize = 16 * 1024;

/// What the tool of `outcome` wrote to its log, stderr and stdout, as its journal entry keeps
/// it: JSON `{"logs": [{"level", "message"}], "stderr", "stdout", "cut"}` — redacted by
/// `policy` as outputs are, at most [`LOGS_KEPT`] bytes in that order of priority, `cut` the
/// bytes left out (here, or by the sandbox's own caps). Never part of what the model reads.
/// `None` when it wrote nothing.
pub fn kept_logs(
    outcome: &Result<CallOutcome, ToolServiceError>,
    policy: &crate::policy::Policy,
) -> Option<String> {
    let r = &outcome.as_ref().ok()?.report;
    if r.logs.is_empty() && r.stdout.text.is_empty() && r.stderr.text.is_empty() {
        return None;
    }
    let mut room = LOGS_KEPT;
    let mut cut = r.stdout.dropped_bytes + r.stderr.dropped_bytes;
    let mut take = |text: &str| -> String {
        let text = policy.redact(text);
        let mut end = text.len().min(room);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        room -= end;
        cut += (text.len() - end) as u64;
        text[..end].to_string()
    };
    let logs: Vec<Value> = r
        .logs
        .iter()
        .map(|l| json!({"level": l.level, "message": take(&l.message)}))
        .collect();
    let stderr = take(&r.stderr.text);
    let stdout = take(&r.stdout.text);
    let mut kept = json!({"logs": logs, "stderr": stderr, "stdout": stdout});
    if cut > 0 || r.dropped_logs > 0 {
        kept["cut"] = json!({"bytes": cut, "log_records": r.dropped_logs});
    }
    Some(kept.to_string())
}
