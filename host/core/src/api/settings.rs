//! The use cases of changing a session after it was created: moving it to another model,
//! changing its policy.

use super::*;
use crate::session::{ModelChange, ModelShown};
use crate::store::StoreError;

impl Harness {
    /// Moves session `id` to another model server, model or context window; its next request
    /// goes there, and a `model_changed` event records the change and who made it. Whoever
    /// may see the session may change its model and window; a new server URL needs an admin,
    /// since the host's model credentials go wherever a session's URL points. Refused while a
    /// turn runs. Returns the model before and after.
    pub async fn set_session_model(
        &self,
        caller: &Caller,
        id: &str,
        change: ModelChange,
    ) -> Result<(ModelShown, ModelShown), ApiError> {
        if change.is_empty() {
            return Err(ApiError::Input(
                "nothing to change: name a model URL, a model or a context window".into(),
            ));
        }
        if change.base_url.is_some() {
            caller.require_admin("moving a session to another model server")?;
        }
        let id = self.checked(caller, id).await?;
        let by = super::callers::actor(caller);
        Ok(self.engine.set_model(&id, change, by).await?)
    }
}

impl Harness {
    /// Changes session `id`'s policy: allow a tool for good (everywhere, or for calls under a
    /// path prefix), or ask before it or deny it again. Only a caller who may decide the
    /// session's approvals may change it, and only the operator and admins may widen it (an
    /// allow): a user token may only tighten what an admin set. A `policy_changed` event
    /// records the change and who made it. Returns the policy after.
    pub async fn change_policy(
        &self,
        caller: &Caller,
        id: &str,
        change: crate::policy::PolicyChange,
    ) -> Result<crate::policy::Policy, ApiError> {
        let change = change.checked().map_err(ApiError::Input)?;
        let sid = SessionId::from(id);
        let owner = self.engine.owner(&sid).await?;
        if !caller.may_see(owner.as_ref()) {
            return Err(crate::access::AccessError::NotFound(format!(
                "session `{}` does not exist",
                id.escape_debug()
            ))
            .into());
        }
        if !caller.may_decide(owner.as_ref()) {
            return Err(crate::access::AccessError::Forbidden(format!(
                "changing the policy of session `{}` needs a caller who may decide its approvals",
                id.escape_debug()
            ))
            .into());
        }
        if change.widens() {
            caller.require_admin(&format!("`{change}` (widening a session's policy)"))?;
        }
        let by = super::callers::actor(caller);
        Ok(self.engine.change_policy(&sid, change, by).await?)
    }
}

/// Which sessions [`Harness::find_sessions`] returns (every field empty: all of them).
#[derive(Debug, Clone, Default)]
pub struct SessionFilter {
    /// Only sessions in one of these states (`idle`, `failed` …).
    pub states: Vec<crate::session::RuntimeState>,
    /// Only sessions active at or after this time (ms since the Unix epoch).
    pub active_since_ms: Option<i64>,
    /// Only sessions not active since this time (ms since the Unix epoch).
    pub inactive_since_ms: Option<i64>,
    /// Only sessions that work for this user (a typed principal, or a local user's name).
    pub user: Option<String>,
    /// Only sessions whose title, goal or messages hold this text (case aside).
    pub search: Option<String>,
    /// At most this many, the most recently active first.
    pub limit: Option<usize>,
}

/// What [`Harness::prune_sessions`] did, or would do with `dry_run`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Pruned {
    pub dry_run: bool,
    /// The sessions deleted (or that would be).
    pub deleted: Vec<crate::views::SessionSummary>,
    /// The sessions that matched but were kept, with why (a workgroup's, one that started
    /// running meanwhile).
    pub kept: Vec<KeptSession>,
}

/// A session prune matched and kept.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KeptSession {
    pub id: String,
    pub reason: String,
}

/// The states `prune_sessions` takes when none are named: sessions at rest. A session that
/// waits for an approval is work a person has not decided yet, and is pruned only by name.
pub const PRUNED_BY_DEFAULT: &[crate::session::RuntimeState] = &[
    crate::session::RuntimeState::Idle,
    crate::session::RuntimeState::Failed,
    crate::session::RuntimeState::Interrupted,
];

/// Finding and tidying sessions.
impl Harness {
    /// The sessions `caller` may see that `filter` lets through, the most recently active
    /// first.
    pub async fn find_sessions(
        &self,
        caller: &Caller,
        filter: &SessionFilter,
    ) -> Result<Vec<crate::views::SessionSummary>, ApiError> {
        let mut list = self.sessions(caller).await?;
        if let Some(text) = filter.search.as_deref().filter(|t| !t.trim().is_empty()) {
            let found = Views::of(&self.engine).matching(text.trim()).await?;
            list.retain(|s| found.contains(&s.id));
        }
        list.retain(|s| {
            filter.user.as_deref().is_none_or(|u| s.works_for(u))
                && (filter.states.is_empty()
                    || filter.states.iter().any(|st| st.as_str() == s.state))
                && filter.active_since_ms.is_none_or(|t| s.last_activity >= t)
                && filter.inactive_since_ms.is_none_or(|t| s.last_activity < t)
        });
        list.sort_by(|a, b| b.last_activity.cmp(&a.last_activity).then_with(|| a.id.cmp(&b.id)));
        if let Some(n) = filter.limit {
            list.truncate(n);
        }
        Ok(list)
    }

    /// Gives session `id` a title, shown in lists instead of its goal (`None`: none); whoever
    /// may see the session may.
    pub async fn set_session_title(
        &self,
        caller: &Caller,
        id: &str,
        title: Option<String>,
    ) -> Result<(), ApiError> {
        let id = self.checked(caller, id).await?;
        Ok(self.engine.set_title(&id, title).await?)
    }

    /// Deletes session `id` and every fact of it, in one transaction (an admin's act):
    /// refused while a turn runs, and for a session of a workgroup, whose results another
    /// session's history holds. A user's long-term memories and shared blobs stay.
    pub async fn delete_session(&self, caller: &Caller, id: &str) -> Result<(), ApiError> {
        caller.require_admin("deleting a session")?;
        let id = self.checked(caller, id).await?;
        Ok(self.engine.delete(&id).await?)
    }

    /// Deletes the sessions not active since `inactive_since_ms` in one of `states`
    /// ([`PRUNED_BY_DEFAULT`] when empty), each in its own transaction; with `dry_run`, only
    /// says which.
    pub async fn prune_sessions(
        &self,
        caller: &Caller,
        inactive_since_ms: i64,
        states: Vec<crate::session::RuntimeState>,
        dry_run: bool,
    ) -> Result<Pruned, ApiError> {
        caller.require_admin("pruning sessions")?;
        let states = if states.is_empty() { PRUNED_BY_DEFAULT.to_vec() } else { states };
        let filter = SessionFilter {
            states,
            inactive_since_ms: Some(inactive_since_ms),
            ..SessionFilter::default()
        };
        let matched = self.find_sessions(caller, &filter).await?;
        let mut pruned = Pruned { dry_run, deleted: Vec::new(), kept: Vec::new() };
        for s in matched {
            if dry_run {
                pruned.deleted.push(s);
                continue;
            }
            match self.engine.delete(&crate::ids::SessionId::from(s.id.as_str())).await {
                Ok(()) => pruned.deleted.push(s),
                Err(e @ (StoreError::Conflict(_) | StoreError::NotFound(_))) => {
                    pruned.kept.push(KeptSession { id: s.id, reason: e.to_string() })
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(pruned)
    }
}
