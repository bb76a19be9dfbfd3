//! Effect-counting tools for the crash and approval tests: each execution appends one line to a
//! log file in the granted workspace, so a duplicate execution is visible.

use std::io::Write;

use keel_sdk::{Effect, JsonSchema, Tool, ToolError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Deserialize, JsonSchema)]
struct Label {
    /// A label unique to the call.
    label: String,
}

#[derive(Serialize, JsonSchema)]
struct Out(Value);

/// Appends `line` to `path`, one write.
fn append(path: &str, line: &str) -> Result<(), ToolError> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| ToolError::io(path, &e))?;
    f.write_all(format!("{line}\n").as_bytes()).map_err(|e| ToolError::io(path, &e))
}

fn effect_append(i: Label) -> Result<Out, ToolError> {
    append("/work/effects.log", &i.label)?;
    Ok(Out(json!({"appended": i.label})))
}

fn effect_send(i: Label) -> Result<Out, ToolError> {
    append("/work/sent.log", &i.label)?;
    Ok(Out(json!({"sent": i.label})))
}

fn effect_put(i: Label) -> Result<Out, ToolError> {
    append("/work/puts.log", &i.label)?;
    std::fs::write(format!("/work/put-{}", i.label), &i.label)
        .map_err(|e| ToolError::io(&i.label, &e))?;
    Ok(Out(json!({"put": i.label})))
}

fn effect_wipe(i: Label) -> Result<Out, ToolError> {
    append("/work/wiped.log", &i.label)?;
    Ok(Out(json!({"wiped": i.label})))
}

fn effect_peek(i: Label) -> Result<Out, ToolError> {
    let text = std::fs::read_to_string("/work/effects.log").unwrap_or_default();
    Ok(Out(json!({"label": i.label, "lines": text.lines().count()})))
}

fn tools() -> Vec<Tool> {
    use Effect::*;
    vec![
        Tool::new(
            "effect_append",
            "Appends the label to effects.log (not idempotent).",
            WorkspaceWrite,
            effect_append,
        ),
        Tool::new(
            "effect_send",
            "Records the label in sent.log, standing for a message sent to the outside world.",
            External,
            effect_send,
        ),
        Tool::new(
            "effect_put",
            "Writes the file put-LABEL (idempotent); counts executions in puts.log.",
            WorkspaceWrite,
            effect_put,
        )
        .idempotent(),
        Tool::new(
            "effect_wipe",
            "Records the label in wiped.log, standing for an irreversible deletion.",
            Destructive,
            effect_wipe,
        ),
        Tool::new("effect_peek", "Counts the lines of effects.log.", ReadOnly, effect_peek),
    ]
}

keel_sdk::export_tools!(tools);
