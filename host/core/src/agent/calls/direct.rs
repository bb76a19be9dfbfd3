//! A direct call: one tool call a front-end makes in a session without a model step (an MCP
//! client's `tools/call`) — the step pipeline with one slot. It is planned like a model's
//! call (loaded, JSON, installed, policy, the input schema of a call the policy asks about),
//! gated (a call the policy asks about is put to a person now, through `ask`, and recorded as
//! a durable approval the call consumes — or refused when nobody can be asked), its intent is
//! durable before it runs, it runs as a step's call runs, and its result is built by the same
//! builder. It is journaled as a step of its own ([`crate::session::DIRECT_CALL_PREFIX`]).

use crate::ids::SessionId;
use std::future::Future;
use std::sync::Arc;

use tracing::Instrument;

use crate::cancel::CancelToken;
use crate::ids::CallId;
use crate::meta::SessionMeta;
use crate::model::ToolCallRequest;
use crate::policy::{Effect, PolicyDecision};
use crate::session::{ApprovalUnit, Decision, JournalStatus};
use crate::store::{StoreError, now_ms};
use crate::tools::result::{FailureKind, ToolResult};

use super::super::AgentService;
use super::drive::{CallJob, call_span, run_raw};
use super::gate::{Gate, gate, new_unit};
use super::slots::{Slot, asks, error_outcome, plan};

/// What a direct call came to.
#[derive(Debug)]
pub struct DirectCall {
    /// The step it was journaled as.
    pub step: i64,
    pub call_id: CallId,
    /// The result as the journal holds it (redacted and capped like a model's tool result).
    pub result: ToolResult,
    /// The tool's output when it ran and succeeded, as the tool returned it (a front-end that
    /// shows it redacts it with the session's policy).
    pub output: Option<serde_json::Value>,
    /// Whether the call ran (false: it was refused before it could).
    pub ran: bool,
    /// The policy's reason when the call needed an approval nobody could give.
    pub ask_reason: Option<String>,
}

