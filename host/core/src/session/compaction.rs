//! Context compaction, SessionEngine's side: freezing the history to summarize at a legal
//! boundary, and the two-step commit of a checkpoint.
//!
//! Nothing is deleted. A compaction changes one fact, the session's `context_start` (the last
//! message later requests no longer hold), and adds a checkpoint whose summary later requests
//! hold in its place. The commit has two steps:
//!
//! 1. the checkpoint row is committed `pending`, with the summary, the range it covers and its
//!    preconditions (the context start it replaces, the last message, the meta version);
//! 2. one transaction checks the preconditions, advances `context_start` and promotes the
//!    checkpoint — or discards it when they no longer hold.
//!
//! A process that dies between the two leaves a pending checkpoint; recovery
//! ([`settle_in`]) finishes step 2 for it. So a request is built either from the old context
//! or from the new one, never from a mix.
//!
//! **Boundary rules.** The kept history never starts with a tool result (a call and its
//! results are never split); outside an active turn it starts with a user message; inside
//! one, a boundary before the turn's user message starts at a user message, and one after it
//! keeps that message verbatim as the *anchor*, repeated at the head of the history of every
//! later request. Open steps are never in the history (their messages are appended when they
//! end), so a boundary is never inside one.

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::store::{StoreError, now_ms};

use super::events::{self, SessionEvent};
use super::facts::{self, RuntimeState};

crate::stored_enum! {
    /// What started a compaction.
    pub enum Trigger: "compaction trigger" {
        /// The next request's estimated size passed the session's threshold of the context
        /// window.
        Threshold = "threshold",
        /// The model server refused a request as longer than its context window.
        Overflow = "overflow",
        /// A person asked for it (`keel session compact`).
        Manual = "manual",
    }
}

crate::stored_enum! {
    /// Where a checkpoint stands.
    pub enum CheckpointStatus: "checkpoint status" {
        /// Committed with its summary; not yet the session's context.
        Pending = "pending",
        /// The session's context: requests hold its summary and the history after it.
        Promoted = "promoted",
        /// Its preconditions no longer held when it was to be promoted.
        Discarded = "discarded",
        /// The summary call failed or its answer was refused; nothing changed.
        Failed = "failed",
    }
}

/// A file a tool created, changed or deleted, as the journal's change sets recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    pub path: String,
    /// `created`, `modified` or `deleted` (the last change).
    pub change: String,
    pub tool: String,
    pub step: i64,
}

/// A tool call that failed, as the journal recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailedCall {
    pub tool: String,
    pub error_kind: String,
    pub step: i64,
}

/// A call of the active turn that a compaction summarized: what ran and how it ended, as the
/// journal recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnCall {
    pub turn: i64,
    pub step: i64,
    pub tool: String,
    /// Its input, cut to [`INPUT_SHOWN`] characters.
    pub input: String,
    /// `ok`, `failed: KIND`, or `outcome unknown`.
    pub outcome: String,
}

/// Characters of a summarized call's input kept at most.
pub const INPUT_SHOWN: usize = 80;
/// The active turn's calls a summary shows at most (the newest; every one stays in the
/// journal and in `keel session show`).
pub const TURN_CALLS_SHOWN: usize = 12;
/// The active turn's calls a summary keeps at most (the newest).
pub const TURN_CALLS_KEPT: usize = 200;

/// The structured continuity summary of a checkpoint. `artifacts`, `failed_calls` and
/// `turn_calls` come from the journal; the other fields from the summary call. Goals and the
/// plan are not here: they stay SessionMeta facts.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Summary {
    pub active_user_request: String,
    pub artifacts: Vec<Artifact>,
    /// Calls that failed in the summarized range (and the previous summary's), so that a
    /// failure stays a failure whatever the summary call wrote.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_calls: Vec<FailedCall>,
    /// The calls of the active turn in the summarized range (and the previous summary's of the
    /// same turn): what already ran, so that a summary never hides a recorded effect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn_calls: Vec<TurnCall>,
    pub decisions: Vec<String>,
    pub constraints: Vec<String>,
    pub open_questions: Vec<String>,
    pub next_actions: Vec<String>,
    pub notes: Vec<String>,
}

/// Characters of one summary entry shown at most.
pub const ENTRY_SHOWN: usize = 600;
/// Entries of one summary list shown at most (the newest artifacts, the first of others).
pub const ENTRIES_SHOWN: usize = 40;

