//! ToolService: the tool catalog and the governance chain of one call.
//!
//! Owns which components are installed and pinned (by sha256), the tools they describe, and
//! the order of checks every call goes through, each a named step:
//! [`resolve`](ToolService::resolve) → [`check_input`](ToolService::check_input) →
//! lease → change snapshot → sandbox run → change set. It does not own sessions, goals or
//! approvals (later owners call it), and it does not run guest code itself (the
//! [`Sandbox`] does).

mod approval;
mod call;
pub mod catalog;
pub mod changes;
mod error;
pub mod install;
pub mod lease;
pub mod mcp;
pub mod result;
mod source;
pub mod trust;
mod view;
pub mod widening;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::sql::Connection;

use crate::home::Home;
use crate::sandbox::{Prepared, Sandbox, SandboxLimits};
use crate::store;

pub use crate::policy::{Effect, Policy, PolicyDecision};
pub use approval::ConsumedApproval;
pub use call::{CallOutcome, CallRequest};
pub use catalog::{
    ComponentRecord, ToolRecord, ToolRef, ToolSetRef, recall_in, tool as tool_in, toolset_in,
};
pub use changes::{ChangeSet, Kept};
pub use error::ToolServiceError;
#[cfg(any(test, feature = "internals"))]
pub use install::FILE_ARTIFACTS_KEPT;
pub use install::{
    FileInspection, InstallMode, InstallReport, Origin, now as install_time, };
pub use lease::{LeaseBusy, LeaseRequest, Leases};
pub use source::{HostCall, HostFuture, HostTool, SourceKind, ToolSource};
#[cfg(any(test, feature = "internals"))]
pub use view::MINIMAL_DESCRIPTION;
pub use view::{
    Catalog, Resolved, SchemaForm,
    ToolPins, };

/// The ToolService of one keel home.
pub struct ToolService {
    home: Home,
    sandbox: Arc<Sandbox>,
    db: Mutex<Connection>,
    /// Where `db` connects to again when a PostgreSQL server dropped it (a restart).
    location: store::Location,
    catalog: Mutex<view::CatalogCache>,
    prepared: Mutex<HashMap<String, Arc<Prepared>>>,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
    leases: Leases,
    hosts: Mutex<HostTools>,
    /// Digests of the components trusted with the control interfaces: the first-party
    /// components and those an admin trusts (`[tools] control_trusted` in keel.toml).
    control_trusted: std::collections::BTreeSet<String>,
    /// This process's connections to external MCP servers.
    mcp: Arc<crate::tools::mcp::client::Pool>,
    /// How much of what calls change is kept to undo them (`[undo]` in keel.toml).
    undo: crate::config::UndoLimits,
}

/// The host tools registered in this process, and a generation that grows with each change
/// (a cached catalog built before a registration is not reused after it).
#[derive(Default)]
struct HostTools {
    tools: std::collections::BTreeMap<String, Arc<dyn HostTool>>,
    generation: u64,
}

impl ToolService {
    /// Opens the home's catalog and sandbox, installing or upgrading the first-party tools
    /// (their compile progress goes to `progress`).
    pub async fn open(
        home: Home,
        limits: SandboxLimits,
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<Self, ToolServiceError> {
        let location = crate::config::store_location(&home)?;
        let conn = store::connect(&location)?;
        let sandbox = Arc::new(Sandbox::new(&home.cache_dir(), limits)?);
        let undo = crate::config::undo_limits(&home)?;
        let admin = crate::config::read(&home)?.tools.unwrap_or_default().control_trusted;
        let builtin: Vec<(&str, &[u8], String)> = crate::builtin::BUILTIN_COMPONENTS
            .iter()
            .map(|(name, bytes, digest)| (*name, *bytes, (*digest).to_string()))
            .collect();
        let control_trusted = builtin
            .iter()
            .map(|(_, _, digest)| digest.clone())
            .chain(admin.into_iter().map(|d| d.trim().to_ascii_lowercase()))
            .collect();
        let service = Self {
            home,
            sandbox,
            db: Mutex::new(conn),
            location,
            catalog: Mutex::new(view::CatalogCache::default()),
            prepared: Mutex::new(HashMap::new()),
            validators: Mutex::new(HashMap::new()),
            leases: Leases::default(),
            hosts: Mutex::default(),
            control_trusted,
            mcp: Arc::default(),
            undo,
        };
        // Hosts that start at once on one database install one after another: each sees
        // what the one before installed, and none inserts a row another just inserted.
        let missing = |service: &Self| -> Result<bool, ToolServiceError> {
            for (name, _, digest) in &builtin {
                let current = catalog::component(&service.db(), name)?;
                if current.is_none_or(|c| c.digest != *digest) {
                    return Ok(true);
                }
            }
            Ok(false)
        };
        if missing(&service)? {
            store::lock_first_start(&service.db())?;
            let installed = service.install_builtins(&builtin, progress).await;
            let unlocked = store::unlock_first_start(&service.db());
            installed?;
            unlocked?;
        }
        Ok(service)
    }

    /// Installs the first-party components the catalog lacks or holds at other bytes (under
    /// the first-start lock).
    async fn install_builtins(
        &self,
        builtin: &[(&str, &[u8], String)],
        progress: &(dyn Fn(&str) + Sync),
    ) -> Result<(), ToolServiceError> {
        for (name, bytes, digest) in builtin {
            let current = catalog::component(&self.db(), name)?;
            if current.is_some_and(|c| c.digest == *digest) {
                continue;
            }
            progress(&format!("installing first-party tool component `{name}` (compiling…)"));
            self.install(bytes, name, "builtin", true).await?;
        }
        Ok(())
    }

    /// Whether the component with `digest` is trusted with the control interfaces
    /// (`keel:control/plan`).
    pub fn trusted_with_control(&self, digest: &str) -> bool {
        self.control_trusted.contains(digest)
    }

    /// This service's connection; on PostgreSQL, made again first when the server dropped it
    /// (after a restart), so that calls work again without restarting keel.
    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        let mut db = self.db.lock().unwrap_or_else(PoisonError::into_inner);
        if db.pg().is_some_and(|c| c.is_closed()) {
            match store::connect(&self.location) {
                Ok(fresh) => *db = fresh,
                Err(e) => tracing::warn!("the tool catalog cannot reach the database: {e}"),
            }
        }
        db
    }

    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    pub fn home(&self) -> &Home {
        &self.home
    }
}
