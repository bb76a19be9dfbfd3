//! Running a workgroup: every session of it that has work gets a runner of its own (a task of
//! this process, each with its own lease and cancel token), until nothing is left to run.
//!
//! The supervisor decides nothing about facts: a child's request and its terminal event are
//! committed by SessionEngine with the facts they report; the supervisor only notices —
//! after each commit of this process, or every [`SUPERVISOR_POLL`] for other processes' — that
//! a session has inputs or a turn to resume, and runs it. It also applies the workgroup's
//! limits that depend on the clock and on use: a child past its deadline, or every live child
//! when the workgroup's step or token budget is spent, is stopped with the reason
//! (`budget_exhausted`), and a parent whose child works past a wait-notice period is told so.
//! Crash recovery needs nothing of its own: what a dead process left is in the inbox rows and
//! open turns that the next supervisor finds.

use crate::ids::SessionId;
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use tracing::Instrument;

use super::{Brain, Submitted};
use crate::agent::{AgentError, Events};
use crate::cancel::CancelToken;
use crate::session::RuntimeState;
use crate::session::lease::{self, lease_live};
use crate::store::StoreError;
use crate::workgroup::{self, Runnable};

/// How often the supervisor looks again when no commit of this process woke it (commits of
/// other processes, deadlines).
pub const SUPERVISOR_POLL: Duration = Duration::from_millis(250);

/// One look at a workgroup.
struct Look {
    sessions: Vec<Runnable>,
    /// Sessions whose runner is a live process other than this one.
    elsewhere: HashSet<String>,
    limits: workgroup::Limits,
    overdue: Vec<String>,
    over_budget: Option<String>,
    /// Live children not yet told to stop.
    live_unstopped: Vec<String>,
    /// Wait notices to write.
    notices: Vec<workgroup::Notice>,
}

impl Brain {
    /// The main session of the workgroup session `id` belongs to; `None` for a standalone
    /// session.
    pub async fn workgroup_of(&self, id: &SessionId) -> Result<Option<SessionId>, StoreError> {
        let id = id.clone();
        self.db
            .read_inline(move |c| Ok(workgroup::position_in(c, &id)?.map(|p| p.main_id.into())))
            .await
    }

    /// Stops session `id` and every live session below it (`reason`: a limit, which makes a
    /// child's terminal event `budget_exhausted`; `None`: an interrupt). A runner stops at its
    /// next check; a turn without a live runner (waiting for a decision, or left by a dead
    /// process) is closed here. Returns the state `id` was in.
    pub async fn stop(
        &self,
        id: &SessionId,
        reason: Option<String>,
    ) -> Result<RuntimeState, StoreError> {
        let (sid, owner) = (id.clone(), self.owner.clone());
        self.db
            .run(move |c| {
                let before = crate::session::runtime_in(c, &sid)?.state;
                let why = match &reason {
                    Some(r) => format!("stopped: {r}"),
                    None => "interrupted by the user".to_string(),
                };
                let now = lease::db_now_in(c)?;
                for s in workgroup::stop_in(c, &sid, reason.as_deref())? {
                    if let Some((h, beat)) = &lease::holder_in(c, &s)?
                        && (h.as_str() == &*owner || lease_live(h, *beat, now))
                    {
                        continue;
                    }
                    lease::drop_in(c, &s)?;
                    crate::session::close_turn_in(c, &s, &why)?;
                }
                Ok(before)
            })
            .await
    }

    async fn look(&self, main: &SessionId) -> Result<Look, StoreError> {
        let (main, owner) = (main.clone(), self.owner.clone());
        self.db
            .read(move |c| {
                let sessions = workgroup::sessions_in(c, &main)?;
                let now = lease::db_now_in(c)?;
                let mut elsewhere = HashSet::new();
                for s in &sessions {
                    if let Some((h, beat)) = lease::holder_in(c, &s.id)?
                        && h.as_str() != &*owner
                        && lease_live(&h, beat, now)
                    {
                        elsewhere.insert(s.id.clone());
                    }
                }
                let pos = workgroup::position_in(c, &main)?.ok_or_else(|| {
                    StoreError::NotFound(format!("`{main}` is not a main session"))
                })?;
                let over_budget = workgroup::over_budget_in(c, &main, &pos.limits)?;
                let live_unstopped = match over_budget {
                    Some(_) => workgroup::live_descendants_in(c, &main)?
                        .into_iter()
                        .filter(|s| !elsewhere.contains(s))
                        .collect(),
                    None => Vec::new(),
                };
                Ok(Look {
                    sessions,
                    elsewhere,
                    notices: workgroup::notices_due_in(c, &main, &pos.limits, now)?,
                    overdue: workgroup::overdue_in(c, &main, now)?,
                    limits: pos.limits,
                    over_budget,
                    live_unstopped,
                })
            })
            .await
    }

