//! Durable session events: every change of a session that a person can see, as a row with a
//! per-session sequence number, written in the same transaction as the fact it reports — so
//! an event is there exactly when its fact is, whichever process committed it, and writing
//! one costs no commit of its own.
//!
//! Events carry only what the timeline already shows (never the API key). They are read
//! "after sequence number N", and followed by polling the store
//! ([`SessionEngine::follow`](super::SessionEngine::follow)): one indexed read of the rows
//! after the last one seen, every poll interval.

use crate::sql::{Connection, params};
use serde::{Deserialize, Serialize};

use crate::model::Usage;
use crate::store::{StoreError, now_ms};

use super::state::RuntimeState;

crate::stored_enum! {
    /// How a capability arrived in a session.
    pub enum Via: "capability origin" {
        /// Named when the session was created (`keel run --tools`).
        Flag = "flag",
        /// Loaded with every session (no `--tools`: every installed tool; the control and
        /// discovery tools always).
        Default = "default",
        /// Selected by the Orchestrator when a turn set the goals.
        Orchestrator = "orchestrator",
        /// Loaded by the model with `skills_load`.
        SkillsLoad = "skills_load",
        /// Selected by the model with `tools_select`.
        ToolsSelect = "tools_select",
        /// Added by an admin to an existing session (`keel run --session ID --tools`).
        Admin = "admin",
    }
}

crate::stored_enum! {
    /// What kind of capability.
    pub enum CapabilityKind: "capability kind" {
        Tool = "tool",
        Skill = "skill",
    }
}

crate::stored_enum! {
    /// What started a compaction.
    pub enum Trigger: "compaction trigger" {
        /// The next request's estimated size passed the session's threshold of the context
        /// window.
        Threshold = "threshold",
        /// The model server refused a request as longer than its context window.
        Overflow = "overflow",
        /// A person asked for it (`keel session compact`).
        Manual = "manual",
    }
}

