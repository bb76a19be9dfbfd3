//! The tool calls of one step: validation, policy, approvals, execution order, the effect
//! journal, results.
//!
//! A step whose calls are all read-only (or refused) runs them and commits once, at its end.
//! Any other step is *opened* first (evidence, assistant message, every call planned) and then
//! driven call by call from its journal: the intent of a side-effecting call is durable before
//! it runs and its result after; a call the policy asks about stops the step until a person
//! decides. The same driver finishes a step after an approval or a crash.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Semaphore;

use crate::cancel::CancelToken;
use crate::digest::sha256_hex;
use crate::model::ToolCallRequest;
use crate::policy::Effect;
use crate::session::{
    AfterCrash, ApprovalStatus, ApprovalUnit, ConsumedApproval, JournalEntry, JournalStatus,
    OpenStep, SessionMeta, WaitCommit,
};
use crate::store::now_ms;
use crate::tools::{
    CallOutcome, CallRequest, Catalog, PolicyDecision, Resolved, ToolService, ToolServiceError,
};

use super::{AgentError, AgentService, Event, Events};

/// What the calls of one step produced, ready to commit.
pub(super) struct StepResult {
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
pub(super) enum StepEnd {
    /// Every call has its result.
    Done(StepResult),
    /// The step waits for these approval units.
    Waiting(Vec<String>),
}

/// A call's result: content for the model, error kind, change set (JSON), duration (ms).
#[derive(Debug, Clone, Default)]
struct Outcome {
    content: String,
    kind: Option<String>,
    changes: Option<String>,
    ms: f64,
}

/// One call of a step and how far it got.
#[derive(Debug, Clone)]
struct Slot {
    call: ToolCallRequest,
    /// The tool, from the catalog the step was assembled from (fresh steps only).
    resolved: Option<Arc<Resolved>>,
    effect: Option<Effect>,
    digest: Option<String>,
    idempotent: bool,
    status: JournalStatus,
    approval_id: Option<String>,
    outcome: Option<Outcome>,
    /// Whether `outcome` (or the current status) is already in the journal.
    durable: bool,
}

impl Slot {
    fn side_effecting(&self) -> bool {
        self.effect.is_some_and(|e| e != Effect::ReadOnly)
    }

    fn entry(&self, position: usize) -> JournalEntry {
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
        }
    }

    fn finish(&mut self, outcome: Outcome) {
        self.status = JournalStatus::Done;
        self.outcome = Some(outcome);
        self.durable = false;
    }
}

fn error_outcome(kind: &str, message: &str) -> Outcome {
    Outcome {
        content: json!({"error": {"kind": kind, "message": message}}).to_string(),
        kind: Some(kind.to_string()),
        ..Outcome::default()
    }
}

/// The content the model sees for a call's result, capped at `cap` bytes with a marker that
/// says how to read more.
pub fn result_content(
    outcome: &Result<CallOutcome, ToolServiceError>,
    cap: usize,
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
            Err(e) => (
                json!({"error": {"kind": e.kind(), "message": e.to_string()}}).to_string(),
                Some(e.kind().to_string()),
            ),
        },
        Err(e) => (
            json!({"error": {"kind": e.kind(), "message": e.to_string()}}).to_string(),
            Some(e.kind().to_string()),
        ),
    };
    (cap_text(text, cap), kind)
}

fn cap_text(text: String, cap: usize) -> String {
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
fn plan(
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
                call.id = format!("call_{step}_{i}");
            }
            if !seen.insert(call.id.clone()) {
                let original = call.id.clone();
                call.id = format!("{original}#{i}");
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
fn asks(meta: &SessionMeta, s: &Slot) -> bool {
    s.effect.is_some_and(|e| matches!(meta.policy.decide(&s.call.name, e), PolicyDecision::Ask(_)))
}

/// Whether a slot must run alone, through the journal (side-effecting or asked about).
fn journaled(meta: &SessionMeta, s: &Slot) -> bool {
    s.outcome.is_none() && (s.side_effecting() || asks(meta, s))
}

async fn execute(
    tools: Arc<ToolService>,
    meta: Arc<SessionMeta>,
    call: ToolCallRequest,
    resolved: Option<Arc<Resolved>>,
    approval: Option<ConsumedApproval>,
    cancel: CancelToken,
) -> Result<CallOutcome, ToolServiceError> {
    let req = CallRequest {
        tool: &call.name,
        input: &call.arguments,
        grants: &meta.grants,
        budget: meta.budget.clone(),
        cancel: Some(cancel),
        loaded: Some(&meta.loaded_tools),
        policy: Some(&meta.policy),
        approval: approval.as_ref(),
    };
    // The version the session pinned when it loaded the tool (kept after an upgrade).
    let resolved = match resolved {
        Some(r) => r,
        None => tools.resolve_pinned(&call.name, &meta.tool_pins)?,
    };
    tools.call_as(req, Some(resolved)).await
}

/// Runs the calls of a fresh model response.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_fresh(
    agent: &AgentService,
    meta: &SessionMeta,
    catalog: Option<&Catalog>,
    turn: i64,
    assembled: &crate::session::Assembled,
    reply: crate::model::ModelReply,
    cancel: &CancelToken,
    events: &Events,
) -> Result<StepEnd, AgentError> {
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
        agent
            .engine
            .open_step(&meta.id, turn, assembled.clone(), assistant.clone(), entries)
            .await?;
        for s in &mut slots {
            s.durable = true;
        }
        if slots.iter().any(|s| s.status == JournalStatus::Intent) {
            crate::crash::point("after_intent");
        }
    }
    drive(agent, meta, assembled.step, assistant, slots, Vec::new(), opened, cancel, events).await
}

