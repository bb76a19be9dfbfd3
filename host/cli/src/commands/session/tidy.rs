//! `keel session list`, `delete` and `prune`: finding sessions and tidying them.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use keel::api::{Caller, SessionFilter};
use keel::protocol::sessions::RuntimeState;
use keel::protocol::setup::Harness;
use keel::protocol::text::parse_age;
use serde_json::json;

use super::super::{ago, api_fail, inert, now_ms};

/// Characters of a session's title (its goal) in a listing.
const TITLE_CHARS: usize = 60;

#[derive(Args)]
pub struct ListArgs {
    /// Only sessions in these states, comma-separated (idle, running, waiting_approval,
    /// failed, interrupted …).
    #[arg(long, value_delimiter = ',', value_name = "STATE")]
    state: Vec<RuntimeState>,
    /// Only sessions active within this long: s, m, h, d or w, e.g. 2h or 7d.
    #[arg(long, value_name = "DURATION", value_parser = parse_age)]
    since: Option<Duration>,
    /// Only sessions whose goal or messages hold this text (case aside).
    #[arg(long, value_name = "TEXT")]
    search: Option<String>,
    /// At most this many sessions.
    #[arg(long, value_name = "N")]
    limit: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct TitleArgs {
    /// Session id.
    id: String,
    /// The title: one line, at most 200 characters.
    #[arg(required_unless_present = "clear")]
    title: Option<String>,
    /// Remove the title: lists show the session's goal again.
    #[arg(long, conflicts_with = "title")]
    clear: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DeleteArgs {
    /// Session id.
    id: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct PruneArgs {
    /// Delete the sessions not active for this long: s, m, h, d or w, e.g. 30d.
    #[arg(long, value_name = "DURATION", value_parser = parse_age)]
    older_than: Duration,
    /// Only sessions in these states, comma-separated (default: idle, failed, interrupted —
    /// a session waiting for an approval is pruned only when named here).
    #[arg(long, value_delimiter = ',', value_name = "STATE")]
    state: Vec<RuntimeState>,
    /// List what would be deleted; delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A session's title — the one a person gave it, else its goal — cut, on one line.
pub fn title(s: &keel::protocol::sessions::SessionSummary) -> String {
    let goal = s.title.as_deref().or(s.session_goal.as_deref()).unwrap_or("-");
    let cut: String = goal.chars().take(TITLE_CHARS).collect();
    let more = if goal.chars().count() > TITLE_CHARS { "…" } else { "" };
    format!("{}{more}", inert(&cut))
}

pub async fn list(h: &Harness, a: ListArgs) -> ExitCode {
    let filter = SessionFilter {
        states: a.state,
        active_since_ms: a.since.map(|d| now_ms().saturating_sub(ms(d))),
        inactive_since_ms: None,
        user: None,
        search: a.search,
        limit: a.limit,
    };
    let list = match h.find_sessions(&Caller::Operator, &filter).await {
        Ok(l) => l,
        Err(e) => return api_fail(a.json, &e),
    };
    if a.json {
        println!("{}", json!(list));
        return ExitCode::SUCCESS;
    }
    let now = now_ms();
    let width = list.iter().map(|s| s.id.chars().count()).max().unwrap_or(0).max(7);
    println!("{:<width$}  {:>12}  {:<16} {:>5}  TITLE", "SESSION", "ACTIVE", "STATE", "TURNS");
    for s in list {
        println!(
            "{:<width$}  {:>12}  {:<16} {:>5}  {}",
            s.id,
            ago(now - s.last_activity),
            s.state,
            s.turns,
            title(&s)
        );
    }
    ExitCode::SUCCESS
}

pub async fn title_of(h: &Harness, a: TitleArgs) -> ExitCode {
    match h.set_session_title(&Caller::Operator, &a.id, a.title.clone()).await {
        Ok(()) if a.json => {
            println!("{}", json!({"ok": true, "session_id": a.id, "title": a.title}));
            ExitCode::SUCCESS
        }
        Ok(()) => {
            match &a.title {
                Some(t) => println!("session {}: {}", inert(&a.id), inert(t.trim())),
                None => println!("session {}: no title (lists show its goal)", inert(&a.id)),
            }
            ExitCode::SUCCESS
        }
        Err(e) => api_fail(a.json, &e),
    }
}

pub async fn delete(h: &Harness, a: DeleteArgs) -> ExitCode {
    match h.delete_session(&Caller::Operator, &a.id).await {
        Ok(()) if a.json => {
            println!("{}", json!({"ok": true, "deleted": a.id}));
            ExitCode::SUCCESS
        }
        Ok(()) => {
            println!("deleted session {}", inert(&a.id));
            ExitCode::SUCCESS
        }
        Err(e) => api_fail(a.json, &e),
    }
}

pub async fn prune(h: &Harness, a: PruneArgs) -> ExitCode {
    let before = now_ms().saturating_sub(ms(a.older_than));
    let pruned = match h.prune_sessions(&Caller::Operator, before, a.state, a.dry_run).await {
        Ok(p) => p,
        Err(e) => return api_fail(a.json, &e),
    };
    if a.json {
        println!("{}", json!(pruned));
        return ExitCode::SUCCESS;
    }
    let now = now_ms();
    let verb = if pruned.dry_run { "would delete" } else { "deleted" };
    for s in &pruned.deleted {
        println!(
            "{verb} {}  (active {}, {}, {})",
            inert(&s.id),
            ago(now - s.last_activity),
            s.state,
            title(s)
        );
    }
    for k in &pruned.kept {
        println!("kept {}: {}", inert(&k.id), inert(&k.reason));
    }
    let n = pruned.deleted.len();
    println!(
        "{} {n} session{}{}",
        if pruned.dry_run { "would delete" } else { "deleted" },
        if n == 1 { "" } else { "s" },
        if pruned.dry_run { " (dry run: nothing was deleted)" } else { "" }
    );
    ExitCode::SUCCESS
}
