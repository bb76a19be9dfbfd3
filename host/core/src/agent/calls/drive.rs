//! Driving a step's calls from its journal.

use std::sync::Arc;

use serde_json::json;
use tokio::sync::Semaphore;
use tracing::Instrument;

use crate::cancel::CancelToken;
use crate::meta::SessionMeta;
use crate::model::ToolCallRequest;
use crate::session::{ApprovalStatus, ApprovalUnit, ConsumedApproval, JournalStatus};
use crate::tools::result::{FailureKind, ToolResult};
use crate::tools::{CallOutcome, CallRequest, Resolved, ToolService, ToolServiceError};

use super::super::{AgentError, Event, Events};
use super::gate::{Gate, gate, wait};
use super::slots::{Outcome, Slot, asks, error_outcome, journaled, unsaved};
use super::{Step, StepEnd, StepResult};

/// Runs the step's calls in order from where its journal stands: parallel runs of read-only
/// calls; each side-effecting or asked-about call alone, its intent durable before it runs.
pub(super) async fn drive(
    at: &Step<'_>,
    assistant: String,
    mut slots: Vec<Slot>,
    units: Vec<ApprovalUnit>,
    opened: bool,
) -> Result<StepEnd, AgentError> {
    let &Step { agent, meta, step, cancel, events } = at;
    let id = meta.id.clone();
    let shared_meta = Arc::new(meta.clone());
    let delegation: Arc<dyn crate::control::Delegation> =
        Arc::new(crate::workgroup::SessionDelegation::new(
            agent.engine().db().clone(),
            id.to_string(),
            meta.config.grants.clone(),
        ));
    let semaphore = Arc::new(Semaphore::new(agent.guards.max_parallel.max(1)));
    let mut wrote = false;
    let mut i = 0;
    while i < slots.len() {
        if slots[i].outcome.is_some() {
            i += 1;
            continue;
        }
        if cancel.is_cancelled() {
            slots[i].finish(error_outcome(
                FailureKind::Interrupted,
                "the user interrupted the turn before this call ran; it was not run",
            ));
            i += 1;
            continue;
        }
        if !journaled(meta, &slots[i]) {
            // A run of consecutive read-only calls runs in parallel.
            let mut group = vec![i];
            while let Some(next) = slots.get(i + group.len())
                && next.outcome.is_none()
                && !journaled(meta, next)
            {
                group.push(i + group.len());
            }
            // Announces call `k` and returns the run of it.
            let start = |k: usize| {
                let s = &slots[k];
                events(&Event::ToolStarted {
                    name: s.call.name.clone(),
                    call_id: s.call.id.clone(),
                });
                let job = CallJob {
                    tools: agent.tools.clone(),
                    db: agent.engine().db().clone(),
                    meta: shared_meta.clone(),
                    call: s.call.clone(),
                    resolved: s.resolved.clone(),
                    approval: None,
                    cancel: cancel.clone(),
                    delegation: delegation.clone(),
                };
                run_one(job, agent.guards.result_cap).instrument(call_span(step, &s.call))
            };
            if let [k] = group[..] {
                // One call runs here, not as a task of its own: a spawn and a cross-thread
                // wake-up per step were measurable at many sessions.
                let outcome = start(k).await;
                finished_event(events, &slots[k], &outcome);
                slots[k].finish(outcome);
                i += 1;
                continue;
            }
            let mut tasks = tokio::task::JoinSet::new();
            for &k in &group {
                let (run, sem) = (start(k), semaphore.clone());
                tasks.spawn(async move {
                    let _permit = sem.acquire_owned().await;
                    (k, run.await)
                });
            }
            while let Some(done) = tasks.join_next().await {
                let (k, outcome) = done.map_err(|e| {
                    AgentError::Store(crate::store::StoreError::Task(format!(
                        "a tool task failed: {e}"
                    )))
                })?;
                finished_event(events, &slots[k], &outcome);
                slots[k].finish(outcome);
            }
            i += group.len();
            continue;
        }
        // A side-effecting or asked-about call: alone, through the journal.
        let mut consume = None;
        let asked = asks(meta, &slots[i]);
        // A call a person approved before the policy came to allow it ("always allow" with
        // the approval) still consumes its approval, so the unit says it ran.
        let approved = !asked
            && super::unit_for(&units, &slots[i].call.id)
                .is_some_and(|u| u.status == ApprovalStatus::Approved);
        if asked || approved {
            match gate(agent, meta, &units, &slots[i]) {
                Gate::Run(unit) => consume = unit,
                Gate::Reject(message) => {
                    slots[i].finish(error_outcome(FailureKind::Rejected, &message));
                    i += 1;
                    continue;
                }
                // An approval that no longer binds the call the policy now allows: it runs
                // as allowed.
                Gate::Wait { .. } if approved => {}
                Gate::Wait { invalidate } => {
                    return wait(at, &mut slots, i, &units, invalidate).await;
                }
            }
        }
        let already_intent = slots[i].status == JournalStatus::Intent && slots[i].durable;
        let mut approval = None;
        if !already_intent {
            crate::crash::point("before_intent");
            slots[i].status = JournalStatus::Intent;
            if consume.is_some() {
                slots[i].approval_id = consume.clone();
            }
            slots[i].durable = false;
            let entries = unsaved(&mut slots);
            approval = agent.engine.commit_progress(&id, step, entries, consume).await?;
            crate::crash::point("after_intent");
        }
        if let (None, Some(unit)) = (&approval, &slots[i].approval_id) {
            // Consumed by this call before its process stopped; it runs again only because
            // it is idempotent.
            approval = agent.engine.consumed_approval(&id, unit, &slots[i].call.id).await?;
        }
        let s = &slots[i];
        events(&Event::ToolStarted { name: s.call.name.clone(), call_id: s.call.id.clone() });
        // An approved call runs the component its approval was bound to: resolved now.
        let resolved = s.resolved.clone().filter(|_| s.approval_id.is_none());
        let job = CallJob {
            tools: agent.tools.clone(),
            db: agent.engine().db().clone(),
            meta: shared_meta.clone(),
            call: s.call.clone(),
            resolved,
            approval,
            cancel: cancel.clone(),
            delegation: delegation.clone(),
        };
        let outcome =
            run_one(job, agent.guards.result_cap).instrument(call_span(step, &s.call)).await;
        crate::crash::point("after_effect");
        finished_event(events, &slots[i], &outcome);
        slots[i].finish(outcome);
        wrote = true;
        // More calls follow: make this result durable now (the last one commits with the step).
        if slots[i + 1..].iter().any(|s| s.outcome.is_none()) {
            let entries = unsaved(&mut slots);
            agent.engine.commit_progress(&id, step, entries, None).await?;
            crate::crash::point("after_result");
        }
        i += 1;
    }
    let mut results = Vec::new();
    let mut journal = Vec::new();
    let mut failed = 0;
    for (k, s) in slots.iter().enumerate() {
        let o = s.outcome.clone().unwrap_or_default();
        if !o.result.is_ok() {
            failed += 1;
        }
        results.push(
            json!({"role": "tool", "tool_call_id": s.call.id, "content": o.result.content})
                .to_string(),
        );
        journal.push(s.entry(k));
    }
    let signatures =
        slots.iter().map(|s| format!("{}\u{1f}{}", s.call.name, s.call.arguments)).collect();
    Ok(StepEnd::Done(StepResult {
        assistant,
        results,
        journal,
        opened,
        wrote,
        all_failed: failed == slots.len(),
        calls: slots.len(),
        signatures,
    }))
}

