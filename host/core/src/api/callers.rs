//! The use cases as a caller makes them: what a principal of the network API may see and do,
//! decided here once for every front-end (the HTTP API and the console) — a user token sees
//! and steers only the sessions it created, decides their approvals only when its preset lets
//! it, grants no host directory but a preset's, and may only tighten the policy and lower the
//! budget and a workgroup's limits. The operator ([`Caller::Operator`]) may do everything.

use crate::ids::SessionId;
use crate::views::Views;
use std::collections::HashMap;
use std::time::Duration;

use super::{ApiError, Harness, SessionSpec};
use crate::access::{AccessError, GrantRoots};
use crate::caller::{Caller, Owner};
use crate::grant::{Access, Grant};
use crate::meta::SessionMeta;
use crate::session::{ApprovalUnit, DecideError, Decision};
use crate::views::SessionSummary;

/// What a caller asks of a new session; each absent part takes the front-end's template.
#[derive(Debug, Clone, Default)]
pub struct SessionRequest {
    /// Chosen id (letters, digits, `-`, `_`), else a generated one.
    pub id: Option<String>,
    /// Host directories to grant (admins only, under the grant roots).
    pub grants: Vec<GrantRequest>,
    /// A grant preset an admin defined; instead of `grants`.
    pub preset: Option<String>,
    /// The tools the model sees (default: every installed tool).
    pub tools: Option<Vec<String>>,
    pub policy: Option<PolicyRequest>,
    pub budget: Option<BudgetRequest>,
    /// A model name on the template's model endpoint.
    pub model: Option<String>,
    /// The user the session works for (admins only; a user's sessions work for that user).
    pub user: Option<String>,
    /// Make it a main session with these workgroup limits.
    pub main: Option<WorkgroupRequest>,
}

/// One host directory asked for.
#[derive(Debug, Clone)]
pub struct GrantRequest {
    pub host: String,
    pub guest: Option<String>,
    pub access: Option<Access>,
}

impl GrantRequest {
    /// Reads one grant as people write it, `HOST_DIR[=GUEST_PATH][:ro|:rw]` (the `--grant`
    /// syntax), without touching the host: the directory is checked where the session is
    /// made.
    pub fn parse(spec: &str) -> Result<Self, ApiError> {
        let spec = spec.trim();
        let (rest, access) = match (spec.strip_suffix(":ro"), spec.strip_suffix(":rw")) {
            (Some(r), _) => (r, Some(Access::Ro)),
            (_, Some(r)) => (r, Some(Access::Rw)),
            _ => (spec, None),
        };
        let (host, guest) = match rest.split_once('=') {
            Some((h, g)) => (h.trim(), Some(g.trim().to_string())),
            None => (rest, None),
        };
        if host.is_empty() || guest.as_deref().is_some_and(str::is_empty) {
            return Err(ApiError::Input(format!(
                "grant `{}`: expected HOST_DIR[=GUEST_PATH][:ro|:rw], e.g. /srv/data=/data:ro",
                spec.escape_debug()
            )));
        }
        Ok(Self { host: host.to_string(), guest, access })
    }
}

/// Policy adjustments by tool name or effect class.
#[derive(Debug, Clone, Default)]
pub struct PolicyRequest {
    /// Run without asking (admins only).
    pub allow: Vec<String>,
    pub ask: Vec<String>,
    pub deny: Vec<String>,
}

/// Per-call limits; a user may only lower the template's.
#[derive(Debug, Clone, Default)]
pub struct BudgetRequest {
    pub fuel: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub memory: Option<u64>,
}

/// A main session's workgroup limits; each absent one takes its default, and a user may not
/// raise a default.
#[derive(Debug, Clone, Default)]
pub struct WorkgroupRequest {
    pub max_children: Option<u32>,
    pub max_depth: Option<u32>,
    pub child_deadline_secs: Option<u64>,
    pub wait_notice_secs: Option<u64>,
    pub max_steps: Option<i64>,
    pub max_tokens: Option<i64>,
}

/// An approval unit as a caller sees it, with whether they may decide it.
#[derive(Debug, Clone)]
pub struct ApprovalView {
    pub unit: ApprovalUnit,
    pub may_decide: bool,
    /// For a pending call that writes a file: the content and its diff against the file there
    /// now.
    pub change: Option<super::FileChange>,
}

