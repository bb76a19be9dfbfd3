//! `control`: keel's first-party control tools — the plan of the session's current phase.
//!
//! - `plan_create {"steps": ["…", …]}` replaces the phase's plan with these steps;
//! - `plan_update {"step": N, "status": "pending|in_progress|done|skipped", "note"?}` moves
//!   step N (from 1);
//! - `task_complete {"summary": "…"}` closes the current phase.
//!
//! The component targets the `keel:tool/control-tool` world: besides the tool exports it
//! imports `keel:control/plan`, which keel links only for components it trusts with it. The
//! session holds the plan; these tools ask it for changes and report the plan as it stands
//! after them. The changes are committed with the call's result, once.

#[allow(unsafe_code, missing_docs, clippy::all)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "keel:tool/control-tool",
        generate_all,
    });
}

use bindings::exports::keel::tool::tools::Guest;
use bindings::keel::control::plan;
use bindings::keel::tool::types::{Effect, ToolError, ToolSpec};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateInput {
    steps: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateInput {
    step: u32,
    status: String,
    #[serde(default)]
    note: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteInput {
    summary: String,
}

fn status_name(s: plan::StepStatus) -> &'static str {
    match s {
        plan::StepStatus::Pending => "pending",
        plan::StepStatus::InProgress => "in_progress",
        plan::StepStatus::Done => "done",
        plan::StepStatus::Skipped => "skipped",
    }
}

fn status_of(s: &str) -> Result<plan::StepStatus, ToolError> {
    Ok(match s {
        "pending" => plan::StepStatus::Pending,
        "in_progress" => plan::StepStatus::InProgress,
        "done" => plan::StepStatus::Done,
        "skipped" => plan::StepStatus::Skipped,
        other => {
            return Err(ToolError::InvalidInput(format!(
                "`status` is `{other}`: use pending, in_progress, done or skipped"
            )));
        }
    })
}

fn plan_json(steps: &[plan::Step]) -> Value {
    let steps: Vec<Value> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut v = json!({"step": i + 1, "text": s.text, "status": status_name(s.status)});
            if let Some(n) = &s.note {
                v["note"] = json!(n);
            }
            v
        })
        .collect();
    json!({"plan": steps})
}

fn parse<T: serde::de::DeserializeOwned>(input: &str) -> Result<T, ToolError> {
    serde_json::from_str(input).map_err(|e| ToolError::InvalidInput(e.to_string()))
}

fn spec(name: &str, description: &str, schema: Value, idempotent: bool) -> ToolSpec {
    ToolSpec {
        name: name.to_string(),
        description: description.to_string(),
        input_schema: schema.to_string(),
        output_schema: None,
        // The only thing these tools change is the session's plan, committed with their
        // result: nothing in the world, so they run like any read-only call.
        effect: Effect::ReadOnly,
        idempotent,
    }
}

struct Control;

impl Guest for Control {
    fn describe() -> Vec<ToolSpec> {
        vec![
            spec(
                "plan_create",
                "Writes the plan of the current phase: its steps, in order, all pending. Replaces any plan the phase had. Use it for work of several steps, then keep it current with plan_update.",
                json!({"type": "object", "additionalProperties": false, "required": ["steps"],
                    "properties": {"steps": {"type": "array", "minItems": 1, "maxItems": 64,
                        "items": {"type": "string", "minLength": 1},
                        "description": "The steps, in order, each a short imperative sentence."}}}),
                false,
            ),
            spec(
                "plan_update",
                "Sets the status of one step of the current plan (steps count from 1), with an optional note.",
                json!({"type": "object", "additionalProperties": false, "required": ["step", "status"],
                    "properties": {
                        "step": {"type": "integer", "minimum": 1},
                        "status": {"type": "string", "enum": ["pending", "in_progress", "done", "skipped"]},
                        "note": {"type": "string"}}}),
                true,
            ),
            spec(
                "task_complete",
                "Declares the current task (phase) complete, with a summary of what was done and verified. Call it once the work is finished and checked.",
                json!({"type": "object", "additionalProperties": false, "required": ["summary"],
                    "properties": {"summary": {"type": "string", "minLength": 1}}}),
                false,
            ),
        ]
    }

    fn invoke(name: String, input: String) -> Result<String, ToolError> {
        let out = match name.as_str() {
            "plan_create" => {
                let i: CreateInput = parse(&input)?;
                plan_json(&plan::create(&i.steps).map_err(ToolError::Failed)?)
            }
            "plan_update" => {
                let i: UpdateInput = parse(&input)?;
                let status = status_of(&i.status)?;
                plan_json(
                    &plan::update(i.step, status, i.note.as_deref()).map_err(ToolError::Failed)?,
                )
            }
            "task_complete" => {
                let i: CompleteInput = parse(&input)?;
                plan::complete(&i.summary).map_err(ToolError::Failed)?;
                json!({"completed": true, "summary": i.summary.trim()})
            }
            other => return Err(ToolError::UnknownTool(other.to_string())),
        };
        Ok(out.to_string())
    }
}

bindings::export!(Control with_types_in bindings);
