//! Workgroups: a main session and the sub-sessions it (and they) delegated to, and the durable
//! events between them. SessionEngine owns every row here.
//!
//! A delegation is a fact of the parent's call: the child's session, its `subsessions` row and
//! its first request are written in the transaction that journals the spawn's result. Every
//! event between two sessions is a `workgroup_events` row with an id derived from the fact it
//! reports, delivered into the receiver's inbox in the sender's transaction (the inbox row names
//! the event, unique): it exists exactly when its fact does, and writing the fact again writes
//! nothing. A child's request ends in exactly one terminal event (`result`, `failure`,
//! `interrupted`, `budget_exhausted`), written where its turn ends — `turn_ended_in`, the
//! state reaction the kernel runs in the one function that ends turns — or where it is stopped
//! while it waits (`stop_in`).

use crate::sql::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::session::events::{self, SessionEvent};
use crate::session::{self, RuntimeState};
use crate::store::{StoreError, now_ms};

/// The delegation tools (the first-party control component's): loaded in main sessions and in
/// the sub-sessions of a workgroup above its depth limit, never in a standalone session.
pub const DELEGATION_TOOLS: &[&str] =
    &["session_spawn", "session_send", "session_status", "session_interrupt", "session_ask"];

/// Bytes of a child's answer, failure or reason kept with it and put in a notification.
pub const MAX_TEXT: usize = 16 * 1024;

crate::stored_enum! {
    /// What a session is for: a main session coordinates and routes; a sub-session works.
    pub enum Role: "session role" {
        Main = "main",
        Sub = "sub",
    }
}

crate::stored_enum! {
    /// The kind of an event between two sessions of a workgroup.
    pub enum Kind: "workgroup event kind" {
        /// Work for a child (parent → child): its input.
        Request = "request",
        /// The child's answer to its request (terminal).
        Result = "result",
        /// The child asks its parent something; the answer comes as the next request.
        Question = "question",
        /// The child's turn failed (terminal).
        Failure = "failure",
        /// The child waits for a person's decision on an approval unit.
        ApprovalNeeded = "approval_needed",
        /// The child was interrupted (terminal).
        Interrupted = "interrupted",
        /// The child was stopped by a limit: its deadline, or the workgroup's budget (terminal).
        BudgetExhausted = "budget_exhausted",
        /// A child is still working after the workgroup's wait notice (not terminal).
        WaitTimeout = "wait_timeout",
    }
}

impl Kind {
    /// Whether the event ends the child's request.
    pub fn terminal(self) -> bool {
        matches!(self, Self::Result | Self::Failure | Self::Interrupted | Self::BudgetExhausted)
    }
}

crate::stored_enum! {
    /// Where a child's current request stands.
    pub enum Delegation: "delegation status" {
        /// Its request has no terminal event yet.
        Live = "live",
        /// Its last request ended (its terminal event is written).
        Done = "done",
    }
}

/// The limits of a workgroup, stored with its main session and applied to every descendant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Children of one session whose request is live, at most (finished ones do not count).
    pub max_live_children: u32,
    /// How deep delegation goes: the main session is depth 0, its children 1.
    pub max_depth: u32,
    /// Seconds a child's request may take before it is stopped (`budget_exhausted`).
    pub child_deadline_secs: u64,
    /// Seconds after which a parent is told that a child is still working (and again after
    /// each such period); 0: never.
    pub wait_notice_secs: u64,
    /// Model steps of the whole workgroup, at most (`None`: no limit).
    pub max_steps: Option<i64>,
    /// Tokens (prompt and completion, as the server reported them) of the whole workgroup, at
    /// most (`None`: no limit).
    pub max_tokens: Option<i64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_live_children: 8,
            max_depth: 2,
            child_deadline_secs: 1800,
            wait_notice_secs: 600,
            max_steps: None,
            max_tokens: None,
        }
    }
}

