//! SessionEngine: the session kernel.
//!
//! Owns the facts every session has: its row and runtime state (state, counters, active turn),
//! its configuration, the append-only history, the durable inbox and its turns, the tool-call
//! journal and its one door (`calls`), events, approvals, the fenced write, and the runner
//! leases. Each business operation is one transaction on the store's single writer; no other
//! module writes these tables.
//!
//! The feature owners stand beside it, each with its own handle and SQL: turn preparation
//! ([`crate::preparation`]: task, plan, transition, orchestration, capabilities), the
//! workgroup ([`crate::workgroup`]), compaction ([`crate::compaction`]) and request assembly
//! with its evidence ([`crate::assembly`]); [`crate::meta`] composes `SessionMeta` above them.
//! The kernel imports none of them: where its commits must change their facts, it runs the
//! [`reactions`] they registered. It does not call the model or run tools.

mod approvals;
mod calls;
mod config;
mod create;
mod delete;
mod direct;
pub(crate) mod events;
mod extensions;
mod facts;
mod fork;
pub(crate) mod lease;
pub(crate) mod preimages;
pub use rewind::PastRewind;
pub use rewind::RewoundConversation;
pub(crate) use rewind::{conversation_rewinds_in, open_rewind_in, reappend_in};
pub mod reactions;
mod reads;
mod recover;
mod rewind;
mod row;
mod state;
mod steps;
mod turns;

use std::sync::Arc;

use crate::sql::Connection;
use serde::{Deserialize, Serialize};

use crate::ids::{CallId, SessionId, UnitId};
use crate::store::{Db, StoreError};

pub use crate::policy::{Effect, Policy};
pub use crate::tools::ConsumedApproval;
pub(crate) use approvals::approvals_of;
pub use approvals::{ApprovalStatus, ApprovalUnit, DecideError, Decision};
pub use config::{ModelChange, SessionConfig};
pub(crate) use config::{config_in, prefetch_config_in, prefetch_preprocess_in, preprocess_on};
pub use create::{NewSession, new_id};
pub(crate) use create::{checked_id, create_in};
pub use direct::DIRECT_CALL_PREFIX;
pub use events::{EventRow, ModelShown, SessionEvent, SettingsChange};
pub(crate) use events::settings_changes;
pub use facts::{MetaCounters, Runtime, RuntimeState};
pub use fork::{ForkSettings, HistoryCut, Origin};
pub(crate) use fork::origin_in;
pub(crate) use facts::{
    journal_row, load_counters, lock_in, no_session, parse, pending_inputs, runtime_and_pending_in,
    runtime_in, set_state, set_state_after, unsettled_in,
};
pub use reactions::{Reactions, StateChange};
pub use recover::RecoveredSession;
pub(crate) use recover::{recover_in, take_in};
pub use steps::{AfterCrash, JournalStatus, OUTCOME_UNKNOWN, OpenStep, WaitCommit, after_crash};
pub(crate) use steps::{close_turn_in, open_step_in};
#[cfg(test)]
pub(crate) use turns::REQUEST_KIND;
pub use turns::{Again, StepCommit, TurnStart};
pub(crate) use turns::{begin_turn_in, commit_step_in, submit_event_in, submit_in};

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
    /// What the tool wrote to its log, stdout and stderr, as JSON (bounded and redacted as
    /// outputs are; never sent to the model). `None`: nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<String>,
    /// The changes a control call asked for (plan changes, skills and tools to load, facts to
    /// remember), applied when its result is committed (not stored with the row: the plan's
    /// versions, the session's capabilities and the memories keep them).
    #[serde(default, skip)]
    pub control_requests: Vec<crate::control::ControlRequest>,
    /// The pre-images its change set refers to, stored with the row (not a column of it).
    #[serde(default, skip)]
    pub kept: crate::tools::Kept,
}

/// The SessionEngine of one database.
#[derive(Clone)]
pub struct SessionEngine {
    db: Db,
    fences: Arc<lease::Fences>,
    extensions: Arc<extensions::Extensions>,
}

/// What a turn starts from ([`SessionEngine::outset`]).
#[derive(Debug, Clone)]
pub struct TurnOutset {
    pub config: SessionConfig,
    pub open_step: Option<OpenStep>,
    pub runtime: Runtime,
}

