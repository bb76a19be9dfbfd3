//! The single writer: one connection on a dedicated thread, off the async executor.
//!
//! Every business operation is a closure run inside its own SAVEPOINT. The writer takes all
//! operations waiting at that moment and commits them in **one** transaction — group commit: one
//! WAL fsync (under `synchronous=FULL`) acknowledges many operations, from many sessions. An
//! operation that fails is rolled back to its savepoint alone; an operation's caller hears of
//! success only after the COMMIT is durable.
//!
//! Reads do not queue behind the writer's fsync: [`Db::read`] runs on a pooled read-only
//! connection (WAL readers see the last committed state and never block the writer).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use super::StoreError;
use crate::sql::{Backend, Connection};

/// Most operations committed together.
pub const MAX_BATCH: usize = 256;
/// Read connections kept open.
pub const MAX_READERS: usize = 64;

type Completion = Box<dyn FnOnce(Option<&str>) + Send>;
type Job = Box<dyn FnOnce(Result<&Connection, &str>) -> (bool, Completion) + Send>;

/// Counters of the writer (for benchmarks and diagnostics).
#[derive(Debug, Default)]
pub struct DbStats {
    /// Transactions committed that changed something: each is one WAL sync (fsync) under
    /// `synchronous=FULL`, none under `normal` or `off`.
    pub commits: AtomicU64,
    /// Of those, the commits that waited for a sync of the log to disk: each under SQLite's
    /// `synchronous=FULL`, none under `normal` or `off` (the WAL is synced at checkpoints
    /// then); each on PostgreSQL (the server syncs before it answers).
    pub syncs: AtomicU64,
    /// Operations run by the writer.
    pub operations: AtomicU64,
    /// Reads run on the read pool.
    pub reads: AtomicU64,
    /// Batches taken by the writer (one transaction each).
    pub batches: AtomicU64,
    /// Nanoseconds the writer spent running operations.
    pub ops_ns: AtomicU64,
    /// Nanoseconds the writer spent in COMMIT (the WAL write and its fsync, and any
    /// checkpoint).
    pub commit_ns: AtomicU64,
    /// CPU time of the writer thread in COMMIT (the WAL write, its fsync and any checkpoint),
    /// in nanoseconds.
    pub commit_cpu_ns: AtomicU64,
    /// CPU time of the writer thread, in nanoseconds.
    pub cpu_ns: AtomicU64,
    /// Round trips to PostgreSQL that this store's operations and reads waited for.
    pub round_trips: AtomicU64,
    /// Times the PostgreSQL writer connected again after losing its connection.
    pub reconnects: AtomicU64,
    /// Times the PostgreSQL listener (`LISTEN keel_events`) connected and listened.
    pub listens: AtomicU64,
    /// Notifications the PostgreSQL listener received.
    pub notifications: AtomicU64,
    /// The writer thread's id in the kernel (Linux; 0 elsewhere), for its scheduler
    /// statistics in `/proc/self/task/ID/schedstat`: how long it waited for a CPU.
    pub thread_id: AtomicU64,
}

/// Where the database is.
#[derive(Debug)]
enum Source {
    Sqlite(std::path::PathBuf),
    Postgres(Box<tokio_postgres::Config>),
}

/// A handle to the database writer and read pool. Clones share them.
#[derive(Clone)]
pub struct Db {
    jobs: mpsc::UnboundedSender<Job>,
    stats: Arc<DbStats>,
    source: Arc<Source>,
    readers: Arc<std::sync::Mutex<Vec<Connection>>>,
    /// Counts this process's commits that wrote something: followers of session events wake
    /// on it at once instead of at their next poll (another process's commits are seen at
    /// the poll).
    committed: tokio::sync::watch::Receiver<u64>,
    /// Nanoseconds the writer waits after each durable commit (benchmarks only, see
    /// [`Db::emulate_sync_latency`]).
    #[cfg(feature = "bench-hooks")]
    added_sync_ns: Arc<AtomicU64>,
}

