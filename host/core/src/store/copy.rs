//! Copying a SQLite store into an empty PostgreSQL database (`keel store migrate --to`), in
//! one PostgreSQL transaction, then checking it: every table's row count and a digest of its
//! rows, computed the same way from both databases, must match.
//!
//! Both stores are at this build's schema version (opening them migrates them). The tables
//! are copied parents first; triggers are off while copying (a copied row keeps the counters
//! it had — a grant must not bump its session's `meta_version` again), and the full-text
//! columns PostgreSQL keeps are computed by the server. FTS5's own tables are not copied: the
//! search columns replace them.

use super::{Location, StoreError};
use crate::sql::{Connection, SqlRef};

/// The tables copied, parents before children.
pub const TABLES: &[&str] = &[
    "components",
    "tools",
    "tool_versions",
    "artifacts",
    "trusted_keys",
    "mcp_servers",
    "api_tokens",
    "grant_presets",
    "blobs",
    "skill_versions",
    "skill_files",
    "skills",
    "memories",
    "sessions",
    "session_config",
    "session_grants",
    "session_capabilities",
    "messages",
    "inbox",
    "tool_calls",
    "evidence",
    "refused_requests",
    "open_steps",
    "approvals",
    "session_events",
    "task_transitions",
    "plan_versions",
    "orchestrations",
    "checkpoints",
    "runner_leases",
    "workgroups",
    "subsessions",
    "workgroup_events",
    "catalog_version",
    "access_version",
];

/// What was copied of one table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Copied {
    pub table: String,
    pub rows: u64,
    /// The SHA-256 of the table's rows (each rendered the same way from either database,
    /// sorted), equal on both sides.
    pub digest: String,
}

/// What a copy did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    pub tables: Vec<Copied>,
    /// Component files put in the database (each digest-checked), for the other hosts.
    pub component_files: u64,
    /// Digests of kept tool versions whose component file the home no longer has (they stay
    /// in the catalog; a session pinned to one cannot run it on any host).
    pub missing_files: Vec<String>,
}

/// Copies the SQLite store `from` into the PostgreSQL database `to`, which must hold no
/// keel data yet, and checks the copy; `files` gives the bytes of a component by digest (the
/// home's `components/` files); `progress` hears of each table. Nothing is left in `to` when
/// it fails.
pub fn sqlite_to_postgres(
    from: &Location,
    to: &Location,
    files: &dyn Fn(&str) -> Option<Vec<u8>>,
    progress: &dyn Fn(&Copied),
) -> Result<Report, StoreError> {
    let (Location::Sqlite { .. }, Location::Postgres { .. }) = (from, to) else {
        return Err(StoreError::Input(
            "a store is copied from a SQLite home to a PostgreSQL database".into(),
        ));
    };
    let source = super::connect(from)?;
    let target = super::connect(to)?;
    for table in TABLES.iter().filter(|t| !matches!(**t, "catalog_version" | "access_version")) {
        let n: i64 =
            target.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?;
        if n > 0 {
            return Err(StoreError::Conflict(format!(
                "{} already holds keel data ({n} row(s) in {table}): copy into an empty database",
                to.display()
            )));
        }
    }
    target.control("BEGIN")?;
    let copied = copy_all(&source, &target, progress).and_then(|tables| {
        let (component_files, missing_files) = copy_files(&source, &target, files)?;
        Ok(Report { tables, component_files, missing_files })
    });
    match copied {
        Ok(report) => {
            target.control("COMMIT")?;
            Ok(report)
        }
        Err(e) => {
            let _ = target.control("ROLLBACK");
            Err(e)
        }
    }
}

