//! Task transitions: what the understanding call of a turn answered and what the fixed table
//! did to the goals — one row per turn, committed exactly once with the goals it sets.
//!
//! A turn begins (its input in history) before the understanding call is made; the call's
//! answer — or `uncertain`, when it failed — is committed here with the transition, the
//! call's request (byte for byte) and the events that report them. A turn whose transition
//! is not committed yet (its process died during the call) is *pending*: the runner that
//! resumes it makes the call again and commits it then. A second commit for one turn is a
//! no-op, so an input is understood and applied once, whatever crashed.

use crate::sql::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::store::{StoreError, now_ms};
use crate::understand::{PreprocessConfig, TaskRelation, TransitionMode, Understanding};

use crate::session as facts;
use crate::session::events::{self, SessionEvent};

/// What the understanding call of a turn came to, for `commit_in`.
#[derive(Debug, Clone, Default)]
pub struct Understood {
    /// The answer (`uncertain` when the call failed); `None` when no call was made (task
    /// understanding is off for the session).
    pub understanding: Option<Understanding>,
    /// Why the answer is `uncertain` when the call failed or its reply was refused.
    pub error: Option<String>,
    /// The exact request body.
    pub request: Option<Vec<u8>>,
    /// The reply's content, as the server sent it.
    pub reply: Option<String>,
    pub duration_ms: f64,
    pub attempts: u32,
}

impl Understood {
    /// The answer's three groups of recall terms (none when no call was made).
    pub fn terms(&self) -> RecallTerms {
        self.understanding
            .as_ref()
            .map(|u| RecallTerms {
                skill: u.skill_recall_terms.clone(),
                tool: u.tool_recall_terms.clone(),
                memory: u.memory_recall_terms.clone(),
            })
            .unwrap_or_default()
    }

    /// The transition the fixed table gives this answer when the phase goal is `phase_goal`.
    pub fn mode(&self, phase_goal: Option<&str>) -> TransitionMode {
        let relation =
            self.understanding.as_ref().map(|u| u.task_relation).unwrap_or(TaskRelation::Uncertain);
        crate::understand::transition(relation, phase_goal)
    }
}

/// The three groups of recall terms of an answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecallTerms {
    pub skill: Vec<String>,
    pub tool: Vec<String>,
    pub memory: Vec<String>,
}

/// A committed transition.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Transition {
    pub turn: i64,
    /// When it was committed (ms since the Unix epoch).
    pub at_ms: i64,
    /// What the call answered; `None` when no call was made.
    pub relation: Option<TaskRelation>,
    pub mode: TransitionMode,
    /// The goals after the transition.
    pub session_goal: Option<String>,
    pub phase_goal: Option<String>,
    pub terms: RecallTerms,
    /// Why the answer is `uncertain`, when the call failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// SHA-256 (hex) and length of the call's request body, when a call was made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_bytes: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i64>,
}

impl Transition {
    /// Whether the transition set the goals (and so asks for capabilities to be prepared).
    pub fn changes_goals(&self) -> bool {
        self.mode != TransitionMode::Keep
    }
}

/// A begun turn whose transition is not committed yet.
#[derive(Debug, Clone)]
pub struct PendingUnderstanding {
    pub turn: i64,
    /// The turn's input.
    pub text: String,
    /// The session's settings for the call (`None`: off).
    pub preprocess: Option<PreprocessConfig>,
    pub session_goal: Option<String>,
    pub phase_goal: Option<String>,
}

fn recorded(c: &Connection, id: &str, turn: i64) -> Result<bool, StoreError> {
    Ok(c.prepare_cached(RECORDED)?.query_row(params![id, turn], |r| r.get(0))?)
}

const RECORDED: &str =
    "SELECT EXISTS(SELECT 1 FROM task_transitions WHERE session_id=?1 AND turn=?2)";
const TURN_INPUT: &str = "SELECT body FROM messages WHERE session_id=?1 AND turn=?2 AND role='user'
     ORDER BY seq LIMIT 1";
const STEPS: &str = "SELECT steps FROM sessions WHERE id=?1";

/// The input of turn `turn` (the content of its first user message).
fn turn_input(c: &Connection, id: &str, turn: i64) -> Result<String, StoreError> {
    let body: Option<String> = c
        .prepare_cached(TURN_INPUT)?
        .query_row(params![id, turn], |r| r.get(0))
        .optional()?;
    let body = body.ok_or_else(|| {
        StoreError::Corrupt(format!("turn {turn} of session `{id}` has no input in its history"))
    })?;
    let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| {
        StoreError::Corrupt(format!("the input of turn {turn} of `{id}` is unreadable: {e}"))
    })?;
    Ok(v["content"].as_str().unwrap_or_default().to_string())
}