impl Db {
    /// Opens the database at `path` (migrating it) and starts its writer thread; every commit
    /// is synced (`synchronous=FULL`).
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, super::Synchronous::Full)
    }

    /// Like [`open`](Self::open), committing as durably as `sync` says.
    pub fn open_with(path: &Path, sync: super::Synchronous) -> Result<Self, StoreError> {
        let conn = super::open_with(path, sync)?;
        Self::start(conn, Source::Sqlite(path.to_path_buf()))
    }

    /// Opens the store at `location` (migrating it) and starts its writer.
    pub fn open_at(location: &super::Location) -> Result<Self, StoreError> {
        match location {
            super::Location::Sqlite { path, sync } => Self::open_with(path, *sync),
            super::Location::Postgres { url } => Self::open_postgres(url),
        }
    }

    /// Connects to the PostgreSQL database at `url` (migrating it) and starts the writer.
    pub fn open_postgres(url: &str) -> Result<Self, StoreError> {
        let config = super::postgres::config(url)?;
        let conn = super::postgres::open(&writer_config(&config), url)?;
        Self::start(conn, Source::Postgres(Box::new(config)))
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        match *self.source {
            Source::Sqlite(_) => Backend::Sqlite,
            Source::Postgres(_) => Backend::Postgres,
        }
    }

    /// A new connection of this database's (for an owner that keeps its own).
    pub fn connect(&self) -> Result<Connection, StoreError> {
        match &*self.source {
            Source::Sqlite(path) => super::open(path),
            Source::Postgres(config) => {
                Ok(Connection::postgres(crate::sql::pg::PgConn::connect(config)?))
            }
        }
    }

    fn start(conn: Connection, source: Source) -> Result<Self, StoreError> {
        let (jobs, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(DbStats::default());
        let counters = stats.clone();
        let added_sync_ns = Arc::new(AtomicU64::new(0));
        #[cfg_attr(not(feature = "bench-hooks"), allow(clippy::redundant_clone))]
        let added = added_sync_ns.clone();
        let (commits, committed) = tokio::sync::watch::channel(0u64);
        let commits = Arc::new(commits);
        let spawned = match &source {
            Source::Sqlite(_) => std::thread::Builder::new()
                .name("keel-db-writer".into())
                .spawn(move || run(conn, rx, &counters, &added, &commits)),
            Source::Postgres(config) => {
                super::listen::start((**config).clone(), commits.clone(), stats.clone())?;
                let config = writer_config(config);
                std::thread::Builder::new()
                    .name("keel-db-writer".into())
                    .spawn(move || run_postgres(conn, &config, rx, &counters, &commits))
            }
        };
        spawned.map_err(|e| StoreError::Task(format!("cannot start the database writer: {e}")))?;
        Ok(Self {
            jobs,
            stats,
            source: Arc::new(source),
            readers: Arc::new(std::sync::Mutex::new(Vec::new())),
            committed,
            #[cfg(feature = "bench-hooks")]
            added_sync_ns,
        })
    }

    /// A receiver that changes after every commit of this process that wrote something.
    pub fn commits(&self) -> tokio::sync::watch::Receiver<u64> {
        self.committed.clone()
    }

    /// Makes every durable commit take `extra` longer before its callers hear of it, as on a
    /// disk whose fsync is that much slower: the writer thread waits, holding the next batch,
    /// exactly as it would inside a slow fsync. For benchmarks that show how commits are
    /// shared on slower storage; keel itself never sets it, and only builds with the
    /// `bench-hooks` feature (the benchmarks') have it.
    #[cfg(feature = "bench-hooks")]
    #[doc(hidden)]
    pub fn emulate_sync_latency(&self, extra: std::time::Duration) {
        self.added_sync_ns.store(nanos(extra), Ordering::Relaxed);
    }

    /// Runs `op` on a read-only connection from the pool, off the async executor.
    pub async fn read<R, F>(&self, op: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnMut(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let db = self.clone();
        tokio::task::spawn_blocking(move || db.read_blocking(op))
            .await
            .map_err(|e| StoreError::Task(format!("a database read failed: {e}")))?
    }

    /// Runs a small, indexed read (a session's meta, the next request, a flag) right here, on
    /// the calling task's thread. WAL readers never wait for the writer, so such a read takes
    /// tens of microseconds; handing it to the blocking pool would cost two thread switches —
    /// more than the read. Scans and reports go through [`read`](Self::read). On PostgreSQL
    /// such a read is one round trip to the server, waited for here as well.
    pub async fn read_inline<R, F>(&self, op: F) -> Result<R, StoreError>
    where
        F: FnMut(&Connection) -> Result<R, StoreError>,
    {
        self.read_blocking(op)
    }

    /// Like [`read`](Self::read), on the calling (non-async) thread. A pooled PostgreSQL
    /// connection that turns out lost when read on (the server restarted since, and the
    /// connection had not yet noticed) is dropped and the read made again once, on a new one:
    /// a restart costs no caller an error.
    pub fn read_blocking<R, F>(&self, mut op: F) -> Result<R, StoreError>
    where
        F: FnMut(&Connection) -> Result<R, StoreError>,
    {
        let mut pooled = self.readers.lock().ok().and_then(|mut p| p.pop());
        // A PostgreSQL connection lost since it was pooled (the server restarted) is dropped.
        if pooled.as_ref().and_then(|c| c.pg()).is_some_and(|c| c.is_closed()) {
            pooled = None;
        }
        if let Some(conn) = pooled {
            let result = self.snapshot_counted(&conn, &mut op);
            if !(result.is_err() && conn.pg().is_some_and(|c| c.is_closed())) {
                self.give_back(conn);
                return result;
            }
        }
        let conn = self.connect_reader()?;
        let result = self.snapshot_counted(&conn, &mut op);
        self.give_back(conn);
        result
    }

    /// [`snapshot`], counted in the store's reads and round trips.
    fn snapshot_counted<R>(
        &self,
        conn: &Connection,
        op: impl FnOnce(&Connection) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let trips = conn.round_trips();
        let result = snapshot(conn, op);
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        self.stats.round_trips.fetch_add(conn.round_trips() - trips, Ordering::Relaxed);
        result
    }

    /// A new read-only connection to the store.
    fn connect_reader(&self) -> Result<Connection, StoreError> {
        Ok(match &*self.source {
            Source::Sqlite(path) => {
                let c = rusqlite::Connection::open_with_flags(
                    path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
                        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                c.busy_timeout(super::BUSY_TIMEOUT)?;
                super::tune(&c)?;
                Connection::from(c)
            }
            Source::Postgres(config) => {
                Connection::postgres(crate::sql::pg::PgConn::connect(config)?)
            }
        })
    }

    /// Pools `conn` again, unless the pool is full or the connection is lost or mid-transaction.
    fn give_back(&self, conn: Connection) {
        if let Ok(mut p) = self.readers.lock()
            && p.len() < MAX_READERS
            && conn.is_autocommit()
            && conn.pg().is_none_or(|c| !c.is_closed())
        {
            p.push(conn);
        }
    }

    pub fn stats(&self) -> &DbStats {
        &self.stats
    }

    /// Runs `op` as one atomic operation and returns its result once it is durably committed.
    pub async fn run<R, F>(&self, op: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let result = match conn {
                Ok(conn) => op(conn),
                Err(message) => Err(StoreError::Commit { message: message.to_string() }),
            };
            let ok = result.is_ok();
            let done: Completion = Box::new(move |commit_error| {
                let _ = tx.send(match commit_error {
                    None => result,
                    Some(message) => Err(StoreError::Commit { message: message.to_string() }),
                });
            });
            (ok, done)
        });
        self.jobs.send(job).map_err(|_| StoreError::WriterGone)?;
        rx.await.map_err(|_| StoreError::WriterGone)?
    }
}

