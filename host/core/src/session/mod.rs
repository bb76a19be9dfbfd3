//! SessionEngine: the session aggregate.
//!
//! Owns every session fact: SessionMeta (goals, loaded tools, policy, budget, model config,
//! runtime state, version counters), the append-only history, the durable inbox, the tool-call
//! journal, request evidence, and per-session grants. Each business operation below is one
//! transaction on the store's single writer; no other module writes these tables. It assembles
//! each model request from the current facts. It does not call the model or run tools.

mod assemble;
mod blobs;
mod calls;
pub mod capabilities;
pub mod compaction;
pub mod delegation;
mod direct;
mod discovery;
pub mod events;
mod facts;
pub mod lease;
pub mod plan;
mod steps;
pub mod transition;
mod views;
pub mod workgroup;

use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::ids::{CallId, UnitId};
use crate::model::ModelConfig;
use crate::sandbox::{Budget, Grant};
use crate::store::{Db, StoreError, now_ms};

pub use crate::policy::{Effect, Policy};
pub use crate::tools::ConsumedApproval;
pub use assemble::{
    Assembled, BYTES_PER_TOKEN, CallFacts, EvidenceOf, GOAL_SHOWN, ModelCallRecord, Part,
    RefusedRequest, TokenEstimate, estimate_tokens, goal_reference, reconstruct_body,
};
pub use delegation::SessionDelegation;
pub use direct::DIRECT_CALL_PREFIX;
pub use discovery::SessionDiscovery;
pub use events::{EventRow, SessionEvent};
pub use facts::{RuntimeState, SessionMeta, pending_inputs, plan_state, unsettled_in};
pub use steps::{
    AfterCrash, ApprovalStatus, ApprovalUnit, DecideError, Decision, JournalStatus,
    OUTCOME_UNKNOWN, OpenStep, RecoveredSession, WaitCommit, after_crash, close_turn_in,
    recover_in,
};
pub use views::{SessionSummary, Timeline, TimelineCall, TimelineMessage};

/// How a decision made on this machine (the CLI, or a library caller) names its decider: the
/// operating-system user.
pub fn local_decider() -> String {
    format!("local user {}", crate::memory::default_user())
}

/// What a new session starts with.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// Chosen id (letters, digits, `-`, `_`), or a generated one.
    pub id: Option<String>,
    pub grants: Vec<Grant>,
    /// Where the session's tools may send HTTP requests, and the secrets bound there.
    pub net: crate::sandbox::net::NetGrants,
    /// Tools loaded into the session (the only ones its model sees and may call).
    pub tools: Vec<String>,
    pub policy: Policy,
    pub budget: Budget,
    pub model: ModelConfig,
    pub system_prompt: String,
    /// The session's loop guards; `None` uses those of the harness that runs each turn.
    pub guards: Option<LoopGuards>,
    /// Settings of the task-understanding call; `None` turns it off (`--no-preprocess`).
    pub preprocess: Option<crate::understand::PreprocessConfig>,
    /// The user the session works for (its long-term memory is theirs); `None`: the
    /// operating-system user.
    pub user: Option<String>,
    /// Whether `tools` were named (`--tools`) rather than every installed tool: recorded as
    /// how each arrived.
    pub named_tools: bool,
    /// Who created the session over the HTTP API (`None`: a local front-end did).
    pub owner: Option<crate::caller::Owner>,
    /// The versions its tools run (tool → component digest), stored with the session in its
    /// creation transaction; a pin for a tool not in `tools` is dropped.
    pub pins: crate::tools::ToolPins,
}

/// The loop guards and bounds of a session's turns, stored with the session (a key missing
/// from a stored value takes its default). Counts too small to mean anything are raised where
/// a turn uses them ([`LoopGuards::normalized`]): a turn makes at least one model call, runs
/// at least one call at a time, stops at the earliest after one error, and a call is repeated
/// only from its second occurrence on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoopGuards {
    /// Model calls per turn at most.
    pub max_steps: u32,
    /// Occurrences in a row of the very same call (tool + arguments) that stop the turn (at
    /// least 2).
    pub max_repeats: u32,
    /// Tool errors in a row before the turn stops.
    pub max_consecutive_errors: u32,
    /// Read-only calls run at once.
    pub max_parallel: usize,
    /// Bytes of one tool result shown to the model; the rest is cut with a marker.
    pub result_cap: usize,
}

impl Default for LoopGuards {
    fn default() -> Self {
        Self {
            max_steps: 24,
            max_repeats: 3,
            max_consecutive_errors: 5,
            max_parallel: 4,
            result_cap: 16 * 1024,
        }
    }
}

impl LoopGuards {
    /// These guards with counts too small to mean anything raised.
    pub fn normalized(self) -> Self {
        Self {
            max_steps: self.max_steps.max(1),
            max_repeats: self.max_repeats.max(2),
            max_consecutive_errors: self.max_consecutive_errors.max(1),
            max_parallel: self.max_parallel.max(1),
            ..self
        }
    }
}

