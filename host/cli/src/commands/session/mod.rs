//! `keel session …`: list, show, send, interrupt, evidence.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use keel::api::Caller;
use keel::protocol::sessions::CancelToken;
use serde_json::json;

mod set;
mod show;
mod tidy;
mod undo;

pub use tidy::title as session_title;
pub use undo::print as print_rewind;

use super::turn::{cancel_on_ctrl_c, open_harness, quiet, report, streaming};
use super::{EXIT_REFUSED, EXIT_SETUP, inert, inert_block};
use show::{
    print_capabilities, print_checkpoint, print_model_calls, print_plan, print_settings,
    print_transitions,
};

#[derive(Subcommand)]
pub enum SessionCommand {
    /// List sessions, the most recently active first: when each was last active, its state,
    /// turns and title (its goal).
    List(tidy::ListArgs),
    /// Give a session a title, shown by `session list` and `chat --resume` instead of its goal.
    Title(tidy::TitleArgs),
    /// Delete a session and every fact of it, in one transaction (refused while a turn runs,
    /// and for a session of a workgroup). A user's long-term memories stay.
    Delete(tidy::DeleteArgs),
    /// Delete the sessions not active for a while (by default those idle, failed or
    /// interrupted); --dry-run lists them.
    Prune(tidy::PruneArgs),
    /// Show a session's timeline: messages, tool calls (inputs, outputs, change sets), state.
    Show(IdArgs),
    /// List a session's tool calls: step, tool, effect, outcome, time; with --logs, what each
    /// tool wrote to its log, stderr and stdout (kept with the call, bounded and redacted;
    /// never sent to the model).
    Calls(show::CallsArgs),
    /// Send a message to a session and run it (or queue it if another process is running it).
    Send(SendArgs),
    /// Interrupt a session's running turn (from any process).
    Interrupt(IdArgs),
    /// Print the exact request body of a model call, byte for byte.
    Evidence(EvidenceArgs),
    /// Print a session's events — inputs, turns, states, model calls with their tokens, tool
    /// calls, approvals, answers — from any process; with --follow, keep printing new ones.
    Events(EventsArgs),
    /// Move the session's tools to the versions installed now. A session keeps running the
    /// component versions it loaded after `keel tool install --upgrade`, until this.
    UpgradeTools(IdArgs),
    /// Compact a session's context now: summarize its history (as much as a legal boundary
    /// allows) into a checkpoint that later requests hold instead. Nothing is deleted:
    /// `session show` marks the checkpoint, `session evidence --compaction` prints the summary
    /// request. A running session is refused (it compacts itself when its requests near the
    /// context window, --context-window); inputs that arrive meanwhile run afterwards.
    Compact(IdArgs),
    /// Move a session to another model server, model or context window: its next request
    /// goes there, and a `model_changed` event records the change (refused while a turn
    /// runs). The settings it was created with are otherwise kept.
    Set(set::SetArgs),
    /// Show a session's policy, or change it for the rest of the session: --allow a tool for
    /// good (everywhere, or TOOL=PREFIX for calls under a guest path), --ask before it again
    /// (the undo), --deny it. Each change is a `policy_changed` event with who made it.
    Policy(set::PolicyArgs),
    /// Put back what the session's calls after a step changed inside its grants: each file as
    /// it was (from the pre-image kept when a tool changed it), what they made removed. A path
    /// changed since the session's last call is a conflict, left alone unless forced;
    /// --dry-run shows the diffs. Effects outside the grants are listed as not undone.
    Rewind(undo::RewindArgs),
    /// Run again the recorded read-only, idempotent calls after a step, with the tools
    /// installed now, against a scratch copy of the session's grants, and say which outputs
    /// changed (a regression check of a new tool version). Other calls are never run.
    Replay(undo::ReplayArgs),
    /// Make a new session whose history is this one's up to a step — the same settings,
    /// grants (--read-only, --drop-grant narrow them), goals and plan — to try another model
    /// (--model), instruction or tool version from the same point. The original is untouched;
    /// the fork's origin is recorded and shown.
    Fork(undo::ForkArgs),
    /// Unload a tool or skill from a session — the only way a capability leaves one (the
    /// Orchestrator, skills_load and tools_select only add). The control and discovery tools
    /// stay.
    Unload(UnloadArgs),
}

