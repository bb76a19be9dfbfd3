//! The use cases of time travel: rewinding what a session's calls changed on disk to how it
//! was at a step, and replaying its recorded read-only calls against the tools installed now.

use std::collections::HashMap;

use super::*;
use crate::compaction::Compaction;
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
    /// With the conversation: what became of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conversation: Option<ConversationReport>,
}

/// What a rewind did to the conversation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConversationReport {
    /// `done`, `would` (a dry run), `nothing` (no message came after the step), or `not_done`
    /// (`why`: files were left as they are).
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The messages that left (or would leave) the context, and those sent again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rewind: Option<crate::compaction::ConversationRewind>,
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
    /// Take the conversation back too, once every file is back: the messages after the step
    /// leave the model's context, and the next turn continues from the step.
    pub conversation: bool,
}

impl Harness {
    /// Session `id`, once `caller` may go back in it (`what`: `rewinding`, `replaying`) to
    /// step `step`: whoever may decide its approvals, to a step 0 or more.
    async fn travels(
        &self,
        caller: &Caller,
        id: &str,
        what: &str,
        step: i64,
    ) -> Result<super::callers::SessionRef, ApiError> {
        let sid = self.checked(caller, id).await?;
        let owner = self.engine.owner(&sid).await?;
        if !caller.may_decide(owner.as_ref()) {
            return Err(crate::access::AccessError::Forbidden(format!(
                "{what} session `{}` needs an admin, or its user where its preset lets them decide its approvals",
                id.escape_debug()
            ))
            .into());
        }
        if step < 0 {
            return Err(ApiError::Input(format!("step {step}: a step is 0 or more")));
        }
        Ok(sid)
    }

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
        let sid = self.travels(caller, id, "rewinding", to).await?;
        let steps = self.engine.runtime(&sid).await?.steps;
        if to > steps {
            return Err(ApiError::Input(format!(
                "session `{}` has {steps} step(s): --to {to} is past its last",
                id.escape_debug()
            )));
        }
        // The conversation's plan first: a conversation that cannot go back stops the rewind
        // before a file is written.
        let conversation = match opts.conversation {
            true => {
                let cut = Assembly::of(&self.engine).cut_after(&sid, to).await?;
                let plan = Compaction::of(&self.engine).plan_conversation_rewind(&sid, cut).await?;
                Some((cut, plan))
            }
            false => None,
        };
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
        let by = super::callers::actor(caller);
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
                by: by.clone(),
            };
            self.engine.end_rewind(&sid, event).await?;
        }
        let mut report = RewindReport {
            session_id: sid.to_string(),
            to,
            dry_run,
            resumed,
            paths,
            not_undone,
            conversation: None,
        };
        let left = report.left().count();
        report.conversation = match conversation {
            None => None,
            Some((_, None)) => {
                Some(ConversationReport { outcome: "nothing", why: None, rewind: None })
            }
            Some((_, Some(plan))) if dry_run => {
                Some(ConversationReport { outcome: "would", why: None, rewind: Some(plan) })
            }
            Some((_, Some(_))) if left > 0 => Some(ConversationReport {
                outcome: "not_done",
                why: Some(format!(
                    "{left} path(s) were left as they are: put them back (or force them), then run the rewind again"
                )),
                rewind: None,
            }),
            Some((cut, Some(_))) => {
                let done = Compaction::of(&self.engine).rewind_conversation(&sid, cut, by).await?;
                Some(ConversationReport {
                    outcome: if done.is_some() { "done" } else { "nothing" },
                    why: None,
                    rewind: done,
                })
            }
        };
        Ok(report)
    }
}

/// One recorded call of a [`Harness::replay`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplayedCall {
    pub step: i64,
    pub call_id: String,
    pub tool: String,
    /// `same` (the output is the recorded one), `changed`, or `skipped` (not re-run: `why`).
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The component that ran when the call was recorded, and the one installed now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recorded_digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest_now: Option<String>,
    /// A changed output: a unified diff from the recorded output to today's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
}

/// What [`Harness::replay`] found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplayReport {
    pub session_id: String,
    /// The calls after this step were looked at.
    pub at: i64,
    pub calls: Vec<ReplayedCall>,
}

impl ReplayReport {
    /// Calls whose output changed.
    pub fn changed(&self) -> usize {
        self.calls.iter().filter(|c| c.outcome == "changed").count()
    }
}

/// A private directory of the system's temporary directory, removed with everything in it
/// when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!("keel-replay-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self(path))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tool result as JSON pretty-printed (as it was, if it is not JSON), for a diff.
fn pretty(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_string())
}

