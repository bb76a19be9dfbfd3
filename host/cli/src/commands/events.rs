//! Session events on the terminal: `keel session events`, and the progress lines of the
//! commands that run turns (`run`, `session send`, `approve`, `reject`, `recover`), which are
//! rendered from the same durable events — what one process prints, another can follow.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use keel::api::Caller;
use keel::protocol::events::{EventRow, SessionEvent};
use keel::protocol::sessions::JournalStatus;
use keel::protocol::setup::Harness;

use super::{EXIT_REFUSED, inert, inert_block};

/// How often a follower reads the store.
pub const POLL: Duration = Duration::from_millis(50);

/// How much of a session's events progress shows.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// The default: the goal, each tool call with what it touched, approvals, warnings and
    /// failures — what a person follows a turn by.
    Compact,
    /// `-v`: a line for every step (inputs, turns, states, model calls, tool intents).
    Verbose,
}

impl Detail {
    /// The detail `-v` asked for.
    pub fn from_flags() -> Self {
        if super::style::verbose() { Detail::Verbose } else { Detail::Compact }
    }
}

/// Whether an event is plumbing: a step of the machinery a person does not follow a turn by,
/// shown only with `-v`.
fn plumbing(event: &SessionEvent) -> bool {
    match event {
        SessionEvent::InputAccepted { .. }
        | SessionEvent::TurnStarted { .. }
        | SessionEvent::UnderstandingStarted { .. }
        | SessionEvent::CapabilitiesDiscovering { .. }
        | SessionEvent::State { .. }
        | SessionEvent::ModelCallStarted { .. }
        | SessionEvent::Answer { .. }
        | SessionEvent::ClientConnected { .. }
        | SessionEvent::CompactionStarted { .. } => true,
        SessionEvent::TaskTransition { error, .. } => error.is_none(),
        SessionEvent::CapabilitiesRecalled { error, .. } => error.is_none(),
        SessionEvent::ToolCall { status, .. } => *status == JournalStatus::Intent,
        _ => false,
    }
}

/// A tool call as a person reads it: its name and what it touches.
fn call(tool: &str, subject: &Option<String>) -> String {
    match subject {
        Some(s) => format!("{} {}", inert(tool), inert(s)),
        None => inert(tool),
    }
}

