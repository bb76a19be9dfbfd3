//! SessionEngine: the session aggregate.
//!
//! Owns every session fact: SessionMeta (goals, loaded tools, policy, budget, model config,
//! runtime state, version counters), the append-only history, the durable inbox, the tool-call
//! journal, request evidence, and per-session grants. Each business operation below is one
//! transaction on the store's single writer; no other module writes these tables. It assembles
//! each model request from the current facts. It does not call the model or run tools.

mod approvals;
mod assemble;
mod blobs;
mod calls;
pub mod capabilities;
pub mod compaction;
mod config;
mod create;
pub mod delegation;
mod direct;
mod discovery;
pub mod events;
mod facts;
pub mod lease;
pub mod orchestration;
pub mod plan;
mod reads;
mod steps;
mod task;
pub mod transition;
mod turns;
mod views;
pub mod workgroup;

use std::sync::Arc;

use crate::sql::Connection;
use serde::{Deserialize, Serialize};

use crate::ids::{CallId, SessionId, UnitId};
use crate::model::ModelConfig;
use crate::sandbox::{Budget, Grant};
use crate::store::{Db, StoreError, now_ms};

pub use crate::policy::{Effect, Policy};
pub use crate::tools::ConsumedApproval;
pub use approvals::{ApprovalStatus, ApprovalUnit, DecideError, Decision};
pub use assemble::{
    Assembled, BYTES_PER_TOKEN, CallFacts, EvidenceOf, FIXED_SHARE, GOAL_SHOWN, MIN_RESULT_CAP,
    ModelCallRecord, Part, RefusedRequest, Room, RoomView, Schemas, TokenEstimate, estimate_tokens,
    goal_reference, reconstruct_body,
};
pub use capabilities::LoadedCapabilities;
pub use config::SessionConfig;
pub use create::{NewSession, create_in};
pub use delegation::SessionDelegation;
pub use direct::DIRECT_CALL_PREFIX;
pub use discovery::SessionDiscovery;
pub use events::{EventRow, SessionEvent};
pub use facts::{Runtime, RuntimeState, SessionMeta, pending_inputs, unsettled_in};
pub use reads::StoreGauges;
pub use steps::{
    AfterCrash, JournalStatus, OUTCOME_UNKNOWN, OpenStep, RecoveredSession, WaitCommit,
    after_crash, close_turn_in, recover_in,
};
pub use task::TaskState;
pub use turns::{Again, StepCommit, TurnStart, begin_turn_in, submit_in};
pub use views::{MessageCall, SessionSummary, Timeline, TimelineCall, TimelineMessage, TurnUsage};