impl SessionEngine {
    /// The engine of `db`, with the reactions of the feature owners beside the kernel (see
    /// [`reactions`]; `keel::harness::REACTIONS` is the set keel's owners register).
    pub fn new(db: Db, reactions: Reactions) -> Self {
        reactions::install(reactions);
        Self { db, fences: Arc::default(), extensions: Arc::default() }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The per-engine state of the owner of `T` (its caches): made on first use, shared by
    /// every clone of this engine.
    pub(crate) fn extension<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        self.extensions.get()
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

    /// The session's configuration.
    pub async fn config(&self, id: &SessionId) -> Result<SessionConfig, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| config::config_in(c, &id)).await
    }

    /// Who owns the session (`None`: created on this machine); `NotFound` if it does not exist.
    pub async fn owner(&self, id: &SessionId) -> Result<Option<crate::caller::Owner>, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| config::owner_in(c, &id)).await
    }

    /// Makes `window` the session's context window if it has none or a larger one (see
    /// `config::learn_window_in`); whether it changed.
    pub async fn learn_window(&self, id: &SessionId, window: u64) -> Result<bool, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| config::learn_window_in(c, &id, window)).await
    }

    /// Gives the session a title (`None`: none; see `config::set_title_in`).
    pub async fn set_title(&self, id: &SessionId, title: Option<String>) -> Result<(), StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| config::set_title_in(c, &id, title.as_deref())).await
    }

    /// Deletes the session and every fact of it (see `delete::delete_in`).
    pub async fn delete(&self, id: &SessionId) -> Result<(), StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| delete::delete_in(c, &id)).await
    }

    /// Moves the session to the model `change` names, recorded as `by`'s (see
    /// `config::set_model_in`): the model before and after.
    pub async fn set_model(
        &self,
        id: &SessionId,
        change: ModelChange,
        by: String,
    ) -> Result<(ModelShown, ModelShown), StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| config::set_model_in(c, &id, &change, &by)).await
    }

    /// Changes the session's policy by `change`, recorded as `by`'s (see
    /// `config::change_policy_in`); the policy after.
    pub async fn change_policy(
        &self,
        id: &SessionId,
        change: crate::policy::PolicyChange,
        by: String,
    ) -> Result<crate::policy::Policy, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| config::change_policy_in(c, &id, &change, &by)).await
    }

    /// The journal rows after step `step`, oldest first, with their steps (what a rewind
    /// undoes).
    pub async fn calls_after(
        &self,
        id: &SessionId,
        step: i64,
    ) -> Result<Vec<(i64, JournalEntry)>, StoreError> {
        let id = id.clone();
        self.db.read(move |c| rewind::calls_after_in(c, &id, step)).await
    }

    /// The session's rewinds that ended, oldest first.
    pub async fn rewinds(&self, id: &SessionId) -> Result<Vec<PastRewind>, StoreError> {
        let id = id.clone();
        self.db.read(move |c| rewind::rewinds_in(c, &id)).await
    }

    /// The bytes of pre-image `sha256` that the session holds.
    pub async fn preimage(
        &self,
        id: &SessionId,
        sha256: &str,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let (id, sha) = (id.clone(), sha256.to_string());
        self.db.read(move |c| preimages::bytes_in(c, &id, &sha)).await
    }

    /// The step of a rewind that started and did not end, if any.
    pub async fn open_rewind(&self, id: &SessionId) -> Result<Option<i64>, StoreError> {
        let id = id.clone();
        self.db.read(move |c| rewind::open_rewind_in(c, &id)).await
    }

    /// Records that `by` begins rewinding the session to step `to` (see `rewind::begin_in`).
    pub async fn begin_rewind(
        &self,
        id: &SessionId,
        to: i64,
        files: usize,
        by: String,
    ) -> Result<(), StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| rewind::begin_in(c, &id, to, files, &by)).await
    }

    /// Creates a session as the fork of this one at `cut`, as `settings` say (see
    /// `fork::fork_in`).
    pub async fn fork(
        &self,
        id: &SessionId,
        cut: HistoryCut,
        settings: ForkSettings,
    ) -> Result<(), StoreError> {
        let from = id.clone();
        self.write(id.clone(), move |c| fork::fork_in(c, &from, &cut, &settings)).await
    }

    /// Records the end of the session's rewind (a `rewound` event).
    pub async fn end_rewind(&self, id: &SessionId, event: SessionEvent) -> Result<(), StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| rewind::end_in(c, &id, &event)).await
    }

    /// Makes the session send one system message from now on (see
    /// `config::learn_one_system_message_in`); whether it changed.
    pub async fn learn_one_system_message(&self, id: &SessionId) -> Result<bool, StoreError> {
        let id = id.clone();
        self.write(id.clone(), move |c| config::learn_one_system_message_in(c, &id)).await
    }

    /// The session's runtime: state, counters, active turn, checkpoint. Also what tells
    /// whether a session exists (`NotFound` if not).
    pub async fn runtime(&self, id: &SessionId) -> Result<Runtime, StoreError> {
        let id = id.clone();
        self.db.read_inline(move |c| facts::runtime_in(c, &id)).await
    }

    /// What a turn of `id` starts from, in one read: its configuration, its open step (one
    /// whose calls were cut short), and its runtime.
    pub async fn outset(&self, id: &SessionId) -> Result<TurnOutset, StoreError> {
        let id = id.clone();
        self.db
            .read_inline(move |c| {
                config::prefetch_config_in(c, &id)?;
                steps::prefetch_open_step_in(c, &id)?;
                facts::prefetch_counters_in(c, &id)?;
                Ok(TurnOutset {
                    config: config::config_in(c, &id)?,
                    open_step: steps::load_open_step(c, &id)?,
                    runtime: facts::runtime_in(c, &id)?,
                })
            })
            .await
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
        let allowed =
            |_: Option<Option<crate::caller::Owner>>| Ok::<(), std::convert::Infallible>(());
        match self.decide_checked(unit, decision, reason, session, by, allowed).await? {
            Ok(decided) => Ok(decided),
            Err(never) => match never {},
        }
    }

    /// Like [`decide_by`](Self::decide_by), once `check` passed, in the same transaction:
    /// `check` is given the owner of the unit's session (`None`: there is no unit `unit`), and
    /// what it refuses is returned without anything written — a decision made over the network
    /// is checked and recorded in one trip to the store.
    pub async fn decide_checked<E, F>(
        &self,
        unit: &str,
        decision: Decision,
        reason: Option<String>,
        session: Option<String>,
        by: String,
        check: F,
    ) -> Result<Result<Result<ApprovalUnit, DecideError>, E>, StoreError>
    where
        E: Send + 'static,
        F: FnOnce(Option<Option<crate::caller::Owner>>) -> Result<(), E> + Send + 'static,
    {
        let unit = unit.to_string();
        let decided = self
            .db
            .run(move |c| {
                if let Err(refused) = check(approvals::owner_of_in(c, &unit)?) {
                    return Ok(Err(refused));
                }
                approvals::decide_in(c, &unit, decision, reason.as_deref(), session.as_deref(), &by)
                    .map(Ok)
            })
            .await?;
        if let Ok(Ok(u)) = &decided {
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
}

pub(crate) use crate::store::json;
