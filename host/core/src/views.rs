//! Read views of a session for people: `keel session list` and `keel session show` — built
//! from the facts (meta, history, journal) and the approvals, owning none of them.

use crate::sql::Connection;
use serde::Serialize;

use crate::sandbox::Grant;
use crate::store::StoreError;

use crate::ids::SessionId;
use crate::meta::load_in as load_meta;
use crate::session::JournalEntry;
use crate::session::{RuntimeState, SessionEngine, journal_row, pending_inputs};

/// One line of `keel session list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionSummary {
    pub id: String,
    pub state: String,
    pub turns: i64,
    pub steps: i64,
    pub session_goal: Option<String>,
    pub created_at: i64,
    /// When its last event was committed (its creation time without events).
    pub last_activity: i64,
    /// The API token that created it (`None`: a local front-end did).
    pub owner: Option<String>,
    /// The user it works for, typed (`local:alice`, `token:bob`); `None`: the operating-system
    /// user of the process that reads it.
    pub user: Option<String>,
    /// The title a person gave it (`keel session title`); `None`: lists show its goal.
    pub title: Option<String>,
}

impl SessionSummary {
    /// Whether the session works for `user` — a typed principal, or a name, which is a local
    /// user's (`alice` is `local:alice`). A session stored without a user works for the
    /// operating-system user.
    pub fn works_for(&self, user: &str) -> bool {
        use crate::memory::{Kind, default_user, typed};
        let user = typed(user, Kind::Local);
        match &self.user {
            Some(u) => *u == user,
            None => typed(&default_user(), Kind::Local) == user,
        }
    }
}

pub fn list(c: &Connection) -> Result<Vec<SessionSummary>, StoreError> {
    let mut stmt = c.prepare(
        "SELECT s.id, s.state, s.turns, s.steps, c.session_goal, s.created_at,
                COALESCE((SELECT MAX(e.at_ms) FROM session_events e WHERE e.session_id = s.id),
                         s.created_at),
                c.owner, c.\"user\", c.title
         FROM sessions s LEFT JOIN session_config c ON c.session_id = s.id
         ORDER BY s.created_at DESC, s.id",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            SessionSummary {
                id: r.get(0)?,
                state: r.get(1)?,
                turns: r.get(2)?,
                steps: r.get(3)?,
                session_goal: r.get(4)?,
                created_at: r.get(5)?,
                last_activity: r.get(6)?,
                owner: None,
                user: r.get(8)?,
                title: r.get(9)?,
            },
            r.get::<_, Option<String>>(7)?,
        ))
    })?;
    rows.map(|row| {
        let (mut s, owner) = row?;
        s.owner = owner
            .map(|o| {
                serde_json::from_str::<crate::caller::Owner>(&o).map_err(|e| {
                    StoreError::Corrupt(format!("session {}: its owner does not read: {e}", s.id))
                })
            })
            .transpose()?
            .map(|o| o.principal);
        Ok(s)
    })
    .collect()
}

/// One message of a timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineMessage {
    pub seq: i64,
    pub turn: i64,
    pub role: String,
    /// The message's text (its text parts joined; empty when it has none).
    pub text: String,
    /// The tool calls an assistant message asked for, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<MessageCall>,
    /// The call a tool message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answers: Option<crate::ids::CallId>,
    /// The message exactly as the model sees it.
    pub body: serde_json::Value,
}

/// A tool call an assistant message asked for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageCall {
    pub id: crate::ids::CallId,
    pub tool: String,
    /// Its arguments as the model wrote them (JSON text, normally an object).
    pub input: String,
}

impl TimelineMessage {
    /// A stored message read into its parts: its text, the calls it asks for, the call it
    /// answers. A body that is not JSON is kept as text.
    pub fn read(seq: i64, turn: i64, role: String, body: String) -> Self {
        let body: serde_json::Value =
            serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
        let text = match &body["content"] {
            serde_json::Value::String(t) => t.clone(),
            serde_json::Value::Array(parts) => {
                parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n")
            }
            _ => body.as_str().unwrap_or_default().to_string(),
        };
        let calls = body["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|c| MessageCall {
                        id: crate::ids::CallId::new(c["id"].as_str().unwrap_or_default()),
                        tool: c["function"]["name"].as_str().unwrap_or_default().to_string(),
                        input: c["function"]["arguments"].as_str().unwrap_or_default().to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let answers = body["tool_call_id"].as_str().map(crate::ids::CallId::new);
        TimelineMessage { seq, turn, role, text, calls, answers, body }
    }
}

/// What the model calls of one turn came to: their number, the tokens the server reported
/// (summed), and the last reply's finish reason.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TurnUsage {
    pub model_calls: usize,
    /// Calls whose usage the server reported (the sums cover only these).
    pub reported: usize,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    #[serde(skip)]
    pub finish_reason: Option<String>,
}