impl AgentService {
    /// Runs one direct call of `tool` with `input` (JSON object text) in the session `meta`
    /// describes; the caller holds the session's runner lease. `ask` is called with the
    /// approval unit when the policy asks; it answers with the decision and its reason, or
    /// `None` when nobody can be asked (the call is then refused).
    pub async fn call_direct<F, Fut>(
        &self,
        meta: &SessionMeta,
        tool: &str,
        input: &str,
        cancel: &CancelToken,
        ask: F,
    ) -> Result<DirectCall, StoreError>
    where
        F: FnOnce(ApprovalUnit) -> Fut,
        Fut: Future<Output = Option<(Decision, Option<String>)>>,
    {
        let id = &meta.id;
        let seed =
            format!("{id}\u{1f}{tool}\u{1f}{}\u{1f}{:?}", now_ms(), std::time::Instant::now());
        let hash = blake3::hash(seed.as_bytes()).to_hex();
        let call_id = CallId::new(format!("{}{}", crate::session::DIRECT_CALL_PREFIX, &hash[..12]));
        let call = ToolCallRequest {
            id: call_id.clone(),
            name: tool.to_string(),
            arguments: input.to_string(),
        };
        let mut slot = plan(&self.tools, None, meta, vec![call], 0, false)
            .pop()
            .ok_or_else(|| StoreError::Task("a direct call was planned as no call".into()))?;
        let asked_about = slot.outcome.is_none() && asks(meta, &slot);
        if slot.outcome.is_none() {
            slot.status = if asked_about { JournalStatus::Waiting } else { JournalStatus::Intent };
        }
        let step = self.engine.begin_direct(id, slot.entry(0)).await?;
        slot.durable = true;
        let mut done = Done { agent: self, id, step, ran: false, ask_reason: None };
        if slot.outcome.is_some() {
            // Refused before anything could run (not loaded, bad input, denied, not installed).
            return done.finish(slot, None).await;
        }
        let mut consume = None;
        if asked_about {
            let why = match meta
                .config
                .policy
                .decide_call(
                    &slot.call.name,
                    slot.effect.unwrap_or(Effect::Destructive),
                    Some(&slot.call.arguments),
                )
            {
                PolicyDecision::Ask(why) => why,
                _ => String::new(),
            };
            let unit = new_unit(meta, step, &slot, why.clone());
            let unit_id = unit.id.clone();
            self.engine.ask_direct(id, step, slot.entry(0), unit.clone()).await?;
            let answer = ask(unit).await;
            let asked = answer.is_some();
            let (decision, reason) =
                answer.unwrap_or((Decision::Reject, Some("nobody could be asked".to_string())));
            let by = if asked {
                "the MCP client's user (elicitation)"
            } else {
                "keel: nobody could be asked"
            };
            // Exactly one decision wins: a person may have decided elsewhere meanwhile.
            let decided = self
                .engine
                .decide_by(&unit_id, decision, reason, Some(id.to_string()), by.to_string())
                .await?;
            if decided.is_ok() {
                crate::crash::point("after_decision");
            }
            let units: Vec<ApprovalUnit> =
                self.engine.approval(&unit_id).await?.into_iter().collect();
            match gate(self, meta, &units, &slot) {
                Gate::Run(unit) => consume = unit,
                Gate::Reject(_) if !asked => {
                    done.ask_reason = Some(why.clone());
                    let message =
                        format!("{why}; the call needs an approval and nobody could be asked");
                    slot.finish(error_outcome(FailureKind::NeedsApproval, &message));
                    return done.finish(slot, None).await;
                }
                Gate::Reject(message) => {
                    slot.finish(error_outcome(FailureKind::Rejected, &message));
                    return done.finish(slot, None).await;
                }
                Gate::Wait { .. } => {
                    let status = units.first().map_or("gone".to_string(), |u| u.status.to_string());
                    let message = format!(
                        "the call was not approved ({status}): it did not run. An approval binds \
                         the tool's component and the input; ask again to run it"
                    );
                    slot.finish(error_outcome(FailureKind::Rejected, &message));
                    return done.finish(slot, None).await;
                }
            }
        }
        let mut approval = None;
        if consume.is_some() {
            crate::crash::point("before_intent");
            slot.status = JournalStatus::Intent;
            slot.approval_id = consume.clone();
            approval = self.engine.commit_progress(id, step, vec![slot.entry(0)], consume).await?;
            crate::crash::point("after_intent");
        }
        let cap = meta.config.guards.as_ref().unwrap_or(&self.guards).result_cap;
        let job = CallJob {
            tools: self.tools.clone(),
            db: self.engine.db().clone(),
            meta: Arc::new(meta.clone()),
            call: slot.call.clone(),
            // An approved call runs the component its approval was bound to: resolved now.
            resolved: slot.resolved.clone().filter(|_| slot.approval_id.is_none()),
            approval,
            cancel: cancel.clone(),
            delegation: Arc::new(crate::workgroup::SessionDelegation::new(
                self.engine.db().clone(),
                id.to_string(),
                meta.config.grants.clone(),
            )),
        };
        let (outcome, raw) = run_raw(job, cap).instrument(call_span(step, &slot.call)).await;
        crate::crash::point("after_effect");
        slot.finish(outcome);
        done.ran = true;
        let output = raw.ok().and_then(|o| o.report.result.ok());
        done.finish(slot, output).await
    }
}

/// The end of a direct call: its final row and the `idle` state, in one commit.
struct Done<'a> {
    agent: &'a AgentService,
    id: &'a SessionId,
    step: i64,
    ran: bool,
    ask_reason: Option<String>,
}

impl Done<'_> {
    async fn finish(
        self,
        slot: Slot,
        output: Option<serde_json::Value>,
    ) -> Result<DirectCall, StoreError> {
        self.agent.engine.finish_direct(self.id, self.step, slot.entry(0)).await?;
        let result = slot.outcome.map(|o| o.result).unwrap_or_default();
        Ok(DirectCall {
            step: self.step,
            call_id: slot.call.id,
            result,
            output,
            ran: self.ran,
            ask_reason: self.ask_reason,
        })
    }
}
