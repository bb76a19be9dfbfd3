//! The orchestration record of each turn that prepared capabilities: what recall found, what
//! the Orchestrator was asked and answered, what was added (through
//! `crate::preparation::capabilities::add_in`), and the exact request of its call.

use crate::sql::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::memory::Memory;
use crate::skills::SkillRef;
use crate::store::{StoreError, now_ms};
use crate::tools::{ToolRef, ToolSetRef};

use crate::preparation::capabilities::{Added, Selection, Via, add_in};
use crate::session::events::{self, SessionEvent};

/// What recall found for one turn: candidates of the three groups, each sorted by stable
/// reference.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Candidates {
    pub skills: Vec<SkillRef>,
    pub toolsets: Vec<ToolSetRef>,
    pub tools: Vec<ToolRef>,
}

impl Candidates {
    pub fn is_empty(&self) -> bool {
        self.skills.is_empty() && self.toolsets.is_empty() && self.tools.is_empty()
    }
}

/// The orchestration of one turn: what was recalled, what the Orchestrator was asked and
/// answered, and what was added.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Orchestration {
    pub turn: i64,
    pub at_ms: i64,
    pub mode: String,
    pub candidates: Candidates,
    /// The user's memories recalled for the request's "relevant memory" block.
    pub memories: Vec<Memory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recall_error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recall_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_bytes: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    /// What the Orchestrator selected that was accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selected: Option<Selection>,
    /// Names in its answer that were not candidates, dropped.
    pub dropped: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i64>,
    /// The orchestration finished (its call was made or not needed, its selection applied).
    pub done: bool,
}

/// What recall found for one turn, to record.
#[derive(Debug, Clone, Default)]
pub struct RecallRecord {
    pub turn: i64,
    pub mode: String,
    pub candidates: Candidates,
    pub memories: Vec<Memory>,
    /// What failed, group by group.
    pub error: Option<String>,
    pub recall_ms: f64,
}

/// Records a turn's recall (replacing an unfinished earlier attempt), with its event.
pub(crate) fn record_recall_in(
    c: &Connection,
    id: &str,
    r: &RecallRecord,
) -> Result<(), StoreError> {
    let (turn, candidates, memories) = (r.turn, &r.candidates, &r.memories);
    let recall_error = r.error.as_deref();
    c.prepare_cached(
        "INSERT INTO orchestrations (session_id, turn, at_ms, mode, candidates, memories,
             recall_error, recall_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (session_id, turn) DO UPDATE SET at_ms=excluded.at_ms,
             candidates=excluded.candidates, memories=excluded.memories,
             recall_error=excluded.recall_error, recall_ms=excluded.recall_ms",
    )?
    .execute(params![
        id,
        turn,
        now_ms(),
        r.mode,
        crate::store::json(candidates)?,
        crate::store::json(memories)?,
        recall_error,
        r.recall_ms
    ])?;
    events::append(
        c,
        id,
        &SessionEvent::CapabilitiesRecalled {
            turn,
            skills: candidates.skills.len(),
            toolsets: candidates.toolsets.len(),
            tools: candidates.tools.len(),
            memories: memories.len(),
            error: recall_error.map(str::to_string),
            call: !candidates.is_empty(),
        },
    )?;
    Ok(())
}

/// What the Orchestrator's call came to.
#[derive(Debug, Clone, Default)]
pub struct OrchestratorCall {
    /// The request body, when a call was made.
    pub request: Option<Vec<u8>>,
    pub reply: Option<String>,
    /// The accepted selection.
    pub selection: Selection,
    pub dropped: Vec<String>,
    pub error: Option<String>,
    pub duration_ms: f64,
    pub attempts: u32,
}