/// Finishes an open step (after an approval, or after a crash), from its journal.
pub(super) async fn run_open(
    agent: &AgentService,
    meta: &SessionMeta,
    open: OpenStep,
    cancel: &CancelToken,
    events: &Events,
) -> Result<StepEnd, AgentError> {
    let mut slots: Vec<Slot> = open
        .calls
        .iter()
        .map(|e| {
            let outcome =
                matches!(e.status, JournalStatus::Done | JournalStatus::Unknown).then(|| Outcome {
                    content: e.result.clone().unwrap_or_default(),
                    kind: e.error_kind.clone(),
                    changes: e.changes.clone(),
                    ms: e.duration_ms.unwrap_or(0.0),
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
                s.outcome = Some(error_outcome("outcome_unknown", crate::session::OUTCOME_UNKNOWN));
                s.durable = false;
            }
            AfterCrash::Rerun => s.status = JournalStatus::Planned,
        }
    }
    drive(agent, meta, open.step, open.assistant, slots, open.units, true, cancel, events).await
}

/// The latest unit of a call.
fn unit_for<'a>(units: &'a [ApprovalUnit], call_id: &str) -> Option<&'a ApprovalUnit> {
    units.iter().rev().find(|u| u.call_id == call_id)
}

/// Whether an open step can make progress without a new decision: false when its first
/// unfinished call waits on a pending approval.
pub(super) fn can_progress(meta: &SessionMeta, open: &OpenStep) -> bool {
    let Some(first) = open
        .calls
        .iter()
        .find(|e| !matches!(e.status, JournalStatus::Done | JournalStatus::Unknown))
    else {
        return true;
    };
    let asked = first
        .effect
        .is_some_and(|e| matches!(meta.policy.decide(&first.tool, e), PolicyDecision::Ask(_)));
    !(asked
        && first.approval_id.is_none()
        && unit_for(&open.units, &first.call_id)
            .is_some_and(|u| u.status == ApprovalStatus::Pending))
}

fn new_unit(meta: &SessionMeta, step: i64, s: &Slot, why: String) -> ApprovalUnit {
    let now = now_ms();
    let seed = format!(
        "{}\u{1f}{step}\u{1f}{}\u{1f}{now}\u{1f}{:?}",
        meta.id,
        s.call.id,
        std::time::Instant::now()
    );
    let hash = blake3::hash(seed.as_bytes()).to_hex();
    ApprovalUnit {
        id: format!("ap-{}", &hash[..12]),
        session_id: meta.id.clone(),
        step,
        call_id: s.call.id.clone(),
        result_id: format!("res-{}", &hash[12..24]),
        tool: s.call.name.clone(),
        // Only resolved calls are asked about, so the effect is known; the strictest class
        // otherwise.
        effect: s.effect.unwrap_or(Effect::Destructive),
        component_digest: s.digest.clone().unwrap_or_default(),
        input: s.call.arguments.clone(),
        input_digest: sha256_hex(s.call.arguments.as_bytes()),
        grants: meta.grants.clone(),
        why,
        status: ApprovalStatus::Pending,
        created_at: now,
        decided_at: None,
        decision_reason: None,
        consumed_at: None,
    }
}