/// One event of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SessionEvent {
    /// An input was accepted into the session's inbox.
    InputAccepted { inbox_seq: i64, text: String },
    /// A turn began with the oldest waiting input.
    TurnStarted { turn: i64 },
    /// The understanding call of turn `turn` is about to be made (`resumed`: again, by a
    /// runner that took the turn over from one that stopped before its transition was
    /// committed).
    UnderstandingStarted {
        turn: i64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        resumed: bool,
    },
    /// Turn `turn`'s transition: what the understanding call answered (`None`: no call was
    /// made) and what the fixed table did to the goals.
    TaskTransition {
        turn: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        relation: Option<crate::understand::TaskRelation>,
        mode: crate::understand::TransitionMode,
        /// Why the answer is `uncertain`, when the call failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// A transition set the goals: the task environment the loop runs in.
    EnvironmentApplied {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_goal: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        phase_goal: Option<String>,
    },
    /// A transition set the goals: recall of skills, tools and memory is about to run.
    CapabilitiesDiscovering { turn: i64 },
    /// What recall found for turn `turn` (candidate counts); `call`: the Orchestrator is asked
    /// next (there were candidates to choose from).
    CapabilitiesRecalled {
        turn: i64,
        skills: usize,
        toolsets: usize,
        tools: usize,
        memories: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        call: bool,
    },
    /// The Orchestrator's call of turn `turn` came back (or failed: `error`); `dropped`:
    /// names in its answer that were not candidates.
    Orchestrated {
        turn: i64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        dropped: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Capabilities were added to the session.
    CapabilitiesAdded { via: Via, tools: Vec<String>, skills: Vec<String> },
    /// A capability was unloaded by an admin.
    CapabilityUnloaded { capability: CapabilityKind, name: String },
    /// The runtime state changed.
    State {
        state: RuntimeState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
    },
    /// Step `step`'s model request is about to be sent (committed with the fact that makes it
    /// the next thing the turn does; `resumed`: again, by a runner that took the turn over from
    /// one that stopped before the step was committed).
    ModelCallStarted {
        step: i64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        resumed: bool,
    },
    /// The model's reply to step `step` is in (committed with the step).
    ModelCallFinished {
        step: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        finish_reason: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<Usage>,
        ms: f64,
        attempts: u32,
        /// The reply holds neither text nor tool calls.
        #[serde(default)]
        empty: bool,
    },
    /// Step `step`'s request did not come back as a reply; kept as refused request
    /// `refused`.
    ModelCallFailed {
        step: i64,
        refused: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        http_status: Option<u16>,
        error: String,
        attempts: u32,
    },
    /// A tool call's journal row changed: `planned`, `intent` (about to run), `waiting` (for
    /// a decision), or final (`done`, with `error_kind` when it failed, or `unknown`).
    ToolCall {
        step: i64,
        call_id: crate::ids::CallId,
        tool: String,
        status: super::JournalStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_kind: Option<crate::failure::FailureKind>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ms: Option<f64>,
        /// What the call touches, in a few words (`call_subject`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subject: Option<String>,
        /// Why it failed: the first line of its error message (`failure_reason`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A call waits for a person's decision.
    ApprovalAsked {
        unit: crate::ids::UnitId,
        tool: String,
        call_id: crate::ids::CallId,
        /// What the call would touch (`call_subject`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subject: Option<String>,
    },
    /// A person decided on an approval unit.
    ApprovalDecided {
        unit: crate::ids::UnitId,
        decision: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// Who decided.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        by: Option<String>,
    },
    /// The model's final answer of turn `turn`.
    Answer { turn: i64, text: String },
    /// A notice keel added to the history (a loop guard ended the turn).
    Notice { text: String },
    /// The plan of the current phase changed (version `version`, by a `create`, `update` or
    /// `complete`): it has `steps` steps, `done` of them done.
    PlanChanged { version: i64, change: String, steps: usize, done: usize },
    /// The phase opened at turn `phase_turn` was declared complete.
    PhaseCompleted { phase_turn: i64, summary: String },
    /// A compaction began: messages `from..=to` are to be summarized (`tokens`: the estimated
    /// size of the next request that led to it).
    CompactionStarted {
        trigger: Trigger,
        from: i64,
        to: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens: Option<i64>,
    },
    /// Checkpoint `checkpoint` was committed, pending promotion.
    CheckpointPrepared { checkpoint: i64 },
    /// Checkpoint `checkpoint` was promoted: later requests hold its summary and the history
    /// after message `context_start`.
    Compacted {
        checkpoint: i64,
        from: i64,
        to: i64,
        context_start: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens_before: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens_after: Option<i64>,
        ms: f64,
        /// Set when the summary is keel's mechanical one: why the summary call failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mechanical: Option<String>,
    },
    /// A compaction failed (the summary call failed or its answer was refused); nothing of the
    /// context changed.
    CompactionFailed { error: String },
    /// A compaction whose process stopped before its checkpoint was committed (during the
    /// summary call) was closed by recovery: nothing of the context changed.
    CompactionAbandoned { reason: String },
    /// A pending checkpoint was discarded: its preconditions no longer held.
    CheckpointDiscarded { checkpoint: i64, reason: String },
    /// An event between two sessions of a workgroup (`event_kind`: request, result, question,
    /// failure, approval_needed, interrupted, budget_exhausted, wait_timeout), written in the
    /// sender's log and the receiver's, with the receiver's inbox row.
    Workgroup { event: String, event_kind: String, from: String, to: String },
    /// A person moved the session to another model server, model or context window (`by`:
    /// who; an API token, or the local user).
    ModelChanged { from: ModelShown, to: ModelShown, by: String },
    /// A person changed the session's policy (`change`: `allow fs_write_file under /out`,
    /// `ask before fs_write_file` …; `by`: who), leaving it as `policy` says (one line).
    PolicyChanged { change: String, policy: String, by: String },
    /// A person began putting back what the session's calls after step `to` changed on disk
    /// (`files`: how many paths; `by`: who). A rewind cut short (a crash) has no `rewound`
    /// after it: running it again finishes it.
    RewindStarted { to: i64, files: usize, by: String },
    /// The rewind to step `to` ended: the paths put back as they were before the calls after
    /// it, those left as they are (each with why: changed since, not restorable, refused by
    /// its grant), and the calls whose effects a rewind cannot undo (outside the grants).
    Rewound {
        to: i64,
        /// The session's last step when it ran: the calls up to it came before it.
        #[serde(default)]
        after_step: i64,
        restored: Vec<String>,
        left: Vec<String>,
        not_undone: Vec<String>,
        by: String,
    },
    /// The session was made as a fork of session `from` at step `at`: its history is
    /// `from`'s up to message `messages` (`by`: who forked it).
    Forked { from: String, at: i64, messages: i64, by: String },
    /// The conversation went back to step `to`: messages `rewound_from..=rewound_to` left the
    /// model's context (they stay in the store), the messages the context held at the step
    /// were appended again as `resent_from..=resent_to` (none when `resent_to` is below
    /// `resent_from`), and the context now starts after message `context_start`.
    ConversationRewound {
        to: i64,
        rewound_from: i64,
        rewound_to: i64,
        resent_from: i64,
        resent_to: i64,
        context_start: i64,
        by: String,
    },
    /// A client reached the session from outside (an MCP client over `transport`), as it
    /// named itself, speaking `protocol`.
    ClientConnected { client: String, version: String, protocol: String, transport: String },
}

/// A session's model as a person names it: the server, the model, the context window.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct ModelShown {
    pub base_url: String,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_window: Option<u64>,
}

impl ModelShown {
    pub fn of(m: &crate::model::ModelConfig) -> Self {
        Self {
            base_url: m.base_url.clone(),
            model: m.model.clone(),
            context_window: m.context_window,
        }
    }
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRow {
    pub seq: i64,
    /// When it was committed (ms since the Unix epoch).
    pub at_ms: i64,
    #[serde(flatten)]
    pub event: SessionEvent,
}

impl SessionEvent {
    /// The stored name of the event's kind (`input_accepted`, `tool_call` …).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InputAccepted { .. } => "input_accepted",
            Self::TurnStarted { .. } => "turn_started",
            Self::UnderstandingStarted { .. } => "understanding_started",
            Self::TaskTransition { .. } => "task_transition",
            Self::EnvironmentApplied { .. } => "environment_applied",
            Self::CapabilitiesDiscovering { .. } => "capabilities_discovering",
            Self::CapabilitiesRecalled { .. } => "capabilities_recalled",
            Self::Orchestrated { .. } => "orchestrated",
            Self::CapabilitiesAdded { .. } => "capabilities_added",
            Self::CapabilityUnloaded { .. } => "capability_unloaded",
            Self::State { .. } => "state",
            Self::ModelCallStarted { .. } => "model_call_started",
            Self::ModelCallFinished { .. } => "model_call_finished",
            Self::ModelCallFailed { .. } => "model_call_failed",
            Self::ToolCall { .. } => "tool_call",
            Self::ApprovalAsked { .. } => "approval_asked",
            Self::ApprovalDecided { .. } => "approval_decided",
            Self::Answer { .. } => "answer",
            Self::Notice { .. } => "notice",
            Self::PlanChanged { .. } => "plan_changed",
            Self::PhaseCompleted { .. } => "phase_completed",
            Self::CompactionStarted { .. } => "compaction_started",
            Self::CheckpointPrepared { .. } => "checkpoint_prepared",
            Self::Compacted { .. } => "compacted",
            Self::CompactionFailed { .. } => "compaction_failed",
            Self::CompactionAbandoned { .. } => "compaction_abandoned",
            Self::CheckpointDiscarded { .. } => "checkpoint_discarded",
            Self::Workgroup { .. } => "workgroup",
            Self::ClientConnected { .. } => "client_connected",
            Self::ModelChanged { .. } => "model_changed",
            Self::PolicyChanged { .. } => "policy_changed",
            Self::RewindStarted { .. } => "rewind_started",
            Self::Rewound { .. } => "rewound",
            Self::Forked { .. } => "forked",
            Self::ConversationRewound { .. } => "conversation_rewound",
        }
    }
}