/// One call to run, owned: it may run as a task of its own.
pub(super) struct CallJob {
    pub(super) tools: Arc<ToolService>,
    pub(super) db: crate::store::Db,
    pub(super) meta: Arc<SessionMeta>,
    pub(super) call: ToolCallRequest,
    /// The tool from the step's catalog; `None` resolves the session's pinned version now.
    pub(super) resolved: Option<Arc<Resolved>>,
    pub(super) approval: Option<ConsumedApproval>,
    pub(super) cancel: CancelToken,
    /// The step's delegation checks (shared by its calls, so parallel spawns count each other).
    pub(super) delegation: Arc<dyn crate::control::Delegation>,
}

async fn execute(job: CallJob) -> Result<CallOutcome, ToolServiceError> {
    let CallJob { tools, db, meta, call, resolved, approval, cancel, delegation } = job;
    let req = CallRequest {
        tool: &call.name,
        input: &call.arguments,
        grants: &meta.config.grants,
        net: &meta.config.net,
        budget: meta.config.budget.clone(),
        cancel: Some(cancel),
        loaded: Some(&meta.capabilities.loaded_tools),
        policy: Some(&meta.config.policy),
        approval: approval.as_ref(),
        control: Some(crate::control::ControlSession {
            plan: meta.task.plan_state(),
            discovery: Some(Arc::new(crate::preparation::SessionDiscovery::new(
                db,
                meta.config.user(),
            ))),
            delegation: Some(delegation),
        }),
    };
    // The version the session pinned when it loaded the tool (kept after an upgrade).
    let resolved = match resolved {
        Some(r) => r,
        None => tools.resolve_pinned(&call.name, &meta.capabilities.tool_pins)?,
    };
    tools.call_as(req, Some(resolved)).await
}

