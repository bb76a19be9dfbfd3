//! Opening a PostgreSQL store: connect, and bring the schema up to date under an advisory lock
//! (several hosts starting at once migrate one after another, never twice).

use super::StoreError;
use crate::sql::pg::{PgConn, redact};
use crate::sql::{Connection, OptionalExtension};

/// The advisory lock key migrations hold ("keel" in ASCII).
const MIGRATION_LOCK: i64 = 0x6b65_656c;

/// The advisory lock key a host's first-start installs hold ("kfst" in ASCII): hosts that
/// start at once on a fresh database install the first-party tools one after another, each
/// seeing what the one before it installed.
const FIRST_START_LOCK: i64 = 0x6b66_7374;

/// Takes the first-start lock on `conn`'s database session (waits for another host's). On
/// SQLite there is one process's writer at a time already: nothing to take.
pub(crate) fn lock_first_start(conn: &Connection) -> Result<(), StoreError> {
    if conn.pg().is_some() {
        conn.query_row("SELECT pg_advisory_lock(?1)", [FIRST_START_LOCK], |_| Ok(()))?;
    }
    Ok(())
}

/// Releases what [`lock_first_start`] took (a session's advisory locks also go with it when
/// its connection closes).
pub(crate) fn unlock_first_start(conn: &Connection) -> Result<(), StoreError> {
    if conn.pg().is_some() {
        conn.query_row("SELECT pg_advisory_unlock(?1)", [FIRST_START_LOCK], |_| Ok(()))?;
    }
    Ok(())
}

/// Connects to the database of `config` (`url` names it in errors, without its password) and
/// migrates it.
pub(super) fn open(config: &tokio_postgres::Config, url: &str) -> Result<Connection, StoreError> {
    let conn =
        PgConn::connect(config).map_err(|source| StoreError::Open { path: redact(url), source })?;
    let conn = Connection::postgres(conn);
    migrate(&conn, i64::MAX)?;
    Ok(conn)
}

/// Applies the migrations up to `up_to` that the database lacks, each in its own transaction
/// with its version record.
pub(super) fn migrate(conn: &Connection, up_to: i64) -> Result<(), StoreError> {
    conn.query_row("SELECT pg_advisory_lock(?1)", [MIGRATION_LOCK], |_| Ok(()))?;
    let result = apply(conn, up_to);
    let unlocked = conn.query_row("SELECT pg_advisory_unlock(?1)", [MIGRATION_LOCK], |_| Ok(()));
    result?;
    unlocked?;
    Ok(())
}

fn apply(conn: &Connection, up_to: i64) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at TEXT NOT NULL)",
    )?;
    let known = super::migrations::latest();
    for (version, sql) in super::migrations::postgres().filter(|m| m.0 <= up_to) {
        let done = conn
            .prepare("SELECT version FROM schema_migrations WHERE version = ?1")?
            .query_row([version], |r| r.get::<_, i64>(0))
            .optional()?
            .is_some();
        if done {
            continue;
        }
        conn.control("BEGIN")?;
        let applied = conn.execute_batch(&sql).and_then(|()| {
            conn.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS'))",
                [version],
            )
        });
        match applied {
            Ok(_) => conn.control("COMMIT")?,
            Err(e) => {
                let _ = conn.control("ROLLBACK");
                return Err(StoreError::Commit { message: format!("migration {version}: {e}") });
            }
        }
    }
    let found: i64 =
        conn.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| {
            r.get(0)
        })?;
    super::not_newer(found, known)
}
