//! Store: the SQLite database (rusqlite, WAL, `synchronous=FULL` unless configured otherwise:
//! [`Synchronous`]).
//!
//! Owns the connection setup and the numbered schema migrations, each applied in its own
//! transaction together with its version record, so a crash mid-migration leaves the old or
//! the new schema, never half. It holds no business rules: the owners' modules write their
//! facts, each change in one transaction.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use crate::sql;

mod migrations;

/// Prepared statements kept per connection.
pub const STATEMENT_CACHE: usize = 128;

/// How long a writer waits for another process's lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// A runner lease not renewed for this long is considered abandoned (its process died),
/// unless `KEEL_LEASE_TTL_MS` says otherwise ([`lease_ttl`]).
pub const LEASE_TTL: Duration = Duration::from_secs(15);

/// The lease TTL in force: `KEEL_LEASE_TTL_MS` (at least 300 ms), else [`LEASE_TTL`]. A
/// shorter TTL lets another host take over a dead one's sessions sooner, at the cost of more
/// frequent heartbeats (every third of the TTL) and of a paused process losing its sessions
/// sooner. Read once per process; every host of one store should use the same value. The
/// store bounds what one host may hold on a shared PostgreSQL database by it: an open
/// transaction, a statement, a lock wait (see `postgres::config`).
pub fn lease_ttl() -> Duration {
    static TTL: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *TTL.get_or_init(|| {
        std::env::var("KEEL_LEASE_TTL_MS")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|ms| Duration::from_millis(ms.max(300)))
            .unwrap_or(LEASE_TTL)
    })
}

/// The schema version this build migrates a database to.
pub fn schema_version() -> i64 {
    migrations::latest()
}

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: sql::Error,
    },
    #[error("database error: {0}")]
    Sql(#[from] sql::Error),
    #[error("the database commit failed: {message}")]
    Commit { message: String },
    #[error("the database writer has stopped")]
    WriterGone,
    /// What was asked for does not exist (a session, a step's evidence …).
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with what is stored (a session id taken, an approval used).
    #[error("{0}")]
    Conflict(String),
    /// The request itself cannot be stored (an empty input, an id keel cannot use).
    #[error("{0}")]
    Input(String),
    /// Stored data does not read back as keel wrote it (unreadable, or altered).
    #[error("{0}")]
    Corrupt(String),
    /// A runner's write refused because its lease was taken over (its fencing token is
    /// stale): the runner stops and never retries the write.
    #[error("{0}")]
    Fenced(String),
    /// A task of the store or of its caller failed (it panicked or could not start).
    #[error("{0}")]
    Task(String),
    #[error(
        "database schema version {found} is newer than this keel understands ({known}); \
         upgrade keel"
    )]
    TooNew { found: i64, known: i64 },
}

impl StoreError {
    /// A stable name of the error's kind: `not_found`, `conflict`, `input`, `corrupt`, or
    /// `store` for a failure of the database itself.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::Conflict(_) => "conflict",
            Self::Input(_) => "input",
            Self::Corrupt(_) => "corrupt",
            Self::Fenced(_) => "fenced",
            // Another host holds the rows (and did not let go within a heartbeat): the
            // request conflicts with its work, and may be made again.
            e if e.is_lock_timeout() => "conflict",
            Self::Open { .. }
            | Self::Sql(_)
            | Self::Commit { .. }
            | Self::WriterGone
            | Self::Task(_)
            | Self::TooNew { .. } => "store",
        }
    }

    /// Whether the database could not be reached or its connection was lost (a server that
    /// restarted or is starting, a backend that was killed): the next operation connects
    /// again, so a reader that waits and asks again may succeed. An error the server answered
    /// with (a SQLSTATE) is not, unless its class says the connection went: `08` (connection
    /// exception) or `57P01`–`57P03` (shut down, crashed, not yet accepting connections).
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Open { .. } => true,
            Self::Sql(sql::Error::Postgres(m)) => match m.split_once("(SQLSTATE ") {
                None => true,
                Some((_, code)) => {
                    code.starts_with("08") || ["57P01", "57P02", "57P03"].iter().any(|c| code.starts_with(c))
                }
            },
            _ => false,
        }
    }

    /// Whether a lock wait outlasted the connection's `lock_timeout` (PostgreSQL's SQLSTATE
    /// 55P03): another host held the rows the operation needed. A statement sent without
    /// waiting may report it only at the `COMMIT`.
    pub fn is_lock_timeout(&self) -> bool {
        matches!(self, Self::Sql(sql::Error::Postgres(m)) | Self::Commit { message: m }
            if m.contains("SQLSTATE 55P03"))
    }

    /// The error's kind, as the result of a tool call it stopped carries it.
    pub fn failure(&self) -> crate::failure::FailureKind {
        use crate::failure::FailureKind;
        match self {
            e if e.is_lock_timeout() => FailureKind::Conflict,
            Self::NotFound(_) => FailureKind::NotFound,
            Self::Conflict(_) => FailureKind::Conflict,
            Self::Input(_) => FailureKind::Input,
            Self::Corrupt(_) => FailureKind::Corrupt,
            _ => FailureKind::Store,
        }
    }
}

