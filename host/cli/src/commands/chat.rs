//! `keel chat`: a session kept open in the terminal. Each line is an input of the session; the
//! answer streams as it is written, with the tool calls between; a call that needs approval is
//! asked about in place — approve it once or for good (a policy change, recorded), reject it
//! with a reason, see its diff or its exact input — deciding the same durable approval unit `keel approve` or the console would. Ctrl-C
//! interrupts a turn and keeps the session; Ctrl-D leaves it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::Args;
use keel::api::{Caller, RewindOptions};
use keel::protocol::sessions::CancelToken;
use keel::protocol::sessions::Submitted;
use keel::protocol::sessions::{ApprovalStatus, Decision};
use keel::protocol::sessions::{Event, Events, TurnOutcome};
use keel::protocol::setup::Harness;
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

use super::run::{SessionArgs, session_in, sessions_of, user_of};
use super::style::{Tone, paint};
use super::{inert, inert_block};

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    session: SessionArgs,
    /// Pick the session to continue from this user's recent ones (time, state, turns, goal).
    #[arg(long, conflicts_with_all = ["session", "new_session", "continue_last"])]
    resume: bool,
    /// Exchanges of a continued session shown when the chat opens: the inputs, the tool
    /// calls and the answers (0: none).
    #[arg(long, value_name = "N", default_value_t = 3)]
    replay: usize,
}

/// Steps `/rewind` lists, at most.
const REWIND_LISTED: usize = 10;

/// Sessions the picker of `--resume` offers, at most.
const PICKER_SESSIONS: usize = 10;

/// The slash commands, with what each does (`/help`).
const COMMANDS: &[(&str, &str)] = &[
    ("/help", "this list"),
    ("/tools", "the tools the session has loaded"),
    ("/grants", "the directories and network destinations the session may reach"),
    ("/approvals", "the calls of this session waiting for a decision, decided in place"),
    ("/compact", "summarize the session's history now, to free its context"),
    (
        "/context",
        "how full the context is, and what takes the room: keel's instructions, tool schemas, summary, kept messages, step (also /room)",
    ),
    ("/events [N]", "the session's last N events (default 20)"),
    ("/session", "the session's id, state, model, policy and budget"),
    ("/model [NAME|URL]", "the session's model; with a name or a server URL, move it there"),
    (
        "/rewind [STEP]",
        "the last steps; with a step, put the files and the conversation back to after it (asks first)",
    ),
    ("/quit", "leave (as Ctrl-D); the session stays"),
    (
        "@/PATH",
        "in a message: attach that file's text (through the session's grants, 64 KiB at most)",
    ),
];

/// Lines of history kept in the keel home.
const HISTORY_LINES: usize = 1000;