    /// Runs the workgroup of main session `main` until no session of it has work left: each
    /// session with inputs or a turn to resume gets a runner task of its own; a child's
    /// terminal event wakes its parent's. `cancel` interrupts the whole workgroup (cascading
    /// to every live descendant), and the supervisor still waits for each to close. Returns
    /// the last outcome of each session that ran.
    pub async fn run_workgroup(
        &self,
        main: &SessionId,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<HashMap<String, Submitted>, AgentError> {
        let mut commits = self.db.commits();
        let mut tasks = tokio::task::JoinSet::new();
        let mut running: HashSet<String> = HashSet::new();
        let mut outcomes = HashMap::new();
        let mut interrupted = false;
        let mut stopped: HashSet<String> = HashSet::new();
        let mut failure = None;
        let mut known: HashSet<String> = HashSet::new();
        loop {
            if cancel.is_cancelled() && !interrupted {
                interrupted = true;
                self.stop(main, None).await?;
            }
            let look = self.look(main).await?;
            for s in &look.sessions {
                if known.insert(s.id.clone()) && s.id != *main {
                    // A child this supervisor had not seen: its spawn is committed.
                    crate::crash::point("after_spawn");
                }
            }
            let deadline = look.limits.child_deadline_secs;
            for child in &look.overdue {
                if stopped.insert(child.clone()) {
                    let why = format!("its deadline of {deadline} s passed");
                    self.stop(&SessionId::from(child), Some(why)).await?;
                }
            }
            if let Some(why) = &look.over_budget {
                for child in &look.live_unstopped {
                    if stopped.insert(child.clone()) {
                        self.stop(&SessionId::from(child), Some(why.clone())).await?;
                    }
                }
            }
            if !look.notices.is_empty() {
                let (m, limits, due) =
                    (main.to_string(), look.limits.clone(), look.notices.clone());
                self.db.run(move |c| workgroup::write_notices_in(c, &m, &limits, &due)).await?;
            }
            let mut started = false;
            for s in &look.sessions {
                if running.contains(&s.id) || look.elsewhere.contains(&s.id) {
                    continue;
                }
                if s.interrupt_requested
                    && s.active_turn
                    && matches!(s.state, RuntimeState::WaitingApproval)
                {
                    // Stopped while it waited for a decision: close it (no runner would).
                    self.stop(&SessionId::from(&s.id), None).await?;
                    started = true;
                    continue;
                }
                if !s.has_work() || failure.is_some() {
                    continue;
                }
                if s.notifications > 0 {
                    // A parent is about to take a child's event from its inbox.
                    crate::crash::point("before_parent_consumes");
                }
                let token = CancelToken::new();
                running.insert(s.id.clone());
                let (brain, id, events) = (self.clone(), s.id.clone(), events.clone());
                // A sub-session's runner names the call that spawned it: its trace links the
                // child's turns to the parent's spawn.
                let span = match &s.spawned_by {
                    Some((parent, call)) => tracing::info_span!(
                        "delegated",
                        session_id = %id,
                        keel.parent.session_id = %parent,
                        keel.parent.call_id = %call,
                    ),
                    None => tracing::Span::current(),
                };
                tasks.spawn(
                    async move {
                        let r = brain.drain(&SessionId::from(&id), &token, &events).await;
                        (id, r)
                    }
                    .instrument(span),
                );
                started = true;
            }
            if tasks.is_empty() && !started && look.elsewhere.is_empty() {
                break;
            }
            tokio::select! {
                joined = tasks.join_next(), if !tasks.is_empty() => {
                    if let Some(joined) = joined {
                        match joined {
                            Ok((id, result)) => {
                                running.remove(&id);
                                match result {
                                    Ok(Some(s)) => {
                                        if id != *main {
                                            // Its answer (and any terminal event) is committed.
                                            crate::crash::point("after_child_answer");
                                        }
                                        outcomes.insert(id, s);
                                    }
                                    Ok(None) => {}
                                    Err(e) => {
                                        tracing::warn!(session = %id, "a runner of the workgroup failed: {e}");
                                        failure.get_or_insert(e);
                                    }
                                }
                            }
                            Err(e) => {
                                tracing::error!("a runner task of the workgroup ended abnormally: {e}");
                            }
                        }
                    }
                }
                _ = commits.changed() => {}
                _ = tokio::time::sleep(SUPERVISOR_POLL) => {}
                _ = cancel.cancelled(), if !interrupted => {}
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(outcomes),
        }
    }
}
