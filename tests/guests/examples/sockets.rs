//! A tool that opens a TCP connection: it imports `wasi:sockets`, which keel never grants.

use keel_sdk::{Effect, JsonSchema, Tool, ToolError};
use serde::Deserialize;

#[derive(Deserialize, JsonSchema)]
struct Addr {
    addr: String,
}

fn connect(i: Addr) -> Result<String, ToolError> {
    std::net::TcpStream::connect(&i.addr).map_err(|e| ToolError::Failed(e.to_string()))?;
    Ok("connected".into())
}

fn tools() -> Vec<Tool> {
    vec![Tool::new("connect", "Connects to a TCP address.", Effect::External, connect)]
}

keel_sdk::export_tools!(tools);
