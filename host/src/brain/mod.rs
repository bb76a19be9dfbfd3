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
use crate::sandbox::CancelToken;
use crate::session::SessionEngine;
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
        let owner = format!(
            "{}-{}",
            std::process::id(),
            &blake3::hash(&now_ms().to_le_bytes()).to_hex()[..8]
        );
        Self { db, agent, owner: owner.into() }
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
        // The input and the lease attempt commit together: one fsync acknowledges the input.
        let (sid, text, owner) = (id.to_string(), input.to_string(), self.owner.clone());
        let (seq, acquired) = self
            .db
            .run(move |c| {
                let seq = crate::session::submit_in(c, &sid, &text)?;
                Ok((seq, acquire_in(c, &sid, &owner)?))
            })
            .await?;
        if !acquired {
            return Ok(Submitted::Queued { inbox_seq: seq });
        }
        self.drain_held(id, true, cancel, events)
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
        self.drain_held(id, false, cancel, events).await
    }

    async fn drain_held(
        &self,
        id: &str,
        mut held: bool,
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
            let result = self.run_inbox(id, cancel, events).await;
            drop(guard);
            match result {
                Ok(Some(outcome)) => last = Some(outcome),
                Ok(None) => {}
                Err(e) => {
                    let _ = self.release(id, true).await;
                    return Err(e);
                }
            }
            let interrupted = matches!(last, Some(TurnOutcome::Interrupted));
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
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<Option<TurnOutcome>, AgentError> {
        let mut last = None;
        while let Some(turn) = self.engine().begin_turn(id).await? {
            let outcome = self.agent.run_turn(id, &turn, cancel, events).await?;
            let stop = outcome == TurnOutcome::Interrupted;
            last = Some(outcome);
            if stop {
                break;
            }
        }
        Ok(last)
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
        self.db
            .run(move |c| {
                let waiting: i64 = c.query_row(
                    "SELECT COUNT(*) FROM inbox WHERE session_id=?1 AND consumed_at IS NULL",
                    [&id],
                    |r| r.get(0),
                )?;
                if waiting > 0 && !force {
                    return Ok(false);
                }
                c.execute(
                    "DELETE FROM runner_leases WHERE session_id=?1 AND owner=?2",
                    params![id, &*owner],
                )?;
                Ok(true)
            })
            .await
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
        Some((_, beat)) => now - beat > LEASE_TTL.as_millis() as i64,
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