/// `keel chat`.
pub async fn execute(home: PathBuf, a: ChatArgs) -> ExitCode {
    let mut a = a;
    let (home_dir, h) = match super::turn::open_harness(&home).await {
        Ok(x) => x,
        Err(e) => return super::fail(false, "setup", &e, super::EXIT_SETUP),
    };
    // Only inputs and commands go into the history, never the answers to a question (an
    // approval's, a reason, the picker's).
    let config = rustyline::Config::builder()
        .auto_add_history(false)
        .max_history_size(HISTORY_LINES)
        .and_then(|b| b.history_ignore_dups(true))
        .map(|b| b.build());
    let editor = config.and_then(DefaultEditor::with_config);
    let mut editor = match editor {
        Ok(e) => e,
        Err(e) => {
            return super::fail(
                false,
                "terminal",
                &format!("the line editor cannot start: {e}"),
                super::EXIT_SETUP,
            );
        }
    };
    let history = home.join("chat-history");
    // A missing history file is a first chat, not an error.
    let _ = editor.load_history(&history);
    if a.resume {
        match pick(&h, &user_of(&a.session), &mut editor).await {
            Ok(Some(id)) => a.session.session = Some(id),
            Ok(None) => return ExitCode::SUCCESS,
            Err(code) => return code,
        }
    }
    let opened = match session_in(&h, &home_dir, &a.session, false).await {
        Ok(o) => o,
        Err(code) => return code,
    };
    let id = opened.id;
    if opened.continued && a.replay > 0 {
        replay(&h, &id, a.replay).await;
    }
    eprintln!(
        "keel: chat in session {id} — type a task; /help lists commands; Ctrl-C interrupts a turn, Ctrl-D leaves"
    );
    // On a shared store, a chat also takes over the sessions of a host that stopped, as a
    // server does, for as long as it is open.
    let _running = h.keep_sessions_running(&keel::api::Caller::Operator);
    let mut chat = Chat { h, id, editor };
    loop {
        match chat.read_line("› ") {
            Ok(line) if line.trim().is_empty() => {}
            Ok(line) if line.trim_start().starts_with('/') => {
                let _ = chat.editor.add_history_entry(line.as_str());
                if !chat.command(line.trim()).await {
                    break;
                }
            }
            Ok(line) => {
                let _ = chat.editor.add_history_entry(line.as_str());
                chat.turn(&line).await
            }
            Err(ReadlineError::Interrupted) => {
                eprintln!("keel: (nothing is running; Ctrl-D leaves, the session stays)");
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => {
                eprintln!("{} the terminal cannot be read: {e}", paint(Tone::Bad, "error:"));
                break;
            }
        }
    }
    if let Err(e) = chat.editor.save_history(&history) {
        eprintln!("keel: warning: the chat history was not saved to {}: {e}", history.display());
    }
    eprintln!("keel: left session {}; go on with `keel chat --session {}`", chat.id, chat.id);
    ExitCode::SUCCESS
}

/// `--resume`: this user's recent sessions, numbered, and the one picked (`None`: none was).
async fn pick(
    h: &Harness,
    user: &str,
    editor: &mut DefaultEditor,
) -> Result<Option<String>, ExitCode> {
    let list = match sessions_of(h, user).await {
        Ok(l) => l,
        Err(e) => return Err(super::api_fail(false, &e)),
    };
    if list.is_empty() {
        return Err(super::fail(
            false,
            "not_found",
            &format!(
                "no session of user `{user}` in this home to resume: start one with `keel chat`"
            ),
            super::EXIT_REFUSED,
        ));
    }
    let now = super::now_ms();
    eprintln!("keel: recent sessions of {user}:");
    let shown: Vec<_> = list.into_iter().take(PICKER_SESSIONS).collect();
    let width = shown.iter().map(|s| s.id.chars().count()).max().unwrap_or(0);
    for (n, s) in shown.iter().enumerate() {
        let goal = super::session::session_title(s);
        eprintln!(
            "  {:>2}  {:<width$}  {:>12}  {:<16} {:>4} turn{}  {}",
            n + 1,
            inert(&s.id),
            super::ago(now - s.last_activity),
            s.state,
            s.turns,
            if s.turns == 1 { " " } else { "s" },
            goal
        );
    }
    loop {
        let prompt = format!("resume which? [1-{}; Enter: 1; q: none] › ", shown.len());
        let answer = match tokio::task::block_in_place(|| editor.readline(&prompt)) {
            Ok(a) => a.trim().to_string(),
            Err(ReadlineError::Interrupted | ReadlineError::Eof) => return Ok(None),
            Err(e) => {
                return Err(super::fail(
                    false,
                    "terminal",
                    &format!("the terminal cannot be read: {e}"),
                    super::EXIT_SETUP,
                ));
            }
        };
        if answer == "q" {
            return Ok(None);
        }
        let n = if answer.is_empty() { Some(1) } else { answer.parse::<usize>().ok() };
        match n.and_then(|n| n.checked_sub(1)).and_then(|i| shown.get(i)) {
            Some(s) => return Ok(Some(s.id.clone())),
            None => eprintln!("keel: answer a number from 1 to {}, Enter or q", shown.len()),
        }
    }
}

/// The last `n` exchanges of session `id` — each input, the tool calls it led to and the
/// answers — as the chat showed them.
async fn replay(h: &Harness, id: &str, n: usize) {
    let timeline = match h.timeline(&Caller::Operator, id).await {
        Ok(t) => t,
        Err(e) => {
            eprintln!("keel: the session's history cannot be shown: {}", inert(&e.to_string()));
            return;
        }
    };
    let inputs: Vec<usize> = timeline
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == "user")
        .map(|(i, _)| i)
        .collect();
    let Some(&from) = inputs.len().checked_sub(n).map_or(inputs.first(), |i| inputs.get(i)) else {
        return;
    };
    let shown = inputs.len().min(n);
    eprintln!(
        "keel: the last {} of session {} ({} in all):",
        if shown == 1 { "exchange".to_string() } else { format!("{shown} exchanges") },
        id,
        inputs.len()
    );
    for m in &timeline.messages[from..] {
        match m.role.as_str() {
            "user" => eprintln!("{} {}", paint(Tone::Strong, "›"), inert(&m.text)),
            "assistant" => {
                for c in &m.calls {
                    eprintln!("  · {}", inert(&c.tool));
                }
                if !m.text.trim().is_empty() {
                    println!("{}", inert_block(m.text.trim_end()));
                }
            }
            _ => {}
        }
    }
    eprintln!("keel: (end of the replay)");
}

