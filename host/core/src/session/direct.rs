//! Direct calls: a tool call a front-end makes in a session without a model step — an MCP
//! client's `tools/call`. Each is a step of its own (the session's step count grows by one)
//! with one journal row, written `intent` before the call runs (or `waiting` while a person
//! is asked, with its approval unit) and `done` after it (each write with its `tool_call`
//! event). The model-free session has no open step: after a crash, [`recover_in`] settles its
//! rows by the same rule as a step's.

use crate::ids::SessionId;
use crate::sql::{Connection, params};

/// How a direct call's id begins (`direct-` and 12 hex characters).
pub const DIRECT_CALL_PREFIX: &str = "direct-";

use crate::failure::FailureKind;
use crate::store::StoreError;

use super::approvals::ApprovalUnit;
use super::facts::{self, RuntimeState};
use super::steps::{self, AfterCrash, JournalStatus, WaitCommit};
use super::{JournalEntry, SessionEngine, calls};

/// Opens a direct call: the next step number, its journal row and the `running` state — one
/// transaction. Returns the step.
pub(crate) fn begin_in(c: &Connection, id: &str, entry: &JournalEntry) -> Result<i64, StoreError> {
    let step: i64 = c
        .prepare_cached("UPDATE sessions SET steps = steps + 1 WHERE id = ?1 RETURNING steps")?
        .query_row([id], |r| r.get(0))?;
    calls::record_in(c, id, step, entry)?;
    let detail = format!("direct call of {}", entry.tool);
    facts::set_state(c, id, RuntimeState::Running, Some(&detail))?;
    Ok(step)
}

/// Finishes a direct call: its row (`done`, or `intent` → `done` with the error that stopped
/// it) and the `idle` state.
pub(crate) fn finish_in(
    c: &Connection,
    id: &str,
    step: i64,
    entry: &JournalEntry,
) -> Result<(), StoreError> {
    calls::record_in(c, id, step, entry)?;
    facts::set_state(c, id, RuntimeState::Idle, None)
}

/// Settles the direct calls a stopped process left: a started call that may have had its
/// effect is `unknown` (never run again); one that was safe to repeat is closed as
/// interrupted (nobody re-issues a client's call); one that waited for a person is closed and
/// its approval cancelled. Rows of the open step (`open_step`) are the step's own business.
/// Returns the calls it settled, each with whether its outcome is unknown.
pub(crate) fn recover_in(
    c: &Connection,
    id: &str,
    open_step: Option<i64>,
) -> Result<Vec<(crate::ids::CallId, bool)>, StoreError> {
    let rows: Vec<(i64, JournalEntry)> = c
        .prepare_cached(
            "SELECT step, call_id, position, tool, input, component_digest, effect, status, result,
                    error_kind, changes, duration_ms, idempotent, approval_id, net, logs
             FROM tool_calls WHERE session_id=?1 AND status IN ('intent', 'waiting')
               AND step IS DISTINCT FROM ?2 ORDER BY step, position",
        )?
        .query_map(params![id, open_step], |r| Ok((r.get(0)?, facts::journal_row(r, 1)?)))?
        .collect::<Result<_, _>>()?;
    let mut settled = Vec::new();
    for (step, mut e) in rows {
        match (e.status, e.after_crash()) {
            (JournalStatus::Intent, AfterCrash::OutcomeUnknown) => {
                steps::mark_unknown(&mut e);
            }
            (JournalStatus::Intent, _) => {
                close(&mut e, FailureKind::Interrupted, "the process stopped during the call")
            }
            _ => close(
                &mut e,
                FailureKind::NotRun,
                "the process stopped while the call waited for a decision; it never ran",
            ),
        }
        calls::record_in(c, id, step, &e)?;
        settled.push((e.call_id.clone(), e.status == JournalStatus::Unknown));
        c.prepare_cached(
            "UPDATE approvals SET status='cancelled', decision_reason='the process stopped before a decision'
             WHERE session_id=?1 AND call_id=?2 AND status IN ('pending', 'approved')",
        )?
        .execute(params![id, e.call_id])?;
    }
    Ok(settled)
}

fn close(e: &mut JournalEntry, kind: FailureKind, message: &str) {
    e.status = JournalStatus::Done;
    e.result = Some(crate::tools::result::error_content(kind, message));
    e.error_kind = Some(kind);
}

impl SessionEngine {
    /// Opens a direct call: the next step, its journal row and the `running` state, in one
    /// transaction; returns the step.
    pub async fn begin_direct(
        &self,
        id: &SessionId,
        entry: JournalEntry,
    ) -> Result<i64, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| begin_in(c, &id, &entry)).await
    }

    /// Stops a direct call to ask a person: its row `waiting` with the approval unit, the
    /// `approval_asked` event and the `waiting_approval` state — one transaction.
    pub async fn ask_direct(
        &self,
        id: &SessionId,
        step: i64,
        entry: JournalEntry,
        unit: ApprovalUnit,
    ) -> Result<(), StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| {
            steps::wait_in(
                c,
                &id,
                &WaitCommit {
                    step,
                    entries: vec![entry],
                    new_units: vec![unit],
                    invalidate: vec![],
                },
            )
        })
        .await
    }

    /// Records that a client reached session `id` from outside (an MCP client).
    pub async fn client_connected(
        &self,
        id: &SessionId,
        client: String,
        version: String,
        protocol: String,
        transport: String,
    ) -> Result<(), StoreError> {
        let id = id.clone();
        let event =
            super::events::SessionEvent::ClientConnected { client, version, protocol, transport };
        self.write(id.clone(), move |c| super::events::append(c, &id, &event).map(|_| ())).await
    }

    /// Finishes a direct call: its row and the `idle` state, in one transaction.
    pub async fn finish_direct(
        &self,
        id: &SessionId,
        step: i64,
        entry: JournalEntry,
    ) -> Result<(), StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| finish_in(c, &id, step, &entry)).await
    }
}
