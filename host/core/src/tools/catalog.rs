//! The tool catalog: installed components and the tools they describe (SQLite tables
//! `components` and `tools`). Only the ToolService writes them; each change is one transaction.

use crate::sql::{Backend, Connection, OptionalExtension, params};

use crate::store::StoreError;

/// One installed component.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ComponentRecord {
    pub name: String,
    /// sha256 of the `.wasm` file; the component is pinned to it.
    pub digest: String,
    pub size: u64,
    /// Where it was installed from (`builtin` for first-party tools).
    pub source: String,
    pub builtin: bool,
    pub installed_at: String,
    /// `component` (a WebAssembly file) or `mcp` (an external MCP server; see
    /// [`super::mcp`]).
    pub kind: super::SourceKind,
    /// The trusted key (by its trust name) whose signature the component carried when it was
    /// installed, and that key (`None`: unsigned, or signed by no trusted key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer_key: Option<String>,
    /// Whether that signer is trusted still: `Some(false)` once its trust was removed, given
    /// to another key, or narrowed so it no longer covers this component's package. Not
    /// stored: worked out from the trusted keys whenever the component is read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer_trusted: Option<bool>,
    /// Installed without the signature its source requires, on purpose (`--allow-unsigned`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unsigned_allowed: bool,
    /// Installed from a registry (`source` is the `oci://` reference): the digest of the
    /// manifest the reference named then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    /// The version the component carries (its `version` section), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// One tool, as its component described it at install time.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ToolRecord {
    pub name: String,
    pub component: String,
    pub description: String,
    pub input_schema: serde_json::Value,
    pub output_schema: Option<serde_json::Value>,
    pub effect: crate::policy::Effect,
    pub idempotent: bool,
    /// sha256 of the tool's description, schemas, effect and idempotence.
    pub spec_digest: String,
}

fn tool_from_row(r: &crate::sql::Row<'_>) -> crate::sql::Result<ToolRecord> {
    let input: String = r.get(3)?;
    let output: Option<String> = r.get(4)?;
    Ok(ToolRecord {
        name: r.get(0)?,
        component: r.get(1)?,
        description: r.get(2)?,
        input_schema: serde_json::from_str(&input).unwrap_or(serde_json::Value::Null),
        output_schema: output.and_then(|o| serde_json::from_str(&o).ok()),
        effect: r.get(5)?,
        idempotent: r.get(6)?,
        spec_digest: r.get(7)?,
    })
}

const TOOL_COLUMNS: &str =
    "name, component, description, input_schema, output_schema, effect, idempotent, spec_digest";

fn component_from_row(r: &crate::sql::Row<'_>) -> crate::sql::Result<ComponentRecord> {
    Ok(ComponentRecord {
        name: r.get(0)?,
        digest: r.get(1)?,
        size: r.get::<_, i64>(2)?.max(0) as u64,
        source: r.get(3)?,
        builtin: r.get(4)?,
        installed_at: r.get(5)?,
        kind: r.get(6)?,
        signer: r.get(7)?,
        signer_key: r.get(8)?,
        signer_trusted: None,
        unsigned_allowed: r.get(9)?,
        manifest_digest: r.get(10)?,
        version: r.get(11)?,
    })
}

const COMPONENT_COLUMNS: &str = "name, digest, size, source, builtin, installed_at, kind, signer, signer_key, unsigned_allowed, manifest_digest, version";

pub fn component(conn: &Connection, name: &str) -> Result<Option<ComponentRecord>, StoreError> {
    let sql = format!("SELECT {COMPONENT_COLUMNS} FROM components WHERE name = ?1");
    Ok(conn.query_row(&sql, [name], component_from_row).optional()?)
}

/// The digest keel recorded for the compiled artifact of `component` under `engine`.
pub fn artifact_digest(
    conn: &Connection,
    engine: &str,
    component: &str,
) -> Result<Option<String>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT digest FROM artifacts WHERE engine = ?1 AND component = ?2",
            [engine, component],
            |r| r.get(0),
        )
        .optional()?)
}

/// Records the digest of the artifact keel just wrote for `component` under `engine`.
pub fn record_artifact(
    conn: &Connection,
    engine: &str,
    component: &str,
    digest: &str,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO artifacts (engine, component, digest, written_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (engine, component) DO UPDATE SET digest = excluded.digest, written_at = excluded.written_at",
        crate::sql::params![engine, component, digest, crate::store::now_ms()],
    )?;
    Ok(())
}

/// The components under `engine` whose artifacts keel keeps for files that are not installed
/// (no component and no pinned version has their digest), past the `keep` most recently
/// written: those to remove.
pub fn stray_artifacts(
    conn: &Connection,
    engine: &str,
    keep: usize,
) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT component FROM artifacts WHERE engine = ?1
           AND component NOT IN (SELECT digest FROM components)
           AND component NOT IN (SELECT digest FROM tool_versions)
         ORDER BY written_at DESC, component",
    )?;
    let rows = stmt.query_map([engine], |r| r.get::<_, String>(0))?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?.into_iter().skip(keep).collect())
}

