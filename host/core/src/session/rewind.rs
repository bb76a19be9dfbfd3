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
                error_kind, changes, duration_ms, idempotent, approval_id, net, logs
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

/// Appends again, after the last message of session `id`, its messages `from..=to` (their turn
/// and role kept), for a conversation going back to where they ended; returns the last
/// message before and the new ones' first and last numbers. Refused while a turn is in
/// progress (running, or waiting for a decision): its next request would mix the two.
pub(crate) fn reappend_in(
    c: &Connection,
    id: &str,
    from: i64,
    to: i64,
) -> Result<(i64, i64, i64), StoreError> {
    super::lock_in(c, id)?;
    let runtime = super::runtime_in(c, id)?;
    if let Some(turn) = runtime.active_turn {
        return Err(StoreError::Conflict(format!(
            "session `{}` is in turn {turn} ({}); let it end, or interrupt it, before rewinding its conversation",
            id.escape_debug(),
            runtime.state.as_str()
        )));
    }
    let last: i64 = c
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))?;
    c.prepare_cached(
        "INSERT INTO messages (session_id, seq, turn, role, body, created_at)
         SELECT session_id, seq - ?2 + ?3, turn, role, body, ?5 FROM messages
         WHERE session_id=?1 AND seq>=?2 AND seq<=?4",
    )?
    .execute(params![id, from, last + 1, to, crate::store::now_ms()])?;
    Ok((last, last + 1, last + 1 + (to - from)))
}

/// A conversation rewind, as a session's timeline shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RewoundConversation {
    pub at_ms: i64,
    /// The step it went back to.
    pub to: i64,
    /// The messages that left the context.
    pub rewound_from: i64,
    pub rewound_to: i64,
    /// The messages the context held at the step, appended again.
    pub resent_from: i64,
    pub resent_to: i64,
    pub by: String,
}

/// The conversation rewinds of session `id`, oldest first.
pub(crate) fn conversation_rewinds_in(
    c: &Connection,
    id: &str,
) -> Result<Vec<RewoundConversation>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT at_ms, body FROM session_events WHERE session_id=?1
         AND kind='conversation_rewound' ORDER BY seq",
    )?;
    let rows: Vec<(i64, String)> =
        stmt.query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?;
    rows.into_iter()
        .map(|(at_ms, body)| match serde_json::from_str::<SessionEvent>(&body) {
            Ok(SessionEvent::ConversationRewound {
                to,
                rewound_from,
                rewound_to,
                resent_from,
                resent_to,
                by,
                ..
            }) => Ok(RewoundConversation {
                at_ms,
                to,
                rewound_from,
                rewound_to,
                resent_from,
                resent_to,
                by,
            }),
            _ => Err(StoreError::Corrupt(format!(
                "a conversation rewind of session `{id}` does not read"
            ))),
        })
        .collect()
}
