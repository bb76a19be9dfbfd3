//! The kernel's facts of a session and the SQL that reads and writes them: its runtime and
//! counters, the history's messages, the state setter (which runs the state reaction) and the
//! journal's rows.

use crate::sql::{Connection, OptionalExtension, params};
use serde::Serialize;

use crate::store::{StoreError, now_ms};

use super::JournalEntry;
pub(crate) use super::row::{lock_in, no_session, parse};
pub use super::state::RuntimeState;

/// The session's runtime: its state, its counters and the turn in progress (the checkpoint its
/// context starts after is compaction's, composed with it in `SessionMeta`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Runtime {
    pub state: RuntimeState,
    pub state_detail: Option<String>,
    pub meta_version: i64,
    pub context_start: i64,
    pub steps: i64,
    pub turns: i64,
    /// The turn in progress (begun, not ended: running, waiting for approval, or recovered
    /// after a crash), if any.
    pub active_turn: Option<i64>,
}

/// The runtime of session `id`.
pub(crate) fn runtime_in(c: &Connection, id: &str) -> Result<Runtime, StoreError> {
    Ok(load_counters(c, id)?.runtime())
}

/// The meta fields that change without `meta_version` changing: the runtime state and the
/// counters. Everything else in [`SessionMeta`](crate::meta::SessionMeta) is covered by
/// `meta_version` (migration 5 makes the database bump it on any change), so a meta read at
/// one version plus these is the current meta.
#[derive(Debug, Clone, PartialEq)]
pub struct MetaCounters {
    /// When the session was created: with the id, what tells this session from a session
    /// that once had its id (kept for caches; sessions are not deleted today).
    pub created_at: i64,
    pub meta_version: i64,
    state: RuntimeState,
    state_detail: Option<String>,
    context_start: i64,
    steps: i64,
    turns: i64,
    active_turn: Option<i64>,
}

impl MetaCounters {
    /// The last message requests no longer hold (0: none).
    pub fn context_start(&self) -> i64 {
        self.context_start
    }

    /// The turn in progress, if any.
    pub fn active_turn(&self) -> Option<i64> {
        self.active_turn
    }

    /// The runtime these counters make.
    pub fn runtime(self) -> Runtime {
        Runtime {
            state: self.state,
            state_detail: self.state_detail,
            meta_version: self.meta_version,
            context_start: self.context_start,
            steps: self.steps,
            turns: self.turns,
            active_turn: self.active_turn,
        }
    }
}

const COUNTERS: &str = "SELECT meta_version, state, state_detail, context_start, steps, turns,
            active_turn, created_at
     FROM sessions WHERE id=?1";

/// Sends the read of [`load_counters`] ahead (see [`Connection::prefetch`]).
pub(crate) fn prefetch_counters_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    Ok(c.prefetch(COUNTERS, [id])?)
}

pub fn load_counters(c: &Connection, id: &str) -> Result<MetaCounters, StoreError> {
    let row = c
        .prepare_cached(COUNTERS)?
        .query_row([id], |r| {
            Ok((
                (r.get::<_, i64>(0)?, r.get::<_, i64>(7)?),
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
                (r.get::<_, i64>(3)?, r.get::<_, i64>(4)?, r.get::<_, i64>(5)?),
                r.get::<_, Option<i64>>(6)?,
            ))
        })
        .optional()?;
    let Some((
        (meta_version, created_at),
        state,
        state_detail,
        (context_start, steps, turns),
        active_turn,
    )) = row
    else {
        return Err(no_session(id));
    };
    Ok(MetaCounters {
        created_at,
        meta_version,
        state: state.parse()?,
        state_detail,
        context_start,
        steps,
        turns,
        active_turn,
    })
}

pub fn append_message(
    c: &Connection,
    id: &str,
    turn: i64,
    role: &str,
    body: &str,
) -> Result<i64, StoreError> {
    append_messages(c, id, turn, [(role, body)])
}

