//! The plan of a session's phase: an append-only list of versions, one per accepted change.
//!
//! A control component's changes reach here with its call's result (see
//! [`crate::sandbox::control`]): `apply_in` applies them, with
//! [`plan::apply`], in the transaction that records that result — once
//! per call, however often the result is written. `task_complete` closes the phase: the phase
//! goal is cleared (it stays in the transition history) and its plan stops being shown.

use crate::sql::{Connection, OptionalExtension, params};
use serde::Serialize;

use crate::plan::{self, PlanRequest, PlanState, PlanStep};
use crate::store::{StoreError, now_ms};

use crate::session::events::{self, SessionEvent};

/// One version of a plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanVersion {
    pub version: i64,
    /// The turn that opened the phase the plan belongs to.
    pub phase_turn: i64,
    pub at_ms: i64,
    /// The change that made this version.
    pub change: PlanRequest,
    /// The plan after the change.
    pub steps: Vec<PlanStep>,
    /// Whether the change closed the phase.
    pub closed: bool,
    /// The call that asked for it.
    pub call_id: Option<String>,
}

fn corrupt(what: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(format!("a stored plan {what} is unreadable: {e}"))
}

/// The latest plan of the phase opened at turn `phase_turn`.
pub(crate) fn current_in(
    c: &Connection,
    id: &str,
    phase_turn: i64,
) -> Result<Option<Vec<PlanStep>>, StoreError> {
    let steps: Option<String> = c
        .prepare_cached(
            "SELECT steps FROM plan_versions WHERE session_id=?1 AND phase_turn=?2
             ORDER BY version DESC LIMIT 1",
        )?
        .query_row(params![id, phase_turn], |r| r.get(0))
        .optional()?;
    steps.map(|s| serde_json::from_str(&s).map_err(|e| corrupt("version", e))).transpose()
}

/// Applies the plan changes call `call_id` asked for, in order, unless that call's changes
/// are applied already. `phase` is the session's current phase (the task state's): the turn
/// that opened it and whether it has a goal; without one there is no plan to change. A change
/// the plan no longer allows (another call of the same step changed it first) is skipped.
pub(crate) fn apply_in(
    c: &Connection,
    id: &str,
    call_id: &str,
    requests: &[PlanRequest],
    phase: Option<(i64, bool)>,
) -> Result<(), StoreError> {
    let applied: bool = c
        .prepare_cached(
            "SELECT EXISTS(SELECT 1 FROM plan_versions WHERE session_id=?1 AND call_id=?2)",
        )?
        .query_row(params![id, call_id], |r| r.get(0))?;
    if applied || requests.is_empty() {
        return Ok(());
    }
    let Some((phase_turn, phase_open)) = phase else { return Ok(()) };
    let mut state = PlanState { steps: current_in(c, id, phase_turn)?, phase_open };
    for request in requests {
        if let Err(why) = plan::apply(&mut state, request) {
            tracing::debug!(call = call_id, %why, "a plan change was skipped");
            continue;
        }
        crate::session::lock_in(c, id)?;
        let version: i64 = c
            .prepare_cached(
                "SELECT COALESCE(MAX(version), 0) + 1 FROM plan_versions WHERE session_id=?1",
            )?
            .query_row([id], |r| r.get(0))?;
        let steps = state.steps.clone().unwrap_or_default();
        c.prepare_cached(
            "INSERT INTO plan_versions (session_id, version, phase_turn, at_ms, change, steps,
                 closed, call_id)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?
        .execute(params![
            id,
            version,
            phase_turn,
            now_ms(),
            crate::store::json(request)?,
            crate::store::json(&steps)?,
            !state.phase_open,
            call_id
        ])?;
        events::append(
            c,
            id,
            &SessionEvent::PlanChanged {
                version,
                change: request.kind().to_string(),
                steps: steps.len(),
                done: steps.iter().filter(|s| s.status == plan::StepStatus::Done).count(),
            },
        )?;
        if let PlanRequest::Complete { summary } = request {
            c.prepare_cached(
                "UPDATE session_config SET phase_goal=NULL, phase_turn=NULL WHERE session_id=?1",
            )?
            .execute([id])?;
            events::append(
                c,
                id,
                &SessionEvent::PhaseCompleted { phase_turn, summary: summary.trim().to_string() },
            )?;
            break;
        }
    }
    Ok(())
}

/// Every plan version of session `id`, oldest first.
pub(crate) fn history_in(c: &Connection, id: &str) -> Result<Vec<PlanVersion>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT version, phase_turn, at_ms, change, steps, closed, call_id
         FROM plan_versions WHERE session_id=?1 ORDER BY version",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok((
            (r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?),
            (r.get::<_, String>(3)?, r.get::<_, String>(4)?),
            (r.get::<_, bool>(5)?, r.get::<_, Option<String>>(6)?),
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let ((version, phase_turn, at_ms), (change, steps), (closed, call_id)) = row?;
        out.push(PlanVersion {
            version,
            phase_turn,
            at_ms,
            change: serde_json::from_str(&change).map_err(|e| corrupt("change", e))?,
            steps: serde_json::from_str(&steps).map_err(|e| corrupt("version", e))?,
            closed,
            call_id,
        });
    }
    Ok(out)
}
