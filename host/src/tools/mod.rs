//! ToolService: the tool catalog and the governance chain of one call.
//!
//! Owns which components are installed and pinned (by sha256), the tools they describe, and
//! the order of checks every call goes through, each a named step:
//! [`resolve`](ToolService::resolve) → [`check_input`](ToolService::check_input) →
//! lease → change snapshot → sandbox run → change set. It does not own sessions, goals or
//! approvals (later owners call it), and it does not run guest code itself (the
//! [`Sandbox`] does).

pub mod catalog;
pub mod changes;
pub mod install;
pub mod lease;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rusqlite::Connection;

use crate::home::Home;
use crate::sandbox::{
    Access, Budget, CallError, CallReport, CancelToken, FsPolicy, Grant, GrantError, LoadError,
    LoadSource, Prepared, Sandbox, SandboxLimits,
};
use crate::session::ConsumedApproval;
use crate::store::{self, StoreError};

pub use crate::policy::{Effect, Policy, PolicyDecision};
pub use catalog::{ComponentRecord, ToolRecord};
pub use changes::ChangeSet;
pub use lease::{LeaseBusy, LeaseRequest, Leases};

/// Budget of the `describe` call made at install time.
pub fn describe_budget() -> Budget {
    Budget {
        fuel: 2_000_000_000,
        timeout: Duration::from_secs(10),
        memory: 128 << 20,
        ..Budget::default()
    }
}

/// Why a tool operation could not be carried out (before or around the sandbox run; failures
/// inside the run are [`CallError`]s in the [`CallOutcome`]).
#[derive(Debug, thiserror::Error)]
pub enum ToolServiceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Grant(#[from] GrantError),
    #[error(transparent)]
    Busy(#[from] LeaseBusy),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "`{name}` is not a valid component name: use lowercase letters, digits, `-` and `_`, \
         starting with a letter (pass --name NAME)"
    )]
    InvalidComponentName { name: String },
    #[error("no tool or component named `{name}` is installed; installed tools: {available}")]
    NotInstalled { name: String, available: String },
    #[error("`{name}` is a first-party component and cannot be removed")]
    Builtin { name: String },
    #[error(
        "`{name}` is the name of a first-party component; another component cannot take or \
         replace it (install it under another name with --name NAME)"
    )]
    Reserved { name: String },
    #[error(
        "a component named `{name}` is already installed (sha256:{digest}); replacing it needs \
         `keel tool install --upgrade`, which shows what changes"
    )]
    AlreadyInstalled { name: String, digest: String },
    #[error("the component's `describe` call failed: {error}")]
    Describe { error: CallError },
    #[error("the component's tool descriptions are not acceptable:\n  - {}", .problems.join("\n  - "))]
    InvalidSpecs { problems: Vec<String> },
    #[error("tool names already belong to other components: {}; remove those first or rename the tools",
        .clashes.iter().map(|(t, c)| format!("`{t}` (component `{c}`)")).collect::<Vec<_>>().join(", "))]
    NameClash { clashes: Vec<(String, String)> },
    #[error("input for `{tool}` is rejected: {}", .problems.join("; "))]
    InvalidInput { tool: String, problems: Vec<String> },
    #[error("the tool `{name}` is not loaded in this session; loaded tools: {loaded}")]
    NotLoaded { name: String, loaded: String },
    #[error("{reason}")]
    PolicyDenied { reason: String },
    #[error("{reason}; the call needs an approval")]
    NeedsApproval { reason: String },
    #[error(
        "approval `{unit}` was given for another tool, component or input than this call's; \
         the call needs its own approval"
    )]
    ApprovalNotBound { unit: String },
    #[error("{what} {asked} exceeds the host's ceiling of {ceiling}")]
    OverCeiling { what: &'static str, asked: u64, ceiling: u64 },
}

