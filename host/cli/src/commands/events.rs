//! Session events on the terminal: `keel session events`, and the progress lines of the
//! commands that run turns (`run`, `session send`, `approve`, `reject`, `recover`), which are
//! rendered from the same durable events — what one process prints, another can follow.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use keel::api::Caller;
use keel::harness::Harness;
use keel::session::{EventRow, JournalStatus, SessionEvent};

use super::{EXIT_REFUSED, inert};

/// How often a follower reads the store.
pub const POLL: Duration = Duration::from_millis(50);

/// The progress line of an event (without the `keel: ` prefix), or `None` for an event that
/// has none of its own.
pub fn render(row: &EventRow) -> Option<String> {
    Some(match &row.event {
        SessionEvent::InputAccepted { inbox_seq, .. } => format!("input #{inbox_seq} accepted"),
        SessionEvent::TurnStarted { turn } => format!("turn {turn} started"),
        SessionEvent::UnderstandingStarted { resumed: false, .. } => {
            "understanding the task".to_string()
        }
        SessionEvent::UnderstandingStarted { resumed: true, .. } => {
            "understanding the task (again: the process that began it stopped)".to_string()
        }
        SessionEvent::TaskTransition { relation, mode, error, .. } => {
            let relation = relation.map(|r| r.as_str()).unwrap_or("not asked");
            match error {
                Some(e) => format!(
                    "task: {relation} → {mode} (the understanding call failed: {})",
                    inert(e)
                ),
                None => format!("task: {relation} → {mode}"),
            }
        }
        SessionEvent::EnvironmentApplied { phase_goal, .. } => format!(
            "applying the task environment (phase goal: {})",
            inert(&keel::session::goal_reference(phase_goal.as_deref().unwrap_or("")))
        ),
        SessionEvent::CapabilitiesDiscovering { .. } => {
            "discovering skills, tools and memory".to_string()
        }
        SessionEvent::CapabilitiesRecalled {
            skills,
            toolsets,
            tools,
            memories,
            error,
            call,
            ..
        } => {
            let found = format!(
                "recalled {skills} skill(s), {toolsets} tool set(s), {tools} tool(s), {memories} memory(ies)"
            );
            match (error, call) {
                (Some(e), _) => format!("{found}; recall failed in part: {}", inert(e)),
                (None, true) => format!("{found}\nkeel: orchestrating task capabilities"),
                (None, false) => found,
            }
        }
        SessionEvent::Orchestrated { dropped, error, .. } => match error {
            Some(e) => {
                format!("orchestration failed, the environment stays as it was: {}", inert(e))
            }
            None if dropped.is_empty() => return None,
            None => {
                format!("orchestration: dropped unknown name(s) {}", inert(&dropped.join(", ")))
            }
        },
        SessionEvent::CapabilitiesAdded { via, tools, skills } => {
            let mut parts = Vec::new();
            if !skills.is_empty() {
                parts.push(format!("skill(s) {}", inert(&skills.join(", "))));
            }
            if !tools.is_empty() {
                parts.push(format!("tool(s) {}", inert(&tools.join(", "))));
            }
            format!("loaded {} ({via})", parts.join(" and "))
        }
        SessionEvent::CapabilityUnloaded { capability, name } => {
            format!("unloaded {capability} {}", inert(name))
        }
        SessionEvent::State { state, detail } => match detail {
            Some(d) => format!("state {state} ({})", inert(d)),
            None => format!("state {state}"),
        },
        SessionEvent::ModelCallStarted { step, resumed: false } => {
            format!("model call (step {step})")
        }
        SessionEvent::ModelCallStarted { step, resumed: true } => {
            format!("model call (step {step}, again: the process that began it stopped)")
        }
        SessionEvent::ModelCallFinished { step, finish_reason, usage, ms, empty, .. } => {
            let tokens = usage
                .map(|u| format!(", {} + {} tokens", u.prompt_tokens, u.completion_tokens))
                .unwrap_or_default();
            let mut line = format!("model replied (step {step}, {:.1} s{tokens})", ms / 1e3);
            if finish_reason.as_deref() == Some("length") {
                line.push_str(&format!(
                    "\nkeel: warning: the reply of step {step} was cut by the token limit (finish_reason: length); \
                     a longer one needs a larger --max-tokens (a new session) or a shorter request"
                ));
            } else if *empty {
                line.push_str(&format!(
                    "\nkeel: warning: the reply of step {step} is empty (finish_reason: {})",
                    finish_reason.as_deref().map(inert).unwrap_or_else(|| "none given".into())
                ));
            }
            line
        }
        SessionEvent::ModelCallFailed { step, refused, http_status, attempts, .. } => format!(
            "model call of step {step} failed after {attempts} attempt(s){}; kept as refused request #{refused}",
            http_status.map(|s| format!(" (HTTP {s})")).unwrap_or_default()
        ),
        SessionEvent::ToolCall { call_id, tool, status, error_kind, ms, .. } => {
            let ms = ms.map(|m| format!(" ({m:.1} ms)")).unwrap_or_default();
            match status {
                JournalStatus::Planned => return None,
                JournalStatus::Intent => format!("  → {} [{}]", inert(tool), inert(call_id)),
                JournalStatus::Done if error_kind.is_none() => format!("  ✓ {}{ms}", inert(tool)),
                JournalStatus::Waiting => return None,
                other => format!(
                    "  ✗ {}{ms}: {}",
                    inert(tool),
                    inert(error_kind.map_or(other.as_str(), |k| k.as_str()))
                ),
            }
        }
        SessionEvent::ApprovalAsked { unit, tool, .. } => format!(
            "  ⏸ {} needs approval: keel approve {unit}  (or keel reject {unit})",
            inert(tool)
        ),
        SessionEvent::ApprovalDecided { unit, decision, .. } => {
            format!("approval {unit} {}", inert(decision))
        }
        SessionEvent::Answer { turn, .. } => format!("turn {turn} answered"),
        SessionEvent::Notice { text } => inert(text),
        SessionEvent::PlanChanged { version, change, steps, done } => {
            format!("plan v{version} ({}): {done} of {steps} steps done", inert(change))
        }
        SessionEvent::PhaseCompleted { summary, .. } => {
            format!("task complete: {}", inert(&summary.chars().take(200).collect::<String>()))
        }
        SessionEvent::CompactionStarted { trigger, from, to, tokens } => format!(
            "compacting the context ({trigger}): summarizing messages {from}–{to}{}",
            tokens.map(|t| format!("; the next request was ~{t} tokens")).unwrap_or_default()
        ),
        SessionEvent::CheckpointPrepared { .. } => return None,
        SessionEvent::Compacted { checkpoint, to, tokens_before, tokens_after, ms, .. } => {
            let tokens = match (tokens_before, tokens_after) {
                (Some(b), Some(a)) => format!(", ~{b} → ~{a} tokens"),
                _ => String::new(),
            };
            format!(
                "context compacted: checkpoint {checkpoint}, requests now hold its summary and the messages after {to}{tokens} ({:.1} s)",
                ms / 1e3
            )
        }
        SessionEvent::CompactionFailed { error } => {
            format!("compaction failed; the context is unchanged: {}", inert(error))
        }
        SessionEvent::CompactionAbandoned { reason } => {
            format!("compaction abandoned; the context is unchanged: {}", inert(reason))
        }
        SessionEvent::CheckpointDiscarded { checkpoint, reason } => {
            format!("checkpoint {checkpoint} discarded: {}", inert(reason))
        }
        SessionEvent::Workgroup { event_kind, from, to, .. } => match event_kind.as_str() {
            "request" => format!("request {from} → {to}"),
            "wait_timeout" => format!("{from} is still working (told {to})"),
            kind => format!("{kind}: {from} → {to}"),
        },
        SessionEvent::ClientConnected { client, version, protocol, transport } => format!(
            "MCP client {} {} connected over {transport} (protocol {})",
            inert(client),
            inert(version),
            inert(protocol)
        ),
    })
}