fn run(
    conn: Connection,
    mut rx: mpsc::UnboundedReceiver<Job>,
    stats: &DbStats,
    #[cfg_attr(not(feature = "bench-hooks"), allow(unused_variables))] added_sync_ns: &AtomicU64,
    commits: &tokio::sync::watch::Sender<u64>,
) {
    #[cfg(target_os = "linux")]
    stats.thread_id.store(
        u64::try_from(rustix::thread::gettid().as_raw_nonzero().get()).unwrap_or(0),
        Ordering::Relaxed,
    );
    // Whether each commit syncs the WAL (`FULL` is 2, `EXTRA` 3).
    let syncs = conn
        .prepare("PRAGMA synchronous")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
        .is_ok_and(|v| v >= 2);
    while let Some(first) = rx.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut done = Vec::with_capacity(batch.len());
        let changes_before = conn.total_changes();
        let started = std::time::Instant::now();
        stats.batches.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = exec(&conn, conn.begin_write()) {
            // Run nothing; every caller hears why.
            let message = format!("cannot begin a transaction: {e}");
            for job in batch {
                let (_, completion) = job(Err(&message));
                completion(None);
            }
            continue;
        }
        // Set when the database rolled the whole transaction back by itself (it may on a full
        // disk or an I/O error): every operation of the batch is then reported failed.
        let mut aborted: Option<String> = None;
        for job in batch {
            if let Some(message) = &aborted {
                let (_, completion) = job(Err(message));
                done.push(completion);
                continue;
            }
            let _ = exec(&conn, "SAVEPOINT op");
            let (ok, completion) = job(Ok(&conn));
            if conn.is_autocommit() {
                aborted = Some(
                    "the database rolled the transaction back (is the disk full?); nothing of it was stored"
                        .to_string(),
                );
            } else if ok {
                let _ = exec(&conn, "RELEASE op");
            } else {
                let _ = exec(&conn, "ROLLBACK TO op").and_then(|_| exec(&conn, "RELEASE op"));
            }
            stats.operations.fetch_add(1, Ordering::Relaxed);
            done.push(completion);
        }
        if let Some(message) = aborted {
            for completion in done {
                completion(Some(&message));
            }
            continue;
        }
        let wrote = conn.total_changes() != changes_before;
        let committing = std::time::Instant::now();
        stats.ops_ns.fetch_add(nanos(committing - started), Ordering::Relaxed);
        let cpu_before = thread_cpu_ns();
        let commit = exec(&conn, "COMMIT");
        let cpu = thread_cpu_ns();
        stats.commit_cpu_ns.fetch_add(cpu.saturating_sub(cpu_before), Ordering::Relaxed);
        #[cfg(feature = "bench-hooks")]
        {
            let added = added_sync_ns.load(Ordering::Relaxed);
            if wrote && added > 0 {
                std::thread::sleep(std::time::Duration::from_nanos(added));
            }
        }
        stats.commit_ns.fetch_add(nanos(committing.elapsed()), Ordering::Relaxed);
        if wrote {
            stats.commits.fetch_add(1, Ordering::Relaxed);
            if syncs {
                stats.syncs.fetch_add(1, Ordering::Relaxed);
            }
            crate::metrics::COMMIT.observe(&[], committing.elapsed().as_secs_f64());
        }
        stats.cpu_ns.store(cpu, Ordering::Relaxed);
        let error = match commit {
            Ok(()) => None,
            Err(e) => {
                let _ = exec(&conn, "ROLLBACK");
                Some(e.to_string())
            }
        };
        for completion in done {
            completion(error.as_deref());
        }
        if wrote && error.is_none() {
            commits.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// The writer's connection settings: the store's, under a name of its own (`keel-writer`,
/// unless the URL named its connections) that tells it apart from the readers in
/// `pg_stat_activity`.
fn writer_config(config: &tokio_postgres::Config) -> tokio_postgres::Config {
    let mut config = config.clone();
    if config.get_application_name() == Some("keel") {
        config.application_name("keel-writer");
    }
    config
}

/// The writer of a PostgreSQL store: each operation in a transaction of its own (the server
/// shares fsyncs between the hosts' concurrent commits itself, and one operation per
/// transaction keeps row locks from being held across sessions), on one connection, made
/// again when it is lost (the operation that found it lost fails; the next one reconnects).
fn run_postgres(
    mut conn: Connection,
    config: &tokio_postgres::Config,
    mut rx: mpsc::UnboundedReceiver<Job>,
    stats: &DbStats,
    commits: &tokio::sync::watch::Sender<u64>,
) {
    while let Some(job) = rx.blocking_recv() {
        if conn.pg().is_some_and(|c| c.is_closed()) {
            match crate::sql::pg::PgConn::connect(config) {
                Ok(c) => {
                    conn = Connection::postgres(c);
                    stats.reconnects.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    let message = format!("the database is unreachable: {e}");
                    let (_, completion) = job(Err(&message));
                    completion(None);
                    continue;
                }
            }
        }
        stats.batches.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let trips = conn.round_trips();
        if let Err(e) = exec(&conn, "BEGIN") {
            let message = format!("cannot begin a transaction: {e}");
            let (_, completion) = job(Err(&message));
            completion(None);
            continue;
        }
        let changes_before = conn.total_changes();
        let (ok, completion) = job(Ok(&conn));
        stats.operations.fetch_add(1, Ordering::Relaxed);
        let committing = std::time::Instant::now();
        stats.ops_ns.fetch_add(nanos(committing - started), Ordering::Relaxed);
        if !ok {
            let _ = exec(&conn, "ROLLBACK");
            stats.round_trips.fetch_add(conn.round_trips() - trips, Ordering::Relaxed);
            completion(None);
            continue;
        }
        let wrote = conn.total_changes() != changes_before;
        let error = exec(&conn, "COMMIT").err().map(|e| {
            let _ = exec(&conn, "ROLLBACK");
            e.to_string()
        });
        stats.commit_ns.fetch_add(nanos(committing.elapsed()), Ordering::Relaxed);
        if wrote {
            // The server syncs its WAL before it answers a COMMIT (`synchronous_commit`).
            stats.commits.fetch_add(1, Ordering::Relaxed);
            stats.syncs.fetch_add(1, Ordering::Relaxed);
            crate::metrics::COMMIT.observe(&[], committing.elapsed().as_secs_f64());
        }
        stats.round_trips.fetch_add(conn.round_trips() - trips, Ordering::Relaxed);
        completion(error.as_deref());
        if wrote && error.is_none() {
            commits.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// Runs `op` in one read transaction: every statement of it sees the same committed state
/// (a session's meta and its history, say, from the same commit), and the connection takes its
/// read lock and checks the WAL once instead of once per statement.
fn snapshot<R>(
    conn: &Connection,
    op: impl FnOnce(&Connection) -> Result<R, StoreError>,
) -> Result<R, StoreError> {
    exec(
        conn,
        match conn.backend() {
            Backend::Sqlite => "BEGIN",
            // One snapshot for every statement of the read, as SQLite's read transaction.
            Backend::Postgres => "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
        },
    )?;
    let result = op(conn);
    // A read transaction has nothing to keep; ending it cannot lose anything. A connection
    // still in a transaction after this is not put back in the pool.
    let _ = exec(conn, "COMMIT");
    result
}

/// Runs one transaction-control statement from the statement cache (the writer runs four of
/// them per operation or batch; parsing each anew showed in its profile).
fn exec(conn: &Connection, sql: &str) -> crate::sql::Result<()> {
    conn.control(sql)
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn blobs(c: &Connection) -> Result<i64, StoreError> {
        Ok(c.query_row("SELECT COUNT(*) FROM blobs", [], |r| r.get(0))?)
    }

    #[test]
    fn a_read_sees_one_committed_state_while_another_connection_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keel.db");
        let db = Db::open(&path).unwrap();
        let other = super::super::open(&path).unwrap();
        let other = other.sqlite().unwrap();
        let (before, during) = db
            .read_blocking(|c| {
                let before = blobs(c)?;
                other.execute("INSERT INTO blobs (hash, body) VALUES ('h', 'b')", [])?;
                Ok((before, blobs(c)?))
            })
            .unwrap();
        assert_eq!((before, during), (0, 0), "one read, one snapshot");
        // The next read (on the same pooled connection) sees the commit.
        assert_eq!(db.read_blocking(blobs).unwrap(), 1);
        assert_eq!(db.stats().reads.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn the_writer_counts_its_cpu_in_commit_apart() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("keel.db")).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        for i in 0..20 {
            rt.block_on(db.run(move |c| {
                c.execute("INSERT INTO blobs (hash, body) VALUES (?1, 'b')", [i])?;
                Ok(())
            }))
            .unwrap();
        }
        let stats = db.stats();
        assert_eq!(stats.commits.load(Ordering::Relaxed), 20);
        let (in_commit, all) =
            (stats.commit_cpu_ns.load(Ordering::Relaxed), stats.cpu_ns.load(Ordering::Relaxed));
        // Twenty synced commits take CPU (the WAL write and its fsync), and never more than the
        // writer thread used in all.
        assert!(in_commit > 0 && in_commit <= all, "{in_commit} ns in COMMIT of {all} ns");
    }
}
