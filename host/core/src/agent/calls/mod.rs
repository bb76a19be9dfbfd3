//! The tool calls of one step: validation, policy, approvals, execution order, the effect
//! journal, results.
//!
//! A step whose calls are all read-only (or refused) runs them and commits once, at its end.
//! Any other step is *opened* first (evidence, assistant message, every call planned) and then
//! driven call by call from its journal: the intent of a side-effecting call is durable before
//! it runs and its result after; a call the policy asks about stops the step until a person
//! decides. The same driver finishes a step after an approval or a crash.

mod direct;
mod drive;
mod gate;
mod slots;

use crate::assembly::Assembly;
use serde_json::json;

use crate::cancel::CancelToken;
use crate::meta::SessionMeta;
use crate::model::ToolCallRequest;
use crate::session::{AfterCrash, ApprovalStatus, JournalEntry, JournalStatus, OpenStep};
use crate::tools::result::{FailureKind, ToolResult};
use crate::tools::{Catalog, PolicyDecision};

use super::{AgentError, AgentService, Events};
use drive::{drive, finished_event};
use gate::unit_for;
use slots::{Outcome, Slot, asks, error_outcome, journaled, plan};

pub use direct::DirectCall;

/// Where a step's calls run: the agent, the session, the step, its cancel token and events.
#[derive(Clone, Copy)]
pub(in crate::agent) struct Step<'a> {
    pub agent: &'a AgentService,
    pub meta: &'a SessionMeta,
    pub step: i64,
    pub cancel: &'a CancelToken,
    pub events: &'a Events,
}

/// What the calls of one step produced, ready to commit.
pub(in crate::agent) struct StepResult {
    pub assistant: String,
    pub results: Vec<String>,
    pub journal: Vec<JournalEntry>,
    /// Whether the step was opened (its evidence is recorded; its open record must close).
    pub opened: bool,
    /// Whether the step ran a side-effecting call.
    pub wrote: bool,
    pub all_failed: bool,
    pub calls: usize,
    pub signatures: Vec<String>,
}

/// How the calls of a step ended.
pub(in crate::agent) enum StepEnd {
    /// Every call has its result.
    Done(StepResult),
    /// The step waits for these approval units.
    Waiting(Vec<crate::ids::UnitId>),
}

/// Runs the calls of a fresh model response.
pub(in crate::agent) async fn run_fresh(
    at: Step<'_>,
    catalog: Option<&Catalog>,
    turn: i64,
    assembled: &crate::assembly::Assembled,
    reply: crate::model::ModelReply,
) -> Result<StepEnd, AgentError> {
    let Step { agent, meta, events, .. } = at;
    let cut = reply.finish_reason.as_deref() == Some("length");
    let mut slots = plan(&agent.tools, catalog, meta, reply.tool_calls, assembled.step, cut);
    // Calls refused before anything could run (unknown tool, arguments that are not JSON, a
    // duplicate id, the policy) are reported like the others.
    for s in &slots {
        if let Some(o) = &s.outcome {
            finished_event(events, s, o);
        }
    }
    let calls: Vec<serde_json::Value> = slots
        .iter()
        .map(|s| json!({"id": s.call.id, "type": "function", "function": {"name": s.call.name, "arguments": s.call.arguments}}))
        .collect();
    let assistant =
        json!({"role": "assistant", "content": reply.content, "tool_calls": calls}).to_string();
    let opened = slots.iter().any(|s| journaled(meta, s));
    if opened {
        // The first call to run, if it is a side-effecting call that needs no approval, has its
        // intent recorded with the step: nothing runs between this commit and it.
        if let Some(first) = slots.iter_mut().find(|s| s.outcome.is_none())
            && first.side_effecting()
            && !asks(meta, first)
        {
            crate::crash::point("before_intent");
            first.status = JournalStatus::Intent;
        }
        let entries: Vec<JournalEntry> =
            slots.iter().enumerate().map(|(i, s)| s.entry(i)).collect();
        Assembly::of(&agent.engine)
            .open_step(&meta.id, turn, assembled.clone(), assistant.clone(), entries)
            .await?;
        for s in &mut slots {
            s.durable = true;
        }
        if slots.iter().any(|s| s.status == JournalStatus::Intent) {
            crate::crash::point("after_intent");
        }
    }
    drive(&at, assistant, slots, Vec::new(), opened).await
}

/// Finishes an open step (after an approval, or after a crash), from its journal.
pub(in crate::agent) async fn run_open(
    agent: &AgentService,
    meta: &SessionMeta,
    open: OpenStep,
    cancel: &CancelToken,
    events: &Events,
) -> Result<StepEnd, AgentError> {
    let at = Step { agent, meta, step: open.step, cancel, events };
    let mut slots: Vec<Slot> = open
        .calls
        .iter()
        .map(|e| {
            let outcome =
                matches!(e.status, JournalStatus::Done | JournalStatus::Unknown).then(|| Outcome {
                    result: ToolResult {
                        content: e.result.clone().unwrap_or_default(),
                        error: e.error_kind,
                    },
                    changes: e.changes.clone(),
                    ms: e.duration_ms.unwrap_or(0.0),
                    // A finished call's plan changes were applied when it was journaled.
                    control: Vec::new(),
                    net: e.net.clone(),
                    logs: e.logs.clone(),
                    // Kept when it was journaled.
                    kept: Default::default(),
                });
            Slot {
                call: ToolCallRequest {
                    id: e.call_id.clone(),
                    name: e.tool.clone(),
                    arguments: e.input.clone(),
                },
                resolved: None,
                effect: e.effect,
                digest: e.component_digest.clone(),
                idempotent: e.idempotent,
                status: e.status,
                approval_id: e.approval_id.clone(),
                outcome,
                durable: true,
            }
        })
        .collect();
    // An intent left by a runner that died: read-only and idempotent calls run again; any
    // other call's outcome is unknown and it never runs again.
    for s in &mut slots {
        match crate::session::after_crash(s.status, s.effect, s.idempotent) {
            AfterCrash::Keep => {}
            AfterCrash::OutcomeUnknown => {
                s.status = JournalStatus::Unknown;
                s.outcome = Some(error_outcome(
                    FailureKind::OutcomeUnknown,
                    crate::session::OUTCOME_UNKNOWN,
                ));
                s.durable = false;
            }
            AfterCrash::Rerun => s.status = JournalStatus::Planned,
        }
    }
    drive(&at, open.assistant, slots, open.units, true).await
}

/// Whether an open step can make progress without a new decision: false when its first
/// unfinished call waits on a pending approval.
pub(in crate::agent) fn can_progress(meta: &SessionMeta, open: &OpenStep) -> bool {
    let Some(first) = open
        .calls
        .iter()
        .find(|e| !matches!(e.status, JournalStatus::Done | JournalStatus::Unknown))
    else {
        return true;
    };
    let asked = first.effect.is_some_and(|e| {
        matches!(
            meta.config.policy.decide_call(&first.tool, e, Some(&first.input)),
            PolicyDecision::Ask(_)
        )
    });
    !(asked
        && first.approval_id.is_none()
        && unit_for(&open.units, &first.call_id)
            .is_some_and(|u| u.status == ApprovalStatus::Pending))
}
