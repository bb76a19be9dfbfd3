//! The session's task state: its goal, the goal of its current phase, the turn that opened the
//! phase, and the phase's plan as it stands. Goals change only by a committed transition
//! (`transition.rs`), the plan only by a new version (`plan.rs`); read here.

use crate::sql::{Connection, OptionalExtension};
use serde::Serialize;

use crate::store::StoreError;

use crate::session::no_session;

/// A session's task state (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskState {
    pub session_goal: Option<String>,
    pub phase_goal: Option<String>,
    /// The turn whose transition set the current phase goal (`None`: no phase is open).
    pub phase_turn: Option<i64>,
    /// The plan of the current phase, as it stands (`None`: no phase, or no plan yet).
    pub plan: Option<Vec<crate::plan::PlanStep>>,
}

impl TaskState {
    /// The plan state the calls of a step see: the current plan, and whether a phase is open.
    pub fn plan_state(&self) -> crate::plan::PlanState {
        crate::plan::PlanState { steps: self.plan.clone(), phase_open: self.phase_goal.is_some() }
    }
}

const GOALS: &str =
    "SELECT session_goal, phase_goal, phase_turn FROM session_config WHERE session_id=?1";

/// Sends the first read of [`task_in`] ahead (see [`Connection::prefetch`]); the plan's
/// depends on it.
pub(crate) fn prefetch_task_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    Ok(c.prefetch(GOALS, [id])?)
}

/// The task state of session `id`.
pub(crate) fn task_in(c: &Connection, id: &str) -> Result<TaskState, StoreError> {
    let (session_goal, phase_goal, phase_turn) = c
        .prepare_cached(GOALS)?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?
        .ok_or_else(|| no_session(id))?;
    Ok(TaskState {
        session_goal,
        phase_goal,
        phase_turn,
        plan: match phase_turn {
            Some(t) => crate::preparation::plan::current_in(c, id, t)?,
            None => None,
        },
    })
}
