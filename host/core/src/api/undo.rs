//! The use cases of undo: rewinding what a session's calls changed on disk to how it was at
//! a step.

use std::collections::HashMap;

use super::*;
use crate::undo::{Force, NotUndone, PathRewind, Was};

/// What [`Harness::rewind`] did, or with `dry_run` would do.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RewindReport {
    pub session_id: String,
    /// The step the files were put back to: as they were after its calls.
    pub to: i64,
    pub dry_run: bool,
    /// It finished a rewind to the same step that was cut short.
    pub resumed: bool,
    /// Each path the calls after the step changed, and what the rewind did to it.
    pub paths: Vec<PathRewind>,
    /// The calls after the step whose effects a rewind does not undo.
    pub not_undone: Vec<NotUndone>,
}

impl RewindReport {
    /// The paths left as they are (a conflict, not restorable, refused, failed).
    pub fn left(&self) -> impl Iterator<Item = &PathRewind> {
        self.paths.iter().filter(|p| !matches!(p.outcome, "done" | "would" | "already"))
    }
}

/// How a rewind runs.
#[derive(Debug, Clone, Default)]
pub struct RewindOptions {
    /// Only say what it would do (with a diff of each file to put back).
    pub dry_run: bool,
    /// Which paths changed since the session's last call to put back anyway.
    pub force: Force,
}

impl Harness {
    /// Puts back every file, link and directory the calls of session `id` after step `to`
    /// changed inside its grants, as they were after step `to` (0: before its first call),
    /// newest change first. A path changed since the session's last call is a conflict and is
    /// left alone unless `opts.force` names it; nothing is written in a dry run. Recorded as a
    /// `rewind_started` and a `rewound` event naming who; refused while a turn runs. Whoever
    /// may decide the session's approvals may rewind it.
    pub async fn rewind(
        &self,
        caller: &Caller,
        id: &str,
        to: i64,
        opts: RewindOptions,
    ) -> Result<RewindReport, ApiError> {
        let sid = self.checked(caller, id).await?;
        let owner = self.engine.owner(&sid).await?;
        if !caller.may_decide(owner.as_ref()) {
            return Err(crate::access::AccessError::Forbidden(format!(
                "rewinding session `{}` needs an admin, or its user where its preset lets them decide its approvals",
                id.escape_debug()
            ))
            .into());
        }
        if to < 0 {
            return Err(ApiError::Input(format!("--to {to}: a step is 0 or more")));
        }
        let steps = self.engine.runtime(&sid).await?.steps;
        if to > steps {
            return Err(ApiError::Input(format!(
                "session `{}` has {steps} step(s): --to {to} is past its last",
                id.escape_debug()
            )));
        }
        let calls = self.engine.calls_after(&sid, -1).await?;
        let rewinds = self.engine.rewinds(&sid).await?;
        let plan = crate::undo::plan(&calls, &rewinds, to).map_err(StoreError::Corrupt)?;
        let mut blobs = HashMap::new();
        for p in plan.paths.values() {
            if let Was::File { sha256, .. } = &p.was
                && !blobs.contains_key(sha256)
                && let Some(bytes) = self.engine.preimage(&sid, sha256).await?
            {
                blobs.insert(sha256.clone(), bytes);
            }
        }
        let grants = self.engine.config(&sid).await?.grants;
        let opened =
            grants.iter().map(|g| g.opened()).collect::<Result<Vec<_>, _>>().map_err(|e| {
                ApiError::Grant(format!("the session's grants cannot be used: {e}"))
            })?;
        let resumed = self.engine.open_rewind(&sid).await? == Some(to);
        let (force, dry_run) = (opts.force, opts.dry_run);
        let by = match caller {
            Caller::Operator => crate::session::local_decider(),
            Caller::Api(p) => p.decider(),
        };
        let (plan, opened, blobs) = (Arc::new(plan), Arc::new(opened), Arc::new(blobs));
        let mut paths = {
            let (p, g, b) = (plan.clone(), opened.clone(), blobs.clone());
            tokio::task::spawn_blocking(move || crate::undo::check(&p, &g, &force, to, &b))
                .await
                .map_err(|e| StoreError::Corrupt(format!("the rewind's check stopped: {e}")))?
        };
        let not_undone = plan.not_undone.clone();
        if !dry_run {
            self.engine.begin_rewind(&sid, to, paths.len(), by.clone()).await?;
            paths = tokio::task::spawn_blocking(move || {
                crate::undo::apply(&mut paths, &opened, &blobs);
                paths
            })
            .await
            .map_err(|e| StoreError::Corrupt(format!("the rewind stopped: {e}")))?;
            let done = |p: &&PathRewind| matches!(p.outcome, "done" | "already");
            let event = crate::session::SessionEvent::Rewound {
                to,
                after_step: steps,
                restored: paths.iter().filter(done).map(|p| p.path.clone()).collect(),
                left: paths
                    .iter()
                    .filter(|p| !done(p))
                    .map(|p| format!("{} ({})", p.path, p.outcome))
                    .collect(),
                not_undone: not_undone
                    .iter()
                    .map(|n| format!("step {} {} ({})", n.step, n.tool, n.call_id))
                    .collect(),
                by,
            };
            self.engine.end_rewind(&sid, event).await?;
        }
        Ok(RewindReport { session_id: sid.to_string(), to, dry_run, resumed, paths, not_undone })
    }
}