pub mod blobs;
pub mod copy;
mod listen;
mod postgres;
pub(crate) use postgres::{lock_first_start, unlock_first_start};
mod postgres_schema;

mod writer;

pub use writer::{Db, DbStats};

/// Where a store is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A SQLite file, committing as durably as `sync` says (the embedded default).
    Sqlite { path: std::path::PathBuf, sync: Synchronous },
    /// A PostgreSQL database (`postgres://…`), which several hosts may share.
    Postgres { url: String },
}

impl Location {
    /// The location as it may be shown (a URL without its password).
    pub fn display(&self) -> String {
        match self {
            Self::Sqlite { path, .. } => path.display().to_string(),
            Self::Postgres { url } => sql::pg::redact(url),
        }
    }
}

/// A connection to the store at `location` (migrated).
pub fn connect(location: &Location) -> Result<sql::Connection, StoreError> {
    match location {
        Location::Sqlite { path, sync } => open_with(path, *sync),
        Location::Postgres { url } => postgres::open(&postgres::config(url)?, url),
    }
}

/// Tests only (`internals`): with `KEEL_TEST_POSTGRES` naming a PostgreSQL server (a
/// `postgres://` URL without a database), every home gets a database of its own on it, made
/// from the migrated template database `keel_template` when first used — so the whole suite
/// runs against PostgreSQL unchanged.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub fn per_home_test_database(home: &Path) -> Result<Option<String>, StoreError> {
    let Some(server) = std::env::var("KEEL_TEST_POSTGRES").ok().filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let digest = crate::digest::sha256_hex(home.to_string_lossy().as_bytes());
    let name = format!("keel_{}", &digest[..16]);
    let base = server.trim_end_matches('/');
    let admin = sql::pg::PgConn::connect(&sql::pg::config(&format!("{base}/postgres"))?)?;
    let admin = sql::Connection::postgres(admin);
    let exists = admin.prepare("SELECT 1 FROM pg_database WHERE datname = ?1")?.exists([&name])?;
    if !exists {
        // Two processes of one test may race to create it: the loser finds it made.
        if let Err(e) =
            admin.execute_batch(&format!("CREATE DATABASE {name} TEMPLATE keel_template"))
        {
            let made =
                admin.prepare("SELECT 1 FROM pg_database WHERE datname = ?1")?.exists([&name])?;
            if !made {
                return Err(e.into());
            }
        }
    }
    Ok(Some(format!("{base}/{name}")))
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sql(sql::Error::Sqlite(e))
    }
}

