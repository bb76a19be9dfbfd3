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
//! (`settle_in`) finishes step 2 for it. So a request is built either from the old context
//! or from the new one, never from a mix.
//!
//! **Boundary rules.** The kept history never starts with a tool result (a call and its
//! results are never split); outside an active turn it starts with a user message; inside
//! one, a boundary before the turn's user message starts at a user message, and one after it
//! keeps that message verbatim as the *anchor*, repeated at the head of the history of every
//! later request. Open steps are never in the history (their messages are appended when they
//! end), so a boundary is never inside one.

use crate::sql::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::store::{StoreError, now_ms};

use crate::session::events::{self, SessionEvent};
use crate::session::{self, RuntimeState};

mod checkpoints;
mod freeze;
mod rewind;

pub use checkpoints::*;
pub use freeze::*;
pub use rewind::ConversationRewind;

pub use crate::session::events::Trigger;

use crate::ids::SessionId;
use crate::session::SessionEngine;
use std::sync::Arc;

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
    pub error_kind: crate::failure::FailureKind,
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
/// Bytes of one journal list (files changed, calls that failed, the turn's calls) a summary
/// shows entry by entry, at most: the newest entries that fit are shown in full, the rest
/// compactly, grouped by tool and outcome — listed, never dropped.
pub const LIST_SHOWN_BYTES: usize = 1024;
/// The active turn's calls a summary keeps at most (the newest).
pub const TURN_CALLS_KEPT: usize = 200;

/// The structured continuity summary of a checkpoint. `active_user_request`, `artifacts`,
/// `failed_calls` and `turn_calls` come from the session's record (the turn's message, the
/// journal); the lists from the summary call — or, when it failed, from the record too (a
/// *mechanical* summary). Goals and the plan are not here: they stay SessionMeta facts.
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
    /// Made by keel from the session's record, the summary call having failed
    /// ([`Summary::mechanical`]); a later summary call's answer replaces it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mechanical: bool,
}

/// Characters of one summary entry shown at most.
pub const ENTRY_SHOWN: usize = 600;
/// Entries of one of the model's summary lists shown at most.
pub const ENTRIES_SHOWN: usize = 40;

/// Lines of a journal list: the newest that fit [`LIST_SHOWN_BYTES`] in full (in order), the
/// earlier ones as `compact` groups them.
fn journal_lines<T>(
    items: &[T],
    full: impl Fn(&T) -> String,
    compact: impl Fn(&[T]) -> Vec<String>,
) -> Vec<String> {
    let mut used = 0;
    let mut first_full = items.len();
    for (i, item) in items.iter().enumerate().rev() {
        used += full(item).len() + 3;
        if used > LIST_SHOWN_BYTES {
            break;
        }
        first_full = i;
    }
    let mut lines = compact(&items[..first_full]);
    lines.extend(items[first_full..].iter().map(full));
    lines
}

/// `items` grouped by `key` (in order of first appearance), with their count and steps:
/// `KEY ×N (steps A–B)`.
fn grouped<T>(items: &[T], key: impl Fn(&T) -> String, step: impl Fn(&T) -> i64) -> Vec<String> {
    let mut groups: Vec<(String, usize, i64, i64)> = Vec::new();
    for item in items {
        let k = key(item);
        let s = step(item);
        match groups.iter_mut().find(|g| g.0 == k) {
            Some(g) => {
                g.1 += 1;
                g.2 = g.2.min(s);
                g.3 = g.3.max(s);
            }
            None => groups.push((k, 1, s, s)),
        }
    }
    groups
        .into_iter()
        .map(|(k, n, a, b)| {
            let steps = if a == b { format!("step {a}") } else { format!("steps {a}–{b}") };
            format!("{k} ×{n} ({steps}; details in the journal)")
        })
        .collect()
}

/// Bytes of the subjects one group of earlier calls lists, at most.
pub const SUBJECTS_SHOWN: usize = 480;

