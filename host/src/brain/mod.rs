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
use std::time::Duration;

use rusqlite::{OptionalExtension, params};

use crate::agent::{AgentError, AgentService, Events, TurnOutcome};
use crate::cancel::CancelToken;
use crate::session::{
    ApprovalUnit, DecideError, Decision, RecoveredSession, RuntimeState, SessionEngine, TurnStart,
};
use crate::store::{Db, StoreError, now_ms};

/// A lease not renewed for this long is considered abandoned (its process died).
pub const LEASE_TTL: Duration = Duration::from_secs(15);
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
    owner: Arc<str>,
}

impl Brain {
    pub fn new(db: Db, agent: AgentService) -> Self {
        let nonce = format!("{}-{:?}", now_ms(), std::time::Instant::now());
        let owner = RunnerId::current(&blake3::hash(nonce.as_bytes()).to_hex()[..8]).to_string();
        Self { db, agent, owner: owner.into() }
    }

    /// Startup recovery: every session whose runner is gone (its lease is free, or its process
    /// is dead, or it expired) gets its facts recovered — see
    /// [`recover_in`](crate::session::recover_in) — in one transaction. Sessions a live runner
    /// holds are left alone. Returns the sessions that changed or have work to resume.
    pub async fn recover(&self) -> Result<Vec<RecoveredSession>, StoreError> {
        let owner = self.owner.clone();
        self.db
            .run(move |c| {
                let candidates: Vec<(String, Option<String>, Option<i64>)> = c
                    .prepare(
                        "SELECT s.id, l.owner, l.heartbeat_ms FROM sessions s
                         LEFT JOIN runner_leases l ON l.session_id = s.id
                         WHERE s.active_turn IS NOT NULL OR l.owner IS NOT NULL
                            OR s.state IN ('running', 'preparing_context', 'compressing')
                            OR EXISTS (SELECT 1 FROM inbox i WHERE i.session_id = s.id AND i.consumed_at IS NULL)",
                    )?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<Result<_, _>>()?;
                let now = now_ms();
                let mut out = Vec::new();
                for (id, holder, beat) in candidates {
                    if let (Some(holder), Some(beat)) = (&holder, beat) {
                        if holder.as_str() == &*owner || lease_live(holder, beat, now) {
                            continue;
                        }
                        c.execute("DELETE FROM runner_leases WHERE session_id=?1", [&id])?;
                    }
                    let r = crate::session::recover_in(c, &id)?;
                    if r.resumable || r.state_before != r.state_after || !r.outcome_unknown.is_empty() || !r.rerun.is_empty() {
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
        let decided = self.engine().decide(unit, decision, reason, session).await?;
        if decided.is_ok() {
            crate::crash::point("after_decision");
        }
        Ok(decided)
    }

    /// Interrupts session `id`: records the request (a live runner stops at its next check and
    /// closes its open calls); when no live runner holds the session, closes its turn here —
    /// every open call gets an interrupted result and pending approvals are cancelled.
    pub async fn interrupt(&self, id: &str) -> Result<RuntimeState, StoreError> {
        let before = self.engine().request_interrupt(id).await?;
        let (sid, owner) = (id.to_string(), self.owner.clone());
        self.db
            .run(move |c| {
                let meta = crate::session::SessionEngine::load_meta_in(c, &sid)?;
                if meta.active_turn.is_none() && meta.state != RuntimeState::Running {
                    return Ok(());
                }
                let holder: Option<(String, i64)> = c
                    .query_row(
                        "SELECT owner, heartbeat_ms FROM runner_leases WHERE session_id=?1",
                        [&sid],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                if let Some((h, beat)) = &holder
                    && (h.as_str() == &*owner || lease_live(h, *beat, now_ms()))
                {
                    return Ok(());
                }
                c.execute("DELETE FROM runner_leases WHERE session_id=?1", [&sid])?;
                crate::session::close_turn_in(c, &sid, "interrupted by the user")?;
                Ok(())
            })
            .await?;
        Ok(before)
    }

    pub fn engine(&self) -> &SessionEngine {
        self.agent.engine()
    }

    /// This process's runner identity.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Persists `input` for session `id`, then runs the session until its inbox is empty —
    /// unless another runner holds it.
    pub async fn submit(
        &self,
        id: &str,
        input: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Submitted, AgentError> {
        // The input, the lease attempt and — with the lease, when no turn is under way — the
        // turn's start commit together: one fsync acknowledges the input and starts its turn.
        let (sid, text, owner) = (id.to_string(), input.to_string(), self.owner.clone());
        let (seq, acquired, begun) = self
            .db
            .run(move |c| {
                let seq = crate::session::submit_in(c, &sid, &text)?;
                if !acquire_in(c, &sid, &owner)? {
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
        self.drain_held(id, true, begun, cancel, events)
            .await
            .map(|r| r.unwrap_or(Submitted::Queued { inbox_seq: seq }))
    }

    /// Runs queued inputs of session `id` if no other runner holds it. `None` when another
    /// runner does.
    pub async fn drain(
        &self,
        id: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Option<Submitted>, AgentError> {
        self.drain_held(id, false, None, cancel, events).await
    }

    /// Runs the session while this runner holds it: `begun` is a turn already started in the
    /// transaction that took the lease.
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
            let resume = TurnStart { turn, text: String::new(), lease: lease.clone() };
            let outcome = self.agent.run_turn(id, &resume, cancel, events).await?;
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
            let turn = TurnStart { lease: lease.clone(), ..turn };
            let outcome = self.agent.run_turn(id, &turn, cancel, events).await?;
            let stop =
                matches!(outcome, TurnOutcome::Interrupted | TurnOutcome::WaitingApproval(_));
            last = Some(outcome);
            if stop {
                break;
            }
        }
        Ok(last)
    }

    /// Whether this runner holds the lease of `id` (a read).
    async fn holds(&self, id: &str) -> Result<bool, StoreError> {
        let (id, owner) = (id.to_string(), self.owner.clone());
        self.db
            .read_inline(move |c| {
                Ok(c.prepare_cached(
                    "SELECT EXISTS(SELECT 1 FROM runner_leases WHERE session_id=?1 AND owner=?2)",
                )?
                .query_row(params![id, &*owner], |r| r.get(0))?)
            })
            .await
    }

    /// Takes the runner lease of `id` if it is free, abandoned, or already ours.
    pub async fn try_acquire(&self, id: &str) -> Result<bool, StoreError> {
        let (id, owner) = (id.to_string(), self.owner.clone());
        self.db.run(move |c| acquire_in(c, &id, &owner)).await
    }

    /// Releases the lease unless unconsumed inputs are waiting (then keeps it and returns
    /// false). With `force`, releases regardless.
    async fn release(&self, id: &str, force: bool) -> Result<bool, StoreError> {
        let (id, owner) = (id.to_string(), self.owner.clone());
        self.db.run(move |c| release_in(c, &id, &owner, force)).await
    }

    async fn heartbeat(&self, id: &str) -> Result<(), StoreError> {
        let (id, owner) = (id.to_string(), self.owner.clone());
        self.db
            .run(move |c| {
                c.execute(
                    "UPDATE runner_leases SET heartbeat_ms=?3 WHERE session_id=?1 AND owner=?2",
                    params![id, &*owner, now_ms()],
                )?;
                Ok(())
            })
            .await
    }
}

/// Releases `owner`'s runner lease of `id` unless unconsumed inputs are waiting (then keeps it
/// and returns false); with `force`, releases regardless. For callers that compose it into a
/// larger transaction (a turn's last commit releases the lease with it).
pub fn release_in(
    c: &rusqlite::Connection,
    id: &str,
    owner: &str,
    force: bool,
) -> Result<bool, StoreError> {
    if !force {
        let waiting: bool = c
            .prepare_cached(
                "SELECT EXISTS(SELECT 1 FROM inbox WHERE session_id=?1 AND consumed_at IS NULL)",
            )?
            .query_row([id], |r| r.get(0))?;
        if waiting {
            return Ok(false);
        }
    }
    c.prepare_cached("DELETE FROM runner_leases WHERE session_id=?1 AND owner=?2")?
        .execute(params![id, owner])?;
    Ok(true)
}

/// Takes the runner lease of `id` for `owner` if it is free, abandoned, or already theirs.
fn acquire_in(c: &rusqlite::Connection, id: &str, owner: &str) -> Result<bool, StoreError> {
    let now = now_ms();
    let held: Option<(String, i64)> = c
        .prepare_cached("SELECT owner, heartbeat_ms FROM runner_leases WHERE session_id=?1")?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let free = match &held {
        None => true,
        Some((o, _)) if o == owner => true,
        Some((o, beat)) => !lease_live(o, *beat, now),
    };
    if free {
        c.prepare_cached(
            "INSERT INTO runner_leases (session_id, owner, heartbeat_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (session_id) DO UPDATE SET owner=excluded.owner, heartbeat_ms=excluded.heartbeat_ms",
        )?
        .execute(params![id, owner, now])?;
    }
    Ok(free)
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

/// A runner's identity: `host/pid/start/nonce`. On the same host, a lease whose process is gone
/// (or whose pid now belongs to a process started later) is abandoned at once; elsewhere it is
/// abandoned when its heartbeat is older than [`LEASE_TTL`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct RunnerId {
    host: String,
    pid: u32,
    start: u64,
    nonce: String,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown-host".into())
}

/// The start time of process `pid` (clock ticks since boot), where the system tells it.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split(' ').nth(19)?.parse().ok()
}

impl RunnerId {
    fn current(nonce: &str) -> Self {
        let pid = std::process::id();
        Self {
            host: hostname(),
            pid,
            start: process_start(pid).unwrap_or(0),
            nonce: nonce.to_string(),
        }
    }

    fn parse(s: &str) -> Option<Self> {
        let mut p = s.rsplitn(4, '/');
        let nonce = p.next()?.to_string();
        let start = p.next()?.parse().ok()?;
        let pid = p.next()?.parse().ok()?;
        let host = p.next()?.to_string();
        Some(Self { host, pid, start, nonce })
    }
}

impl std::fmt::Display for RunnerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}/{}", self.host, self.pid, self.start, self.nonce)
    }
}

/// Whether the lease of `holder`, last renewed at `beat`, still binds its session.
fn lease_live(holder: &str, beat: i64, now: i64) -> bool {
    if let Some(h) = RunnerId::parse(holder)
        && h.host == hostname()
        && h.start != 0
    {
        if h.pid == std::process::id() {
            return true;
        }
        return process_start(h.pid) == Some(h.start);
    }
    now - beat <= LEASE_TTL.as_millis() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runner_ids_round_trip_and_dead_processes_release_their_leases() {
        let me = RunnerId::current("abc");
        assert_eq!(RunnerId::parse(&me.to_string()), Some(me.clone()));
        assert!(lease_live(&me.to_string(), 0, i64::MAX), "this process is alive");
        // A pid with another start time is a different (or no) process.
        let other = RunnerId { pid: me.pid, start: me.start + 1, ..me.clone() };
        let dead = RunnerId { pid: u32::MAX - 1, ..me.clone() };
        assert!(!lease_live(&dead.to_string(), now_ms(), now_ms()));
        assert!(lease_live(&other.to_string(), 0, 0), "same pid counts as this process");
        // Another host: the heartbeat decides.
        let remote = RunnerId { host: "elsewhere".into(), ..me };
        assert!(lease_live(&remote.to_string(), now_ms(), now_ms()));
        assert!(!lease_live(&remote.to_string(), 0, LEASE_TTL.as_millis() as i64 + 1));
    }
}
