//! ProcessSandbox: runs one component call under a budget.
//!
//! Owns the engine, the compiled-artifact cache, the linker and the per-call machinery: a
//! fresh `Store` per call from an `InstancePre`, fuel, an epoch deadline, memory/table/instance
//! limits, capped stdio and an output cap, and a WASI context built only from the call's
//! grants. It does **not** decide what is allowed: which tool runs, with which grants and
//! budget, is decided by the caller (the ToolService).

mod cache;
mod carried;
pub mod control;
pub mod descriptors;
mod engine;
mod error;
mod fs;

mod host_api;
mod imports;
mod limits;
pub mod net;
mod pipe;
mod run;
mod wasi;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::Engine;
use wasmtime::component::{Component, ComponentExportIndex, InstancePre, Linker};

pub use crate::cancel::CancelToken;
pub use crate::digest::sha256_hex;
pub use crate::grant::{Access, Grant, GrantError, GrantUnusable, Opened};
pub use cache::{LoadSource, check_header};
pub use carried::{Carried, NAME_SECTION, VERSION_SECTION, carried, custom_section, parse_version};
pub use control::ControlCtx;
pub use error::{CallError, LoadError, ToolErrorKind};
pub use fs::{Captured, FsPolicy, PreImages, UndoBounds};
pub use run::{CallReport, Invocation, RawSpec};
pub use wasi::GRANTED_INTERFACES;
#[cfg(any(test, feature = "internals"))]
pub use {fs::FsReport, host_api::MAX_LOG_RECORDS, run::MAX_ERROR_MESSAGE};

use cache::ArtifactCache;
use wasi::CallState;

/// The WIT interface every tool component exports.
pub const TOOLS_INTERFACE: &str = "keel:tool/tools@0.1.0";

/// Elements a table may hold.
pub const MAX_TABLE_ELEMENTS: u64 = 1_000_000;
/// Core instances one call may create.
pub const MAX_INSTANCES_PER_CALL: usize = 256;
/// Tables one call may create.
pub const MAX_TABLES_PER_CALL: usize = 256;
/// Linear memories one call may create.
pub const MAX_MEMORIES_PER_CALL: usize = 16;

/// Limits of the sandbox as a whole (not per call).
#[derive(Debug, Clone)]
pub struct SandboxLimits {
    /// Largest `.wasm` accepted, in bytes.
    pub max_component_bytes: u64,
    /// Longest a component may take to compile.
    pub compile_timeout: Duration,
    /// Ceiling of any call's memory budget, in bytes (the pooling allocator's slot size).
    pub max_memory: u64,
    /// Wasm stack per call, in bytes.
    pub max_wasm_stack: usize,
    /// Calls that may run at once (sizes the pooling allocator).
    pub max_concurrent_calls: u32,
    /// File descriptors all tools of the process may hold at once (grants, open files,
    /// connections); `None`: the process's limit of open files less a reserve for the store
    /// and the front-ends ([`descriptors`]).
    pub tool_descriptors: Option<usize>,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            max_component_bytes: 64 * 1024 * 1024,
            compile_timeout: Duration::from_secs(60),
            max_memory: 4 * 1024 * 1024 * 1024,
            max_wasm_stack: 1024 * 1024,
            max_concurrent_calls: 128,
            tool_descriptors: None,
        }
    }
}

/// The budget of one call. Every field is a hard limit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Budget {
    /// Fuel units (roughly one per WebAssembly instruction).
    pub fuel: u64,
    /// Wall-clock deadline.
    #[serde(with = "duration_ms")]
    pub timeout: Duration,
    /// Linear memory across all of the component's memories, in bytes.
    pub memory: u64,
    /// Largest output accepted, in bytes.
    pub max_output: u64,
    /// Bytes of stdout and of stderr kept (the rest is counted and dropped).
    pub max_stdio: usize,
    /// Bytes one call may write to its grants, growth of files included (a write past the
    /// end counts the hole it leaves).
    #[serde(default = "default_write_quota")]
    pub write_quota: u64,
    /// Files, directories and links one call may create.
    #[serde(default = "default_max_files_created")]
    pub max_files_created: u64,
}

