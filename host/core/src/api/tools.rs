//! The use cases of the tool catalog: install, read and remove components, host tools, and
//! an admin's governed call outside any session.

use super::*;

impl Harness {
    /// Validates, compiles and installs a component as `name` (`source` says where it came
    /// from), pinned by its sha256.
    pub async fn install_tool(
        &self,
        caller: &Caller,
        bytes: &[u8],
        name: &str,
        source: &str,
        mode: InstallMode,
    ) -> Result<InstallReport, ApiError> {
        caller.require_admin("installing a tool")?;
        Ok(self.tools.install_as(bytes, name, source, mode).await?)
    }

    /// The installed tools (any caller may read the catalog).
    pub fn tools(&self, _caller: &Caller) -> Result<Vec<ToolRecord>, ApiError> {
        Ok(self.tools.tools()?)
    }

    /// The installed components, with where each came from and who signed it (any caller may
    /// read the catalog).
    pub fn components(&self, _caller: &Caller) -> Result<Vec<ComponentRecord>, ApiError> {
        Ok(self.tools.components()?)
    }

    /// The component named `name`, or the one providing the tool `name`, with its tools (any
    /// caller may read it; what a user is shown of it is [`shown::component`]).
    pub fn tool(
        &self,
        _caller: &Caller,
        name: &str,
    ) -> Result<(ComponentRecord, Vec<ToolRecord>), ApiError> {
        Ok(self.tools.component_for(name)?)
    }

    /// Removes the component named `name` (or providing the tool `name`); returns it and the
    /// names of its tools. Sessions that pinned it keep their record of it.
    pub fn remove_tool(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<(ComponentRecord, Vec<String>), ApiError> {
        caller.require_admin("removing a tool")?;
        Ok(self.tools.remove(name)?)
    }

    /// Adds a tool implemented in this process (a control or MCP tool) to the catalog; from
    /// then on it is loaded, checked, asked about, approved and journaled like a component's.
    pub fn register_host_tool(
        &self,
        caller: &Caller,
        tool: std::sync::Arc<dyn HostTool>,
    ) -> Result<(), ApiError> {
        caller.require_admin("adding a host tool")?;
        Ok(self.tools.register_host_tool(tool)?)
    }

    /// The installed tool records of `names` at the versions `pins` holds (the version
    /// installed now for a name not pinned); a name not installed is left out. Any caller may
    /// read the catalog.
    pub fn tools_pinned(
        &self,
        _caller: &Caller,
        names: &[String],
        pins: &ToolPins,
    ) -> Result<Vec<ToolRecord>, ApiError> {
        let catalog = self.tools.catalog()?;
        Ok(names
            .iter()
            .filter_map(|n| catalog.get_pinned(n, pins))
            .map(|r| r.record.clone())
            .collect())
    }

    /// An admin's direct, governed call of one tool, outside any session.
    pub async fn call_tool(
        &self,
        caller: &Caller,
        req: CallRequest<'_>,
    ) -> Result<CallOutcome, ApiError> {
        caller.require_admin("calling a tool outside a session")?;
        Ok(self.tools.call(req).await?)
    }

    /// Whether the component file `bytes` has its compiled form in the artifact cache (a call
    /// of it starts without compiling), for a front-end to say that a compile is coming.
    pub fn tool_file_compiled(&self, caller: &Caller, bytes: &[u8]) -> Result<bool, ApiError> {
        caller.require_admin("calling a component file")?;
        Ok(self.tools.file_compiled(bytes)?)
    }

    /// Runs one call of a tool of the component file `bytes` without installing it (a tool
    /// author's loop): install's checks, then the governed call an installed tool gets. `name`
    /// is the component name it is checked as. Nothing is written to the catalog; the
    /// compiled form is cached by the bytes' digest, so the next call of the same bytes does
    /// not compile them.
    pub async fn call_tool_file(
        &self,
        caller: &Caller,
        bytes: &[u8],
        name: &str,
        req: CallRequest<'_>,
    ) -> Result<CallOutcome, ApiError> {
        caller.require_admin("calling a component file")?;
        Ok(self.tools.call_file(bytes, name, req).await?)
    }

    /// What installing the component file `bytes` as `name` would do — accepted, or refused
    /// and why — with its imports and tools. Nothing is installed.
    pub async fn inspect_tool_file(
        &self,
        caller: &Caller,
        bytes: &[u8],
        name: &str,
    ) -> Result<crate::tools::FileInspection, ApiError> {
        caller.require_admin("inspecting a component file")?;
        Ok(self.tools.inspect_file(bytes, name).await)
    }

    /// Trusts the publisher key `key` (`ed25519:` and 64 hex digits) as `name` for the packages
    /// the glob `packages` matches. A name or key trusted already is a conflict.
    pub fn trust_add(
        &self,
        caller: &Caller,
        name: &str,
        key: &str,
        packages: &str,
    ) -> Result<crate::tools::trust::TrustedKey, ApiError> {
        caller.require_admin("trusting a publisher key")?;
        self.tools.trust_add(name, key, packages).map_err(store_kind)
    }

    /// The trusted publisher keys (any caller may read them).
    pub fn trusted_keys(
        &self,
        _caller: &Caller,
    ) -> Result<Vec<crate::tools::trust::TrustedKey>, ApiError> {
        self.tools.trusted_keys().map_err(store_kind)
    }

    /// Stops trusting the publisher key `name`.
    pub fn trust_remove(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<crate::tools::trust::TrustedKey, ApiError> {
        caller.require_admin("removing a trusted key")?;
        self.tools.trust_remove(name).map_err(store_kind)
    }

    /// Whether the component file `bytes` is signed, and which trusted key (covering the
    /// package `package`) signed it.
    pub fn signer_of(
        &self,
        _caller: &Caller,
        bytes: &[u8],
        package: &str,
    ) -> Result<(bool, Option<crate::tools::trust::TrustedKey>), ApiError> {
        self.tools.signers_of(bytes, package).map_err(store_kind)
    }

    /// Checks the grants and tools a session would be made with, before it is (`keel mcp
    /// serve` checks what it offers when it starts): grants that overlap or reach keel's home,
    /// tools not installed.
    pub fn check_session_parts(
        &self,
        caller: &Caller,
        grants: &[Grant],
        tools: Option<&[String]>,
    ) -> Result<(), ApiError> {
        caller.require_admin("checking a session's grants and tools")?;
        self.check_grant_set(grants)?;
        for t in tools.into_iter().flatten() {
            self.tools.resolve(t).map_err(|e| ApiError::NotInstalled(e.to_string()))?;
        }
        Ok(())
    }
}

/// A ToolService error whose cause is the store's keeps the store's kind (`input`,
/// `conflict`, `not_found`).
fn store_kind(e: crate::tools::ToolServiceError) -> ApiError {
    match e {
        crate::tools::ToolServiceError::Store(s) => ApiError::Store(s),
        other => ApiError::Tools(other),
    }
}

/// Whether `tool` is one of keel's own control tools (the plan, discovery and delegation
/// tools of the first-party `control` component): they steer the session rather than touch
/// the world, and lists show their class as `control` rather than their policy class.
pub fn is_control_tool(tool: &crate::tools::ToolRecord) -> bool {
    tool.component == "control"
        && (CONTROL_TOOLS.contains(&tool.name.as_str())
            || DELEGATION_TOOLS.contains(&tool.name.as_str()))
}

/// The class a person reads for `tool`: `control` for keel's control tools, else its effect.
pub fn shown_class(tool: &crate::tools::ToolRecord) -> String {
    if is_control_tool(tool) { "control".to_string() } else { tool.effect.to_string() }
}