impl Limits {
    /// Refuses limits that cannot work.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=256).contains(&self.max_live_children) {
            return Err("the live-children limit must be between 1 and 256".into());
        }
        if !(1..=8).contains(&self.max_depth) {
            return Err("the depth limit must be between 1 and 8".into());
        }
        if self.child_deadline_secs == 0 {
            return Err("a child's deadline must be at least 1 second".into());
        }
        if self.max_steps.is_some_and(|n| n < 1) || self.max_tokens.is_some_and(|n| n < 1) {
            return Err("a workgroup budget must be at least 1".into());
        }
        Ok(())
    }
}

/// Where a session stands in its workgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub main_id: String,
    /// `None` for the main session.
    pub parent: Option<String>,
    pub depth: u32,
    pub limits: Limits,
}

pub use crate::control::Spawn;

pub mod delegation;
mod deliver;
mod supervise;
mod views;

pub use delegation::SessionDelegation;

pub use deliver::*;
pub use supervise::*;
pub use views::*;

pub use crate::session::new_id;

fn store_json<T: Serialize>(v: &T) -> Result<String, StoreError> {
    crate::store::json(v)
}

fn parse_limits(text: &str) -> Result<Limits, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("stored workgroup limits are unreadable: {e}")))
}

fn cut(text: &str) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_string();
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [cut at {MAX_TEXT} bytes]", &text[..end])
}

/// Makes session `id` (just created) the main session of a new workgroup: `tools` are what its
/// sub-sessions load (the delegation tools among them while they may delegate), `preprocess`
/// their task-understanding settings (a main session routes and has none of its own).
pub(crate) fn create_main_in(
    c: &Connection,
    id: &str,
    limits: &Limits,
    preprocess: Option<&crate::understand::PreprocessConfig>,
    tools: &[String],
) -> Result<(), StoreError> {
    limits.check().map_err(StoreError::Input)?;
    c.execute("UPDATE session_config SET role='main' WHERE session_id=?1", [id])?;
    c.execute(
        "INSERT INTO workgroups (main_id, limits, preprocess, tools, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            id,
            store_json(limits)?,
            preprocess.map(store_json).transpose()?,
            store_json(&tools)?,
            now_ms()
        ],
    )?;
    Ok(())
}

/// Where session `id` stands in its workgroup; `None` for a standalone session.
pub(crate) fn position_in(c: &Connection, id: &str) -> Result<Option<Position>, StoreError> {
    // One statement: the workgroup of the main the session is a child of, or of the session
    // itself, with the session's place in it.
    let row: Option<(String, Option<String>, u32, String)> = c
        .prepare_cached(
            "SELECT w.main_id, s.parent_id, COALESCE(s.depth, 0), w.limits
             FROM workgroups w LEFT JOIN subsessions s ON s.session_id = ?1
             WHERE w.main_id = COALESCE((SELECT main_id FROM subsessions WHERE session_id = ?1), ?1)",
        )?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    let Some((main_id, parent, depth, limits)) = row else { return Ok(None) };
    Ok(Some(Position { main_id, parent, depth, limits: parse_limits(&limits)? }))
}

/// The children of `parent` whose request is live.
pub(crate) fn live_children_in(c: &Connection, parent: &str) -> Result<u32, StoreError> {
    Ok(c.prepare_cached("SELECT COUNT(*) FROM subsessions WHERE parent_id=?1 AND status='live'")?
        .query_row([parent], |r| r.get(0))?)
}

/// What the workgroup of `main` has used: model steps and reported tokens.
pub(crate) fn usage_in(c: &Connection, main: &str) -> Result<(i64, i64), StoreError> {
    Ok(c.prepare_cached(
        "SELECT COALESCE(SUM(s.steps), 0),
                COALESCE(SUM((SELECT COALESCE(SUM(COALESCE(e.prompt_tokens, 0) + COALESCE(e.completion_tokens, 0)), 0)
                              FROM evidence e WHERE e.session_id = s.id)), 0)
         FROM sessions s
         WHERE s.id = ?1 OR s.id IN (SELECT session_id FROM subsessions WHERE main_id = ?1)",
    )?
    .query_row([main], |r| Ok((r.get(0)?, r.get(1)?)))?)
}

