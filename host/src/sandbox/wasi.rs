//! The WASI a tool gets: deny by default, in one place.
//!
//! [`build_ctx`] starts from nothing and adds only what the lease says:
//! - no environment variables and no arguments;
//! - stdin closed; stdout and stderr captured into capped buffers (never the host's stdio);
//! - no network: `wasi:sockets` is not even linked, so a component that imports it is refused
//!   when it is installed;
//! - the filesystem is exactly the grants, each mounted read-only or read-write;
//! - clocks and random numbers (they reveal nothing of the host).
//!
//! [`add_to_linker`] links the WASI 0.2 interfaces above plus `keel:tool/host`; the list of
//! what is linked is [`GRANTED_INTERFACES`], used to explain install refusals.

use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::p2::bindings as wasi;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::grant::{Access, Grant};
use super::host_api::{self, HostApi, HostApiCtx};
use super::limits::CallLimits;
use super::pipe::CappedPipe;

/// Interfaces (without version) linked for every tool. Anything else a component imports is
/// refused at install time.
pub const GRANTED_INTERFACES: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:cli/exit",
    "wasi:cli/environment",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "keel:tool/types",
    "keel:tool/host",
];

/// Explains why an interface that is not granted is refused.
pub fn why_not_granted(interface: &str) -> &'static str {
    if interface.starts_with("wasi:sockets/") {
        "network access is not granted to tools"
    } else if interface.starts_with("wasi:http/") {
        "outgoing HTTP is not granted to tools"
    } else if interface.starts_with("keel:") {
        "this host interface is only linked for trusted control tools"
    } else {
        "keel does not provide this interface to tools"
    }
}

/// The store data of one call.
pub struct CallState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(super) limits: CallLimits,
    pub(super) host: HostApiCtx,
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl CallState {
    pub(super) fn new(wasi: WasiCtx, limits: CallLimits) -> Self {
        Self { wasi, table: ResourceTable::new(), limits, host: HostApiCtx::default() }
    }
}

/// Builds the WASI context of one call from its grants (see the module docs for defaults).
pub fn build_ctx(
    grants: &[Grant],
    stdout: &CappedPipe,
    stderr: &CappedPipe,
) -> wasmtime::Result<WasiCtx> {
    let mut b = WasiCtxBuilder::new();
    // File I/O runs on the calling thread instead of a blocking pool: calls are short and
    // bounded by their deadline; this cuts a small read from ~100 µs to ~12 µs.
    b.allow_blocking_current_thread(true);
    b.stdout(stdout.clone()).stderr(stderr.clone());
    for g in grants {
        let perms = match g.access {
            Access::Ro => FsPerms::ReadOnly,
            Access::Rw => FsPerms::ReadWrite,
        };
        b.preopened_dir(&g.host, &g.guest, perms)?;
    }
    Ok(b.build())
}

/// Links the granted WASI interfaces and `keel:tool/host`.
pub fn add_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::clocks::WasiClocks;
    use wasmtime_wasi::clocks::WasiClocksView;
    use wasmtime_wasi::filesystem::WasiFilesystem;
    use wasmtime_wasi::filesystem::WasiFilesystemView;
    use wasmtime_wasi::random::WasiRandom;
    type T = CallState;
    let l = linker;
    wasi::io::error::add_to_linker::<T, HasIo>(l, |t| &mut t.table)?;
    wasi::io::poll::add_to_linker::<T, HasIo>(l, |t| &mut t.table)?;
    wasi::io::streams::add_to_linker::<T, HasIo>(l, |t| &mut t.table)?;
    wasi::clocks::wall_clock::add_to_linker::<T, WasiClocks>(l, T::clocks)?;
    wasi::clocks::monotonic_clock::add_to_linker::<T, WasiClocks>(l, T::clocks)?;
    wasi::filesystem::types::add_to_linker::<T, WasiFilesystem>(l, T::filesystem)?;
    wasi::filesystem::preopens::add_to_linker::<T, WasiFilesystem>(l, T::filesystem)?;
    wasi::random::random::add_to_linker::<T, WasiRandom>(l, |t| t.wasi.random())?;
    wasi::random::insecure::add_to_linker::<T, WasiRandom>(l, |t| t.wasi.random())?;
    wasi::random::insecure_seed::add_to_linker::<T, WasiRandom>(l, |t| t.wasi.random())?;
    wasi::cli::exit::add_to_linker::<T, WasiCli>(l, T::cli)?;
    wasi::cli::environment::add_to_linker::<T, WasiCli>(l, T::cli)?;
    wasi::cli::stdin::add_to_linker::<T, WasiCli>(l, T::cli)?;
    wasi::cli::stdout::add_to_linker::<T, WasiCli>(l, T::cli)?;
    wasi::cli::stderr::add_to_linker::<T, WasiCli>(l, T::cli)?;
    wasi::cli::terminal_input::add_to_linker::<T, WasiCli>(l, T::cli)?;
    wasi::cli::terminal_output::add_to_linker::<T, WasiCli>(l, T::cli)?;
    wasi::cli::terminal_stdin::add_to_linker::<T, WasiCli>(l, T::cli)?;
    wasi::cli::terminal_stdout::add_to_linker::<T, WasiCli>(l, T::cli)?;
    wasi::cli::terminal_stderr::add_to_linker::<T, WasiCli>(l, T::cli)?;
    host_api::add_to_linker(l, |t: &mut T| HostApi::new(&mut t.host))?;
    Ok(())
}

struct HasIo;

impl wasmtime::component::HasData for HasIo {
    type Data<'a> = &'a mut ResourceTable;
}