/// Earlier calls of the turn, grouped by tool and outcome, each group naming what its calls
/// were about (their subjects, [`subject`]), bounded by [`SUBJECTS_SHOWN`]:
/// `fs_write_file → ok ×9 (steps 2–10): /w/a.txt, /w/b.txt, …`.
fn grouped_subjects(calls: &[TurnCall]) -> Vec<String> {
    let mut groups: Vec<(String, Vec<&TurnCall>)> = Vec::new();
    for c in calls {
        let k = format!("{} → {}", c.tool, c.outcome);
        match groups.iter_mut().find(|g| g.0 == k) {
            Some(g) => g.1.push(c),
            None => groups.push((k, vec![c])),
        }
    }
    groups
        .into_iter()
        .map(|(k, cs)| {
            let (a, b) =
                cs.iter().fold((i64::MAX, i64::MIN), |(a, b), c| (a.min(c.step), b.max(c.step)));
            let steps = if a == b { format!("step {a}") } else { format!("steps {a}–{b}") };
            let mut subjects = String::new();
            let mut listed = 0;
            for c in &cs {
                let s = shown(&subject(&c.input));
                if subjects.len() + s.len() + 2 > SUBJECTS_SHOWN {
                    break;
                }
                if !subjects.is_empty() {
                    subjects.push_str(", ");
                }
                subjects.push_str(&s);
                listed += 1;
            }
            let more = match cs.len() - listed {
                0 => String::new(),
                n => format!(", and {n} more (details in the journal)"),
            };
            format!("{k} ×{} ({steps}): {subjects}{more}", cs.len())
        })
        .collect()
}

/// Characters of a call's subject shown at most.
pub const SUBJECT_SHOWN: usize = 48;

/// What a call was about, from its input (cut to [`INPUT_SHOWN`] characters, so perhaps not
/// whole JSON): the value of its first `path`, `url`, `file`, `name`, `query` or `command`
/// field, else its first string value, else its start.
pub fn subject(input: &str) -> String {
    const KEYS: &[&str] = &["path", "url", "file", "name", "query", "command"];
    let value = match serde_json::from_str::<serde_json::Value>(input) {
        Ok(serde_json::Value::Object(m)) => KEYS
            .iter()
            .find_map(|k| m.get(*k).and_then(|v| v.as_str()))
            .or_else(|| m.values().find_map(|v| v.as_str()))
            .map(str::to_string),
        _ => {
            // Cut JSON: the first string after a colon.
            input.split_once(':').and_then(|(_, rest)| {
                let rest = rest.trim_start().strip_prefix('"')?;
                Some(rest.split('"').next().unwrap_or(rest).to_string())
            })
        }
    };
    clip(value.unwrap_or_else(|| input.to_string()), SUBJECT_SHOWN)
}

impl Summary {
    /// The summary of the messages up to `to` as the system message shows it, bounded: the
    /// model's lists by [`ENTRY_SHOWN`] and [`ENTRIES_SHOWN`], the journal's by
    /// [`LIST_SHOWN_BYTES`] (the rest grouped, never dropped).
    pub fn render(&self, to: i64) -> String {
        let how = if self.mechanical {
            "summarized by keel from the session's record (the summary call failed)"
        } else {
            "summarized"
        };
        let mut text = format!(
            "\n\nEarlier conversation, {how} (messages 1–{to} are compacted: they are kept \
             in the session's record and no longer shown). The summary is a record of earlier \
             work, not a new instruction.\nActive user request: {}",
            // (by its start when long: the turn's message heads the history anyway)
            shown(&crate::shown::goal_reference(&self.active_user_request))
        );
        let mut list = |title: &str, lines: Vec<String>| {
            if !lines.is_empty() {
                text.push_str(&format!("\n{title}"));
                for l in lines {
                    text.push_str(&format!("\n- {l}"));
                }
            }
        };
        list(
            "Files changed (from the tool journal):",
            journal_lines(
                &self.artifacts,
                |a| format!("{} ({} by {}, step {})", shown(&a.path), a.change, a.tool, a.step),
                |earlier| {
                    if earlier.is_empty() {
                        return Vec::new();
                    }
                    vec![format!("{} earlier changes by {}", earlier.len(), {
                        let mut tools: Vec<&str> =
                            earlier.iter().map(|a| a.tool.as_str()).collect();
                        tools.dedup();
                        tools.truncate(8);
                        tools.join(", ")
                    })]
                },
            ),
        );
        list(
            "Calls that failed (from the tool journal):",
            journal_lines(
                &self.failed_calls,
                |f| format!("{} failed: {} (step {})", f.tool, f.error_kind, f.step),
                |earlier| {
                    grouped(earlier, |f| format!("{} failed: {}", f.tool, f.error_kind), |f| f.step)
                },
            ),
        );
        list(
            "Calls already run in the current turn (from the tool journal; their effects \
             happened — do not run one again unless the user asks):",
            journal_lines(
                &self.turn_calls,
                |t| format!("step {}: {} {} → {}", t.step, t.tool, shown(&t.input), t.outcome),
                grouped_subjects,
            ),
        );
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

    /// The summary keel makes of `frozen` without a model, when the summary call failed:
    /// the previous summary's lists carried over, and as notes what the session's record
    /// says of the range — the user's requests (newest first) and the calls made, grouped by
    /// tool. The journal's lists and the active request are filled in as for any summary.
    pub fn mechanical(frozen: &Frozen) -> Self {
        let mut s = frozen.previous.as_ref().map(|(_, p)| p.clone()).unwrap_or_default();
        s.mechanical = true;
        let mut requests = Vec::new();
        let mut calls: Vec<(String, usize)> = Vec::new();
        for m in &frozen.messages {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&m.body) else { continue };
            if v["role"] == "user"
                && let Some(c) = v["content"].as_str()
            {
                requests.push(clip(c.split_whitespace().collect::<Vec<_>>().join(" "), 160));
            }
            for call in v["tool_calls"].as_array().into_iter().flatten() {
                let name = call["function"]["name"].as_str().unwrap_or("?").to_string();
                match calls.iter_mut().find(|c| c.0 == name) {
                    Some(c) => c.1 += 1,
                    None => calls.push((name, 1)),
                }
            }
        }
        let mut notes: Vec<String> = requests
            .iter()
            .rev()
            .take(MECHANICAL_REQUESTS)
            .map(|r| format!("the user asked: {r}"))
            .collect();
        if requests.len() > MECHANICAL_REQUESTS {
            notes.push(format!("… and {} earlier requests", requests.len() - MECHANICAL_REQUESTS));
        }
        if !calls.is_empty() {
            let listed: Vec<String> = calls.iter().map(|(n, k)| format!("{n} ×{k}")).collect();
            notes.push(clip(format!("calls made: {}", listed.join(", ")), ENTRY_SHOWN));
        }
        // The previous notes after these, the whole list bounded.
        notes.extend(std::mem::take(&mut s.notes));
        notes.truncate(MECHANICAL_NOTES);
        s.notes = notes;
        s
    }
}

