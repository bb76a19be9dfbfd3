//! Checkpoints: begun, prepared with the summary call's request, promoted, discarded or
//! failed, settled at recovery; their list and evidence.

use super::*;

/// Marks the session `compressing` for `frozen`, with the event that says what is summarized.
pub(crate) fn begin_in(
    c: &Connection,
    id: &str,
    frozen: &Frozen,
    tokens: Option<i64>,
) -> Result<(), StoreError> {
    session::set_state(c, id, RuntimeState::Compressing, None)?;
    events::append(
        c,
        id,
        &SessionEvent::CompactionStarted {
            trigger: frozen.trigger,
            from: frozen.prev_context_start + 1,
            to: frozen.to,
            tokens,
        },
    )?;
    Ok(())
}

/// What the summary call came to.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryCall {
    /// The summary, validated (its artifacts filled in from the journal); `None` when the
    /// call failed or its answer was refused (`error`) and no mechanical summary was made.
    pub summary: Option<Summary>,
    /// Why the call failed: with a summary, that summary is keel's mechanical one.
    pub error: Option<String>,
    /// The exact request of the last attempt.
    pub request: Vec<u8>,
    /// The text of the last answer.
    pub reply: Option<String>,
    pub attempts: u32,
    pub duration_ms: f64,
    pub usage: Option<crate::model::Usage>,
}

/// Commits the checkpoint of `frozen` (step 1): `pending` with the summary — a mechanical
/// one keeps the summary call's failure as its `error` — or `failed` with the error (then the
/// state becomes `state_after`). Returns its number.
pub(crate) fn prepare_in(
    c: &Connection,
    id: &str,
    frozen: &Frozen,
    call: &SummaryCall,
    tokens: (Option<i64>, Option<i64>),
    state_after: RuntimeState,
) -> Result<i64, StoreError> {
    crate::session::lock_in(c, id)?;
    let seq: i64 = c
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM checkpoints WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))?;
    let (sha, bytes) = crate::store::blobs::put_request_in(c, &call.request, "the summary")?;
    let status =
        if call.summary.is_some() { CheckpointStatus::Pending } else { CheckpointStatus::Failed };
    let summary = call.summary.as_ref().map(crate::store::json).transpose()?;
    c.prepare_cached(
        "INSERT INTO checkpoints (session_id, seq, status, trigger, turn, created_at, decided_at,
             range_from, range_to, prev_context_start, last_message, meta_version, anchor, previous,
             summary, artifacts, body_sha256, body_bytes, reply, error, attempts, duration_ms,
             prompt_tokens, completion_tokens, tokens_before, tokens_after)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
                 ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26)",
    )?
    .execute(params![
        id,
        seq,
        status,
        frozen.trigger,
        frozen.turn,
        now_ms(),
        (status == CheckpointStatus::Failed).then(now_ms),
        frozen.prev_context_start + 1,
        frozen.to,
        frozen.prev_context_start,
        frozen.last_message,
        frozen.meta_version,
        frozen.anchor,
        frozen.previous.as_ref().map(|p| p.0),
        summary,
        crate::store::json(&frozen.artifacts)?,
        sha,
        bytes,
        call.reply,
        call.error,
        call.attempts,
        call.duration_ms,
        call.usage.map(|u| u.prompt_tokens as i64),
        call.usage.map(|u| u.completion_tokens as i64),
        tokens.0,
        tokens.1,
    ])?;
    match (&call.summary, &call.error) {
        (Some(_), _) | (None, None) => {
            events::append(c, id, &SessionEvent::CheckpointPrepared { checkpoint: seq })?;
        }
        (None, Some(e)) => {
            events::append(c, id, &SessionEvent::CompactionFailed { error: e.clone() })?;
            session::set_state(c, id, state_after, None)?;
        }
    }
    Ok(seq)
}

/// What `promote_in` did.
#[derive(Debug, Clone, PartialEq)]
pub enum Promotion {
    /// The checkpoint is the session's context now: it starts after message `context_start`.
    Promoted { checkpoint: i64, context_start: i64 },
    /// Its preconditions no longer held; why.
    Discarded { checkpoint: i64, reason: String },
    /// It was not pending (promoted or discarded already): nothing to do.
    Settled(CheckpointStatus),
}

