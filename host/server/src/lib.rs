//! # keel-server
//!
//! keel's network front-ends, over the use cases of the core ([`keel::api`]): they map a
//! request to a use case and its answer to a response, and own no fact.
//!
//! - [`http`] — `keel serve`: the JSON API under `/api/v1` and the server-rendered console.
//! - [`mcp`] — `keel mcp serve`: keel as an MCP server, over stdio or streamable HTTP.
//! - [`listen`] — the bounded HTTP listener both network front-ends serve on.
#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod http;
pub mod listen;
pub mod mcp;