/// A session its caller may see, as [`Harness::checked`] found it: the use cases take one
/// after their one check and forward it to the owners (it is the session's id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRef(SessionId);

impl std::fmt::Display for SessionRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::ops::Deref for SessionRef {
    type Target = SessionId;
    fn deref(&self) -> &SessionId {
        &self.0
    }
}

fn forbidden(caller: &Caller, what: &str) -> ApiError {
    let name = caller.name().unwrap_or("operator");
    AccessError::Forbidden(format!("{what}; `{name}` is a user token")).into()
}

impl Harness {
    /// Whether `caller` may see session `id` (which exists).
    pub(super) async fn sees(&self, caller: &Caller, id: &str) -> Result<bool, ApiError> {
        let id = &SessionId::from(id);
        Ok(caller.is_admin() || caller.may_see(self.engine.config(id).await?.owner.as_ref()))
    }

    /// The one check every use case on one session opens with: session `id` exists and
    /// `caller` may see it — one indexed read of its owner. A session the caller may not see
    /// is "not found", like one that does not exist.
    pub(super) async fn checked(&self, caller: &Caller, id: &str) -> Result<SessionRef, ApiError> {
        let id = SessionId::from(id);
        let owner = self.engine.owner(&id).await?;
        if caller.may_see(owner.as_ref()) {
            Ok(SessionRef(id))
        } else {
            Err(AccessError::NotFound(format!("session `{}` does not exist", id.escape_debug()))
                .into())
        }
    }

    /// Session `id`'s settings and state, if `caller` may see it; another user's session is
    /// "not found", as one that does not exist.
    pub async fn session(&self, caller: &Caller, id: &str) -> Result<SessionMeta, ApiError> {
        let id = &SessionId::from(id);
        let meta = SessionMeta::read(&self.engine, id).await?;
        if caller.may_see(meta.config.owner.as_ref()) {
            Ok(meta)
        } else {
            Err(AccessError::NotFound(format!("session `{}` does not exist", id.escape_debug()))
                .into())
        }
    }

    /// Every session `caller` may see, newest first.
    pub async fn sessions(&self, caller: &Caller) -> Result<Vec<SessionSummary>, ApiError> {
        let mut sessions = Views::of(&self.engine).list().await?;
        if let Caller::Api(p) = caller
            && !caller.is_admin()
        {
            let me = p.id();
            sessions.retain(|s| s.owner.as_deref() == Some(me.as_str()));
        }
        Ok(sessions)
    }

    /// The approval units `caller` may see (of `session`, or of every session; pending only
    /// or all), each with whether they may decide it.
    pub async fn approvals(
        &self,
        caller: &Caller,
        session: Option<&str>,
        pending_only: bool,
    ) -> Result<Vec<ApprovalView>, ApiError> {
        if let Some(s) = session {
            self.session(caller, s).await?;
        }
        let units = self.engine.approvals(session, pending_only).await?;
        let mut owners: HashMap<String, Option<Owner>> = HashMap::new();
        let mut out = Vec::new();
        for unit in units {
            let sid = unit.session_id.to_string();
            if !owners.contains_key(&sid) {
                owners.insert(sid.clone(), self.engine.config(&SessionId::from(&sid)).await?.owner);
            }
            let owner = owners.get(&sid).cloned().flatten();
            if !caller.may_see(owner.as_ref()) {
                continue;
            }
            out.push(ApprovalView {
                may_decide: caller.may_decide(owner.as_ref()),
                unit,
                change: None,
            });
        }
        // A pending write's change reads and diffs a file: off the async workers, once per
        // state of the file.
        let changes = self.changes.clone();
        tokio::task::spawn_blocking(move || {
            for view in &mut out {
                if view.unit.status == crate::session::ApprovalStatus::Pending {
                    view.change = changes.of(&view.unit);
                }
            }
            out
        })
        .await
        .map_err(|e| {
            ApiError::Store(crate::store::StoreError::Task(format!(
                "computing the approvals' changes failed: {e}"
            )))
        })
    }