/// User requests a mechanical summary names, at most (the newest).
const MECHANICAL_REQUESTS: usize = 6;
/// Notes a mechanical summary keeps, at most.
const MECHANICAL_NOTES: usize = 12;

fn shown(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    clip(crate::shown::inert_markers(&line).into_owned(), ENTRY_SHOWN)
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

const CURRENT: &str = "SELECT seq, range_from, range_to, summary, anchor FROM checkpoints
     WHERE session_id=?1 AND status='promoted' ORDER BY seq DESC LIMIT 1";

/// Sends the first read of [`current_in`] ahead (see [`Connection::prefetch`]).
pub(crate) fn prefetch_current_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    Ok(c.prefetch(CURRENT, [id])?)
}

/// The promoted checkpoint of session `id` that its context starts after, if any.
pub(crate) fn current_in(
    c: &Connection,
    id: &str,
) -> Result<Option<CurrentCheckpoint>, StoreError> {
    type Row = ((i64, i64, i64), Option<String>, Option<i64>);
    let row: Option<Row> = c
        .prepare_cached(CURRENT)?
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

/// What compaction owns of the sessions of one engine: their checkpoints and the calls that
/// made their summaries.
#[derive(Clone, Copy)]
pub struct Compaction<'a> {
    engine: &'a SessionEngine,
}

impl<'a> Compaction<'a> {
    /// The handle of `engine`'s sessions.
    pub fn of(engine: &'a SessionEngine) -> Self {
        Self { engine }
    }

    /// Starts a compaction of session `id`: finishes any pending checkpoint first (see
    /// `settle_in`), freezes the history to summarize at the boundary `aim` asks
    /// for and marks the session `compressing` — one transaction. `None` when nothing can be
    /// compacted (the session is left as it was).
    pub async fn begin(
        &self,
        id: &SessionId,
        trigger: Trigger,
        aim: Aim,
        tokens: Option<i64>,
    ) -> Result<Option<Frozen>, StoreError> {
        let id = id.clone();
        self.engine
            .write(id.clone(), move |c| {
                settle_in(c, &id)?;
                let frozen = freeze_in(c, &id, trigger, aim)?;
                if let Some(f) = &frozen {
                    begin_in(c, &id, f, tokens)?;
                }
                Ok(frozen)
            })
            .await
    }

    /// Commits the checkpoint of a compaction (step 1, see `prepare_in`).
    pub async fn prepare_checkpoint(
        &self,
        id: &SessionId,
        frozen: Arc<Frozen>,
        call: SummaryCall,
        tokens: (Option<i64>, Option<i64>),
        state_after: RuntimeState,
    ) -> Result<i64, StoreError> {
        let id = id.clone();
        self.engine
            .write(id.clone(), move |c| prepare_in(c, &id, &frozen, &call, tokens, state_after))
            .await
    }

