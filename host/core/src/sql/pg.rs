//! The PostgreSQL driver of [`Connection`](super::Connection): `tokio-postgres` connections
//! whose protocol tasks run on one background runtime thread, used synchronously by the store's
//! operations (which run off the async executor, on the writer thread or the read pool, as with
//! SQLite). A call waits for its reply without entering any runtime, so it is safe from any
//! thread.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use tokio_postgres::config::SslMode;
use tokio_postgres::types::{FromSql as PgFromSql, IsNull, ToSql as PgToSql, Type, to_sql_checked};

use super::{Error, Result, SqlRef, SqlValue};

type BoxError = Box<dyn std::error::Error + Sync + Send>;

/// How long connecting may take before it fails, unless the URL says otherwise.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The runtime that drives every PostgreSQL connection's protocol (and the listeners).
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("keel-pg")
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the PostgreSQL runtime: {e}"))
    })
    .as_ref()
    .map_err(|e| Error::Postgres(e.clone()))
}

/// Round trips to PostgreSQL waited for by this process, and the time spent waiting.
static ROUND_TRIPS: AtomicU64 = AtomicU64::new(0);
static WAITED_NS: AtomicU64 = AtomicU64::new(0);

/// How many round trips to PostgreSQL this process has waited for, and for how long in all.
#[cfg(any(test, feature = "internals"))]
pub fn round_trips() -> (u64, Duration) {
    (ROUND_TRIPS.load(Ordering::Relaxed), Duration::from_nanos(WAITED_NS.load(Ordering::Relaxed)))
}

/// Waits for `f` — one round trip to the server — on this thread. The client's futures only
/// exchange messages with the connection's task on the background runtime, so no runtime is
/// needed here.
fn wait<F: std::future::Future>(f: F) -> F::Output {
    let started = std::time::Instant::now();
    let out = futures_executor::block_on(f);
    ROUND_TRIPS.fetch_add(1, Ordering::Relaxed);
    let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    WAITED_NS.fetch_add(ns, Ordering::Relaxed);
    out
}

/// A PostgreSQL error as keel reports it: the server's message with its SQLSTATE code, or the
/// client's.
pub(crate) fn error(e: &tokio_postgres::Error) -> Error {
    Error::Postgres(describe(e))
}

pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(d) = db.detail() {
                s.push_str(": ");
                s.push_str(d);
            }
            s
        }
        None => {
            let mut s = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(inner) = source {
                s.push_str(": ");
                s.push_str(&inner.to_string());
                source = inner.source();
            }
            s
        }
    }
}

/// Parses a `postgres://` URL, with keel's defaults for what it leaves out.
pub(crate) fn config(url: &str) -> Result<tokio_postgres::Config> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e: tokio_postgres::Error| {
        Error::Postgres(format!("`{}` is not a PostgreSQL URL: {}", redact(url), describe(&e)))
    })?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    config.keepalives(true).keepalives_idle(Duration::from_secs(30));
    if config.get_application_name().is_none() {
        config.application_name("keel");
    }
    // TLS when the URL requires it, with the server's certificate verified; `prefer` (the
    // default) is taken as `disable`: keel never sends a password over a connection whose
    // certificate it did not check.
    if config.get_ssl_mode() != SslMode::Require {
        config.ssl_mode(SslMode::Disable);
    }
    Ok(config)
}

/// What connects to PostgreSQL: TLS, used when the configuration requires it.
pub(crate) fn tls() -> super::pg_tls::MakeRustls {
    super::pg_tls::MakeRustls
}

/// `url` with its password replaced, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// How many prepared statements a connection keeps.
const MAX_CACHED: usize = 512;

/// A connection, used from one thread at a time.
///
/// It waits for the server as little as it can: a transaction's `BEGIN` goes with its first
/// statement, a read-only transaction's `COMMIT` with the next request, and a statement whose
/// outcome the caller does not read ([`PgConn::execute_pipelined`]) with whatever follows it —
/// the client sends requests in order without waiting, so each of these rides another request's
/// round trip.
pub(crate) struct PgConn {
    client: Arc<tokio_postgres::Client>,
    cache: RefCell<HashMap<String, PgStatement>>,
    changes: Cell<u64>,
    in_tx: Cell<bool>,
    /// Whether the open transaction is read-only.
    read_only: Cell<bool>,
    /// What [`PgConn::first_in_transaction`] has seen in the open transaction.
    marks: RefCell<std::collections::HashSet<String>>,
    /// A `BEGIN` not sent yet: it goes with the transaction's first statement, in the same
    /// round trip (and not at all when no statement follows).
    pending_begin: RefCell<Option<String>>,
    /// Requests sent whose replies are not read yet, oldest first.
    sent: RefCell<Vec<Sent>>,
    /// Queries sent ahead of the statements that will read them ([`PgConn::prefetch`]).
    prefetched: RefCell<Vec<Prefetched>>,
    /// Round trips this connection has waited for.
    trips: Cell<u64>,
}