/// A value as the JSON text of a column.
pub fn json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v)
        .map_err(|e| StoreError::Corrupt(format!("a value cannot be encoded: {e}")))
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// How durably a commit is written (SQLite's `synchronous` in WAL mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit's WAL write is synced (one fsync) before keel reports it: a power loss
    /// loses nothing that was reported committed. The default.
    #[default]
    Full,
    /// Commits are not synced; the WAL is synced at checkpoints. A crash of keel loses
    /// nothing, a power loss or kernel crash may lose the last commits (never the database's
    /// consistency). No fsync on a step's path.
    Normal,
    /// Nothing is ever synced: a power loss may corrupt the database. For throwaway homes.
    Off,
}

impl Synchronous {
    /// The value of `PRAGMA synchronous`.
    pub fn pragma(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
            Self::Off => "OFF",
        }
    }
}

impl std::str::FromStr for Synchronous {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "full" => Ok(Self::Full),
            "normal" => Ok(Self::Normal),
            "off" => Ok(Self::Off),
            _ => Err(format!(
                "`{}` is not a synchronous mode: use full (every commit synced, the default), \
                 normal (synced at checkpoints) or off (never synced)",
                s.escape_debug()
            )),
        }
    }
}

/// Opens (creating if needed) the database at `path` and brings its schema up to date, with
/// every commit synced (`synchronous=FULL`).
pub fn open(path: &Path) -> Result<sql::Connection, StoreError> {
    open_with(path, Synchronous::Full)
}

/// Like [`open`], committing as durably as `sync` says.
///
/// SQLite is built without its own directory syncs (`SQLITE_DISABLE_DIRSYNC`: it would sync
/// the directory the first time every process syncs the WAL). The directory entries that
/// matter are the database's and its WAL's; when either file is new, this syncs the directory
/// once, before any business commit, unless nothing is synced at all (`synchronous=off`).
pub fn open_with(path: &Path, sync: Synchronous) -> Result<sql::Connection, StoreError> {
    open_sqlite(path, sync).map(sql::Connection::from)
}

fn open_sqlite(path: &Path, sync: Synchronous) -> Result<Connection, StoreError> {
    let open_err = |source: rusqlite::Error| StoreError::Open {
        path: path.display().to_string(),
        source: source.into(),
    };
    let new_files = !path.exists() || !wal_path(path).exists();
    if !path.exists() {
        // Created private: SQLite gives the WAL and shared-memory files the database's mode.
        crate::home::touch_private(path).map_err(|e| {
            StoreError::Task(format!("cannot create the database {}: {e}", path.display()))
        })?;
    }
    let mut conn = Connection::open(path).map_err(open_err)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(open_err)?;
    conn.pragma_update(None, "synchronous", sync.pragma()).map_err(open_err)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(open_err)?;
    tune(&conn).map_err(open_err)?;
    migrate(&mut conn)?;
    if new_files && sync != Synchronous::Off {
        sync_parent(path)?;
    }
    Ok(conn)
}

/// The WAL file of the database at `path`.
fn wal_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    name.into()
}

/// Makes the directory entries of `path`'s directory durable.
fn sync_parent(path: &Path) -> Result<(), StoreError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::Task(format!("cannot sync the directory {}: {e}", dir.display())))
}

/// Per-connection settings of every connection keel opens.
pub(crate) fn tune(conn: &Connection) -> rusqlite::Result<()> {
    // Every business operation uses cached statements; the default cache (16) is smaller than
    // the writer's working set.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Query-planner stability: without it, a cached statement whose plan could depend on a
    // bound value is re-prepared whenever that value changes — on every call of the hot
    // statements here (it was a third of the writer's CPU).
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

/// Opens the database at `path` with its schema brought only up to migration `version` — how a
/// database written by an older keel looks (for upgrade tests).
#[doc(hidden)]
#[cfg(any(test, feature = "internals"))]
pub fn open_at_version(path: &Path, version: i64) -> Result<Connection, StoreError> {
    let mut conn = Connection::open(path).map_err(|source| StoreError::Open {
        path: path.display().to_string(),
        source: source.into(),
    })?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    migrate_to(&mut conn, version)?;
    Ok(conn)
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    migrate_to(conn, i64::MAX)
}

fn migrate_to(conn: &mut Connection, up_to: i64) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)",
    )?;
    let known = migrations::latest();
    for (version, sql) in migrations::sqlite().filter(|m| m.0 <= up_to) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let done: bool = tx.query_row(
            "SELECT EXISTS(SELECT 1 FROM schema_migrations WHERE version = ?1)",
            [version],
            |r| r.get(0),
        )?;
        if !done {
            tx.execute_batch(&sql)?;
            tx.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, datetime('now'))",
                [version],
            )?;
            crate::crash::point("mid_migration");
        }
        tx.commit()?;
    }
    let found: i64 =
        conn.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| {
            r.get(0)
        })?;
    not_newer(found, known)
}

