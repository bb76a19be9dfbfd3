//! Task understanding: one stateless semantic call per user input, and the fixed table that
//! turns its answer into a task transition.
//!
//! The call sees only the message text, stable references of attached resources, the current
//! phase goal and the session goal — no history, no candidates, no plan. Its answer has exactly
//! four fields: a [`TaskRelation`] and three groups of recall terms. Anything else (bad JSON,
//! an extra or missing field, an unknown relation, a failed call) is
//! [`Understanding::uncertain`]: the turn goes on with its goals unchanged. Brain applies
//! [`transition`] — no scores, no goal rewritten by a model.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::model::ModelConfig;

crate::stored_enum! {
    /// How an input relates to the session's current task.
    pub enum TaskRelation: "task relation" {
        /// The message sets up a task.
        EstablishTask = "establish_task",
        /// The message continues the current phase.
        ContinueCurrent = "continue_current",
        /// The message stays within the session's responsibility but changes the current work.
        ChangeWithinSession = "change_within_session",
        /// The message is outside what the session is for.
        OutsideSessionScope = "outside_session_scope",
        /// The relation could not be told (or the call failed).
        Uncertain = "uncertain",
    }
}

crate::stored_enum! {
    /// What a transition does to the goals.
    pub enum TransitionMode: "transition mode" {
        /// No phase goal yet: the message becomes the phase goal (and the session goal if
        /// there is none).
        Initialize = "initialize",
        /// A change within the session: the message becomes the new phase goal.
        Reconcile = "reconcile",
        /// The goals stay as they are; capabilities are not reselected.
        Keep = "keep",
    }
}

/// Most terms in one recall group.
pub const MAX_TERMS: usize = 16;
/// Longest recall term, in characters.
pub const MAX_TERM_CHARS: usize = 80;
/// Default cap on the call's reply.
pub const DEFAULT_MAX_TOKENS: u32 = 512;
/// Default longest wait without progress for the call (it is not streamed).
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// How the call asks for JSON: with a JSON Schema (`response_format` `json_schema`), as any
/// JSON object (`json_object`), or by its instructions alone (`none`), for servers that
/// refuse the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResponseFormat {
    #[default]
    JsonSchema,
    JsonObject,
    None,
}

impl std::str::FromStr for ResponseFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "json_schema" => Ok(Self::JsonSchema),
            "json_object" => Ok(Self::JsonObject),
            "none" => Ok(Self::None),
            _ => {
                Err(format!("`{s}` is not a response format: use json_schema, json_object or none"))
            }
        }
    }
}

/// A session's settings for the call, stored with it. The model settings default to the
/// session's (`[model.preprocess]` in `keel.toml`, `--preprocess-model`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreprocessConfig {
    /// The server and model the call goes to.
    pub model: ModelConfig,
    pub response_format: ResponseFormat,
}

impl PreprocessConfig {
    /// The call's settings on the business model: not streamed, a small reply, a short wait,
    /// one retry.
    pub fn from_business(business: &ModelConfig) -> Self {
        let mut model = business.clone();
        model.stream = false;
        model.stream_usage = false;
        model.temperature = Some(0.0);
        model.max_tokens = Some(DEFAULT_MAX_TOKENS);
        model.timeout_ms = model.timeout_ms.min(DEFAULT_TIMEOUT_MS);
        model.max_retries = model.max_retries.min(1);
        Self { model, response_format: ResponseFormat::default() }
    }
}

/// A stable reference to an attached resource (never its content).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceRef {
    pub ref_id: String,
    pub protocol: String,
    pub filename: String,
    pub media_type: String,
}

/// The call's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Understanding {
    pub task_relation: TaskRelation,
    pub skill_recall_terms: Vec<String>,
    pub tool_recall_terms: Vec<String>,
    pub memory_recall_terms: Vec<String>,
}

impl Understanding {
    /// What a failed or unreadable call becomes: `uncertain`, no terms.
    pub fn uncertain() -> Self {
        Self {
            task_relation: TaskRelation::Uncertain,
            skill_recall_terms: Vec::new(),
            tool_recall_terms: Vec::new(),
            memory_recall_terms: Vec::new(),
        }
    }
}

const FIELDS: [&str; 4] =
    ["task_relation", "skill_recall_terms", "tool_recall_terms", "memory_recall_terms"];