/// A journal row: one tool call of one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub call_id: CallId,
    pub position: i64,
    pub tool: String,
    pub input: String,
    pub component_digest: Option<String>,
    /// `None` when the tool could not be resolved (the call never ran).
    pub effect: Option<Effect>,
    pub status: JournalStatus,
    /// The content given to the model as the tool result.
    pub result: Option<String>,
    pub error_kind: Option<String>,
    pub changes: Option<String>,
    pub duration_ms: Option<f64>,
    /// Whether the tool declares that calling it twice equals calling it once.
    pub idempotent: bool,
    /// The approval consumed by this call, if the policy asked for one.
    pub approval_id: Option<UnitId>,
    /// The HTTP requests the call sent or was refused, as JSON records (method, host, port,
    /// path, status, bytes, time, outcome and reason; never bodies or headers). `None`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net: Option<String>,
    /// The changes a control call asked for (plan changes, skills and tools to load, facts to
    /// remember), applied when its result is committed (not stored with the row: the plan's
    /// versions, the session's capabilities and the memories keep them).
    #[serde(default, skip)]
    pub control_requests: Vec<crate::control::ControlRequest>,
}

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

/// The SessionEngine of one database.
#[derive(Clone)]
pub struct SessionEngine {
    db: Db,
    assembly: Arc<assemble::AssemblyCache>,
    stored: Arc<assemble::StoredParts>,
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl SessionEngine {
    pub fn new(db: Db) -> Self {
        Self { db, assembly: Arc::default(), stored: Arc::default() }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Creates a session with its grants, tools, policy and model.
    pub async fn create(&self, new: NewSession) -> Result<String, StoreError> {
        let id = checked_id(&new)?;
        let new = Arc::new(new);
        let id2 = id.clone();
        self.db.run(move |c| create_in(c, &id2, &new)).await?;
        Ok(id)
    }

    /// Creates a main session: `new` (without task understanding of its own: a main session
    /// routes) and its workgroup, with `limits` and the settings its sub-sessions get —
    /// `child_preprocess` and `new.tools` (the delegation tools among them) — in one
    /// transaction.
    pub async fn create_main(
        &self,
        new: NewSession,
        limits: workgroup::Limits,
        child_preprocess: Option<crate::understand::PreprocessConfig>,
    ) -> Result<String, StoreError> {
        limits.check().map_err(StoreError::Input)?;
        let id = checked_id(&new)?;
        let new = NewSession { id: Some(id.clone()), preprocess: None, ..new };
        let id2 = id.clone();
        self.db
            .run(move |c| {
                create_in(c, &id2, &new)?;
                workgroup::create_main_in(c, &id2, &limits, child_preprocess.as_ref(), &new.tools)
            })
            .await?;
        Ok(id)
    }

    /// Whether a session exists.
    pub async fn exists(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.db
            .read_inline(move |c| {
                Ok(c.prepare_cached("SELECT EXISTS(SELECT 1 FROM sessions WHERE id=?1)")?
                    .query_row([&id], |r| r.get(0))?)
            })
            .await
    }

    /// The session's meta facts, read inside a caller's transaction.
    pub fn load_meta_in(c: &Connection, id: &str) -> Result<SessionMeta, StoreError> {
        facts::load_meta(c, id)
    }

    /// The session's meta facts.
    pub async fn meta(&self, id: &str) -> Result<SessionMeta, StoreError> {
        let id = id.to_string();
        self.db.read_inline(move |c| facts::load_meta(c, &id)).await
    }

    /// Pins loaded tools to component digests: `pins` holds the digest each tool resolves to
    /// now. Without `upgrade` only tools not pinned yet are pinned (what a session loaded it
    /// keeps); with it every given pin replaces the old one. Returns the pins that changed,
    /// as (tool, old digest, new digest).
    pub async fn pin_tools(
        &self,
        id: &str,
        pins: std::collections::BTreeMap<String, String>,
        upgrade: bool,
    ) -> Result<Vec<(String, Option<String>, String)>, StoreError> {
        let id = id.to_string();
        self.db
            .run(move |c| {
                let meta = facts::load_meta(c, &id)?;
                let mut current = meta.tool_pins;
                let mut changed = Vec::new();
                for (tool, digest) in pins {
                    if !meta.loaded_tools.contains(&tool) {
                        continue;
                    }
                    let old = current.get(&tool).cloned();
                    if old.as_deref() == Some(digest.as_str()) || (old.is_some() && !upgrade) {
                        continue;
                    }
                    current.insert(tool.clone(), digest.clone());
                    changed.push((tool, old, digest));
                }
                if !changed.is_empty() {
                    c.execute(
                        "UPDATE session_config SET tool_pins=?2 WHERE session_id=?1",
                        params![id, json(&current)?],
                    )?;
                }
                Ok(changed)
            })
            .await
    }

    /// Adds tools to the session's loaded set (add-only, pinned): an admin's addition through
    /// AddSelectedCapabilities.
    pub async fn add_tools(&self, id: &str, tools: Vec<String>) -> Result<(), StoreError> {
        let selection = capabilities::Selection { tools, ..Default::default() };
        self.add_capabilities(id, selection, capabilities::Via::Admin).await.map(|_| ())
    }

    /// Appends an input to the durable inbox; returns its sequence number. Committed before
    /// anything runs.
    pub async fn submit(&self, id: &str, text: &str) -> Result<i64, StoreError> {
        let (id, text) = (id.to_string(), text.to_string());
        self.db.run(move |c| submit_in(c, &id, &text)).await
    }

    /// Takes the oldest unconsumed input: marks it consumed, appends it to history as the user
    /// message of a new turn and clears an interrupt request — and, for a session without
    /// task understanding, commits the turn's transition. One transaction.
    pub async fn begin_turn(&self, id: &str) -> Result<Option<TurnStart>, StoreError> {
        let id = id.to_string();
        self.db.run(move |c| begin_turn_in(c, &id)).await
    }

    /// Records that a runner took over turn `turn` of session `id` from one that stopped, and
    /// is about to make `again` once more: its `…_started` event (`resumed`), and for a model
    /// call the `running` state, in one transaction.
    pub async fn resume_turn(&self, id: &str, turn: i64, again: Again) -> Result<(), StoreError> {
        let id = id.to_string();
        self.db
            .run(move |c| {
                let event = match again {
                    Again::Understanding => {
                        SessionEvent::UnderstandingStarted { turn, resumed: true }
                    }
                    Again::ModelCall => {
                        let meta = facts::load_meta(c, &id)?;
                        if meta.state != RuntimeState::Running {
                            facts::set_state(c, &id, RuntimeState::Running, None)?;
                        }
                        SessionEvent::ModelCallStarted { step: meta.steps + 1, resumed: true }
                    }
                };
                events::append(c, &id, &event).map(|_| ())
            })
            .await
    }

    /// The session's active turn when its transition is not committed yet (the runner makes
    /// the understanding call, then [`commit_transition`](Self::commit_transition)).
    pub async fn pending_understanding(
        &self,
        id: &str,
    ) -> Result<Option<transition::PendingUnderstanding>, StoreError> {
        let id = id.to_string();
        self.db.read_inline(move |c| transition::pending_in(c, &id)).await
    }

    /// Commits turn `turn`'s transition (see [`transition::commit_in`]), with the recall of its
    /// capability preparation when it has one: `None` when it was committed already.
    pub async fn commit_transition(
        &self,
        id: &str,
        turn: i64,
        understood: transition::Understood,
        recalled: Option<capabilities::RecallRecord>,
    ) -> Result<Option<transition::Transition>, StoreError> {
        let id = id.to_string();
        self.db
            .run(move |c| transition::commit_in(c, &id, turn, &understood, recalled.as_ref()))
            .await
    }

    /// The active turn's transition when its capability preparation has not finished (see
    /// [`transition::unprepared_in`]).
    pub async fn unprepared(&self, id: &str) -> Result<Option<transition::Transition>, StoreError> {
        let id = id.to_string();
        self.db.read_inline(move |c| transition::unprepared_in(c, &id)).await
    }

    /// Records what recall found (see [`capabilities::record_recall_in`]) and, with `finish`,
    /// finishes the orchestration in the same commit (no call was needed).
    pub async fn record_recall(
        &self,
        id: &str,
        record: capabilities::RecallRecord,
        finish: Option<capabilities::OrchestratorCall>,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        self.db
            .run(move |c| {
                capabilities::record_recall_in(c, &id, &record)?;
                if let Some(call) = &finish {
                    capabilities::finish_in(c, &id, record.turn, call)?;
                }
                Ok(())
            })
            .await
    }

    /// Finishes turn `turn`'s orchestration: adds what was selected and applies the
    /// environment (see [`capabilities::finish_in`]).
    pub async fn finish_orchestration(
        &self,
        id: &str,
        turn: i64,
        call: capabilities::OrchestratorCall,
    ) -> Result<capabilities::Added, StoreError> {
        let id = id.to_string();
        self.db.run(move |c| capabilities::finish_in(c, &id, turn, &call)).await
    }

    /// AddSelectedCapabilities outside a turn (an admin's addition): add-only, pinned.
    pub async fn add_capabilities(
        &self,
        id: &str,
        selection: capabilities::Selection,
        via: capabilities::Via,
    ) -> Result<capabilities::Added, StoreError> {
        let id = id.to_string();
        self.db.run(move |c| capabilities::add_in(c, &id, &selection, via, None, None)).await
    }

    /// Unloads a tool or skill from session `id` (the explicit removal path).
    pub async fn unload(
        &self,
        id: &str,
        kind: capabilities::Kind,
        name: &str,
    ) -> Result<(), StoreError> {
        let (id, name) = (id.to_string(), name.to_string());
        self.db.run(move |c| capabilities::unload_in(c, &id, kind, &name)).await
    }

    /// The session's capabilities and how each arrived, and its orchestrations.
    pub async fn capabilities(
        &self,
        id: &str,
    ) -> Result<(Vec<capabilities::Capability>, Vec<capabilities::Orchestration>), StoreError> {
        let id = id.to_string();
        self.db
            .read(move |c| {
                facts::load_counters(c, &id)?;
                Ok((capabilities::of_session(c, &id)?, capabilities::orchestrations_in(c, &id)?))
            })
            .await
    }

    /// The exact request of turn `turn`'s orchestration call (the last one if `None`).
    pub async fn orchestration_evidence(
        &self,
        id: &str,
        turn: Option<i64>,
    ) -> Result<(i64, Vec<u8>), StoreError> {
        let id = id.to_string();
        self.db.read(move |c| capabilities::evidence_in(c, &id, turn)).await
    }

    /// The session's task transitions, oldest first.
    pub async fn transitions(&self, id: &str) -> Result<Vec<transition::Transition>, StoreError> {
        let id = id.to_string();
        self.db
            .read(move |c| {
                facts::load_counters(c, &id)?;
                transition::of_session(c, &id)
            })
            .await
    }

    /// The exact request body of turn `turn`'s understanding call (the last one if `None`).
    pub async fn understanding_evidence(
        &self,
        id: &str,
        turn: Option<i64>,
    ) -> Result<(i64, Vec<u8>), StoreError> {
        let id = id.to_string();
        self.db.read(move |c| transition::evidence_in(c, &id, turn)).await
    }

    /// Whether inputs are waiting in the inbox.
    pub async fn has_pending_input(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.db.read_inline(move |c| facts::pending_inputs(c, &id).map(|n| n > 0)).await
    }

    /// Sets the runtime state (with an optional detail shown to the user).
    pub async fn set_state(
        &self,
        id: &str,
        state: RuntimeState,
        detail: Option<String>,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        self.db.run(move |c| facts::set_state(c, &id, state, detail.as_deref())).await
    }

    /// Records that the user asked to interrupt the session's running turn.
    pub async fn request_interrupt(&self, id: &str) -> Result<RuntimeState, StoreError> {
        let id = id.to_string();
        self.db
            .run(move |c| {
                let meta = facts::load_meta(c, &id)?;
                c.execute("UPDATE sessions SET interrupt_requested=1 WHERE id=?1", [&id])?;
                Ok(meta.state)
            })
            .await
    }

    /// Whether an interrupt was requested.
    /// A read (it never queues behind the writer): runners poll it often.
    pub async fn interrupt_requested(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.db
            .read_inline(move |c| {
                Ok(c.prepare_cached("SELECT interrupt_requested FROM sessions WHERE id=?1")?
                    .query_row([&id], |r| r.get(0))?)
            })
            .await
    }

    /// Assembles the next model request from the current facts, in one read; `tools` turns
    /// the session's facts into the serialized schemas of its loaded tools, inside the same
    /// read transaction (the connection is passed to it).
    pub async fn assemble<F>(
        &self,
        id: &str,
        tools: F,
    ) -> Result<(SessionMeta, Assembled), StoreError>
    where
        F: FnOnce(&Connection, &SessionMeta) -> Option<Arc<str>> + Send,
    {
        let id = id.to_string();
        let cache = self.assembly.clone();
        self.db.read_inline(move |c| assemble::assemble(c, &id, &cache, tools)).await
    }

    /// Commits a step whose tools were all safe to re-run: the request evidence, the assistant
    /// message and every tool result (as pairs, in the model's order), the journal rows and
    /// the new state — one transaction.
    pub async fn commit_step(&self, id: &str, step: StepCommit) -> Result<(), StoreError> {
        let id = id.to_string();
        let stored = self.stored.clone();
        let evidence = step.evidence.clone();
        self.db.run(move |c| commit_step(c, &id, &step, &stored)).await?;
        if let Some(e) = &evidence {
            self.stored.committed(e);
        }
        Ok(())
    }

    /// Opens a step whose calls may change the world: its evidence, the assistant message and
    /// every call's journal row (`planned`, or `intent` for a call about to run, or `done` for
    /// a refused one) — one transaction, before any of them runs.
    pub async fn open_step(
        &self,
        id: &str,
        turn: i64,
        evidence: Assembled,
        assistant: String,
        entries: Vec<JournalEntry>,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        let stored = self.stored.clone();
        let recorded = evidence.clone();
        self.db
            .run(move |c| {
                assemble::record_evidence(c, &id, &evidence, &stored)?;
                steps::open_step_in(c, &id, turn, evidence.step, &assistant, &entries)?;
                facts::set_state_after(c, &id, RuntimeState::Running, None, Some(evidence.step))
            })
            .await?;
        self.stored.committed(&recorded);
        Ok(())
    }

    /// The session's open step (committed, not finished), if any.
    pub async fn load_open_step(&self, id: &str) -> Result<Option<OpenStep>, StoreError> {
        let id = id.to_string();
        self.db.read_inline(move |c| steps::load_open_step(c, &id)).await
    }

    /// Records progress of an open step (an intent before a side effect, a result after it);
    /// with `consume`, the approval the call uses is consumed in the same transaction.
    pub async fn commit_progress(
        &self,
        id: &str,
        step: i64,
        entries: Vec<JournalEntry>,
        consume: Option<UnitId>,
    ) -> Result<Option<ConsumedApproval>, StoreError> {
        let id = id.to_string();
        self.db.run(move |c| steps::progress_in(c, &id, step, &entries, consume.as_deref())).await
    }

    /// The proof of the approval `unit` that call `call_id` of session `id` consumed before its
    /// process stopped; `None` when the unit is not consumed by that call.
    pub async fn consumed_approval(
        &self,
        id: &str,
        unit: &str,
        call_id: &str,
    ) -> Result<Option<ConsumedApproval>, StoreError> {
        let (id, unit, call_id) = (id.to_string(), unit.to_string(), call_id.to_string());
        self.db.run(move |c| steps::consumed_by(c, &id, &unit, &call_id)).await
    }

    /// Persists the approval units of a blocked step and sets `waiting_approval`; the runner
    /// then exits.
    pub async fn commit_wait(&self, id: &str, wait: WaitCommit) -> Result<(), StoreError> {
        let id = id.to_string();
        self.db.run(move |c| steps::wait_in(c, &id, &wait)).await
    }

    /// Records a decision on a pending approval unit (one conditional update: exactly one
    /// decision wins), decided by the local user.
    pub async fn decide(
        &self,
        unit: &str,
        decision: Decision,
        reason: Option<String>,
        session: Option<String>,
    ) -> Result<Result<ApprovalUnit, DecideError>, StoreError> {
        self.decide_by(unit, decision, reason, session, local_decider()).await
    }

    /// Like [`decide`](Self::decide), recording `by` as the decider.
    pub async fn decide_by(
        &self,
        unit: &str,
        decision: Decision,
        reason: Option<String>,
        session: Option<String>,
        by: String,
    ) -> Result<Result<ApprovalUnit, DecideError>, StoreError> {
        let unit = unit.to_string();
        self.db
            .run(move |c| {
                steps::decide_in(c, &unit, decision, reason.as_deref(), session.as_deref(), &by)
            })
            .await
    }

    /// Approval units of one session (or every session); only pending ones if `pending_only`.
    pub async fn approvals(
        &self,
        session: Option<&str>,
        pending_only: bool,
    ) -> Result<Vec<ApprovalUnit>, StoreError> {
        let session = session.map(str::to_string);
        self.db.read(move |c| steps::approvals_of(c, session.as_deref(), pending_only)).await
    }

    /// One approval unit.
    pub async fn approval(&self, unit: &str) -> Result<Option<ApprovalUnit>, StoreError> {
        let unit = unit.to_string();
        self.db.read(move |c| steps::approval(c, &unit)).await
    }

    /// Closes the session's turn as interrupted (see [`close_turn_in`]).
    pub async fn close_turn(&self, id: &str, why: &str) -> Result<usize, StoreError> {
        let (id, why) = (id.to_string(), why.to_string());
        self.db.run(move |c| close_turn_in(c, &id, &why)).await
    }

    /// Every session, newest first.
    pub async fn list(&self) -> Result<Vec<SessionSummary>, StoreError> {
        self.db.read(views::list).await
    }

    /// The session's timeline: messages, tool calls, state.
    pub async fn timeline(&self, id: &str) -> Result<Timeline, StoreError> {
        let id = id.to_string();
        self.db.read(move |c| views::timeline(c, &id)).await
    }

    /// The exact request body of `step` (the last step if `None`), byte for byte.
    pub async fn evidence(
        &self,
        id: &str,
        step: Option<i64>,
    ) -> Result<(i64, Vec<u8>), StoreError> {
        let id = id.to_string();
        self.db.read(move |c| assemble::evidence(c, &id, EvidenceOf::Step(step))).await
    }

    /// Events of session `id` after sequence number `after`, oldest first, at most `limit`.
    /// An unknown session is an error (a session without events yet has none).
    pub async fn events_after(
        &self,
        id: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<EventRow>, StoreError> {
        let id = id.to_string();
        self.db
            .read_inline(move |c| {
                facts::load_counters(c, &id)?;
                events::after(c, &id, after, limit)
            })
            .await
    }

    /// Follows session `id`'s events after sequence number `after`, whichever process
    /// commits them: the receiver gets each new event once, in order, until it is dropped.
    /// Every commit of this process wakes the follower at once; the store is also polled every
    /// `every` for other processes' commits (one indexed read of the rows after the last one
    /// seen; no busy loop).
    pub fn follow(
        &self,
        id: &str,
        after: i64,
        every: std::time::Duration,
    ) -> tokio::sync::mpsc::Receiver<Result<EventRow, StoreError>> {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let engine = self.clone();
        let id = id.to_string();
        let mut commits = self.db.commits();
        tokio::spawn(async move {
            let mut last = after;
            loop {
                match engine.events_after(&id, last, 256).await {
                    Ok(rows) => {
                        let full = rows.len() == 256;
                        for row in rows {
                            last = row.seq;
                            if tx.send(Ok(row)).await.is_err() {
                                return;
                            }
                        }
                        if full {
                            continue;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
                // This process's commits wake the follower at once; another process's are
                // seen at the next poll.
                tokio::select! {
                    () = tokio::time::sleep(every) => {}
                    changed = commits.changed() => {
                        if changed.is_err() {
                            tokio::time::sleep(every).await;
                        }
                    }
                    () = tx.closed() => return,
                }
            }
        });
        rx
    }

    /// The last event's sequence number of session `id` (0 when it has none).
    pub async fn last_event(&self, id: &str) -> Result<i64, StoreError> {
        let id = id.to_string();
        self.db.read_inline(move |c| events::last_seq(c, &id)).await
    }

    /// The exact body of refused request `seq` (the last one if `None`), byte for byte.
    pub async fn refused_evidence(
        &self,
        id: &str,
        seq: Option<i64>,
    ) -> Result<(i64, Vec<u8>), StoreError> {
        let id = id.to_string();
        self.db.read(move |c| assemble::evidence(c, &id, EvidenceOf::Refused(seq))).await
    }

    /// The session's model calls (what each came to: finish reason, tokens, time), by step.
    pub async fn model_calls(&self, id: &str) -> Result<Vec<ModelCallRecord>, StoreError> {
        let id = id.to_string();
        self.db.read(move |c| assemble::model_calls(c, &id)).await
    }

    /// An estimate of the tokens of the session's next request.
    pub async fn token_estimate(&self, id: &str) -> Result<TokenEstimate, StoreError> {
        let id = id.to_string();
        self.db.read(move |c| assemble::token_estimate(c, &id)).await
    }

    /// Starts a compaction of session `id`: finishes any pending checkpoint first (see
    /// [`compaction::settle_in`]), freezes the history to summarize at the boundary `aim` asks
    /// for and marks the session `compressing` — one transaction. `None` when nothing can be
    /// compacted (the session is left as it was).
    pub async fn begin_compaction(
        &self,
        id: &str,
        trigger: compaction::Trigger,
        aim: compaction::Aim,
        tokens: Option<i64>,
    ) -> Result<Option<compaction::Frozen>, StoreError> {
        let id = id.to_string();
        self.db
            .run(move |c| {
                compaction::settle_in(c, &id)?;
                let frozen = compaction::freeze_in(c, &id, trigger, aim)?;
                if let Some(f) = &frozen {
                    compaction::begin_in(c, &id, f, tokens)?;
                }
                Ok(frozen)
            })
            .await
    }

    /// Commits the checkpoint of a compaction (step 1, see [`compaction::prepare_in`]).
    pub async fn prepare_checkpoint(
        &self,
        id: &str,
        frozen: Arc<compaction::Frozen>,
        call: compaction::SummaryCall,
        tokens: (Option<i64>, Option<i64>),
        state_after: RuntimeState,
    ) -> Result<i64, StoreError> {
        let id = id.to_string();
        self.db
            .run(move |c| compaction::prepare_in(c, &id, &frozen, &call, tokens, state_after))
            .await
    }

    /// Promotes checkpoint `seq` (step 2, see [`compaction::promote_in`]).
    pub async fn promote_checkpoint(
        &self,
        id: &str,
        seq: i64,
        state_after: RuntimeState,
        ms: f64,
    ) -> Result<compaction::Promotion, StoreError> {
        let id = id.to_string();
        self.db.run(move |c| compaction::promote_in(c, &id, seq, Some(state_after), ms)).await
    }

    /// The session's checkpoints, oldest first.
    pub async fn checkpoints(
        &self,
        id: &str,
    ) -> Result<Vec<compaction::CheckpointRecord>, StoreError> {
        let id = id.to_string();
        self.db
            .read(move |c| {
                facts::load_counters(c, &id)?;
                compaction::checkpoints_in(c, &id)
            })
            .await
    }

    /// The exact request of checkpoint `seq`'s summary call (the last one's if `None`).
    pub async fn compaction_evidence(
        &self,
        id: &str,
        seq: Option<i64>,
    ) -> Result<(i64, Vec<u8>), StoreError> {
        let id = id.to_string();
        self.db.read(move |c| compaction::evidence_in(c, &id, seq)).await
    }

    /// Bytes of request per token for session `id`: from the newest of its last eight
    /// requests whose usage the server reported, else [`BYTES_PER_TOKEN`].
    pub async fn bytes_per_token(&self, id: &str) -> Result<f64, StoreError> {
        let id = id.to_string();
        self.db
            .read_inline(move |c| {
                let rows: Vec<(Option<i64>, Option<i64>)> = c
                    .prepare_cached(
                        "SELECT body_bytes, prompt_tokens FROM evidence WHERE session_id=?1
                         ORDER BY step DESC LIMIT 8",
                    )?
                    .query_map([&id], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                let known = rows.into_iter().find_map(|(b, t)| Some((b?, t?)));
                Ok(estimate_tokens(0, known).bytes_per_token)
            })
            .await
    }

    /// Ends the turn of a request that did not come back as a reply: records the request as
    /// refused (its evidence, `error` and the status the server gave) and sets the session
    /// `failed` with `error` — one transaction. Returns the refused request's number.
    pub async fn refuse_step(
        &self,
        id: &str,
        request: Assembled,
        http_status: Option<u16>,
        error: String,
    ) -> Result<i64, StoreError> {
        let id = id.to_string();
        let stored = self.stored.clone();
        let recorded = request.clone();
        let seq = self
            .db
            .run(move |c| {
                let seq = assemble::record_refused(c, &id, &request, http_status, &error, &stored)?;
                facts::set_state(c, &id, RuntimeState::Failed, Some(&error))?;
                Ok(seq)
            })
            .await?;
        self.stored.committed(&recorded);
        Ok(seq)
    }
}

/// Checks what `new` names (its user, policy patterns, chosen id) and returns its id: the
/// chosen one, or a new random one — so that sessions created at once (by concurrent API
/// requests on one worker thread, or parallel spawns) never collide.
fn checked_id(new: &NewSession) -> Result<String, StoreError> {
    if let Some(u) = &new.user
        && !crate::memory::valid_principal(&crate::memory::typed(u, crate::memory::Kind::Local))
    {
        return Err(StoreError::Input(format!(
            "the user name `{u}` is not valid: use letters, digits, `-`, `_`, `.` and `@` (at most 64)"
        )));
    }
    new.policy.check_patterns().map_err(StoreError::Input)?;
    match &new.id {
        Some(id) if !valid_id(id) => Err(StoreError::Input(format!(
            "session id `{id}` is not valid: use letters, digits, `-` and `_` (at most 64)"
        ))),
        Some(id) => Ok(id.clone()),
        None => Ok(workgroup::new_id()),
    }
}

/// Stores session `id` as `new` describes it, inside a caller's transaction (a sub-session is
/// created in the transaction that records its parent's spawn). Refuses an id in use.
pub fn create_in(c: &Connection, id: &str, new: &NewSession) -> Result<(), StoreError> {
    let pins: crate::tools::ToolPins = new
        .pins
        .iter()
        .filter(|(t, _)| new.tools.contains(t))
        .map(|(t, d)| (t.clone(), d.clone()))
        .collect();
    let exists: bool =
        c.query_row("SELECT EXISTS(SELECT 1 FROM sessions WHERE id=?1)", [id], |r| r.get(0))?;
    if exists {
        return Err(StoreError::Conflict(format!("session `{id}` already exists")));
    }
    c.execute(
        "INSERT INTO sessions (id, created_at, state, meta_version) VALUES (?1, ?2, 'idle', 1)",
        params![id, now_ms()],
    )?;
    c.execute(
        "INSERT INTO session_config (session_id, loaded_tools, policy, budget, model, system_prompt, guards, preprocess, user, owner, net, tool_pins)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            id,
            json(&new.tools)?,
            json(&new.policy)?,
            json(&new.budget)?,
            json(&new.model)?,
            new.system_prompt,
            new.guards.as_ref().map(json).transpose()?,
            new.preprocess.as_ref().map(json).transpose()?,
            // Typed: a local user unless the creator typed it (`token:NAME` over the API).
            crate::memory::typed(
                &new.user.clone().unwrap_or_else(crate::memory::default_user),
                crate::memory::Kind::Local
            ),
            new.owner.as_ref().map(json).transpose()?,
            (!new.net.is_empty()).then(|| json(&new.net)).transpose()?,
            json(&pins)?
        ],
    )?;
    let origins: Vec<(String, capabilities::Via)> = new
        .tools
        .iter()
        .map(|t| {
            let via = if new.named_tools && !crate::builtin::ALWAYS_LOADED.contains(&t.as_str()) {
                capabilities::Via::Flag
            } else {
                capabilities::Via::Default
            };
            (t.clone(), via)
        })
        .collect();
    capabilities::created_in(c, id, &origins)?;
    for g in &new.grants {
        let within = g
            .within
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| StoreError::Task(format!("cannot store a grant: {e}")))?;
        c.execute(
            "INSERT INTO session_grants (session_id, host, guest, access, dev, ino, within)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                id,
                g.host.display().to_string(),
                g.guest,
                g.access.to_string(),
                g.id.map(|d| d.dev as i64),
                g.id.map(|d| d.ino as i64),
                within
            ],
        )?;
    }
    Ok(())
}

/// The turn start of [`SessionEngine::begin_turn`], for callers that compose it into a larger
/// transaction (the Brain takes the input, the runner lease and the turn in one).
pub fn begin_turn_in(c: &Connection, id: &str) -> Result<Option<TurnStart>, StoreError> {
    // An interrupted session takes no input until one is sent to it (which makes it
    // `preparing_context`): a stop that came before the turn began is not undone here.
    let state: String = c
        .prepare_cached("SELECT state FROM sessions WHERE id=?1")?
        .query_row([id], |r| r.get(0))?;
    if state == RuntimeState::Interrupted.as_str() {
        return Ok(None);
    }
    let next: Option<(i64, String, Option<String>)> = c
        .query_row(
            "SELECT i.seq, i.text, e.kind FROM inbox i LEFT JOIN workgroup_events e ON e.id = i.event_id
             WHERE i.session_id=?1 AND i.consumed_at IS NULL ORDER BY i.seq LIMIT 1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let Some((seq, text, event_kind)) = next else { return Ok(None) };
    // A notification from another session of the workgroup is not a task: it bypasses task
    // understanding, as a main session's every input does (the main has none configured).
    let notification = event_kind.is_some_and(|k| k != workgroup::Kind::Request.as_str());
    c.execute(
        "UPDATE inbox SET consumed_at=?3 WHERE session_id=?1 AND seq=?2",
        params![id, seq, now_ms()],
    )?;
    c.execute(
        "UPDATE sessions SET turns=turns+1, interrupt_requested=0, state='running',
         state_detail=NULL, meta_version=meta_version+1 WHERE id=?1",
        [id],
    )?;
    let turn: i64 = c.query_row("SELECT turns FROM sessions WHERE id=?1", [id], |r| r.get(0))?;
    c.execute("UPDATE sessions SET active_turn=?2 WHERE id=?1", params![id, turn])?;
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
    let understand = !notification && transition::preprocess_on(c, id)?;
    if understand {
        events::append(c, id, &SessionEvent::UnderstandingStarted { turn, resumed: false })?;
    } else {
        transition::commit_in(c, id, turn, &transition::Understood::default(), None)?;
    }
    Ok(Some(TurnStart { turn, text, lease: None, understand, resumed: false }))
}

/// The inbox append of [`SessionEngine::submit`], for callers that compose it into a larger
/// transaction (the Brain takes the runner lease in the same one). A session that is not
/// running shows `preparing_context` until its runner starts the turn.
pub fn submit_in(c: &Connection, id: &str, text: &str) -> Result<i64, StoreError> {
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
    let meta = facts::load_meta(c, id)?;
    let seq: i64 = c
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM inbox WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))?;
    c.prepare_cached(
        "INSERT INTO inbox (session_id, seq, text, created_at, event_id) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![id, seq, text, now_ms(), event])?;
    events::append(c, id, &SessionEvent::InputAccepted { inbox_seq: seq, text: text.to_string() })?;
    // A compaction in progress keeps its state; the input is taken after it.
    if meta.active_turn.is_none()
        && !matches!(meta.state, RuntimeState::Running | RuntimeState::Compressing)
        && (wakes_interrupted || meta.state != RuntimeState::Interrupted)
    {
        facts::set_state(c, id, RuntimeState::PreparingContext, None)?;
    }
    Ok(seq)
}

/// Everything one step commits at its end.
#[derive(Debug, Clone)]
pub struct StepCommit {
    pub turn: i64,
    /// Evidence to record (None when [`SessionEngine::open_step`] already did).
    pub evidence: Option<Assembled>,
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

fn commit_step(
    c: &Connection,
    id: &str,
    s: &StepCommit,
    stored: &assemble::StoredParts,
) -> Result<(), StoreError> {
    if let Some(e) = &s.evidence {
        assemble::record_evidence(c, id, e, stored)?;
    }
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
    let step = s.evidence.as_ref().map(|e| e.step);
    facts::set_state_after(c, id, s.state, s.detail.as_deref(), step)?;
    if let Some(owner) = &s.release_lease
        && s.state == RuntimeState::Idle
    {
        // The runner keeps its lease while inputs wait: it runs them next.
        if facts::pending_inputs(c, id)? == 0 {
            crate::session::lease::release_in(c, id, owner)?;
        }
    }
    if s.state == RuntimeState::Running {
        events::append(
            c,
            id,
            &SessionEvent::ModelCallStarted { step: s.step + 1, resumed: false },
        )?;
    }
    Ok(())
}

pub(crate) use crate::store::json;
