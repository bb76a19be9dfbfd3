//! What every command that runs turns shares: opening the harness, the exit codes of a turn,
//! the model's text streamed, Ctrl-C, and the report of a turn's outcome.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use keel::api::Caller;
use keel::protocol::sessions::ModelClient;
use keel::protocol::sessions::Submitted;
use keel::protocol::sessions::TurnUsage;
use keel::protocol::sessions::{CancelToken, SandboxLimits};
use keel::protocol::sessions::{Event, Events, LoopGuards, TurnOutcome};
use keel::protocol::setup::Harness;
use keel::protocol::setup::Home;
use serde_json::json;

use super::{EXIT_TOOL_ERROR, inert_block};

/// Exit code of an interrupted turn.
pub const EXIT_INTERRUPTED: u8 = 130;
/// Exit code of a turn that stopped to wait for an approval.
pub const EXIT_WAITING: u8 = 4;

/// No in-process events: the commands print progress from the session's durable events
/// ([`super::events::Progress`]).
pub fn quiet() -> Events {
    Arc::new(|_: &Event| {})
}

/// The text of the last reply streamed on stderr, whole: what [`report`] need not print again
/// on the same terminal.
static STREAMED: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// The model's text on stderr as it arrives (the durable events carry the rest of the
/// progress); a newline ends each streamed reply. Stdout stays the answer alone.
pub fn streaming() -> Events {
    let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
    Arc::new(move |e: &Event| {
        use std::io::Write;
        use std::sync::atomic::Ordering;
        let mut streamed = STREAMED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match e {
            Event::TextDelta { text, .. } => {
                let mut err = std::io::stderr().lock();
                if !open.swap(true, Ordering::SeqCst) {
                    streamed.clear();
                    let _ = write!(err, "keel: ▸ ");
                }
                streamed.push_str(text);
                let _ = write!(err, "{}", super::inert_block(text));
                let _ = err.flush();
            }
            Event::TextRestarted { .. } => {
                // The attempt that showed the text failed; the call is made again.
                streamed.clear();
                let was_open = open.swap(true, Ordering::SeqCst);
                eprint!(
                    "{}keel: ▸ (the reply was cut off; asked again) ",
                    if was_open { "\n" } else { "" }
                );
            }
            Event::ModelReplied { .. } | Event::State(_) if open.swap(false, Ordering::SeqCst) => {
                eprintln!();
            }
            _ => {}
        }
    })
}

/// Opens the harness of `home`, with first-party installs reported on stderr.
pub async fn open_harness(home: &PathBuf) -> Result<(Home, Harness), String> {
    let home =
        Home::at(home).map_err(|e| format!("cannot use keel home {}: {e}", home.display()))?;
    let guards = LoopGuards::default();
    let progress = |m: &str| eprintln!("keel: {m}");
    let harness = Harness::open(
        home.clone(),
        SandboxLimits::default(),
        ModelClient::key_from_env(),
        guards,
        &progress,
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok((home, harness))
}

/// Cancels `cancel` on Ctrl-C.
pub fn cancel_on_ctrl_c(cancel: &CancelToken) {
    let c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("keel: interrupting…");
            c.cancel();
        }
    });
}

/// Prints the outcome of a submit to session `id` and returns the exit code.
pub async fn report(json_out: bool, h: &Harness, id: &str, submitted: &Submitted) -> ExitCode {
    let meta = h.session(&Caller::Operator, id).await;
    let harness_state = meta.as_ref().map(|m| m.runtime.state.to_string()).unwrap_or_default();
    let turn = meta.map(|m| m.runtime.turns).unwrap_or(0);
    let tokens = h.turn_usage(&Caller::Operator, id, turn).await.unwrap_or_default();
    report_with(json_out, id, &harness_state, submitted, &tokens)
}

