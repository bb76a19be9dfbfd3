//! `keel session rewind ID --to STEP`: put back what a session's calls after a step changed
//! on disk (and with `--conversation`, take its conversation back there too);
//! `keel session replay`: run its recorded reads again; `keel session fork`: a new session
//! from a step.

use std::process::ExitCode;

use clap::Args;
use keel::api::{Caller, ForkOptions, RewindForce, RewindOptions, RewindReport};
use keel::protocol::setup::Harness;
use serde_json::json;

use super::super::{api_fail, inert, inert_block};

#[derive(Args)]
pub struct RewindArgs {
    /// Session id.
    id: String,
    /// The step to go back to: files as they were after its calls (0: before the session's
    /// first call). `keel session show ID` lists the steps.
    #[arg(long, value_name = "STEP")]
    to: i64,
    /// Only say what would change, with a diff of each file to put back; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Put back the paths changed since the session's last call too (conflicts), all of them
    /// or, with --force-path, those named.
    #[arg(long, conflicts_with = "force_path")]
    force: bool,
    /// Put back this path although it changed since the session's last call (a guest path,
    /// as listed; repeatable).
    #[arg(long, value_name = "PATH")]
    force_path: Vec<String>,
    /// Take the conversation back too, once every file is back: the messages after the step
    /// leave the model's context (they stay in the store, shown as rewound), and the next
    /// turn continues from the step.
    #[arg(long)]
    conversation: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub async fn rewind(h: &Harness, a: RewindArgs) -> ExitCode {
    let force = RewindForce::from_flags(a.force, a.force_path.clone());
    let opts = RewindOptions { dry_run: a.dry_run, force, conversation: a.conversation };
    let report = match h.rewind(&Caller::Operator, &a.id, a.to, opts).await {
        Ok(r) => r,
        Err(e) => return api_fail(a.json, &e),
    };
    let left = report.left().count();
    if a.json {
        println!("{}", json!({"ok": left == 0, "rewind": report}));
    } else {
        print(&report);
    }
    if left == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

/// A rewind's report, as `keel session rewind` and the chat's `/rewind` print it.
pub fn print(r: &RewindReport) {
    let what = if r.dry_run { " (dry run: nothing was written)" } else { "" };
    let resumed = if r.resumed { ", finishing the one cut short" } else { "" };
    println!("session {}: rewind to step {}{resumed}{what}", r.session_id, r.to);
    if r.paths.is_empty() {
        println!("  nothing on disk changed after step {}", r.to);
    }
    for p in &r.paths {
        let verb = match (p.outcome, p.action) {
            ("done", "restore") => "restored",
            ("done", "remove" | "remove_dir") => "removed",
            ("done", "recreate") => "recreated",
            ("would", "restore") => "would restore",
            ("would", "remove" | "remove_dir") => "would remove",
            ("would", _) => "would recreate",
            ("already", _) => "already as it was",
            ("conflict", _) => "conflict",
            ("not_restorable", _) => "not restorable",
            ("refused", _) => "refused",
            _ => "failed",
        };
        let why = p.reason.as_deref().map(|r| format!(": {}", inert(r))).unwrap_or_default();
        let forced = if p.forced { " (forced)" } else { "" };
        println!("  {verb:<18} {}{forced}{why}", inert(&p.path));
        if let Some(d) = &p.diff {
            for line in inert_block(d).lines() {
                println!("      {line}");
            }
        }
    }
    for n in &r.not_undone {
        println!(
            "  not undone         step {} {} ({}): {}",
            n.step,
            inert(&n.tool),
            n.call_id,
            inert(&n.why)
        );
    }
    let left = r.left().count();
    if left > 0 {
        println!(
            "{left} path(s) left as they are; --force-path PATH (or --force) puts back one that changed since"
        );
    }
    if let Some(c) = &r.conversation {
        let moved = |w: &keel::protocol::sessions::ConversationRewind| {
            format!(
                "messages {}–{} {} the model's context; the {} message(s) it held at step {} {}",
                w.rewound_from,
                w.rewound_to,
                if c.outcome == "would" { "would leave" } else { "left" },
                w.resent,
                r.to,
                if c.outcome == "would" { "would be sent again" } else { "are sent again" },
            )
        };
        match (c.outcome, &c.rewind) {
            ("done" | "would", Some(w)) => println!("  conversation       {}", moved(w)),
            ("nothing", _) => println!("  conversation       nothing came after step {}", r.to),
            (_, _) => println!(
                "  conversation       not rewound: {}",
                inert(c.why.as_deref().unwrap_or("-"))
            ),
        }
    }
}

#[derive(Args)]
pub struct ForkArgs {
    /// Session id.
    id: String,
    /// The step to fork at: the fork's history is the session's up to the results of this
    /// step (0: before its first request). `keel session show ID` lists the steps.
    #[arg(long, value_name = "STEP")]
    at: i64,
    /// The fork's id (default: a new one).
    #[arg(long = "new-id", value_name = "ID")]
    new_id: Option<String>,
    /// The fork's model, if another (by default the session's).
    #[command(flatten)]
    model: super::set::ModelArgs,
    /// Give the fork every grant read-only.
    #[arg(long)]
    read_only: bool,
    /// Do not give the fork the grant at this guest path (repeatable).
    #[arg(long, value_name = "GUEST")]
    drop_grant: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `keel session fork`: a new session whose history is the session's up to a step.
pub async fn fork(h: &Harness, a: ForkArgs) -> ExitCode {
    let opts = ForkOptions {
        id: a.new_id,
        model: a.model.change(),
        read_only: a.read_only,
        drop_grants: a.drop_grant,
    };
    let report = match h.fork(&Caller::Operator, &a.id, a.at, opts).await {
        Ok(r) => r,
        Err(e) => return api_fail(a.json, &e),
    };
    if a.json {
        println!("{}", json!({"ok": true, "fork": report}));
        return ExitCode::SUCCESS;
    }
    println!(
        "session {}: forked from {} at step {} ({} message(s), turn {})",
        report.session_id, report.from, report.at, report.messages, report.turn
    );
    println!("  model   {}", super::super::describe_model(&report.model));
    for g in &report.grants {
        println!("  grant   {g}");
    }
    if report.grants.is_empty() {
        println!("  grant   none");
    }
    println!("  the files its grants reach are shared with {}, not copied", report.from);
    println!("continue it: keel run --session {} \"…\"", report.session_id);
    ExitCode::SUCCESS
}

#[derive(Args)]
pub struct ReplayArgs {
    /// Session id.
    id: String,
    /// Run again the calls after this step (0: every call).
    #[arg(long, value_name = "STEP", default_value_t = 0)]
    at: i64,
    /// Required: only tools (the one replay there is): the recorded read-only, idempotent calls, with the
    /// tools installed now, against a scratch copy of the session's grants. The model is not
    /// asked anything.
    #[arg(long)]
    tools_only: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `keel session replay`: exit 0 when every re-run call gave its recorded output, 1 when one
/// changed.
pub async fn replay(h: &Harness, a: ReplayArgs) -> ExitCode {
    if !a.tools_only {
        let why = "a replay runs the recorded tool calls only (--tools-only): the model is never asked again";
        return super::super::fail(a.json, "invalid_input", why, super::super::EXIT_REFUSED);
    }
    let report = match h.replay(&Caller::Operator, &a.id, a.at).await {
        Ok(r) => r,
        Err(e) => return api_fail(a.json, &e),
    };
    let changed = report.changed();
    if a.json {
        println!("{}", json!({"ok": changed == 0, "replay": report}));
    } else {
        println!(
            "session {}: the calls after step {}, run again with the tools installed now",
            report.session_id, report.at
        );
        if report.calls.is_empty() {
            println!("  no call after step {}", report.at);
        }
        for c in &report.calls {
            let version = match (&c.recorded_digest, &c.digest_now) {
                (Some(a), Some(b)) if a != b => {
                    format!(" (tool {} → {})", &a[..12.min(a.len())], &b[..12.min(b.len())])
                }
                _ => String::new(),
            };
            let why = c.why.as_deref().map(|w| format!(": {}", inert(w))).unwrap_or_default();
            println!("  step {:<4} {:<8} {}{version}{why}", c.step, c.outcome, inert(&c.tool));
            if let Some(d) = &c.diff {
                for line in inert_block(d).lines() {
                    println!("      {line}");
                }
            }
        }
        let same = report.calls.iter().filter(|c| c.outcome == "same").count();
        let skipped = report.calls.iter().filter(|c| c.outcome == "skipped").count();
        println!("{same} same, {changed} changed, {skipped} skipped");
    }
    if changed == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