impl Budget {
    /// One line a person reads: fuel, deadline, memory, output, writes, new files.
    pub fn summary(&self) -> String {
        format!(
            "fuel {} · {} · memory {} · output {} · writes {} · {} new files",
            self.fuel,
            crate::units::format_duration(self.timeout),
            crate::units::format_size(self.memory),
            crate::units::format_size(self.max_output),
            crate::units::format_size(self.write_quota),
            self.max_files_created
        )
    }
}

/// The default per-call write quota: 1 GiB.
pub const DEFAULT_WRITE_QUOTA: u64 = 1 << 30;
/// The default cap on objects one call creates.
pub const DEFAULT_MAX_FILES_CREATED: u64 = 10_000;

fn default_write_quota() -> u64 {
    DEFAULT_WRITE_QUOTA
}

fn default_max_files_created() -> u64 {
    DEFAULT_MAX_FILES_CREATED
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            fuel: 20_000_000_000,
            timeout: Duration::from_secs(30),
            memory: 256 * 1024 * 1024,
            max_output: 4 * 1024 * 1024,
            max_stdio: 1024 * 1024,
            write_quota: DEFAULT_WRITE_QUOTA,
            max_files_created: DEFAULT_MAX_FILES_CREATED,
        }
    }
}

mod duration_ms {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms: u64 = serde::Deserialize::deserialize(d)?;
        Ok(Duration::from_millis(ms))
    }
}

/// Refuses the imports that are not among [`GRANTED_INTERFACES`] (nor, for a component
/// `trusted` with them, among the control interfaces), naming every one.
fn check_granted<'a>(names: impl Iterator<Item = &'a str>, trusted: bool) -> Result<(), LoadError> {
    let mut ungranted = Vec::new();
    for name in names {
        let unversioned = name.split('@').next().unwrap_or(name);
        let control = trusted && wasi::CONTROL_INTERFACES.contains(&unversioned);
        if !GRANTED_INTERFACES.contains(&unversioned) && !control {
            ungranted.push((name.to_string(), wasi::why_not_granted(unversioned)));
        }
    }
    if ungranted.is_empty() {
        Ok(())
    } else {
        Err(LoadError::UngrantedImports { imports: ungranted })
    }
}

/// A component ready to run: linked once, instantiated fresh for every call.
pub struct Prepared {
    pre: InstancePre<CallState>,
    describe: ComponentExportIndex,
    invoke: ComponentExportIndex,
}

/// The sandbox: one engine, one linker, one epoch ticker, one artifact cache — built on first
/// use, so a process that runs no tool (`keel session list`) never reserves the instance pool
/// or starts the ticker thread.
pub struct Sandbox {
    cache_root: PathBuf,
    limits: SandboxLimits,
    core: std::sync::OnceLock<Core>,
    /// One permit per pooled instance slot: calls beyond the pool wait instead of failing.
    slots: Arc<tokio::sync::Semaphore>,
    /// Compiles started (from bytes or from a file), for checks that nothing was compiled.
    compiles: std::sync::atomic::AtomicU64,
    /// The descriptors all of this sandbox's calls share.
    descriptors: Arc<descriptors::Descriptors>,
}

/// What the sandbox builds on first use.
struct Core {
    engine: Engine,
    linker: Linker<CallState>,
    /// `linker` plus the control interfaces, for trusted components.
    control_linker: Linker<CallState>,
    engine_hash: String,
    cache: ArtifactCache,
    _ticker: engine::EpochTicker,
}