/// What a turn streamed to the terminal: the text of the reply being written, so an answer
/// already shown is not printed twice.
#[derive(Default)]
struct Streamed {
    /// The text of the current reply so far.
    reply: String,
    /// The text of the last complete reply.
    last: String,
}

struct Chat {
    h: Harness,
    id: String,
    editor: DefaultEditor,
}

impl Chat {
    /// A line from the terminal (the runtime's other tasks keep running meanwhile).
    fn read_line(&mut self, prompt: &str) -> Result<String, ReadlineError> {
        tokio::task::block_in_place(|| self.editor.readline(prompt))
    }

    /// Runs `text` as the session's next input, then asks about what waits for approval, until
    /// the turn ends.
    async fn turn(&mut self, text: &str) {
        let Some(text) = self.with_attachments(text).await else { return };
        let text = text.as_str();
        let streamed = Arc::new(Mutex::new(Streamed::default()));
        let events = stream_to_stdout(streamed.clone());
        let submitted = self.run(|h, id, cancel| {
            let text = text.to_string();
            let events = events.clone();
            async move { h.send(&Caller::Operator, &id, &text, &cancel, &events).await.map(Some) }
        });
        let outcome = submitted.await;
        self.settle(outcome, &streamed, &events).await;
    }

    /// `text` with the content of each file it names as `@/guest/path` attached after it,
    /// read through the session's grants; `None` (and why, on stderr) when one cannot be.
    async fn with_attachments(&self, text: &str) -> Option<String> {
        let mut out = text.to_string();
        let mut seen = Vec::new();
        for word in text.split_whitespace() {
            let Some(path) = word.strip_prefix('@').filter(|p| p.starts_with('/')) else {
                continue;
            };
            // A sentence's punctuation is not part of the path.
            let path = path.trim_end_matches([',', '.', ';', ':', '!', '?', ')', '"', '\'']);
            if seen.contains(&path) {
                continue;
            }
            seen.push(path);
            match self.h.read_granted(&Caller::Operator, &self.id, path).await {
                Ok(f) => {
                    eprintln!("keel: attached {} ({} bytes)", inert(&f.path), f.bytes);
                    out.push_str(&format!(
                        "\n\n<file path=\"{}\" bytes=\"{}\">\n{}\n</file>",
                        f.path,
                        f.bytes,
                        f.text.replace("</file>", "</file\u{200b}>")
                    ));
                }
                Err(e) => {
                    eprintln!(
                        "{} {} (nothing was sent)",
                        paint(Tone::Bad, "error:"),
                        inert(&e.to_string())
                    );
                    return None;
                }
            }
        }
        Some(out)
    }

