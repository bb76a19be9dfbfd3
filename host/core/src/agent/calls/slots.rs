//! The calls of one step as slots: how far each got, its journal row, the result the model
//! sees, and the validation of a fresh model response.

use std::collections::HashSet;
use std::sync::Arc;

use crate::meta::SessionMeta;
use crate::model::ToolCallRequest;
use crate::policy::Effect;
use crate::session::{JournalEntry, JournalStatus};
use crate::tools::result::{FailureKind, ToolResult};
use crate::tools::{Catalog, PolicyDecision, Resolved, ToolService};

/// A call's result (content for the model, failure kind), change set (JSON), duration (ms).
#[derive(Debug, Clone, Default)]
pub(super) struct Outcome {
    pub(super) result: ToolResult,
    pub(super) changes: Option<String>,
    pub(super) ms: f64,
    /// The changes a control call asked for.
    pub(super) control: Vec<crate::control::ControlRequest>,
    /// The call's HTTP request records (JSON), if it sent any.
    pub(super) net: Option<String>,
    /// The pre-images its changes refer to, kept with its journal entry.
    pub(super) kept: crate::tools::Kept,
    /// What its tool wrote to its log, stderr and stdout (JSON), if anything.
    pub(super) logs: Option<String>,
}

/// One call of a step and how far it got.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub(super) call: ToolCallRequest,
    /// The tool, from the catalog the step was assembled from (fresh steps only).
    pub(super) resolved: Option<Arc<Resolved>>,
    pub(super) effect: Option<Effect>,
    pub(super) digest: Option<String>,
    pub(super) idempotent: bool,
    pub(super) status: JournalStatus,
    pub(super) approval_id: Option<crate::ids::UnitId>,
    pub(super) outcome: Option<Outcome>,
    /// Whether `outcome` (or the current status) is already in the journal.
    pub(super) durable: bool,
}

impl Slot {
    pub(super) fn side_effecting(&self) -> bool {
        self.effect.is_some_and(|e| e != Effect::ReadOnly)
    }

    pub(super) fn entry(&self, position: usize) -> JournalEntry {
        let o = self.outcome.clone().unwrap_or_default();
        let has = self.outcome.is_some();
        JournalEntry {
            call_id: self.call.id.clone(),
            position: position as i64,
            tool: self.call.name.clone(),
            input: self.call.arguments.clone(),
            component_digest: self.digest.clone(),
            effect: self.effect,
            status: self.status,
            result: has.then_some(o.result.content),
            error_kind: o.result.error,
            changes: o.changes,
            duration_ms: has.then_some(o.ms),
            idempotent: self.idempotent,
            approval_id: self.approval_id.clone(),
            net: o.net,
            logs: o.logs,
            control_requests: o.control,
            kept: o.kept,
        }
    }

    pub(super) fn finish(&mut self, outcome: Outcome) {
        self.status = JournalStatus::Done;
        self.outcome = Some(outcome);
        self.durable = false;
    }
}

pub(super) fn error_outcome(kind: FailureKind, message: &str) -> Outcome {
    Outcome { result: ToolResult::failed(kind, message), ..Outcome::default() }
}

/// Validates the calls of a fresh model response: ids, known tools, JSON arguments, the input
/// schema of calls the policy asks about (a person is never asked about a call that cannot
/// run), and the policy's refusals.
pub(super) fn plan(
    tools: &ToolService,
    catalog: Option<&Catalog>,
    meta: &SessionMeta,
    calls: Vec<ToolCallRequest>,
    step: i64,
    cut: bool,
) -> Vec<Slot> {
    let mut seen = HashSet::new();
    calls
        .into_iter()
        .enumerate()
        .map(|(i, mut call)| {
            let mut refused: Option<Outcome> = None;
            if call.id.trim().is_empty() {
                call.id = format!("call_{step}_{i}").into();
            }
            if !seen.insert(call.id.clone()) {
                let original = call.id.clone();
                call.id = format!("{original}#{i}").into();
                refused = Some(error_outcome(
                    FailureKind::DuplicateCallId,
                    &format!("tool call id `{original}` was used twice in one response; this call was not run. Give every call its own id."),
                ));
            }
            let trimmed = call.arguments.trim();
            call.arguments = if trimmed.is_empty() { "{}".to_string() } else { trimmed.to_string() };
            let (mut effect, mut digest, mut idempotent, mut resolved) = (None, None, false, None);
            if refused.is_none() {
                if !meta.capabilities.loaded_tools.contains(&call.name) {
                    refused = Some(error_outcome(
                        FailureKind::UnknownTool,
                        &format!("there is no tool `{}` in this session; available tools: {}", call.name, meta.capabilities.loaded_tools.join(", ")),
                    ));
                } else if let Err(e) = serde_json::from_str::<serde_json::Value>(&call.arguments) {
                    refused = Some(if cut {
                        error_outcome(FailureKind::CutOff, &format!("your call of `{}` was cut off by the token limit (finish_reason: length) before its arguments were complete; it was not run. Send it again with shorter arguments, or split the work.", call.name))
                    } else {
                        error_outcome(FailureKind::InvalidInput, &format!("the arguments of `{}` are not valid JSON ({e}); send a JSON object", call.name))
                    });
                } else {
                    let found = match catalog {
                        Some(at) => at
                            .get_pinned(&call.name, &meta.capabilities.tool_pins)
                            .ok_or_else(|| tools.not_installed(&call.name)),
                        None => tools.resolve_pinned(&call.name, &meta.capabilities.tool_pins),
                    };
                    match found {
                        Ok(r) => {
                            resolved = Some(r.clone());
                            effect = Some(r.record.effect);
                            digest = Some(r.digest.clone());
                            idempotent = r.record.idempotent;
                            match meta.config.policy.decide_call(&call.name, r.record.effect, Some(&call.arguments)) {
                                PolicyDecision::Deny(why) => {
                                    refused = Some(error_outcome(FailureKind::PolicyDenied, &why));
                                }
                                PolicyDecision::Ask(_) => {
                                    if let Err(e) = tools.check_input(&r.record, &call.arguments) {
                                        refused = Some(error_outcome(e.failure(), &e.to_string()));
                                    }
                                }
                                PolicyDecision::Allow => {}
                            }
                        }
                        Err(e) => refused = Some(error_outcome(e.failure(), &e.to_string())),
                    }
                }
            }
            let mut slot = Slot {
                call,
                resolved,
                effect,
                digest,
                idempotent,
                status: JournalStatus::Planned,
                approval_id: None,
                outcome: None,
                durable: false,
            };
            if let Some(o) = refused {
                slot.finish(o);
            }
            slot
        })
        .collect()
}

/// Whether the policy asks about this slot's call.
pub(super) fn asks(meta: &SessionMeta, s: &Slot) -> bool {
    s.effect.is_some_and(|e| {
        matches!(
            meta.config.policy.decide_call(&s.call.name, e, Some(&s.call.arguments)),
            PolicyDecision::Ask(_)
        )
    })
}

/// Whether a slot must run alone, through the journal (side-effecting or asked about).
pub(super) fn journaled(meta: &SessionMeta, s: &Slot) -> bool {
    s.outcome.is_none() && (s.side_effecting() || asks(meta, s))
}

/// Journal rows of every slot whose state is not yet durable.
pub(super) fn unsaved(slots: &mut [Slot]) -> Vec<JournalEntry> {
    let mut out = Vec::new();
    for (i, s) in slots.iter_mut().enumerate() {
        if !s.durable {
            out.push(s.entry(i));
            s.durable = true;
        }
    }
    out
}