/// Appends `(role, body)` messages in order under consecutive sequence numbers; returns the
/// last one (or the latest existing one when there are none).
pub fn append_messages<'a>(
    c: &Connection,
    id: &str,
    turn: i64,
    messages: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<i64, StoreError> {
    lock_in(c, id)?;
    let mut seq: i64 = c
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))?;
    let mut insert = c.prepare_cached(
        "INSERT INTO messages (session_id, seq, turn, role, body, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    let now = now_ms();
    for (role, body) in messages {
        seq += 1;
        insert.execute_pipelined(params![id, seq, turn, role, body, now])?;
    }
    Ok(seq)
}

pub fn set_state(
    c: &Connection,
    id: &str,
    state: RuntimeState,
    detail: Option<&str>,
) -> Result<(), StoreError> {
    set_state_after(c, id, state, detail, None)
}

/// [`set_state`] at the end (or the opening) of step `step`, which it records as the
/// session's latest model request in the same statement.
pub fn set_state_after(
    c: &Connection,
    id: &str,
    state: RuntimeState,
    detail: Option<&str>,
    step: Option<i64>,
) -> Result<(), StoreError> {
    let before: (String, Option<String>, Option<i64>) = c
        .prepare_cached("SELECT state, state_detail, active_turn FROM sessions WHERE id=?1")?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    set_state_from(c, id, (&before.0, before.1.as_deref(), before.2), state, detail, step)
}

/// [`set_state_after`] where the caller has just read, in the same transaction, the session's
/// state, its detail and its active turn: `before`.
pub(crate) fn set_state_from(
    c: &Connection,
    id: &str,
    before: (&str, Option<&str>, Option<i64>),
    state: RuntimeState,
    detail: Option<&str>,
    step: Option<i64>,
) -> Result<(), StoreError> {
    if before.0 != state.as_str() || before.1 != detail {
        super::events::append(
            c,
            id,
            &super::events::SessionEvent::State { state, detail: detail.map(str::to_string) },
        )?;
    }
    // A turn ends when the session becomes idle, fails or is interrupted.
    let ends_turn =
        matches!(state, RuntimeState::Idle | RuntimeState::Failed | RuntimeState::Interrupted);
    c.prepare_cached(
        "UPDATE sessions SET state=?2, state_detail=?3,
         active_turn=CASE WHEN ?4 THEN NULL ELSE active_turn END, steps=COALESCE(?5, steps)
         WHERE id=?1",
    )?
    .execute_pipelined(params![id, state.as_str(), detail, ends_turn, step])?;
    // This is the one place turns end and waits begin: the features that react to either
    // (a sub-session's workgroup) do so here, in the same transaction.
    let change =
        super::reactions::StateChange { state, detail, ends_turn: ends_turn && before.2.is_some() };
    (super::reactions::get().on_state)(c, id, change)
}

/// Sessions with work in flight: a turn open, a running state, or inputs not yet consumed —
/// those startup recovery looks at (with those a runner holds).
pub(crate) fn unsettled_in(c: &Connection) -> Result<Vec<String>, StoreError> {
    Ok(c.prepare(
        "SELECT s.id FROM sessions s
         WHERE s.active_turn IS NOT NULL
            OR s.state IN ('running', 'preparing_context', 'compressing')
            OR EXISTS (SELECT 1 FROM inbox i WHERE i.session_id = s.id AND i.consumed_at IS NULL)
            OR EXISTS (SELECT 1 FROM checkpoints k WHERE k.session_id = s.id AND k.status = 'pending')",
    )?
    .query_map([], |r| r.get(0))?
    .collect::<Result<_, _>>()?)
}

/// How many inputs of session `id` wait in its inbox.
pub fn pending_inputs(c: &Connection, id: &str) -> Result<i64, StoreError> {
    Ok(c.prepare_cached(PENDING)?.query_row([id], |r| r.get(0))?)
}

const PENDING: &str = "SELECT COUNT(*) FROM inbox WHERE session_id=?1 AND consumed_at IS NULL";

