//! `control`: keel's first-party control tools — the plan of the session's current phase, and
//! discovery of skills, tools and the user's memory.
//!
//! - `plan_create {"steps": ["…", …]}` replaces the phase's plan with these steps;
//! - `plan_update {"step": N, "status": "pending|in_progress|done|skipped", "note"?}` moves
//!   step N (from 1);
//! - `task_complete {"summary": "…"}` closes the current phase;
//! - `skills_find {"query"}`, `skills_load {"name", "offset"?, "file"?}`;
//! - `tools_find {"query"}`, `tools_select {"names": [...]}`;
//! - `memory_write {"text", "tags"?}`, `memory_find {"query"}`;
//! - delegation, in a workgroup: `session_spawn {"purpose", "input", "resources"?, "grants"?}`,
//!   `session_send {"session", "input"}`, `session_status {"sessions"?}`,
//!   `session_interrupt {"session"}`, `session_ask {"question"}`.
//!
//! The component targets the `keel:tool/control-tool` world: besides the tool exports it
//! imports the `keel:control` interfaces, which keel links only for components it trusts with
//! them. The session holds the plan, its capabilities and the user's memory; these tools ask
//! it for changes, committed with the call's result, once.

#[allow(unsafe_code, missing_docs, clippy::all)]
mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "keel:tool/control-tool",
        generate_all,
    });
}