/// Step 2 of the commit of checkpoint `seq`: when its preconditions hold, advances the
/// context start and promotes it; otherwise discards it. `state_after` (if any) is set in the
/// same transaction. Applying it twice changes nothing the second time.
pub(crate) fn promote_in(
    c: &Connection,
    id: &str,
    seq: i64,
    state_after: Option<RuntimeState>,
    ms: f64,
) -> Result<Promotion, StoreError> {
    let row = c
        .prepare_cached(
            "SELECT status, range_from, range_to, prev_context_start, last_message, meta_version,
                    tokens_before, tokens_after, error
             FROM checkpoints WHERE session_id=?1 AND seq=?2",
        )?
        .query_row(params![id, seq], |r| {
            Ok((
                r.get::<_, CheckpointStatus>(0)?,
                (r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, i64>(3)?),
                (r.get::<_, i64>(4)?, r.get::<_, i64>(5)?),
                (r.get::<_, Option<i64>>(6)?, r.get::<_, Option<i64>>(7)?),
                r.get::<_, Option<String>>(8)?,
            ))
        })
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("session `{id}` has no checkpoint {seq}")))?;
    let (status, (from, to, prev), (last, version), (before, after), mechanical) = row;
    if status != CheckpointStatus::Pending {
        return Ok(Promotion::Settled(status));
    }
    let counters = session::load_counters(c, id)?;
    let last_now: i64 = c
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))?;
    let reason = if counters.context_start() != prev {
        Some(format!(
            "the context start moved from message {prev} to {} after the checkpoint was prepared",
            counters.context_start()
        ))
    } else if last_now != last {
        Some(format!(
            "the history changed after the checkpoint was prepared (last message {last}, now {last_now})"
        ))
    } else if counters.meta_version != version {
        Some(format!(
            "the session's settings changed after the checkpoint was prepared (version {version}, now {})",
            counters.meta_version
        ))
    } else {
        None
    };
    let now = now_ms();
    if let Some(reason) = reason {
        c.prepare_cached(
            "UPDATE checkpoints SET status='discarded', decided_at=?3, error=?4
             WHERE session_id=?1 AND seq=?2",
        )?
        .execute(params![id, seq, now, reason])?;
        events::append(
            c,
            id,
            &SessionEvent::CheckpointDiscarded { checkpoint: seq, reason: reason.clone() },
        )?;
        if let Some(s) = state_after {
            session::set_state(c, id, s, None)?;
        }
        return Ok(Promotion::Discarded { checkpoint: seq, reason });
    }
    c.prepare_cached(
        "UPDATE sessions SET context_start=?2, meta_version=meta_version+1 WHERE id=?1",
    )?
    .execute(params![id, to])?;
    c.prepare_cached(
        "UPDATE checkpoints SET status='promoted', decided_at=?3 WHERE session_id=?1 AND seq=?2",
    )?
    .execute(params![id, seq, now])?;
    events::append(
        c,
        id,
        &SessionEvent::Compacted {
            checkpoint: seq,
            from,
            to,
            context_start: to,
            tokens_before: before,
            tokens_after: after,
            ms,
            mechanical,
        },
    )?;
    if let Some(s) = state_after {
        session::set_state(c, id, s, None)?;
    }
    Ok(Promotion::Promoted { checkpoint: seq, context_start: to })
}