/// Progress lines on stderr for a session while this process runs its turns: a follower of
/// the session's events from the moment it starts.
/// A line of a command's own progress: as [`render`], but a failed state without its detail,
/// which the command prints once, as its error, when it ends.
fn brief(row: &EventRow) -> Option<String> {
    match &row.event {
        SessionEvent::State { state: keel::session::RuntimeState::Failed, .. } => {
            Some("state failed".to_string())
        }
        _ => render(row),
    }
}

pub struct Progress {
    printed: Arc<AtomicI64>,
    task: tokio::task::JoinHandle<()>,
    harness: Harness,
    id: String,
}

impl Progress {
    /// Starts printing the events of session `id` committed from now on.
    pub async fn start(h: &Harness, id: &str) -> Self {
        let from = h.last_event(&Caller::Operator, id).await.unwrap_or(0);
        let printed = Arc::new(AtomicI64::new(from));
        let rx = h.follow(&Caller::Operator, id, from, POLL).await.ok();
        let seen = printed.clone();
        let task = tokio::spawn(async move {
            let Some(mut rx) = rx else { return };
            while let Some(Ok(row)) = rx.recv().await {
                if let Some(line) = brief(&row) {
                    eprintln!("keel: {line}");
                }
                seen.store(row.seq, Ordering::Release);
            }
        });
        Self { printed, task, harness: h.clone(), id: id.to_string() }
    }