/// The keys of a tool's input that name what a call touches, most telling first.
const SUBJECT_KEYS: &[&str] =
    &["path", "file", "url", "uri", "command", "query", "pattern", "dir", "directory", "name"];

/// Longest subject shown, in characters.
const SUBJECT_CHARS: usize = 80;

/// What a call with this input touches, in a few words for a progress line: the first of
/// `path`, `file`, `url`, `uri`, `command`, `query`, `pattern`, `dir`, `directory`, `name` the
/// input has as a string (else its first string value), cut at 80 characters, followed by the size of the `content` it writes — `/out/report.md (133
/// bytes)`. `None` for an input that is not a JSON object or holds no string.
pub fn call_subject(input: &str) -> Option<String> {
    let serde_json::Value::Object(map) = serde_json::from_str(input).ok()? else {
        return None;
    };
    let text = |k: &str| map.get(k).and_then(|v| v.as_str()).filter(|s| !s.trim().is_empty());
    let named = SUBJECT_KEYS
        .iter()
        .find_map(|k| text(k))
        .or_else(|| map.iter().filter(|(k, _)| *k != "content").find_map(|(k, _)| text(k)));
    let size = map.get("content").and_then(|v| v.as_str()).map(|c| match c.len() {
        1 => "1 byte".to_string(),
        n => format!("{n} bytes"),
    });
    let subject = match (named, size) {
        (Some(n), Some(s)) => format!("{} ({s})", one_line(n, SUBJECT_CHARS)),
        (Some(n), None) => one_line(n, SUBJECT_CHARS),
        (None, Some(s)) => format!("({s})"),
        (None, None) => return None,
    };
    Some(subject)
}