#[derive(Args)]
#[group(required = true, multiple = false)]
pub struct UnloadWhat {
    /// The tool to unload.
    #[arg(long, value_name = "NAME")]
    tool: Option<String>,
    /// The skill to unload.
    #[arg(long, value_name = "NAME")]
    skill: Option<String>,
}

#[derive(Args)]
pub struct UnloadArgs {
    /// Session id.
    id: String,
    #[command(flatten)]
    what: UnloadWhat,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct JsonFlag {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct IdArgs {
    /// Session id.
    id: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct SendArgs {
    /// Session id.
    id: String,
    /// The message.
    message: String,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct EventsArgs {
    /// Session id.
    id: String,
    /// Only events after this sequence number.
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    after: i64,
    /// Keep printing events as they are committed (by this or any other process) until
    /// interrupted.
    #[arg(long)]
    follow: bool,
    /// Under each finished tool call, what its tool wrote to its log, stderr and stdout (kept
    /// with the call, bounded and redacted; never sent to the model). With --json, a
    /// `{"kind": "tool_logs", "call_id", "logs"}` line after the call's event.
    #[arg(long)]
    logs: bool,
    /// One JSON object per line: {seq, at_ms, kind, …}.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct EvidenceArgs {
    /// Session id.
    id: String,
    /// Step (model call) number; default: the last.
    #[arg(long, conflicts_with_all = ["refused", "understanding", "orchestration", "compaction"])]
    step: Option<i64>,
    /// The summary call of a compaction instead, by checkpoint number; without a number, the
    /// last one.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "0",
          conflicts_with_all = ["refused", "understanding", "orchestration"])]
    compaction: Option<i64>,
    /// The task-understanding call of a turn instead, by turn number; without a number, the
    /// last one.
    #[arg(long, value_name = "TURN", num_args = 0..=1, default_missing_value = "0",
          conflicts_with_all = ["refused", "orchestration"])]
    understanding: Option<i64>,
    /// The Orchestrator's call of a turn instead, by turn number; without a number, the last
    /// one.
    #[arg(long, value_name = "TURN", num_args = 0..=1, default_missing_value = "0",
          conflicts_with = "refused")]
    orchestration: Option<i64>,
    /// A request the server refused (or that failed) instead, by its number in `keel session
    /// show`; without a number, the last one.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "0")]
    refused: Option<i64>,
    /// With --compaction: the summary call's last answer as the model wrote it (redacted),
    /// instead of its request — a refused answer too, to see why it was refused.
    #[arg(long, requires = "compaction")]
    reply: bool,
}

/// Characters of a direct call's result `session show` prints (`--json` has all of it).
const DIRECT_RESULT_SHOWN: usize = 300;

fn fail(json_out: bool, message: &str, code: u8) -> ExitCode {
    super::fail(json_out, "setup", message, code)
}