impl TurnUsage {
    /// Sums the calls of `turn`.
    pub fn of(calls: &[crate::assembly::ModelCallRecord], turn: i64) -> Self {
        let mut t = Self::default();
        for c in calls.iter().filter(|c| c.turn == Some(turn)) {
            t.model_calls += 1;
            t.finish_reason.clone_from(&c.call.finish_reason);
            if let Some(u) = c.call.usage {
                t.reported += 1;
                t.prompt_tokens += u.prompt_tokens;
                t.completion_tokens += u.completion_tokens;
                if let Some(cached) = u.cached_tokens {
                    *t.cached_tokens.get_or_insert(0) += cached;
                }
            }
        }
        t
    }

    /// `1234 + 56 tokens (3 model calls)`, or what is known of it.
    pub fn describe(&self) -> String {
        let calls = match self.model_calls {
            1 => "1 model call".to_string(),
            n => format!("{n} model calls"),
        };
        if self.reported == 0 {
            return format!("{calls}, tokens not reported by the server");
        }
        let cached =
            self.cached_tokens.map(|c| format!(", {c} of them cached")).unwrap_or_default();
        let partial = if self.reported < self.model_calls {
            format!("; {} of the calls reported none", self.model_calls - self.reported)
        } else {
            String::new()
        };
        format!(
            "{} prompt{cached} + {} completion tokens, {calls}{partial}",
            self.prompt_tokens, self.completion_tokens
        )
    }
}

/// One tool call of a timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineCall {
    pub step: i64,
    #[serde(flatten)]
    pub entry: JournalEntry,
}

/// `keel session show`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    pub id: String,
    /// The title a person gave it (`keel session title`), if any.
    pub title: Option<String>,
    /// The step of a rewind that was cut short (a crash), if any: running it again finishes
    /// it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unfinished_rewind: Option<i64>,
    /// The session it was forked from, and at which step, if it is a fork.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<crate::session::Origin>,
    /// Each time its conversation went back to a step, oldest first: the messages that left
    /// the context, and those sent again.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conversation_rewinds: Vec<crate::session::RewoundConversation>,
    pub state: RuntimeState,
    pub state_detail: Option<String>,
    pub session_goal: Option<String>,
    /// The current phase goal (`None`: no phase is open).
    pub phase_goal: Option<String>,
    /// Every task transition, oldest first: what each turn's understanding call answered and
    /// what it did to the goals.
    pub transitions: Vec<crate::preparation::transition::Transition>,
    /// The plan of the current phase (`None`: no phase, or no plan yet).
    pub plan: Option<Vec<crate::plan::PlanStep>>,
    /// Every version of every plan of the session, oldest first.
    pub plan_history: Vec<crate::preparation::plan::PlanVersion>,
    pub loaded_tools: Vec<String>,
    pub tool_pins: std::collections::BTreeMap<String, String>,
    /// The user the session works for (whose long-term memory it recalls and writes).
    pub user: String,
    /// Every loaded tool and skill and how it arrived (flag, default, orchestrator,
    /// skills_load, tools_select, admin), in the order they arrived.
    pub capabilities: Vec<crate::preparation::capabilities::Capability>,
    /// The orchestration of each turn that prepared capabilities: what recall found, what the
    /// Orchestrator answered, what was added.
    pub orchestrations: Vec<crate::preparation::orchestration::Orchestration>,
    pub grants: Vec<Grant>,
    /// The project instructions (`AGENTS.md` of a granted root) the session was given: file,
    /// digest, size.
    pub project_instructions: Vec<crate::project::Instructions>,
    /// Where the session's tools may send HTTP requests and the secrets bound there (names
    /// only), one line each.
    pub net: Vec<String>,
    /// What the session's calls run under: its policy (denied, asked and allowed tools and
    /// effect classes, redaction patterns), each call's budget, its model settings (the
    /// server's address shown to admins only) and its loop guards.
    pub policy: crate::policy::Policy,
    /// The changes people made to the policy and the model since the session was created,
    /// oldest first, with who made each.
    pub settings_changes: Vec<crate::session::SettingsChange>,
    pub budget: crate::sandbox::Budget,
    pub model: crate::model::ModelConfig,
    pub guards: Option<crate::session::LoopGuards>,
    /// The last message requests no longer hold (0: none; see `checkpoints`).
    pub context_start: i64,
    /// Every compaction of the session, oldest first: the messages each summarizes, its
    /// summary, and whether it is promoted, pending, discarded or failed.
    pub checkpoints: Vec<crate::compaction::CheckpointRecord>,
    /// Every message, the compacted ones included (nothing is deleted).
    pub messages: Vec<TimelineMessage>,
    pub tool_calls: Vec<TimelineCall>,
    /// Every approval unit of the session, oldest first.
    pub approvals: Vec<crate::session::ApprovalUnit>,
    pub pending_inputs: i64,
    /// Every model call: its step, turn, finish reason, tokens and time.
    pub model_calls: Vec<crate::assembly::ModelCallRecord>,
    /// Requests that did not come back as replies (refused by the server, or failed).
    pub refused_requests: Vec<crate::assembly::RefusedRequest>,
    /// The estimated tokens of the next request.
    pub next_request: crate::assembly::TokenEstimate,
    /// Where the room of the next request goes (filled in by the front door, which assembles
    /// it with the session's tool schemas).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub room: Option<crate::assembly::RoomView>,
}