/// Finishes turn `turn`'s orchestration: keeps the call's request (in `blobs`, by SHA-256) and
/// answer, adds the accepted selection (AddSelectedCapabilities), and emits the events that
/// end the preparation — then the turn's first model call starts. Returns what was added.
pub(crate) fn finish_in(
    c: &Connection,
    id: &str,
    turn: i64,
    call: &OrchestratorCall,
) -> Result<Added, StoreError> {
    let (sha, bytes) = match &call.request {
        Some(body) => {
            let (sha, bytes) = crate::store::blobs::put_request_in(c, body, "an orchestration")?;
            (Some(sha), Some(bytes))
        }
        None => (None, None),
    };
    let made = call.request.is_some();
    c.prepare_cached(
        "UPDATE orchestrations SET body_sha256=?3, body_bytes=?4, reply=?5, selected=?6,
             dropped=?7, error=?8, duration_ms=?9, attempts=?10, done=1
         WHERE session_id=?1 AND turn=?2",
    )?
    .execute(params![
        id,
        turn,
        sha,
        bytes,
        call.reply,
        made.then(|| crate::store::json(&call.selection)).transpose()?,
        crate::store::json(&call.dropped)?,
        call.error,
        made.then_some(call.duration_ms),
        made.then_some(i64::from(call.attempts)),
    ])?;
    if made {
        events::append(
            c,
            id,
            &SessionEvent::Orchestrated {
                turn,
                dropped: call.dropped.clone(),
                error: call.error.clone(),
            },
        )?;
    }
    let added = add_in(c, id, &call.selection, Via::Orchestrator, Some(turn), None)?;
    let runtime = crate::session::runtime_in(c, id)?;
    let task = crate::preparation::task::task_in(c, id)?;
    events::append(
        c,
        id,
        &SessionEvent::EnvironmentApplied {
            session_goal: task.session_goal.clone(),
            phase_goal: task.phase_goal.clone(),
        },
    )?;
    events::append(
        c,
        id,
        &SessionEvent::ModelCallStarted { step: runtime.steps + 1, resumed: false },
    )?;
    Ok(added)
}

const ORCHESTRATION: &str = "SELECT turn, at_ms, mode, candidates, memories, recall_error,
    recall_ms, body_sha256, body_bytes, reply, selected, dropped, error, duration_ms, attempts,
    done FROM orchestrations";

fn orchestration(r: &crate::sql::Row<'_>) -> crate::sql::Result<Orchestration> {
    fn json<T: serde::de::DeserializeOwned>(i: usize, t: String) -> crate::sql::Result<T> {
        serde_json::from_str(&t).map_err(|e| crate::sql::Error::conversion(i, e))
    }
    Ok(Orchestration {
        turn: r.get(0)?,
        at_ms: r.get(1)?,
        mode: r.get(2)?,
        candidates: json(3, r.get(3)?)?,
        memories: json(4, r.get(4)?)?,
        recall_error: r.get(5)?,
        recall_ms: r.get(6)?,
        body_sha256: r.get(7)?,
        body_bytes: r.get(8)?,
        reply: r.get(9)?,
        selected: r.get::<_, Option<String>>(10)?.map(|s| json(10, s)).transpose()?,
        dropped: r
            .get::<_, Option<String>>(11)?
            .map(|s| json(11, s))
            .transpose()?
            .unwrap_or_default(),
        error: r.get(12)?,
        duration_ms: r.get(13)?,
        attempts: r.get(14)?,
        done: r.get(15)?,
    })
}

/// The orchestration of turn `turn`, if it began.
pub(crate) fn of_turn_in(
    c: &Connection,
    id: &str,
    turn: i64,
) -> Result<Option<Orchestration>, StoreError> {
    Ok(c.prepare_cached(&format!("{ORCHESTRATION} WHERE session_id=?1 AND turn=?2"))?
        .query_row(params![id, turn], orchestration)
        .optional()?)
}

/// The last orchestration of session `id` whose recall was recorded.
pub(crate) fn latest_in(c: &Connection, id: &str) -> Result<Option<Orchestration>, StoreError> {
    Ok(c.prepare_cached(&latest_sql())?.query_row([id], orchestration).optional()?)
}

fn latest_sql() -> String {
    format!("{ORCHESTRATION} WHERE session_id=?1 ORDER BY turn DESC LIMIT 1")
}

/// Sends the read of [`latest_in`] ahead (see [`Connection::prefetch`]).
pub(crate) fn prefetch_latest_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    Ok(c.prefetch(&latest_sql(), [id])?)
}

/// Every orchestration of session `id`, oldest first.
pub(crate) fn orchestrations_in(
    c: &Connection,
    id: &str,
) -> Result<Vec<Orchestration>, StoreError> {
    let mut stmt =
        c.prepare_cached(&format!("{ORCHESTRATION} WHERE session_id=?1 ORDER BY turn"))?;
    let rows = stmt.query_map([id], orchestration)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The exact request body of turn `turn`'s orchestration call (the last one made if `None`).
pub(crate) fn evidence_in(
    c: &Connection,
    id: &str,
    turn: Option<i64>,
) -> Result<(i64, Vec<u8>), StoreError> {
    crate::preparation::call_evidence_in(c, id, crate::preparation::CallKind::Orchestration, turn)
}