/// What a turn cost, for the end of its summary line (` · this turn: …`; empty without a
/// model call).
pub fn this_turn(tokens: &TurnUsage) -> String {
    if tokens.model_calls > 0 {
        format!(" · this turn: {}", tokens.describe())
    } else {
        String::new()
    }
}

fn report_with(
    json_out: bool,
    id: &str,
    harness_state: &str,
    submitted: &Submitted,
    tokens: &TurnUsage,
) -> ExitCode {
    let (outcome, answer, code) = match submitted {
        Submitted::Ran(TurnOutcome::Answer(a)) => ("answer", a.clone(), 0),
        Submitted::Ran(TurnOutcome::Stopped(n)) => ("stopped", n.clone(), 0),
        Submitted::Ran(TurnOutcome::Interrupted) => {
            ("interrupted", String::new(), EXIT_INTERRUPTED)
        }
        Submitted::Ran(TurnOutcome::Failed(e)) => ("failed", e.clone(), EXIT_TOOL_ERROR),
        Submitted::Ran(TurnOutcome::WaitingApproval(_)) => {
            ("waiting_approval", String::new(), EXIT_WAITING)
        }
        Submitted::Queued { .. } => ("queued", String::new(), 0),
    };
    let approvals = match submitted {
        Submitted::Ran(TurnOutcome::WaitingApproval(units)) => units.clone(),
        _ => Vec::new(),
    };
    let this_turn = this_turn(tokens);
    if json_out {
        if !this_turn.is_empty() {
            eprintln!("keel: session {id} ({harness_state}){this_turn}");
        }
        println!(
            "{}",
            json!({"ok": code == 0 || code == EXIT_WAITING, "session_id": id, "state": harness_state,
                   "outcome": outcome, "answer": answer, "approvals": approvals,
                   "finish_reason": tokens.finish_reason, "tokens": tokens})
        );
    } else {
        match submitted {
            Submitted::Ran(TurnOutcome::Failed(e)) => eprintln!(
                "{} {}",
                super::style::paint(super::style::Tone::Bad, "error:"),
                inert_block(e)
            ),
            Submitted::Ran(TurnOutcome::Interrupted) => eprintln!("keel: session {id} interrupted"),
            Submitted::Ran(TurnOutcome::WaitingApproval(units)) => eprintln!(
                "keel: session {id} waits for approval ({}); review with `keel approvals --session {id}`, \
                 then `keel approve UNIT` or `keel reject UNIT` — the turn resumes from there",
                units.join(", ")
            ),
            Submitted::Queued { inbox_seq } => eprintln!(
                "keel: session {id} is running in another process; your input is queued (#{inbox_seq}) and it will run it next"
            ),
            // On a terminal that shows stderr and stdout alike, an answer streamed whole is
            // on the screen already; piped or redirected, stdout gets it.
            _ if shown_already(&answer) => {}
            _ => println!("{}", inert_block(&answer)),
        }
        eprintln!("keel: session {id} ({harness_state}){this_turn}");
    }
    ExitCode::from(code)
}

/// Whether `answer` was streamed whole on stderr and stdout is that same terminal.
fn shown_already(answer: &str) -> bool {
    let streamed = STREAMED.lock().map(|s| s.trim() == answer.trim()).unwrap_or(false);
    streamed && !answer.trim().is_empty() && same_terminal()
}

/// Whether stdout and stderr are one terminal.
fn same_terminal() -> bool {
    use std::io::IsTerminal;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    if !(std::io::stdout().is_terminal() && std::io::stderr().is_terminal()) {
        return false;
    }
    let device = |fd: std::os::fd::BorrowedFd<'_>| {
        fd.try_clone_to_owned()
            .ok()
            .map(std::fs::File::from)
            .and_then(|f| f.metadata().ok())
            .map(|m| m.rdev())
    };
    let (out, err) = (device(std::io::stdout().as_fd()), device(std::io::stderr().as_fd()));
    out.is_some() && out == err
}
