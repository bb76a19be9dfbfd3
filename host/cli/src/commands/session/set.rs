//! `keel session set ID`: move a session to another model server, model or context window.

use std::process::ExitCode;

use clap::Args;
use keel::api::Caller;
use keel::protocol::sessions::ModelChange;
use keel::protocol::setup::Harness;
use serde_json::json;

use super::super::describe_model as describe;

#[derive(Args)]
pub struct SetArgs {
    /// Session id.
    id: String,
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
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
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
    let change =
        ModelChange { base_url: a.model_url, model: a.model, context_window: a.context_window };
    change_model(h, &a.id, change, a.json).await
}
