//! The use cases of external MCP servers: add, refresh (the diff, accepted or not), list,
//! remove.

use super::*;

/// What `keel mcp refresh` found: the server's tools now against those accepted.
#[derive(Debug, Clone, serde::Serialize)]
pub struct McpRefresh {
    pub server: String,
    pub info: crate::tools::mcp::ServerInfo,
    pub diff: crate::tools::mcp::ToolDiff,
    /// Whether the catalog now holds the server's current tools (nothing changed, or the
    /// change was accepted).
    pub accepted: bool,
    pub skipped: Vec<(String, String)>,
}

/// External MCP servers as tools.
impl Harness {
    /// Starts the server of `spec`, lists its tools and adds it to the catalog (its tools as
    /// `NAME__TOOL`, pinned by digest). The server is stopped again; calls start it on demand.
    pub async fn mcp_add(
        &self,
        caller: &Caller,
        spec: crate::tools::mcp::ServerSpec,
    ) -> Result<crate::tools::mcp::Offer, ApiError> {
        caller.require_admin("adding an MCP server")?;
        crate::tools::mcp::check_server_name(&spec.name)
            .map_err(crate::tools::ToolServiceError::from)?;
        if self.tools.component_for(&spec.name).is_ok() {
            return Err(crate::tools::ToolServiceError::from(crate::tools::mcp::McpError::Exists(
                spec.name.clone(),
            ))
            .into());
        }
        let live = crate::tools::mcp::client::connect(&spec)
            .await
            .map_err(crate::tools::ToolServiceError::from)?;
        let offer = live.offer();
        live.close().await;
        self.tools.mcp_put(&spec, &offer, false)?;
        Ok(offer)
    }

    /// Lists the server's tools again and compares them with those accepted; with `accept`,
    /// a change replaces them (sessions see the new tools; approvals bound to a changed tool's
    /// old digest no longer match).
    pub async fn mcp_refresh(
        &self,
        caller: &Caller,
        name: &str,
        accept: bool,
    ) -> Result<McpRefresh, ApiError> {
        caller.require_admin("refreshing an MCP server")?;
        let record = self.tools.mcp_server(name)?;
        let live = crate::tools::mcp::client::connect(&record.spec)
            .await
            .map_err(crate::tools::ToolServiceError::from)?;
        let offer = live.offer();
        live.close().await;
        let (_, tools) = self.tools.component_for(name)?;
        let old: Vec<(ToolRecord, crate::tools::mcp::PinnedTool)> = record
            .tools
            .iter()
            .filter_map(|p| tools.iter().find(|t| t.name == p.name).map(|t| (t.clone(), p.clone())))
            .collect();
        let diff = crate::tools::mcp::diff(&old, &offer.tools);
        let accepted = diff.is_empty() || accept;
        if accepted {
            self.tools.mcp_put(&record.spec, &offer, true)?;
        }
        Ok(McpRefresh {
            server: name.to_string(),
            info: offer.info,
            diff,
            accepted,
            skipped: offer.skipped,
        })
    }

    /// Every added MCP server.
    pub fn mcp_servers(
        &self,
        caller: &Caller,
    ) -> Result<Vec<crate::tools::mcp::registry::ServerRecord>, ApiError> {
        caller.require_admin("listing MCP servers")?;
        Ok(self.tools.mcp_servers()?)
    }

    /// One added MCP server, with its tools as the catalog holds them.
    pub fn mcp_server(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<(crate::tools::mcp::registry::ServerRecord, Vec<ToolRecord>), ApiError> {
        caller.require_admin("reading an MCP server")?;
        let record = self.tools.mcp_server(name)?;
        let (_, tools) = self.tools.component_for(name)?;
        Ok((record, tools))
    }

    /// Removes an MCP server and its tools; returns the tools' names.
    pub fn mcp_remove(&self, caller: &Caller, name: &str) -> Result<Vec<String>, ApiError> {
        caller.require_admin("removing an MCP server")?;
        Ok(self.tools.mcp_remove(name)?)
    }
}