/// Finishes the commit of every pending checkpoint of session `id` (recovery: promoted when
/// its preconditions hold, discarded otherwise). Returns what it did.
pub(crate) fn settle_in(c: &Connection, id: &str) -> Result<Vec<Promotion>, StoreError> {
    let pending: Vec<i64> = c
        .prepare_cached(
            "SELECT seq FROM checkpoints WHERE session_id=?1 AND status='pending' ORDER BY seq",
        )?
        .query_map([id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    pending.into_iter().map(|seq| promote_in(c, id, seq, None, 0.0)).collect()
}

/// A checkpoint as `keel session show` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointRecord {
    pub seq: i64,
    pub status: CheckpointStatus,
    pub trigger: Trigger,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<i64>,
    pub created_at: i64,
    /// The messages it summarizes.
    pub from: i64,
    pub to: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anchor: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub request_bytes: i64,
    pub attempts: u32,
    pub duration_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_before: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_after: Option<i64>,
    /// The summary call's last answer, as the model wrote it (redacted): kept when it was
    /// refused too, to show why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
}

/// The checkpoints of session `id`, oldest first.
pub(crate) fn checkpoints_in(
    c: &Connection,
    id: &str,
) -> Result<Vec<CheckpointRecord>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT seq, status, trigger, turn, created_at, range_from, range_to, anchor, summary,
                error, body_bytes, attempts, duration_ms, tokens_before, tokens_after, reply
         FROM checkpoints WHERE session_id=?1 ORDER BY seq",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok((
            (r.get::<_, i64>(0)?, r.get::<_, CheckpointStatus>(1)?, r.get::<_, Trigger>(2)?),
            (
                r.get::<_, Option<i64>>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, i64>(5)?,
                r.get::<_, i64>(6)?,
            ),
            (
                r.get::<_, Option<i64>>(7)?,
                r.get::<_, Option<String>>(8)?,
                r.get::<_, Option<String>>(9)?,
            ),
            (
                r.get::<_, Option<i64>>(10)?,
                r.get::<_, Option<u32>>(11)?,
                r.get::<_, Option<f64>>(12)?,
            ),
            (r.get::<_, Option<i64>>(13)?, r.get::<_, Option<i64>>(14)?),
            r.get::<_, Option<String>>(15)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (
            (seq, status, trigger),
            (turn, created_at, from, to),
            (anchor, summary, error),
            call,
            tokens,
            reply,
        ) = row?;
        out.push(CheckpointRecord {
            seq,
            status,
            trigger,
            turn,
            created_at,
            from,
            to,
            anchor,
            summary: summary.map(|s| parse_summary(Some(&s), seq)).transpose()?,
            error,
            request_bytes: call.0.unwrap_or(0),
            attempts: call.1.unwrap_or(0),
            duration_ms: call.2.unwrap_or(0.0),
            tokens_before: tokens.0,
            tokens_after: tokens.1,
            reply,
        });
    }
    Ok(out)
}

/// The last answer of checkpoint `seq`'s summary call (the last checkpoint's if `None`), as
/// the model wrote it (redacted): kept when it was refused too.
pub(crate) fn reply_in(
    c: &Connection,
    id: &str,
    seq: Option<i64>,
) -> Result<(i64, String), StoreError> {
    session::load_counters(c, id)?;
    let row: Option<(i64, Option<String>, Option<String>)> = c
        .prepare_cached(
            "SELECT seq, reply, error FROM checkpoints WHERE session_id=?1 AND (CAST(?2 AS BIGINT) IS NULL OR seq=?2)
             ORDER BY seq DESC LIMIT 1",
        )?
        .query_row(params![id, seq], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    match row {
        Some((seq, Some(reply), _)) => Ok((seq, reply)),
        Some((seq, None, error)) => Err(StoreError::NotFound(format!(
            "checkpoint {seq} of session `{id}` has no answer: its summary call got none ({})",
            error.as_deref().unwrap_or("no error recorded")
        ))),
        None => Err(StoreError::NotFound(match seq {
            Some(s) => format!("session `{id}` has no checkpoint {s}"),
            None => format!("session `{id}` has not been compacted"),
        })),
    }
}

/// The exact request of checkpoint `seq`'s summary call (the last checkpoint's if `None`),
/// byte for byte.
pub(crate) fn evidence_in(
    c: &Connection,
    id: &str,
    seq: Option<i64>,
) -> Result<(i64, Vec<u8>), StoreError> {
    session::load_counters(c, id)?;
    let row: Option<(i64, Option<String>)> = c
        .prepare_cached(
            "SELECT seq, body_sha256 FROM checkpoints WHERE session_id=?1 AND (CAST(?2 AS BIGINT) IS NULL OR seq=?2)
             ORDER BY seq DESC LIMIT 1",
        )?
        .query_row(params![id, seq], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match row {
        Some((seq, Some(sha))) => Ok((seq, crate::store::blobs::get_in(c, &sha)?.into_bytes())),
        _ => Err(StoreError::NotFound(match seq {
            Some(s) => format!("session `{id}` has no checkpoint {s}"),
            None => format!("session `{id}` has not been compacted"),
        })),
    }
}
