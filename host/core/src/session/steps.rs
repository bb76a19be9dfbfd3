//! Open steps and the recovery of the tool-call journal (approval units are `approvals.rs`).
//!
//! A step whose calls may change the world is *open* from the moment its evidence, assistant
//! message and planned calls are committed until its results commit as pairs. While it is open,
//! each call's journal row says how far it got: `planned` (not started), `intent` (about to
//! run, durably), `waiting` (for an approval), `done`, `unknown` (its process died while it
//! ran). A later runner — after an approval, or after a crash — finishes the step from these
//! facts alone.

use crate::sql::{Connection, OptionalExtension, params};
use serde_json::json;

use super::approvals::{ApprovalStatus, ApprovalUnit, UNIT_COLUMNS, units_where};
use super::facts::{self, RuntimeState};
use super::{JournalEntry, calls, json as to_json};
use crate::ids::UnitId;
use crate::policy::Effect;
use crate::store::{StoreError, now_ms};
use crate::tools::ConsumedApproval;
use crate::tools::result::{FailureKind, error_content};

/// What the model is told about a side-effecting call whose process died before its result was
/// recorded.
pub const OUTCOME_UNKNOWN: &str = "interrupted — outcome unknown, verify before retrying: the \
     process running this call stopped before its result was recorded, so the call may or may \
     not have taken effect. It will not be run again automatically.";

crate::stored_enum! {
    /// How far one call of an open step got: the journal row's status.
    pub enum JournalStatus: "journal status" {
        /// In an open step, not started.
        Planned = "planned",
        /// Recorded just before a side effect runs.
        Intent = "intent",
        /// Waiting for an approval.
        Waiting = "waiting",
        /// Its result is recorded.
        Done = "done",
        /// A side effect whose process died before its result was recorded.
        Unknown = "unknown",
    }
}

/// A step committed but not finished.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenStep {
    pub step: i64,
    pub turn: i64,
    /// The assistant message (with its tool calls), as the model sent it.
    pub assistant: String,
    /// Every call of the step, in the model's order.
    pub calls: Vec<JournalEntry>,
    /// The approval units of the step.
    pub units: Vec<ApprovalUnit>,
}

/// What [`SessionEngine::commit_wait`](super::SessionEngine::commit_wait) commits when a step
/// stops for approvals.
#[derive(Debug, Clone, Default)]
pub struct WaitCommit {
    pub step: i64,
    /// Journal rows to write: results finished so far and the blocked calls (`waiting`).
    pub entries: Vec<JournalEntry>,
    pub new_units: Vec<ApprovalUnit>,
    /// Units that no longer match their call (the tool was upgraded): `(unit, why)`.
    pub invalidate: Vec<UnitId>,
}

const OPEN_STEP: &str = "SELECT step, turn, assistant FROM open_steps WHERE session_id=?1";

/// Sends the first read of [`load_open_step`] ahead (see [`Connection::prefetch`]).
pub(crate) fn prefetch_open_step_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    Ok(c.prefetch(OPEN_STEP, [id])?)
}

/// The session's open step, if any.
pub fn load_open_step(c: &Connection, id: &str) -> Result<Option<OpenStep>, StoreError> {
    let head: Option<(i64, i64, String)> = c
        .prepare_cached(OPEN_STEP)?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((step, turn, assistant)) = head else { return Ok(None) };
    let calls = c
        .prepare_cached(
            "SELECT call_id, position, tool, input, component_digest, effect, status, result, error_kind,
                    changes, duration_ms, idempotent, approval_id, net, logs
             FROM tool_calls WHERE session_id=?1 AND step=?2 ORDER BY position",
        )?
        .query_map(params![id, step], |r| facts::journal_row(r, 0))?
        .collect::<Result<Vec<_>, _>>()?;
    let units = units_where(c, "session_id=?1 AND step=?2", &[&id, &step])?;
    Ok(Some(OpenStep { step, turn, assistant, calls, units }))
}

