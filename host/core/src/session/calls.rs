//! A call's row in the journal: the journal's one door. The journal writer
//! ([`super::facts::put_journal`]) writes the call's row only; [`record_in`] is what every
//! commit of a call's row goes through, and it hands a control call's requests to the owners
//! that apply them (the call-done reaction, see [`super::reactions`]).

use crate::sql::Connection;

use super::JournalEntry;
use crate::store::StoreError;

/// Writes call `e` of step `step` to the journal and, when it finished with control requests,
/// applies them in the same transaction.
pub(crate) fn record_in(
    c: &Connection,
    id: &str,
    step: i64,
    e: &JournalEntry,
) -> Result<(), StoreError> {
    super::facts::put_journal(c, id, step, e)?;
    if e.status == super::JournalStatus::Done && !e.control_requests.is_empty() {
        (super::reactions::get().on_call_done)(c, id, &e.call_id, &e.control_requests)?;
    }
    Ok(())
}