impl Harness {
    /// Runs again the recorded calls of session `id` after step `at` that are read-only and
    /// idempotent — with the tools installed now, against a scratch copy of the session's
    /// grants (read-only; the session's files are not touched) — and says for each whether
    /// its output is the recorded one: a regression check of a new tool version against real
    /// recorded work. Calls of any other effect class, failed ones, host and control tools are
    /// never run: they are listed as skipped. Whoever may decide the session's approvals may.
    pub async fn replay(
        &self,
        caller: &Caller,
        id: &str,
        at: i64,
    ) -> Result<ReplayReport, ApiError> {
        let sid = self.travels(caller, id, "replaying", at).await?;
        let config = self.engine.config(&sid).await?;
        let cap = config.guards.as_ref().map_or(16 * 1024, |g| g.result_cap);
        // The scratch copy, each grant read-only at its guest path.
        let scratch = Scratch::new().map_err(|e| {
            ApiError::Grant(format!("a scratch directory for the replay cannot be made: {e}"))
        })?;
        let grants = config.grants.clone();
        let root = scratch.0.clone();
        let copies = tokio::task::spawn_blocking(move || -> Result<Vec<Grant>, String> {
            let mut copied = crate::undo::scratch::Copied::default();
            let mut out = Vec::new();
            for (i, g) in grants.iter().enumerate() {
                let dir = g.open().map_err(|e| e.to_string())?;
                let to = root.join(i.to_string());
                std::fs::create_dir(&to).map_err(|e| e.to_string())?;
                crate::undo::scratch::copy_tree(&dir, &to, &mut copied)?;
                out.push(
                    Grant::new(&to, &g.guest, crate::grant::Access::Ro)
                        .map_err(|e| e.to_string())?,
                );
            }
            Ok(out)
        })
        .await
        .map_err(|e| StoreError::Corrupt(format!("the replay's copy stopped: {e}")))?
        .map_err(|e| ApiError::Grant(format!("the session's grants cannot be copied: {e}")))?;
        let mut calls = Vec::new();
        for (step, e) in self.engine.calls_after(&sid, at).await? {
            let mut call = ReplayedCall {
                step,
                call_id: e.call_id.to_string(),
                tool: e.tool.clone(),
                outcome: "skipped",
                why: None,
                recorded_digest: e.component_digest.clone(),
                digest_now: None,
                diff: None,
            };
            let effect = e.effect.map_or("unknown".to_string(), |x| x.to_string());
            call.why = if e.effect != Some(crate::policy::Effect::ReadOnly) {
                Some(format!("its effect is {effect}: only read-only calls are run again"))
            } else if !e.idempotent {
                Some("it is not idempotent: running it again could differ by design".into())
            } else if e.status != crate::session::JournalStatus::Done || e.error_kind.is_some() {
                Some("it did not finish with a result".into())
            } else {
                match self.tools.resolve(&e.tool) {
                    Ok(r) if super::is_control_tool(&r.record) => {
                        Some("it is a control tool (it reads the session's own state)".into())
                    }
                    Ok(r) if matches!(r.source, crate::tools::ToolSource::Component) => {
                        call.digest_now = Some(r.digest.clone());
                        None
                    }
                    Ok(_) => Some("it is not a component (a host or MCP tool)".into()),
                    Err(err) => Some(format!("it cannot be run now: {err}")),
                }
            };
            if call.why.is_none() {
                let req = CallRequest {
                    tool: &e.tool,
                    input: &e.input,
                    grants: &copies,
                    net: crate::sandbox::net::NetGrants::none(),
                    budget: config.budget.clone(),
                    cancel: None,
                    loaded: None,
                    policy: None,
                    approval: None,
                    control: None,
                };
                let outcome = self.tools.call(req).await;
                let now = crate::tools::result::ToolResult::of(&outcome, cap, &config.policy);
                let recorded = e.result.clone().unwrap_or_default();
                if now.content == recorded {
                    call.outcome = "same";
                } else {
                    call.outcome = "changed";
                    let (diff, too_large) = crate::change::labeled_diff(
                        &e.tool,
                        &pretty(&recorded),
                        &pretty(&now.content),
                        "recorded",
                        "now",
                    );
                    call.diff = Some(match too_large {
                        Some(n) => format!("(diff too large: {n} lines changed)"),
                        None => diff,
                    });
                }
            }
            calls.push(call);
        }
        Ok(ReplayReport { session_id: sid.to_string(), at, calls })
    }
}
