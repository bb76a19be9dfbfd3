//! `keel workgroup list|show`: main sessions and the sub-sessions below them.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use keel::api::Caller;
use keel::protocol::sessions::{Member, Workgroup};
use keel::protocol::setup::Harness;
use serde_json::json;

use super::fail;
use super::turn::{EXIT_WAITING, open_harness};
use super::{EXIT_SETUP, inert};

#[derive(Subcommand)]
pub enum WorkgroupCommand {
    /// List the workgroups (main sessions), newest first, with their sessions' states.
    List(ListArgs),
    /// Show one workgroup as a tree: each session's state, goal, delegation status, pending
    /// approvals, steps and tokens; with --events, the events between its sessions.
    Show(ShowArgs),
}

#[derive(Args)]
pub struct ListArgs {
    /// Print JSON (an array of workgroups).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ShowArgs {
    /// The main session's id.
    id: String,
    /// Also list the events between the sessions (request, result, question, failure, …).
    #[arg(long)]
    events: bool,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub async fn execute(home: PathBuf, cmd: WorkgroupCommand) -> ExitCode {
    let json_out = match &cmd {
        WorkgroupCommand::List(a) => a.json,
        WorkgroupCommand::Show(a) => a.json,
    };
    let (_, h) = match open_harness(&home).await {
        Ok(x) => x,
        Err(e) => return fail(json_out, "setup", &e, EXIT_SETUP),
    };
    match cmd {
        WorkgroupCommand::List(a) => match h.workgroups(&Caller::Operator).await {
            Ok(list) if a.json => {
                println!("{}", json!(list));
                ExitCode::SUCCESS
            }
            Ok(list) if list.is_empty() => {
                println!("no workgroups; `keel run --main \"TASK\"` starts one");
                ExitCode::SUCCESS
            }
            Ok(list) => {
                for w in &list {
                    let main = &w.members[0];
                    let live = w.members.iter().filter(|m| live(m)).count();
                    let waiting: usize = w.members.iter().map(|m| m.approvals.len()).sum();
                    println!(
                        "{}  {}  {} sub-sessions ({live} live){}  {} steps  {} tokens",
                        w.main_id,
                        main.state,
                        w.members.len() - 1,
                        if waiting > 0 {
                            format!(", {waiting} approvals pending")
                        } else {
                            String::new()
                        },
                        w.steps,
                        w.tokens
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => super::api_fail(a.json, &e),
        },
        WorkgroupCommand::Show(a) => {
            let w = match h.workgroup(&Caller::Operator, &a.id).await {
                Ok(w) => w,
                Err(e) => return super::api_fail(a.json, &e),
            };
            let events = if a.events {
                match h.workgroup_events(&Caller::Operator, &a.id).await {
                    Ok(e) => Some(e),
                    Err(e) => return super::api_fail(a.json, &e),
                }
            } else {
                None
            };
            if a.json {
                let mut v = json!(w);
                if let Some(e) = events {
                    v["event_list"] = json!(e);
                }
                println!("{v}");
                return ExitCode::SUCCESS;
            }
            print_tree(&w);
            if let Some(events) = events {
                println!();
                for e in events {
                    println!(
                        "{}  {:<16} {} → {}{}",
                        keel::protocol::text::format_time(e.at),
                        e.kind.to_string(),
                        e.from,
                        e.to,
                        if e.consumed { "" } else { "  (waiting in the inbox)" }
                    );
                }
            }
            ExitCode::SUCCESS
        }
    }
}

fn live(m: &Member) -> bool {
    m.delegation == Some(keel::protocol::sessions::Delegation::Live)
}

fn line(m: &Member) -> String {
    let mut s = format!("{}  [{}]", m.session_id, m.state);
    match (m.delegation, m.terminal) {
        (Some(keel::protocol::sessions::Delegation::Live), _) => s.push_str(" live"),
        (Some(_), Some(t)) => s.push_str(&format!(" done: {t}")),
        _ => {}
    }
    if let Some(p) = &m.purpose {
        s.push_str(&format!("  {}", inert(p)));
    }
    s.push_str(&format!("  {} steps, {} tokens", m.steps, m.tokens));
    s
}

/// Prints the workgroup as a tree under its main session.
pub fn print_tree(w: &Workgroup) {
    let l = &w.limits;
    println!(
        "workgroup {}: {} sessions, {} steps, {} tokens, {} events (limits: {} live children, depth {}, {} s per request{}{})",
        w.main_id,
        w.members.len(),
        w.steps,
        w.tokens,
        w.events,
        l.max_live_children,
        l.max_depth,
        l.child_deadline_secs,
        l.max_steps.map(|n| format!(", {n} steps")).unwrap_or_default(),
        l.max_tokens.map(|n| format!(", {n} tokens")).unwrap_or_default(),
    );
    fn walk(w: &Workgroup, m: &Member, indent: usize) {
        println!("{}{}", "  ".repeat(indent), line(m));
        let pad = "  ".repeat(indent + 2);
        if let Some(g) = &m.goal {
            println!("{pad}goal: {}", inert(&keel::protocol::sessions::goal_reference(g)));
        }
        if let Some(q) = &m.question {
            println!("{pad}asks: {}", inert(q));
        }
        if let (Some(t), false) = (&m.text, live(m)) {
            let first = t.lines().next().unwrap_or("");
            println!("{pad}{}", inert(&first.chars().take(160).collect::<String>()));
        }
        for u in &m.approvals {
            println!("{pad}waits for approval {u} (`keel approve {u}`)");
        }
        for c in w.members.iter().filter(|c| c.parent.as_deref() == Some(m.session_id.as_str())) {
            walk(w, c, indent + 1);
        }
    }
    if let Some(main) = w.members.first() {
        walk(w, main, 0);
    }
}

/// After a turn of session `id` ran (exit code `code`): for a session of a workgroup, shows
/// the workgroup on stderr and, when a session of it waits for a decision, says so and exits
/// with the waiting code.
pub async fn after_run(json_out: bool, h: &Harness, id: &str, code: ExitCode) -> ExitCode {
    let Ok(Some(main)) = h.workgroup_of(&Caller::Operator, id).await else { return code };
    let Ok(w) = h.workgroup(&Caller::Operator, &main).await else { return code };
    let waiting: Vec<(&str, &str)> = w
        .members
        .iter()
        .flat_map(|m| m.approvals.iter().map(move |u| (m.session_id.as_str(), u.as_str())))
        .collect();
    if !json_out {
        let subs = w.members.len() - 1;
        let live = w.members.iter().filter(|m| live(m)).count();
        eprintln!(
            "keel: workgroup {main}: {subs} sub-sessions ({live} live), {} steps, {} tokens; `keel workgroup show {main}`",
            w.steps, w.tokens
        );
        for (s, u) in &waiting {
            eprintln!(
                "keel: session {s} waits for approval {u}; `keel approvals --session {main} --all-children`, then `keel approve {u}` resumes the workgroup"
            );
        }
    }
    if waiting.is_empty() || code != ExitCode::SUCCESS {
        code
    } else {
        ExitCode::from(EXIT_WAITING)
    }
}