    /// Asks about what a drive left waiting for approval and resumes the turn, until it ends;
    /// then says how it ended, and what it cost.
    async fn settle(
        &mut self,
        mut outcome: Result<Option<Submitted>, keel::api::ApiError>,
        streamed: &Arc<Mutex<Streamed>>,
        events: &Events,
    ) {
        while let Ok(Some(Submitted::Ran(TurnOutcome::WaitingApproval(units)))) = &outcome {
            let units = units.clone();
            if !self.decide_all(&units).await {
                eprintln!(
                    "keel: the turn waits; decide with /approvals, `keel approve UNIT` or the console"
                );
                return;
            }
            let events = events.clone();
            outcome = self
                .run(move |h, id, cancel| async move {
                    h.resume(&Caller::Operator, &id, &cancel, &events).await
                })
                .await;
        }
        let last = streamed.lock().map(|s| s.last.clone()).unwrap_or_default();
        match outcome {
            Ok(Some(Submitted::Ran(TurnOutcome::Answer(a)))) => {
                if a.trim() != last.trim() {
                    println!("{}", inert_block(&a));
                }
            }
            Ok(Some(Submitted::Ran(TurnOutcome::Stopped(note)))) => {
                eprintln!("keel: the turn stopped: {}", inert_block(&note));
            }
            Ok(Some(Submitted::Ran(TurnOutcome::Interrupted))) => {
                eprintln!("keel: interrupted; the session stays — type to go on");
            }
            Ok(Some(Submitted::Ran(TurnOutcome::Failed(e)))) => {
                eprintln!("{} {}", paint(Tone::Bad, "error:"), inert_block(&e));
            }
            Ok(Some(Submitted::Ran(TurnOutcome::WaitingApproval(_)))) => {}
            Ok(Some(Submitted::Queued { inbox_seq })) => eprintln!(
                "keel: another keel process runs this session; your input is queued (#{inbox_seq})"
            ),
            Ok(None) => {
                eprintln!("keel: another keel process holds this session; it resumes the turn")
            }
            Err(e) => eprintln!("{} {}", paint(Tone::Bad, "error:"), inert_block(&e.to_string())),
        }
        self.summary().await;
    }

