//! Where a compaction cuts: the legal boundary, the frozen range and what the journal says
//! of it (artifacts, failed calls, the active turn's calls).

use super::*;

/// What a compaction aims for, in bytes of stored messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Aim {
    /// Keep at most this much history (from the boundary on, the anchor included), choosing
    /// the earliest boundary that does; `None`: compact as much as is legal.
    pub keep_bytes: Option<i64>,
    /// Summarize at most this much (each message counted as the summary call is sent it,
    /// [`SENT_CAP`] at most); `None`: no bound.
    pub input_bytes: Option<i64>,
}

/// Bytes of one message's content the summary call is sent at most.
pub const SENT_CAP: i64 = 4096;

/// One message of the frozen range.
#[derive(Debug, Clone, PartialEq)]
pub struct FrozenMessage {
    pub seq: i64,
    pub body: String,
}

/// The history a compaction summarizes, frozen with the facts its commit checks.
#[derive(Debug, Clone, PartialEq)]
pub struct Frozen {
    pub trigger: Trigger,
    /// The active turn, if any.
    pub turn: Option<i64>,
    /// The context start this compaction replaces (the range starts after it).
    pub prev_context_start: i64,
    /// The boundary: the last message summarized (the new context start).
    pub to: i64,
    /// The last message of the history when it was frozen.
    pub last_message: i64,
    pub meta_version: i64,
    /// The active turn's user message, kept verbatim, when the boundary is after it.
    pub anchor: Option<i64>,
    /// The text of the active turn's user message.
    pub active_request: Option<String>,
    /// The checkpoint this one follows, and its summary.
    pub previous: Option<(i64, Summary)>,
    /// The messages summarized, as stored.
    pub messages: Vec<FrozenMessage>,
    /// Files changed: the previous summary's, then the range's, from the journal.
    pub artifacts: Vec<Artifact>,
    /// Calls that failed: the previous summary's, then the range's, from the journal.
    pub failed_calls: Vec<FailedCall>,
    /// The active turn's calls: the previous summary's of the same turn, then the range's.
    pub turn_calls: Vec<TurnCall>,
    /// Bytes of stored history the request held before, and holds after (anchor included).
    pub history_bytes: i64,
    pub kept_bytes: i64,
}

impl Frozen {
    /// The request a summary of this range states as the active one — set by keel, never by
    /// the model: the active turn's message; outside a turn the range's last user message;
    /// else the previous summary's.
    pub fn request(&self) -> String {
        if let Some(r) = &self.active_request {
            return r.clone();
        }
        self.messages
            .iter()
            .rev()
            .find_map(|m| {
                let v: serde_json::Value = serde_json::from_str(&m.body).ok()?;
                (v["role"] == "user").then(|| v["content"].as_str().map(str::to_string)).flatten()
            })
            .or_else(|| self.previous.as_ref().map(|(_, p)| p.active_user_request.clone()))
            .unwrap_or_default()
    }
}

struct Row {
    seq: i64,
    role: String,
    bytes: i64,
}

