//! The tool calls of one model response: validation, execution order, results.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Semaphore;

use crate::model::{ModelReply, ToolCallRequest};
use crate::sandbox::CancelToken;
use crate::session::{Assembled, JournalEntry, SessionMeta};
use crate::tools::{CallOutcome, CallRequest, ToolService, ToolServiceError};

use super::{AgentError, AgentService, Event, Events};

/// What the calls of one step produced, ready to commit.
pub(super) struct StepResult {
    pub assistant: String,
    pub results: Vec<String>,
    pub journal: Vec<JournalEntry>,
    pub intents_committed: bool,
    pub all_failed: bool,
    pub calls: usize,
    pub signatures: Vec<String>,
}

/// A call's result: content for the model, error kind, change set (JSON), duration (ms).
type Outcome = (String, Option<String>, Option<String>, f64);

/// A call after validation.
struct Planned {
    call: ToolCallRequest,
    /// Set when the call is refused before it runs.
    refusal: Option<(String, String)>,
    effect: Option<String>,
    digest: Option<String>,
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

fn refusal(kind: &str, message: String) -> Option<(String, String)> {
    Some((kind.to_string(), message))
}

fn plan(
    tools: &ToolService,
    meta: &SessionMeta,
    calls: Vec<ToolCallRequest>,
    step: i64,
) -> Vec<Planned> {
    let mut seen = HashSet::new();
    calls
        .into_iter()
        .enumerate()
        .map(|(i, mut call)| {
            let mut refused = None;
            if call.id.trim().is_empty() {
                call.id = format!("call_{step}_{i}");
            }
            if !seen.insert(call.id.clone()) {
                let original = call.id.clone();
                call.id = format!("{original}#{i}");
                refused = refusal(
                    "duplicate_call_id",
                    format!("tool call id `{original}` was used twice in one response; this call was not run. Give every call its own id."),
                );
            }
            let trimmed = call.arguments.trim();
            call.arguments = if trimmed.is_empty() { "{}".to_string() } else { trimmed.to_string() };
            let args = call.arguments.as_str();
            let mut effect = None;
            let mut digest = None;
            if refused.is_none() {
                if !meta.loaded_tools.contains(&call.name) {
                    refused = refusal(
                        "unknown_tool",
                        format!("there is no tool `{}` in this session; available tools: {}", call.name, meta.loaded_tools.join(", ")),
                    );
                } else if let Err(e) = serde_json::from_str::<serde_json::Value>(args) {
                    refused = refusal("invalid_input", format!("the arguments of `{}` are not valid JSON ({e}); send a JSON object", call.name));
                } else {
                    match tools.resolve(&call.name) {
                        Ok(r) => {
                            effect = Some(r.record.effect.clone());
                            digest = Some(r.digest.clone());
                        }
                        Err(e) => refused = refusal(e.kind(), e.to_string()),
                    }
                }
            }
            Planned { call, refusal: refused, effect, digest }
        })
        .collect()
}

fn entry(p: &Planned, position: usize, status: &str) -> JournalEntry {
    JournalEntry {
        call_id: p.call.id.clone(),
        position: position as i64,
        tool: p.call.name.clone(),
        input: p.call.arguments.clone(),
        component_digest: p.digest.clone(),
        effect: p.effect.clone(),
        status: status.to_string(),
        result: None,
        error_kind: None,
        changes: None,
        duration_ms: None,
    }
}

async fn execute(
    tools: Arc<ToolService>,
    meta: Arc<SessionMeta>,
    call: ToolCallRequest,
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
    };
    tools.call(req).await
}