    /// Runs one drive of the session (`send` or `resume`) with its progress on stderr, Ctrl-C
    /// interrupting it.
    async fn run<F, Fut>(&self, drive: F) -> Result<Option<Submitted>, keel::api::ApiError>
    where
        F: FnOnce(Harness, String, CancelToken) -> Fut,
        Fut: std::future::Future<Output = Result<Option<Submitted>, keel::api::ApiError>>,
    {
        let cancel = CancelToken::new();
        let interrupt = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                // One line says it, when the turn has stopped (`settle`); this only ends a
                // streamed line.
                if tokio::signal::ctrl_c().await.is_ok() {
                    eprintln!();
                    cancel.cancel();
                }
            })
        };
        let progress = super::events::Progress::start(&self.h, &self.id).await;
        let out = drive(self.h.clone(), self.id.clone(), cancel).await;
        progress.finish().await;
        interrupt.abort();
        out
    }

    /// `/rewind`: the last steps, to pick one; `/rewind STEP`: what going back there would do
    /// (files and conversation), and, once confirmed, the rewind.
    async fn rewind(&mut self, arg: Option<&str>) {
        let fail = |e: &dyn std::fmt::Display| {
            eprintln!("{} {}", paint(Tone::Bad, "error:"), inert(&e.to_string()));
        };
        let Some(step) = arg else {
            let t = match self.h.timeline(&Caller::Operator, &self.id).await {
                Ok(t) => t,
                Err(e) => return fail(&e),
            };
            for m in t.model_calls.iter().rev().take(REWIND_LISTED).rev() {
                let tools: Vec<&str> = t
                    .tool_calls
                    .iter()
                    .filter(|c| c.step == m.step)
                    .map(|c| c.entry.tool.as_str())
                    .collect();
                let what = if tools.is_empty() { "answer".to_string() } else { tools.join(", ") };
                let turn = m.turn.map(|t| t.to_string()).unwrap_or_else(|| "-".into());
                eprintln!("  step {:<4} turn {turn:<4} {}", m.step, inert(&what));
            }
            eprintln!("  /rewind STEP goes back to after that step (0: the start)");
            return;
        };
        let Ok(to) = step.parse::<i64>() else {
            return fail(&format!("`{}` is not a step number; /rewind lists them", inert(step)));
        };
        let opts = |dry_run| RewindOptions { dry_run, conversation: true, ..Default::default() };
        let plan = match self.h.rewind(&Caller::Operator, &self.id, to, opts(true)).await {
            Ok(r) => r,
            Err(e) => return fail(&e),
        };
        super::session::print_rewind(&plan);
        let answer = self.read_line(&format!("go back to step {to}? [y/N] › "));
        if !matches!(answer.as_deref().map(str::trim), Ok("y" | "yes")) {
            eprintln!("keel: nothing was changed");
            return;
        }
        match self.h.rewind(&Caller::Operator, &self.id, to, opts(false)).await {
            Ok(r) => super::session::print_rewind(&r),
            Err(e) => fail(&e),
        }
    }

    /// Asks about each waiting unit in turn; `false` when one was left undecided.
    async fn decide_all(&mut self, units: &[keel::protocol::ids::UnitId]) -> bool {
        for unit in units {
            let Ok(u) = self.h.approval(&Caller::Operator, unit).await else {
                continue;
            };
            if u.status != ApprovalStatus::Pending {
                // Decided elsewhere meanwhile (another terminal, the console).
                eprintln!("keel: approval {unit}: {}", u.verdict());
                continue;
            }
            if !self.ask(&u).await {
                return false;
            }
        }
        true
    }

    /// Shows unit `u` and asks until it is decided (`true`) or skipped (`false`).
    async fn ask(&mut self, u: &keel::protocol::sessions::ApprovalUnit) -> bool {
        let mut full = false;
        // "Always": the tool under the call's directory, or everywhere for a call naming no
        // path.
        let under = keel::protocol::sessions::call_directory(&u.input);
        let always = match &under {
            Some(dir) => format!("{} under {dir}", u.tool),
            None => u.tool.clone(),
        };
        loop {
            for line in super::approval::unit_lines(u, full) {
                eprintln!("{line}");
            }
            let prompt = format!(
                "{} approve once [y] · always allow {} [a] · reject [n] · full diff and input [d] · leave it [s] › ",
                paint(Tone::Waiting, "⏸"),
                inert(&always)
            );
            let answer = match self.read_line(&prompt) {
                Ok(a) => a.trim().to_lowercase(),
                Err(ReadlineError::Interrupted | ReadlineError::Eof) => return false,
                Err(_) => return false,
            };
            let (decision, reason) = match answer.as_str() {
                "y" | "yes" => (Decision::Approve, None),
                "a" | "always" => {
                    let change = keel::protocol::sessions::PolicyChange::Allow {
                        tool: u.tool.clone(),
                        under: under.clone(),
                    };
                    match self.h.change_policy(&Caller::Operator, &self.id, change).await {
                        Ok(policy) => eprintln!(
                            "keel: policy: {} (undo: keel session policy {} --ask {})",
                            inert(&policy.summary()),
                            self.id,
                            inert(&u.tool)
                        ),
                        Err(e) => {
                            eprintln!("{} {}", paint(Tone::Bad, "error:"), inert(&e.to_string()));
                            continue;
                        }
                    }
                    (Decision::Approve, None)
                }
                "n" | "no" => {
                    let reason =
                        match self.read_line("reason (the model is told; Enter for none) › ") {
                            Ok(r) => Some(r.trim().to_string()).filter(|r| !r.is_empty()),
                            Err(_) => return false,
                        };
                    (Decision::Reject, reason)
                }
                "d" | "i" | "diff" | "input" => {
                    full = true;
                    continue;
                }
                "s" | "skip" => return false,
                _ => {
                    eprintln!("keel: answer y, a, n, d or s");
                    continue;
                }
            };
            return match self
                .h
                .decide(&Caller::Operator, &u.id, decision, reason, Some(self.id.clone()))
                .await
            {
                Ok(d) => {
                    eprintln!("keel: approval {}: {}", d.id, d.verdict());
                    true
                }
                Err(e) => {
                    // Decided elsewhere first: the durable unit says how.
                    eprintln!("keel: {}", inert(&e.to_string()));
                    true
                }
            };
        }
    }

    /// One line after a turn: the session's state and what the turn cost.
    async fn summary(&self) {
        let meta = self.h.session(&Caller::Operator, &self.id).await;
        let state = meta.as_ref().map(|m| m.runtime.state.to_string()).unwrap_or_default();
        let turn = meta.map(|m| m.runtime.turns).unwrap_or(0);
        let tokens = self.h.turn_usage(&Caller::Operator, &self.id, turn).await.unwrap_or_default();
        // How full the context is, where the window is known; past half full, where its room
        // goes.
        let room = self.h.room(&Caller::Operator, &self.id).await.ok();
        let full = room
            .as_ref()
            .and_then(|r| r.used().map(|u| format!(" · context {:.0}% full (/context)", u * 100.0)))
            .unwrap_or_default();
        eprintln!("keel: {state}{}{full}", super::turn::this_turn(&tokens));
        if let Some(room) = room
            && room.used().is_some_and(|u| u > ROOM_SHOWN_PAST)
        {
            eprintln!("keel: {} (/context)", room.describe());
        }
    }

    /// Runs slash command `line`; `false` to leave.
    async fn command(&mut self, line: &str) -> bool {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap_or_default();
        let arg = words.next();
        let meta = match self.h.session(&Caller::Operator, &self.id).await {
            Ok(m) => m,
            Err(e) => {
                eprintln!("{} {}", paint(Tone::Bad, "error:"), inert(&e.to_string()));
                return true;
            }
        };
        match name {
            "/quit" | "/exit" | "/q" => return false,
            "/help" | "/?" => {
                for (c, what) in COMMANDS {
                    eprintln!("  {c:<12} {what}");
                }
                eprintln!("  anything else is the session's next input");
            }
            "/tools" => {
                let tools = &meta.capabilities.loaded_tools;
                if tools.is_empty() {
                    eprintln!("keel: no tools loaded");
                }
                for t in tools {
                    eprintln!("  {}", inert(t));
                }
            }
            "/grants" => {
                if meta.config.grants.is_empty() {
                    eprintln!("  no directories");
                }
                for g in &meta.config.grants {
                    eprintln!("  {g}");
                }
                for n in meta.config.net.lines() {
                    eprintln!("  {}", inert(&n));
                }
            }
            "/approvals" => {
                let units = self
                    .h
                    .approvals(&Caller::Operator, Some(&self.id), true)
                    .await
                    .unwrap_or_default();
                if units.is_empty() {
                    eprintln!("keel: nothing waits for a decision");
                    return true;
                }
                let ids: Vec<keel::protocol::ids::UnitId> =
                    units.into_iter().map(|v| v.unit.id).collect();
                if self.decide_all(&ids).await {
                    let streamed = Arc::new(Mutex::new(Streamed::default()));
                    let events = stream_to_stdout(streamed.clone());
                    let resume = events.clone();
                    let out = self
                        .run(move |h, id, cancel| async move {
                            h.resume(&Caller::Operator, &id, &cancel, &resume).await
                        })
                        .await;
                    self.settle(out, &streamed, &events).await;
                }
            }
            "/compact" => {
                let cancel = CancelToken::new();
                let progress = super::events::Progress::start(&self.h, &self.id).await;
                let r = self
                    .h
                    .compact(&Caller::Operator, &self.id, &cancel, &super::turn::quiet())
                    .await;
                progress.finish().await;
                match r {
                    Ok(keel::protocol::sessions::Compaction::Nothing) => {
                        eprintln!("keel: nothing to compact yet");
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("{} {}", paint(Tone::Bad, "error:"), inert(&e.to_string())),
                }
            }
            "/context" | "/room" => match self.h.room(&Caller::Operator, &self.id).await {
                Ok(room) => eprintln!("  {}", room.describe()),
                Err(e) => eprintln!("{} {}", paint(Tone::Bad, "error:"), inert(&e.to_string())),
            },
            "/events" => {
                let n: i64 = arg.and_then(|a| a.parse().ok()).unwrap_or(20).clamp(1, 1000);
                let last = self.h.last_event(&Caller::Operator, &self.id).await.unwrap_or(0);
                let rows = self
                    .h
                    .events(&Caller::Operator, &self.id, (last - n).max(0), n as usize)
                    .await
                    .unwrap_or_default();
                for row in rows {
                    eprintln!(
                        "#{} {} {}",
                        row.seq,
                        keel::protocol::text::format_time(row.at_ms),
                        super::events::line(&row)
                    );
                }
            }
            "/model" => {
                use keel::protocol::sessions::{ModelChange, ModelShown};
                let Some(to) = arg else {
                    let now = ModelShown::of(&meta.config.model);
                    eprintln!("  model    {}", super::describe_model(&now));
                    return true;
                };
                let change = if to.starts_with("http://") || to.starts_with("https://") {
                    ModelChange { base_url: Some(to.to_string()), ..ModelChange::default() }
                } else {
                    ModelChange { model: Some(to.to_string()), ..ModelChange::default() }
                };
                match self.h.set_session_model(&Caller::Operator, &self.id, change).await {
                    Ok((from, to)) if from == to => {
                        eprintln!("keel: the session already uses {}", super::describe_model(&to));
                    }
                    Ok((from, to)) => eprintln!(
                        "keel: model {} → {}",
                        super::describe_model(&from),
                        super::describe_model(&to)
                    ),
                    Err(e) => eprintln!("{} {}", paint(Tone::Bad, "error:"), inert(&e.to_string())),
                }
            }
            "/rewind" => self.rewind(arg).await,
            "/session" => {
                eprintln!("  session  {} ({})", self.id, meta.runtime.state);
                eprintln!("  model    {}", inert(&meta.config.model.summary(true)));
                eprintln!("  policy   {}", inert(&meta.config.policy.summary()));
                eprintln!("  budget   {}", inert(&meta.config.budget.summary()));
            }
            other => {
                let names = COMMANDS.iter().map(|(c, _)| c.split(' ').next().unwrap_or(c));
                let hint = keel::protocol::text::did_you_mean(&keel::protocol::text::closest(
                    other, names,
                ));
                eprintln!("keel: no command {}{hint}; /help lists them", inert(other));
            }
        }
        true
    }
}

/// The share of the context window past which the line after a turn says where the next
/// request's room goes.
const ROOM_SHOWN_PAST: f64 = 0.5;

/// Events that write the model's text to stdout as it arrives (the chat's answer), keeping
/// what was shown in `streamed`.
fn stream_to_stdout(streamed: Arc<Mutex<Streamed>>) -> Events {
    Arc::new(move |e: &Event| {
        use std::io::Write;
        match e {
            Event::TextDelta { text, .. } => {
                let mut out = std::io::stdout().lock();
                let _ = write!(out, "{}", inert_block(text));
                let _ = out.flush();
                if let Ok(mut s) = streamed.lock() {
                    s.reply.push_str(text);
                }
            }
            Event::TextRestarted { .. } => {
                if let Ok(mut s) = streamed.lock()
                    && !std::mem::take(&mut s.reply).is_empty()
                {
                    println!();
                }
                eprintln!("keel: (the reply was cut off; the model is asked again)");
            }
            Event::ModelReplied { .. } | Event::State(_) => {
                if let Ok(mut s) = streamed.lock()
                    && !s.reply.is_empty()
                {
                    println!();
                    s.last = std::mem::take(&mut s.reply);
                }
            }
            _ => {}
        }
    })
}