/// How a decision made on this machine (the CLI, or a library caller) names its decider: the
/// operating-system user.
pub fn local_decider() -> String {
    format!("local user {}", crate::memory::default_user())
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
    pub error_kind: Option<crate::failure::FailureKind>,
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

/// The SessionEngine of one database.
#[derive(Clone)]
pub struct SessionEngine {
    db: Db,
    fences: Arc<lease::Fences>,
    assembly: Arc<assemble::AssemblyCache>,
    stored: Arc<assemble::StoredParts>,
}

impl SessionEngine {
    pub fn new(db: Db) -> Self {
        Self { db, fences: Arc::default(), assembly: Arc::default(), stored: Arc::default() }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The fencing tokens of the leases this process's runners hold.
    pub(crate) fn fences(&self) -> &lease::Fences {
        &self.fences
    }

    /// Runs `op`, a write of session `id`'s state, as one atomic operation. When a runner of
    /// this process holds the session's lease, the write first locks the session and checks
    /// the lease's fencing token in the same transaction: a runner whose lease was taken over
    /// gets [`StoreError::Fenced`] and nothing is written.
    pub(crate) async fn write<R, F>(&self, id: SessionId, op: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let fence = self.fences.of(id.as_str());
        self.db
            .run(move |c| {
                if let Some(fence) = &fence {
                    facts::lock_in(c, &id)?;
                    lease::check_fence_in(c, &id, fence)?;
                }
                op(c)
            })
            .await
    }

    /// The session's meta facts, read inside a caller's transaction.
    pub fn load_meta_in(c: &Connection, id: &str) -> Result<SessionMeta, StoreError> {
        facts::load_meta(c, id)
    }

    /// The session's meta facts (its four sub-owners'; a reader that needs one reads that one
    /// alone: [`config`](Self::config), [`task`](Self::task),
    /// [`loaded`](Self::loaded), [`runtime`](Self::runtime)).
    pub async fn meta(&self, id: &SessionId) -> Result<SessionMeta, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| facts::load_meta(c, &id)).await
    }

    /// The session's configuration.
    pub async fn config(&self, id: &SessionId) -> Result<SessionConfig, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| config::config_in(c, &id)).await
    }

    /// Makes `window` the session's context window if it has none or a larger one (see
    /// `config::learn_window_in`); whether it changed.
    pub async fn learn_window(&self, id: &SessionId, window: u64) -> Result<bool, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| config::learn_window_in(c, &id, window)).await
    }

    /// Makes the session send one system message from now on (see
    /// `config::learn_one_system_message_in`); whether it changed.
    pub async fn learn_one_system_message(&self, id: &SessionId) -> Result<bool, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| config::learn_one_system_message_in(c, &id)).await
    }

    /// The session's task state: goals, phase, plan.
    pub async fn task(&self, id: &SessionId) -> Result<TaskState, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| task::task_in(c, &id)).await
    }

    /// What the session has loaded.
    pub async fn loaded(&self, id: &SessionId) -> Result<LoadedCapabilities, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| capabilities::capabilities_in(c, &id)).await
    }

    /// The session's runtime: state, counters, active turn, checkpoint. Also what tells
    /// whether a session exists (`NotFound` if not).
    pub async fn runtime(&self, id: &SessionId) -> Result<Runtime, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| facts::runtime_in(c, &id)).await
    }

    /// Pins loaded tools to component digests: `pins` holds the digest each tool resolves to
    /// now. Without `upgrade` only tools not pinned yet are pinned (what a session loaded it
    /// keeps); with it every given pin replaces the old one. Returns the pins that changed,
    /// as (tool, old digest, new digest).
    pub async fn pin_tools(
        &self,
        id: &SessionId,
        pins: std::collections::BTreeMap<String, String>,
        upgrade: bool,
    ) -> Result<Vec<(String, Option<String>, String)>, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| capabilities::pin_in(c, &id, pins, upgrade)).await
    }

    /// Adds tools to the session's loaded set (add-only, pinned): an admin's addition through
    /// AddSelectedCapabilities.
    pub async fn add_tools(&self, id: &SessionId, tools: Vec<String>) -> Result<(), StoreError> {
        let selection = capabilities::Selection { tools, ..Default::default() };
        self.add_capabilities(id, selection, capabilities::Via::Admin).await.map(|_| ())
    }

    /// The session's active turn when its transition is not committed yet (the runner makes
    /// the understanding call, then [`commit_transition`](Self::commit_transition)).
    pub async fn pending_understanding(
        &self,
        id: &SessionId,
    ) -> Result<Option<transition::PendingUnderstanding>, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| transition::pending_in(c, &id)).await
    }

    /// Commits turn `turn`'s transition (see [`transition::commit_in`]), with the recall of its
    /// capability preparation when it has one: `None` when it was committed already.
    pub async fn commit_transition(
        &self,
        id: &SessionId,
        turn: i64,
        understood: transition::Understood,
        recalled: Option<orchestration::RecallRecord>,
    ) -> Result<Option<transition::Transition>, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| {
            transition::commit_in(c, &id, turn, &understood, recalled.as_ref())
        })
        .await
    }

    /// The active turn's transition when its capability preparation has not finished (see
    /// [`transition::unprepared_in`]).
    pub async fn unprepared(
        &self,
        id: &SessionId,
    ) -> Result<Option<transition::Transition>, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| transition::unprepared_in(c, &id)).await
    }

    /// Records what recall found (see [`orchestration::record_recall_in`]) and, with `finish`,
    /// finishes the orchestration in the same commit (no call was needed).
    pub async fn record_recall(
        &self,
        id: &SessionId,
        record: orchestration::RecallRecord,
        finish: Option<orchestration::OrchestratorCall>,
    ) -> Result<(), StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| {
            orchestration::record_recall_in(c, &id, &record)?;
            if let Some(call) = &finish {
                orchestration::finish_in(c, &id, record.turn, call)?;
            }
            Ok(())
        })
        .await
    }

    /// Finishes turn `turn`'s orchestration: adds what was selected and applies the
    /// environment (see [`orchestration::finish_in`]).
    pub async fn finish_orchestration(
        &self,
        id: &SessionId,
        turn: i64,
        call: orchestration::OrchestratorCall,
    ) -> Result<capabilities::Added, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| orchestration::finish_in(c, &id, turn, &call)).await
    }

    /// AddSelectedCapabilities outside a turn (an admin's addition): add-only, pinned.
    pub async fn add_capabilities(
        &self,
        id: &SessionId,
        selection: capabilities::Selection,
        via: capabilities::Via,
    ) -> Result<capabilities::Added, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| capabilities::add_in(c, &id, &selection, via, None, None))
            .await
    }

    /// Unloads a tool or skill from session `id` (the explicit removal path).
    pub async fn unload(
        &self,
        id: &SessionId,
        kind: capabilities::Kind,
        name: &str,
    ) -> Result<(), StoreError> {
        let (id, name) = (id.clone(), name.to_string());
        self.write(id.clone(), move |c| capabilities::unload_in(c, &id, kind, &name)).await
    }

    /// The session's capabilities and how each arrived, and its orchestrations.
    pub async fn capabilities(
        &self,
        id: &SessionId,
    ) -> Result<(Vec<capabilities::Capability>, Vec<orchestration::Orchestration>), StoreError>
    {
        let id = id.clone();
        self.db
            .read(move |c| {
                facts::load_counters(c, &id)?;
                Ok((capabilities::of_session(c, &id)?, orchestration::orchestrations_in(c, &id)?))
            })
            .await
    }

    /// The exact request of turn `turn`'s orchestration call (the last one if `None`).
    pub async fn orchestration_evidence(
        &self,
        id: &SessionId,
        turn: Option<i64>,
    ) -> Result<(i64, Vec<u8>), StoreError> {
        let id = id.clone();
        self.db.read(move |c| orchestration::evidence_in(c, &id, turn)).await
    }

    /// The session's task transitions, oldest first.
    pub async fn transitions(
        &self,
        id: &SessionId,
    ) -> Result<Vec<transition::Transition>, StoreError> {
        let id = id.clone();
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
        id: &SessionId,
        turn: Option<i64>,
    ) -> Result<(i64, Vec<u8>), StoreError> {
        let id = id.clone();
        self.db.read(move |c| transition::evidence_in(c, &id, turn)).await
    }

    /// Assembles the next model request from the current facts, in one read; `tools` turns
    /// the session's facts into the serialized schemas of its loaded tools in the form asked
    /// for, inside the same read transaction (the connection is passed to it).
    pub async fn assemble<F>(
        &self,
        id: &SessionId,
        tools: F,
    ) -> Result<(SessionMeta, Assembled), StoreError>
    where
        F: FnMut(&Connection, &SessionMeta, Schemas) -> Option<Arc<str>> + Send,
    {
        self.assemble_within(id, None, tools).await
    }

    /// [`assemble`](Self::assemble), with the history's tool results cut so that the request
    /// takes at most `within` bytes, if a cut can make it (see `assemble::fitting_cap`).
    pub async fn assemble_within<F>(
        &self,
        id: &SessionId,
        within: Option<usize>,
        tools: F,
    ) -> Result<(SessionMeta, Assembled), StoreError>
    where
        F: FnMut(&Connection, &SessionMeta, Schemas) -> Option<Arc<str>> + Send,
    {
        let id = id.clone();
        let cache = self.assembly.clone();
        self.db.read_inline(move |c| assemble::assemble(c, &id, &cache, within, tools)).await
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
        let decided = self
            .db
            .run(move |c| {
                approvals::decide_in(c, &unit, decision, reason.as_deref(), session.as_deref(), &by)
            })
            .await?;
        if let Ok(u) = &decided {
            let name = match decision {
                Decision::Approve => "approve",
                Decision::Reject => "reject",
            };
            crate::metrics::APPROVALS_DECIDED.inc(&[name]);
            // The wait, as a span from the unit's creation to its decision.
            let _wait = tracing::info_span!(
                "approval",
                session_id = %u.session_id,
                otel.start_unix_ms = u.created_at,
                keel.approval.id = %u.id,
                keel.decision = name,
                gen_ai.tool.name = %u.tool,
                gen_ai.tool.call.id = %u.call_id,
            )
            .entered();
        }
        Ok(decided)
    }

    /// Approval units of one session (or every session); only pending ones if `pending_only`.
    pub async fn approvals(
        &self,
        session: Option<&str>,
        pending_only: bool,
    ) -> Result<Vec<ApprovalUnit>, StoreError> {
        let session = session.map(str::to_string);
        self.db.read(move |c| approvals::approvals_of(c, session.as_deref(), pending_only)).await
    }

    /// One approval unit.
    pub async fn approval(&self, unit: &str) -> Result<Option<ApprovalUnit>, StoreError> {
        let unit = unit.to_string();
        self.db.read(move |c| approvals::approval(c, &unit)).await
    }

    /// Starts a compaction of session `id`: finishes any pending checkpoint first (see
    /// [`compaction::settle_in`]), freezes the history to summarize at the boundary `aim` asks
    /// for and marks the session `compressing` — one transaction. `None` when nothing can be
    /// compacted (the session is left as it was).
    pub async fn begin_compaction(
        &self,
        id: &SessionId,
        trigger: compaction::Trigger,
        aim: compaction::Aim,
        tokens: Option<i64>,
    ) -> Result<Option<compaction::Frozen>, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| {
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
        id: &SessionId,
        frozen: Arc<compaction::Frozen>,
        call: compaction::SummaryCall,
        tokens: (Option<i64>, Option<i64>),
        state_after: RuntimeState,
    ) -> Result<i64, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| {
            compaction::prepare_in(c, &id, &frozen, &call, tokens, state_after)
        })
        .await
    }

    /// Promotes checkpoint `seq` (step 2, see [`compaction::promote_in`]).
    pub async fn promote_checkpoint(
        &self,
        id: &SessionId,
        seq: i64,
        state_after: RuntimeState,
        ms: f64,
    ) -> Result<compaction::Promotion, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| compaction::promote_in(c, &id, seq, Some(state_after), ms))
            .await
    }

    /// The session's checkpoints, oldest first.
    pub async fn checkpoints(
        &self,
        id: &SessionId,
    ) -> Result<Vec<compaction::CheckpointRecord>, StoreError> {
        let id = id.clone();
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
        id: &SessionId,
        seq: Option<i64>,
    ) -> Result<(i64, Vec<u8>), StoreError> {
        let id = id.clone();
        self.db.read(move |c| compaction::evidence_in(c, &id, seq)).await
    }

    /// The last answer of checkpoint `seq`'s summary call (the last checkpoint's if `None`).
    pub async fn compaction_reply(
        &self,
        id: &SessionId,
        seq: Option<i64>,
    ) -> Result<(i64, String), StoreError> {
        let id = id.clone();
        self.db.read(move |c| compaction::reply_in(c, &id, seq)).await
    }
}

pub(crate) use crate::store::json;
