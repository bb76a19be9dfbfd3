//! `keel session set ID`: move a session to another model server, model or context window.
//! `keel session policy ID`: allow a tool for good, or ask before it again.

use std::process::ExitCode;

use clap::Args;
use keel::api::Caller;
use keel::protocol::sessions::{ModelChange, PolicyChange};
use keel::protocol::setup::Harness;
use serde_json::json;

use super::super::describe_model as describe;

#[derive(Args)]
pub struct SetArgs {
    /// Session id.
    id: String,
    #[command(flatten)]
    model: ModelArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Another model for a session: each part given replaces the session's.
#[derive(Args)]
pub struct ModelArgs {
    /// The model server's base URL, the part before /chat/completions (an admin's change:
    /// the host's model credentials go wherever it points).
    #[arg(long, value_name = "URL")]
    model_url: Option<String>,
    /// The model name.
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// The model's context window in tokens.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(512..))]
    context_window: Option<u64>,
}

impl ModelArgs {
    pub fn change(self) -> ModelChange {
        ModelChange {
            base_url: self.model_url,
            model: self.model,
            context_window: self.context_window,
        }
    }
}

/// Moves session `id` to the model `change` names and says what changed, on stderr (as a
/// chat does) or stdout; whether it did.
pub async fn change_model(h: &Harness, id: &str, change: ModelChange, json: bool) -> ExitCode {
    match h.set_session_model(&Caller::Operator, id, change).await {
        Ok((from, to)) if json => {
            println!("{}", json!({"ok": true, "session_id": id, "from": from, "to": to}));
            ExitCode::SUCCESS
        }
        Ok((from, to)) if from == to => {
            println!("session {id} already uses {}", describe(&to));
            ExitCode::SUCCESS
        }
        Ok((from, to)) => {
            println!("session {id}: {} → {}", describe(&from), describe(&to));
            ExitCode::SUCCESS
        }
        Err(e) => super::super::api_fail(json, &e),
    }
}

pub async fn execute(h: &Harness, a: SetArgs) -> ExitCode {
    change_model(h, &a.id, a.model.change(), a.json).await
}

#[derive(Args)]
pub struct PolicyArgs {
    /// Session id.
    id: String,
    /// Allow TOOL without asking, for the rest of the session: everywhere, or with
    /// TOOL=PREFIX only for calls whose every path is under PREFIX (a guest path, /out).
    /// Only an admin (or the local operator) widens a policy.
    #[arg(long, value_name = "TOOL[=PREFIX]")]
    allow: Vec<String>,
    /// Ask before every call of TOOL (undoes an allow).
    #[arg(long, value_name = "TOOL")]
    ask: Vec<String>,
    /// Refuse every call of TOOL.
    #[arg(long, value_name = "TOOL")]
    deny: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// Applies `change` to session `id`'s policy and says what it is now, on stdout (or in
/// JSON); the exit code.
pub async fn change_policy(
    h: &Harness,
    id: &str,
    change: PolicyChange,
    json: bool,
) -> Result<String, ExitCode> {
    match h.change_policy(&Caller::Operator, id, change).await {
        Ok(policy) => Ok(policy.summary()),
        Err(e) => Err(super::super::api_fail(json, &e)),
    }
}

pub async fn policy(h: &Harness, a: PolicyArgs) -> ExitCode {
    let mut changes = Vec::new();
    for spec in &a.allow {
        let (tool, under) = match spec.split_once('=') {
            Some((t, p)) => (t.to_string(), Some(p.to_string())),
            None => (spec.clone(), None),
        };
        changes.push(PolicyChange::Allow { tool, under });
    }
    changes.extend(a.ask.iter().map(|t| PolicyChange::Ask { tool: t.clone() }));
    changes.extend(a.deny.iter().map(|t| PolicyChange::Deny { tool: t.clone() }));
    let mut summary = None;
    for change in changes {
        match change_policy(h, &a.id, change, a.json).await {
            Ok(s) => summary = Some(s),
            Err(code) => return code,
        }
    }
    let summary = match summary {
        Some(s) => s,
        None => match h.session(&Caller::Operator, &a.id).await {
            Ok(meta) => meta.config.policy.summary(),
            Err(e) => return super::super::api_fail(a.json, &e),
        },
    };
    if a.json {
        println!("{}", json!({"ok": true, "session_id": a.id, "policy": summary}));
    } else {
        println!("session {}: {}", a.id, super::super::inert(&summary));
    }
    ExitCode::SUCCESS
}
