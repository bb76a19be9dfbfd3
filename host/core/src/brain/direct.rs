//! Direct calls: a front-end (an MCP client) calls one tool in a session, without a model.
//!
//! The call runs under the session's runner lease like a turn (two processes never run one
//! session at once), through the same ToolService chain with the session's grants, loaded
//! tools, policy and budget, and is journaled as a step of its own. A call the policy asks
//! about waits for a person's decision — taken by `ask` (an MCP client's elicitation) and
//! recorded as a durable approval that the call consumes — or, when nobody can be asked, is
//! refused without running.

use std::future::Future;

use crate::cancel::CancelToken;
use crate::ids::CallId;
use crate::policy::PolicyDecision;
use crate::session::{ApprovalStatus, ApprovalUnit, Decision, JournalEntry, JournalStatus};
use crate::store::{StoreError, now_ms};
use crate::tools::{CallOutcome, CallRequest, ToolServiceError};

use super::{Brain, RunnerTasks};

/// What a direct call came to.
#[derive(Debug)]
pub struct DirectCall {
    /// The step it was journaled as.
    pub step: i64,
    pub call_id: CallId,
    /// The call's outcome (a refusal before it ran is an `Err`).
    pub outcome: Result<CallOutcome, DirectRefusal>,
    /// The result as the journal holds it (redacted and capped like a model's tool result).
    pub content: String,
}

/// Why a direct call did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DirectRefusal {
    /// `needs_approval`, `rejected`, or a ToolService error kind (`denied`, `invalid_input` …).
    pub kind: String,
    pub message: String,
    /// The policy's reason when the call needed an approval nobody could give.
    pub ask_reason: Option<String>,
}

impl Brain {
    /// Runs one direct call of `tool` with `input` (JSON object text) in session `id`. `ask`
    /// is called with the approval unit when the policy asks; it answers with the decision
    /// and its reason, or `None` when nobody can be asked (the call is then refused).
    #[tracing::instrument(name = "direct_call", skip_all, fields(session_id = %id, tool = %tool))]
    pub async fn call_direct<F, Fut>(
        &self,
        id: &str,
        tool: &str,
        input: &str,
        cancel: &CancelToken,
        ask: F,
    ) -> Result<DirectCall, StoreError>
    where
        F: FnOnce(ApprovalUnit) -> Fut,
        Fut: Future<Output = Option<(Decision, Option<String>)>>,
    {
        let busy = || {
            StoreError::Conflict(format!(
                "session `{id}` is being run by another runner; a direct call waits for none"
            ))
        };
        let Some(local) = self.enter(id) else { return Err(busy()) };
        if !self.try_acquire(id).await? {
            return Err(busy());
        }
        let guard = RunnerTasks::start(self, id, cancel);
        let result = self.direct_held(id, tool, input, cancel, ask).await;
        drop(guard);
        let released = self.release(id, true).await;
        drop(local);
        let call = result?;
        released?;
        Ok(call)
    }

