//! Store: the SQLite database (rusqlite, WAL, `synchronous=FULL`).
//!
//! Owns the connection setup and the numbered schema migrations, each applied in its own
//! transaction together with its version record, so a crash mid-migration leaves the old or
//! the new schema, never half. It holds no business rules: the owners' modules write their
//! facts, each change in one transaction.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

/// How long a writer waits for another process's lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Numbered migrations; append only, never edit one that shipped.
const MIGRATIONS: &[(i64, &str)] = &[(
    1,
    "CREATE TABLE components (
        name         TEXT PRIMARY KEY,
        digest       TEXT NOT NULL,
        size         INTEGER NOT NULL,
        source       TEXT NOT NULL,
        builtin      INTEGER NOT NULL,
        installed_at TEXT NOT NULL
    );
    CREATE TABLE tools (
        name          TEXT PRIMARY KEY,
        component     TEXT NOT NULL REFERENCES components(name) ON DELETE CASCADE,
        description   TEXT NOT NULL,
        input_schema  TEXT NOT NULL,
        output_schema TEXT,
        effect        TEXT NOT NULL,
        idempotent    INTEGER NOT NULL,
        spec_digest   TEXT NOT NULL
    );
    CREATE INDEX tools_by_component ON tools(component);",
)];

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error(
        "database schema version {found} is newer than this keel understands ({known}); \
         upgrade keel"
    )]
    TooNew { found: i64, known: i64 },
}

/// Opens (creating if needed) the database at `path` and brings its schema up to date.
pub fn open(path: &Path) -> Result<Connection, StoreError> {
    let open_err = |source| StoreError::Open { path: path.display().to_string(), source };
    let mut conn = Connection::open(path).map_err(open_err)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(open_err)?;
    conn.pragma_update(None, "synchronous", "FULL").map_err(open_err)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(open_err)?;
    migrate(&mut conn)?;
    Ok(conn)
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)",
    )?;
    let known = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
    for &(version, sql) in MIGRATIONS {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let done: bool = tx.query_row(
            "SELECT EXISTS(SELECT 1 FROM schema_migrations WHERE version = ?1)",
            [version],
            |r| r.get(0),
        )?;
        if !done {
            tx.execute_batch(sql)?;
            tx.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, datetime('now'))",
                [version],
            )?;
        }
        tx.commit()?;
    }
    let found: i64 =
        conn.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| {
            r.get(0)
        })?;
    if found > known {
        return Err(StoreError::TooNew { found, known });
    }
    Ok(())
}