/// Journal rows of every slot whose state is not yet durable.
fn unsaved(slots: &mut [Slot]) -> Vec<JournalEntry> {
    let mut out = Vec::new();
    for (i, s) in slots.iter_mut().enumerate() {
        if !s.durable {
            out.push(s.entry(i));
            s.durable = true;
        }
    }
    out
}

/// What to do about an asked call.
enum Gate {
    Run(Option<String>),
    Reject(String),
    Wait { invalidate: Option<String> },
}

fn gate(agent: &AgentService, meta: &SessionMeta, units: &[ApprovalUnit], s: &Slot) -> Gate {
    if s.approval_id.is_some() {
        // Consumed by this very call before a crash; it re-runs only because it is idempotent.
        return Gate::Run(None);
    }
    match unit_for(units, &s.call.id) {
        Some(u) if u.status == ApprovalStatus::Approved => {
            // The approval binds (call id, component digest, input digest).
            let current = agent
                .tools
                .resolve_pinned(&s.call.name, &meta.tool_pins)
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

#[allow(clippy::too_many_arguments)]
async fn drive(
    agent: &AgentService,
    meta: &SessionMeta,
    step: i64,
    assistant: String,
    mut slots: Vec<Slot>,
    units: Vec<ApprovalUnit>,
    opened: bool,
    cancel: &CancelToken,
    events: &Events,
) -> Result<StepEnd, AgentError> {
    let id = meta.id.clone();
    let shared_meta = Arc::new(meta.clone());
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
                "interrupted",
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
                let (tools, meta, call, resolved, cancel, cap) = (
                    agent.tools.clone(),
                    shared_meta.clone(),
                    s.call.clone(),
                    s.resolved.clone(),
                    cancel.clone(),
                    agent.guards.result_cap,
                );
                run_one(tools, meta, call, resolved, None, cancel, cap)
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
        if asks(meta, &slots[i]) {
            match gate(agent, meta, &units, &slots[i]) {
                Gate::Run(unit) => consume = unit,
                Gate::Reject(message) => {
                    slots[i].finish(error_outcome("rejected", &message));
                    i += 1;
                    continue;
                }
                Gate::Wait { invalidate } => {
                    return wait(agent, meta, step, &mut slots, i, &units, invalidate, events)
                        .await;
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
        let outcome = run_one(
            agent.tools.clone(),
            shared_meta.clone(),
            s.call.clone(),
            resolved,
            approval,
            cancel.clone(),
            agent.guards.result_cap,
        )
        .await;
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
        if o.kind.is_some() {
            failed += 1;
        }
        results.push(
            json!({"role": "tool", "tool_call_id": s.call.id, "content": o.content}).to_string(),
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

/// Stops the step at slot `at` to wait for approvals: a pending unit for it and for every later
/// asked-about call that has none, with the results so far — one commit. Nothing is committed
/// when nothing changed (a resume that finds the same approval still pending).
#[allow(clippy::too_many_arguments)]
async fn wait(
    agent: &AgentService,
    meta: &SessionMeta,
    step: i64,
    slots: &mut [Slot],
    at: usize,
    units: &[ApprovalUnit],
    invalidate: Option<String>,
    events: &Events,
) -> Result<StepEnd, AgentError> {
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
                if let Ok(r) = agent.tools.resolve_pinned(&slot.call.name, &meta.tool_pins)
                    && slot.digest.as_deref() != Some(r.digest.as_str())
                {
                    slot.digest = Some(r.digest.clone());
                    slot.durable = false;
                }
                let why = match meta
                    .policy
                    .decide(&slot.call.name, slot.effect.unwrap_or(Effect::Destructive))
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

async fn run_one(
    tools: Arc<ToolService>,
    meta: Arc<SessionMeta>,
    call: ToolCallRequest,
    resolved: Option<Arc<Resolved>>,
    approval: Option<ConsumedApproval>,
    cancel: CancelToken,
    cap: usize,
) -> Outcome {
    let started = std::time::Instant::now();
    let outcome = execute(tools, meta, call, resolved, approval, cancel).await;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let changes = outcome
        .as_ref()
        .ok()
        .and_then(|o| o.changes.as_ref())
        .filter(|c| !c.is_empty())
        .and_then(|c| serde_json::to_string(c).ok());
    let (content, kind) = result_content(&outcome, cap);
    Outcome { content, kind, changes, ms }
}

fn finished_event(events: &Events, s: &Slot, o: &Outcome) {
    events(&Event::ToolFinished {
        name: s.call.name.clone(),
        call_id: s.call.id.clone(),
        ok: o.kind.is_none(),
        kind: o.kind.clone(),
        ms: o.ms,
    });
}