pub fn timeline(c: &Connection, id: &str) -> Result<Timeline, StoreError> {
    let meta = load_meta(c, id)?;
    let mut stmt =
        c.prepare("SELECT seq, turn, role, body FROM messages WHERE session_id=?1 ORDER BY seq")?;
    let messages = stmt
        .query_map([id], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .map(|(seq, turn, role, body)| TimelineMessage::read(seq, turn, role, body))
        .collect();
    let mut stmt = c.prepare(
        "SELECT step, call_id, position, tool, input, component_digest, effect, status, result, error_kind, changes,
                duration_ms, idempotent, approval_id, net, logs
         FROM tool_calls WHERE session_id=?1 ORDER BY step, position",
    )?;
    let tool_calls = stmt
        .query_map([id], |r| Ok(TimelineCall { step: r.get(0)?, entry: journal_row(r, 1)? }))?
        .collect::<Result<Vec<_>, _>>()?;
    let approvals = crate::session::approvals_of(c, Some(id), false)?;
    let user = meta.config.user();
    let title: Option<String> = c
        .prepare_cached("SELECT title FROM session_config WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))?;
    Ok(Timeline {
        id: id.to_string(),
        title,
        unfinished_rewind: crate::session::open_rewind_in(c, id)?,
        forked_from: crate::session::origin_in(c, id)?,
        conversation_rewinds: crate::session::conversation_rewinds_in(c, id)?,
        state: meta.runtime.state,
        state_detail: meta.runtime.state_detail,
        session_goal: meta.task.session_goal,
        phase_goal: meta.task.phase_goal,
        transitions: crate::preparation::transition::of_session(c, id)?,
        plan: meta.task.plan,
        plan_history: crate::preparation::plan::history_in(c, id)?,
        user,
        loaded_tools: meta.capabilities.loaded_tools,
        tool_pins: meta.capabilities.tool_pins,
        capabilities: crate::preparation::capabilities::of_session(c, id)?,
        orchestrations: crate::preparation::orchestration::orchestrations_in(c, id)?,
        context_start: meta.runtime.context_start,
        checkpoints: crate::compaction::checkpoints_in(c, id)?,
        project_instructions: crate::project::listed(&meta.config.system_prompt),
        grants: meta.config.grants,
        net: meta.config.net.lines(),
        policy: meta.config.policy,
        settings_changes: crate::session::settings_changes(c, id)?,
        budget: meta.config.budget,
        model: meta.config.model,
        guards: meta.config.guards,
        messages,
        tool_calls,
        approvals,
        pending_inputs: pending_inputs(c, id)?,
        model_calls: crate::assembly::model_calls(c, id)?,
        refused_requests: crate::assembly::refused_requests(c, id)?,
        next_request: crate::assembly::token_estimate(c, id)?,
        room: None,
    })
}

/// The sessions whose title, goal or messages hold `text` (case aside for ASCII letters), by id.
pub fn matching(c: &Connection, text: &str) -> Result<std::collections::BTreeSet<String>, StoreError> {
    let mut pattern = String::from("%");
    for ch in text.to_lowercase().chars() {
        if matches!(ch, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(ch);
    }
    pattern.push('%');
    let mut stmt = c.prepare(
        "SELECT session_id FROM session_config
         WHERE LOWER(session_goal) LIKE ?1 ESCAPE '\\' OR LOWER(title) LIKE ?1 ESCAPE '\\'
         UNION SELECT DISTINCT session_id FROM messages WHERE LOWER(body) LIKE ?1 ESCAPE '\\'",
    )?;
    let ids = stmt.query_map([pattern.as_str()], |r| r.get::<_, String>(0))?;
    Ok(ids.collect::<Result<_, _>>()?)
}

/// The views of the sessions of one engine.
#[derive(Clone, Copy)]
pub struct Views<'a> {
    engine: &'a SessionEngine,
}

impl<'a> Views<'a> {
    /// The handle of `engine`'s sessions.
    pub fn of(engine: &'a SessionEngine) -> Self {
        Self { engine }
    }

    /// Every session, newest first.
    pub async fn list(&self) -> Result<Vec<SessionSummary>, StoreError> {
        self.engine.db().read(list).await
    }

    /// The ids of the sessions whose goal or messages hold `text` ([`matching`]).
    pub async fn matching(
        &self,
        text: &str,
    ) -> Result<std::collections::BTreeSet<String>, StoreError> {
        let text = text.to_string();
        self.engine.db().read(move |c| matching(c, &text)).await
    }

    /// The session's timeline: messages, tool calls, state.
    pub async fn timeline(&self, id: &SessionId) -> Result<Timeline, StoreError> {
        let id = id.clone();
        self.engine.db().read(move |c| timeline(c, &id)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_works_for_its_typed_user_and_one_without_for_the_os_user() {
        let of = |user: Option<&str>| SessionSummary {
            id: "s".into(),
            state: "idle".into(),
            turns: 0,
            steps: 0,
            session_goal: None,
            created_at: 0,
            last_activity: 0,
            owner: None,
            user: user.map(str::to_string),
            title: None,
        };
        assert!(of(Some("local:carol")).works_for("carol"));
        assert!(of(Some("local:carol")).works_for("local:carol"));
        assert!(!of(Some("token:carol")).works_for("carol"));
        assert!(!of(Some("local:carol")).works_for("bob"));
        let me = crate::memory::default_user();
        assert!(of(None).works_for(&me));
        assert!(!of(None).works_for(&format!("{me}x")));
    }

    #[test]
    fn a_message_is_read_into_its_text_calls_and_answer() {
        let assistant = serde_json::json!({"role": "assistant", "content": "Reading it.",
            "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "fs_read_file", "arguments": "{\"path\":\"/w/a\"}"}}]});
        let m = TimelineMessage::read(3, 1, "assistant".into(), assistant.to_string());
        assert_eq!(m.text, "Reading it.");
        assert_eq!(m.calls.len(), 1);
        assert_eq!((m.calls[0].id.as_str(), m.calls[0].tool.as_str()), ("c1", "fs_read_file"));
        assert_eq!(m.calls[0].input, "{\"path\":\"/w/a\"}");
        assert_eq!(m.answers, None);

        let tool = serde_json::json!({"role": "tool", "tool_call_id": "c1", "content": "hello"});
        let m = TimelineMessage::read(4, 1, "tool".into(), tool.to_string());
        assert_eq!((m.text.as_str(), m.answers.as_deref()), ("hello", Some("c1")));

        let parts = serde_json::json!({"role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]});
        let m = TimelineMessage::read(1, 1, "user".into(), parts.to_string());
        assert_eq!(m.text, "one\ntwo");
        // A body that is not JSON is kept as text.
        let m = TimelineMessage::read(2, 1, "user".into(), "plain words".into());
        assert_eq!(m.text, "plain words");
        assert!(m.calls.is_empty());
    }
}