    async fn direct_held<F, Fut>(
        &self,
        id: &str,
        tool: &str,
        input: &str,
        cancel: &CancelToken,
        ask: F,
    ) -> Result<DirectCall, StoreError>
    where
        F: FnOnce(ApprovalUnit) -> Fut,
        Fut: Future<Output = Option<(Decision, Option<String>)>>,
    {
        let tools = self.agent.tools().clone();
        let meta = self.engine().meta(id).await?;
        let cap = meta.guards.clone().unwrap_or_else(|| self.agent.guards().clone()).result_cap;
        let seed =
            format!("{id}\u{1f}{tool}\u{1f}{}\u{1f}{:?}", now_ms(), std::time::Instant::now());
        let hash = blake3::hash(seed.as_bytes()).to_hex();
        let call_id = CallId::new(format!("{}{}", crate::session::DIRECT_CALL_PREFIX, &hash[..12]));
        let resolved = tools.catalog().ok().and_then(|c| c.get_pinned(tool, &meta.tool_pins));
        let mut entry = JournalEntry {
            call_id: call_id.clone(),
            position: 0,
            tool: tool.to_string(),
            input: input.to_string(),
            component_digest: resolved.as_ref().map(|r| r.digest.clone()),
            effect: resolved.as_ref().map(|r| r.record.effect),
            status: JournalStatus::Intent,
            result: None,
            error_kind: None,
            changes: None,
            duration_ms: None,
            idempotent: resolved.as_ref().is_some_and(|r| r.record.idempotent),
            approval_id: None,
            net: None,
            control_requests: Vec::new(),
        };
        let step = self.engine().begin_direct(id, entry.clone()).await?;
        let refuse =
            |entry: &mut JournalEntry, kind: &str, message: String, ask: Option<String>| {
                let content = crate::tools::result::error_content(kind, &message);
                entry.status = JournalStatus::Done;
                entry.result = Some(content.clone());
                entry.error_kind = Some(kind.to_string());
                (DirectRefusal { kind: kind.to_string(), message, ask_reason: ask }, content)
            };
        let mut consumed = None;
        // A call the chain would refuse anyway (not loaded, bad input) is refused by it, never
        // put to a person.
        if let Some(r) = &resolved
            && meta.loaded_tools.iter().any(|t| t == tool)
            && let PolicyDecision::Ask(why) = meta.policy.decide(&r.record.name, r.record.effect)
        {
            if let Err(e) = tools.check_input(&r.record, input) {
                let (refusal, content) = refuse(&mut entry, e.kind(), e.to_string(), None);
                return self.direct_done(id, step, entry, Err(refusal), content).await;
            }
            let unit = ApprovalUnit::pending(&meta, step, &entry, why.clone());
            let unit_id = unit.id.clone();
            entry.status = JournalStatus::Waiting;
            entry.approval_id = Some(unit_id.clone());
            self.engine().ask_direct(id, step, entry.clone(), unit.clone()).await?;
            let answer = ask(unit).await;
            let asked = answer.is_some();
            let (decision, reason) =
                answer.unwrap_or((Decision::Reject, Some("nobody could be asked".to_string())));
            // Exactly one decision wins: a person may have decided elsewhere meanwhile.
            let by = if asked {
                "the MCP client's user (elicitation)"
            } else {
                "keel: nobody could be asked"
            };
            let _ = self
                .decide_by(&unit_id, decision, reason, Some(id.to_string()), by.to_string())
                .await?;
            let decided = self.engine().approval(&unit_id).await?;
            let status = decided.as_ref().map(|u| u.status);
            if status != Some(ApprovalStatus::Approved) {
                let (kind, message, ask_reason) = match (asked, decided) {
                    (false, Some(u)) if u.status == ApprovalStatus::Rejected => (
                        "needs_approval",
                        format!("{why}; the call needs an approval and nobody could be asked"),
                        Some(why.clone()),
                    ),
                    (_, u) => (
                        "rejected",
                        format!(
                            "the call was not approved ({}){}",
                            u.as_ref().map_or("gone".to_string(), |u| u.status.to_string()),
                            u.and_then(|u| u.decision_reason)
                                .map(|r| format!(": {r}"))
                                .unwrap_or_default()
                        ),
                        None,
                    ),
                };
                let (refusal, content) = refuse(&mut entry, kind, message, ask_reason);
                return self.direct_done(id, step, entry, Err(refusal), content).await;
            }
            entry.status = JournalStatus::Intent;
            consumed =
                self.engine().commit_progress(id, step, vec![entry.clone()], Some(unit_id)).await?;
        }
        let started = std::time::Instant::now();
        let outcome = tools
            .call_as(
                CallRequest {
                    tool,
                    input,
                    grants: &meta.grants,
                    net: &meta.net,
                    budget: meta.budget.clone(),
                    cancel: Some(cancel.clone()),
                    loaded: Some(&meta.loaded_tools),
                    policy: Some(&meta.policy),
                    approval: consumed.as_ref(),
                    control: None,
                },
                resolved,
            )
            .await;
        let (content, kind) = crate::agent::result_content(&outcome, cap, &meta.policy);
        entry.status = JournalStatus::Done;
        entry.result = Some(content.clone());
        entry.error_kind = kind;
        entry.duration_ms = Some(started.elapsed().as_secs_f64() * 1e3);
        let outcome = match outcome {
            Ok(o) => {
                entry.changes = o.changes.as_ref().and_then(|c| serde_json::to_string(c).ok());
                entry.net = crate::agent::net_records(&o.report.net);
                Ok(o)
            }
            Err(e) => Err(refusal_of(&e)),
        };
        self.direct_done(id, step, entry, outcome, content).await
    }

    async fn direct_done(
        &self,
        id: &str,
        step: i64,
        entry: JournalEntry,
        outcome: Result<CallOutcome, DirectRefusal>,
        content: String,
    ) -> Result<DirectCall, StoreError> {
        let call_id = entry.call_id.clone();
        self.engine().finish_direct(id, step, entry).await?;
        Ok(DirectCall { step, call_id, outcome, content })
    }
}

fn refusal_of(e: &ToolServiceError) -> DirectRefusal {
    let ask_reason = match e {
        ToolServiceError::NeedsApproval { reason } => Some(reason.clone()),
        _ => None,
    };
    DirectRefusal { kind: e.kind().to_string(), message: e.to_string(), ask_reason }
}
