//! Brain: input scheduling, one runner per session, interruption.
//!
//! `submit` persists the input first (the durable inbox), then tries to take the session's
//! runner — a lease row in the database, so two processes can never run one session at once.
//! The loser leaves its input in the inbox (that is the recorded wake) and returns; the holder
//! drains the inbox in order and, in the same transaction that releases the lease, checks for
//! inputs that arrived meanwhile, so no wake is lost. While a runner works it renews its lease
//! and watches the session's durable interrupt flag, turning it into cancellation of the
//! in-flight model call or running component. It does not assemble requests or own tool facts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::{AgentError, AgentService, Events, TurnOutcome};
use crate::cancel::CancelToken;
use crate::model::ModelError;
use crate::session::transition::{PendingUnderstanding, Transition, Understood};
use crate::session::{
    Again, ApprovalUnit, DecideError, Decision, RecoveredSession, RuntimeState, SessionEngine,
    TurnStart,
};
use crate::store::{Db, StoreError, now_ms};

mod direct;
pub mod orchestrate;
pub mod workgroup;

pub use crate::session::lease::LEASE_TTL;
use crate::session::lease::{self, RunnerId, lease_live};
use crate::understand;

/// How often a runner renews its lease.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// How often a runner checks the session's interrupt flag.
pub const INTERRUPT_POLL: Duration = Duration::from_millis(100);

/// What `submit` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// This call ran the session's turns; the last one ended like this.
    Ran(TurnOutcome),
    /// Another runner holds the session; the input is queued in its inbox and will be run by it.
    Queued { inbox_seq: i64 },
}

/// The Brain of one process.
#[derive(Clone)]
pub struct Brain {
    db: Db,
    agent: AgentService,
    engine: SessionEngine,
    owner: Arc<str>,
    /// Sessions a task of this process is running now. The lease row names the process, so it
    /// cannot tell two of its tasks apart: this set does.
    local: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// A session run by a task of this process; leaves the set on drop.
struct LocalRun {
    local: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    id: String,
}

impl Drop for LocalRun {
    fn drop(&mut self) {
        self.local.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.id);
    }
}

impl Brain {
    pub fn new(db: Db, agent: AgentService) -> Self {
        let nonce = format!("{}-{:?}", now_ms(), std::time::Instant::now());
        let owner = RunnerId::current(&blake3::hash(nonce.as_bytes()).to_hex()[..8]).to_string();
        let engine = agent.engine().clone();
        Self { db, agent, engine, owner: owner.into(), local: Arc::default() }
    }

    /// Startup recovery: every session whose runner is gone (its lease is free, or its process
    /// is dead, or it expired) gets its facts recovered — see
    /// [`recover_in`](crate::session::recover_in) — in one transaction. Sessions a live runner
    /// holds are left alone. Returns the sessions that changed or have work to resume.
    pub async fn recover(&self) -> Result<Vec<RecoveredSession>, StoreError> {
        let owner = self.owner.clone();
        self.db
            .run(move |c| {
                // Sessions with work in flight, and sessions some runner holds.
                let mut candidates: std::collections::BTreeMap<String, Option<(String, i64)>> =
                    crate::session::unsettled_in(c)?.into_iter().map(|id| (id, None)).collect();
                for (id, holder, beat) in lease::all_in(c)? {
                    candidates.insert(id, Some((holder, beat)));
                }
                let now = now_ms();
                let mut out = Vec::new();
                for (id, held) in candidates {
                    if let Some((holder, beat)) = &held {
                        if holder.as_str() == &*owner || lease_live(holder, *beat, now) {
                            continue;
                        }
                        lease::drop_in(c, &id)?;
                    }
                    let r = crate::session::recover_in(c, &id)?;
                    if r.resumable
                        || r.state_before != r.state_after
                        || !r.outcome_unknown.is_empty()
                        || !r.rerun.is_empty()
                    {
                        out.push(r);
                    }
                }
                Ok(out)
            })
            .await
    }

    /// Records a decision on an approval unit (exactly one decision wins under any number of
    /// concurrent deciders). The caller then resumes the session with [`drain`](Self::drain).
    pub async fn decide(
        &self,
        unit: &str,
        decision: Decision,
        reason: Option<String>,
        session: Option<String>,
    ) -> Result<Result<ApprovalUnit, DecideError>, StoreError> {
        self.decide_by(unit, decision, reason, session, crate::session::local_decider()).await
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
        let decided = self.engine().decide_by(unit, decision, reason, session, by).await?;
        if decided.is_ok() {
            crate::crash::point("after_decision");
        }
        Ok(decided)
    }