/// Longest failure reason kept, in characters.
const REASON_CHARS: usize = 160;

/// The first line of a failed call's error message (`{"error": {"message": …}}`), cut at 160
/// characters; `None` for a result that is not such an object.
pub fn failure_reason(result: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(result).ok()?;
    let message = v.get("error")?.get("message")?.as_str()?;
    Some(one_line(message, REASON_CHARS)).filter(|m| !m.is_empty())
}

/// The first line of `text`, trimmed, cut at `max` characters with `…`.
fn one_line(text: &str, max: usize) -> String {
    let line = text.trim().lines().next().unwrap_or_default();
    match line.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_string(),
    }
}

/// Appends `event` to session `id`'s events, in the caller's transaction.
///
/// The event records the fencing token of the session's lease at the time (`fence`: never
/// smaller than an earlier event's), and on PostgreSQL wakes the followers of the session
/// (`NOTIFY keel_events`, delivered when the transaction commits; only a hint — they read the
/// table by sequence number).
pub fn append(c: &Connection, id: &str, event: &SessionEvent) -> Result<(), StoreError> {
    super::row::lock_in(c, id)?;
    let body = serde_json::to_string(event)
        .map_err(|e| StoreError::Corrupt(format!("an event cannot be encoded: {e}")))?;
    // Numbered after the last one, in the same statement (the session's row lock orders
    // writers on PostgreSQL); sent without waiting for the server there.
    c.prepare_cached(
        "INSERT INTO session_events (session_id, seq, at_ms, kind, body, fence)
         SELECT ?1, COALESCE(MAX(seq), 0) + 1, ?2, ?3, ?4,
                (SELECT fence FROM runner_leases WHERE session_id=?1)
         FROM session_events WHERE session_id=?1",
    )?
    .execute_pipelined(params![id, now_ms(), event.kind(), body])?;
    // One wake-up per session and transaction: followers read every event after their last.
    if c.backend() == crate::sql::Backend::Postgres
        && c.first_in_transaction(&format!("notify {id}"))
    {
        c.prepare_cached("SELECT pg_notify('keel_events', ?1)")?.execute_pipelined([id])?;
    }
    Ok(())
}

/// Events of session `id` after sequence number `after`, oldest first, at most `limit`.
pub fn after(
    c: &Connection,
    id: &str,
    after: i64,
    limit: usize,
) -> Result<Vec<EventRow>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT seq, at_ms, body FROM session_events WHERE session_id=?1 AND seq>?2
         ORDER BY seq LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![id, after, limit as i64], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
    })?;
    rows.map(|row| decoded(id, row?)).collect()
}