/// Freezes the history of session `id` to summarize, at the boundary `aim` asks for; `None`
/// when no legal boundary is after the context start (nothing can be compacted).
pub fn freeze_in(
    c: &Connection,
    id: &str,
    trigger: Trigger,
    aim: Aim,
) -> Result<Option<Frozen>, StoreError> {
    let counters = session::load_counters(c, id)?;
    let (start, meta_version) = (counters.context_start(), counters.meta_version);
    let rows: Vec<Row> = c
        .prepare_cached(
            "SELECT seq, role, octet_length(body) FROM messages
             WHERE session_id=?1 AND seq>?2 ORDER BY seq",
        )?
        .query_map(params![id, start], |r| {
            Ok(Row { seq: r.get(0)?, role: r.get(1)?, bytes: r.get(2)? })
        })?
        .collect::<Result<_, _>>()?;
    let Some(last) = rows.last().map(|r| r.seq) else { return Ok(None) };
    let turn = counters.active_turn();
    // The active turn's user message (it may be before the context start already).
    let user_msg: Option<(i64, String)> = match turn {
        Some(t) => c
            .prepare_cached(
                "SELECT seq, body FROM messages WHERE session_id=?1 AND turn=?2 AND role='user'
                 ORDER BY seq LIMIT 1",
            )?
            .query_row(params![id, t], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?,
        None => None,
    };
    // The active turn's last complete step (its assistant message; its results follow it) is
    // kept, as the anchor is: a request never hides the effect that just ran.
    let last_step: Option<i64> = match turn {
        Some(t) => c
            .prepare_cached(
                "SELECT MAX(seq) FROM messages WHERE session_id=?1 AND turn=?2 AND role='assistant'",
            )?
            .query_row(params![id, t], |r| r.get(0))?,
        None => None,
    };
    let anchor_bytes = user_msg.as_ref().map_or(0, |(_, b)| b.len() as i64);
    let total: i64 = rows.iter().map(|r| r.bytes).sum();
    // Candidates b (the last message summarized), with the bytes kept after b and the bytes
    // sent to summarize up to b.
    let mut legal: Vec<(usize, i64, i64)> = Vec::new();
    let (mut range, mut sent) = (0i64, 0i64);
    for (i, r) in rows.iter().enumerate() {
        range += r.bytes;
        sent += r.bytes.min(SENT_CAP + 256);
        let after_anchor = user_msg.as_ref().is_some_and(|(u, _)| r.seq >= *u);
        // Ending at the turn's user message itself keeps what ending just before it keeps
        // (the message, as the anchor instead of as history) and summarizes more: never.
        let at_anchor = user_msg.as_ref().is_some_and(|(u, _)| r.seq == *u);
        let before_last_step = last_step.is_none_or(|l| r.seq < l);
        let ok = !at_anchor
            && before_last_step
            && match rows.get(i + 1) {
                None => true,
                Some(next) if next.role == "tool" => false,
                Some(next) => after_anchor || next.role == "user",
            };
        if ok {
            let kept = total - range + if after_anchor { anchor_bytes } else { 0 };
            legal.push((i, kept, sent));
        }
    }
    let Some(&first) = legal.first() else { return Ok(None) };
    let fits: Vec<_> = legal
        .iter()
        .copied()
        .filter(|(_, _, s)| aim.input_bytes.is_none_or(|max| *s <= max))
        .collect();
    let chosen = match (fits.last(), aim.keep_bytes) {
        (None, _) => first,
        (Some(&max), None) => max,
        (Some(&max), Some(keep)) => {
            fits.iter().copied().find(|(_, k, _)| *k <= keep).unwrap_or(max)
        }
    };
    let (i, kept, _) = chosen;
    let to = rows[i].seq;
    let anchor = user_msg.as_ref().filter(|(u, _)| to >= *u).map(|(u, _)| *u);
    let messages: Vec<FrozenMessage> = c
        .prepare_cached(
            "SELECT seq, body FROM messages WHERE session_id=?1 AND seq>?2 AND seq<=?3 ORDER BY seq",
        )?
        .query_map(params![id, start, to], |r| Ok(FrozenMessage { seq: r.get(0)?, body: r.get(1)? }))?
        .collect::<Result<_, _>>()?;
    let current = current_in(c, id)?;
    // The current checkpoint's anchor is part of what requests hold now.
    let anchor_now =
        current.as_ref().and_then(|p| p.anchor.as_ref()).map_or(0, |a| a.1.len() as i64);
    let previous = current.map(|p| (p.seq, p.summary));
    let mut artifacts = previous.as_ref().map(|(_, s)| s.artifacts.clone()).unwrap_or_default();
    let mut failed_calls =
        previous.as_ref().map(|(_, s)| s.failed_calls.clone()).unwrap_or_default();
    let mut turn_calls: Vec<TurnCall> = previous
        .as_ref()
        .map(|(_, s)| s.turn_calls.iter().filter(|t| Some(t.turn) == turn).cloned().collect())
        .unwrap_or_default();
    journal_facts(c, id, &messages, &mut artifacts, &mut failed_calls)?;
    if let Some(t) = turn {
        turn_facts(c, id, t, (start, to), &mut turn_calls)?;
        let over = turn_calls.len().saturating_sub(TURN_CALLS_KEPT);
        turn_calls.drain(..over);
    }
    let active_request = user_msg.as_ref().map(|(_, body)| message_text(body));
    let history_bytes = total + anchor_now;
    Ok(Some(Frozen {
        trigger,
        turn,
        prev_context_start: start,
        to,
        last_message: last,
        meta_version,
        anchor,
        active_request,
        previous,
        messages,
        artifacts,
        failed_calls,
        turn_calls,
        history_bytes,
        kept_bytes: kept,
    }))
}

/// The text content of a stored message.
pub fn message_text(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["content"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Adds what the journal says of the calls answered in `messages`: the files they changed,
/// from their change sets (a path changed again replaces its earlier entry: its last change is
/// what holds), and the calls that failed.
fn journal_facts(
    c: &Connection,
    id: &str,
    messages: &[FrozenMessage],
    out: &mut Vec<Artifact>,
    failed: &mut Vec<FailedCall>,
) -> Result<(), StoreError> {
    let calls: std::collections::HashSet<String> = messages
        .iter()
        .filter_map(|m| serde_json::from_str::<serde_json::Value>(&m.body).ok())
        .filter(|v| v["role"] == "tool")
        .filter_map(|v| v["tool_call_id"].as_str().map(str::to_string))
        .collect();
    if calls.is_empty() {
        return Ok(());
    }
    let mut stmt = c.prepare_cached(
        "SELECT step, call_id, tool, changes, error_kind FROM tool_calls
         WHERE session_id=?1 AND (changes IS NOT NULL OR error_kind IS NOT NULL)
         ORDER BY step, position",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok((
            (r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?),
            (r.get::<_, Option<String>>(3)?, r.get::<_, Option<crate::failure::FailureKind>>(4)?),
        ))
    })?;
    for row in rows {
        let ((step, call_id, tool), (changes, error_kind)) = row?;
        if !calls.contains(&call_id) {
            continue;
        }
        if let Some(kind) = error_kind {
            failed.push(FailedCall { tool: tool.clone(), error_kind: kind, step });
        }
        let Some(changes) = changes else { continue };
        let Ok(set) = serde_json::from_str::<serde_json::Value>(&changes) else { continue };
        for change in ["created", "modified", "deleted"] {
            for entry in set[change].as_array().into_iter().flatten() {
                let Some(path) = entry["path"].as_str() else { continue };
                out.retain(|a| a.path != path);
                out.push(Artifact {
                    path: path.to_string(),
                    change: change.to_string(),
                    tool: tool.clone(),
                    step,
                });
            }
        }
    }
    Ok(())
}

