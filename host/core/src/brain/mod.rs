//! Brain: input scheduling, one runner per session, interruption.
//!
//! `submit` persists the input first (the durable inbox), then tries to take the session's
//! runner — a lease row in the database, so two processes can never run one session at once.
//! The loser leaves its input in the inbox (that is the recorded wake) and returns; the holder
//! drains the inbox in order and, in the same transaction that releases the lease, checks for
//! inputs that arrived meanwhile, so no wake is lost. While a runner works it renews its lease
//! and watches the session's durable interrupt flag, turning it into cancellation of the
//! in-flight model call or running component. It does not assemble requests or own tool facts.

use crate::assembly::Assembly;
use crate::ids::SessionId;
use crate::meta::SessionMeta;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::agent::{AgentError, AgentService, Events, TurnOutcome};
use crate::cancel::CancelToken;
use crate::model::ModelError;
use crate::preparation::transition::{PendingUnderstanding, Transition, Understood};
use crate::session::{
    Again, ApprovalUnit, DecideError, Decision, RecoveredSession, RuntimeState, SessionEngine,
    TurnStart,
};
use crate::store::{Db, StoreError, now_ms};

mod direct;
pub mod orchestrate;
mod prepare;
pub mod workgroup;

use crate::session::lease::{self, RunnerId, lease_live};
pub use crate::session::lease::{heartbeat_every, host_id, };
use crate::understand;

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
    local: Arc<std::sync::Mutex<std::collections::HashSet<SessionId>>>,
}

/// A session run by a task of this process; leaves the set on drop.
struct LocalRun {
    local: Arc<std::sync::Mutex<std::collections::HashSet<SessionId>>>,
    id: SessionId,
}

impl Drop for LocalRun {
    fn drop(&mut self) {
        self.local.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.id);
    }
}

impl Brain {
    /// Where the room of session `id`'s next request goes (see [`AgentService::room`]).
    pub async fn room(&self, id: &SessionId) -> Result<crate::assembly::RoomView, AgentError> {
        self.agent.room(id).await
    }

    pub fn new(db: Db, agent: AgentService) -> Self {
        let nonce = format!("{}-{:?}", now_ms(), std::time::Instant::now());
        let owner = RunnerId::current(&blake3::hash(nonce.as_bytes()).to_hex()[..8]).to_string();
        let engine = agent.engine().clone();
        Self { db, agent, engine, owner: owner.into(), local: Arc::default() }
    }

