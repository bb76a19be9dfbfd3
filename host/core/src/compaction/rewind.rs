//! The conversation going back to a step: like a compaction, it changes where the model's
//! context starts, and deletes nothing. The messages the context held after the step are
//! appended again, and the context starts after the last message there was — so the messages
//! after the step leave the context (they stay in the store, and every request's evidence
//! still rebuilds), and the next turn continues from the step.

use super::*;

/// What a conversation rewind did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConversationRewind {
    /// The step the conversation went back to.
    pub to: i64,
    /// The messages that left the context.
    pub rewound_from: i64,
    pub rewound_to: i64,
    /// How many messages were appended again (the context at the step).
    pub resent: i64,
    /// The context now starts after this message.
    pub context_start: i64,
}

/// What taking session `id`'s conversation back to `cut` would do, read only: `None` when
/// nothing came after the step. Refused when a compaction after the step summarized what the
/// context held at it (forking the session at the step starts from that history).
pub(crate) fn plan_in(
    c: &Connection,
    id: &str,
    cut: &crate::session::HistoryCut,
) -> Result<Option<ConversationRewind>, StoreError> {
    let later: Option<i64> = c
        .prepare_cached(
            "SELECT MIN(seq) FROM checkpoints WHERE session_id=?1 AND status='promoted'
             AND range_to>?2",
        )?
        .query_row(params![id, cut.context_start], |r| r.get(0))?;
    if let Some(checkpoint) = later {
        return Err(StoreError::Conflict(format!(
            "session `{}` was compacted after step {} (checkpoint {checkpoint}): the context it \
             had then is summarized, so its conversation cannot go back there; fork it at that \
             step instead (keel session fork {} --at {})",
            id.escape_debug(),
            cut.step,
            id.escape_debug(),
            cut.step
        )));
    }
    let start = session::load_counters(c, id)?.context_start();
    let last: i64 = c
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))?;
    if last <= cut.seq && start == cut.context_start {
        return Ok(None);
    }
    Ok(Some(ConversationRewind {
        to: cut.step,
        rewound_from: start.max(cut.seq) + 1,
        rewound_to: last,
        resent: cut.seq - cut.context_start,
        context_start: last,
    }))
}

/// Takes session `id`'s conversation back to `cut`, recorded as `by`'s (a
/// `conversation_rewound` event): what [`plan_in`] says, done. Refused while a turn is in
/// progress.
pub(crate) fn rewind_conversation_in(
    c: &Connection,
    id: &str,
    cut: &crate::session::HistoryCut,
    by: &str,
) -> Result<Option<ConversationRewind>, StoreError> {
    settle_in(c, id)?;
    let Some(plan) = plan_in(c, id, cut)? else { return Ok(None) };
    let (last, resent_from, resent_to) =
        session::reappend_in(c, id, cut.context_start + 1, cut.seq)?;
    c.prepare_cached(
        "UPDATE sessions SET context_start=?2, meta_version=meta_version+1 WHERE id=?1",
    )?
    .execute(params![id, last])?;
    events::append(
        c,
        id,
        &SessionEvent::ConversationRewound {
            to: cut.step,
            rewound_from: plan.rewound_from,
            rewound_to: last,
            resent_from,
            resent_to,
            context_start: last,
            by: by.to_string(),
        },
    )?;
    Ok(Some(ConversationRewind { rewound_to: last, context_start: last, ..plan }))
}
