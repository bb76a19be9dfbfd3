//! The `summary` component's tool, `note_summary` (read-only, idempotent), in the two versions
//! replay's regression check installs one after the other: version 2 adds the words to the
//! output.

use keel_sdk::{Effect, JsonSchema, Tool, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, JsonSchema)]
pub struct Input {
    /// The file to summarize.
    path: String,
}

#[derive(Serialize, JsonSchema)]
pub struct Output {
    lines: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    words: Option<usize>,
}

fn read(path: &str) -> Result<String, ToolError> {
    std::fs::read_to_string(path).map_err(|e| ToolError::io(path, &e))
}

fn version_1(i: Input) -> Result<Output, ToolError> {
    Ok(Output { lines: read(&i.path)?.lines().count(), words: None })
}

fn version_2(i: Input) -> Result<Output, ToolError> {
    let text = read(&i.path)?;
    Ok(Output { lines: text.lines().count(), words: Some(text.split_whitespace().count()) })
}

/// The tools of version `version` (1 or 2).
pub fn tools(version: u32) -> Vec<Tool> {
    let run = if version > 1 { version_2 } else { version_1 };
    vec![
        Tool::new("note_summary", "Counts the lines of a file.", Effect::ReadOnly, run)
            .idempotent(),
    ]
}
