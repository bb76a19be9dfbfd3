//! A session's runtime: the inbox, turns (begin, resume, close), the state and the interrupt
//! flag, and the commits of a step (its open step, progress, waits, its end).

use crate::sql::{Connection, OptionalExtension, params};
use std::sync::Arc;

use super::events::{self, SessionEvent};
use super::facts::{self, RuntimeState};
use super::steps::{self, OpenStep, WaitCommit, close_turn_in};
use super::{JournalEntry, SessionEngine, calls};
use crate::ids::{SessionId, UnitId};
use crate::store::{StoreError, now_ms};
use crate::tools::ConsumedApproval;

/// The start of a turn: the input it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnStart {
    pub turn: i64,
    pub text: String,
    /// The runner lease the turn runs under: released in the commit that ends the turn when
    /// no input waits (see [`StepCommit::release_lease`]).
    pub lease: Option<Arc<str>>,
    /// Whether the turn's transition waits for the understanding call.
    pub understand: bool,
    /// Whether a runner takes the turn over from one that stopped, and the turn's next model
    /// call was not announced since (it is, again, when the turn resumes).
    pub resumed: bool,
}

/// What a runner that takes a turn over makes again (see [`SessionEngine::resume_turn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Again {
    /// The task-understanding call.
    Understanding,
    /// The next step's model call.
    ModelCall,
}

/// The kind of a workgroup event that is work for its receiver (a request): any other event in
/// a session's inbox is a notification.
pub(crate) const REQUEST_KIND: &str = "request";

const STATE: &str = "SELECT state FROM sessions WHERE id=?1";
const NEXT_INPUT: &str = "SELECT i.seq, i.text, e.kind FROM inbox i
     LEFT JOIN workgroup_events e ON e.id = i.event_id
     WHERE i.session_id=?1 AND i.consumed_at IS NULL ORDER BY i.seq LIMIT 1";

/// The turn start of [`SessionEngine::begin_turn`], for callers that compose it into a larger
/// transaction (the Brain takes the input, the runner lease and the turn in one).
pub(crate) fn begin_turn_in(c: &Connection, id: &str) -> Result<Option<TurnStart>, StoreError> {
    // An interrupted session takes no input until one is sent to it (which makes it
    // `preparing_context`): a stop that came before the turn began is not undone here.
    // The reads before the first write go to the server at once.
    c.prefetch(STATE, [id])?;
    c.prefetch(NEXT_INPUT, [id])?;
    super::config::prefetch_preprocess_in(c, id)?;
    let state: String = c.prepare_cached(STATE)?.query_row([id], |r| r.get(0))?;
    if state == RuntimeState::Interrupted.as_str() {
        return Ok(None);
    }
    let next: Option<(i64, String, Option<String>)> = c
        .prepare_cached(NEXT_INPUT)?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((seq, text, event_kind)) = next else { return Ok(None) };
    // A notification from another session of the workgroup is not a task: it bypasses task
    // understanding, as a main session's every input does (the main has none configured).
    let notification = event_kind.is_some_and(|k| k != REQUEST_KIND);
    let understand = !notification && super::config::preprocess_on(c, id)?;
    c.prepare_cached("UPDATE inbox SET consumed_at=?3 WHERE session_id=?1 AND seq=?2")?
        .execute_pipelined(params![id, seq, now_ms()])?;
    // The right-hand sides read the row as it was: the new turn is `turns + 1`.
    let turn: i64 = c
        .prepare_cached(
            "UPDATE sessions SET turns=turns+1, active_turn=turns+1, interrupt_requested=0,
             state='running', state_detail=NULL, meta_version=meta_version+1 WHERE id=?1
             RETURNING turns",
        )?
        .query_row([id], |r| r.get(0))?;
    let body = serde_json::json!({"role": "user", "content": text}).to_string();
    facts::append_message(c, id, turn, "user", &body)?;
    for e in [
        SessionEvent::TurnStarted { turn },
        SessionEvent::State { state: RuntimeState::Running, detail: None },
    ] {
        events::append(c, id, &e)?;
    }
    // With task understanding on, the runner makes the call and commits the transition
    // next; without it, the transition (the fixed table on no answer) commits here.
    if understand {
        events::append(c, id, &SessionEvent::UnderstandingStarted { turn, resumed: false })?;
    }
    (super::reactions::get().on_turn_begun)(c, id, turn, understand)?;
    Ok(Some(TurnStart { turn, text, lease: None, understand, resumed: false }))
}

/// The inbox append of [`SessionEngine::submit`], for callers that compose it into a larger
/// transaction (the Brain takes the runner lease in the same one). A session that is not
/// running shows `preparing_context` until its runner starts the turn.
pub(crate) fn submit_in(c: &Connection, id: &str, text: &str) -> Result<i64, StoreError> {
    inbox_in(c, id, text, None, true)
}