/// The session's active turn, when its transition is not committed yet.
pub(crate) fn pending_in(
    c: &Connection,
    id: &str,
) -> Result<Option<PendingUnderstanding>, StoreError> {
    let Some(turn) = facts::runtime_in(c, id)?.active_turn else { return Ok(None) };
    if recorded(c, id, turn)? {
        return Ok(None);
    }
    let task = super::task::task_in(c, id)?;
    Ok(Some(PendingUnderstanding {
        turn,
        text: turn_input(c, id, turn)?,
        preprocess: facts::config_in(c, id)?.preprocess,
        session_goal: task.session_goal,
        phase_goal: task.phase_goal,
    }))
}

/// Whether a transition in `mode` prepares capabilities (recall and the Orchestrator): only
/// `initialize` and `reconcile`, and only in a session with task understanding on (the
/// Orchestrator is a call of the same supporting model).
pub fn prepares_capabilities(mode: TransitionMode, understanding_on: bool) -> bool {
    mode != TransitionMode::Keep && understanding_on
}

/// The active turn's committed transition, when it prepares capabilities and its
/// orchestration has not finished (its process died in between): what to prepare again.
pub(crate) fn unprepared_in(c: &Connection, id: &str) -> Result<Option<Transition>, StoreError> {
    let config = crate::session::config_in(c, id)?;
    let runtime = crate::session::runtime_in(c, id)?;
    let Some(turn) = runtime.active_turn else { return Ok(None) };
    let Some(t) = select(c, id, Some(turn))?.pop() else {
        return Ok(None);
    };
    if !prepares_capabilities(t.mode, config.preprocess.is_some()) {
        return Ok(None);
    }
    let done = crate::preparation::orchestration::of_turn_in(c, id, turn)?.is_some_and(|o| o.done);
    Ok((!done).then_some(t))
}

/// Commits the transition of turn `turn`: applies the fixed table to the session's goals,
/// records the row (and the call's request), and appends the events — `task_transition`,
/// `environment_applied` when the goals changed, then `model_call_started` for the loop that
/// follows. `None` (and nothing written) when the turn's transition is already committed.
pub(crate) fn commit_in(
    c: &Connection,
    id: &str,
    turn: i64,
    understood: &Understood,
    recalled: Option<&crate::preparation::orchestration::RecallRecord>,
) -> Result<Option<Transition>, StoreError> {
    // Every read before the first write goes to the server at once.
    c.prefetch(RECORDED, params![id, turn])?;
    crate::session::prefetch_preprocess_in(c, id)?;
    crate::preparation::task::prefetch_task_in(c, id)?;
    c.prefetch(TURN_INPUT, params![id, turn])?;
    c.prefetch(STEPS, [id])?;
    if recorded(c, id, turn)? {
        return Ok(None);
    }
    let preprocess = crate::session::preprocess_on(c, id)?;
    let task = crate::preparation::task::task_in(c, id)?;
    let text = turn_input(c, id, turn)?;
    // The step count, which nothing below changes.
    let steps: i64 = c.prepare_cached(STEPS)?.query_row([id], |r| r.get(0))?;
    let relation = understood.understanding.as_ref().map(|u| u.task_relation);
    let mode = understood.mode(task.phase_goal.as_deref());
    let (session_goal, phase_goal) = match mode {
        TransitionMode::Initialize => {
            (Some(task.session_goal.clone().unwrap_or_else(|| text.clone())), Some(text))
        }
        TransitionMode::Reconcile => (task.session_goal.clone(), Some(text)),
        TransitionMode::Keep => (task.session_goal.clone(), task.phase_goal.clone()),
    };
    if mode != TransitionMode::Keep {
        c.prepare_cached(
            "UPDATE session_config SET session_goal=?2, phase_goal=?3, phase_turn=?4
             WHERE session_id=?1",
        )?
        .execute_pipelined(params![id, session_goal, phase_goal, turn])?;
    }
    let terms = understood.terms();
    let (sha, bytes) = match &understood.request {
        Some(body) => {
            let (sha, bytes) = crate::store::blobs::put_request_in(c, body, "an understanding")?;
            (Some(sha), Some(bytes))
        }
        None => (None, None),
    };
    let made = understood.request.is_some();
    let at_ms = now_ms();
    c.prepare_cached(
        "INSERT INTO task_transitions (session_id, turn, at_ms, relation, mode, session_goal,
             phase_goal, terms, error, body_sha256, body_bytes, reply, duration_ms, attempts)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    )?
    .execute_pipelined(params![
        id,
        turn,
        at_ms,
        relation.map(|r| r.as_str()),
        mode.as_str(),
        session_goal,
        phase_goal,
        crate::store::json(&terms)?,
        understood.error,
        sha,
        bytes,
        understood.reply,
        made.then_some(understood.duration_ms),
        made.then_some(i64::from(understood.attempts)),
    ])?;
    events::append(
        c,
        id,
        &SessionEvent::TaskTransition { turn, relation, mode, error: understood.error.clone() },
    )?;
    if prepares_capabilities(mode, preprocess) {
        // Capability preparation: its recall (made before this commit) is recorded here; with
        // no candidates it is finished here too — otherwise the Orchestrator's call follows,
        // and its commit applies the environment.
        events::append(c, id, &SessionEvent::CapabilitiesDiscovering { turn })?;
        if let Some(r) = recalled.filter(|r| r.turn == turn) {
            crate::preparation::orchestration::record_recall_in(c, id, r)?;
            if r.candidates.is_empty() {
                let none = crate::preparation::orchestration::OrchestratorCall::default();
                crate::preparation::orchestration::finish_in(c, id, turn, &none)?;
            }
        }
    } else {
        if mode != TransitionMode::Keep {
            events::append(
                c,
                id,
                &SessionEvent::EnvironmentApplied {
                    session_goal: session_goal.clone(),
                    phase_goal: phase_goal.clone(),
                },
            )?;
        }
        events::append(c, id, &SessionEvent::ModelCallStarted { step: steps + 1, resumed: false })?;
    }
    Ok(Some(Transition {
        turn,
        at_ms,
        relation,
        mode,
        session_goal,
        phase_goal,
        terms,
        error: understood.error.clone(),
        body_sha256: sha,
        body_bytes: bytes,
        duration_ms: made.then_some(understood.duration_ms),
        attempts: made.then_some(i64::from(understood.attempts)),
    }))
}

