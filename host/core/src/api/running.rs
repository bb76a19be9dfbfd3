//! Keeping sessions running: the take-over loop every long-lived front-end (`keel serve`,
//! `keel mcp serve --http`, `keel chat`) runs beside its requests. On a shared store, every
//! heartbeat, the sessions of a host that stopped renewing its leases are recovered and resumed
//! — a host that died is replaced within the lease's time to live and one heartbeat. A server
//! also resumes what its own startup recovery found ([`Harness::resume_recovered`]).

use super::{ApiError, Harness};
use crate::agent::Events;
use crate::caller::Caller;
use crate::cancel::CancelToken;
use crate::session::RecoveredSession;

/// The task that keeps a front-end's sessions running; it stops when this is dropped.
#[derive(Debug)]
pub struct KeepRunning {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl KeepRunning {
    /// Whether it looks for other hosts' sessions (the store is shared).
    pub fn takes_over(&self) -> bool {
        self.task.is_some()
    }
}

impl Drop for KeepRunning {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Harness {
    /// Runs session `id`'s queued inputs (or its open turn) in the background, as its runner,
    /// in the span current here (a request's: the turns it runs are part of its trace); a
    /// session another runner holds is left to it. What fails is logged.
    pub fn resume_in_background(&self, caller: &Caller, id: &str) {
        use tracing::Instrument;
        let (h, caller, id) = (self.clone(), caller.clone(), id.to_string());
        tokio::spawn(
            async move {
                let cancel = CancelToken::new();
                let events: Events = std::sync::Arc::new(|_| {});
                if let Err(e) = h.resume(&caller, &id, &cancel, &events).await {
                    tracing::warn!(session = %id, "the turn could not run: {e}");
                }
            }
            .instrument(tracing::Span::current()),
        );
    }

    /// Resumes, in the background, the sessions this harness's startup recovery found with
    /// work (an admin's use case: a server does it as it starts).
    pub fn resume_recovered(&self, caller: &Caller) -> Result<(), ApiError> {
        caller.require_admin("resuming what recovery found")?;
        for r in self.recovered.iter().filter(|r| r.resumable) {
            self.resume_in_background(caller, r.id.as_str());
        }
        Ok(())
    }

    /// Keeps the store's sessions running (an admin's use case): on a shared store, every
    /// heartbeat, takes over the sessions whose runner is gone ([`take_over`](Self::take_over))
    /// and resumes them in the background; on one machine's store there is no other host, and
    /// nothing runs. Stops when the value returned is dropped.
    pub fn keep_sessions_running(&self, caller: &Caller) -> Result<KeepRunning, ApiError> {
        caller.require_admin("keeping sessions running")?;
        if !self.shared_store() {
            return Ok(KeepRunning { task: None });
        }
        let (h, caller) = (self.clone(), caller.clone());
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(crate::brain::heartbeat_every()).await;
                match h.take_over(&caller).await {
                    Ok(found) => h.resume_taken_over(&caller, found),
                    Err(e) => tracing::warn!("looking for sessions to take over failed: {e}"),
                }
            }
        });
        Ok(KeepRunning { task: Some(task) })
    }

    /// A clean stop of a host on a shared store: gives up every session lease it holds, so
    /// other hosts take its sessions over at their next look (a heartbeat) rather than after
    /// the lease TTL, recovering each as after a crash. What this process still tries to write
    /// to them is refused (their tokens moved on). Returns how many leases were given up; on
    /// a store of one host there is nothing to hand over.
    pub async fn release_leases(&self, caller: &Caller) -> Result<usize, ApiError> {
        caller.require_admin("giving up this host's sessions")?;
        if !self.shared_store() {
            return Ok(0);
        }
        Ok(self.brain.release_all().await?)
    }

    fn resume_taken_over(&self, caller: &Caller, found: Vec<RecoveredSession>) {
        for r in found.into_iter().filter(|r| r.resumable) {
            tracing::info!(session = %r.id, "taking over a session whose runner is gone");
            self.resume_in_background(caller, r.id.as_str());
        }
    }
}