/// Reads the call's reply liberally ([`Reader`](crate::model::answer::Reader)): one JSON object
/// (alone, in a code fence or in prose); `task_relation` one of the five (case, spaces and
/// hyphens aside; missing: `uncertain`); each terms field a list (one string is one term, a
/// missing field none) of which the first [`MAX_TERMS`] distinct terms (compared without
/// case) are kept, each cut at [`MAX_TERM_CHARS`] characters, terms that are not text dropped.
/// Only what cannot be read is refused.
pub fn parse(content: &str) -> Result<(Understanding, crate::model::answer::Reader), String> {
    let mut r = crate::model::answer::Reader::new(content, &FIELDS)?;
    let relation = match r.text("task_relation", MAX_TERM_CHARS)? {
        None => {
            r.notes.push("`task_relation` was missing: read as `uncertain`".into());
            TaskRelation::Uncertain
        }
        Some(text) => {
            let name = text.to_ascii_lowercase().replace([' ', '-'], "_");
            name.parse::<TaskRelation>().map_err(|_| {
                format!(
                    "`task_relation` `{text}` is none of establish_task, continue_current, \
                     change_within_session, outside_session_scope, uncertain"
                )
            })?
        }
    };
    let mut terms = |field: &str| -> Result<Vec<String>, String> {
        let items = r.list(field, usize::MAX, MAX_TERM_CHARS)?;
        let mut out: Vec<String> = Vec::new();
        for term in items {
            if term.chars().any(char::is_control) {
                r.notes.push(format!("`{field}` held a term that is not text: dropped"));
            } else if !out.iter().any(|t| t.eq_ignore_ascii_case(&term)) {
                out.push(term);
            }
        }
        if out.len() > MAX_TERMS {
            r.notes.push(format!(
                "`{field}` held {} terms: the first {MAX_TERMS} were kept",
                out.len()
            ));
            out.truncate(MAX_TERMS);
        }
        Ok(out)
    };
    let understanding = Understanding {
        task_relation: relation,
        skill_recall_terms: terms("skill_recall_terms")?,
        tool_recall_terms: terms("tool_recall_terms")?,
        memory_recall_terms: terms("memory_recall_terms")?,
    };
    Ok((understanding, r))
}

/// The fixed transition table: with no phase goal, whatever the relation, the message sets
/// the task up; a change within the session reconciles; everything else keeps the goals.
pub fn transition(relation: TaskRelation, phase_goal: Option<&str>) -> TransitionMode {
    match (phase_goal, relation) {
        (None, _) => TransitionMode::Initialize,
        (Some(_), TaskRelation::ChangeWithinSession) => TransitionMode::Reconcile,
        (Some(_), _) => TransitionMode::Keep,
    }
}

/// What the call is given: these four things and nothing else.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub message: &'a str,
    pub resources: &'a [ResourceRef],
    pub current_task_goal: Option<&'a str>,
    pub session_goal: Option<&'a str>,
}

/// Characters of each goal the call is sent, at most: enough to classify a message against,
/// not the whole of a long task (it is in the session's history).
pub const GOAL_CHARS: usize = 2000;

/// `current_task_goal` when the work under way is the session goal itself.
pub const SAME_AS_SESSION_GOAL: &str = "(the session goal)";

fn bounded(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max).collect();
    cut.push('…');
    cut
}

/// The system message of the call (the whole of it: the call carries no other instructions).
pub const INSTRUCTIONS: &str = "You classify one message sent to an agent session against the \
session's task. You get a JSON object: `message` (the new message), `resources` (references of \
attached files), `current_task_goal` (the work under way, `(the session goal)` when it is the \
session goal, or null) and `session_goal` (what the session is responsible for, or null; a \
long goal is cut, ending in `…`). Answer with one JSON object with exactly these four \
fields and nothing else:\n\
- `task_relation`: `establish_task` (the message sets up a task), `continue_current` (it \
continues the current work), `change_within_session` (it changes the work but stays within the \
session's responsibility), `outside_session_scope` (it is outside the session's \
responsibility) or `uncertain`;\n\
- `skill_recall_terms`: methods, actions, evidence, quality or artifacts the work needs;\n\
- `tool_recall_terms`: actions and domains a tool would serve;\n\
- `memory_recall_terms`: entities, topics, preferences, constraints or decisions to recall.\n\
Each terms field is an array (possibly empty) of at most 16 short, distinct English phrases.";

/// The JSON Schema of the answer.
pub fn answer_schema() -> Value {
    let terms = json!({"type": "array", "maxItems": MAX_TERMS, "items": {"type": "string"}});
    json!({
        "type": "object",
        "properties": {
            "task_relation": {"type": "string", "enum": TaskRelation::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>()},
            "skill_recall_terms": terms,
            "tool_recall_terms": terms,
            "memory_recall_terms": terms,
        },
        "required": FIELDS,
        "additionalProperties": false,
    })
}

/// The exact request body of the call.
pub fn request_body(config: &PreprocessConfig, inputs: Inputs<'_>) -> Vec<u8> {
    // The session goal once: a phase goal that is the session goal is named, not repeated.
    let current = match (inputs.current_task_goal, inputs.session_goal) {
        (Some(c), Some(s)) if c == s => Some(SAME_AS_SESSION_GOAL.to_string()),
        (c, _) => c.map(|c| bounded(c, GOAL_CHARS)),
    };
    let user = json!({
        "message": inputs.message,
        "resources": inputs.resources,
        "current_task_goal": current,
        "session_goal": inputs.session_goal.map(|s| bounded(s, GOAL_CHARS)),
    });
    supporting_request(config, INSTRUCTIONS, &user, "task_understanding", answer_schema())
}

