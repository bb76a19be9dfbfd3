//! The calls of one step as slots: how far each got, its journal row, the result the model
//! sees, and the validation of a fresh model response.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::json;

use crate::model::ToolCallRequest;
use crate::policy::Effect;
use crate::session::{JournalEntry, JournalStatus, SessionMeta};
use crate::tools::{CallOutcome, Catalog, PolicyDecision, Resolved, ToolService, ToolServiceError};

/// A call's result: content for the model, error kind, change set (JSON), duration (ms).
#[derive(Debug, Clone, Default)]
pub(super) struct Outcome {
    pub(super) content: String,
    pub(super) kind: Option<String>,
    pub(super) changes: Option<String>,
    pub(super) ms: f64,
    /// The changes a control call asked for.
    pub(super) control: Vec<crate::control::ControlRequest>,
    /// The call's HTTP request records (JSON), if it sent any.
    pub(super) net: Option<String>,
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
            result: has.then_some(o.content),
            error_kind: o.kind,
            changes: o.changes,
            duration_ms: has.then_some(o.ms),
            idempotent: self.idempotent,
            approval_id: self.approval_id.clone(),
            net: o.net,
            control_requests: o.control,
        }
    }

    pub(super) fn finish(&mut self, outcome: Outcome) {
        self.status = JournalStatus::Done;
        self.outcome = Some(outcome);
        self.durable = false;
    }
}

pub(super) fn error_outcome(kind: &str, message: &str) -> Outcome {
    Outcome {
        content: crate::tools::result::error_content(kind, message),
        kind: Some(kind.to_string()),
        ..Outcome::default()
    }
}

/// The content the model sees for a call's result: redacted by `policy`, then capped at
/// `cap` bytes with a marker that says how to read more.
pub fn result_content(
    outcome: &Result<CallOutcome, ToolServiceError>,
    cap: usize,
    policy: &crate::policy::Policy,
) -> (String, Option<String>) {
    let (text, kind) = match outcome {
        Ok(o) => match &o.report.result {
            Ok(v) => {
                let text = match &o.changes {
                    Some(ch) if !ch.is_empty() => json!({"output": v, "changes": ch}).to_string(),
                    _ => v.to_string(),
                };
                (text, None)
            }
            Err(e) => {
                let mut error = crate::tools::result::error_value(e.kind(), &e.to_string());
                // Why keel refused a request: the tool only saw HTTP-request-denied.
                let refused: Vec<String> = o
                    .report
                    .net
                    .records
                    .iter()
                    .filter(|r| r.outcome != "ok")
                    .filter_map(|r| {
                        r.reason.as_ref().map(|why| {
                            format!(
                                "{} {}://{}:{}{}: {why}",
                                r.method, r.scheme, r.host, r.port, r.path
                            )
                        })
                    })
                    .collect();
                if !refused.is_empty() {
                    error["error"]["network"] = json!(refused);
                }
                (error.to_string(), Some(e.kind().to_string()))
            }
        },
        Err(e) => (
            crate::tools::result::error_content(e.kind(), &e.to_string()),
            Some(e.kind().to_string()),
        ),
    };
    (cap_text(policy.redact(&text).into_owned(), cap), kind)
}

pub(super) fn cap_text(text: String, cap: usize) -> String {
    if text.len() <= cap {
        return text;
    }
    let mut cut = cap;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(
        "{}\n[output truncated: {} of {} bytes shown. Ask for less at a time — use offset/limit, a narrower path or fewer results — to read the rest.]",
        &text[..cut],
        cut,
        text.len()
    )
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
                    "duplicate_call_id",
                    &format!("tool call id `{original}` was used twice in one response; this call was not run. Give every call its own id."),
                ));
            }
            let trimmed = call.arguments.trim();
            call.arguments = if trimmed.is_empty() { "{}".to_string() } else { trimmed.to_string() };
            let (mut effect, mut digest, mut idempotent, mut resolved) = (None, None, false, None);
            if refused.is_none() {
                if !meta.loaded_tools.contains(&call.name) {
                    refused = Some(error_outcome(
                        "unknown_tool",
                        &format!("there is no tool `{}` in this session; available tools: {}", call.name, meta.loaded_tools.join(", ")),
                    ));
                } else if let Err(e) = serde_json::from_str::<serde_json::Value>(&call.arguments) {
                    refused = Some(if cut {
                        error_outcome("cut_off", &format!("your call of `{}` was cut off by the token limit (finish_reason: length) before its arguments were complete; it was not run. Send it again with shorter arguments, or split the work.", call.name))
                    } else {
                        error_outcome("invalid_input", &format!("the arguments of `{}` are not valid JSON ({e}); send a JSON object", call.name))
                    });
                } else {
                    let found = match catalog {
                        Some(at) => at
                            .get_pinned(&call.name, &meta.tool_pins)
                            .ok_or_else(|| tools.not_installed(&call.name)),
                        None => tools.resolve_pinned(&call.name, &meta.tool_pins),
                    };
                    match found {
                        Ok(r) => {
                            resolved = Some(r.clone());
                            effect = Some(r.record.effect);
                            digest = Some(r.digest.clone());
                            idempotent = r.record.idempotent;
                            match meta.policy.decide(&call.name, r.record.effect) {
                                PolicyDecision::Deny(why) => {
                                    refused = Some(error_outcome("denied", &why));
                                }
                                PolicyDecision::Ask(_) => {
                                    if let Err(e) = tools.check_input(&r.record, &call.arguments) {
                                        refused = Some(error_outcome(e.kind(), &e.to_string()));
                                    }
                                }
                                PolicyDecision::Allow => {}
                            }
                        }
                        Err(e) => refused = Some(error_outcome(e.kind(), &e.to_string())),
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
    s.effect.is_some_and(|e| matches!(meta.policy.decide(&s.call.name, e), PolicyDecision::Ask(_)))
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