/// Why the workgroup of `main` may not spend more, if it may not.
pub(crate) fn over_budget_in(
    c: &Connection,
    main: &str,
    limits: &Limits,
) -> Result<Option<String>, StoreError> {
    if limits.max_steps.is_none() && limits.max_tokens.is_none() {
        return Ok(None);
    }
    let (steps, tokens) = usage_in(c, main)?;
    if let Some(max) = limits.max_steps
        && steps >= max
    {
        return Ok(Some(format!("the workgroup used its {max} model steps")));
    }
    if let Some(max) = limits.max_tokens
        && tokens >= max
    {
        return Ok(Some(format!("the workgroup used {tokens} of its {max} tokens")));
    }
    Ok(None)
}

/// The workgroup's reaction to a session's state change (see [`crate::session::reactions`]):
/// the end of a sub-session's turn may end its request; a wait for approval tells its parent.
pub(crate) fn on_state(
    c: &Connection,
    id: &str,
    change: session::StateChange<'_>,
) -> Result<(), StoreError> {
    if change.ends_turn {
        turn_ended_in(c, id, change.state, change.detail)
    } else if change.state == RuntimeState::WaitingApproval {
        waiting_in(c, id)
    } else {
        Ok(())
    }
}

/// What the workgroup owns of the sessions of one engine.
#[derive(Clone, Copy)]
pub struct Workgroups<'a> {
    engine: &'a session::SessionEngine,
}

impl<'a> Workgroups<'a> {
    /// The handle of `engine`'s sessions.
    pub fn of(engine: &'a session::SessionEngine) -> Self {
        Self { engine }
    }

    /// Creates a main session: `new` (without task understanding of its own: a main session
    /// routes) and its workgroup, with `limits` and the settings its sub-sessions get —
    /// `child_preprocess` and `new.tools` (the delegation tools among them) — in one
    /// transaction.
    pub async fn create_main(
        &self,
        new: session::NewSession,
        limits: Limits,
        child_preprocess: Option<crate::understand::PreprocessConfig>,
    ) -> Result<String, StoreError> {
        limits.check().map_err(StoreError::Input)?;
        let id = session::checked_id(&new)?;
        let new = session::NewSession { id: Some(id.clone()), preprocess: None, ..new };
        let id2 = id.clone();
        self.engine
            .db()
            .run(move |c| {
                session::create_in(c, &id2, &new)?;
                create_main_in(c, &id2, &limits, child_preprocess.as_ref(), &new.tools)
            })
            .await?;
        Ok(id)
    }
}


/// The main session of the workgroup session `id` is part of, if any.
fn main_of_in(c: &Connection, id: &str) -> Result<Option<String>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT main_id FROM workgroups WHERE main_id=?1
         UNION SELECT main_id FROM subsessions WHERE session_id=?1",
    )?
    .query_row([id], |r| r.get(0))
    .optional()?)
}

/// The fork reaction: a session of a workgroup is not forked — its history holds the results
/// of other sessions, which a fork would not have.
pub(crate) fn on_fork(
    c: &Connection,
    from: &str,
    _to: &str,
    _cut: &crate::session::HistoryCut,
) -> Result<(), StoreError> {
    match main_of_in(c, from)? {
        Some(main) => Err(StoreError::Conflict(format!(
            "session `{}` is part of the workgroup of `{}`: its history holds other sessions' \
             results, so it cannot be forked",
            from.escape_debug(),
            main.escape_debug()
        ))),
        None => Ok(()),
    }
}

/// The delete reaction: a session of a workgroup is kept — its results are part of another
/// session's history (the main session's, or its parent's).
pub(crate) fn on_delete(c: &Connection, id: &str) -> Result<(), StoreError> {
    match main_of_in(c, id)? {
        Some(main) => Err(StoreError::Conflict(format!(
            "session `{}` is part of the workgroup of `{}`: its results are in another session's \
             history, so it is kept",
            id.escape_debug(),
            main.escape_debug()
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel tells a request in a session's inbox from a notification by the kind's
    /// stored name, without importing the workgroup: the two spellings are one.
    #[test]
    fn the_kernel_names_a_request_as_the_workgroup_stores_it() {
        assert_eq!(Kind::Request.as_str(), session::REQUEST_KIND);
    }
}
