//! The ToolService's side of external MCP servers: it is the only writer of the catalog, so
//! adding, accepting and removing a server go through it, and its catalog resolves a server's
//! tools to [`McpTool`]s run by this process's [`Pool`].

use std::sync::Arc;

use super::client::McpTool;
use super::registry::{self, ServerRecord};
use super::{McpError, Offer, ServerSpec};
use crate::store::StoreError;

use crate::tools::view::Resolved;
use crate::tools::{SourceKind, ToolServiceError, catalog};

impl crate::tools::ToolService {
    /// Every added MCP server.
    pub fn mcp_servers(&self) -> Result<Vec<ServerRecord>, ToolServiceError> {
        Ok(registry::list_in(&self.db())?)
    }

    /// The MCP server `name`.
    pub fn mcp_server(&self, name: &str) -> Result<ServerRecord, ToolServiceError> {
        registry::get_in(&self.db(), name)?
            .ok_or_else(|| McpError::NotFound(name.to_string()).into())
    }

    /// Records server `spec` with the tools of `offer`: a new server when `replace` is false
    /// (its name must be free, as a component's or a server's), else the accepted tools of an
    /// added server are replaced. No tool name may belong to another component.
    pub fn mcp_put(
        &self,
        spec: &ServerSpec,
        offer: &Offer,
        replace: bool,
    ) -> Result<(), ToolServiceError> {
        super::check_server_name(&spec.name)?;
        let names: Vec<String> = offer.tools.iter().map(|t| t.record.name.clone()).collect();
        let mut clashes = self.host_tool_owners(&names);
        {
            let mut db = self.db();
            let tx = db.transaction().map_err(StoreError::from)?;
            match (catalog::component(&tx, &spec.name)?, replace) {
                (Some(_), false) => return Err(McpError::Exists(spec.name.clone()).into()),
                (Some(c), true) if c.kind != SourceKind::Mcp => {
                    return Err(McpError::Exists(spec.name.clone()).into());
                }
                (None, true) => return Err(McpError::NotFound(spec.name.clone()).into()),
                _ => {}
            }
            clashes.extend(catalog::clashes(&tx, &spec.name, &names)?);
            if !clashes.is_empty() {
                return Err(ToolServiceError::NameClash { clashes });
            }
            registry::put_in(&tx, spec, offer)?;
            tx.commit().map_err(StoreError::from)?;
        }
        self.invalidate_catalog();
        Ok(())
    }

    /// Removes the MCP server `name` and its tools; returns their names.
    pub fn mcp_remove(&self, name: &str) -> Result<Vec<String>, ToolServiceError> {
        let removed = {
            let mut db = self.db();
            let tx = db.transaction().map_err(StoreError::from)?;
            if registry::get_in(&tx, name)?.is_none() {
                return Err(McpError::NotFound(name.to_string()).into());
            }
            let removed = registry::remove_in(&tx, name)?;
            tx.commit().map_err(StoreError::from)?;
            removed
        };
        self.invalidate_catalog();
        Ok(removed)
    }

    /// The catalog entries of the MCP servers `c` sees, resolved to this process's pool.
    pub(crate) fn mcp_resolved(
        &self,
        c: &crate::sql::Connection,
        tools: &[crate::tools::ToolRecord],
    ) -> Result<Vec<Arc<Resolved>>, ToolServiceError> {
        let mut out = Vec::new();
        for server in registry::list_in(c)? {
            let spec = Arc::new(server.spec);
            for pinned in server.tools {
                let Some(record) = tools.iter().find(|t| t.name == pinned.name) else { continue };
                let tool: Arc<dyn crate::tools::HostTool> = Arc::new(McpTool {
                    record: record.clone(),
                    spec: spec.clone(),
                    pinned,
                    pool: self.mcp.clone(),
                });
                out.push(Arc::new(Resolved::host(&tool)));
            }
        }
        Ok(out)
    }
}