pub async fn execute(home: PathBuf, cmd: SessionCommand) -> ExitCode {
    let json_out = match &cmd {
        SessionCommand::List(a) => a.json,
        SessionCommand::Delete(a) => a.json,
        SessionCommand::Title(a) => a.json,
        SessionCommand::Prune(a) => a.json,
        SessionCommand::Show(a)
        | SessionCommand::Interrupt(a)
        | SessionCommand::Compact(a)
        | SessionCommand::UpgradeTools(a) => a.json,
        SessionCommand::Send(a) => a.json,
        SessionCommand::Events(a) => a.json,
        SessionCommand::Unload(a) => a.json,
        SessionCommand::Set(a) => a.json,
        SessionCommand::Policy(a) => a.json,
        SessionCommand::Rewind(a) => a.json,
        SessionCommand::Replay(a) => a.json,
        SessionCommand::Fork(a) => a.json,
        SessionCommand::Calls(a) => a.json,
        SessionCommand::Evidence(_) => false,
    };
    let (_, h) = match open_harness(&home).await {
        Ok(x) => x,
        Err(e) => return fail(json_out, &e, EXIT_SETUP),
    };
    match cmd {
        SessionCommand::UpgradeTools(a) => upgrade_tools(&h, &a).await,
        SessionCommand::Compact(a) => compact(&h, &a).await,
        SessionCommand::Set(a) => set::execute(&h, a).await,
        SessionCommand::Policy(a) => set::policy(&h, a).await,
        SessionCommand::Rewind(a) => undo::rewind(&h, a).await,
        SessionCommand::Replay(a) => undo::replay(&h, a).await,
        SessionCommand::Fork(a) => undo::fork(&h, a).await,
        SessionCommand::Calls(a) => show::calls(&h, a).await,
        SessionCommand::Unload(a) => {
            use keel::protocol::sessions::CapabilityKind as Kind;
            let (kind, name) = match (&a.what.tool, &a.what.skill) {
                (Some(t), _) => (Kind::Tool, t.clone()),
                (None, Some(s)) => (Kind::Skill, s.clone()),
                (None, None) => {
                    return super::fail(a.json, "input", "name --tool or --skill", EXIT_REFUSED);
                }
            };
            match h.unload(&Caller::Operator, &a.id, kind, &name).await {
                Ok(()) if a.json => {
                    println!(
                        "{}",
                        json!({"ok": true, "session_id": a.id, "unloaded": {"kind": kind, "name": name}})
                    );
                    ExitCode::SUCCESS
                }
                Ok(()) => {
                    println!("unloaded {kind} {} from session {}", inert(&name), a.id);
                    ExitCode::SUCCESS
                }
                Err(e) => super::api_fail(a.json, &e),
            }
        }
        SessionCommand::Events(a) => {
            super::events::execute(&h, &a.id, a.after, a.follow, a.json, a.logs).await
        }
        SessionCommand::List(a) => tidy::list(&h, a).await,
        SessionCommand::Delete(a) => tidy::delete(&h, a).await,
        SessionCommand::Title(a) => tidy::title_of(&h, a).await,
        SessionCommand::Prune(a) => tidy::prune(&h, a).await,
        SessionCommand::Show(a) => {
            match h.timeline(&Caller::Operator, &a.id).await {
                Ok(t) if a.json => {
                    println!("{}", json!(t));
                    ExitCode::SUCCESS
                }
                Ok(t) => {
                    println!(
                        "session {}  state {}{}",
                        t.id,
                        t.state,
                        t.state_detail
                            .as_deref()
                            .map(|d| format!(" ({})", inert(d)))
                            .unwrap_or_default()
                    );
                    if let Some(title) = &t.title {
                        println!("title   {}", inert(title));
                    }
                    if let Some(to) = t.unfinished_rewind {
                        println!(
                            "rewind  to step {to} was cut short: `keel session rewind {} --to {to}` finishes it",
                            t.id
                        );
                    }
                    if let Some(o) = &t.forked_from {
                        println!(
                            "fork    of session {} at step {} (by {})",
                            inert(&o.session),
                            o.step,
                            inert(&o.by)
                        );
                    }
                    for r in &t.conversation_rewinds {
                        println!(
                            "rewound the conversation to step {} (by {}): messages {}–{} left the context",
                            r.to,
                            inert(&r.by),
                            r.rewound_from,
                            r.rewound_to
                        );
                    }
                    println!("goal    {}", inert(t.session_goal.as_deref().unwrap_or("-")));
                    println!(
                        "phase   {}",
                        inert(t.phase_goal.as_deref().unwrap_or("- (no phase open)"))
                    );
                    let tools: Vec<String> = t
                        .loaded_tools
                        .iter()
                        .map(|n| match t.tool_pins.get(n) {
                            Some(d) => format!("{n}@{}", &d[..d.len().min(12)]),
                            None => n.clone(),
                        })
                        .collect();
                    println!("tools   {}", tools.join(", "));
                    println!("user    {}", inert(&t.user));
                    print_settings(&t);
                    for g in &t.grants {
                        println!("grant   {g}");
                    }
                    for n in &t.net {
                        println!("grant   {n}");
                    }
                    let mut marks = t.checkpoints.iter().peekable();
                    for m in &t.messages {
                        while let Some(cp) = marks.next_if(|cp| cp.from <= m.seq) {
                            print_checkpoint(cp, t.context_start);
                        }
                        let rewound = t
                            .conversation_rewinds
                            .iter()
                            .any(|r| (r.rewound_from..=r.rewound_to).contains(&m.seq));
                        let summarized = t.checkpoints.iter().any(|cp| {
                            cp.status == keel::protocol::sessions::CheckpointStatus::Promoted
                                && (cp.from..=cp.to).contains(&m.seq)
                        });
                        let compacted = match (rewound, m.seq <= t.context_start, summarized) {
                            (true, _, _) => " (rewound)",
                            (false, true, true) => " (compacted)",
                            (false, true, false) => " (sent again after a rewind)",
                            (false, false, _) => "",
                        };
                        println!("\n#{} turn {} {}{compacted}", m.seq, m.turn, m.role);
                        if !m.text.is_empty() {
                            println!("  {}", inert_block(&m.text));
                        }
                        for c in &m.calls {
                            println!("  → {} {}", inert(&c.tool), inert(&c.input));
                        }
                    }
                    if !t.tool_calls.is_empty() {
                        println!("\ntool calls:");
                        for c in &t.tool_calls {
                            let e = &c.entry;
                            println!(
                                "  step {} {} {} [{}{}] {:.1} ms{}",
                                c.step,
                                inert(&e.tool),
                                inert(&e.input),
                                e.status,
                                e.error_kind.map(|k| format!(", {k}")).unwrap_or_default(),
                                e.duration_ms.unwrap_or(0.0),
                                e.changes
                                    .as_deref()
                                    .map(|ch| format!("\n    changes {}", inert(ch)))
                                    .unwrap_or_default()
                            );
                            // The call's HTTP requests (method, destination, status, bytes, time).
                            let records: Vec<keel::protocol::net::NetRecord> = e
                                .net
                                .as_deref()
                                .and_then(|n| serde_json::from_str(n).ok())
                                .unwrap_or_default();
                            for n in &records {
                                println!("    {}", inert(&super::net_line(n)));
                            }
                            // A direct call (an MCP client's) has no history message holding its
                            // result: show it here.
                            if let Some(r) = e.result.as_deref().filter(|_| {
                                e.call_id.starts_with(keel::protocol::sessions::DIRECT_CALL_PREFIX)
                            }) {
                                let shown: String = r.chars().take(DIRECT_RESULT_SHOWN).collect();
                                let more = if shown.len() < r.len() { " …" } else { "" };
                                println!("    result {}{more}", inert(&shown));
                            }
                        }
                    }
                    for u in t
                        .approvals
                        .iter()
                        .filter(|u| u.status == keel::protocol::sessions::ApprovalStatus::Pending)
                    {
                        println!(
                            "\nwaiting for approval {}: {} {} ({}) — keel approve {} / keel reject {}",
                            u.id,
                            inert(&u.tool),
                            inert(&u.input),
                            u.effect,
                            u.id,
                            u.id
                        );
                    }
                    print_plan(&t);
                    print_transitions(&t);
                    print_capabilities(&t);
                    print_model_calls(&t);
                    if t.pending_inputs > 0 {
                        println!("\n{} input(s) waiting in the inbox", t.pending_inputs);
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => super::api_fail(a.json, &e),
            }
        }
        SessionCommand::Send(a) => {
            let cancel = CancelToken::new();
            cancel_on_ctrl_c(&cancel);
            let progress = super::events::Progress::start(&h, &a.id).await;
            let submitted =
                h.send(&Caller::Operator, &a.id, &a.message, &cancel, &streaming()).await;
            progress.finish().await;
            match submitted {
                Ok(s) => report(a.json, &h, &a.id, &s).await,
                Err(e) => super::fail(a.json, e.kind(), &e.to_string(), super::exit_code(&e)),
            }
        }
        SessionCommand::Interrupt(a) => match h.interrupt(&Caller::Operator, &a.id).await {
            Ok(state) => {
                if a.json {
                    println!("{}", json!({"ok": true, "session_id": a.id, "state": state}));
                } else {
                    println!(
                        "interrupt requested for session {} (state {state}); a running turn stops at its next check (≤ 0.1 s), \
                         a waiting one is closed now",
                        a.id
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => super::api_fail(a.json, &e),
        },
        SessionCommand::Evidence(a) => match match (a.refused, a.understanding, a.orchestration) {
            _ if a.reply => {
                let n = a.compaction.filter(|n| *n > 0);
                h.compaction_reply(&Caller::Operator, &a.id, n)
                    .await
                    .map(|(seq, r)| (seq, format!("{r}\n").into_bytes()))
            }
            _ if a.compaction.is_some() => {
                let n = a.compaction.unwrap_or(0);
                h.compaction_evidence(&Caller::Operator, &a.id, (n > 0).then_some(n)).await
            }
            (Some(n), _, _) => {
                h.refused_evidence(&Caller::Operator, &a.id, (n > 0).then_some(n)).await
            }
            (None, Some(t), _) => {
                h.understanding_evidence(&Caller::Operator, &a.id, (t > 0).then_some(t)).await
            }
            (None, None, Some(t)) => {
                h.orchestration_evidence(&Caller::Operator, &a.id, (t > 0).then_some(t)).await
            }
            (None, None, None) => h.evidence(&Caller::Operator, &a.id, a.step).await,
        } {
            Ok((_, body)) => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&body);
                let _ = out.flush();
                ExitCode::SUCCESS
            }
            Err(e) => super::api_fail(false, &e),
        },
    }
}

/// `keel session compact`.
async fn compact(h: &keel::protocol::setup::Harness, a: &IdArgs) -> ExitCode {
    use keel::protocol::sessions::Compaction;
    let cancel = CancelToken::new();
    cancel_on_ctrl_c(&cancel);
    let progress = super::events::Progress::start(h, &a.id).await;
    let result = h.compact(&Caller::Operator, &a.id, &cancel, &quiet()).await;
    progress.finish().await;
    let outcome = match result {
        Ok(o) => o,
        Err(e) => return super::api_fail(a.json, &e),
    };
    let next = h.timeline(&Caller::Operator, &a.id).await.ok().map(|t| t.next_request);
    match outcome {
        Compaction::Compacted { checkpoint, from, context_start, ms } => {
            if a.json {
                println!(
                    "{}",
                    json!({"ok": true, "session_id": a.id, "checkpoint": checkpoint, "from": from,
                           "to": context_start, "context_start": context_start, "ms": ms,
                           "next_request": next})
                );
            } else {
                println!(
                    "session {}: checkpoint {checkpoint} summarizes messages {from}–{context_start}; the next request is ~{} tokens",
                    a.id,
                    next.map(|n| n.tokens.to_string()).unwrap_or_else(|| "?".into())
                );
            }
            ExitCode::SUCCESS
        }
        Compaction::Nothing => super::fail(
            a.json,
            "nothing_to_compact",
            &format!(
                "session {} has nothing to compact: no history after its context start ends at a legal boundary",
                a.id
            ),
            EXIT_REFUSED,
        ),
        Compaction::Failed(e) | Compaction::Discarded(e) => super::fail(
            a.json,
            "compaction_failed",
            &format!("the compaction of session {} failed; its context is unchanged: {e}", a.id),
            EXIT_REFUSED,
        ),
    }
}

/// `keel session upgrade-tools ID`: pins every loaded tool to the version installed now.
async fn upgrade_tools(h: &keel::protocol::setup::Harness, a: &IdArgs) -> ExitCode {
    let changed = match h.upgrade_session_tools(&Caller::Operator, &a.id).await {
        Ok(c) => c,
        Err(e) => return super::api_fail(a.json, &e),
    };
    if a.json {
        let rows: Vec<_> = changed
            .iter()
            .map(|(tool, old, new)| json!({"tool": tool, "old_digest": old, "new_digest": new}))
            .collect();
        println!("{}", json!({"ok": true, "session_id": a.id, "upgraded": rows}));
    } else if changed.is_empty() {
        println!("session {}: every tool already runs the installed version", a.id);
    } else {
        for (tool, old, new) in &changed {
            let old = old.as_deref().map(|d| format!("sha256:{d}")).unwrap_or("-".into());
            println!("{tool}: {old} -> sha256:{new}");
        }
    }
    ExitCode::SUCCESS
}
