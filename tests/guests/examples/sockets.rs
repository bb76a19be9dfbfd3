//! A tool that tries the network every way the standard library offers: a TCP connection, a
//! TCP listener, a UDP socket and a name lookup. It imports `wasi:sockets`, which keel links
//! with everything denied, so each attempt must fail inside the guest.

use std::net::ToSocketAddrs;

use keel_sdk::{Effect, JsonSchema, Tool, ToolError};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize, JsonSchema)]
struct Addr {
    /// `IP:PORT` to connect to.
    addr: String,
    /// A host name to look up.
    #[serde(default)]
    name: Option<String>,
}

fn outcome<T>(r: std::io::Result<T>) -> Value {
    match r {
        Ok(_) => json!("ok"),
        Err(e) => json!(e.to_string()),
    }
}

fn connect(i: Addr) -> Result<Value, ToolError> {
    Ok(json!({
        "tcp_connect": outcome(std::net::TcpStream::connect(&i.addr)),
        "tcp_listen": outcome(std::net::TcpListener::bind("127.0.0.1:0")),
        "udp_bind": outcome(std::net::UdpSocket::bind("127.0.0.1:0")),
        "lookup": outcome(format!("{}:80", i.name.as_deref().unwrap_or("localhost")).to_socket_addrs()),
    }))
}

fn tools() -> Vec<Tool> {
    vec![Tool::new("connect", "Tries TCP, UDP and name lookup.", Effect::External, connect)]
}

keel_sdk::export_tools!(tools);