/// Refuses a database whose schema (`found`) is newer than this build's (`known`).
fn not_newer(found: i64, known: i64) -> Result<(), StoreError> {
    if found > known {
        return Err(StoreError::TooNew { found, known });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg(m: &str) -> StoreError {
        StoreError::Sql(sql::Error::Postgres(m.into()))
    }

    /// A lost or refused connection is waited out; an error the server answered is not,
    /// unless it says the connection went; a lock timeout is a conflict.
    #[test]
    fn unreachable_and_lock_timeout_are_told_from_other_errors() {
        assert!(pg("connection closed").is_unreachable());
        assert!(pg("cannot connect to PostgreSQL: error connecting to server").is_unreachable());
        let killed = "terminating connection due to administrator command (SQLSTATE 57P01)";
        assert!(pg(killed).is_unreachable());
        assert!(pg("the database system is starting up (SQLSTATE 57P03)").is_unreachable());
        assert!(!pg("duplicate key value violates unique constraint (SQLSTATE 23505)").is_unreachable());
        let timeout = pg("canceling statement due to lock timeout (SQLSTATE 55P03)");
        assert!(!timeout.is_unreachable());
        assert!(timeout.is_lock_timeout());
        assert_eq!(timeout.kind(), "conflict");
        assert_eq!(pg("connection closed").kind(), "store");
        let at_commit = StoreError::Commit {
            message: "canceling statement due to lock timeout (SQLSTATE 55P03)".into(),
        };
        assert_eq!(at_commit.kind(), "conflict");
    }

    #[test]
    fn migration_20_types_the_owners_of_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keel.db");
        let c = open_at_version(&path, 19).unwrap();
        for (id, owner) in [
            ("a", r#"{"token":"alice","user_decides":true}"#),
            ("e", r#"{"token":"KEEL_API_TOKEN","user_decides":false}"#),
        ] {
            c.execute(
                "INSERT INTO sessions (id, created_at, state, meta_version) VALUES (?1, 0, 'idle', 0)",
                [id],
            )
            .unwrap();
            c.execute(
                "INSERT INTO session_config (session_id, loaded_tools, policy, budget, model, system_prompt, owner)
                 VALUES (?1, '[]', '{}', '{}', '{}', '', ?2)",
                [id, owner],
            )
            .unwrap();
        }
        drop(c);
        let mut c = Connection::open(&path).unwrap();
        migrate(&mut c).unwrap();
        let owner = |id: &str| -> serde_json::Value {
            let text: String = c
                .query_row("SELECT owner FROM session_config WHERE session_id = ?1", [id], |r| {
                    r.get(0)
                })
                .unwrap();
            serde_json::from_str(&text).unwrap()
        };
        assert_eq!(
            owner("a"),
            serde_json::json!({"principal": "token:alice", "user_decides": true})
        );
        assert_eq!(owner("e")["principal"], "env:KEEL_API_TOKEN");
        let v: i64 = c.query_row("SELECT version FROM access_version", [], |r| r.get(0)).unwrap();
        c.execute(
            "INSERT INTO api_tokens (name, role, hash, created_at) VALUES ('x', 'user', 'h', 0)",
            [],
        )
        .unwrap();
        c.execute("DELETE FROM api_tokens WHERE name = 'x'", []).unwrap();
        let w: i64 = c.query_row("SELECT version FROM access_version", [], |r| r.get(0)).unwrap();
        assert_eq!(w, v + 2);
    }
}