/// The body of a supporting call (task understanding, the Orchestrator): stateless, not
/// streamed, `instructions` as the system message and `user` as the one user message (JSON
/// text), the answer asked for as JSON by the configured `response_format`.
pub fn supporting_request(
    config: &PreprocessConfig,
    instructions: &str,
    user: &serde_json::Value,
    schema_name: &str,
    schema: serde_json::Value,
) -> Vec<u8> {
    let mut body = json!({
        "model": config.model.model,
        "stream": false,
        "messages": [
            {"role": "system", "content": instructions},
            {"role": "user", "content": user.to_string()},
        ],
    });
    if let Some(t) = config.model.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(m) = config.model.max_tokens {
        body["max_tokens"] = json!(m);
    }
    match config.response_format {
        ResponseFormat::JsonSchema => {
            body["response_format"] = json!({"type": "json_schema", "json_schema": {
                "name": schema_name, "strict": true, "schema": schema}});
        }
        ResponseFormat::JsonObject => body["response_format"] = json!({"type": "json_object"}),
        ResponseFormat::None => {}
    }
    body.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_liberally_and_refused_only_when_unreadable() {
        let ok = r#"{"task_relation":"continue_current","skill_recall_terms":["csv audit","CSV audit"],
            "tool_recall_terms":[],"memory_recall_terms":["orders"]}"#;
        let (u, r) = parse(ok).unwrap();
        assert_eq!(u.task_relation, TaskRelation::ContinueCurrent);
        assert_eq!(u.skill_recall_terms, ["csv audit"], "duplicates dropped");
        assert!(r.notes.is_empty(), "{:?}", r.notes);
        let loose = "Here you go:\n```json\n{\"task_relation\":\"Change within session\",\
            \"tool_recall_terms\":\"convert to docx\",\"goal\":\"x\"}\n```";
        let (u, r) = parse(loose).unwrap();
        assert_eq!(u.task_relation, TaskRelation::ChangeWithinSession);
        assert_eq!(u.tool_recall_terms, ["convert to docx"]);
        assert!(u.skill_recall_terms.is_empty() && u.memory_recall_terms.is_empty());
        assert!(r.notes.iter().any(|n| n.contains("goal")), "{:?}", r.notes);
        let (u, _) = parse(r#"{"skill_recall_terms":["a\u0007b", "ok"]}"#).unwrap();
        assert_eq!(u.task_relation, TaskRelation::Uncertain);
        assert_eq!(u.skill_recall_terms, ["ok"]);
        let many = format!(
            r#"{{"task_relation":"uncertain","skill_recall_terms":{}}}"#,
            serde_json::to_string(&(0..17).map(|i| format!("t{i}")).collect::<Vec<_>>()).unwrap()
        );
        assert_eq!(parse(&many).unwrap().0.skill_recall_terms.len(), MAX_TERMS);
        for (bad, why) in [
            ("not json", "no JSON object"),
            ("[]", "not an object"),
            (r#"{"task_relation":"carry_on"}"#, "`carry_on` is none of"),
            (r#"{"task_relation":"uncertain","skill_recall_terms":{"a":1}}"#, "is an object"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_transition_table_is_fixed() {
        use TaskRelation::*;
        for r in TaskRelation::ALL {
            assert_eq!(transition(*r, None), TransitionMode::Initialize);
        }
        assert_eq!(transition(ChangeWithinSession, Some("g")), TransitionMode::Reconcile);
        for r in [EstablishTask, ContinueCurrent, OutsideSessionScope, Uncertain] {
            assert_eq!(transition(r, Some("g")), TransitionMode::Keep, "{r}");
        }
    }

    #[test]
    fn the_request_holds_only_the_four_inputs() {
        let config = PreprocessConfig::from_business(&ModelConfig::new("http://x/v1", "m"));
        let body = request_body(
            &config,
            Inputs {
                message: "convert it to Word",
                resources: &[],
                current_task_goal: Some("write a guide"),
                session_goal: None,
            },
        );
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["stream"], false);
        assert_eq!(v["messages"].as_array().unwrap().len(), 2);
        let user: Value =
            serde_json::from_str(v["messages"][1]["content"].as_str().unwrap()).unwrap();
        let mut keys: Vec<&str> = user.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["current_task_goal", "message", "resources", "session_goal"]);
        assert_eq!(v["response_format"]["type"], "json_schema");
    }

    #[test]
    fn the_session_goal_is_sent_once_and_bounded() {
        let config = PreprocessConfig::from_business(&ModelConfig::new("http://x/v1", "m"));
        let task = "summarise this report: ".to_string() + &"word ".repeat(4000);
        let body = request_body(
            &config,
            Inputs {
                message: "just say hi",
                resources: &[],
                current_task_goal: Some(&task),
                session_goal: Some(&task),
            },
        );
        let text = String::from_utf8(body).unwrap();
        assert_eq!(text.matches("summarise this report").count(), 1, "the goal once");
        assert!(text.len() < GOAL_CHARS + 4000, "{} bytes", text.len());
        let v: Value = serde_json::from_str(&text).unwrap();
        let user: Value =
            serde_json::from_str(v["messages"][1]["content"].as_str().unwrap()).unwrap();
        assert_eq!(user["current_task_goal"], SAME_AS_SESSION_GOAL);
        assert!(user["session_goal"].as_str().unwrap().ends_with('…'));
    }
}
