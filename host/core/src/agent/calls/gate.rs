//! The approval gate of a step: which unit a call runs under, and the wait that stops the
//! step for a person's decision.

use crate::digest::sha256_hex;
use crate::ids::UnitId;
use crate::meta::SessionMeta;
use crate::policy::Effect;
use crate::session::{ApprovalStatus, ApprovalUnit, JournalStatus, WaitCommit};
use crate::tools::PolicyDecision;

use super::super::{AgentError, AgentService, Event};
use super::slots::{Slot, asks, unsaved};
use super::{Step, StepEnd};

/// The latest unit of a call.
pub(super) fn unit_for<'a>(units: &'a [ApprovalUnit], call_id: &str) -> Option<&'a ApprovalUnit> {
    units.iter().rev().find(|u| u.call_id == call_id)
}

pub(super) fn new_unit(meta: &SessionMeta, step: i64, s: &Slot, why: String) -> ApprovalUnit {
    ApprovalUnit::pending(&meta.id, &meta.config, step, &s.entry(0), why)
}

/// What to do about an asked call.
pub(super) enum Gate {
    Run(Option<UnitId>),
    Reject(String),
    Wait { invalidate: Option<UnitId> },
}

pub(super) fn gate(
    agent: &AgentService,
    meta: &SessionMeta,
    units: &[ApprovalUnit],
    s: &Slot,
) -> Gate {
    if s.approval_id.is_some() {
        // Consumed by this very call before a crash; it re-runs only because it is idempotent.
        return Gate::Run(None);
    }
    match unit_for(units, &s.call.id) {
        Some(u) if u.status == ApprovalStatus::Approved => {
            // The approval binds (call id, component digest, input digest).
            let current = agent
                .tools
                .resolve_pinned(&s.call.name, &meta.capabilities.tool_pins)
                .ok()
                .map(|r| r.digest.clone());
            let bound = u.call_id == s.call.id
                && u.input_digest == sha256_hex(s.call.arguments.as_bytes())
                && current.as_deref() == Some(u.component_digest.as_str());
            if bound {
                Gate::Run(Some(u.id.clone()))
            } else {
                Gate::Wait { invalidate: Some(u.id.clone()) }
            }
        }
        Some(u) if u.status == ApprovalStatus::Rejected => {
            let reason = u.decision_reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
            Gate::Reject(format!(
                "a person rejected this call (approval {}){reason}. It was not run; do not retry it without asking.",
                u.id
            ))
        }
        _ => Gate::Wait { invalidate: None },
    }
}

/// Stops the step at slot `at` to wait for approvals: a pending unit for it and for every later
/// asked-about call that has none, with the results so far — one commit. Nothing is committed
/// when nothing changed (a resume that finds the same approval still pending).
pub(super) async fn wait(
    step_at: &Step<'_>,
    slots: &mut [Slot],
    at: usize,
    units: &[ApprovalUnit],
    invalidate: Option<UnitId>,
) -> Result<StepEnd, AgentError> {
    let &Step { agent, meta, step, events, .. } = step_at;
    let mut new_units = Vec::new();
    let mut waiting = Vec::new();
    for slot in slots[at..].iter_mut() {
        if slot.outcome.is_some() || !asks(meta, slot) {
            continue;
        }
        let live = unit_for(units, &slot.call.id)
            .filter(|u| u.status == ApprovalStatus::Pending || u.status == ApprovalStatus::Approved)
            .filter(|u| invalidate.as_deref() != Some(u.id.as_str()));
        match live {
            Some(u) => waiting.push(u.id.clone()),
            None => {
                // The unit binds the component that would run now.
                if let Ok(r) =
                    agent.tools.resolve_pinned(&slot.call.name, &meta.capabilities.tool_pins)
                    && slot.digest.as_deref() != Some(r.digest.as_str())
                {
                    slot.digest = Some(r.digest.clone());
                    slot.durable = false;
                }
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
                let u = new_unit(meta, step, slot, why);
                waiting.push(u.id.clone());
                events(&Event::ApprovalNeeded { unit: u.id.clone(), tool: u.tool.clone() });
                new_units.push(u);
            }
        }
        if slot.status != JournalStatus::Waiting {
            slot.status = JournalStatus::Waiting;
            slot.durable = false;
        }
    }
    let entries = unsaved(slots);
    if !entries.is_empty() || !new_units.is_empty() || invalidate.is_some() {
        let wait =
            WaitCommit { step, entries, new_units, invalidate: invalidate.into_iter().collect() };
        agent.engine.commit_wait(&meta.id, wait).await?;
    }
    Ok(StepEnd::Waiting(waiting))
}
