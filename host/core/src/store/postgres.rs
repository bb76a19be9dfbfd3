//! Opening a PostgreSQL store: connect, and bring the schema up to date under an advisory lock
//! (several hosts starting at once migrate one after another, never twice). Every connection
//! keel makes is bounded by the lease TTL on the server's side ([`config`]), so no host holds
//! another up for longer than that, paused or cut off as it may be.

use std::time::{Duration, Instant};

use super::StoreError;
use crate::sql::pg::{PgConn, redact};
use crate::sql::{Connection, OptionalExtension};

/// The advisory lock key migrations hold ("keel" in ASCII).
const MIGRATION_LOCK: i64 = 0x6b65_656c;

/// The advisory lock key a host's first-start installs hold ("kfst" in ASCII): hosts that
/// start at once on a fresh database install the first-party tools one after another, each
/// seeing what the one before it installed.
const FIRST_START_LOCK: i64 = 0x6b66_7374;

/// How long a host waits for another host's advisory lock (a migration, a first start's
/// installs) before it stops with an error that names the lock.
const ADVISORY_WAIT: Duration = Duration::from_secs(600);

/// The connection settings of `url`, with keel's defaults and its bounds: every connection
/// keel makes carries, as server-side settings sent when it connects (no round trip),
/// - `idle_in_transaction_session_timeout` = the lease TTL: a host paused (SIGSTOP, a VM
///   freeze) or cut off with a transaction open has it ended by the server, and its row locks
///   released, by the time its leases expire — so another host can take its sessions over
///   within the TTL and one heartbeat;
/// - `lock_timeout` = a heartbeat (a third of the TTL): no host's writer waits longer than
///   that on a lock another host holds (the operation fails, and is tried again by its
///   caller, or reported);
/// - `statement_timeout` = the lease TTL (a migration lifts it for its own statements).
///
/// Settings the URL gives in its own `options` come after keel's, and win.
pub(super) fn config(url: &str) -> Result<tokio_postgres::Config, StoreError> {
    let mut config = crate::sql::pg::config(url)?;
    let ttl = super::lease_ttl().as_millis();
    let ours = format!(
        "-c idle_in_transaction_session_timeout={ttl} -c lock_timeout={} \
         -c statement_timeout={ttl}",
        (ttl / 3).max(1)
    );
    let options = match config.get_options() {
        Some(theirs) if !theirs.trim().is_empty() => format!("{ours} {theirs}"),
        _ => ours,
    };
    config.options(&options);
    Ok(config)
}

/// Takes the session-level advisory lock `key` on `conn`, waiting (with tries, so the wait is
/// not a lock wait the connection's `lock_timeout` would end) up to [`ADVISORY_WAIT`] for
/// another host holding it; `what` names it in the error.
fn advisory_lock(conn: &Connection, key: i64, what: &str) -> Result<(), StoreError> {
    let started = Instant::now();
    loop {
        let got: bool =
            conn.query_row("SELECT pg_try_advisory_lock(?1)", [key], |r| r.get(0))?;
        if got {
            return Ok(());
        }
        if started.elapsed() >= ADVISORY_WAIT {
            return Err(StoreError::Conflict(format!(
                "another host has held the {what} lock for {} s; if it is stuck, stop it \
                 (it shows in: SELECT pid, application_name, client_addr FROM pg_locks \
                 JOIN pg_stat_activity USING (pid) WHERE locktype = 'advisory' AND \
                 objid = {key})",
                ADVISORY_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Takes the first-start lock on `conn`'s database session (waits for another host's). On
/// SQLite there is one process's writer at a time already: nothing to take.
pub(crate) fn lock_first_start(conn: &Connection) -> Result<(), StoreError> {
    if conn.pg().is_some() {
        advisory_lock(conn, FIRST_START_LOCK, "first start")?;
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
    advisory_lock(conn, MIGRATION_LOCK, "migration")?;
    // A migration's statements (an index built on a large table, a lock on a table an older
    // host still uses) may take longer than a host's bounds: lifted while it runs.
    let result = conn
        .execute_batch("SET statement_timeout = 0; SET lock_timeout = 0")
        .map_err(StoreError::from)
        .and_then(|()| apply(conn, up_to));
    let reset = conn.execute_batch("RESET statement_timeout; RESET lock_timeout");
    let unlocked = conn.query_row("SELECT pg_advisory_unlock(?1)", [MIGRATION_LOCK], |_| Ok(()));
    result?;
    reset?;
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
