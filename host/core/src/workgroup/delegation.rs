//! [`SessionDelegation`]: the checks a session's delegation calls make when they ask, through
//! the store's read pool. What they ask for is committed with the call's result
//! ([`crate::workgroup`]).

use std::sync::Mutex;

use crate::control::{Checked, ChildStatus, ControlError, Delegation};
use crate::sandbox::Grant;
use crate::store::Db;
use crate::workgroup::{self, Delegation as Status, Spawn};

pub use crate::control::MAX_INPUT;
/// Resource references one spawn may carry, and bytes of each.
pub const MAX_RESOURCES: usize = 32;
pub const MAX_RESOURCE: usize = 1024;
/// Characters of a purpose.
pub const MAX_PURPOSE: usize = 200;

/// Delegation checks for the calls of one step of session `id`, whose grants are `grants`.
pub struct SessionDelegation {
    db: Db,
    id: String,
    grants: Vec<Grant>,
    /// Spawns checked in this step (not committed yet): they count against the limit.
    spawned: Mutex<u32>,
}

impl SessionDelegation {
    pub fn new(db: Db, id: String, grants: Vec<Grant>) -> Self {
        Self { db, id, grants, spawned: Mutex::new(0) }
    }
}

fn store(e: crate::store::StoreError) -> ControlError {
    ControlError::Failed(format!("the workgroup could not be read: {e}"))
}

fn invalid(message: impl Into<String>) -> ControlError {
    ControlError::Invalid(message.into())
}

fn denied(message: impl Into<String>) -> ControlError {
    ControlError::Denied(message.into())
}

const NOT_IN_WORKGROUP: &str = "this session is not part of a workgroup: delegation works in a main session (`keel run --main`) and in its sub-sessions";

impl Delegation for SessionDelegation {
    fn check_spawn(
        &self,
        purpose: &str,
        input: &str,
        resources: &[String],
        grants: &[String],
    ) -> Result<Checked, ControlError> {
        let purpose = purpose.trim();
        if purpose.is_empty() || purpose.chars().count() > MAX_PURPOSE {
            return Err(invalid(format!("say the purpose in 1 to {MAX_PURPOSE} characters")));
        }
        if input.trim().is_empty() {
            return Err(invalid("the input is empty: say what the sub-session should do"));
        }
        if input.len() > MAX_INPUT {
            return Err(invalid(format!(
                "the input is over {MAX_INPUT} bytes; pass large data as a resource reference (a path in a grant)"
            )));
        }
        if resources.len() > MAX_RESOURCES || resources.iter().any(|r| r.len() > MAX_RESOURCE) {
            return Err(invalid(format!(
                "at most {MAX_RESOURCES} resource references of at most {MAX_RESOURCE} bytes each"
            )));
        }
        let narrowed = if grants.is_empty() {
            self.grants.clone()
        } else {
            let mut out = Vec::new();
            for g in grants {
                out.push(Grant::narrow(&self.grants, g).map_err(denied)?);
            }
            Grant::check_disjoint(&out).map_err(|e| invalid(e.to_string()))?;
            out
        };
        let id = self.id.clone();
        let (pos, live, over) = self
            .db
            .read_blocking(move |c| {
                let Some(pos) = workgroup::position_in(c, &id)? else {
                    return Ok((None, 0, None));
                };
                let live = workgroup::live_children_in(c, &id)?;
                let over = workgroup::over_budget_in(c, &pos.main_id, &pos.limits)?;
                Ok((Some(pos), live, over))
            })
            .map_err(store)?;
        let pos = pos.ok_or_else(|| ControlError::Unavailable(NOT_IN_WORKGROUP.into()))?;
        if pos.depth + 1 > pos.limits.max_depth {
            return Err(denied(format!(
                "depth limit: this session is at depth {} of its workgroup and the limit is {}; do the work here, or answer with what you have",
                pos.depth, pos.limits.max_depth
            )));
        }
        if let Some(why) = over {
            return Err(denied(format!("budget: {why}; no more sub-sessions can start")));
        }
        let mut spawned = self.spawned.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if live + *spawned >= pos.limits.max_live_children {
            return Err(denied(format!(
                "limit: {} sub-sessions of this session are live and the limit is {}; end your turn to wait for their results (each wakes you), or stop one with session_interrupt",
                live + *spawned,
                pos.limits.max_live_children
            )));
        }
        *spawned += 1;
        Ok(Checked {
            spawn: Spawn {
                child: workgroup::new_id(),
                purpose: purpose.to_string(),
                input: input.to_string(),
                resources: resources.to_vec(),
                grants: narrowed,
            },
            depth: pos.depth + 1,
        })
    }

    fn check_child(&self, session: &str) -> Result<(), ControlError> {
        let (id, s) = (self.id.clone(), session.to_string());
        let row = self.db.read_blocking(move |c| workgroup::child_in(c, &s)).map_err(store)?;
        match row {
            Some(r) if r.parent == id => Ok(()),
            _ => Err(denied(format!(
                "`{session}` is not a sub-session of this session; session_status lists them"
            ))),
        }
    }

    fn check_ask(&self, question: &str) -> Result<(), ControlError> {
        if question.trim().is_empty() || question.len() > MAX_INPUT {
            return Err(invalid(format!("ask a question of 1 to {MAX_INPUT} bytes")));
        }
        let id = self.id.clone();
        let row = self.db.read_blocking(move |c| workgroup::child_in(c, &id)).map_err(store)?;
        match row {
            Some(r) if r.status == Status::Live => Ok(()),
            Some(_) => Err(ControlError::Unavailable(
                "this session has no request under way to ask about".into(),
            )),
            None => Err(ControlError::Unavailable(
                "this session has no parent session to ask; ask the user in your answer".into(),
            )),
        }
    }

    fn status(&self, sessions: &[String]) -> Result<Vec<ChildStatus>, ControlError> {
        let (id, wanted) = (self.id.clone(), sessions.to_vec());
        let found = self
            .db
            .read_blocking(move |c| {
                let Some(pos) = workgroup::position_in(c, &id)? else { return Ok(None) };
                let group = workgroup::workgroup_in(c, &pos.main_id)?;
                Ok(group.map(|g| g.members))
            })
            .map_err(store)?;
        let members = found.ok_or_else(|| ControlError::Unavailable(NOT_IN_WORKGROUP.into()))?;
        let mut out = Vec::new();
        if wanted.is_empty() {
            out.extend(members.iter().filter(|m| m.parent.as_deref() == Some(self.id.as_str())));
        } else {
            for w in &wanted {
                let m = members
                    .iter()
                    .find(|m| &m.session_id == w)
                    .ok_or_else(|| invalid(format!("`{w}` is not a session of this workgroup")))?;
                out.push(m);
            }
        }
        Ok(out
            .into_iter()
            .map(|m| ChildStatus {
                session: m.session_id.clone(),
                purpose: m.purpose.clone().unwrap_or_else(|| "main session".into()),
                state: m.state.to_string(),
                delegation: m.delegation.map(|d| d.to_string()).unwrap_or_default(),
                terminal: m.terminal.map(|k| k.to_string()),
                text: m.text.as_deref().map(|t| t.chars().take(4096).collect()),
                approvals: m.approvals.clone(),
            })
            .collect())
    }
}
