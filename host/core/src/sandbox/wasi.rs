//! The WASI a tool gets: deny by default, in one place.
//!
//! [`build_ctx`] starts from nothing and adds only what the lease says:
//! - no environment variables and no arguments;
//! - stdin closed; stdout and stderr captured into capped buffers (never the host's stdio);
//! - no sockets: `wasi:sockets` is linked (language runtimes such as CPython import it) but
//!   denies everything — no TCP, no UDP, no name lookup, every address refused — so every
//!   socket operation fails inside the guest;
//! - outgoing HTTP only: `wasi:http/outgoing-handler` is linked with keel's egress hook
//!   ([`super::net`]), which checks every request against the call's network grants (none:
//!   every request is refused with `HTTP-request-denied`);
//! - the filesystem is exactly the grants, each mounted read-only or read-write, behind the
//!   guard of [`super::fs`] (effect class, write quota, creation cap);
//! - clocks and random numbers (they reveal nothing of the host).
//!
//! [`add_to_linker`] links the WASI 0.2 interfaces above and keel's own units — the guarded
//! filesystem ([`super::fs`]), egress ([`super::net`]), `keel:tool/host` ([`super::host_api`])
//! and, for trusted components, `keel:control` ([`super::control`]) — each of which provides
//! its linker setup; [`CallState`] holds each unit's per-call state. The list of what is
//! linked is [`GRANTED_INTERFACES`], used to explain install refusals.

use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::filesystem::WasiFilesystemCtxView;
use wasmtime_wasi::p2::bindings as wasi;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::fs::{FsGuard, FsPolicy, FsReach, GuardedFs};

use super::host_api::{self, HostApi, HostApiCtx};
use super::limits::CallLimits;
use super::pipe::CappedPipe;
use crate::grant::{Access, Opened};

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
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/ip-name-lookup",
    "wasi:http/types",
    "wasi:http/outgoing-handler",
    "keel:tool/types",
    "keel:tool/host",
];

/// Explains why an interface that is not granted is refused.
pub fn why_not_granted(interface: &str) -> &'static str {
    if interface.starts_with("wasi:http/") {
        "a tool sends HTTP requests (wasi:http/outgoing-handler); it does not serve them"
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
    pub(super) fs: FsGuard,
    /// The plan of a call of a trusted control component (`None` for every other call).
    pub(super) control: Option<super::control::ControlCtx>,
    http: wasmtime_wasi_http::WasiHttpCtx,
    /// The egress hook: every `wasi:http` request of the call passes it.
    pub(super) egress: super::net::Egress,
}

impl wasmtime_wasi_http::WasiHttpView for CallState {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        wasmtime_wasi_http::WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.egress,
        }
    }
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl CallState {
    pub(super) fn new(
        wasi: WasiCtx,
        limits: CallLimits,
        fs: (FsPolicy, FsReach),
        egress: super::net::Egress,
    ) -> Self {
        Self {
            wasi,
            table: ResourceTable::new(),
            limits,
            host: HostApiCtx::default(),
            fs: FsGuard::new(fs.0, fs.1),
            control: None,
            http: wasmtime_wasi_http::WasiHttpCtx::new(),
            egress,
        }
    }

    fn guarded_fs(&mut self) -> GuardedFs<'_> {
        GuardedFs {
            fs: WasiFilesystemCtxView { ctx: self.wasi.filesystem(), table: &mut self.table },
            guard: &mut self.fs,
        }
    }
}

/// Builds the WASI context of one call from its opened grants (see the module docs for
/// defaults); `read_only` mounts every grant read-only. Each grant is mounted from the handle
/// its identity was checked on, never from its path.
pub fn build_ctx(
    grants: &[Opened],
    read_only: bool,
    stdout: &CappedPipe,
    stderr: &CappedPipe,
) -> wasmtime::Result<WasiCtx> {
    let mut b = WasiCtxBuilder::new();
    // File I/O runs on the calling thread instead of a blocking pool: calls are short and
    // bounded by their deadline; this cuts a small read from ~100 µs to ~12 µs.
    b.allow_blocking_current_thread(true);
    b.stdout(stdout.clone()).stderr(stderr.clone());
    // Sockets are linked but useless: no TCP, no UDP, no name lookup, no address allowed.
    b.allow_tcp(false).allow_udp(false).allow_ip_name_lookup(false);
    b.socket_addr_check(|_, _| Box::pin(async { false }));
    for g in grants {
        // A read-only tool sees every grant read-only, whatever the session granted.
        let perms = match g.access {
            _ if read_only => FsPerms::ReadOnly,
            Access::Ro => FsPerms::ReadOnly,
            Access::Rw => FsPerms::ReadWrite,
        };
        b.preopened_dir(handle_path(&g.dir), &g.guest, perms)?;
    }
    Ok(b.build())
}

/// A path that opens the very directory `dir` is a handle to: its descriptor's entry in
/// `/proc/self/fd`, which the kernel resolves to the open directory itself, wherever it is
/// now, whatever replaced its old path. (wasmtime-wasi preopens by path only.)
fn handle_path(dir: &cap_std::fs::Dir) -> std::path::PathBuf {
    use std::os::fd::AsRawFd;
    std::path::PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()))
}

/// Links the granted WASI interfaces (outgoing HTTP through the egress hook) and
/// `keel:tool/host`.
pub fn add_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    use wasmtime_wasi::cli::{WasiCli, WasiCliView};
    use wasmtime_wasi::clocks::WasiClocks;
    use wasmtime_wasi::clocks::WasiClocksView;
    use wasmtime_wasi::random::WasiRandom;
    use wasmtime_wasi::sockets::{WasiSockets, WasiSocketsView};
    type T = CallState;
    let l = linker;
    wasi::io::error::add_to_linker::<T, HasIo>(l, |t| &mut t.table)?;
    wasi::io::poll::add_to_linker::<T, HasIo>(l, |t| &mut t.table)?;
    wasi::io::streams::add_to_linker::<T, HasIo>(l, |t| &mut t.table)?;
    wasi::clocks::wall_clock::add_to_linker::<T, WasiClocks>(l, T::clocks)?;
    wasi::clocks::monotonic_clock::add_to_linker::<T, WasiClocks>(l, T::clocks)?;
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
    wasi::sockets::tcp::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    wasi::sockets::udp::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    wasi::sockets::tcp_create_socket::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    wasi::sockets::udp_create_socket::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    wasi::sockets::instance_network::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    wasi::sockets::network::add_to_linker::<T, WasiSockets>(l, &Default::default(), T::sockets)?;
    wasi::sockets::ip_name_lookup::add_to_linker::<T, WasiSockets>(l, T::sockets)?;
    // keel's own units, each with its per-call state in `CallState`.
    super::fs::add_to_linker(l, T::guarded_fs)?;
    super::net::add_to_linker(l)?;
    host_api::add_to_linker(l, |t: &mut T| HostApi::new(&mut t.host))?;
    Ok(())
}

/// Interfaces (without version) linked only for components trusted with them.
pub const CONTROL_INTERFACES: &[&str] = &[
    "keel:control/plan",
    "keel:control/capabilities",
    "keel:control/memory",
    "keel:control/sessions",
    "keel:control/types",
];

/// Links the control interfaces (on a linker that has the rest: see [`add_to_linker`]).
pub fn add_control_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    super::control::add_to_linker(linker, |t: &mut CallState| {
        super::control::Control::new(&mut t.control)
    })
}

struct HasIo;

impl wasmtime::component::HasData for HasIo {
    type Data<'a> = &'a mut ResourceTable;
}
