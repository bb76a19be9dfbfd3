//! The session's side of a rewind: the journal rows a rewind reads, the pre-images it puts
//! back, and the two events that make it a durable operation — `rewind_started` before the
//! first file is written, `rewound` after the last — so that a rewind cut short is seen (and
//! finished by running it again: each file is put back at most once, atomically).

use crate::sql::{Connection, OptionalExtension, params};
use crate::store::StoreError;

use super::events::{SessionEvent, append};
use super::facts::journal_row;
use super::state::RuntimeState;
use super::JournalEntry;

/// The journal rows of session `id` after step `step`, oldest first: (step, row).
pub(super) fn calls_after_in(
    c: &Connection,
    id: &str,
    step: i64,
) -> Result<Vec<(i64, JournalEntry)>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT step, call_id, position, tool, input, component_digest, effect, status, result,
                error_kind, changes, duration_ms, idempotent, approval_id, net
         FROM tool_calls WHERE session_id=?1 AND step>?2 ORDER BY step, position",
    )?;
    let rows = stmt.query_map(params![id, step], |r| Ok((r.get(0)?, journal_row(r, 1)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// A rewind that ended: the step it went back to, the session's last step when it ran, and
/// the paths it put back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastRewind {
    pub to: i64,
    pub after_step: i64,
    pub restored: Vec<String>,
}

/// The rewinds of session `id` that ended, oldest first.
pub(super) fn rewinds_in(c: &Connection, id: &str) -> Result<Vec<PastRewind>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT body FROM session_events WHERE session_id=?1 AND kind='rewound' ORDER BY seq",
    )?;
    let bodies: Vec<String> = stmt.query_map([id], |r| r.get(0))?.collect::<Result<_, _>>()?;
    bodies
        .into_iter()
        .map(|b| match serde_json::from_str::<SessionEvent>(&b) {
            Ok(SessionEvent::Rewound { to, after_step, restored, .. }) => {
                Ok(PastRewind { to, after_step, restored })
            }
            _ => Err(StoreError::Corrupt(format!("a rewind of session `{id}` does not read"))),
        })
        .collect()
}

/// The step of session `id`'s rewind that started and did not end, if any.
pub(crate) fn open_rewind_in(c: &Connection, id: &str) -> Result<Option<i64>, StoreError> {
    let last: Option<(String, String)> = c
        .prepare_cached(
            "SELECT kind, body FROM session_events
             WHERE session_id=?1 AND kind IN ('rewind_started', 'rewound')
             ORDER BY seq DESC LIMIT 1",
        )?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match last {
        Some((kind, body)) if kind == "rewind_started" => {
            match serde_json::from_str::<SessionEvent>(&body) {
                Ok(SessionEvent::RewindStarted { to, .. }) => Ok(Some(to)),
                _ => Err(StoreError::Corrupt(format!(
                    "a rewind of session `{id}` is recorded unreadably"
                ))),
            }
        }
        _ => Ok(None),
    }
}

/// Records that `by` begins rewinding session `id` to step `to` (`files` paths). Refused while
/// a turn runs (its tools could change the same files), and while another rewind, to another
/// step, is unfinished.
pub(super) fn begin_in(
    c: &Connection,
    id: &str,
    to: i64,
    files: usize,
    by: &str,
) -> Result<(), StoreError> {
    let state: String = c
        .prepare_cached("SELECT state FROM sessions WHERE id=?1")?
        .query_row([id], |r| r.get(0))
        .optional()?
        .ok_or_else(|| super::row::no_session(id))?;
    if state == RuntimeState::Running.as_str() || state == RuntimeState::PreparingContext.as_str()
    {
        return Err(StoreError::Conflict(format!(
            "session `{}` is running a turn; interrupt it (or wait for it to end) before rewinding it",
            id.escape_debug()
        )));
    }
    if let Some(open) = open_rewind_in(c, id)?
        && open != to
    {
        return Err(StoreError::Conflict(format!(
            "a rewind of session `{}` to step {open} was cut short: finish it first (keel session rewind {} --to {open})",
            id.escape_debug(),
            id.escape_debug()
        )));
    }
    append(c, id, &SessionEvent::RewindStarted { to, files, by: by.to_string() })?;
    Ok(())
}

/// Records the end of session `id`'s rewind.
pub(super) fn end_in(c: &Connection, id: &str, event: &SessionEvent) -> Result<(), StoreError> {
    append(c, id, event)?;
    Ok(())
}