    /// Prints what is left (every event committed before this call) and stops.
    pub async fn finish(self) {
        // The follower is stopped first (it prints and records each row between two awaits,
        // so it never stops half-way through one); then what it had not printed yet is read
        // and printed here, without waiting for its next poll.
        self.task.abort();
        let _ = self.task.await;
        let mut last = self.printed.load(Ordering::Acquire);
        while let Ok(rows) = self.harness.events(&Caller::Operator, &self.id, last, 256).await {
            if rows.is_empty() {
                break;
            }
            for row in rows {
                if let Some(line) = brief(&row) {
                    eprintln!("keel: {line}");
                }
                last = row.seq;
            }
        }
    }
}

/// A line for every event, the ones progress leaves out included (`keel session events`).
pub fn line(row: &EventRow) -> String {
    render(row).unwrap_or_else(|| match &row.event {
        SessionEvent::ToolCall { tool, status, .. } => format!("  {} {}", inert(tool), status),
        SessionEvent::Orchestrated { turn, .. } => {
            format!("orchestration of turn {turn}: every name it chose is known")
        }
        SessionEvent::CheckpointPrepared { checkpoint } => {
            format!("checkpoint {checkpoint} prepared (its summary is written, not promoted yet)")
        }
        // Every other kind has a line of its own in `render`; a kind added later that has
        // none yet is shown by its stored name, never as a Rust value.
        other => other.kind().to_string(),
    })
}

/// `keel session events ID [--after N] [--follow] [--json]`.
pub async fn execute(h: &Harness, id: &str, after: i64, follow: bool, json: bool) -> ExitCode {
    let print = |row: &EventRow| {
        if json {
            match serde_json::to_string(row) {
                Ok(line) => println!("{line}"),
                Err(e) => eprintln!("error: event {} cannot be written: {e}", row.seq),
            }
        } else {
            let line = line(row);
            println!("#{} {} {line}", row.seq, keel::units::format_time(row.at_ms));
        }
    };
    if !follow {
        let mut last = after;
        loop {
            match h.events(&Caller::Operator, id, last, 1000).await {
                Ok(rows) if rows.is_empty() => return ExitCode::SUCCESS,
                Ok(rows) => {
                    for row in &rows {
                        print(row);
                        last = row.seq;
                    }
                }
                Err(e) => return super::api_fail(json, &e),
            }
        }
    }
    let mut rx = match h.follow(&Caller::Operator, id, after, POLL).await {
        Ok(rx) => rx,
        Err(e) => return super::api_fail(json, &e),
    };
    loop {
        tokio::select! {
            next = rx.recv() => match next {
                Some(Ok(row)) => print(&row),
                Some(Err(e)) => return super::fail(json, e.kind(), &e.to_string(), EXIT_REFUSED),
                None => return ExitCode::SUCCESS,
            },
            _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
        }
    }
}