/// Opens a step: its assistant message and every call's journal row, one transaction with the
/// caller's other writes (evidence).
pub(crate) fn open_step_in(
    c: &Connection,
    id: &str,
    turn: i64,
    step: i64,
    assistant: &str,
    entries: &[JournalEntry],
) -> Result<(), StoreError> {
    c.prepare_cached(
        "INSERT INTO open_steps (session_id, step, turn, assistant, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![id, step, turn, assistant, now_ms()])?;
    for e in entries {
        calls::record_in(c, id, step, e)?;
    }
    Ok(())
}

fn consumed_row(unit: &str, r: &crate::sql::Row<'_>) -> crate::sql::Result<ConsumedApproval> {
    Ok(ConsumedApproval::new(unit.into(), r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
}

/// Writes journal rows of an open step; with `consume`, first consumes that approval (it must
/// still be `approved`: an approval is used once) and returns the proof of it.
pub(crate) fn progress_in(
    c: &Connection,
    id: &str,
    step: i64,
    entries: &[JournalEntry],
    consume: Option<&str>,
) -> Result<Option<ConsumedApproval>, StoreError> {
    let mut consumed = None;
    if let Some(unit) = consume {
        consumed = c
            .prepare_cached(
                "UPDATE approvals SET status='consumed', consumed_at=?3
                 WHERE id=?1 AND session_id=?2 AND status='approved'
                 RETURNING call_id, tool, input_digest, component_digest",
            )?
            .query_row(params![unit, id, now_ms()], |r| consumed_row(unit, r))
            .optional()?;
        if consumed.is_none() {
            return Err(StoreError::Conflict(format!(
                "approval `{unit}` is no longer usable (it was consumed, cancelled or replaced)"
            )));
        }
    }
    for e in entries {
        calls::record_in(c, id, step, e)?;
    }
    Ok(consumed)
}

/// The approval `unit` of session `id` that call `call_id` consumed before its process
/// stopped (the call runs again because it is idempotent); `None` when there is no such unit.
pub fn consumed_by(
    c: &Connection,
    id: &str,
    unit: &str,
    call_id: &str,
) -> Result<Option<ConsumedApproval>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT call_id, tool, input_digest, component_digest FROM approvals
         WHERE id=?1 AND session_id=?2 AND call_id=?3 AND status='consumed'",
    )?
    .query_row(params![unit, id, call_id], |r| consumed_row(unit, r))
    .optional()?)
}

/// Stops an open step to wait for approvals: journal rows, new units, invalidated units, and
/// the `waiting_approval` state — one transaction.
pub(crate) fn wait_in(c: &Connection, id: &str, w: &WaitCommit) -> Result<(), StoreError> {
    for e in &w.entries {
        calls::record_in(c, id, w.step, e)?;
    }
    for unit in &w.invalidate {
        c.prepare_cached(
            "UPDATE approvals SET status='invalidated', decision_reason=COALESCE(decision_reason, '')
                 || ' [invalidated: the tool changed since the decision]'
             WHERE id=?1 AND session_id=?2 AND status IN ('pending', 'approved')",
        )?
        .execute(params![unit, id])?;
    }
    for u in &w.new_units {
        c.prepare_cached(&format!(
            "INSERT INTO approvals ({UNIT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, NULL, NULL, NULL, NULL, ?15)"
        ))?
        .execute(params![
            u.id,
            id,
            u.step,
            u.call_id,
            u.result_id,
            u.tool,
            u.effect,
            u.component_digest,
            u.input,
            u.input_digest,
            to_json(&u.grants)?,
            u.why,
            ApprovalStatus::Pending,
            u.created_at,
            (!u.net.is_empty()).then(|| to_json(&u.net)).transpose()?
        ])?;
        super::events::append(
            c,
            id,
            &super::events::SessionEvent::ApprovalAsked {
                unit: u.id.clone(),
                tool: u.tool.clone(),
                call_id: u.call_id.clone(),
                subject: super::events::call_subject(&u.input),
            },
        )?;
    }
    let pending = units_where(c, "session_id=?1 AND status='pending'", &[&id])?;
    let detail = match pending.as_slice() {
        [] => None,
        [u] => Some(format!("waiting for approval {} ({})", u.id, u.tool)),
        many => Some(format!(
            "waiting for {} approvals: {}",
            many.len(),
            many.iter().map(|u| u.id.as_str()).collect::<Vec<_>>().join(", ")
        )),
    };
    facts::set_state(c, id, RuntimeState::WaitingApproval, detail.as_deref())
}

/// What becomes of a journal row when the runner that wrote it is gone (a crash, or an
/// interrupted turn closed by another process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterCrash {
    /// Not started (`planned`, `waiting`), or finished (`done`, `unknown`): as it is.
    Keep,
    /// Started (`intent`) but safe to run again: read-only, or idempotent.
    Rerun,
    /// Started, side-effecting and not idempotent: it may have had its effect, so it never
    /// runs again and its outcome is unknown.
    OutcomeUnknown,
}

