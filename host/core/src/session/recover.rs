//! Recovering a session whose runner stopped: what the features left half done is settled
//! (their recovery reaction), then the open step's started calls and the direct calls are
//! settled and the session is given the state a runner resumes from.

use serde::Serialize;

use crate::ids::{CallId, SessionId};
use crate::sql::Connection;
use crate::store::StoreError;

use super::approvals::ApprovalStatus;
use super::facts::{self, RuntimeState};
use super::steps::{AfterCrash, JournalStatus, load_open_step, mark_unknown};
use super::{calls, direct};

/// What recovery found and did for one session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecoveredSession {
    pub id: SessionId,
    pub state_before: RuntimeState,
    pub state_after: RuntimeState,
    /// Calls whose outcome became "unknown" (side-effecting, not idempotent, started).
    pub outcome_unknown: Vec<CallId>,
    /// Calls that will run again (read-only or idempotent, started).
    pub rerun: Vec<CallId>,
    /// Whether a runner has work to do (a turn to resume or inputs to take).
    pub resumable: bool,
}

/// The detail shown for a session recovered after an unclean stop.
pub const RECOVERED_DETAIL: &str =
    "recovered after an unclean stop; the turn resumes when a runner takes the session";

/// Takes the runner lease of `id` for `owner` (see `lease::acquire_in`); when it takes it
/// from a runner that is gone, the session is recovered first, in the same transaction — so
/// whatever takes a session over (a turn submitted, a drain, a compaction, a direct call)
/// never resumes on the half-done work of a runner that died, whichever host's startup
/// recovery ran when. The fencing token it holds the lease with.
pub(crate) fn take_in(c: &Connection, id: &str, owner: &str) -> Result<Option<i64>, StoreError> {
    let Some(acquired) = super::lease::acquire_in(c, id, owner)? else { return Ok(None) };
    if acquired.from_gone {
        tracing::info!(session = id, "taking over a session whose runner is gone: recovering it first");
        recover_in(c, id)?;
    }
    Ok(Some(acquired.token))
}

/// Recovers one session whose runner is gone (the caller holds or has cleared its lease):
/// committed pairs stay; a started call of an open step that is read-only or idempotent will
/// run again; any other started call gets the "outcome unknown" result; a running session shows
/// `preparing_context` until a runner resumes it; waiting and interrupted sessions stay as they
/// are. Applying it twice changes nothing the second time.
pub(crate) fn recover_in(c: &Connection, id: &str) -> Result<RecoveredSession, StoreError> {
    // What the features left half done is settled first (a checkpoint committed but not
    // promoted is promoted or discarded; a compaction that committed none is closed).
    (super::reactions::get().on_recover)(c, id)?;
    let runtime = facts::runtime_in(c, id)?;
    let mut outcome_unknown = Vec::new();
    let mut rerun = Vec::new();
    let open = load_open_step(c, id)?;
    if let Some(open) = &open {
        for e in &open.calls {
            let mut e = e.clone();
            match e.after_crash() {
                AfterCrash::Keep => continue,
                AfterCrash::OutcomeUnknown => {
                    mark_unknown(&mut e);
                    outcome_unknown.push(e.call_id.clone());
                }
                AfterCrash::Rerun => {
                    e.status = JournalStatus::Planned;
                    rerun.push(e.call_id.clone());
                }
            }
            calls::record_in(c, id, open.step, &e)?;
        }
    }
    // Direct calls (a front-end's, without a model step) the stopped process left open.
    let direct = direct::recover_in(c, id, open.as_ref().map(|o| o.step))?;
    let had_direct = !direct.is_empty()
        || runtime.state_detail.as_deref().is_some_and(|d| d.starts_with("direct call"));
    outcome_unknown.extend(direct.into_iter().filter(|(_, unknown)| *unknown).map(|(id, _)| id));
    let state_after = match runtime.state {
        RuntimeState::Running | RuntimeState::WaitingApproval
            if had_direct && open.is_none() && runtime.active_turn.is_none() =>
        {
            facts::set_state(c, id, RuntimeState::Idle, Some(RECOVERED_DETAIL))?;
            RuntimeState::Idle
        }
        // A compaction outside a turn, or while a step waited for a decision, returns to
        // where it started.
        RuntimeState::Compressing if open.is_some() => {
            facts::set_state(c, id, RuntimeState::WaitingApproval, None)?;
            RuntimeState::WaitingApproval
        }
        RuntimeState::Compressing if runtime.active_turn.is_none() => {
            facts::set_state(c, id, RuntimeState::Idle, None)?;
            RuntimeState::Idle
        }
        RuntimeState::Running | RuntimeState::Compressing => {
            facts::set_state(c, id, RuntimeState::PreparingContext, Some(RECOVERED_DETAIL))?;
            RuntimeState::PreparingContext
        }
        s => s,
    };
    let inputs = facts::pending_inputs(c, id)?;
    let undecided =
        open.as_ref().is_some_and(|o| o.units.iter().any(|u| u.status == ApprovalStatus::Pending));
    let resumable = match state_after {
        RuntimeState::WaitingApproval => !undecided,
        RuntimeState::Interrupted | RuntimeState::Idle | RuntimeState::Failed => inputs > 0,
        _ => runtime.active_turn.is_some() || inputs > 0,
    };
    Ok(RecoveredSession {
        id: id.into(),
        state_before: runtime.state,
        state_after,
        outcome_unknown,
        rerun,
        resumable,
    })
}