impl Core {
    fn build(cache_root: &Path, limits: &SandboxLimits) -> Result<Self, LoadError> {
        // Host errors reach guests as text (`wasi:io/error.to-debug-string`): they must never
        // carry a host backtrace — its paths, and the time and memory it costs to capture —
        // whatever RUST_BACKTRACE says. (Traps keep their WebAssembly backtraces.)
        wasmtime::error::disable_backtrace();
        let engine = engine::build_engine(limits).map_err(|source| LoadError::Engine { source })?;
        let mut linker = Linker::new(&engine);
        wasi::add_to_linker(&mut linker).map_err(|source| LoadError::Engine { source })?;
        let mut control_linker = linker.clone();
        wasi::add_control_to_linker(&mut control_linker)
            .map_err(|source| LoadError::Engine { source })?;
        let ticker = engine::EpochTicker::start(&engine).map_err(|source| LoadError::Cache {
            context: "starting the epoch ticker thread".into(),
            source,
        })?;
        let engine_hash = engine::compatibility_hash(&engine);
        let cache = ArtifactCache::new(cache_root, &engine_hash);
        Ok(Self { engine, linker, control_linker, engine_hash, cache, _ticker: ticker })
    }
}

impl Sandbox {
    /// A sandbox whose compiled artifacts are cached under `cache_root`. The engine is built
    /// when it is first needed.
    pub fn new(cache_root: &Path, limits: SandboxLimits) -> Result<Self, LoadError> {
        let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_concurrent_calls as usize));
        let descriptors = Arc::new(descriptors::Descriptors::new(limits.tool_descriptors));
        Ok(Self {
            cache_root: cache_root.to_path_buf(),
            limits,
            core: Default::default(),
            slots,
            compiles: Default::default(),
            descriptors,
        })
    }

    /// The engine and what goes with it, built on first use (by one caller; a concurrent
    /// builder's copy is dropped).
    fn core(&self) -> Result<&Core, LoadError> {
        if let Some(core) = self.core.get() {
            return Ok(core);
        }
        let built = Core::build(&self.cache_root, &self.limits)?;
        Ok(self.core.get_or_init(|| built))
    }

    /// Digest of the engine settings that artifacts are compiled for.
    pub fn engine_hash(&self) -> Result<&str, LoadError> {
        Ok(&self.core()?.engine_hash)
    }

    pub fn limits(&self) -> &SandboxLimits {
        &self.limits
    }

    /// How many compiles this sandbox has started.
    #[cfg(any(test, feature = "internals"))]
    pub fn compiles(&self) -> u64 {
        self.compiles.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Compiles `bytes` (bounded in size and time) without caching.
    pub fn compile(&self, bytes: &[u8]) -> Result<Component, LoadError> {
        self.compiles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        cache::compile(
            &self.core()?.engine,
            Arc::from(bytes),
            self.limits.max_component_bytes,
            self.limits.compile_timeout,
        )
    }

    /// Writes the compiled artifact of `component` (whose `.wasm` hashes to `digest`) and
    /// returns the artifact's digest, which the caller records (see [`Sandbox::load`]).
    pub fn cache_artifact(&self, component: &Component, digest: &str) -> Result<String, LoadError> {
        self.core()?.cache.store(component, digest)
    }

    /// The compiled component of `digest` from the artifact cache, if an artifact there hashes
    /// to `recorded` (the digest the caller kept when it was written); an artifact that does
    /// not is removed. `None`: compile it.
    pub fn load_cached(
        &self,
        digest: &str,
        recorded: Option<&str>,
    ) -> Result<Option<Component>, LoadError> {
        let core = self.core()?;
        Ok(core.cache.load(&core.engine, digest, recorded).0)
    }

    /// Whether an artifact of `digest` is in the cache (not checked: see `load_cached`).
    pub fn has_artifact(&self, digest: &str) -> Result<bool, LoadError> {
        Ok(self.core()?.cache.has(digest))
    }

    /// Removes the cached artifact of `digest`, if there is one.
    pub fn drop_artifact(&self, digest: &str) -> Result<(), LoadError> {
        self.core()?.cache.remove(digest);
        Ok(())
    }

    /// Loads the component with `digest` from the artifact cache — only an artifact whose
    /// bytes hash to `recorded`, the digest the caller kept when it was written — or compiles
    /// it from `wasm` (refusing a file that does not hash to `digest`). The third value is the
    /// digest of an artifact written now, for the caller to record.
    pub fn load(
        &self,
        digest: &str,
        recorded: Option<&str>,
        wasm: &Path,
    ) -> Result<(Component, LoadSource, Option<String>), LoadError> {
        let core = self.core()?;
        let loaded = core.cache.load_or_compile(
            &core.engine,
            digest,
            recorded,
            wasm,
            self.limits.max_component_bytes,
            self.limits.compile_timeout,
        )?;
        if !matches!(loaded.1, LoadSource::Cache) {
            self.compiles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(loaded)
    }

    /// Checks the imports of a component's bytes before anything is compiled: a component
    /// that imports an interface keel does not grant (a control interface, unless `trusted`)
    /// is refused without spending the time and memory a compile takes.
    pub fn check_imports(&self, bytes: &[u8], trusted: bool) -> Result<(), LoadError> {
        let names = imports::top_level_imports(bytes)
            .map_err(|e| LoadError::Compile { source: wasmtime::format_err!("{e}") })?;
        check_granted(names.iter().map(String::as_str), trusted)
    }

    /// The interfaces the component in `bytes` imports (package, interface and version).
    pub fn imports(&self, bytes: &[u8]) -> Result<Vec<String>, LoadError> {
        imports::top_level_imports(bytes)
            .map_err(|e| LoadError::Compile { source: wasmtime::format_err!("{e}") })
    }

    /// The names the component in `bytes` exports at its top level (its interfaces).
    pub fn exports(&self, bytes: &[u8]) -> Result<Vec<String>, LoadError> {
        imports::top_level(bytes)
            .map(|(_, exports)| exports)
            .map_err(|e| LoadError::Compile { source: wasmtime::format_err!("{e}") })
    }

    /// Whether the component in `bytes` imports `wasi:http` (can reach the network).
    pub fn imports_http(&self, bytes: &[u8]) -> Result<bool, LoadError> {
        let names = imports::top_level_imports(bytes)
            .map_err(|e| LoadError::Compile { source: wasmtime::format_err!("{e}") })?;
        Ok(net::imports_http(names.iter().map(String::as_str)))
    }

    /// Checks that `component` targets the keel tool world and imports only granted
    /// interfaces (the control interfaces too when it is `trusted` with them), and links it.
    pub fn prepare(&self, component: &Component, trusted: bool) -> Result<Prepared, LoadError> {
        let core = self.core()?;
        let ty = component.component_type();
        check_granted(ty.imports(&core.engine).map(|(name, _)| name), trusted)?;
        let linker = if trusted { &core.control_linker } else { &core.linker };
        let pre = linker.instantiate_pre(component).map_err(|source| LoadError::Link {
            missing: imports::unlinked(linker, component),
            source,
        })?;
        let exports: Vec<String> = ty.exports(&core.engine).map(|(n, _)| n.to_string()).collect();
        let wrong = |what: &str| LoadError::WrongWorld {
            reason: format!(
                "{what}; it exports [{}]",
                if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") }
            ),
        };
        let iface = component
            .get_export_index(None, TOOLS_INTERFACE)
            .ok_or_else(|| wrong(&format!("it does not export `{TOOLS_INTERFACE}`")))?;
        let describe = component
            .get_export_index(Some(&iface), "describe")
            .ok_or_else(|| wrong("its tools interface has no `describe` function"))?;
        let invoke = component
            .get_export_index(Some(&iface), "invoke")
            .ok_or_else(|| wrong("its tools interface has no `invoke` function"))?;
        Ok(Prepared { pre, describe, invoke })
    }

    /// Calls `describe` on a fresh instance, with `budget` and no filesystem.
    pub async fn describe(&self, prepared: &Prepared, budget: &Budget) -> CallReport<Vec<RawSpec>> {
        let _slot = self.slots.acquire().await;
        run::describe(prepared.pre.engine(), prepared, budget, &self.descriptors).await
    }

    /// Runs `call` on a fresh instance of `prepared`: under its budget, seeing only its
    /// grants, with the filesystem guarded by its policy and its HTTP requests checked against
    /// its egress plan. Never panics on guest behaviour: every failure is a typed
    /// [`CallError`].
    pub async fn invoke(&self, prepared: &Prepared, call: Invocation<'_>) -> CallReport<String> {
        let _slot = self.slots.acquire().await;
        run::invoke(prepared.pre.engine(), prepared, call, &self.descriptors).await
    }
}
