//! The `mcp_servers` table: the servers added with `keel mcp add`, their transport, what
//! they said of themselves and the tools keel accepted (with each tool's digest). A server is
//! also a `components` row of kind `mcp` and its tools are `tools` rows, written in the same
//! transaction; the ToolService is the only writer (through its `mcp_*` methods).

use crate::sql::{Connection, OptionalExtension, params};

use crate::store::{StoreError, json, now_ms};
use crate::tools::{ComponentRecord, SourceKind, ToolRecord, catalog};

use super::{Offer, PinnedTool, ServerInfo, ServerSpec};

/// An added server as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ServerRecord {
    pub spec: ServerSpec,
    pub info: ServerInfo,
    pub tools: Vec<PinnedTool>,
    pub added_at: i64,
    pub refreshed_at: i64,
}

fn corrupt(what: &str, e: serde_json::Error) -> StoreError {
    StoreError::Corrupt(format!("a stored MCP server's {what} does not read back: {e}"))
}

fn from_row(r: &crate::sql::Row<'_>) -> crate::sql::Result<(String, String, String, i64, i64)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

fn decode(row: (String, String, String, i64, i64)) -> Result<ServerRecord, StoreError> {
    let (spec, info, tools, added_at, refreshed_at) = row;
    Ok(ServerRecord {
        spec: serde_json::from_str(&spec).map_err(|e| corrupt("settings", e))?,
        info: serde_json::from_str(&info).map_err(|e| corrupt("server info", e))?,
        tools: serde_json::from_str(&tools).map_err(|e| corrupt("tool pins", e))?,
        added_at,
        refreshed_at,
    })
}

const COLUMNS: &str = "spec, server_info, tools, added_at, refreshed_at";

/// The server `name`, if added.
pub fn get_in(c: &Connection, name: &str) -> Result<Option<ServerRecord>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM mcp_servers WHERE name = ?1");
    c.prepare_cached(&sql)?.query_row([name], from_row).optional()?.map(decode).transpose()
}

/// Every added server, by name.
pub fn list_in(c: &Connection) -> Result<Vec<ServerRecord>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM mcp_servers ORDER BY name");
    let rows: Vec<_> = c.prepare(&sql)?.query_map([], from_row)?.collect::<Result<Vec<_>, _>>()?;
    rows.into_iter().map(decode).collect()
}

/// Records `spec` with the tools of `offer` (replacing what was accepted before): the
/// `components` row (kind `mcp`, its digest that of the offer's pins), the `tools` rows and
/// the `mcp_servers` row — in the caller's transaction.
pub fn put_in(c: &Connection, spec: &ServerSpec, offer: &Offer) -> Result<(), StoreError> {
    let pins: Vec<&PinnedTool> = offer.tools.iter().map(|t| &t.pinned).collect();
    let digest = crate::digest::sha256_hex(
        serde_json::to_string(&pins).map_err(|e| corrupt("tool pins", e))?.as_bytes(),
    );
    let component = ComponentRecord {
        name: spec.name.clone(),
        digest,
        size: 0,
        source: format!("mcp:{}", spec.transport.identity()),
        builtin: false,
        installed_at: crate::tools::install_time(),
        kind: SourceKind::Mcp,
        signer: None,
        signer_key: None,
        signer_trusted: None,
        unsigned_allowed: false,
        manifest_digest: None,
        version: None,
    };
    let records: Vec<ToolRecord> = offer.tools.iter().map(|t| t.record.clone()).collect();
    // Earlier versions of the server's tools cannot run (the server is what it is now).
    c.execute("DELETE FROM tool_versions WHERE component = ?1", [&spec.name])?;
    catalog::put_in(c, &component, &records)?;
    let now = now_ms();
    c.execute(
        "INSERT INTO mcp_servers (name, spec, server_info, tools, added_at, refreshed_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5)
         ON CONFLICT (name) DO UPDATE SET spec=excluded.spec, server_info=excluded.server_info,
             tools=excluded.tools, refreshed_at=excluded.refreshed_at",
        params![spec.name, json(spec)?, json(&offer.info)?, json(&pins)?, now],
    )?;
    Ok(())
}

/// Removes server `name`: its tools, its `components` row and its `mcp_servers` row. Returns
/// the names of its tools.
pub fn remove_in(c: &Connection, name: &str) -> Result<Vec<String>, StoreError> {
    let (tools, _) = catalog::remove_in(c, name)?;
    c.execute("DELETE FROM mcp_servers WHERE name = ?1", [name])?;
    Ok(tools)
}