/// The span of one call of a step, inside its turn's span: `step`, `call_id`, `tool`.
pub(super) fn call_span(step: i64, call: &ToolCallRequest) -> tracing::Span {
    tracing::info_span!(
        "tool_call",
        step,
        call_id = %call.id,
        tool = %call.name,
        gen_ai.tool.call.arguments = tracing::field::Empty,
        gen_ai.tool.call.result = tracing::field::Empty,
    )
}

async fn run_one(job: CallJob, cap: usize) -> Outcome {
    run_raw(job, cap).await.0
}

/// Runs one call: its outcome as the journal keeps it, and the ToolService's own answer.
pub(super) async fn run_raw(
    job: CallJob,
    cap: usize,
) -> (Outcome, Result<CallOutcome, ToolServiceError>) {
    let started = std::time::Instant::now();
    let meta = job.meta.clone();
    let call_input = crate::metrics::capture_content().then(|| job.call.arguments.clone());
    let outcome = execute(job).await;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let changes = outcome
        .as_ref()
        .ok()
        .and_then(|o| o.changes.as_ref())
        .filter(|c| !c.is_empty())
        .and_then(|c| serde_json::to_string(c).ok());
    let control = outcome.as_ref().map(|o| o.report.control_requests.clone()).unwrap_or_default();
    // Redacted before the result is journaled, put in the history or shown to anyone.
    let result = ToolResult::of(&outcome, cap, &meta.config.policy);
    let logs = crate::tools::result::kept_logs(&outcome, &meta.config.policy);
    if let Some(input) = call_input {
        let span = tracing::Span::current();
        span.record("gen_ai.tool.call.arguments", crate::metrics::captured(input.as_bytes()));
        span.record("gen_ai.tool.call.result", crate::metrics::captured(result.content.as_bytes()));
    }
    let net = outcome.as_ref().ok().and_then(|o| net_records(&o.report.net));
    let kept = outcome
        .as_ref()
        .ok()
        .and_then(|o| o.changes.as_ref())
        .map(|c| c.kept.clone())
        .unwrap_or_default();
    (Outcome { result, changes, ms, control, net, kept, logs }, outcome)
}

/// The journal's JSON of a call's request records (`None`: it sent none).
fn net_records(net: &crate::sandbox::net::NetReport) -> Option<String> {
    if net.records.is_empty() {
        return None;
    }
    let value = match net.dropped {
        0 => serde_json::json!(net.records),
        n => serde_json::json!({"records": net.records, "dropped": n}),
    };
    Some(value.to_string())
}

pub(super) fn finished_event(events: &Events, s: &Slot, o: &Outcome) {
    events(&Event::ToolFinished {
        name: s.call.name.clone(),
        call_id: s.call.id.clone(),
        ok: o.result.is_ok(),
        kind: o.result.error,
        ms: o.ms,
    });
}