/// The inbox append of an event from another session of the workgroup (`event`: its id, which
/// the inbox row keeps, unique). A request is an input like any other; a notification (a
/// child's answer, question, failure …) waits in an interrupted session for the user.
pub(crate) fn submit_event_in(
    c: &Connection,
    id: &str,
    text: &str,
    event: &str,
    request: bool,
) -> Result<i64, StoreError> {
    inbox_in(c, id, text, Some(event), request)
}

fn inbox_in(
    c: &Connection,
    id: &str,
    text: &str,
    event: Option<&str>,
    wakes_interrupted: bool,
) -> Result<i64, StoreError> {
    if text.trim().is_empty() {
        return Err(StoreError::Input("an input must say something: this one is empty".into()));
    }
    crate::session::facts::lock_in(c, id)?;
    const NEXT_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) + 1 FROM inbox WHERE session_id=?1";
    facts::prefetch_counters_in(c, id)?;
    c.prefetch(NEXT_SEQ, [id])?;
    let runtime = crate::session::facts::runtime_in(c, id)?;
    let seq: i64 = c.prepare_cached(NEXT_SEQ)?.query_row([id], |r| r.get(0))?;
    c.prepare_cached(
        "INSERT INTO inbox (session_id, seq, text, created_at, event_id) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute_pipelined(params![id, seq, text, now_ms(), event])?;
    events::append(c, id, &SessionEvent::InputAccepted { inbox_seq: seq, text: text.to_string() })?;
    // A compaction in progress keeps its state; the input is taken after it.
    if runtime.active_turn.is_none()
        && !matches!(runtime.state, RuntimeState::Running | RuntimeState::Compressing)
        && (wakes_interrupted || runtime.state != RuntimeState::Interrupted)
    {
        let before = (runtime.state.as_str(), runtime.state_detail.as_deref(), runtime.active_turn);
        facts::set_state_from(c, id, before, RuntimeState::PreparingContext, None, None)?;
    }
    Ok(seq)
}

/// Everything one step commits at its end.
#[derive(Debug, Clone)]
pub struct StepCommit {
    pub turn: i64,
    pub step: i64,
    /// The assistant message, as sent back to the model in later requests.
    pub assistant: String,
    /// Tool result messages, in the model's order.
    pub results: Vec<String>,
    pub journal: Vec<JournalEntry>,
    /// A closing notice (loop guard) appended after the results.
    pub notice: Option<String>,
    pub state: RuntimeState,
    pub detail: Option<String>,
    /// Whether the step was open (its open-step record is removed in the same transaction).
    pub closes_open_step: bool,
    /// The runner lease to release in the same transaction when the step ends the turn
    /// (`idle`) and no input waits: the turn's last commit is also the runner's.
    pub release_lease: Option<Arc<str>>,
}

/// Commits a step (its request's evidence, when it has any to record, is written by request
/// assembly in the same transaction, which names the request's step as `request`); whether it
/// released the runner's lease.
pub(crate) fn commit_step_in(
    c: &Connection,
    id: &str,
    s: &StepCommit,
    request: Option<i64>,
) -> Result<bool, StoreError> {
    let notice = s
        .notice
        .as_ref()
        .map(|n| serde_json::json!({"role": "assistant", "content": n}).to_string());
    if s.results.is_empty() && s.journal.is_empty() && !s.closes_open_step {
        let text = serde_json::from_str::<serde_json::Value>(&s.assistant)
            .ok()
            .and_then(|v| v["content"].as_str().map(str::to_string))
            .unwrap_or_default();
        events::append(c, id, &SessionEvent::Answer { turn: s.turn, text })?;
    }
    if let Some(text) = &s.notice {
        events::append(c, id, &SessionEvent::Notice { text: text.clone() })?;
    }
    let messages = std::iter::once(("assistant", s.assistant.as_str()))
        .chain(s.results.iter().map(|r| ("tool", r.as_str())))
        .chain(notice.as_deref().map(|n| ("assistant", n)));
    facts::append_messages(c, id, s.turn, messages)?;
    for e in &s.journal {
        calls::record_in(c, id, s.step, e)?;
    }
    if s.closes_open_step {
        c.prepare_cached("DELETE FROM open_steps WHERE session_id=?1")?.execute([id])?;
    }
    facts::set_state_after(c, id, s.state, s.detail.as_deref(), request)?;
    let mut released = false;
    if let Some(owner) = &s.release_lease
        && s.state == RuntimeState::Idle
    {
        // The runner keeps its lease while inputs wait: it runs them next.
        if facts::pending_inputs(c, id)? == 0 {
            crate::session::lease::release_in(c, id, owner)?;
            released = true;
        }
    }
    if s.state == RuntimeState::Running {
        events::append(
            c,
            id,
            &SessionEvent::ModelCallStarted { step: s.step + 1, resumed: false },
        )?;
    }
    Ok(released)
}