/// The progress line of an event at `detail` (without the `keel: ` prefix), or `None` for an
/// event that has none there.
pub fn render(row: &EventRow, detail: Detail) -> Option<String> {
    if detail == Detail::Compact {
        if plumbing(&row.event) {
            return None;
        }
        match &row.event {
            SessionEvent::EnvironmentApplied { session_goal, phase_goal } => {
                let goal = phase_goal.as_deref().or(session_goal.as_deref()).unwrap_or("");
                return Some(format!(
                    "goal: {}",
                    inert(&keel::protocol::sessions::goal_reference(goal))
                ));
            }
            SessionEvent::ModelCallFinished { .. } => {
                // Only its warnings (a reply cut or empty), never the timing line.
                let full = render(row, Detail::Verbose)?;
                let warnings: Vec<&str> =
                    full.lines().skip(1).map(|l| l.trim_start_matches("keel: ")).collect();
                return (!warnings.is_empty()).then(|| warnings.join("\nkeel: "));
            }
            _ => {}
        }
    }
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
            inert(&keel::protocol::sessions::goal_reference(phase_goal.as_deref().unwrap_or("")))
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
        SessionEvent::ToolCall {
            call_id, tool, status, error_kind, ms, subject, reason, ..
        } => {
            // A call the policy refused never ran: it has no duration to show.
            let ran = *error_kind != Some(keel::protocol::sessions::FailureKind::PolicyDenied);
            let ms =
                ms.filter(|m| ran && *m > 0.0).map(|m| format!(" ({m:.1} ms)")).unwrap_or_default();
            let what = call(tool, subject);
            match status {
                JournalStatus::Planned => return None,
                JournalStatus::Intent => format!("  → {what} [{}]", inert(call_id)),
                JournalStatus::Done if error_kind.is_none() => format!("  ✓ {what}{ms}"),
                JournalStatus::Waiting => return None,
                other => format!("  ✗ {what}{ms}: {}", failure(other, *error_kind, reason)),
            }
        }
        SessionEvent::ApprovalAsked { unit, tool, subject, .. } => format!(
            "  ⏸ {} needs approval: keel approve {unit}  (or keel reject {unit})",
            call(tool, subject)
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
        SessionEvent::Compacted {
            checkpoint,
            to,
            tokens_before,
            tokens_after,
            ms,
            mechanical,
            ..
        } => {
            let tokens = match (tokens_before, tokens_after) {
                (Some(b), Some(a)) => format!(", ~{b} → ~{a} tokens"),
                _ => String::new(),
            };
            let how = match mechanical {
                Some(why) => format!(
                    "; the summary is keel's own, from the session's record, as the summary call failed: {}",
                    inert(why)
                ),
                None => String::new(),
            };
            format!(
                "context compacted: checkpoint {checkpoint}, requests now hold its summary and the messages after {to}{tokens} ({:.1} s){how}",
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
        SessionEvent::PolicyChanged { change, policy, by } => {
            format!("policy: {} (by {}); now {}", inert(change), inert(by), inert(policy))
        }
        SessionEvent::ModelChanged { from, to, by } => format!(
            "model {} → {} (by {})",
            super::describe_model(from),
            super::describe_model(to),
            inert(by)
        ),
        SessionEvent::RewindStarted { to, files, by } => {
            format!("rewind to step {to} begins: {files} path(s) (by {})", inert(by))
        }
        SessionEvent::Rewound { to, restored, left, not_undone, by, .. } => format!(
            "rewound to step {to} (by {}): {} put back, {} left as they are, {} call(s) not undone",
            inert(by),
            restored.len(),
            left.len(),
            not_undone.len()
        ),
        SessionEvent::Forked { from, at, by, .. } => {
            format!("forked from session {} at step {at} (by {})", inert(from), inert(by))
        }
        SessionEvent::ConversationRewound { to, rewound_from, rewound_to, by, .. } => format!(
            "conversation rewound to step {to} (by {}): messages {rewound_from}–{rewound_to} left the context",
            inert(by)
        ),
    })
}

/// Why a call failed, as a person reads it: a policy's refusal says which rule, the sandbox's
/// or a tool's says `denied:` and why, anything else its kind and first line.
fn failure(
    status: &JournalStatus,
    kind: Option<keel::protocol::sessions::FailureKind>,
    reason: &Option<String>,
) -> String {
    use keel::protocol::sessions::FailureKind;
    let reason = reason.as_deref().map(inert);
    match (kind, reason) {
        (Some(FailureKind::PolicyDenied), Some(r)) => r,
        (Some(FailureKind::PolicyDenied), None) => "denied by policy".to_string(),
        (Some(k), Some(r)) => format!("{}: {r}", k.as_str().replace('_', " ")),
        (Some(k), None) => k.as_str().replace('_', " "),
        (None, _) => status.as_str().to_string(),
    }
}

/// A line of a command's own progress: as [`render`], but a failed state without its detail,
/// which the command prints once, as its error, when it ends.
fn brief(row: &EventRow, detail: Detail) -> Option<String> {
    match &row.event {
        SessionEvent::State { state: keel::protocol::sessions::RuntimeState::Failed, .. } => {
            (detail == Detail::Verbose).then(|| "state failed".to_string())
        }
        _ => render(row, detail),
    }
}

/// Prints a progress line on stderr, its mark coloured on a terminal.
fn print_progress(line: &str) {
    for l in line.lines() {
        let l = l.strip_prefix("keel: ").unwrap_or(l);
        eprintln!("keel: {}", super::style::mark(l));
    }
}

/// Progress lines on stderr for a session while this process runs its turns: a follower of
/// the session's events from the moment it starts.
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
        let detail = Detail::from_flags();
        let task = tokio::spawn(async move {
            let Some(mut rx) = rx else { return };
            while let Some(Ok(row)) = rx.recv().await {
                if let Some(line) = brief(&row, detail) {
                    print_progress(&line);
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
                if let Some(line) = brief(&row, Detail::from_flags()) {
                    print_progress(&line);
                }
                last = row.seq;
            }
        }
    }
}

/// A line for every event, the ones progress leaves out included (`keel session events`).
pub fn line(row: &EventRow) -> String {
    render(row, Detail::Verbose).unwrap_or_else(|| match &row.event {
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

/// `keel session events ID [--after N] [--follow] [--json]`. Following, the text a model is
/// writing shows as it arrives (`▸ …`; with `--json`, `text_delta` objects without a sequence
/// number), in whichever process runs the turn; the durable `answer` or message follows it.
/// Bytes of each stream `keel session calls --logs` and `session events --logs` print of a call (`--json` gives all that
/// was kept).
const LOGS_SHOWN: usize = 2048;

/// What a call's tool wrote (its kept logs, as stored), indented under the call's line: the
/// log records, then stderr and stdout (each cut at [`LOGS_SHOWN`] bytes), then what was not
/// kept.
pub fn print_logs(l: &serde_json::Value) {
    for r in l["logs"].as_array().into_iter().flatten() {
        let level = r["level"].as_str().unwrap_or("?");
        let line = format!("    log [{level}] │ ");
        println!("{}", super::prefixed(&line, &inert_block(r["message"].as_str().unwrap_or(""))));
    }
    for stream in ["stderr", "stdout"] {
        let text = l[stream].as_str().unwrap_or("");
        if !text.is_empty() {
            let mut end = text.len().min(LOGS_SHOWN);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            let line = format!("    {stream} │ ");
            println!("{}", super::prefixed(&line, inert_block(&text[..end]).trim_end()));
            if end < text.len() {
                println!("    ({} more bytes shown by --json)", text.len() - end);
            }
        }
    }
    if let Some(cut) = l.get("cut") {
        println!(
            "    ({} more bytes and {} log records were not kept)",
            cut["bytes"], cut["log_records"]
        );
    }
}

/// The kept logs of a session's calls, by call id, read from its timeline when a finished
/// call's event needs them (`session events --logs`).
struct KeptLogs<'a> {
    h: &'a Harness,
    id: &'a str,
    by_call: std::collections::HashMap<String, serde_json::Value>,
}

impl KeptLogs<'_> {
    /// The logs of `call_id` if its event is a finished call and it kept any.
    async fn of(&mut self, row: &EventRow) -> Option<(String, serde_json::Value)> {
        let SessionEvent::ToolCall { call_id, status, .. } = &row.event else { return None };
        if *status != JournalStatus::Done {
            return None;
        }
        let call = call_id.to_string();
        if !self.by_call.contains_key(&call) {
            let t = self.h.timeline(&Caller::Operator, self.id).await.ok()?;
            for c in &t.tool_calls {
                let kept = c.entry.logs.as_deref().and_then(|l| serde_json::from_str(l).ok());
                self.by_call.insert(c.entry.call_id.to_string(), kept.unwrap_or_default());
            }
        }
        let logs = self.by_call.get(&call).filter(|l| !l.is_null())?;
        Some((call, logs.clone()))
    }
}

pub async fn execute(
    h: &Harness,
    id: &str,
    after: i64,
    follow: bool,
    json: bool,
    logs: bool,
) -> ExitCode {
    use std::io::Write;
    let mut kept = KeptLogs { h, id, by_call: Default::default() };
    let print_logs = |call: String, l: serde_json::Value| {
        if json {
            println!("{}", serde_json::json!({"kind": "tool_logs", "call_id": call, "logs": l}));
        } else {
            print_logs(&l);
        }
    };
    // Whether a line of live text is open (the next event starts a new line).
    let mut open = false;
    let print = |row: &EventRow, open: &mut bool| {
        if std::mem::take(open) {
            println!();
        }
        if json {
            match serde_json::to_string(row) {
                Ok(line) => println!("{line}"),
                Err(e) => eprintln!("error: event {} cannot be written: {e}", row.seq),
            }
        } else {
            let line = line(row);
            println!("#{} {} {line}", row.seq, keel::protocol::text::format_time(row.at_ms));
        }
    };
    if !follow {
        let mut last = after;
        loop {
            match h.events(&Caller::Operator, id, last, 1000).await {
                Ok(rows) if rows.is_empty() => return ExitCode::SUCCESS,
                Ok(rows) => {
                    for row in &rows {
                        print(row, &mut open);
                        last = row.seq;
                        if let Some((call, l)) = kept.of(row).await.filter(|_| logs) {
                            print_logs(call, l);
                        }
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
    let mut text = match h.follow_text(&Caller::Operator, id).await {
        Ok(t) => t,
        Err(e) => return super::api_fail(json, &e),
    };
    let mut tick = tokio::time::interval(POLL);
    loop {
        tokio::select! {
            next = rx.recv() => match next {
                Some(Ok(row)) => {
                    print(&row, &mut open);
                    if let Some((call, l)) = kept.of(&row).await.filter(|_| logs) {
                        print_logs(call, l);
                    }
                }
                Some(Err(e)) => return super::fail(json, e.kind(), &e.to_string(), EXIT_REFUSED),
                None => return ExitCode::SUCCESS,
            },
            _ = tick.tick() => {
                let deltas = text.poll();
                if deltas.is_empty() {
                    continue;
                }
                let mut out = std::io::stdout().lock();
                for d in deltas {
                    if json {
                        let mut v = serde_json::json!({"kind": "text_delta", "step": d.step, "text": d.text});
                        if d.restart {
                            v["restart"] = serde_json::json!(true);
                        }
                        let _ = writeln!(out, "{v}");
                    } else if d.restart {
                        // The text so far is void: its call is made again.
                        let _ = write!(
                            out,
                            "{}  ▸ (the reply was cut off; asked again) ",
                            if std::mem::replace(&mut open, true) { "\n" } else { "" }
                        );
                    } else {
                        if !open {
                            let _ = write!(out, "  ▸ ");
                            open = true;
                        }
                        let _ = write!(out, "{}", super::inert_block(&d.text));
                    }
                }
                let _ = out.flush();
            }
            _ = tokio::signal::ctrl_c() => return ExitCode::SUCCESS,
        }
    }
}