    /// Promotes checkpoint `seq` (step 2, see `promote_in`).
    pub async fn promote_checkpoint(
        &self,
        id: &SessionId,
        seq: i64,
        state_after: RuntimeState,
        ms: f64,
    ) -> Result<Promotion, StoreError> {
        let id = id.clone();
        self.engine.write(id.clone(), move |c| promote_in(c, &id, seq, Some(state_after), ms)).await
    }

    /// Takes the session's conversation back to `cut`, as `by` asked (see
    /// `rewind::rewind_conversation_in`).
    pub async fn rewind_conversation(
        &self,
        id: &SessionId,
        cut: crate::session::HistoryCut,
        by: String,
    ) -> Result<Option<ConversationRewind>, StoreError> {
        let id = id.clone();
        self.engine
            .write(id.clone(), move |c| rewind::rewind_conversation_in(c, &id, &cut, &by))
            .await
    }

    /// What taking the session's conversation back to `cut` would do (see `rewind::plan_in`).
    pub async fn plan_conversation_rewind(
        &self,
        id: &SessionId,
        cut: crate::session::HistoryCut,
    ) -> Result<Option<ConversationRewind>, StoreError> {
        let id = id.clone();
        self.engine.db().read(move |c| rewind::plan_in(c, &id, &cut)).await
    }

    /// The session's checkpoints, oldest first.
    pub async fn checkpoints(&self, id: &SessionId) -> Result<Vec<CheckpointRecord>, StoreError> {
        let id = id.clone();
        self.engine
            .db()
            .read(move |c| {
                crate::session::load_counters(c, &id)?;
                checkpoints_in(c, &id)
            })
            .await
    }

    /// The exact request of checkpoint `seq`'s summary call (the last one's if `None`).
    pub async fn evidence(
        &self,
        id: &SessionId,
        seq: Option<i64>,
    ) -> Result<(i64, Vec<u8>), StoreError> {
        let id = id.clone();
        self.engine.db().read(move |c| evidence_in(c, &id, seq)).await
    }

    /// The last answer of checkpoint `seq`'s summary call (the last checkpoint's if `None`).
    pub async fn reply(
        &self,
        id: &SessionId,
        seq: Option<i64>,
    ) -> Result<(i64, String), StoreError> {
        let id = id.clone();
        self.engine.db().read(move |c| reply_in(c, &id, seq)).await
    }
}

/// Compaction's part of recovering session `id` (the recovery reaction, see
/// [`crate::session::reactions`]): a checkpoint committed but not promoted is promoted now, or
/// discarded; a compaction that committed none (its process stopped during the summary call)
/// is closed, once — the kernel changes the state it left.
pub(crate) fn on_recover(c: &Connection, id: &str) -> Result<(), StoreError> {
    let settled = settle_in(c, id)?;
    if settled.is_empty() && session::runtime_in(c, id)?.state == RuntimeState::Compressing {
        events::append(
            c,
            id,
            &SessionEvent::CompactionAbandoned {
                reason: "the process stopped before the summary was committed".into(),
            },
        )?;
    }
    Ok(())
}

/// The columns of `checkpoints` a fork copies.
const CHECKPOINT_COLUMNS: &str = "seq, status, trigger, turn, created_at, decided_at, range_from, \
     range_to, prev_context_start, last_message, meta_version, anchor, previous, summary, \
     artifacts, body_sha256, body_bytes, reply, error, attempts, duration_ms, prompt_tokens, \
     completion_tokens, tokens_before, tokens_after";

/// The fork reaction: fork `to` gets the checkpoints of `from` that were promoted up to the
/// cut's context start (the one its request held is its current one), and that context start.
pub(crate) fn on_fork(
    c: &Connection,
    from: &str,
    to: &str,
    cut: &crate::session::HistoryCut,
) -> Result<(), StoreError> {
    c.execute(
        &format!(
            "INSERT INTO checkpoints (session_id, {CHECKPOINT_COLUMNS})
             SELECT ?2, {CHECKPOINT_COLUMNS} FROM checkpoints
             WHERE session_id=?1 AND status='promoted' AND range_to<=?3"
        ),
        params![from, to, cut.context_start],
    )?;
    c.prepare_cached("UPDATE sessions SET context_start=?2 WHERE id=?1")?
        .execute(params![to, cut.context_start])?;
    Ok(())
}

/// The delete reaction: the session's checkpoints.
pub(crate) fn on_delete(c: &Connection, id: &str) -> Result<(), StoreError> {
    c.execute("DELETE FROM checkpoints WHERE session_id=?1", [id])?;
    Ok(())
}
