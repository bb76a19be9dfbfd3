//! The session row's floor: its lock, the error for a missing session, and the reading of a
//! stored JSON value. Every other file of the kernel stands on it.

use crate::sql::Connection;
use crate::store::StoreError;

/// Locks session `id`'s row for the rest of the caller's transaction (PostgreSQL's
/// `FOR UPDATE`): writes of one session from several hosts take their turn, so each numbers
/// its rows (events, messages, inputs …) after the last committed one. SQLite's store has one
/// writer, which already orders them; there this does nothing. Taken before any lease row;
/// taken once per transaction (the lock is held until it ends).
pub(crate) fn lock_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    if c.backend() == crate::sql::Backend::Postgres && c.first_in_transaction(&format!("lock {id}"))
    {
        // Sent without waiting: the server takes the lock before it runs the statements sent
        // after it, and a lock wait that times out fails the next one that waits.
        c.prepare_cached("SELECT 1 FROM sessions WHERE id=?1 FOR UPDATE")?.execute_pipelined([id])?;
    }
    Ok(())
}

/// The error of a session that does not exist.
pub(crate) fn no_session(id: &str) -> StoreError {
    StoreError::NotFound(format!("no session `{id}`; see `keel session list`"))
}

/// A stored JSON value (`what` names it in the error of an unreadable one).
pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    text: &str,
    what: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("stored {what} is unreadable: {e}")))
}