impl ToolServiceError {
    /// A stable, machine-readable name of the error's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Store(_) => "store",
            Self::Load(_) => "load",
            Self::Config(_) => "config",
            Self::Grant(_) => "grant",
            Self::Busy(_) => "busy",
            Self::Io { .. } => "io",
            Self::InvalidComponentName { .. } => "invalid_name",
            Self::NotInstalled { .. } => "not_installed",
            Self::Builtin { .. } => "builtin",
            Self::Reserved { .. } => "reserved_name",
            Self::AlreadyInstalled { .. } => "already_installed",
            Self::Describe { .. } => "describe_failed",
            Self::InvalidSpecs { .. } => "invalid_specs",
            Self::NameClash { .. } => "name_clash",
            Self::InvalidInput { .. } => "invalid_input",
            Self::OverCeiling { .. } => "over_ceiling",
            Self::NotLoaded { .. } => "unknown_tool",
            Self::PolicyDenied { .. } => "denied",
            Self::NeedsApproval { .. } => "needs_approval",
            Self::ApprovalNotBound { .. } => "approval_not_bound",
        }
    }
}

/// How `install` treats a component name that is already taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallMode {
    /// A new component: a name already installed is refused (the same file again is fine).
    New,
    /// Replaces the installed component of that name (`keel tool install --upgrade`).
    Upgrade,
    /// A first-party component, installed or updated by keel itself.
    Builtin,
}

/// What `install` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InstallReport {
    pub component: ComponentRecord,
    pub tools: Vec<ToolRecord>,
    /// Digest of the version this one replaced, if any.
    pub replaced: Option<String>,
    /// What an upgrade changed, tool by tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeDiff>,
    pub compile_ms: f64,
}

/// What an upgrade changes in a component's tools (a changed description, schema, effect
/// class or idempotence is a changed spec, and needs fresh approvals).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct UpgradeDiff {
    pub old_digest: String,
    pub new_digest: String,
    pub changed: Vec<String>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

/// Compares the tools of two versions of a component.
fn upgrade_diff(
    old_digest: &str,
    new_digest: &str,
    old: &[ToolRecord],
    new: &[ToolRecord],
) -> UpgradeDiff {
    let mut d = UpgradeDiff {
        old_digest: old_digest.to_string(),
        new_digest: new_digest.to_string(),
        ..UpgradeDiff::default()
    };
    for t in new {
        match old.iter().find(|o| o.name == t.name) {
            None => d.added.push(t.name.clone()),
            Some(o) if o.spec_digest != t.spec_digest => d.changed.push(t.name.clone()),
            Some(_) => {}
        }
    }
    d.removed = old
        .iter()
        .filter(|o| !new.iter().any(|t| t.name == o.name))
        .map(|o| o.name.clone())
        .collect();
    d
}

/// One call to make.
#[derive(Debug, Clone)]
pub struct CallRequest<'a> {
    pub tool: &'a str,
    /// JSON object text.
    pub input: &'a str,
    pub grants: &'a [Grant],
    pub budget: Budget,
    pub cancel: Option<CancelToken>,
    /// When set, only these tools may be called (the tools loaded in a session).
    pub loaded: Option<&'a [String]>,
    /// When set, the policy the call must pass.
    pub policy: Option<&'a Policy>,
    /// The approval consumed for this call, when the policy asks. It must bind this tool,
    /// the component that runs and this exact input.
    pub approval: Option<&'a ConsumedApproval>,
}

/// What a call produced.
#[derive(Debug, Clone)]
pub struct CallOutcome {
    pub tool: ToolRecord,
    pub report: CallReport<serde_json::Value>,
    /// Changes in the read-write grants (calls that may write only).
    pub changes: Option<ChangeSet>,
}

/// A resolved tool: its record and the digest of the component that provides it.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub record: ToolRecord,
    pub digest: String,
}

/// The catalog at one version, in memory and immutable: the installed tools, and their
/// serialized schemas per loaded-tool list (built on first use). A step resolves its calls
/// against the catalog its request was assembled from, so the model's schemas and the
/// components that run are the same.
#[derive(Debug)]
pub struct Catalog {
    version: i64,
    tools: HashMap<String, Arc<Resolved>>,
    /// Every kept version of every tool, by (name, component digest).
    versions: HashMap<(String, String), Arc<Resolved>>,
    /// Serialized `tools` arrays by loaded-tool list (each with the digest it resolves to).
    tools_json: Mutex<HashMap<ResolvedList, Option<Arc<str>>>>,
}