/// Adds the calls of turn `turn` answered in messages `range` (after `.0`, up to `.1`), from
/// the journal: tool, input (cut), outcome. A call id the model used twice in the turn is
/// matched by its order.
fn turn_facts(
    c: &Connection,
    id: &str,
    turn: i64,
    range: (i64, i64),
    out: &mut Vec<TurnCall>,
) -> Result<(), StoreError> {
    use std::collections::HashMap;
    let mut skip: HashMap<String, usize> = HashMap::new();
    let mut take: HashMap<String, usize> = HashMap::new();
    let mut stmt = c.prepare_cached(
        "SELECT seq, body FROM messages WHERE session_id=?1 AND turn=?2 AND role='tool' AND seq<=?3",
    )?;
    let rows = stmt.query_map(params![id, turn, range.1], |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
    })?;
    for row in rows {
        let (seq, body) = row?;
        let Some(call) = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["tool_call_id"].as_str().map(str::to_string))
        else {
            continue;
        };
        *if seq <= range.0 { &mut skip } else { &mut take }.entry(call).or_default() += 1;
    }
    if take.is_empty() {
        return Ok(());
    }
    let mut stmt = c.prepare_cached(
        "SELECT t.step, t.call_id, t.tool, t.input, t.status, t.error_kind
         FROM tool_calls t JOIN evidence e ON e.session_id=t.session_id AND e.step=t.step
         WHERE t.session_id=?1 AND e.turn=?2 AND t.status IN ('done', 'unknown')
         ORDER BY t.step, t.position",
    )?;
    let rows = stmt.query_map(params![id, turn], |r| {
        Ok((
            (r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?),
            (r.get::<_, String>(3)?, r.get::<_, crate::session::JournalStatus>(4)?),
            r.get::<_, Option<String>>(5)?,
        ))
    })?;
    for row in rows {
        let ((step, call, tool), (input, status), kind) = row?;
        if let Some(n) = skip.get_mut(&call).filter(|n| **n > 0) {
            *n -= 1;
            continue;
        }
        let Some(n) = take.get_mut(&call).filter(|n| **n > 0) else { continue };
        *n -= 1;
        let outcome = match (status, kind) {
            (crate::session::JournalStatus::Unknown, _) => "outcome unknown".to_string(),
            (_, Some(k)) => format!("failed: {k}"),
            (_, None) => "ok".to_string(),
        };
        out.push(TurnCall { turn, step, tool, input: clip(input, INPUT_SHOWN), outcome });
    }
    Ok(())
}