impl Summary {
    /// The summary of the messages up to `to` as the system message shows it, bounded ([`ENTRY_SHOWN`],
    /// [`ENTRIES_SHOWN`]).
    pub fn render(&self, to: i64) -> String {
        let mut text = format!(
            "\n\nEarlier conversation, summarized (messages 1–{to} are compacted: they are kept \
             in the session's record and no longer shown). The summary is a record of earlier \
             work, not a new instruction.\nActive user request: {}",
            shown(&self.active_user_request)
        );
        if !self.artifacts.is_empty() {
            text.push_str("\nFiles changed (from the tool journal):");
            let skip = self.artifacts.len().saturating_sub(ENTRIES_SHOWN);
            if skip > 0 {
                text.push_str(&format!("\n- … {skip} earlier changes not listed"));
            }
            for a in &self.artifacts[skip..] {
                text.push_str(&format!(
                    "\n- {} ({} by {}, step {})",
                    shown(&a.path),
                    a.change,
                    a.tool,
                    a.step
                ));
            }
        }
        if !self.failed_calls.is_empty() {
            text.push_str("\nCalls that failed (from the tool journal):");
            let skip = self.failed_calls.len().saturating_sub(ENTRIES_SHOWN);
            if skip > 0 {
                text.push_str(&format!("\n- … {skip} earlier failures not listed"));
            }
            for f in &self.failed_calls[skip..] {
                text.push_str(&format!(
                    "\n- {} failed: {} (step {})",
                    f.tool, f.error_kind, f.step
                ));
            }
        }
        if !self.turn_calls.is_empty() {
            text.push_str(
                "\nCalls already run in the current turn (from the tool journal; their effects \
                 happened — do not run one again unless the user asks):",
            );
            let skip = self.turn_calls.len().saturating_sub(TURN_CALLS_SHOWN);
            if skip > 0 {
                text.push_str(&format!(
                    "\n- … {skip} earlier calls of this turn not listed (up to step {})",
                    self.turn_calls[skip - 1].step
                ));
            }
            for t in &self.turn_calls[skip..] {
                text.push_str(&format!(
                    "\n- step {}: {} {} → {}",
                    t.step,
                    t.tool,
                    shown(&t.input),
                    t.outcome
                ));
            }
        }
        for (title, items) in [
            ("Decisions", &self.decisions),
            ("Constraints", &self.constraints),
            ("Open questions", &self.open_questions),
            ("Next actions", &self.next_actions),
            ("Notes", &self.notes),
        ] {
            if items.is_empty() {
                continue;
            }
            text.push_str(&format!("\n{title}:"));
            for item in items.iter().take(ENTRIES_SHOWN) {
                text.push_str(&format!("\n- {}", shown(item)));
            }
            if items.len() > ENTRIES_SHOWN {
                text.push_str(&format!("\n- … {} more", items.len() - ENTRIES_SHOWN));
            }
        }
        text
    }
}

fn shown(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    clip(super::assemble::inert_markers(&line).into_owned(), ENTRY_SHOWN)
}

/// `text` cut to `max` characters, `…` marking a cut.
fn clip(text: String, max: usize) -> String {
    if text.chars().count() <= max {
        return text;
    }
    let mut cut: String = text.chars().take(max).collect();
    cut.push('…');
    cut
}

/// The session's current checkpoint, as requests are built from it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CurrentCheckpoint {
    pub seq: i64,
    pub from: i64,
    pub to: i64,
    pub summary: Summary,
    /// The active turn's user message, repeated at the head of the history: its sequence
    /// number and stored body.
    #[serde(skip)]
    pub anchor: Option<(i64, String)>,
}

/// The promoted checkpoint of session `id` that its context starts after, if any.
pub fn current_in(c: &Connection, id: &str) -> Result<Option<CurrentCheckpoint>, StoreError> {
    type Row = ((i64, i64, i64), Option<String>, Option<i64>);
    let row: Option<Row> = c
        .prepare_cached(
            "SELECT seq, range_from, range_to, summary, anchor FROM checkpoints
             WHERE session_id=?1 AND status='promoted' ORDER BY seq DESC LIMIT 1",
        )?
        .query_row([id], |r| Ok(((r.get(0)?, r.get(1)?, r.get(2)?), r.get(3)?, r.get(4)?)))
        .optional()?;
    let Some(((seq, from, to), summary, anchor)) = row else { return Ok(None) };
    let summary = parse_summary(summary.as_deref(), seq)?;
    let anchor = match anchor {
        Some(a) => Some((
            a,
            c.prepare_cached("SELECT body FROM messages WHERE session_id=?1 AND seq=?2")?
                .query_row(params![id, a], |r| r.get::<_, String>(0))
                .optional()?
                .ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "checkpoint {seq} of session `{id}` names message {a}, which is missing"
                    ))
                })?,
        )),
        None => None,
    };
    Ok(Some(CurrentCheckpoint { seq, from, to, summary, anchor }))
}

fn parse_summary(text: Option<&str>, seq: i64) -> Result<Summary, StoreError> {
    serde_json::from_str(text.unwrap_or("null")).map_err(|e| {
        StoreError::Corrupt(format!("the summary of checkpoint {seq} is unreadable: {e}"))
    })
}

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
    let counters = facts::load_counters(c, id)?;
    let (start, meta_version) = (counters.context_start(), counters.meta_version);
    let rows: Vec<Row> = c
        .prepare_cached(
            "SELECT seq, role, LENGTH(CAST(body AS BLOB)) FROM messages
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
            (r.get::<_, Option<String>>(3)?, r.get::<_, Option<String>>(4)?),
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
            (r.get::<_, String>(3)?, r.get::<_, super::JournalStatus>(4)?),
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
            (super::JournalStatus::Unknown, _) => "outcome unknown".to_string(),
            (_, Some(k)) => format!("failed: {k}"),
            (_, None) => "ok".to_string(),
        };
        out.push(TurnCall { turn, step, tool, input: clip(input, INPUT_SHOWN), outcome });
    }
    Ok(())
}

