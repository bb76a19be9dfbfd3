//! A call's result as the model sees it when the call failed:
//! `{"error": {"kind": KIND, "message": MESSAGE}}`. One builder for every writer of a tool
//! result — the turn loop, direct calls, a turn closed without its runner, recovery — so the
//! shape the model reads is the same whoever wrote it.

use serde_json::{Value, json};

/// The error object of a failed call, to which a writer may add fields of its own (the
/// refused network requests, say).
pub fn error_value(kind: &str, message: &str) -> Value {
    json!({"error": {"kind": kind, "message": message}})
}

/// The error object of a failed call, as the text stored and shown to the model.
pub fn error_content(kind: &str, message: &str) -> String {
    error_value(kind, message).to_string()
}