/// A stored event of session `id` from its row (`seq`, `at_ms`, `body`).
fn decoded(id: &str, (seq, at_ms, body): (i64, i64, String)) -> Result<EventRow, StoreError> {
    let event = serde_json::from_str(&body).map_err(|e| {
        StoreError::Corrupt(format!("event {seq} of session `{id}` is not readable: {e}"))
    })?;
    Ok(EventRow { seq, at_ms, event })
}

/// A change a person made to a session's settings after it was created (`keel session set`,
/// `keel session policy`, the approval answer "always", the API).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SettingsChange {
    pub seq: i64,
    pub at_ms: i64,
    /// `policy` or `model`.
    pub setting: String,
    /// What changed, in words and without a host detail: `allow fs_write_file under /out`,
    /// `qwen3 → qwen3-coder (window 32768)`.
    pub change: String,
    /// Who made it: an API token, or the local user.
    pub by: String,
    /// A model change's model before and after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<ModelShown>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<ModelShown>,
}

impl ModelShown {
    /// The model and its window, as a change names it.
    fn named(&self) -> String {
        match self.context_window {
            Some(w) => format!("{} (window {w})", self.model),
            None => self.model.clone(),
        }
    }
}

/// The changes people made to session `id`'s policy and model, oldest first.
pub fn settings_changes(c: &Connection, id: &str) -> Result<Vec<SettingsChange>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT seq, at_ms, body FROM session_events
         WHERE session_id=?1 AND kind IN ('policy_changed', 'model_changed') ORDER BY seq",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let EventRow { seq, at_ms, event } = decoded(id, row?)?;
        let change = match event {
            SessionEvent::PolicyChanged { change, by, .. } => SettingsChange {
                seq,
                at_ms,
                setting: "policy".into(),
                change,
                by,
                from: None,
                to: None,
            },
            SessionEvent::ModelChanged { from, to, by } => {
                let server = if from.base_url == to.base_url { "" } else { ", on another server" };
                SettingsChange {
                    seq,
                    at_ms,
                    setting: "model".into(),
                    change: format!("{} → {}{server}", from.named(), to.named()),
                    by,
                    from: Some(from),
                    to: Some(to),
                }
            }
            _ => continue,
        };
        out.push(change);
    }
    Ok(out)
}

/// The last event's sequence number of session `id` (0 when it has none).
pub fn last_seq(c: &Connection, id: &str) -> Result<i64, StoreError> {
    Ok(c.prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM session_events WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_names_what_a_call_touches() {
        let write = r##"{"content":"# audit\n","path":"/out/report.md"}"##;
        assert_eq!(call_subject(write).as_deref(), Some("/out/report.md (8 bytes)"));
        assert_eq!(
            call_subject(r#"{"path":"/data/orders.csv"}"#).as_deref(),
            Some("/data/orders.csv")
        );
        assert_eq!(
            call_subject(r#"{"limit":3,"url":"https://x.test/a"}"#).as_deref(),
            Some("https://x.test/a")
        );
        // No telling key: the first string, never the content.
        assert_eq!(call_subject(r#"{"n":1,"label":"q3"}"#).as_deref(), Some("q3"));
        assert_eq!(call_subject(r#"{"content":"x"}"#).as_deref(), Some("(1 byte)"));
        assert_eq!(call_subject(r#"{"n":1}"#), None);
        assert_eq!(call_subject("not json"), None);
        assert_eq!(call_subject("[1]"), None);
        let long = format!(r#"{{"path":"/{}\nsecond line"}}"#, "é".repeat(100));
        let s = call_subject(&long).unwrap();
        assert_eq!(s.chars().count(), SUBJECT_CHARS + 1, "{s}");
        assert!(s.ends_with('…') && !s.contains("second"));
    }

    #[test]
    fn a_reason_is_the_first_line_of_the_error() {
        let r = r#"{"error":{"kind":"denied","message":"/etc/x: outside every directory granted to this session\nmore"}}"#;
        assert_eq!(
            failure_reason(r).as_deref(),
            Some("/etc/x: outside every directory granted to this session")
        );
        assert_eq!(failure_reason(r#"{"rows":1}"#), None);
        assert_eq!(failure_reason(r#"{"error":{"message":""}}"#), None);
        assert_eq!(failure_reason("{\"error\": {\"message\": \"cut"), None);
    }
}