fn copy_all(
    source: &Connection,
    target: &Connection,
    progress: &dyn Fn(&Copied),
) -> Result<Vec<Copied>, StoreError> {
    for table in TABLES {
        target.execute_batch(&format!("ALTER TABLE {table} DISABLE TRIGGER USER"))?;
    }
    let mut out = Vec::new();
    for table in TABLES {
        let columns = columns(source, table)?;
        let list = columns.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ");
        let order = if *table == "workgroup_events" { " ORDER BY rowid" } else { "" };
        let select = format!("SELECT {list} FROM {table}{order}");
        let marks = (1..=columns.len()).map(|i| format!("?{i}")).collect::<Vec<_>>().join(", ");
        let insert = if matches!(*table, "catalog_version" | "access_version") {
            format!("UPDATE {table} SET version = ?2 WHERE id = ?1")
        } else {
            format!("INSERT INTO {table} ({list}) VALUES ({marks})")
        };
        let mut insert = target.prepare(&insert)?;
        let mut rows = 0u64;
        let mut stmt = source.prepare(&select)?;
        let values = stmt.query_map([], |r| {
            (0..columns.len()).map(|i| r.get::<_, Owned>(i)).collect::<Result<Vec<_>, _>>()
        })?;
        for row in values {
            let row = row?;
            let refs: Vec<SqlRef<'_>> = row.iter().map(Owned::as_ref).collect();
            insert.execute(&refs[..]).map_err(|e| StoreError::Commit {
                message: format!("copying a row of {table}: {e}"),
            })?;
            rows += 1;
        }
        if *table == "memories" {
            target.execute_batch(
                "SELECT setval(pg_get_serial_sequence('memories', 'id'), \
                 COALESCE((SELECT max(id) FROM memories), 0) + 1, false)",
            )?;
        }
        let (source_rows, source_digest) = digest(source, table, &columns)?;
        let (target_rows, target_digest) = digest(target, table, &columns)?;
        if source_rows != target_rows || source_digest != target_digest || source_rows != rows {
            return Err(StoreError::Corrupt(format!(
                "the copy of {table} does not match: {source_rows} row(s) digest {source_digest} \
                 in SQLite, {target_rows} row(s) digest {target_digest} in PostgreSQL"
            )));
        }
        let copied = Copied { table: table.to_string(), rows, digest: source_digest };
        progress(&copied);
        out.push(copied);
    }
    for table in TABLES {
        target.execute_batch(&format!("ALTER TABLE {table} ENABLE TRIGGER USER"))?;
    }
    Ok(out)
}

/// Puts the file of every installed component and kept tool version into the database.
fn copy_files(
    source: &Connection,
    target: &Connection,
    files: &dyn Fn(&str) -> Option<Vec<u8>>,
) -> Result<(u64, Vec<String>), StoreError> {
    let digests: Vec<String> = source
        .prepare(
            "SELECT digest FROM components WHERE kind = 'component'
             UNION SELECT digest FROM tool_versions
             WHERE component IN (SELECT name FROM components WHERE kind = 'component')
                OR component NOT IN (SELECT name FROM components)
             ORDER BY 1",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let (mut copied, mut missing) = (0, Vec::new());
    for digest in digests {
        match files(&digest) {
            Some(bytes) if crate::digest::sha256_hex(&bytes) == digest => {
                target.execute(
                    "INSERT INTO component_files (digest, bytes) VALUES (?1, ?2)",
                    crate::sql::params![digest, bytes],
                )?;
                copied += 1;
            }
            Some(_) => {
                return Err(StoreError::Corrupt(format!(
                    "the home's file of component {digest} does not have that digest"
                )));
            }
            None => missing.push(digest),
        }
    }
    Ok((copied, missing))
}

/// The columns of `table` in the SQLite store.
fn columns(source: &Connection, table: &str) -> Result<Vec<String>, StoreError> {
    let names: Vec<String> = source
        .prepare(&format!("SELECT name FROM pragma_table_info('{table}') ORDER BY cid"))?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if names.is_empty() {
        return Err(StoreError::Corrupt(format!("the SQLite store has no table {table}")));
    }
    Ok(names)
}

/// The number of rows of `table` and the SHA-256 of their renderings, sorted.
fn digest(c: &Connection, table: &str, columns: &[String]) -> Result<(u64, String), StoreError> {
    let list = columns.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ");
    let mut rendered: Vec<String> = c
        .prepare(&format!("SELECT {list} FROM {table}"))?
        .query_map([], |r| {
            let mut line = String::new();
            for i in 0..columns.len() {
                let v: Owned = r.get(i)?;
                render(&v, &mut line);
                line.push('\u{1f}');
            }
            Ok(line)
        })?
        .collect::<Result<_, _>>()?;
    rendered.sort_unstable();
    let mut all = String::new();
    for line in &rendered {
        all.push_str(line);
        all.push('\u{1e}');
    }
    Ok((rendered.len() as u64, crate::digest::sha256_hex(all.as_bytes())))
}

/// A column's value, owned.
type Owned = crate::sql::SqlValue;

/// One rendering for both databases: integers and reals as numbers, text as is, bytes in hex.
fn render(v: &Owned, out: &mut String) {
    match v {
        Owned::Null => out.push('\u{2205}'),
        Owned::Int(i) => out.push_str(&i.to_string()),
        Owned::Real(f) => out.push_str(&format!("{f:?}")),
        Owned::Text(s) => out.push_str(s),
        Owned::Blob(b) => out.push_str(&hex::encode(b)),
    }
}