/// The one crash rule of a journal row with `status`, of a tool with effect class `effect`
/// (`None`: the tool was not resolved, so nothing ran).
pub fn after_crash(status: JournalStatus, effect: Option<Effect>, idempotent: bool) -> AfterCrash {
    if status != JournalStatus::Intent {
        AfterCrash::Keep
    } else if effect.is_some_and(|x| x != Effect::ReadOnly) && !idempotent {
        AfterCrash::OutcomeUnknown
    } else {
        AfterCrash::Rerun
    }
}

impl JournalEntry {
    /// [`after_crash`] of this row.
    pub fn after_crash(&self) -> AfterCrash {
        after_crash(self.status, self.effect, self.idempotent)
    }
}

/// Marks a started, side-effecting, non-idempotent call as `unknown`.
pub(super) fn mark_unknown(e: &mut JournalEntry) {
    e.status = JournalStatus::Unknown;
    e.result = Some(error_content(FailureKind::OutcomeUnknown, OUTCOME_UNKNOWN));
    e.error_kind = Some(FailureKind::OutcomeUnknown);
}

/// Closes the session's turn as interrupted: every call of its open step that has no result
/// gets one (calls that never started: "not run"; calls that started and may have had an
/// effect: "outcome unknown"), the step commits as complete pairs, its open approvals are
/// cancelled, and the session becomes `interrupted`. Returns how many calls were closed.
pub(crate) fn close_turn_in(c: &Connection, id: &str, why: &str) -> Result<usize, StoreError> {
    let mut closed = 0;
    if let Some(open) = load_open_step(c, id)? {
        let mut results = Vec::new();
        for mut e in open.calls {
            let finished = matches!(e.status, JournalStatus::Done | JournalStatus::Unknown);
            match (finished, e.after_crash()) {
                (true, _) => {}
                (false, AfterCrash::OutcomeUnknown) => {
                    mark_unknown(&mut e);
                    closed += 1;
                    calls::record_in(c, id, open.step, &e)?;
                }
                (false, AfterCrash::Keep | AfterCrash::Rerun) => {
                    e.status = JournalStatus::Done;
                    e.result = Some(error_content(
                        FailureKind::Interrupted,
                        &format!("{why} before this call ran; it was not run"),
                    ));
                    e.error_kind = Some(FailureKind::Interrupted);
                    closed += 1;
                    calls::record_in(c, id, open.step, &e)?;
                }
            }
            results.push(
                json!({"role": "tool", "tool_call_id": e.call_id, "content": e.result.unwrap_or_default()})
                    .to_string(),
            );
        }
        facts::append_message(c, id, open.turn, "assistant", &open.assistant)?;
        for r in &results {
            facts::append_message(c, id, open.turn, "tool", r)?;
        }
        c.prepare_cached("DELETE FROM open_steps WHERE session_id=?1")?.execute([id])?;
        c.prepare_cached(
            "UPDATE approvals SET status='cancelled', decision_reason=COALESCE(decision_reason, ?2)
             WHERE session_id=?1 AND status IN ('pending', 'approved')",
        )?
        .execute(params![id, why])?;
    }
    facts::set_state(c, id, RuntimeState::Interrupted, Some(why))?;
    Ok(closed)
}

#[cfg(test)]
mod crash_rule {
    use super::{AfterCrash, Effect, JournalStatus, after_crash};

    #[test]
    fn only_a_started_side_effecting_call_that_is_not_idempotent_has_an_unknown_outcome() {
        use JournalStatus::*;
        for &status in JournalStatus::ALL.iter().filter(|s| **s != Intent) {
            for effect in [None, Some(Effect::ReadOnly), Some(Effect::External)] {
                assert_eq!(after_crash(status, effect, false), AfterCrash::Keep, "{status}");
            }
        }
        assert_eq!(after_crash(Intent, Some(Effect::ReadOnly), false), AfterCrash::Rerun);
        assert_eq!(after_crash(Intent, None, false), AfterCrash::Rerun);
        for &effect in &Effect::ALL[1..] {
            assert_eq!(after_crash(Intent, Some(effect), true), AfterCrash::Rerun);
            assert_eq!(after_crash(Intent, Some(effect), false), AfterCrash::OutcomeUnknown);
        }
    }
}