pub(super) async fn run_calls(
    agent: &AgentService,
    meta: &SessionMeta,
    assembled: &Assembled,
    reply: ModelReply,
    cancel: &CancelToken,
    events: &Events,
) -> Result<StepResult, AgentError> {
    let id = meta.id.clone();
    let planned = plan(&agent.tools, meta, reply.tool_calls, assembled.step);
    let writes = |p: &Planned| p.refusal.is_none() && p.effect.as_deref() != Some("read-only");
    let intents: Vec<JournalEntry> = planned
        .iter()
        .enumerate()
        .filter(|(_, p)| writes(p))
        .map(|(i, p)| entry(p, i, "intent"))
        .collect();
    let intents_committed = !intents.is_empty();
    if intents_committed {
        agent.engine.commit_intents(&id, assembled.clone(), intents).await?;
    }
    let meta = Arc::new(meta.clone());
    let mut outcomes: Vec<Option<Outcome>> = vec![None; planned.len()];
    let semaphore = Arc::new(Semaphore::new(agent.guards.max_parallel.max(1)));
    let mut i = 0;
    while i < planned.len() {
        // A run of consecutive read-only (or refused) calls runs in parallel; a side-effecting
        // call runs alone.
        let mut group = vec![i];
        if !writes(&planned[i]) {
            while i + group.len() < planned.len() && !writes(&planned[i + group.len()]) {
                group.push(i + group.len());
            }
        }
        let mut tasks = tokio::task::JoinSet::new();
        for &k in &group {
            let p = &planned[k];
            if let Some((kind, message)) = &p.refusal {
                let content = json!({"error": {"kind": kind, "message": message}}).to_string();
                outcomes[k] = Some((content, Some(kind.clone()), None, 0.0));
                continue;
            }
            if cancel.is_cancelled() {
                let content = json!({"error": {"kind": "interrupted", "message": "the user interrupted the turn before this call ran; it was not run"}}).to_string();
                outcomes[k] = Some((content, Some("interrupted".into()), None, 0.0));
                continue;
            }
            events(&Event::ToolStarted { name: p.call.name.clone(), call_id: p.call.id.clone() });
            let (tools, meta, call, cancel, sem, cap) = (
                agent.tools.clone(),
                meta.clone(),
                p.call.clone(),
                cancel.clone(),
                semaphore.clone(),
                agent.guards.result_cap,
            );
            tasks.spawn(async move {
                let _permit = sem.acquire_owned().await;
                let started = std::time::Instant::now();
                let outcome = execute(tools, meta, call, cancel).await;
                let ms = started.elapsed().as_secs_f64() * 1e3;
                let changes = outcome
                    .as_ref()
                    .ok()
                    .and_then(|o| o.changes.as_ref())
                    .filter(|c| !c.is_empty())
                    .and_then(|c| serde_json::to_string(c).ok());
                let (content, kind) = result_content(&outcome, cap);
                (k, content, kind, changes, ms)
            });
        }
        while let Some(done) = tasks.join_next().await {
            let (k, content, kind, changes, ms) = match done {
                Ok(v) => v,
                Err(e) => {
                    return Err(AgentError::Store(crate::store::StoreError::Invalid(format!(
                        "a tool task failed: {e}"
                    ))));
                }
            };
            let p = &planned[k];
            events(&Event::ToolFinished {
                name: p.call.name.clone(),
                call_id: p.call.id.clone(),
                ok: kind.is_none(),
                kind: kind.clone(),
                ms,
            });
            // A side-effecting call's result is made durable at once when more calls follow in
            // this step; for the last one, the step's own commit records it (one fsync less).
            let more_follow = i + group.len() < planned.len();
            if writes(p) && more_follow {
                let mut e = entry(p, k, "done");
                e.result = Some(content.clone());
                e.error_kind = kind.clone();
                e.changes = changes.clone();
                e.duration_ms = Some(ms);
                agent.engine.commit_call_result(&id, assembled.step, e).await?;
            }
            outcomes[k] = Some((content, kind, changes, ms));
        }
        i += group.len();
    }
    let assistant_calls: Vec<serde_json::Value> = planned
        .iter()
        .map(|p| json!({"id": p.call.id, "type": "function", "function": {"name": p.call.name, "arguments": p.call.arguments}}))
        .collect();
    let assistant =
        json!({"role": "assistant", "content": reply.content, "tool_calls": assistant_calls})
            .to_string();
    let mut results = Vec::new();
    let mut journal = Vec::new();
    let mut failed = 0;
    for (k, p) in planned.iter().enumerate() {
        let (content, kind, changes, ms) = outcomes[k].clone().unwrap_or_default();
        if kind.is_some() {
            failed += 1;
        }
        results.push(
            json!({"role": "tool", "tool_call_id": p.call.id, "content": content}).to_string(),
        );
        let mut e = entry(p, k, "done");
        e.result = Some(content);
        e.error_kind = kind;
        e.changes = changes;
        e.duration_ms = Some(ms);
        journal.push(e);
    }
    let signatures =
        planned.iter().map(|p| format!("{}\u{1f}{}", p.call.name, p.call.arguments)).collect();
    Ok(StepResult {
        assistant,
        results,
        journal,
        intents_committed,
        all_failed: failed == planned.len(),
        calls: planned.len(),
        signatures,
    })
}