/// Forgets the artifact of `component` under `engine`.
pub fn forget_artifact(conn: &Connection, engine: &str, component: &str) -> Result<(), StoreError> {
    conn.execute(
        "DELETE FROM artifacts WHERE engine = ?1 AND component = ?2",
        [engine, component],
    )?;
    Ok(())
}

pub fn components(conn: &Connection) -> Result<Vec<ComponentRecord>, StoreError> {
    let sql = format!("SELECT {COMPONENT_COLUMNS} FROM components ORDER BY name");
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map([], component_from_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub fn tool(conn: &Connection, name: &str) -> Result<Option<ToolRecord>, StoreError> {
    let sql = format!("SELECT {TOOL_COLUMNS} FROM tools WHERE name = ?1");
    Ok(conn.query_row(&sql, [name], tool_from_row).optional()?)
}

pub fn tools(conn: &Connection) -> Result<Vec<ToolRecord>, StoreError> {
    let sql = format!("SELECT {TOOL_COLUMNS} FROM tools ORDER BY name");
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map([], tool_from_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub fn tools_of(conn: &Connection, component: &str) -> Result<Vec<ToolRecord>, StoreError> {
    let sql = format!("SELECT {TOOL_COLUMNS} FROM tools WHERE component = ?1 ORDER BY name");
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map([component], tool_from_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Tools of other components whose names clash with `names`.
pub fn clashes(
    conn: &Connection,
    component: &str,
    names: &[String],
) -> Result<Vec<(String, String)>, StoreError> {
    let mut out = Vec::new();
    for name in names {
        if let Some(t) = tool(conn, name)?
            && t.component != component
        {
            out.push((t.name, t.component));
        }
    }
    Ok(out)
}

/// Records `component` and its `tools`, replacing an earlier version of the same component,
/// in one transaction.
pub fn put(
    conn: &mut Connection,
    component: &ComponentRecord,
    tools: &[ToolRecord],
) -> Result<(), StoreError> {
    let tx = conn.transaction()?;
    put_in(&tx, component, tools)?;
    tx.commit()?;
    Ok(())
}

/// [`put`] inside the caller's transaction.
pub fn put_in(
    tx: &Connection,
    component: &ComponentRecord,
    tools: &[ToolRecord],
) -> Result<(), StoreError> {
    tx.execute("DELETE FROM tools WHERE component = ?1", [&component.name])?;
    tx.execute("DELETE FROM components WHERE name = ?1", [&component.name])?;
    tx.execute(
        "INSERT INTO components (name, digest, size, source, builtin, installed_at, kind,
                                 signer, signer_key, unsigned_allowed, manifest_digest,
                                 version)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            component.name,
            component.digest,
            component.size as i64,
            component.source,
            component.builtin,
            component.installed_at,
            component.kind,
            component.signer,
            component.signer_key,
            component.unsigned_allowed,
            component.manifest_digest,
            component.version
        ],
    )?;
    for t in tools {
        tx.execute(
            "INSERT INTO tools (name, component, description, input_schema, output_schema,
                                effect, idempotent, spec_digest)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                t.name,
                t.component,
                t.description,
                t.input_schema.to_string(),
                t.output_schema.as_ref().map(|s| s.to_string()),
                t.effect,
                t.idempotent,
                t.spec_digest
            ],
        )?;
        // The version a session that loads the tool now pins (kept after upgrades).
        tx.execute(
            "INSERT INTO tool_versions
                 SELECT name, ?2, component, description, input_schema, output_schema, effect,
                        idempotent, spec_digest
                 FROM tools WHERE name = ?1
                 ON CONFLICT DO NOTHING",
            params![t.name, component.digest],
        )?;
    }
    Ok(())
}

/// Removes a component with every kept version of its tools; returns its tool names and the
/// digests of all its versions.
pub fn remove(
    conn: &mut Connection,
    component: &str,
) -> Result<(Vec<String>, Vec<String>), StoreError> {
    let tx = conn.transaction()?;
    let out = remove_in(&tx, component)?;
    tx.commit()?;
    Ok(out)
}

/// [`remove`] inside the caller's transaction.
pub fn remove_in(
    tx: &Connection,
    component: &str,
) -> Result<(Vec<String>, Vec<String>), StoreError> {
    let names: Vec<String> = {
        let mut stmt = tx.prepare("SELECT name FROM tools WHERE component = ?1 ORDER BY name")?;
        let rows = stmt.query_map([component], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    let digests: Vec<String> = {
        let mut stmt =
            tx.prepare("SELECT DISTINCT digest FROM tool_versions WHERE component = ?1")?;
        let rows = stmt.query_map([component], |r| r.get(0))?;
        rows.collect::<Result<_, _>>()?
    };
    tx.execute("DELETE FROM tools WHERE component = ?1", [component])?;
    tx.execute("DELETE FROM tool_versions WHERE component = ?1", [component])?;
    tx.execute("DELETE FROM components WHERE name = ?1", [component])?;
    Ok((names, digests))
}

/// Every kept version of every tool, with the digest of the component that provides it.
pub fn tool_versions(conn: &Connection) -> Result<Vec<(ToolRecord, String)>, StoreError> {
    let sql = format!("SELECT {TOOL_COLUMNS}, digest FROM tool_versions");
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map([], |r| Ok((tool_from_row(r)?, r.get::<_, String>(8)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The database's data version: it changes whenever another connection commits (SQLite's
/// `data_version`; on PostgreSQL, which has none, the catalog's own version).
pub fn data_version(conn: &Connection) -> Result<i64, StoreError> {
    match conn.backend() {
        Backend::Sqlite => {
            Ok(conn.prepare_cached("PRAGMA data_version")?.query_row([], |r| r.get(0))?)
        }
        Backend::Postgres => catalog_version(conn),
    }
}

/// The catalog's version: it changes whenever a component or tool row changes, whoever
/// commits it (triggers of migration 4 keep it).
pub fn catalog_version(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn
        .prepare_cached("SELECT version FROM catalog_version WHERE id = 1")?
        .query_row([], |r| r.get(0))?)
}

/// Keeps the bytes of component `digest` in a shared (PostgreSQL) store, for the other hosts;
/// nothing on SQLite, whose home keeps the file.
pub fn share_file(conn: &Connection, digest: &str, bytes: &[u8]) -> Result<(), StoreError> {
    if conn.backend() == Backend::Postgres {
        conn.prepare_cached(
            "INSERT INTO component_files (digest, bytes) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        )?
        .execute(params![digest, bytes])?;
    }
    Ok(())
}

/// Forgets the shared bytes of component `digest` (no component uses it any more).
pub fn unshare_file(conn: &Connection, digest: &str) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM component_files WHERE digest=?1")?.execute([digest])?;
    Ok(())
}

/// The shared bytes of component `digest`, if the store keeps them.
pub fn shared_file(conn: &Connection, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(conn
        .prepare_cached("SELECT bytes FROM component_files WHERE digest=?1")?
        .query_row([digest], |r| r.get(0))
        .optional()?)
}

/// Whether any component still uses the file with `digest`.
pub fn digest_in_use(conn: &Connection, digest: &str) -> Result<bool, StoreError> {
    Ok(conn.query_row(
        "SELECT EXISTS(SELECT 1 FROM components WHERE digest = ?1)",
        [digest],
        |r| r.get(0),
    )?)
}

/// A tool as recall and search name it: enough for a model to decide on it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ToolRef {
    pub name: String,
    /// The component (the tool set) that provides it.
    pub component: String,
    pub description: String,
    pub effect: String,
}

/// A component as a tool set: its name and the tools it provides.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ToolSetRef {
    pub name: String,
    pub tools: Vec<String>,
}

/// Tools of one tool set named to a model, at most.
pub const TOOLSET_TOOLS_SHOWN: usize = 32;

/// The installed tools best matching `terms` (bm25 over name and description), at most
/// `limit`, best first.
pub fn recall_in<S: AsRef<str>>(
    conn: &Connection,
    terms: &[S],
    limit: usize,
) -> Result<Vec<crate::search::Scored<ToolRef>>, StoreError> {
    let (sql, query, min_rowid) = match conn.backend() {
        Backend::Postgres => {
            let Some(query) = crate::search::ts_query(terms) else {
                return Ok(Vec::new());
            };
            let sql =
                "SELECT t.name, t.component, t.description, t.effect, -ts_rank(t.fts, q) AS score
                 FROM tools t, to_tsquery('english', ?1) q
                 WHERE t.fts @@ q ORDER BY score, t.name LIMIT ?2";
            (sql, query, None)
        }
        Backend::Sqlite => {
            let Some(plan) =
                crate::search::plan_in(conn, "tools_fts", "tools_vocab", None, None, terms)?
            else {
                return Ok(Vec::new());
            };
            let sql = "SELECT t.name, t.component, t.description, t.effect, bm25(tools_fts, 5.0, 1.0) AS score
                 FROM tools_fts JOIN tools t ON t.rowid = tools_fts.rowid
                 WHERE tools_fts MATCH ?1 AND tools_fts.rowid >= ?3 ORDER BY score LIMIT ?2";
            (sql, plan.query, Some(plan.min_rowid))
        }
    };
    let mut stmt = conn.prepare_cached(sql)?;
    let scored = |r: &crate::sql::Row<'_>| {
        Ok(crate::search::Scored {
            item: ToolRef {
                name: r.get(0)?,
                component: r.get(1)?,
                description: r.get(2)?,
                effect: r.get(3)?,
            },
            score: r.get(4)?,
        })
    };
    let rows = match min_rowid {
        Some(min) => stmt.query_map(params![query, limit as i64, min], scored)?,
        None => stmt.query_map(params![query, limit as i64], scored)?,
    };
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The tool set of component `name` (its first [`TOOLSET_TOOLS_SHOWN`] tools by name).
pub fn toolset_in(conn: &Connection, name: &str) -> Result<Option<ToolSetRef>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT name FROM tools WHERE component = ?1 ORDER BY name LIMIT ?2")?;
    let tools: Vec<String> = stmt
        .query_map(params![name, TOOLSET_TOOLS_SHOWN as i64], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok((!tools.is_empty()).then(|| ToolSetRef { name: name.to_string(), tools }))
}
