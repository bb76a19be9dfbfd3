//! Network egress of tools: `wasi:http` requests under per-session grants, through keel's own
//! hook ([`Egress`]) — never the default transport, and never `wasi:sockets` (which stays
//! deny-all).
//!
//! - [`grant`]: what a session may reach (`--net`), the loopback exceptions of tests
//!   (`--net-allow-loopback`), and where each secret goes (`--secret`);
//! - [`addr`]: which addresses are never reached, whatever a name resolves to;
//! - the hook: the check of every request, secrets on the wire, the byte cap and the records.

pub mod addr;
pub mod grant;
mod hook;
mod reflect;

pub use grant::{
    DEFAULT_NET_MAX_BYTES, DEFAULT_NET_MAX_REQUESTS, LoopbackException,
    NetGrantError, NetGrants, NetRule, SecretBinding,
};
pub use hook::{Egress, EgressPlan, NetRecord, NetReport};

/// Adds outgoing `wasi:http` (`types`, `outgoing-handler`) to `linker`, with the store's
/// [`Egress`] (reached through its `WasiHttpView`) as the sender of every request.
pub fn add_to_linker<T: wasmtime_wasi_http::WasiHttpView + 'static>(
    linker: &mut wasmtime::component::Linker<T>,
) -> wasmtime::Result<()> {
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(linker)
}


/// Whether any of `imports` is a `wasi:http` interface.
pub fn imports_http<'a>(imports: impl IntoIterator<Item = &'a str>) -> bool {
    imports.into_iter().any(|name| name.split('@').next().unwrap_or(name).starts_with("wasi:http/"))
}