    /// Approval unit `unit`, if `caller` may see its session.
    pub async fn approval(&self, caller: &Caller, unit: &str) -> Result<ApprovalUnit, ApiError> {
        let missing = || ApiError::Decision(DecideError::NotFound { unit: unit.into() });
        let found = self.engine.approval(unit).await?.ok_or_else(missing)?;
        if self.sees(caller, &found.session_id).await? { Ok(found) } else { Err(missing()) }
    }

    /// Records `caller`'s decision on unit `unit` (of session `session`, when given) if they
    /// may make it (a user who cannot see its session is told there is no such unit). The
    /// operator decides as the local user; an API principal by its token's name.
    pub async fn decide(
        &self,
        caller: &Caller,
        unit: &str,
        decision: Decision,
        reason: Option<String>,
        session: Option<String>,
    ) -> Result<ApprovalUnit, ApiError> {
        let Caller::Api(principal) = caller else {
            return Ok(self.brain.decide(unit, decision, reason, session).await??);
        };
        // Whether the caller sees and may decide the unit is checked in the transaction that
        // records the decision: one trip to the store.
        let (who, name) = (caller.clone(), unit.to_string());
        let check = move |owner: Option<Option<Owner>>| -> Result<(), AccessError> {
            let Some(owner) = owner.filter(|o| who.may_see(o.as_ref())) else {
                return Err(AccessError::NotFound(format!("there is no approval `{name}`")));
            };
            if who.may_decide(owner.as_ref()) {
                return Ok(());
            }
            Err(AccessError::Forbidden(format!(
                "an admin decides this session's approvals: its preset does not let its user decide{}",
                owner
                    .as_ref()
                    .and_then(|o| o.preset.as_deref())
                    .map(|p| format!(" (preset `{p}`)"))
                    .unwrap_or_default()
            )))
        };
        let by = principal.decider();
        Ok(self.brain.decide_checked(unit, decision, reason, session, by, check).await???)
    }

    /// Creates the session `req` asks for, from `template`, checked against what `caller`
    /// may do ([`session_spec_for`](Self::session_spec_for)); the caller is its owner.
    pub async fn create_session_for(
        &self,
        caller: &Caller,
        template: &SessionSpec,
        roots: &GrantRoots,
        req: SessionRequest,
    ) -> Result<crate::ids::SessionId, ApiError> {
        let spec = self.session_spec_for(caller, template, roots, req).await?;
        self.create(spec).await
    }

    /// The session `req` asks for, from `template`, checked against what `caller` may do:
    /// host directories only from an admin and under `roots`, a preset's grants otherwise;
    /// `allow` only from an admin; a user only lowers the budget and the workgroup limits and
    /// works for themselves. The caller is recorded as the session's owner.
    pub async fn session_spec_for(
        &self,
        caller: &Caller,
        template: &SessionSpec,
        roots: &GrantRoots,
        req: SessionRequest,
    ) -> Result<SessionSpec, ApiError> {
        let mut spec = template.clone();
        let admin = caller.is_admin();
        if !req.grants.is_empty() && req.preset.is_some() {
            return Err(ApiError::Input("give `grants` or `preset`, not both".into()));
        }
        let mut owner = match caller {
            Caller::Api(p) => Some(Owner { principal: p.id(), preset: None, user_decides: false }),
            Caller::Operator => None,
        };
        if !req.grants.is_empty() {
            if !admin {
                return Err(forbidden(
                    caller,
                    "only admins grant host directories: name a preset an admin defined (`preset`)",
                ));
            }
            let grants = req
                .grants
                .iter()
                .map(|g| crate::access::grant_of(&g.host, g.guest.as_deref(), g.access))
                .collect::<Result<Vec<Grant>, _>>()?;
            roots.check(&grants)?;
            spec.grants = grants;
        }
        if let Some(name) = &req.preset {
            let p = self.preset(caller, name).await?;
            spec.grants = p.grants;
            if let Some(o) = owner.as_mut() {
                o.preset = Some(p.name);
                o.user_decides = p.user_decides;
            }
        }
        if let Some(p) = req.policy {
            if !p.allow.is_empty() && !admin {
                return Err(forbidden(
                    caller,
                    "only admins may let tools run without asking (`policy.allow`)",
                ));
            }
            spec.allow.extend(p.allow);
            spec.ask.extend(p.ask);
            spec.deny.extend(p.deny);
        }
        if let Some(b) = req.budget {
            let d = spec.budget.clone();
            let timeout = b.timeout_ms.map(Duration::from_millis);
            if !admin
                && (b.fuel.is_some_and(|f| f > d.fuel)
                    || timeout.is_some_and(|t| t > d.timeout)
                    || b.memory.is_some_and(|m| m > d.memory))
            {
                return Err(forbidden(
                    caller,
                    &format!(
                        "a user may only lower the budget (fuel {}, timeout {} ms, memory {})",
                        d.fuel,
                        d.timeout.as_millis(),
                        d.memory
                    ),
                ));
            }
            spec.budget.fuel = b.fuel.unwrap_or(d.fuel);
            spec.budget.timeout = timeout.unwrap_or(d.timeout);
            spec.budget.memory = b.memory.unwrap_or(d.memory);
        }
        if let Some(m) = req.model {
            if m.trim().is_empty() {
                return Err(ApiError::Input("the model name is empty".into()));
            }
            spec.model.model = m.clone();
            if let Some(p) = spec.preprocess.as_mut()
                && p.model.model == template.model.model
            {
                p.model.model = m;
            }
        }
        spec.user = match (admin, req.user, caller.name()) {
            (true, Some(u), _) => Some(u),
            (true, None, _) => spec.user,
            (false, Some(u), Some(me)) if u != me => {
                return Err(forbidden(
                    caller,
                    "a user's sessions work for that user only (`user`)",
                ));
            }
            (false, _, me) => me.map(str::to_string),
        };
        if let Some(u) = &spec.user
            && !crate::memory::valid_principal(&crate::memory::typed(u, crate::memory::Kind::Token))
        {
            return Err(ApiError::Input(format!(
                "user `{}` is not a valid name",
                u.escape_debug()
            )));
        }
        spec.id = req.id;
        spec.tools = req.tools;
        spec.owner = owner;
        if let Some(m) = req.main {
            spec.main = Some(workgroup_limits(m, admin)?);
        }
        Ok(spec)
    }
}