/// A query sent ahead: the statement, its parameters, and its rows once its reply is read.
struct Prefetched {
    sql: Arc<str>,
    params: Vec<SqlValue>,
    rows: Arc<std::sync::Mutex<Option<Vec<PgRow>>>>,
}

type Reply = Pin<Box<dyn Future<Output = std::result::Result<(), tokio_postgres::Error>> + Send>>;

/// A request sent without waiting for its reply.
struct Sent {
    reply: Reply,
    /// Whether its error fails the request whose round trip it shares (a read-only
    /// transaction's `COMMIT` has nothing to lose, and its error is dropped).
    checked: bool,
    /// Whether it is a `BEGIN`: one that failed leaves no transaction open.
    begin: bool,
}

/// A prepared statement, and whether it may change rows.
#[derive(Clone)]
pub(crate) struct PgStatement {
    stmt: tokio_postgres::Statement,
    writes: bool,
    /// Its text as keel wrote it (the cache's key).
    sql: Arc<str>,
}

pub(crate) type PgRow = tokio_postgres::Row;

impl PgConn {
    /// Connects to the database `config` names.
    pub(crate) fn connect(config: &tokio_postgres::Config) -> Result<Self> {
        let config = config.clone();
        let tls = tls();
        let (tx, rx) = std::sync::mpsc::channel();
        runtime()?.spawn(async move {
            match config.connect(tls).await {
                Ok((client, connection)) => {
                    if tx.send(Ok(client)).is_ok()
                        && let Err(e) = connection.await
                    {
                        tracing::debug!(error = %describe(&e), "a PostgreSQL connection ended");
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
        let client = rx
            .recv()
            .map_err(|_| Error::Postgres("the PostgreSQL runtime stopped".into()))?
            .map_err(|e| {
                Error::Postgres(format!("cannot connect to PostgreSQL: {}", describe(&e)))
            })?;
        Ok(Self {
            client: Arc::new(client),
            cache: RefCell::new(HashMap::new()),
            changes: Cell::new(0),
            in_tx: Cell::new(false),
            read_only: Cell::new(false),
            marks: RefCell::default(),
            pending_begin: RefCell::default(),
            sent: RefCell::default(),
            prefetched: RefCell::default(),
            trips: Cell::new(0),
        })
    }

    /// Whether the connection to the server is lost.
    pub(crate) fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Prepares `sql` — a round trip — or takes it from this connection's cache. Every
    /// statement is cached on PostgreSQL, whether or not the caller asked for the cache: one
    /// prepared for a single use would cost a round trip to prepare and a message to close on
    /// every use. Keel's statement texts are fixed, so the cache stays small; past
    /// [`MAX_CACHED`] statements it starts over.
    pub(crate) fn prepare(&self, sql: &str) -> Result<PgStatement> {
        if let Some(s) = self.cache.borrow().get(sql) {
            return Ok(s.clone());
        }
        let text = translate(sql);
        let stmt = self
            .send(self.client.prepare(&text))
            .map_err(|e| Error::Postgres(format!("{} in: {}", describe(&e), text.trim())))?;
        let first = text.split_whitespace().next().unwrap_or("").to_ascii_uppercase();
        let writes = !matches!(first.as_str(), "SELECT" | "VALUES" | "SHOW" | "EXPLAIN");
        let s = PgStatement { stmt, writes, sql: sql.into() };
        let mut cache = self.cache.borrow_mut();
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(sql.to_string(), s.clone());
        Ok(s)
    }

    fn params<'a>(s: &PgStatement, values: &'a [SqlRef<'a>]) -> Result<Vec<PgParam<'a>>> {
        let wanted = s.stmt.params().len();
        if wanted != values.len() {
            return Err(Error::Parameters { wanted, given: values.len() });
        }
        Ok(values.iter().map(|v| PgParam(*v)).collect())
    }

    pub(crate) fn execute(&self, s: &PgStatement, values: &[SqlRef<'_>]) -> Result<usize> {
        let params = Self::params(s, values)?;
        self.forget_prefetched(s);
        let refs: Vec<&(dyn PgToSql + Sync)> = params.iter().map(|p| p as _).collect();
        let n = self.send(self.client.execute(&s.stmt, &refs)).map_err(|e| error(&e))?;
        if s.writes {
            self.changes.set(self.changes.get() + n.max(1));
        }
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    pub(crate) fn query(&self, s: &PgStatement, values: &[SqlRef<'_>]) -> Result<Vec<PgRow>> {
        let params = Self::params(s, values)?;
        if let Some(rows) = self.prefetched_rows(s, values)? {
            return Ok(rows);
        }
        self.forget_prefetched(s);
        let refs: Vec<&(dyn PgToSql + Sync)> = params.iter().map(|p| p as _).collect();
        let rows = self.send(self.client.query(&s.stmt, &refs)).map_err(|e| error(&e))?;
        if s.writes {
            self.changes.set(self.changes.get() + rows.len().max(1) as u64);
        }
        Ok(rows)
    }

    /// Runs a statement whose outcome the caller does not read. Inside a write transaction it
    /// is sent without waiting: its reply is read with the next request that waits (at the
    /// latest the `COMMIT`), in the same round trip, and its error, if any, fails that request
    /// (the server has aborted the transaction by then). Elsewhere it is [`execute`](Self::execute).
    pub(crate) fn execute_pipelined(&self, s: &PgStatement, values: &[SqlRef<'_>]) -> Result<()> {
        if !self.in_transaction() || self.read_only.get() {
            return self.execute(s, values).map(|_| ());
        }
        Self::params(s, values)?;
        self.forget_prefetched(s);
        self.send_begin().map_err(|e| error(&e))?;
        let owned = owned(values);
        let (client, stmt) = (self.client.clone(), s.stmt.clone());
        self.start(
            async move {
                let params: Vec<PgParam<'_>> = owned.iter().map(|v| PgParam(v.as_ref())).collect();
                let refs: Vec<&(dyn PgToSql + Sync)> = params.iter().map(|p| p as _).collect();
                client.execute(&stmt, &refs).await.map(|_| ())
            },
            true,
            false,
        )
        .map_err(|e| error(&e))?;
        if s.writes {
            self.changes.set(self.changes.get() + 1);
        }
        Ok(())
    }

    /// Sends query `s` now, inside a transaction, for a statement of the same transaction to
    /// read later: [`query`](Self::query) of the same statement with the same parameters takes
    /// its rows instead of asking the server — and the first such read waits, in one round
    /// trip, for every query sent ahead. A statement that may change rows, or the end of the
    /// transaction, drops what was sent ahead (a read after a write must see it). Outside a
    /// transaction it does nothing.
    pub(crate) fn prefetch(&self, s: &PgStatement, values: &[SqlRef<'_>]) -> Result<()> {
        if !self.in_transaction() || s.writes {
            return Ok(());
        }
        Self::params(s, values)?;
        self.send_begin().map_err(|e| error(&e))?;
        let params = owned(values);
        let owned = params.clone();
        let rows = Arc::new(std::sync::Mutex::new(None));
        let (client, stmt, slot) = (self.client.clone(), s.stmt.clone(), rows.clone());
        self.start(
            async move {
                let params: Vec<PgParam<'_>> = owned.iter().map(|v| PgParam(v.as_ref())).collect();
                let refs: Vec<&(dyn PgToSql + Sync)> = params.iter().map(|p| p as _).collect();
                let got = client.query(&stmt, &refs).await?;
                *slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(got);
                Ok(())
            },
            true,
            false,
        )
        .map_err(|e| error(&e))?;
        self.prefetched.borrow_mut().push(Prefetched { sql: s.sql.clone(), params, rows });
        Ok(())
    }

    /// The rows of `s` with `values` if they were sent ahead, waiting for them if need be.
    fn prefetched_rows(&self, s: &PgStatement, values: &[SqlRef<'_>]) -> Result<Option<Vec<PgRow>>> {
        let found = {
            let mut list = self.prefetched.borrow_mut();
            let at = list.iter().position(|p| {
                Arc::ptr_eq(&p.sql, &s.sql)
                    && p.params.len() == values.len()
                    && p.params.iter().zip(values).all(|(a, b)| a.is(b))
            });
            at.map(|i| list.remove(i))
        };
        let Some(found) = found else { return Ok(None) };
        let take = || found.rows.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(rows) = take() {
            return Ok(Some(rows));
        }
        self.send(std::future::ready(Ok::<_, tokio_postgres::Error>(()))).map_err(|e| error(&e))?;
        Ok(take())
    }

    /// Drops what was sent ahead when `s` may change rows.
    fn forget_prefetched(&self, s: &PgStatement) {
        if s.writes {
            self.prefetched.borrow_mut().clear();
        }
    }

    /// Sends the request `reply` makes (its first poll hands it to the connection's task, in
    /// order after every request before it) and keeps it to be read later.
    fn start(
        &self,
        reply: impl Future<Output = std::result::Result<(), tokio_postgres::Error>> + Send + 'static,
        checked: bool,
        begin: bool,
    ) -> std::result::Result<(), tokio_postgres::Error> {
        let mut reply: Reply = Box::pin(reply);
        match reply.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(Err(e)) if checked => Err(e),
            Poll::Ready(_) => Ok(()),
            Poll::Pending => {
                self.sent.borrow_mut().push(Sent { reply, checked, begin });
                Ok(())
            }
        }
    }

    /// Sends the pending `BEGIN`, if there is one.
    fn send_begin(&self) -> std::result::Result<(), tokio_postgres::Error> {
        let Some(begin) = self.pending_begin.borrow_mut().take() else { return Ok(()) };
        let client = self.client.clone();
        let sent = self.start(async move { client.batch_execute(&begin).await }, true, true);
        if sent.is_err() {
            self.in_tx.set(false);
        }
        sent
    }

    /// Runs statements without parameters (the simple query protocol), keeping track of the
    /// transaction they open or end.
    pub(crate) fn batch(&self, sql: &str) -> Result<()> {
        self.prefetched.borrow_mut().clear();
        let head = sql.trim_start().to_ascii_uppercase();
        let begins = head.starts_with("BEGIN") || head.starts_with("START TRANSACTION");
        let ends =
            head.starts_with("COMMIT") || head.starts_with("END") || head.starts_with("ROLLBACK");
        // A transaction begins with its first statement; one that ran none ends without a
        // word to the server.
        if begins && !self.in_transaction() {
            *self.pending_begin.borrow_mut() = Some(sql.to_string());
            self.in_tx.set(true);
            self.read_only.set(head.contains("READ ONLY"));
            self.marks.borrow_mut().clear();
            return Ok(());
        }
        if ends && !head.starts_with("ROLLBACK TO") {
            let unsent = self.pending_begin.borrow_mut().take().is_some();
            if unsent || self.read_only.get() {
                // A read-only transaction has nothing to lose at its end: it is sent, and its
                // reply read with the connection's next request.
                if !unsent {
                    let (client, sql) = (self.client.clone(), sql.to_string());
                    let _ = self.start(async move { client.batch_execute(&sql).await }, false, false);
                }
                self.in_tx.set(false);
                self.read_only.set(false);
                self.marks.borrow_mut().clear();
                return Ok(());
            }
        }
        let result = self.send(self.client.batch_execute(sql)).map_err(|e| error(&e));
        if begins {
            self.in_tx.set(result.is_ok());
            self.marks.borrow_mut().clear();
        } else if ends {
            // A rollback to a savepoint undoes the locks taken after it: forget them all.
            if !head.starts_with("ROLLBACK TO") {
                self.in_tx.set(false);
                self.read_only.set(false);
            }
            self.marks.borrow_mut().clear();
        } else if !head.starts_with("SAVEPOINT") && !head.starts_with("RELEASE") {
            self.changes.set(self.changes.get() + 1);
        }
        result
    }

    /// Waits for `request`, in one round trip with the pending `BEGIN` and every request sent
    /// before it whose reply is not read yet (the client pipelines them); the first of those
    /// that failed fails the request.
    fn send<T>(
        &self,
        request: impl Future<Output = std::result::Result<T, tokio_postgres::Error>>,
    ) -> std::result::Result<T, tokio_postgres::Error> {
        self.send_begin()?;
        self.trips.set(self.trips.get() + 1);
        let sent = std::mem::take(&mut *self.sent.borrow_mut());
        if sent.is_empty() {
            return wait(request);
        }
        let earlier = futures_util::future::join_all(
            sent.into_iter().map(|s| async move { (s.checked, s.begin, s.reply.await) }),
        );
        let (earlier, out) = wait(futures_util::future::join(earlier, request));
        for (checked, begin, result) in earlier {
            if let Err(e) = result {
                if begin {
                    self.in_tx.set(false);
                }
                if checked {
                    return Err(e);
                }
            }
        }
        out
    }

    /// Whether `key` is new in the open transaction (always, outside one): for what one
    /// transaction needs once — a row lock it already holds, a notification it already sent.
    pub(crate) fn first_in_transaction(&self, key: &str) -> bool {
        if !self.in_transaction() {
            return true;
        }
        self.marks.borrow_mut().insert(key.to_string())
    }

    pub(crate) fn in_transaction(&self) -> bool {
        self.in_tx.get() && !self.client.is_closed()
    }

    pub(crate) fn changes(&self) -> u64 {
        self.changes.get()
    }

    /// Round trips this connection has waited for.
    pub(crate) fn trips(&self) -> u64 {
        self.trips.get()
    }
}

/// `values`, kept for a request that outlives the caller's borrow of them.
fn owned(values: &[SqlRef<'_>]) -> Vec<SqlValue> {
    values.iter().map(|v| SqlValue::from(*v)).collect()
}

/// `?N` and `?` parameters as PostgreSQL's `$N`, outside quotes.
pub(crate) fn translate(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut chars = sql.chars().peekable();
    let mut next = 1usize;
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                out.push(c);
                if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    out.push(c);
                }
                '?' => {
                    let mut digits = String::new();
                    while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                        digits.push(*d);
                        chars.next();
                    }
                    out.push('$');
                    if digits.is_empty() {
                        out.push_str(&next.to_string());
                        next += 1;
                    } else {
                        out.push_str(&digits);
                    }
                }
                _ => out.push(c),
            },
        }
    }
    out
}

/// A parameter, converted to the type the server asked for.
#[derive(Debug)]
struct PgParam<'a>(SqlRef<'a>);

impl PgToSql for PgParam<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> std::result::Result<IsNull, BoxError> {
        let text =
            matches!(*ty, Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN);
        match self.0 {
            SqlRef::Null => Ok(IsNull::Yes),
            SqlRef::Int(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(i)?.to_sql(ty, out),
                Type::INT2 => i16::try_from(i)?.to_sql(ty, out),
                Type::OID => u32::try_from(i)?.to_sql(ty, out),
                Type::BOOL => (i != 0).to_sql(ty, out),
                Type::FLOAT8 => (i as f64).to_sql(ty, out),
                Type::FLOAT4 => (i as f32).to_sql(ty, out),
                _ if text => i.to_string().as_str().to_sql(ty, out),
                _ => Err(format!("an integer cannot be sent as {ty}").into()),
            },
            SqlRef::Real(f) => match *ty {
                Type::FLOAT8 => f.to_sql(ty, out),
                Type::FLOAT4 => (f as f32).to_sql(ty, out),
                _ if text => f.to_string().as_str().to_sql(ty, out),
                _ => Err(format!("a real number cannot be sent as {ty}").into()),
            },
            SqlRef::Text(s) => match *ty {
                Type::BYTEA => s.as_bytes().to_sql(ty, out),
                Type::INT8 => s.parse::<i64>()?.to_sql(ty, out),
                Type::INT4 => s.parse::<i32>()?.to_sql(ty, out),
                _ if text => s.to_sql(ty, out),
                _ => Err(format!("text cannot be sent as {ty}").into()),
            },
            SqlRef::Blob(b) => match *ty {
                Type::BYTEA => b.to_sql(ty, out),
                _ if text => std::str::from_utf8(b)?.to_sql(ty, out),
                _ => Err(format!("bytes cannot be sent as {ty}").into()),
            },
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// A column of any type keel stores, borrowed from its row.
enum PgAny<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

impl<'a> PgFromSql<'a> for PgAny<'a> {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> std::result::Result<Self, BoxError> {
        Ok(match *ty {
            Type::BOOL => Self::Int(i64::from(bool::from_sql(ty, raw)?)),
            Type::INT2 => Self::Int(i64::from(i16::from_sql(ty, raw)?)),
            Type::INT4 => Self::Int(i64::from(i32::from_sql(ty, raw)?)),
            Type::INT8 => Self::Int(i64::from_sql(ty, raw)?),
            Type::OID => Self::Int(i64::from(u32::from_sql(ty, raw)?)),
            Type::FLOAT4 => Self::Real(f64::from(f32::from_sql(ty, raw)?)),
            Type::FLOAT8 => Self::Real(f64::from_sql(ty, raw)?),
            Type::NUMERIC => numeric(raw)?,
            Type::BYTEA => Self::Blob(raw),
            _ => Self::Text(<&str as PgFromSql>::from_sql(ty, raw)?),
        })
    }

    fn from_sql_null(_: &Type) -> std::result::Result<Self, BoxError> {
        Ok(Self::Null)
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// A `numeric` in the binary format: an integer when it has no fraction and fits, else a real.
fn numeric<'a>(raw: &[u8]) -> std::result::Result<PgAny<'a>, BoxError> {
    let word = |i: usize| -> std::result::Result<i16, BoxError> {
        raw.get(i..i + 2)
            .map(|b| i16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "a numeric value is cut short".into())
    };
    let (ndigits, weight, sign) = (word(0)?, word(2)?, word(4)? as u16);
    if sign == 0xC000 {
        return Ok(PgAny::Real(f64::NAN));
    }
    let negative = sign == 0x4000;
    let mut int: Option<i128> = Some(0);
    let mut real = 0f64;
    for k in 0..ndigits.max(0) as usize {
        let d = i128::from(word(8 + 2 * k)?);
        let power = i32::from(weight) - k as i32;
        real += d as f64 * 10000f64.powi(power);
        if power >= 0 {
            int = int.and_then(|v| {
                10000i128
                    .checked_pow(power as u32)
                    .and_then(|p| d.checked_mul(p))
                    .and_then(|t| v.checked_add(t))
            });
        } else if d != 0 {
            int = None;
        }
    }
    if let Some(i) = int.and_then(|i| i64::try_from(if negative { -i } else { i }).ok()) {
        return Ok(PgAny::Int(i));
    }
    Ok(PgAny::Real(if negative { -real } else { real }))
}

/// Column `idx` of `row`, converted by `convert`.
pub(crate) fn column<T>(
    row: &PgRow,
    idx: usize,
    convert: impl FnOnce(SqlRef<'_>) -> Result<T>,
) -> Result<T> {
    let v: PgAny<'_> = row.try_get(idx).map_err(|e| Error::conversion(idx, describe(&e)))?;
    convert(match v {
        PgAny::Null => SqlRef::Null,
        PgAny::Int(i) => SqlRef::Int(i),
        PgAny::Real(f) => SqlRef::Real(f),
        PgAny::Text(s) => SqlRef::Text(s),
        PgAny::Blob(b) => SqlRef::Blob(b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_numbered_outside_quotes() {
        assert_eq!(
            translate("SELECT a FROM t WHERE b=?1 AND c=?12"),
            "SELECT a FROM t WHERE b=$1 AND c=$12"
        );
        assert_eq!(translate("VALUES (?, ?, '?', \"a?\")"), "VALUES ($1, $2, '?', \"a?\")");
        assert_eq!(translate("SELECT 'it''s ?' , ?3"), "SELECT 'it''s ?' , $3");
    }

    #[test]
    fn a_password_is_not_shown() {
        assert_eq!(
            redact("postgres://keel:s3cret@db:5432/keel"),
            "postgres://keel:***@db:5432/keel"
        );
        assert_eq!(redact("postgres://keel@db/keel"), "postgres://keel@db/keel");
        assert_eq!(redact("host=/tmp dbname=keel"), "host=/tmp dbname=keel");
    }

    #[test]
    fn numerics_read_as_integers_or_reals() {
        // 12345678 = digits [1234, 5678], weight 1.
        let raw = [0u8, 2, 0, 1, 0, 0, 0, 0, 0x04, 0xD2, 0x16, 0x2E];
        assert!(matches!(numeric(&raw).unwrap(), PgAny::Int(12_345_678)));
        // -1.5 = digits [1, 5000], weight 0, scale 1.
        let raw = [0u8, 2, 0, 0, 0x40, 0, 0, 1, 0, 1, 0x13, 0x88];
        assert!(matches!(numeric(&raw).unwrap(), PgAny::Real(f) if f == -1.5));
    }
}