    /// Startup recovery: every session whose runner is gone (its lease is free, or its process
    /// is dead, or it expired) gets its facts recovered — see
    /// `recover_in` — in one transaction. Sessions a live runner
    /// holds are left alone. Returns the sessions that changed or have work to resume.
    pub async fn recover(&self) -> Result<Vec<RecoveredSession>, StoreError> {
        let owner = self.owner.clone();
        self.db
            .run(move |c| {
                // Sessions with work in flight, and sessions some runner holds.
                let (held, busy) = lease::for_recovery_in(c)?;
                let mut candidates: std::collections::BTreeMap<String, Option<(String, i64)>> =
                    crate::session::unsettled_in(c)?
                        .into_iter()
                        .filter(|id| !busy.contains(id))
                        .map(|id| (id, None))
                        .collect();
                for (id, holder, beat) in held {
                    candidates.insert(id, Some((holder, beat)));
                }
                let now = lease::db_now_in(c)?;
                let mut out = Vec::new();
                for (id, held) in candidates {
                    let held = match held {
                        Some(h) => Some(h),
                        // Work in flight and no lease locked above: lock its row now (a host
                        // taking it this moment is waited for, or skipped while it holds it).
                        None => match lease::lock_unheld_in(c, &id)? {
                            None => continue,
                            Some((holder, _)) if holder.is_empty() => None,
                            Some(h) => Some(h),
                        },
                    };
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

    /// Gives up every lease this runner holds (a clean stop): the sessions are taken over by
    /// other hosts at their next look, and this process's later writes to them are refused.
    pub async fn release_all(&self) -> Result<usize, StoreError> {
        let owner = self.owner.clone();
        self.db.run(move |c| lease::release_all_in(c, &owner)).await
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
        let allowed =
            |_: Option<Option<crate::caller::Owner>>| Ok::<(), std::convert::Infallible>(());
        match self.decide_checked(unit, decision, reason, session, by, allowed).await? {
            Ok(decided) => Ok(decided),
            Err(never) => match never {},
        }
    }

    /// Like [`decide_by`](Self::decide_by), once `check` passed in the deciding transaction
    /// (see [`SessionEngine::decide_checked`]).
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
        let decided =
            self.engine().decide_checked(unit, decision, reason, session, by, check).await?;
        if let Ok(Ok(_)) = &decided {
            crate::crash::point("after_decision");
        }
        Ok(decided)
    }

    /// Interrupts session `id` and, in a workgroup, every live session below it: records the
    /// request (a live runner stops at its next check and closes its open calls); a turn that
    /// no live runner holds is closed here — every open call gets an interrupted result and
    /// pending approvals are cancelled. Returns the state `id` was in.
    pub async fn interrupt(&self, id: &SessionId) -> Result<RuntimeState, StoreError> {
        self.stop(id, None).await
    }

    pub fn engine(&self) -> &SessionEngine {
        &self.engine
    }

    /// This process's runner identity.
    #[cfg(any(test, feature = "internals"))]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Marks session `id` as run by this task; `None` when another task of this process runs
    /// it.
    fn enter(&self, id: &SessionId) -> Option<LocalRun> {
        let mut set = self.local.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        set.insert(id.clone()).then(|| LocalRun { local: self.local.clone(), id: id.clone() })
    }

    /// Leaves session `id` after `local`'s run ended with `last`, then runs inputs that another
    /// task of this process queued while it ran and that nobody took: that task found the
    /// session busy, committed its input, and found it busy still when it looked again. (The
    /// other order is covered by that task: it looks again after its commit.)
    async fn leave(
        &self,
        id: &SessionId,
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
                    let id = id.clone();
                    move |c| {
                        let (runtime, pending) = crate::session::runtime_and_pending_in(c, &id)?;
                        let runs = runtime.active_turn.is_none()
                            && !matches!(runtime.state, RuntimeState::Interrupted);
                        Ok(runs && pending > 0)
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
        id: &SessionId,
        input: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Submitted, AgentError> {
        let Some(local) = self.enter(id) else {
            // Another task of this process runs the session: the input waits in the inbox,
            // and that task's loop takes it — or, if it ended meanwhile, this task does.
            let (sid, text) = (id.clone(), input.to_string());
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
        let (sid, text, owner) = (id.clone(), input.to_string(), self.owner.clone());
        let (seq, acquired, begun) = self
            .db
            .run(move |c| {
                let seq = crate::session::submit_in(c, &sid, &text)?;
                let Some(token) = crate::session::take_in(c, &sid, &owner)? else {
                    return Ok((seq, None, None));
                };
                let under_way = crate::session::runtime_in(c, &sid)?.active_turn.is_some();
                let begun = if under_way { None } else { crate::session::begin_turn_in(c, &sid)? };
                Ok((seq, Some(token), begun))
            })
            .await?;
        let Some(token) = acquired else {
            return Ok(Submitted::Queued { inbox_seq: seq });
        };
        self.hold(id, token);
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
        id: &SessionId,
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
        id: &SessionId,
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
            let lost = match result {
                Ok(ran) => {
                    last = ran.last.or(last);
                    ran.lost
                }
                Err(e) => {
                    let _ = self.release(id, true).await;
                    return Err(e);
                }
            };
            // An interrupted or waiting turn releases the session: queued inputs wait for the
            // user (or the decision).
            let interrupted =
                matches!(last, Some(TurnOutcome::Interrupted | TurnOutcome::WaitingApproval(_)));
            // A turn that ended idle released the lease in its last commit (unless inputs
            // waited): then there is nothing left to do here.
            if !interrupted && (lost || !self.holds(id).await?) {
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
        id: &SessionId,
        begun: Option<TurnStart>,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<InboxRun, AgentError> {
        let lease = Some(self.owner.clone());
        let mut last = None;
        // A turn already under way (it waited for an approval, or its process died) comes first.
        if begun.is_none()
            && let Some(turn) = self.engine().runtime(id).await?.active_turn
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
                return Ok(InboxRun { last: Some(outcome), lost: false });
            }
            last = Some(outcome);
        }
        let mut next = begun;
        loop {
            // A turn's last commit may have released the lease: then another runner may hold
            // the session now, and this one must not start another turn.
            if last.is_some() && !self.holds(id).await? {
                return Ok(InboxRun { last, lost: true });
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
        Ok(InboxRun { last, lost: false })
    }

    /// Compacts session `id` on demand (`keel session compact`): takes its runner — refused
    /// while another runner holds it (a running session compacts itself when its requests
    /// near the context window) — summarizes as much of its history as a legal boundary allows
    /// (bounded by what one summary call may be sent), and returns the runner; inputs that
    /// arrived meanwhile are run then.
    #[tracing::instrument(name = "compact", skip_all, fields(session_id = %id))]
    pub async fn compact(
        &self,
        id: &SessionId,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<crate::agent::compact::Compaction, AgentError> {
        use crate::agent::compact::{self, Aim, CompactRequest, Trigger};
        let meta = SessionMeta::read(self.engine(), id).await?;
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
        let state_after = match meta.runtime.state {
            RuntimeState::Running | RuntimeState::Compressing | RuntimeState::PreparingContext
                if meta.runtime.active_turn.is_some() =>
            {
                RuntimeState::PreparingContext
            }
            RuntimeState::Running | RuntimeState::Compressing | RuntimeState::PreparingContext => {
                RuntimeState::Idle
            }
            s => s,
        };
        let estimate = Assembly::of(self.engine()).token_estimate(id).await;
        let per_token =
            estimate.as_ref().map_or(crate::assembly::BYTES_PER_TOKEN, |e| e.bytes_per_token);
        let request = CompactRequest {
            trigger: Trigger::Manual,
            window: None,
            aim: Aim {
                keep_bytes: None,
                input_bytes: meta
                    .config
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
    async fn holds(&self, id: &SessionId) -> Result<bool, StoreError> {
        let (id, owner) = (id.clone(), self.owner.clone());
        self.db.read_inline(move |c| lease::holds_in(c, &id, &owner)).await
    }

    /// Takes the runner lease of `id` if it is free, abandoned, or already ours.
    pub async fn try_acquire(&self, id: &SessionId) -> Result<bool, StoreError> {
        let (sid, owner) = (id.clone(), self.owner.clone());
        let token = self.db.run(move |c| crate::session::take_in(c, &sid, &owner)).await?;
        if let Some(token) = token {
            self.hold(id, token);
        }
        Ok(token.is_some())
    }

    /// Registers the fencing token this runner holds `id`'s lease with: every write of the
    /// session's state checks it from now on.
    fn hold(&self, id: &SessionId, token: i64) {
        let fence = lease::Fence { owner: self.owner.clone(), token };
        self.engine.fences().hold(id.as_str(), fence);
    }

    /// Releases the lease unless unconsumed inputs are waiting (then keeps it and returns
    /// false). With `force`, releases regardless.
    async fn release(&self, id: &SessionId, force: bool) -> Result<bool, StoreError> {
        let (sid, owner) = (id.clone(), self.owner.clone());
        let released = self
            .db
            .run(move |c| {
                // Inputs keep the lease for this runner, except those of an interrupted session:
                // they wait for a person's next message, which takes the session again.
                if !force
                    && crate::session::pending_inputs(c, &sid)? > 0
                    && crate::session::runtime_in(c, &sid)?.state
                        != crate::session::RuntimeState::Interrupted
                {
                    return Ok(false);
                }
                lease::release_in(c, &sid, &owner)?;
                Ok(true)
            })
            .await?;
        if released {
            self.engine.fences().drop_held(id.as_str(), &self.owner);
        }
        Ok(released)
    }

    /// Renews this runner's lease of `id`; false when it was taken over (the runner stops).
    async fn heartbeat(&self, id: &SessionId) -> Result<bool, StoreError> {
        let (id, owner) = (id.clone(), self.owner.clone());
        self.db.run(move |c| lease::heartbeat_in(c, &id, &owner)).await
    }
}

/// What running a session's inbox came to: the last turn's outcome, and whether the runner
/// found its lease gone after it (released by the turn's last commit).
struct InboxRun {
    last: Option<TurnOutcome>,
    lost: bool,
}

/// The background work of a runner: lease renewal and interrupt watching. Stopped on drop.
struct RunnerTasks {
    handle: tokio::task::JoinHandle<()>,
}

impl RunnerTasks {
    fn start(brain: &Brain, id: &SessionId, cancel: &CancelToken) -> Self {
        let (brain, id, cancel) = (brain.clone(), id.clone(), cancel.clone());
        let handle = tokio::spawn(async move {
            let mut since_beat = Duration::ZERO;
            loop {
                tokio::time::sleep(INTERRUPT_POLL).await;
                since_beat += INTERRUPT_POLL;
                if since_beat >= heartbeat_every() {
                    since_beat = Duration::ZERO;
                    if let Ok(false) = brain.heartbeat(&id).await {
                        // Another runner took the session over: stop at once (its writes
                        // would be refused by the fence anyway).
                        tracing::warn!(session = %id, "the session's lease was taken over; this runner stops");
                        cancel.cancel();
                    }
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
