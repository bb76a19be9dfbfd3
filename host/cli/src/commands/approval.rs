//! `keel approvals`, `keel approve`, `keel reject`, `keel recover`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use keel::api::Caller;
use keel::protocol::sessions::CancelToken;
use keel::protocol::sessions::Submitted;
use keel::protocol::sessions::{ApprovalUnit, Decision};
use serde_json::json;

use super::fail;
use super::turn::{cancel_on_ctrl_c, open_harness, report, streaming};
use super::{EXIT_SETUP, inert};

#[derive(Args)]
pub struct ApprovalsArgs {
    /// Only this session's approvals.
    #[arg(long)]
    session: Option<String>,
    /// With --session MAIN: also the approvals of every session below it in its workgroup.
    #[arg(long, requires = "session")]
    all_children: bool,
    /// Also list decided, consumed and cancelled approvals.
    #[arg(long)]
    all: bool,
    /// Show a file write's whole diff (or content) and the exact input, not cut.
    #[arg(long)]
    full: bool,
    /// Print JSON (an array of approval units, each pending file write with its `change`:
    /// path, content, current size, unified diff).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct DecideArgs {
    /// The approval unit (from `keel approvals`).
    unit: String,
    /// Why (recorded with the decision; a rejection reason is shown to the model).
    #[arg(long)]
    reason: Option<String>,
    /// Refuse unless the unit belongs to this session.
    #[arg(long)]
    session: Option<String>,
    /// Record the decision only; do not resume the session's turn now.
    #[arg(long)]
    no_resume: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RecoverArgs {
    /// Recover the facts only (close what a dead process left open); do not resume turns.
    #[arg(long)]
    no_resume: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Diff lines shown before the rest is cut with a count (`--full` shows them all).
const DIFF_LINES: usize = 60;
/// Content lines of a new file shown before the rest is cut with a count.
const CONTENT_LINES: usize = 30;

/// An approval unit as lines a person reads: what exactly would run and what it may touch,
/// and for a file write, the content and its diff against the file there now (cut unless
/// `full`; `full` also shows the exact input).
pub fn unit_lines(u: &ApprovalUnit, full: bool) -> Vec<String> {
    let mut out = vec![
        format!("approval {}  [{}]", u.id, u.status),
        format!("  session   {} (step {}, call {})", u.session_id, u.step, inert(&u.call_id)),
        format!("  tool      {}  ({})", inert(&u.tool), u.effect),
        format!("  component sha256:{}", u.component_digest),
    ];
    let change = (u.status == keel::protocol::sessions::ApprovalStatus::Pending)
        .then(|| keel::api::FileChange::of(u))
        .flatten();
    if change.is_none() || full {
        out.push(format!("  input     {}", inert(&u.input)));
    }
    out.push(format!("  input sha256:{}", u.input_digest));
    if let Some(c) = &change {
        out.extend(change_lines(c, full));
    }
    if u.grants.is_empty() {
        out.push("  may touch nothing on disk (no grants)".to_string());
    }
    for g in &u.grants {
        out.push(format!("  may touch {g}"));
    }
    for n in &u.net {
        out.push(format!("  may reach {}", inert(n)));
    }
    if u.net.is_empty() && matches!(u.effect, keel::protocol::sessions::Effect::External) {
        out.push("  may reach nothing on the network (no network grants)".to_string());
    }
    out.push(format!("  why       {}", inert(&u.why)));
    if let Some(r) = &u.decision_reason {
        out.push(format!("  reason    {}", inert(r)));
    }
    out
}

/// A file write as a person reviews it: one summary line, then the unified diff against the
/// file there now — or, for a new file (or one that cannot be compared), its content.
pub fn change_lines(c: &keel::api::FileChange, full: bool) -> Vec<String> {
    let mut out = vec![format!("  change    {}", inert(&c.summary()))];
    let (text, max, what) = if c.diff.is_empty() {
        (&c.content, CONTENT_LINES, "of the content")
    } else {
        (&c.diff, DIFF_LINES, "of the diff")
    };
    let (shown, omitted) = keel::api::cut_lines(text, if full { usize::MAX } else { max });
    for line in shown {
        // Added lines green, removed ones red, hunk heads bold (colours only on a terminal).
        let tone = match line.as_bytes().first() {
            _ if c.diff.is_empty() => None,
            Some(b'+') if !line.starts_with("+++") => Some(super::style::Tone::Good),
            Some(b'-') if !line.starts_with("---") => Some(super::style::Tone::Bad),
            Some(b'@') => Some(super::style::Tone::Strong),
            _ => None,
        };
        let line = inert(line);
        out.push(match tone {
            Some(t) => {
                let text = line.trim_end_matches('\n');
                format!("    │ {}{}", super::style::paint(t, text), &line[text.len()..])
            }
            None => format!("    │ {line}"),
        });
    }
    if omitted > 0 {
        out.push(format!("    │ … {omitted} more line(s) {what}; --full shows them all"));
    }
    out
}

/// `keel approvals`.
pub async fn list(home: PathBuf, a: ApprovalsArgs) -> ExitCode {
    let (_, h) = match open_harness(&home).await {
        Ok(x) => x,
        Err(e) => return fail(a.json, "setup", &e, EXIT_SETUP),
    };
    let units = match (&a.session, a.all_children) {
        (Some(s), true) => h.approvals_below(&Caller::Operator, s, !a.all).await,
        _ => h
            .approvals(&Caller::Operator, a.session.as_deref(), !a.all)
            .await
            .map(|views| views.into_iter().map(|v| v.unit).collect()),
    };
    match units {
        Ok(units) if a.json => {
            let shown: Vec<serde_json::Value> = units
                .iter()
                .map(|u| {
                    let mut v = json!(u);
                    if u.status == keel::protocol::sessions::ApprovalStatus::Pending
                        && let Some(c) = keel::api::FileChange::of(u)
                    {
                        v["change"] = json!(c);
                    }
                    v
                })
                .collect();
            println!("{}", json!(shown));
            ExitCode::SUCCESS
        }
        Ok(units) if units.is_empty() => {
            println!("no {}approvals", if a.all { "" } else { "pending " });
            ExitCode::SUCCESS
        }
        Ok(units) => {
            for (i, u) in units.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                for line in unit_lines(u, a.full) {
                    println!("{}", for_stdout(&line));
                }
            }
            println!("\ndecide with `keel approve UNIT` or `keel reject UNIT [--reason TEXT]`");
            ExitCode::SUCCESS
        }
        Err(e) => super::api_fail(a.json, &e),
    }
}

/// `keel approve` / `keel reject`: records the decision, then resumes the session's turn in the
/// foreground until it finishes or waits again.
pub async fn decide(home: PathBuf, a: DecideArgs, decision: Decision) -> ExitCode {
    let (_, h) = match open_harness(&home).await {
        Ok(x) => x,
        Err(e) => return fail(a.json, "setup", &e, EXIT_SETUP),
    };
    let unit = match h
        .decide(&Caller::Operator, &a.unit, decision, a.reason.clone(), a.session.clone())
        .await
    {
        Ok(u) => u,
        Err(e) => return fail(a.json, e.kind(), &e.to_string(), super::exit_code(&e)),
    };
    let verb = if decision == Decision::Approve { "approved" } else { "rejected" };
    if !a.json {
        eprintln!(
            "keel: {verb} {} ({} in session {})",
            unit.id,
            inert(&unit.tool),
            unit.session_id
        );
    }
    let id = unit.session_id.clone();
    if a.no_resume {
        if a.json {
            println!("{}", json!({"ok": true, "unit": unit, "session_id": id, "resumed": false}));
        }
        return ExitCode::SUCCESS;
    }
    let cancel = CancelToken::new();
    cancel_on_ctrl_c(&cancel);
    let progress = super::events::Progress::start(&h, &id).await;
    let resumed = h.resume(&Caller::Operator, &id, &cancel, &streaming()).await;
    progress.finish().await;
    let submitted = match resumed {
        Ok(Some(s)) => s,
        Ok(None) => {
            // Another live keel process holds the session; it sees the decision and resumes.
            if a.json {
                println!(
                    "{}",
                    json!({"ok": true, "unit": unit, "session_id": id, "resumed": false, "outcome": "handed_over"})
                );
            } else {
                eprintln!(
                    "keel: session {id} is held by another running keel process; it resumes the turn"
                );
            }
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(a.json, e.kind(), &e.to_string(), super::exit_code(&e)),
    };
    report(a.json, &h, &id, &submitted).await
}

/// `keel recover`: startup recovery (done by every command that opens the store), then each
/// recovered session's turn resumed in the foreground.
pub async fn recover(home: PathBuf, a: RecoverArgs) -> ExitCode {
    let (_, h) = match open_harness(&home).await {
        Ok(x) => x,
        Err(e) => return fail(a.json, "setup", &e, EXIT_SETUP),
    };
    let mut resumed = Vec::new();
    if !a.no_resume {
        let cancel = CancelToken::new();
        cancel_on_ctrl_c(&cancel);
        for r in h.recovered(&Caller::Operator).unwrap_or_default().iter().filter(|r| r.resumable) {
            if !a.json {
                eprintln!("keel: resuming session {}", r.id);
            }
            let progress = super::events::Progress::start(&h, &r.id).await;
            let drained = h.resume(&Caller::Operator, &r.id, &cancel, &streaming()).await;
            progress.finish().await;
            let outcome = match drained {
                Ok(Some(Submitted::Ran(o))) => o.describe(),
                Ok(_) => "held by another runner".to_string(),
                Err(e) => format!("error: {e}"),
            };
            let state = h
                .session(&Caller::Operator, &r.id)
                .await
                .map(|m| m.runtime.state.to_string())
                .unwrap_or_default();
            resumed.push(json!({"session_id": r.id, "state": state, "outcome": outcome}));
        }
    }
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "recovered": h.recovered(&Caller::Operator).unwrap_or_default(), "resumed": resumed})
        );
    } else if h.recovered(&Caller::Operator).unwrap_or_default().is_empty() {
        println!("nothing to recover");
    } else {
        for r in h.recovered(&Caller::Operator).unwrap_or_default() {
            println!(
                "session {}: {} → {}{}{}",
                r.id,
                r.state_before,
                r.state_after,
                if r.outcome_unknown.is_empty() {
                    String::new()
                } else {
                    format!(", outcome unknown: {}", inert(&r.outcome_unknown.join(", ")))
                },
                if r.rerun.is_empty() {
                    String::new()
                } else {
                    format!(", will re-run: {}", inert(&r.rerun.join(", ")))
                }
            );
        }
        for r in &resumed {
            println!("resumed {}: {} ({})", r["session_id"], r["outcome"], r["state"]);
        }
    }
    ExitCode::SUCCESS
}

/// `line` (coloured for stderr) as stdout takes it: its colours only when stdout is a terminal
/// too.
fn for_stdout(line: &str) -> String {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        return line.to_string();
    }
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("\x1b[") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        match after.find('m') {
            Some(end) => rest = &after[end + 1..],
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}
