//! Deleting a session: every fact of it, in one transaction — the kernel's rows here, each
//! feature's through the `on_delete` reaction (which may refuse, as a workgroup's does for a
//! session whose results another session's history holds). Content-addressed blobs stay
//! (another session may share them); a user's long-term memories stay (they are the user's).

use crate::sql::{Connection, OptionalExtension};
use crate::store::StoreError;

use super::row::no_session;
use super::state::RuntimeState;

/// The kernel's tables keyed by `session_id`, deleted before the session's row.
const KERNEL_TABLES: &[&str] = &[
    "approvals",
    "open_steps",
    "runner_leases",
    "tool_calls",
    "inbox",
    "messages",
    "session_grants",
    "session_events",
    "session_config",
];

/// Deletes session `id` and every fact of it. Refused while a turn runs.
pub(crate) fn delete_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    let state: String = c
        .prepare_cached("SELECT state FROM sessions WHERE id=?1")?
        .query_row([id], |r| r.get(0))
        .optional()?
        .ok_or_else(|| no_session(id))?;
    if state == RuntimeState::Running.as_str() {
        return Err(StoreError::Conflict(format!(
            "session `{}` is running a turn; interrupt it (or wait for it to end) before deleting it",
            id.escape_debug()
        )));
    }
    (super::reactions::get().on_delete)(c, id)?;
    super::preimages::delete_in(c, id)?;
    for table in KERNEL_TABLES {
        c.execute(&format!("DELETE FROM {table} WHERE session_id=?1"), [id])?;
    }
    c.execute("DELETE FROM sessions WHERE id=?1", [id])?;
    Ok(())
}
