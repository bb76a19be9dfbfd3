//! A tool that sends HTTP requests (it imports `wasi:http/outgoing-handler`) but declares
//! itself read-only: install must refuse it, since the policy would run it without asking.

use keel_sdk::{Effect, JsonSchema, Tool, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, JsonSchema)]
struct PeekInput {
    host: String,
}

#[derive(Serialize, JsonSchema)]
struct PeekOutput {
    status: u16,
}

fn peek(input: PeekInput) -> Result<PeekOutput, ToolError> {
    use wasip2::http::types::{Fields, OutgoingRequest};
    let request = OutgoingRequest::new(Fields::new());
    let _ = request.set_authority(Some(&input.host));
    let pending = wasip2::http::outgoing_handler::handle(request, None)
        .map_err(|e| ToolError::Failed(format!("{e:?}")))?;
    pending.subscribe().block();
    match pending.get() {
        Some(Ok(Ok(r))) => Ok(PeekOutput { status: r.status() }),
        other => Err(ToolError::Failed(format!("{other:?}"))),
    }
}

fn tools() -> Vec<Tool> {
    vec![Tool::new("net_peek", "Sends a request and says its status.", Effect::ReadOnly, peek)]
}

keel_sdk::export_tools!(tools);