/// The runtime of session `id` and how many inputs wait in its inbox, in one round trip.
pub(crate) fn runtime_and_pending_in(
    c: &Connection,
    id: &str,
) -> Result<(Runtime, i64), StoreError> {
    prefetch_counters_in(c, id)?;
    c.prefetch(PENDING, [id])?;
    Ok((runtime_in(c, id)?, pending_inputs(c, id)?))
}

pub fn put_journal(
    c: &Connection,
    id: &str,
    step: i64,
    e: &JournalEntry,
) -> Result<(), StoreError> {
    let digest = crate::sandbox::sha256_hex(e.input.as_bytes());
    // The pre-images its change set refers to, in the same transaction as the row.
    let changes = super::preimages::keep_in(c, id, e.changes.as_deref(), &e.kept)?;
    let finished = (e.status != super::JournalStatus::Intent).then(now_ms);
    // A row written again with the status it has (a step's commit writes all of its calls,
    // some already final) changes nothing a person sees: no second event.
    let before: Option<super::JournalStatus> = c
        .prepare_cached(
            "SELECT status FROM tool_calls WHERE session_id=?1 AND step=?2 AND call_id=?3",
        )?
        .query_row(params![id, step, e.call_id], |r| r.get(0))
        .optional()?;
    c.prepare_cached(
        "INSERT INTO tool_calls (session_id, step, call_id, position, tool, input, input_digest, component_digest,
                                 effect, status, result, error_kind, changes, duration_ms, created_at, finished_at,
                                 idempotent, approval_id, net, logs)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)
         ON CONFLICT (session_id, step, call_id) DO UPDATE SET status=excluded.status, result=excluded.result,
             error_kind=excluded.error_kind, changes=excluded.changes, duration_ms=excluded.duration_ms,
             net=COALESCE(excluded.net, tool_calls.net), logs=COALESCE(excluded.logs, tool_calls.logs),
             finished_at=excluded.finished_at, component_digest=excluded.component_digest,
             approval_id=COALESCE(excluded.approval_id, tool_calls.approval_id)",
    )?
    .execute(params![
        id,
        step,
        e.call_id,
        e.position,
        e.tool,
        e.input,
        digest,
        e.component_digest,
        e.effect,
        e.status,
        e.result,
        e.error_kind,
        changes,
        e.duration_ms,
        now_ms(),
        finished,
        e.idempotent,
        e.approval_id,
        e.net,
        e.logs
    ])?;
    if before == Some(e.status) {
        return Ok(());
    }
    super::events::append(
        c,
        id,
        &super::events::SessionEvent::ToolCall {
            step,
            call_id: e.call_id.clone(),
            tool: e.tool.clone(),
            status: e.status,
            error_kind: e.error_kind,
            ms: e.duration_ms,
            subject: super::events::call_subject(&e.input),
            reason: e.error_kind.and(e.result.as_deref()).and_then(super::events::failure_reason),
        },
    )?;
    Ok(())
}

/// A journal entry from the columns `call_id, position, tool, input, component_digest, effect,
/// status, result, error_kind, changes, duration_ms, idempotent, approval_id, net, logs` starting at
/// `at`.
pub fn journal_row(r: &crate::sql::Row<'_>, at: usize) -> crate::sql::Result<JournalEntry> {
    Ok(JournalEntry {
        call_id: r.get(at)?,
        position: r.get(at + 1)?,
        tool: r.get(at + 2)?,
        input: r.get(at + 3)?,
        component_digest: r.get(at + 4)?,
        effect: r.get(at + 5)?,
        status: r.get(at + 6)?,
        result: r.get(at + 7)?,
        error_kind: r.get(at + 8)?,
        changes: r.get(at + 9)?,
        duration_ms: r.get(at + 10)?,
        idempotent: r.get(at + 11)?,
        approval_id: r.get(at + 12)?,
        net: r.get(at + 13)?,
        logs: r.get(at + 14)?,
        control_requests: Vec::new(),
        kept: Default::default(),
    })
}