use bindings::exports::keel::tool::tools::Guest;
use bindings::keel::control::types::ControlError;
use bindings::keel::control::{capabilities, memory, plan, sessions};
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueryInput {
    query: String,
    #[serde(default)]
    limit: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadInput {
    name: String,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    file: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SelectInput {
    names: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteInput {
    text: String,
    #[serde(default)]
    tags: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpawnInput {
    purpose: String,
    input: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    grants: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendInput {
    session: String,
    input: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusInput {
    #[serde(default)]
    sessions: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionInput {
    session: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AskInput {
    question: String,
}

fn query_schema(what: &str) -> Value {
    json!({"type": "object", "additionalProperties": false, "required": ["query"],
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 512,
                "description": format!("Words describing the {what} wanted.")},
            "limit": {"type": "integer", "minimum": 1, "maximum": 50,
                "description": "Results at most (default 10)."}}})
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

/// keel's refusal of a control request, as the tool's error: its message, as a failed call —
/// the kind the model has always been shown for a refused control request, whatever keel's
/// reason (the reason is in the message).
fn refused(e: ControlError) -> ToolError {
    match e {
        ControlError::Invalid(m)
        | ControlError::Denied(m)
        | ControlError::Unavailable(m)
        | ControlError::Failed(m) => ToolError::Failed(m),
    }
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
        // What these tools change is the session's own state (its plan, its capabilities, the
        // user's memory), committed with their result: nothing in the world, so they run like
        // any read-only call.
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
                "skills_find",
                "Searches the installed skills (methods for kinds of work: steps, rules, output requirements) by words describing the work. Returns names and descriptions; load one with skills_load to follow it.",
                query_schema("skill"),
                true,
            ),
            spec(
                "skills_load",
                "Loads an installed skill into this session and returns its method (a page of its body; `next_offset` says where the next page begins) or one of its reference files. The skill is shown with every later request. A skill grants nothing: a tool it mentions must still be loaded with tools_select.",
                json!({"type": "object", "additionalProperties": false, "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "offset": {"type": "integer", "minimum": 0, "description": "Byte offset of the page to read (from next_offset)."},
                        "file": {"type": "string", "description": "A reference file of the skill, by path."}}}),
                true,
            ),
            spec(
                "tools_find",
                "Searches the installed tools that are not necessarily loaded in this session, by words describing the action wanted. Returns each tool's name, its tool set (component), description and effect class; load them with tools_select.",
                query_schema("tool"),
                true,
            ),
            spec(
                "tools_select",
                "Loads installed tools into this session by name — or a whole tool set by its component name — so they can be called from the next step on. Their calls follow the session's grants and policy like any other.",
                json!({"type": "object", "additionalProperties": false, "required": ["names"],
                    "properties": {"names": {"type": "array", "minItems": 1, "maxItems": 64,
                        "items": {"type": "string", "minLength": 1}}}}),
                true,
            ),
            spec(
                "memory_write",
                "Remembers a fact for the user across sessions. Use it ONLY when the user explicitly asks you to remember something (a preference, a decision, a fact about their work); never on your own initiative.",
                json!({"type": "object", "additionalProperties": false, "required": ["text"],
                    "properties": {
                        "text": {"type": "string", "minLength": 1, "maxLength": 2000,
                            "description": "The fact, in one or two self-contained sentences."},
                        "tags": {"type": "array", "maxItems": 8, "items": {"type": "string", "minLength": 1, "maxLength": 40}}}}),
                false,
            ),
            spec(
                "memory_find",
                "Searches what the user asked to be remembered in earlier sessions, by words describing the topic.",
                query_schema("memory"),
                true,
            ),
            spec(
                "task_complete",
                "Declares the current task (phase) complete, with a summary of what was done and verified. Call it once the work is finished and checked.",
                json!({"type": "object", "additionalProperties": false, "required": ["summary"],
                    "properties": {"summary": {"type": "string", "minLength": 1}}}),
                false,
            ),
            spec(
                "session_spawn",
                "Hands work to a new sub-session of this workgroup. It gets only `input` (the original request, in the user's words) and `resources` (stable references: paths, URLs, ids) and works it out itself, with its own tools. Returns its id at once; its answer, question, failure or wait for approval arrives later as a notification that wakes you — end your turn to wait. `grants` (`/guest/path:ro|rw`) may only narrow yours; none gives it yours.",
                json!({"type": "object", "additionalProperties": false, "required": ["purpose", "input"],
                    "properties": {
                        "purpose": {"type": "string", "minLength": 1, "maxLength": 200,
                            "description": "A short label for the work, shown in the workgroup."},
                        "input": {"type": "string", "minLength": 1, "description": "The request for the sub-session."},
                        "resources": {"type": "array", "maxItems": 32, "items": {"type": "string", "minLength": 1, "maxLength": 1024}},
                        "grants": {"type": "array", "maxItems": 16, "items": {"type": "string", "minLength": 1}}}}),
                false,
            ),
            spec(
                "session_send",
                "Sends more input to one of your sub-sessions: an answer to its question, a correction, or new work after it finished.",
                json!({"type": "object", "additionalProperties": false, "required": ["session", "input"],
                    "properties": {
                        "session": {"type": "string", "minLength": 1},
                        "input": {"type": "string", "minLength": 1}}}),
                false,
            ),
            spec(
                "session_status",
                "Shows where sub-sessions stand (state, live or done, their last answer or failure, approvals they wait for). No `sessions`: your children. It does not wait.",
                json!({"type": "object", "additionalProperties": false,
                    "properties": {"sessions": {"type": "array", "maxItems": 256, "items": {"type": "string", "minLength": 1}}}}),
                true,
            ),
            spec(
                "session_interrupt",
                "Stops one of your sub-sessions and every session below it; each ends with an `interrupted` notification.",
                json!({"type": "object", "additionalProperties": false, "required": ["session"],
                    "properties": {"session": {"type": "string", "minLength": 1}}}),
                false,
            ),
            spec(
                "session_ask",
                "Asks the session that gave you this work a question (sub-sessions only). Then end your turn: the answer arrives as your next input.",
                json!({"type": "object", "additionalProperties": false, "required": ["question"],
                    "properties": {"question": {"type": "string", "minLength": 1}}}),
                false,
            ),
        ]
    }

    fn invoke(name: String, input: String) -> Result<String, ToolError> {
        let out = match name.as_str() {
            "plan_create" => {
                let i: CreateInput = parse(&input)?;
                plan_json(&plan::create(&i.steps).map_err(refused)?)
            }
            "plan_update" => {
                let i: UpdateInput = parse(&input)?;
                let status = status_of(&i.status)?;
                plan_json(&plan::update(i.step, status, i.note.as_deref()).map_err(refused)?)
            }
            "task_complete" => {
                let i: CompleteInput = parse(&input)?;
                plan::complete(&i.summary).map_err(refused)?;
                json!({"completed": true, "summary": i.summary.trim()})
            }
            "skills_find" => {
                let i: QueryInput = parse(&input)?;
                let hits =
                    capabilities::find_skills(&i.query, i.limit.unwrap_or(10)).map_err(refused)?;
                let skills: Vec<Value> = hits
                    .iter()
                    .map(|h| json!({"name": h.name, "description": h.description}))
                    .collect();
                json!({"skills": skills})
            }
            "skills_load" => {
                let i: LoadInput = parse(&input)?;
                let page =
                    capabilities::load_skill(&i.name, i.offset.unwrap_or(0), i.file.as_deref())
                        .map_err(refused)?;
                let mut out = json!({
                    "accepted_skill_ids": [page.name],
                    "name": page.name,
                    "description": page.description,
                    "text": page.text,
                    "files": page.files,
                    "tools": page.tools,
                });
                if let Some(f) = i.file {
                    out["file"] = json!(f);
                }
                if let Some(n) = page.next_offset {
                    out["next_offset"] = json!(n);
                }
                out
            }
            "tools_find" => {
                let i: QueryInput = parse(&input)?;
                let hits =
                    capabilities::find_tools(&i.query, i.limit.unwrap_or(10)).map_err(refused)?;
                let tools: Vec<Value> = hits
                    .iter()
                    .map(|h| json!({"name": h.name, "toolset": h.toolset, "description": h.description, "effect": h.effect}))
                    .collect();
                json!({"tools": tools})
            }
            "tools_select" => {
                let i: SelectInput = parse(&input)?;
                let accepted = capabilities::select_tools(&i.names).map_err(refused)?;
                json!({"accepted_tool_ids": accepted})
            }
            "memory_write" => {
                let i: WriteInput = parse(&input)?;
                memory::remember(&i.text, &i.tags).map_err(refused)?;
                json!({"remembered": true, "text": i.text.trim()})
            }
            "memory_find" => {
                let i: QueryInput = parse(&input)?;
                let hits = memory::find(&i.query, i.limit.unwrap_or(10)).map_err(refused)?;
                let memories: Vec<Value> = hits
                    .iter()
                    .map(|m| json!({"id": m.id, "text": m.text, "tags": m.tags}))
                    .collect();
                json!({"memories": memories})
            }
            "session_spawn" => {
                let i: SpawnInput = parse(&input)?;
                let s = sessions::spawn(&i.purpose, &i.input, &i.resources, &i.grants)
                    .map_err(refused)?;
                json!({"session": s.session, "depth": s.depth, "grants": s.grants, "state": "started",
                       "note": "its result arrives as a notification; end your turn to wait for it"})
            }
            "session_send" => {
                let i: SendInput = parse(&input)?;
                sessions::send(&i.session, &i.input).map_err(refused)?;
                json!({"sent": true, "session": i.session})
            }
            "session_status" => {
                let i: StatusInput = parse(&input)?;
                let list = sessions::status(&i.sessions).map_err(refused)?;
                let list: Vec<Value> = list
                    .iter()
                    .map(|s| {
                        json!({"session": s.session, "purpose": s.purpose, "state": s.state,
                        "delegation": s.delegation, "terminal": s.terminal, "text": s.text,
                        "approvals": s.approvals})
                    })
                    .collect();
                json!({"sessions": list})
            }
            "session_interrupt" => {
                let i: SessionInput = parse(&input)?;
                sessions::interrupt(&i.session).map_err(refused)?;
                json!({"interrupted": true, "session": i.session})
            }
            "session_ask" => {
                let i: AskInput = parse(&input)?;
                sessions::ask(&i.question).map_err(refused)?;
                json!({"asked": true, "note": "end your turn; the answer arrives as your next input"})
            }
            other => return Err(ToolError::UnknownTool(other.to_string())),
        };
        Ok(out.to_string())
    }
}

bindings::export!(Control with_types_in bindings);