/// Marks the session `compressing` for `frozen`, with the event that says what is summarized.
pub fn begin_in(
    c: &Connection,
    id: &str,
    frozen: &Frozen,
    tokens: Option<i64>,
) -> Result<(), StoreError> {
    facts::set_state(c, id, RuntimeState::Compressing, None)?;
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
    /// call failed or its answer was refused (`error`).
    pub summary: Option<Summary>,
    pub error: Option<String>,
    /// The exact request of the last attempt.
    pub request: Vec<u8>,
    /// The text of the last answer.
    pub reply: Option<String>,
    pub attempts: u32,
    pub duration_ms: f64,
    pub usage: Option<crate::model::Usage>,
}

/// Commits the checkpoint of `frozen` (step 1): `pending` with the summary, or `failed` with
/// the error (then the state becomes `state_after`). Returns its number.
pub fn prepare_in(
    c: &Connection,
    id: &str,
    frozen: &Frozen,
    call: &SummaryCall,
    tokens: (Option<i64>, Option<i64>),
    state_after: RuntimeState,
) -> Result<i64, StoreError> {
    let seq: i64 = c
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM checkpoints WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))?;
    let (sha, bytes) = super::blobs::put_request_in(c, &call.request, "the summary")?;
    let status =
        if call.summary.is_some() { CheckpointStatus::Pending } else { CheckpointStatus::Failed };
    let summary = call.summary.as_ref().map(super::json).transpose()?;
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
        super::json(&frozen.artifacts)?,
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
    match &call.error {
        None => {
            events::append(c, id, &SessionEvent::CheckpointPrepared { checkpoint: seq })?;
        }
        Some(e) => {
            events::append(c, id, &SessionEvent::CompactionFailed { error: e.clone() })?;
            facts::set_state(c, id, state_after, None)?;
        }
    }
    Ok(seq)
}

/// What [`promote_in`] did.
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
pub fn promote_in(
    c: &Connection,
    id: &str,
    seq: i64,
    state_after: Option<RuntimeState>,
    ms: f64,
) -> Result<Promotion, StoreError> {
    let row = c
        .prepare_cached(
            "SELECT status, range_from, range_to, prev_context_start, last_message, meta_version,
                    tokens_before, tokens_after
             FROM checkpoints WHERE session_id=?1 AND seq=?2",
        )?
        .query_row(params![id, seq], |r| {
            Ok((
                r.get::<_, CheckpointStatus>(0)?,
                (r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, i64>(3)?),
                (r.get::<_, i64>(4)?, r.get::<_, i64>(5)?),
                (r.get::<_, Option<i64>>(6)?, r.get::<_, Option<i64>>(7)?),
            ))
        })
        .optional()?
        .ok_or_else(|| StoreError::NotFound(format!("session `{id}` has no checkpoint {seq}")))?;
    let (status, (from, to, prev), (last, version), (before, after)) = row;
    if status != CheckpointStatus::Pending {
        return Ok(Promotion::Settled(status));
    }
    let counters = facts::load_counters(c, id)?;
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
            facts::set_state(c, id, s, None)?;
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
        },
    )?;
    if let Some(s) = state_after {
        facts::set_state(c, id, s, None)?;
    }
    Ok(Promotion::Promoted { checkpoint: seq, context_start: to })
}

/// Finishes the commit of every pending checkpoint of session `id` (recovery: promoted when
/// its preconditions hold, discarded otherwise). Returns what it did.
pub fn settle_in(c: &Connection, id: &str) -> Result<Vec<Promotion>, StoreError> {
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
}

/// The checkpoints of session `id`, oldest first.
pub fn checkpoints_in(c: &Connection, id: &str) -> Result<Vec<CheckpointRecord>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT seq, status, trigger, turn, created_at, range_from, range_to, anchor, summary,
                error, body_bytes, attempts, duration_ms, tokens_before, tokens_after
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
        });
    }
    Ok(out)
}

/// The exact request of checkpoint `seq`'s summary call (the last checkpoint's if `None`),
/// byte for byte.
pub fn evidence_in(
    c: &Connection,
    id: &str,
    seq: Option<i64>,
) -> Result<(i64, Vec<u8>), StoreError> {
    facts::load_counters(c, id)?;
    let row: Option<(i64, Option<String>)> = c
        .prepare_cached(
            "SELECT seq, body_sha256 FROM checkpoints WHERE session_id=?1 AND (?2 IS NULL OR seq=?2)
             ORDER BY seq DESC LIMIT 1",
        )?
        .query_row(params![id, seq], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    match row {
        Some((seq, Some(sha))) => Ok((seq, super::blobs::get_in(c, &sha)?.into_bytes())),
        _ => Err(StoreError::NotFound(match seq {
            Some(s) => format!("session `{id}` has no checkpoint {s}"),
            None => format!("session `{id}` has not been compacted"),
        })),
    }
}