/// Every transition of session `id`, oldest first.
pub fn of_session(c: &Connection, id: &str) -> Result<Vec<Transition>, StoreError> {
    select(c, id, None)
}

/// The transitions of session `id` (of turn `turn` only, when given), oldest first.
fn select(c: &Connection, id: &str, turn: Option<i64>) -> Result<Vec<Transition>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT turn, at_ms, relation, mode, session_goal, phase_goal, terms, error, body_sha256,
                body_bytes, duration_ms, attempts
         FROM task_transitions WHERE session_id=?1 AND (CAST(?2 AS BIGINT) IS NULL OR turn=?2) ORDER BY turn",
    )?;
    let rows = stmt.query_map(params![id, turn], |r| {
        Ok((
            (r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, Option<TaskRelation>>(2)?),
            (
                r.get::<_, TransitionMode>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, Option<String>>(5)?,
            ),
            (r.get::<_, String>(6)?, r.get::<_, Option<String>>(7)?),
            (
                r.get::<_, Option<String>>(8)?,
                r.get::<_, Option<i64>>(9)?,
                r.get::<_, Option<f64>>(10)?,
                r.get::<_, Option<i64>>(11)?,
            ),
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let ((turn, at_ms, relation), (mode, session_goal, phase_goal), (terms, error), call) =
            row?;
        let (body_sha256, body_bytes, duration_ms, attempts) = call;
        out.push(Transition {
            turn,
            at_ms,
            relation,
            mode,
            session_goal,
            phase_goal,
            terms: serde_json::from_str(&terms).map_err(|e| {
                StoreError::Corrupt(format!("the recall terms of turn {turn} are unreadable: {e}"))
            })?,
            error,
            body_sha256,
            body_bytes,
            duration_ms,
            attempts,
        });
    }
    Ok(out)
}

/// The exact request body of the understanding call of turn `turn` (the last turn that made
/// one if `None`), byte for byte.
pub(crate) fn evidence_in(
    c: &Connection,
    id: &str,
    turn: Option<i64>,
) -> Result<(i64, Vec<u8>), StoreError> {
    crate::preparation::call_evidence_in(c, id, crate::preparation::CallKind::Understanding, turn)
}