    /// Interrupts session `id` and, in a workgroup, every live session below it: records the
    /// request (a live runner stops at its next check and closes its open calls); a turn that
    /// no live runner holds is closed here — every open call gets an interrupted result and
    /// pending approvals are cancelled. Returns the state `id` was in.
    pub async fn interrupt(&self, id: &str) -> Result<RuntimeState, StoreError> {
        self.stop(id, None).await
    }

    pub fn engine(&self) -> &SessionEngine {
        &self.engine
    }

    /// This process's runner identity.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Marks session `id` as run by this task; `None` when another task of this process runs
    /// it.
    fn enter(&self, id: &str) -> Option<LocalRun> {
        let mut set = self.local.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        set.insert(id.to_string())
            .then(|| LocalRun { local: self.local.clone(), id: id.to_string() })
    }

    /// Leaves session `id` after `local`'s run ended with `last`, then runs inputs that another
    /// task of this process queued while it ran and that nobody took: that task found the
    /// session busy, committed its input, and found it busy still when it looked again. (The
    /// other order is covered by that task: it looks again after its commit.)
    async fn leave(
        &self,
        id: &str,
        local: LocalRun,
        mut last: Option<Submitted>,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Option<Submitted>, AgentError> {
        drop(local);
        loop {
            let waiting = self
                .db
                .read_inline({
                    let id = id.to_string();
                    move |c| {
                        let meta = SessionEngine::load_meta_in(c, &id)?;
                        let runs = meta.active_turn.is_none()
                            && !matches!(meta.state, RuntimeState::Interrupted);
                        Ok(runs && crate::session::pending_inputs(c, &id)? > 0)
                    }
                })
                .await?;
            if !waiting {
                return Ok(last);
            }
            let Some(local) = self.enter(id) else { return Ok(last) };
            let ran = self.drain_held(id, false, None, cancel, events).await;
            drop(local);
            match ran? {
                Some(r) => last = Some(r),
                // Another process holds it: that runner takes the inputs.
                None => return Ok(last),
            }
        }
    }

    /// Persists `input` for session `id`, then runs the session until its inbox is empty —
    /// unless another runner holds it (another process, or another task of this one).
    pub async fn submit(
        &self,
        id: &str,
        input: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Submitted, AgentError> {
        let Some(local) = self.enter(id) else {
            // Another task of this process runs the session: the input waits in the inbox,
            // and that task's loop takes it — or, if it ended meanwhile, this task does.
            let (sid, text) = (id.to_string(), input.to_string());
            let seq = self.db.run(move |c| crate::session::submit_in(c, &sid, &text)).await?;
            return match self.enter(id) {
                Some(local) => Ok(self
                    .leave(id, local, None, cancel, events)
                    .await?
                    .unwrap_or(Submitted::Queued { inbox_seq: seq })),
                None => Ok(Submitted::Queued { inbox_seq: seq }),
            };
        };
        // The input, the lease attempt and — with the lease, when no turn is under way — the
        // turn's start commit together: one fsync acknowledges the input and starts its turn.
        let (sid, text, owner) = (id.to_string(), input.to_string(), self.owner.clone());
        let (seq, acquired, begun) = self
            .db
            .run(move |c| {
                let seq = crate::session::submit_in(c, &sid, &text)?;
                if !lease::acquire_in(c, &sid, &owner)? {
                    return Ok((seq, false, None));
                }
                let under_way =
                    crate::session::SessionEngine::load_meta_in(c, &sid)?.active_turn.is_some();
                let begun = if under_way { None } else { crate::session::begin_turn_in(c, &sid)? };
                Ok((seq, true, begun))
            })
            .await?;
        if !acquired {
            return Ok(Submitted::Queued { inbox_seq: seq });
        }
        let ran = self.drain_held(id, true, begun, cancel, events).await?;
        Ok(self
            .leave(id, local, ran, cancel, events)
            .await?
            .unwrap_or(Submitted::Queued { inbox_seq: seq }))
    }

    /// Runs queued inputs of session `id` if no other runner holds it. `None` when another
    /// runner does.
    pub async fn drain(
        &self,
        id: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Option<Submitted>, AgentError> {
        let Some(local) = self.enter(id) else { return Ok(None) };
        let ran = self.drain_held(id, false, None, cancel, events).await?;
        self.leave(id, local, ran, cancel, events).await
    }

    /// Runs the session while this runner holds it: `begun` is a turn already started in the
    /// transaction that took the lease.
    #[tracing::instrument(name = "runner", skip_all, fields(session_id = %id))]
    async fn drain_held(
        &self,
        id: &str,
        mut held: bool,
        mut begun: Option<TurnStart>,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Option<Submitted>, AgentError> {
        let mut last = None;
        loop {
            if !held && !self.try_acquire(id).await? {
                return Ok(last.map(Submitted::Ran));
            }
            held = true;
            let guard = RunnerTasks::start(self, id, cancel);
            let result = self.run_inbox(id, begun.take(), cancel, events).await;
            drop(guard);
            match result {
                Ok(Some(outcome)) => last = Some(outcome),
                Ok(None) => {}
                Err(e) => {
                    let _ = self.release(id, true).await;
                    return Err(e);
                }
            }
            // An interrupted or waiting turn releases the session: queued inputs wait for the
            // user (or the decision).
            let interrupted =
                matches!(last, Some(TurnOutcome::Interrupted | TurnOutcome::WaitingApproval(_)));
            // A turn that ended idle released the lease in its last commit (unless inputs
            // waited): then there is nothing left to do here.
            if !interrupted && !self.holds(id).await? {
                return Ok(Some(Submitted::Ran(
                    last.unwrap_or(TurnOutcome::Answer(String::new())),
                )));
            }
            // Release unless inputs arrived meanwhile (checked in the same transaction).
            if self.release(id, interrupted).await? || interrupted {
                return Ok(Some(Submitted::Ran(
                    last.unwrap_or(TurnOutcome::Answer(String::new())),
                )));
            }
        }
    }

    async fn run_inbox(
        &self,
        id: &str,
        begun: Option<TurnStart>,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Option<TurnOutcome>, AgentError> {
        let lease = Some(self.owner.clone());
        let mut last = None;
        // A turn already under way (it waited for an approval, or its process died) comes first.
        if begun.is_none()
            && let Some(turn) = self.engine().meta(id).await?.active_turn
        {
            // Its process may have died before its transition was committed.
            let announced = self.understand(id, cancel, true).await?;
            let resume = TurnStart {
                turn,
                text: String::new(),
                lease: lease.clone(),
                understand: false,
                resumed: !announced,
            };
            // Boxed: a turn's future is deep, and a caller's future that holds it whole would
            // pass the compiler's type-depth limit.
            let outcome = Box::pin(self.agent.run_turn(id, &resume, cancel, events)).await?;
            if matches!(outcome, TurnOutcome::Interrupted | TurnOutcome::WaitingApproval(_)) {
                return Ok(Some(outcome));
            }
            last = Some(outcome);
        }
        let mut next = begun;
        loop {
            // A turn's last commit may have released the lease: then another runner may hold
            // the session now, and this one must not start another turn.
            if last.is_some() && !self.holds(id).await? {
                break;
            }
            let turn = match next.take() {
                Some(t) => t,
                None => match self.engine().begin_turn(id).await? {
                    Some(t) => t,
                    None => break,
                },
            };
            if turn.understand {
                self.understand(id, cancel, false).await?;
            }
            let turn = TurnStart { lease: lease.clone(), ..turn };
            let outcome = Box::pin(self.agent.run_turn(id, &turn, cancel, events)).await?;
            let stop =
                matches!(outcome, TurnOutcome::Interrupted | TurnOutcome::WaitingApproval(_));
            last = Some(outcome);
            if stop {
                break;
            }
        }
        Ok(last)
    }

    /// Task understanding of the session's active turn, when its transition is pending: the
    /// stateless call (if the session has it on), then the transition's commit, then
    /// capability preparation when the goals changed. A turn whose transition is committed
    /// already is left as it is: an input is understood and applied once. `resumed`: a runner
    /// takes the turn over from one that stopped (a call it makes again is announced again).
    /// Returns whether it announced the turn's next model call (the commit that ends the
    /// preparation does).
    #[tracing::instrument(name = "understand", skip_all, fields(session_id = %id))]
    async fn understand(
        &self,
        id: &str,
        cancel: &CancelToken,
        resumed: bool,
    ) -> Result<bool, AgentError> {
        let Some(pending) = self.engine().pending_understanding(id).await? else {
            // Committed already: its capability preparation may not have finished (the
            // process died in between).
            if let Some(t) = self.engine().unprepared(id).await?
                && let Some(config) = self.engine().meta(id).await?.preprocess
            {
                self.prepare_capabilities(id, &t, &config, cancel).await?;
                return Ok(true);
            }
            return Ok(false);
        };
        let understood = match &pending.preprocess {
            None => Understood::default(),
            Some(config) => {
                if resumed {
                    self.engine().resume_turn(id, pending.turn, Again::Understanding).await?;
                }
                let understood = self.understanding_call(config, &pending, cancel).await;
                crate::crash::point("after_understanding_call");
                understood
            }
        };
        // The fixed table's mode is known before the commit: a transition that prepares
        // capabilities recalls first, so that the recall commits with the transition (and,
        // with nothing to choose from, the whole preparation does).
        let mode = understood.mode(pending.phase_goal.as_deref());
        let recalled = match &pending.preprocess {
            Some(_) if crate::session::transition::prepares_capabilities(mode, true) => {
                let meta = self.engine().meta(id).await?;
                Some(self.recall(&meta, pending.turn, mode, &understood.terms()).await)
            }
            _ => None,
        };
        let committed =
            self.engine().commit_transition(id, pending.turn, understood, recalled.clone()).await?;
        let announced = committed.is_some();
        if let (Some(t), Some(r), Some(config)) = (committed, recalled, &pending.preprocess)
            && !r.candidates.is_empty()
        {
            crate::crash::point("after_recall");
            self.orchestrate(id, &t, config, &r.candidates, cancel).await?;
        }
        Ok(announced)
    }

    /// The understanding call: one stateless, non-streamed JSON request holding the message,
    /// its resources and the two goals; its answer read liberally. A failed call or an
    /// unreadable answer is `uncertain`, with the reason kept.
    async fn understanding_call(
        &self,
        config: &understand::PreprocessConfig,
        pending: &PendingUnderstanding,
        cancel: &CancelToken,
    ) -> Understood {
        let body = understand::request_body(
            config,
            understand::Inputs {
                message: &pending.text,
                resources: &[],
                current_task_goal: pending.phase_goal.as_deref(),
                session_goal: pending.session_goal.as_deref(),
            },
        );
        let body = bytes::Bytes::from(body);
        let started = Instant::now();
        let result = self.agent.model().complete(&config.model, &body, cancel).await;
        let duration_ms = started.elapsed().as_secs_f64() * 1e3;
        let (understanding, error, reply, attempts) = match result {
            Ok(reply) => {
                let content = reply.content.unwrap_or_default();
                match understand::parse(&content) {
                    Ok((u, reader)) => {
                        reader.log("task understanding");
                        (u, None, Some(content), reply.attempts)
                    }
                    Err(e) => (
                        understand::Understanding::uncertain(),
                        Some(format!("the answer was refused: {e}")),
                        Some(content),
                        reply.attempts,
                    ),
                }
            }
            Err(f) => {
                let why = if f.last == ModelError::Cancelled {
                    "the call was interrupted".to_string()
                } else {
                    f.to_string()
                };
                (understand::Understanding::uncertain(), Some(why), None, f.attempts)
            }
        };
        if let Some(e) = &error {
            tracing::debug!(error = %e, "task understanding is uncertain");
        }
        Understood {
            understanding: Some(understanding),
            error,
            request: Some(body.to_vec()),
            reply,
            duration_ms,
            attempts,
        }
    }

    /// Capability preparation for a transition that set the goals (`initialize` or
    /// `reconcile`): recall of the three groups — skills, tools, the user's memories — in
    /// parallel; the recall's commit; the Orchestrator's call when there are candidates to
    /// choose from; the commit that adds what it selected and applies the environment. A
    /// failed recall group or call leaves the environment as it was, with an event saying
    /// what failed, and the turn goes on.
    async fn prepare_capabilities(
        &self,
        id: &str,
        transition: &Transition,
        config: &understand::PreprocessConfig,
        cancel: &CancelToken,
    ) -> Result<(), AgentError> {
        let meta = self.engine().meta(id).await?;
        let record = self.recall(&meta, transition.turn, transition.mode, &transition.terms).await;
        if record.candidates.is_empty() {
            // Nothing to choose from: no call; the recall and the environment in one commit.
            let call = crate::session::capabilities::OrchestratorCall::default();
            self.engine().record_recall(id, record, Some(call)).await?;
            return Ok(());
        }
        let candidates = record.candidates.clone();
        self.engine().record_recall(id, record, None).await?;
        crate::crash::point("after_recall");
        self.orchestrate(id, transition, config, &candidates, cancel).await
    }

    /// The recall of one transition, timed, as it is recorded.
    async fn recall(
        &self,
        meta: &crate::session::SessionMeta,
        turn: i64,
        mode: crate::understand::TransitionMode,
        terms: &crate::session::transition::RecallTerms,
    ) -> crate::session::capabilities::RecallRecord {
        let started = Instant::now();
        let recalled = recall(&self.db, meta, terms).await;
        crate::session::capabilities::RecallRecord {
            turn,
            mode: mode.as_str().to_string(),
            candidates: recalled.candidates,
            memories: recalled.memories,
            error: recalled.error,
            recall_ms: started.elapsed().as_secs_f64() * 1e3,
        }
    }

    /// The Orchestrator's call over recorded candidates, then the commit that adds what it
    /// selected and applies the environment.
    #[tracing::instrument(name = "orchestrate", skip_all, fields(session_id = %id))]
    async fn orchestrate(
        &self,
        id: &str,
        transition: &Transition,
        config: &understand::PreprocessConfig,
        candidates: &crate::session::capabilities::Candidates,
        cancel: &CancelToken,
    ) -> Result<(), AgentError> {
        let meta = self.engine().meta(id).await?;
        let call = self.orchestrator_call(config, &meta, transition, candidates, cancel).await;
        crate::crash::point("after_orchestration_call");
        self.engine().finish_orchestration(id, transition.turn, call).await?;
        Ok(())
    }

    /// The Orchestrator's call: one stateless, non-streamed JSON request; its answer read
    /// liberally and kept to the candidates. A failed call or an unreadable answer adds nothing.
    async fn orchestrator_call(
        &self,
        config: &understand::PreprocessConfig,
        meta: &crate::session::SessionMeta,
        transition: &Transition,
        candidates: &crate::session::capabilities::Candidates,
        cancel: &CancelToken,
    ) -> crate::session::capabilities::OrchestratorCall {
        let skills: Vec<String> = meta.skills.iter().map(|s| s.name.clone()).collect();
        let body = orchestrate::request_body(
            config,
            orchestrate::Inputs {
                mode: transition.mode.as_str(),
                session_goal: transition.session_goal.as_deref(),
                phase_goal: transition.phase_goal.as_deref(),
                terms: &transition.terms,
                loaded_tools: &meta.loaded_tools,
                loaded_skills: &skills,
                candidates,
            },
        );
        let body = bytes::Bytes::from(body);
        let started = Instant::now();
        let result = self.agent.model().complete(&config.model, &body, cancel).await;
        let duration_ms = started.elapsed().as_secs_f64() * 1e3;
        let mut call = crate::session::capabilities::OrchestratorCall {
            request: Some(body.to_vec()),
            duration_ms,
            ..Default::default()
        };
        match result {
            Ok(reply) => {
                call.attempts = reply.attempts;
                let content = reply.content.unwrap_or_default();
                match orchestrate::parse(&content) {
                    Ok((answer, reader)) => {
                        reader.log("orchestrator");
                        let (selection, dropped) = orchestrate::validate(answer, candidates);
                        if !dropped.is_empty() {
                            tracing::info!(session = %meta.id, ?dropped, "the orchestrator named what recall did not offer");
                        }
                        call.selection = selection;
                        call.dropped = dropped;
                    }
                    Err(e) => call.error = Some(format!("the answer was refused: {e}")),
                }
                call.reply = Some(content);
            }
            Err(f) => {
                call.attempts = f.attempts;
                call.error = Some(if f.last == ModelError::Cancelled {
                    "the call was interrupted".to_string()
                } else {
                    f.to_string()
                });
            }
        }
        call
    }

    /// Compacts session `id` on demand (`keel session compact`): takes its runner — refused
    /// while another runner holds it (a running session compacts itself when its requests
    /// near the context window) — summarizes as much of its history as a legal boundary allows
    /// (bounded by what one summary call may be sent), and returns the runner; inputs that
    /// arrived meanwhile are run then.
    #[tracing::instrument(name = "compact", skip_all, fields(session_id = %id))]
    pub async fn compact(
        &self,
        id: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<crate::agent::compact::Compaction, AgentError> {
        use crate::agent::compact::{self, Aim, CompactRequest, Trigger};
        let meta = self.engine().meta(id).await?;
        let busy = || {
            StoreError::Conflict(format!(
                "session `{id}` is held by a runner that is working on it; a running session compacts itself \
                 when its requests near the context window (--context-window). Try again when it is idle"
            ))
        };
        let Some(local) = self.enter(id) else { return Err(busy().into()) };
        if !self.try_acquire(id).await? {
            return Err(busy().into());
        }
        let guard = RunnerTasks::start(self, id, cancel);
        let state_after = match meta.state {
            RuntimeState::Running | RuntimeState::Compressing | RuntimeState::PreparingContext
                if meta.active_turn.is_some() =>
            {
                RuntimeState::PreparingContext
            }
            RuntimeState::Running | RuntimeState::Compressing | RuntimeState::PreparingContext => {
                RuntimeState::Idle
            }
            s => s,
        };
        let estimate = self.engine().token_estimate(id).await;
        let per_token =
            estimate.as_ref().map_or(crate::session::BYTES_PER_TOKEN, |e| e.bytes_per_token);
        let request = CompactRequest {
            trigger: Trigger::Manual,
            aim: Aim {
                keep_bytes: None,
                input_bytes: meta
                    .model
                    .context_window
                    .map(|w| (w as f64 * compact::INPUT_FRACTION * per_token) as i64),
            },
            before: estimate.ok().map(|e| (e.bytes, e.tokens)),
            state_after,
        };
        let result = self.agent.compact(id, request, cancel).await;
        drop(guard);
        let outcome = match result {
            Ok(o) => o,
            Err(e) => {
                let _ = self.release(id, true).await;
                return Err(e);
            }
        };
        let ran = if self.release(id, false).await? {
            None
        } else {
            self.drain_held(id, true, None, cancel, events).await?
        };
        self.leave(id, local, ran, cancel, events).await?;
        Ok(outcome)
    }

    /// Whether this runner holds the lease of `id` (a read).
    async fn holds(&self, id: &str) -> Result<bool, StoreError> {
        let (id, owner) = (id.to_string(), self.owner.clone());
        self.db.read_inline(move |c| lease::holds_in(c, &id, &owner)).await
    }

    /// Takes the runner lease of `id` if it is free, abandoned, or already ours.
    pub async fn try_acquire(&self, id: &str) -> Result<bool, StoreError> {
        let (id, owner) = (id.to_string(), self.owner.clone());
        self.db.run(move |c| lease::acquire_in(c, &id, &owner)).await
    }

    /// Releases the lease unless unconsumed inputs are waiting (then keeps it and returns
    /// false). With `force`, releases regardless.
    async fn release(&self, id: &str, force: bool) -> Result<bool, StoreError> {
        let (id, owner) = (id.to_string(), self.owner.clone());
        self.db
            .run(move |c| {
                // Inputs keep the lease for this runner, except those of an interrupted session:
                // they wait for a person's next message, which takes the session again.
                if !force
                    && crate::session::pending_inputs(c, &id)? > 0
                    && crate::session::SessionEngine::load_meta_in(c, &id)?.state
                        != crate::session::RuntimeState::Interrupted
                {
                    return Ok(false);
                }
                lease::release_in(c, &id, &owner)?;
                Ok(true)
            })
            .await
    }

    async fn heartbeat(&self, id: &str) -> Result<(), StoreError> {
        let (id, owner) = (id.to_string(), self.owner.clone());
        self.db.run(move |c| lease::heartbeat_in(c, &id, &owner)).await
    }
}

/// What recall found for one transition.
struct Recalled {
    candidates: crate::session::capabilities::Candidates,
    memories: Vec<crate::memory::Memory>,
    /// What failed, group by group.
    error: Option<String>,
}

/// Recalls the three groups — skills, tools (as tool sets and single tools), the session
/// user's memories — in parallel on the read pool. Scores truncate and order each group and
/// are logged; then what the session has loaded already is left out and each group is sorted
/// by stable reference, so neither scores nor completion order reach a request.
async fn recall(
    db: &Db,
    meta: &crate::session::SessionMeta,
    terms: &crate::session::transition::RecallTerms,
) -> Recalled {
    use crate::search::MAX_CANDIDATES;
    let (skill_terms, tool_terms, memory_terms) =
        (terms.skill.clone(), terms.tool.clone(), terms.memory.clone());
    let user = meta.user();
    let (skills, tools, memories) = tokio::join!(
        db.read(move |c| crate::skills::recall_in(c, &skill_terms, MAX_CANDIDATES)),
        db.read(move |c| {
            let hits = crate::tools::recall_in(c, &tool_terms, MAX_CANDIDATES)?;
            let mut sets = Vec::new();
            for h in &hits {
                if !sets.iter().any(|s: &crate::tools::ToolSetRef| s.name == h.item.component)
                    && let Some(set) = crate::tools::toolset_in(c, &h.item.component)?
                {
                    sets.push(set);
                }
            }
            Ok((hits, sets))
        }),
        db.read(move |c| crate::memory::recall_in(
            c,
            &user,
            &memory_terms,
            crate::memory::RECALLED
        )),
    );
    let mut errors = Vec::new();
    let mut out = Recalled { candidates: Default::default(), memories: Vec::new(), error: None };
    match skills {
        Ok(hits) => {
            for h in &hits {
                tracing::debug!(session = %meta.id, skill = %h.item.name, score = h.score, "skill recalled");
            }
            out.candidates.skills = hits
                .into_iter()
                .map(|h| h.item)
                .filter(|s| !meta.skills.iter().any(|l| l.name == s.name))
                .collect();
        }
        Err(e) => errors.push(format!("skills: {e}")),
    }
    match tools {
        Ok((hits, sets)) => {
            for h in &hits {
                tracing::debug!(session = %meta.id, tool = %h.item.name, score = h.score, "tool recalled");
            }
            let loaded = |t: &String| meta.loaded_tools.contains(t);
            out.candidates.tools =
                hits.into_iter().map(|h| h.item).filter(|t| !loaded(&t.name)).collect();
            out.candidates.toolsets =
                sets.into_iter().filter(|s| !s.tools.iter().all(loaded)).collect();
        }
        Err(e) => errors.push(format!("tools: {e}")),
    }
    match memories {
        Ok(hits) => {
            for h in &hits {
                tracing::debug!(session = %meta.id, memory = h.item.id, score = h.score, "memory recalled");
            }
            out.memories = hits.into_iter().map(|h| h.item).collect();
        }
        Err(e) => errors.push(format!("memory: {e}")),
    }
    crate::search::by_reference(&mut out.candidates.skills, |s| s.name.clone());
    crate::search::by_reference(&mut out.candidates.tools, |t| t.name.clone());
    crate::search::by_reference(&mut out.candidates.toolsets, |t| t.name.clone());
    crate::search::by_reference(&mut out.memories, |m| m.id);
    if !errors.is_empty() {
        tracing::warn!(session = %meta.id, "recall failed in part: {}", errors.join("; "));
        out.error = Some(errors.join("; "));
    }
    out
}

/// The background work of a runner: lease renewal and interrupt watching. Stopped on drop.
struct RunnerTasks {
    handle: tokio::task::JoinHandle<()>,
}

impl RunnerTasks {
    fn start(brain: &Brain, id: &str, cancel: &CancelToken) -> Self {
        let (brain, id, cancel) = (brain.clone(), id.to_string(), cancel.clone());
        let handle = tokio::spawn(async move {
            let mut since_beat = Duration::ZERO;
            loop {
                tokio::time::sleep(INTERRUPT_POLL).await;
                since_beat += INTERRUPT_POLL;
                if since_beat >= HEARTBEAT {
                    since_beat = Duration::ZERO;
                    let _ = brain.heartbeat(&id).await;
                }
                if brain.engine().interrupt_requested(&id).await.unwrap_or(false) {
                    cancel.cancel();
                }
            }
        });
        Self { handle }
    }
}

impl Drop for RunnerTasks {
    fn drop(&mut self) {
        self.handle.abort();
    }
}
