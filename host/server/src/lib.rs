//! # keel-server
//!
//! keel's network front-ends, over the use cases of the core ([`keel::api`]): they map a
//! request to a use case and its answer to a response, and own no fact.
//!
//! - [`http`] — `keel serve`: the JSON API under `/api/v1` and the server-rendered console.
//! - [`mcp`] — `keel mcp serve`: keel as an MCP server, over stdio or streamable HTTP.
//! - [`listen`] — the bounded HTTP listener both network front-ends serve on.
//! - [`telemetry`] — traces: keel's spans exported over OTLP/HTTP (a `tracing` layer the
//!   binary installs, any front-end's spans included).
#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod http;
pub mod listen;
pub mod mcp;
pub mod telemetry;

#[cfg(test)]
mod tests {
    /// The front-ends reach the owner spine only through the use cases of `keel::api`, each
    /// with its caller: none touches the Brain, SessionEngine, ToolService or the store.
    #[test]
    fn front_ends_use_only_the_use_case_api() {
        let sources = [
            ("mcp.rs", include_str!("mcp.rs")),
            ("listen.rs", include_str!("listen.rs")),
            ("http/mod.rs", include_str!("http/mod.rs")),
            ("http/api/mod.rs", include_str!("http/api/mod.rs")),
            ("http/api/approvals.rs", include_str!("http/api/approvals.rs")),
            ("http/api/tools.rs", include_str!("http/api/tools.rs")),
            ("http/api/events.rs", include_str!("http/api/events.rs")),
            ("http/auth.rs", include_str!("http/auth.rs")),
            ("http/console.rs", include_str!("http/console.rs")),
            ("http/files.rs", include_str!("http/files.rs")),
        ];
        for (file, text) in sources {
            let code: String = text
                .split("#[cfg(test)]")
                .next()
                .unwrap_or(text)
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            for owner in [
                ".brain",
                ".engine",
                "harness.tools.",
                "harness.db",
                ".agent",
                "ToolService",
                "SessionEngine",
            ] {
                assert!(!code.contains(owner), "{file} reaches `{owner}` directly");
            }
        }
    }
}