/// Tool names with the component digest each resolves to.
type ResolvedList = Vec<(String, String)>;

/// A session's pins: the component digest it loaded, by tool name.
pub type ToolPins = std::collections::BTreeMap<String, String>;

impl Catalog {
    /// The installed tool `name`, if any.
    pub fn get(&self, name: &str) -> Option<Arc<Resolved>> {
        self.tools.get(name).cloned()
    }

    /// The version of `name` a session with `pins` runs: the pinned component digest when
    /// the tool is pinned (kept even after an upgrade), else the installed one.
    pub fn get_pinned(&self, name: &str, pins: &ToolPins) -> Option<Arc<Resolved>> {
        let current = self.tools.get(name);
        match pins.get(name) {
            Some(d) if current.is_none_or(|c| &c.digest != d) => {
                self.versions.get(&(name.to_string(), d.clone())).cloned()
            }
            _ => current.cloned(),
        }
    }

    /// The loaded tools as the model sees them — the OpenAI `tools` array (name, description,
    /// input schema), serialized once per tool list. `None` when no loaded tool is installed.
    pub fn tools_json(&self, loaded: &[String]) -> Option<Arc<str>> {
        self.tools_json_pinned(loaded, &ToolPins::new())
    }

    /// [`tools_json`](Self::tools_json) for a session with `pins`: each tool as the version
    /// the session runs.
    pub fn tools_json_pinned(&self, loaded: &[String], pins: &ToolPins) -> Option<Arc<str>> {
        let resolved: Vec<Arc<Resolved>> =
            loaded.iter().filter_map(|name| self.get_pinned(name, pins)).collect();
        let key: Vec<(String, String)> =
            resolved.iter().map(|r| (r.record.name.clone(), r.digest.clone())).collect();
        let mut memo = self.tools_json.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(hit) = memo.get(&key) {
            return hit.clone();
        }
        let items: Vec<serde_json::Value> = resolved
            .iter()
            .map(|r| {
                serde_json::json!({"type": "function", "function": {
                    "name": r.record.name, "description": r.record.description,
                    "parameters": r.record.input_schema}})
            })
            .collect();
        let json: Option<Arc<str>> =
            (!items.is_empty()).then(|| serde_json::Value::Array(items).to_string().into());
        memo.insert(key, json.clone());
        json
    }

    /// The digests `loaded` resolves to now, for the tools that are installed: what a session
    /// pins when it loads them.
    pub fn current_pins(&self, loaded: &[String]) -> ToolPins {
        loaded
            .iter()
            .filter_map(|n| self.tools.get(n).map(|r| (n.clone(), r.digest.clone())))
            .collect()
    }
}

/// The newest catalog this service has seen. Its version is checked in one of two ways: on
/// this service's own connection, only when the database's `data_version` moved (another
/// connection committed — usually a session's commit, which leaves the catalog as it was);
/// or inside a caller's read transaction ([`ToolService::catalog_in`], a step's assembly).
/// Catalog versions only grow, so a newer catalog is never replaced by an older one; this
/// service's own writes clear it.
#[derive(Default)]
struct CatalogCache {
    /// `PRAGMA data_version` of the own connection when the version was last read on it.
    data_version: Option<i64>,
    current: Option<Arc<Catalog>>,
    /// Times the catalog was loaded from the database.
    loads: u64,
}

/// The ToolService of one keel home.
pub struct ToolService {
    home: Home,
    sandbox: Arc<Sandbox>,
    db: Mutex<Connection>,
    /// The store's durability, from the home's settings (read once, when the service opens).
    catalog: Mutex<CatalogCache>,
    prepared: Mutex<HashMap<String, Arc<Prepared>>>,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
    leases: Leases,
}

fn now() -> String {
    let secs =
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format!("{secs}")
}