impl SessionEngine {
    /// Appends an input to the durable inbox; returns its sequence number. Committed before
    /// anything runs.
    pub async fn submit(&self, id: &SessionId, text: &str) -> Result<i64, StoreError> {
        let (id, text) = (id.clone(), text.to_string());
        self.db.run(move |c| submit_in(c, &id, &text)).await
    }

    /// Takes the oldest unconsumed input: marks it consumed, appends it to history as the user
    /// message of a new turn and clears an interrupt request — and, for a session without
    /// task understanding, commits the turn's transition. One transaction.
    pub async fn begin_turn(&self, id: &SessionId) -> Result<Option<TurnStart>, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| begin_turn_in(c, &id)).await
    }

    /// Records that a runner took over turn `turn` of session `id` from one that stopped, and
    /// is about to make `again` once more: its `…_started` event (`resumed`), and for a model
    /// call the `running` state, in one transaction.
    pub async fn resume_turn(
        &self,
        id: &SessionId,
        turn: i64,
        again: Again,
    ) -> Result<(), StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| {
            let event = match again {
                Again::Understanding => SessionEvent::UnderstandingStarted { turn, resumed: true },
                Again::ModelCall => {
                    let runtime = crate::session::facts::runtime_in(c, &id)?;
                    if runtime.state != RuntimeState::Running {
                        facts::set_state(c, &id, RuntimeState::Running, None)?;
                    }
                    SessionEvent::ModelCallStarted { step: runtime.steps + 1, resumed: true }
                }
            };
            events::append(c, &id, &event).map(|_| ())
        })
        .await
    }

    /// Whether inputs are waiting in the inbox.
    pub async fn has_pending_input(&self, id: &SessionId) -> Result<bool, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| facts::pending_inputs(c, &id).map(|n| n > 0)).await
    }

    /// Sets the runtime state (with an optional detail shown to the user).
    pub async fn set_state(
        &self,
        id: &SessionId,
        state: RuntimeState,
        detail: Option<String>,
    ) -> Result<(), StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| facts::set_state(c, &id, state, detail.as_deref())).await
    }

    /// Records that the user asked to interrupt the session's running turn.
    pub async fn request_interrupt(&self, id: &SessionId) -> Result<RuntimeState, StoreError> {
        let id = id.clone();
        self.db
            .run(move |c| {
                let runtime = crate::session::facts::runtime_in(c, &id)?;
                c.execute("UPDATE sessions SET interrupt_requested=1 WHERE id=?1", [&id])?;
                Ok(runtime.state)
            })
            .await
    }

    /// Whether an interrupt was requested.
    /// A read (it never queues behind the writer): runners poll it often.
    pub async fn interrupt_requested(&self, id: &SessionId) -> Result<bool, StoreError> {
        let id = id.clone();
        self.db
            .read_inline(move |c| {
                Ok(c.prepare_cached("SELECT interrupt_requested FROM sessions WHERE id=?1")?
                    .query_row([&id], |r| r.get(0))?)
            })
            .await
    }

    /// Drops this process's fence of session `id`'s lease, which a commit released for `owner`.
    pub(crate) fn released(&self, id: &SessionId, owner: &str) {
        self.fences.drop_held(id.as_str(), owner);
    }

    /// The session's open step (committed, not finished), if any.
    pub async fn load_open_step(&self, id: &SessionId) -> Result<Option<OpenStep>, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| steps::load_open_step(c, &id)).await
    }

    /// Records progress of an open step (an intent before a side effect, a result after it);
    /// with `consume`, the approval the call uses is consumed in the same transaction.
    pub async fn commit_progress(
        &self,
        id: &SessionId,
        step: i64,
        entries: Vec<JournalEntry>,
        consume: Option<UnitId>,
    ) -> Result<Option<ConsumedApproval>, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| {
            steps::progress_in(c, &id, step, &entries, consume.as_deref())
        })
        .await
    }

    /// The proof of the approval `unit` that call `call_id` of session `id` consumed before its
    /// process stopped; `None` when the unit is not consumed by that call.
    pub async fn consumed_approval(
        &self,
        id: &SessionId,
        unit: &str,
        call_id: &str,
    ) -> Result<Option<ConsumedApproval>, StoreError> {
        let (id, unit, call_id) = (id.clone(), unit.to_string(), call_id.to_string());
        self.write(id.clone(), move |c| steps::consumed_by(c, &id, &unit, &call_id)).await
    }

    /// Persists the approval units of a blocked step and sets `waiting_approval`; the runner
    /// then exits.
    pub async fn commit_wait(&self, id: &SessionId, wait: WaitCommit) -> Result<(), StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| steps::wait_in(c, &id, &wait)).await
    }

    /// Closes the session's turn as interrupted (see `close_turn_in`).
    pub async fn close_turn(&self, id: &SessionId, why: &str) -> Result<usize, StoreError> {
        let (id, why) = (id.clone(), why.to_string());
        self.write(id.clone(), move |c| close_turn_in(c, &id, &why)).await
    }
}