/// The limits, checked; a user may not raise a default.
fn workgroup_limits(
    m: WorkgroupRequest,
    admin: bool,
) -> Result<crate::workgroup::Limits, ApiError> {
    let d = crate::workgroup::Limits::default();
    let limits = crate::workgroup::Limits {
        max_live_children: m.max_children.unwrap_or(d.max_live_children),
        max_depth: m.max_depth.unwrap_or(d.max_depth),
        child_deadline_secs: m.child_deadline_secs.unwrap_or(d.child_deadline_secs),
        wait_notice_secs: m.wait_notice_secs.unwrap_or(d.wait_notice_secs),
        max_steps: m.max_steps,
        max_tokens: m.max_tokens,
    };
    limits.check().map_err(ApiError::Input)?;
    if !admin
        && (limits.max_live_children > d.max_live_children
            || limits.max_depth > d.max_depth
            || limits.child_deadline_secs > d.child_deadline_secs)
    {
        return Err(AccessError::Forbidden(format!(
            "a user may only keep or lower a workgroup's limits (children {}, depth {}, deadline {} s)",
            d.max_live_children, d.max_depth, d.child_deadline_secs
        ))
        .into());
    }
    Ok(limits)
}

/// How a person who acts on a session is named in its events: this machine's user, or the
/// API caller.
pub(super) fn actor(caller: &Caller) -> String {
    match caller {
        Caller::Operator => crate::session::local_decider(),
        Caller::Api(p) => p.decider(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_line_reads_as_the_grant_flag_does() {
        let g = GrantRequest::parse(" /srv/data=/data:rw ").unwrap();
        assert_eq!(
            (g.host.as_str(), g.guest.as_deref(), g.access),
            ("/srv/data", Some("/data"), Some(Access::Rw))
        );
        let g = GrantRequest::parse("/srv/notes").unwrap();
        assert_eq!((g.host.as_str(), g.guest, g.access), ("/srv/notes", None, None));
        let g = GrantRequest::parse("/srv/notes:ro").unwrap();
        assert_eq!(g.access, Some(Access::Ro));
        for bad in ["", "=/data", "/srv/data=", ":rw"] {
            let e = GrantRequest::parse(bad).unwrap_err().to_string();
            assert!(e.contains("HOST_DIR[=GUEST_PATH]"), "{bad}: {e}");
        }
    }
}