impl ToolService {
    /// Opens the home's catalog and sandbox, installing or upgrading the first-party tools
    /// (their compile progress goes to `progress`).
    pub async fn open(
        home: Home,
        limits: SandboxLimits,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<Self, ToolServiceError> {
        let sync = crate::config::synchronous(&home)?;
        let conn = store::open_with(&home.database(), sync)?;
        let sandbox = Arc::new(Sandbox::new(&home.cache_dir(), limits)?);
        let service = Self {
            home,
            sandbox,
            db: Mutex::new(conn),
            catalog: Mutex::new(CatalogCache::default()),
            prepared: Mutex::new(HashMap::new()),
            validators: Mutex::new(HashMap::new()),
            leases: Leases::default(),
        };
        for (name, bytes) in crate::builtin::BUILTIN_COMPONENTS {
            let digest = crate::sandbox::sha256_hex(bytes);
            let current = catalog::component(&service.db(), name)?;
            if current.is_some_and(|c| c.digest == digest) {
                continue;
            }
            progress(&format!("installing first-party tool component `{name}` (compiling…)"));
            service.install(bytes, name, "builtin", true).await?;
        }
        Ok(service)
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    pub fn home(&self) -> &Home {
        &self.home
    }

    /// Validates and installs a component: it must be a component (not a core module), target
    /// the keel tool world, import only granted interfaces, and describe well-formed tools with
    /// valid JSON Schemas whose names no other component uses. Replaces an earlier version of
    /// the same component name.
    pub async fn install(
        &self,
        bytes: &[u8],
        name: &str,
        source: &str,
        builtin: bool,
    ) -> Result<InstallReport, ToolServiceError> {
        let mode = if builtin { InstallMode::Builtin } else { InstallMode::New };
        self.install_as(bytes, name, source, mode).await
    }

    /// [`install`](Self::install) with an explicit [`InstallMode`]: the names of first-party
    /// components are reserved to them, and replacing an installed component needs
    /// [`InstallMode::Upgrade`].
    pub async fn install_as(
        &self,
        bytes: &[u8],
        name: &str,
        source: &str,
        mode: InstallMode,
    ) -> Result<InstallReport, ToolServiceError> {
        let builtin = mode == InstallMode::Builtin;
        if !install::valid_component_name(name) {
            return Err(ToolServiceError::InvalidComponentName { name: name.to_string() });
        }
        if !builtin && crate::builtin::BUILTIN_COMPONENTS.iter().any(|(n, _)| *n == name) {
            return Err(ToolServiceError::Reserved { name: name.to_string() });
        }
        let digest = crate::sandbox::sha256_hex(bytes);
        let existing = catalog::component(&self.db(), name)?;
        if mode == InstallMode::New
            && let Some(old) = &existing
            && old.digest != digest
        {
            return Err(ToolServiceError::AlreadyInstalled {
                name: name.to_string(),
                digest: old.digest.clone(),
            });
        }
        let limit = self.sandbox.limits().max_component_bytes;
        if bytes.len() as u64 > limit {
            return Err(LoadError::TooLarge { size: bytes.len() as u64, limit }.into());
        }
        crate::sandbox::check_header(bytes)?;
        let started = std::time::Instant::now();
        self.sandbox.check_imports(bytes)?;
        let component = self.sandbox.compile(bytes)?;
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        let prepared = Arc::new(self.sandbox.prepare(&component)?);
        let report = self.sandbox.describe(&prepared, &describe_budget()).await;
        let specs = report.result.map_err(|error| ToolServiceError::Describe { error })?;
        let tools = install::validate_specs(name, specs)
            .map_err(|problems| ToolServiceError::InvalidSpecs { problems })?;
        let names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
        let clashes = catalog::clashes(&self.db(), name, &names)?;
        if !clashes.is_empty() {
            return Err(ToolServiceError::NameClash { clashes });
        }
        let path = self.home.component_path(&digest);
        if !path.exists() {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            let io = |context: &str| {
                let context = context.to_string();
                move |source| ToolServiceError::Io { context, source }
            };
            std::fs::write(&tmp, bytes).map_err(io("writing the component file"))?;
            std::fs::rename(&tmp, &path).map_err(io("publishing the component file"))?;
        }
        self.sandbox.cache_artifact(&component, &digest)?;
        let record = ComponentRecord {
            name: name.to_string(),
            digest: digest.clone(),
            size: bytes.len() as u64,
            source: source.to_string(),
            builtin,
            installed_at: now(),
        };
        let (replaced, upgrade) = {
            let mut db = self.db();
            let old = catalog::component(&db, name)?.filter(|c| c.digest != digest);
            let upgrade = match &old {
                Some(o) => {
                    Some(upgrade_diff(&o.digest, &digest, &catalog::tools_of(&db, name)?, &tools))
                }
                None => None,
            };
            catalog::put(&mut db, &record, &tools)?;
            (old.map(|o| o.digest), upgrade)
        };
        // The replaced version's file stays: sessions that loaded it keep running it until
        // they are told to upgrade (`keel session upgrade-tools`).
        self.invalidate_catalog();
        self.prepared.lock().unwrap_or_else(PoisonError::into_inner).insert(digest, prepared);
        Ok(InstallReport { component: record, tools, replaced, upgrade, compile_ms })
    }

    fn forget_file(&self, digest: &str) -> Result<(), ToolServiceError> {
        if !catalog::digest_in_use(&self.db(), digest)? {
            let _ = std::fs::remove_file(self.home.component_path(digest));
        }
        Ok(())
    }

    /// Every installed component.
    pub fn components(&self) -> Result<Vec<ComponentRecord>, ToolServiceError> {
        Ok(catalog::components(&self.db())?)
    }

    /// Every installed tool.
    pub fn tools(&self) -> Result<Vec<ToolRecord>, ToolServiceError> {
        Ok(catalog::tools(&self.db())?)
    }

    /// The component named `name`, or the component of the tool named `name`.
    pub fn component_for(
        &self,
        name: &str,
    ) -> Result<(ComponentRecord, Vec<ToolRecord>), ToolServiceError> {
        let db = self.db();
        let component = match catalog::component(&db, name)? {
            Some(c) => Some(c),
            None => match catalog::tool(&db, name)? {
                Some(t) => catalog::component(&db, &t.component)?,
                None => None,
            },
        };
        let Some(component) = component else {
            drop(db);
            return Err(self.not_installed(name));
        };
        let tools = catalog::tools_of(&db, &component.name)?;
        Ok((component, tools))
    }

    /// The error for a tool or component `name` that is not installed (it lists those that
    /// are).
    pub fn not_installed(&self, name: &str) -> ToolServiceError {
        let available = self
            .tools()
            .map(|t| t.into_iter().map(|t| t.name).collect::<Vec<_>>().join(", "))
            .unwrap_or_default();
        ToolServiceError::NotInstalled { name: name.to_string(), available }
    }

    /// Removes a component (by its name or one of its tools' names).
    pub fn remove(&self, name: &str) -> Result<(ComponentRecord, Vec<String>), ToolServiceError> {
        let (component, _) = self.component_for(name)?;
        if component.builtin {
            return Err(ToolServiceError::Builtin { name: component.name });
        }
        let (removed, digests) = catalog::remove(&mut self.db(), &component.name)?;
        self.invalidate_catalog();
        self.forget_file(&component.digest)?;
        for d in &digests {
            self.forget_file(d)?;
        }
        Ok((component, removed))
    }

    fn invalidate_catalog(&self) {
        let mut cache = self.catalog.lock().unwrap_or_else(PoisonError::into_inner);
        cache.data_version = None;
        cache.current = None;
    }

    /// Loads the catalog at the version `c` sees (inside `c`'s transaction, if it has one).
    fn load_catalog(c: &Connection, version: i64) -> Result<Catalog, ToolServiceError> {
        let digests: HashMap<String, String> =
            catalog::components(c)?.into_iter().map(|c| (c.name, c.digest)).collect();
        let tools = catalog::tools(c)?
            .into_iter()
            .filter_map(|record| {
                let digest = digests.get(&record.component)?.clone();
                Some((record.name.clone(), Arc::new(Resolved { record, digest })))
            })
            .collect();
        let versions = catalog::tool_versions(c)?
            .into_iter()
            .map(|(record, digest)| {
                ((record.name.clone(), digest.clone()), Arc::new(Resolved { record, digest }))
            })
            .collect();
        Ok(Catalog { version, tools, versions, tools_json: Mutex::default() })
    }

    /// Keeps `loaded` as the current catalog unless a newer one is there already; returns the
    /// newest.
    fn keep_newest(&self, loaded: Catalog) -> Arc<Catalog> {
        let mut cache = self.catalog.lock().unwrap_or_else(PoisonError::into_inner);
        cache.loads += 1;
        match &cache.current {
            Some(current) if current.version >= loaded.version => current.clone(),
            _ => {
                let loaded = Arc::new(loaded);
                cache.current = Some(loaded.clone());
                loaded
            }
        }
    }

    /// The current catalog, brought up to date on this service's connection: one cheap read
    /// when another connection committed since the last check, a reload only when the
    /// catalog itself changed.
    pub fn catalog(&self) -> Result<Arc<Catalog>, ToolServiceError> {
        let db = self.db();
        let data_version = catalog::data_version(&db)?;
        {
            let cache = self.catalog.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(current) = &cache.current
                && cache.data_version == Some(data_version)
            {
                return Ok(current.clone());
            }
        }
        // The version, and the catalog if it changed, from one read transaction: an install
        // committing meanwhile is seen whole or not at all (and moves `data_version` again).
        let tx = db.unchecked_transaction().map_err(StoreError::from)?;
        let data_version = catalog::data_version(&tx)?;
        let version = catalog::catalog_version(&tx)?;
        let current = {
            let mut cache = self.catalog.lock().unwrap_or_else(PoisonError::into_inner);
            cache.data_version = Some(data_version);
            cache.current.clone().filter(|c| c.version >= version)
        };
        let current = match current {
            Some(current) => current,
            None => self.keep_newest(Self::load_catalog(&tx, version)?),
        };
        // A read transaction: ending it cannot lose anything.
        tx.commit().map_err(StoreError::from)?;
        Ok(current)
    }

    /// The catalog as of `c`'s read transaction — a session's snapshot, so that a step's
    /// request and its calls see the catalog and the session's facts from one commit. Reads
    /// one row on `c` and nothing on this service's connection (whose lock every session's
    /// step would otherwise take); reloads (from `c`) only when the catalog changed.
    pub fn catalog_in(&self, c: &Connection) -> Result<Arc<Catalog>, ToolServiceError> {
        let version = catalog::catalog_version(c)?;
        {
            let cache = self.catalog.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(current) = cache.current.as_ref().filter(|c| c.version >= version) {
                return Ok(current.clone());
            }
        }
        Ok(self.keep_newest(Self::load_catalog(c, version)?))
    }

    /// How many times this service loaded the catalog from the database (for tests).
    #[doc(hidden)]
    pub fn catalog_loads(&self) -> u64 {
        self.catalog.lock().unwrap_or_else(PoisonError::into_inner).loads
    }

    /// Step 1: the tool must be installed. Served from memory while the catalog is unchanged.
    pub fn resolve(&self, tool: &str) -> Result<Arc<Resolved>, ToolServiceError> {
        self.catalog()?.get(tool).ok_or_else(|| self.not_installed(tool))
    }

    /// Step 1 for a session: the version of `tool` the session pinned when it loaded it
    /// (kept after an upgrade), or the installed one if it is not pinned.
    pub fn resolve_pinned(
        &self,
        tool: &str,
        pins: &ToolPins,
    ) -> Result<Arc<Resolved>, ToolServiceError> {
        self.catalog()?.get_pinned(tool, pins).ok_or_else(|| self.not_installed(tool))
    }

    /// The component digests `tools` resolve to now (installed tools only).
    pub fn current_pins(&self, tools: &[String]) -> Result<ToolPins, ToolServiceError> {
        Ok(self.catalog()?.current_pins(tools))
    }

    /// Step 2: the input must be a JSON object matching the tool's input schema; the error
    /// names each failing field.
    pub fn check_input(
        &self,
        tool: &ToolRecord,
        input: &str,
    ) -> Result<serde_json::Value, ToolServiceError> {
        let invalid =
            |problems| ToolServiceError::InvalidInput { tool: tool.name.clone(), problems };
        let value: serde_json::Value = serde_json::from_str(input)
            .map_err(|e| invalid(vec![format!("input is not valid JSON: {e}")]))?;
        let validator = {
            let mut cache = self.validators.lock().unwrap_or_else(PoisonError::into_inner);
            match cache.get(&tool.spec_digest) {
                Some(v) => v.clone(),
                None => {
                    let v =
                        Arc::new(jsonschema::validator_for(&tool.input_schema).map_err(|e| {
                            invalid(vec![format!(
                                "the tool's input schema cannot be compiled: {e}"
                            )])
                        })?);
                    cache.insert(tool.spec_digest.clone(), v.clone());
                    v
                }
            }
        };
        let problems: Vec<String> = validator
            .iter_errors(&value)
            .take(10)
            .map(|e| {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() { "input".to_string() } else { format!("field `{at}`") };
                format!("{at}: {e}")
            })
            .collect();
        if problems.is_empty() { Ok(value) } else { Err(invalid(problems)) }
    }

    /// Loads (from memory, the artifact cache, or by compiling) the component with `digest`.
    pub fn prepared(
        &self,
        digest: &str,
    ) -> Result<(Arc<Prepared>, Option<LoadSource>), ToolServiceError> {
        if let Some(p) = self.prepared.lock().unwrap_or_else(PoisonError::into_inner).get(digest) {
            return Ok((p.clone(), None));
        }
        let (component, source) = self.sandbox.load(digest, &self.home.component_path(digest))?;
        let prepared = Arc::new(self.sandbox.prepare(&component)?);
        self.prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(digest.to_string(), prepared.clone());
        Ok((prepared, Some(source)))
    }

    /// The loaded tools as the model sees them, from the current catalog
    /// ([`Catalog::tools_json`]). `None` when no loaded tool is installed, or when the catalog
    /// cannot be read (no tools rather than stale ones).
    pub fn tools_json(&self, loaded: &[String]) -> Option<Arc<str>> {
        self.catalog().ok()?.tools_json(loaded)
    }

    /// Runs one governed call: resolve → input schema → budget ceiling → grants → lease →
    /// change snapshot → sandbox → change set.
    pub async fn call(&self, req: CallRequest<'_>) -> Result<CallOutcome, ToolServiceError> {
        self.call_as(req, None).await
    }

    /// Like [`call`](Self::call), with the tool already resolved by the caller — from the
    /// [`Catalog`] its step was assembled from — when `resolved` names the requested tool.
    pub async fn call_as(
        &self,
        req: CallRequest<'_>,
        resolved: Option<Arc<Resolved>>,
    ) -> Result<CallOutcome, ToolServiceError> {
        if let Some(loaded) = req.loaded
            && !loaded.iter().any(|t| t == req.tool)
        {
            return Err(ToolServiceError::NotLoaded {
                name: req.tool.to_string(),
                loaded: loaded.join(", "),
            });
        }
        let resolved = match resolved.filter(|r| r.record.name == req.tool) {
            Some(r) => r,
            None => self.resolve(req.tool)?,
        };
        let tool = &resolved.record;
        self.check_input(tool, req.input)?;
        match req.policy.map(|p| p.decide(&tool.name, tool.effect)) {
            Some(PolicyDecision::Deny(reason)) => {
                return Err(ToolServiceError::PolicyDenied { reason });
            }
            Some(PolicyDecision::Ask(reason)) => match req.approval {
                None => return Err(ToolServiceError::NeedsApproval { reason }),
                Some(a) if !a.binds(&tool.name, &resolved.digest, req.input) => {
                    return Err(ToolServiceError::ApprovalNotBound { unit: a.unit().to_string() });
                }
                Some(_) => {}
            },
            Some(PolicyDecision::Allow) | None => {}
        }
        let ceiling = self.sandbox.limits().max_memory;
        if req.budget.memory > ceiling {
            return Err(ToolServiceError::OverCeiling {
                what: "memory budget",
                asked: req.budget.memory,
                ceiling,
            });
        }
        Grant::check_disjoint(req.grants)?;
        let writes = tool.effect != Effect::ReadOnly;
        let requests: Vec<LeaseRequest> = req
            .grants
            .iter()
            .map(|g| LeaseRequest {
                dir: g.host.clone(),
                exclusive: writes && g.access == Access::Rw,
            })
            .collect();
        let _lease = match self.leases.acquire(requests.clone(), Duration::ZERO) {
            Ok(l) => l,
            Err(_) => {
                let leases = self.leases.clone();
                let wait = req.budget.timeout;
                tokio::task::spawn_blocking(move || leases.acquire(requests, wait)).await.map_err(
                    |e| ToolServiceError::Io {
                        context: "waiting for the workspace lease".into(),
                        source: std::io::Error::other(e.to_string()),
                    },
                )??
            }
        };
        let (prepared, _) = self.prepared(&resolved.digest)?;
        let fs = FsPolicy {
            read_only: !writes,
            remove_existing: tool.effect == Effect::Destructive,
            write_quota: req.budget.write_quota,
            max_created: req.budget.max_files_created,
        };
        let track = writes && req.grants.iter().any(|g| g.access == Access::Rw);
        // The walks and hashing are blocking and bounded: a small workspace is walked here,
        // a large one (or much to hash) off the async threads; both stop when the call is
        // cancelled.
        let grants: Arc<[Grant]> = req.grants.into();
        let before = match track {
            true => match changes::snapshot_inline(&grants, req.cancel.as_ref()) {
                Some(snap) => Some(snap),
                None => {
                    let (g, c) = (grants.clone(), req.cancel.clone());
                    tokio::task::spawn_blocking(move || changes::snapshot(&g, c.as_ref()))
                        .await
                        .ok()
                }
            },
            false => None,
        };
        let report = self
            .sandbox
            .invoke(
                &prepared,
                &tool.name,
                req.input,
                req.grants,
                fs,
                &req.budget,
                req.cancel.as_ref(),
            )
            .await;
        let changes = match before {
            Some(before) => {
                let inline =
                    changes::snapshot_inline(&grants, req.cancel.as_ref()).filter(|after| {
                        changes::bytes_to_hash(&before, after) <= changes::INLINE_HASH_BYTES
                    });
                match inline {
                    Some(after) => {
                        Some(changes::diff(&before, &after, &grants, req.cancel.as_ref()))
                    }
                    None => {
                        let (g, c) = (grants.clone(), req.cancel.clone());
                        let set = tokio::task::spawn_blocking(move || {
                            let after = changes::snapshot(&g, c.as_ref());
                            changes::diff(&before, &after, &g, c.as_ref())
                        })
                        .await;
                        Some(set.unwrap_or_default())
                    }
                }
            }
            // A snapshot that could not be taken: nothing can be said of the changes.
            None if track => Some(ChangeSet::default()),
            None => None,
        };
        let report = CallReport {
            result: report.result.and_then(|text| {
                serde_json::from_str(&text)
                    .map_err(|e| CallError::InvalidOutput { reason: e.to_string() })
            }),
            stdout: report.stdout,
            stderr: report.stderr,
            logs: report.logs,
            dropped_logs: report.dropped_logs,
            progress: report.progress,
            fuel_used: report.fuel_used,
            memory_peak: report.memory_peak,
            duration: report.duration,
            fs: report.fs,
        };
        Ok(CallOutcome { tool: tool.clone(), report, changes })
    }
}
