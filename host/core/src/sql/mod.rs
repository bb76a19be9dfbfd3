//! The store's connection: one interface over the two databases keel runs on — SQLite (the
//! embedded default, one machine) and PostgreSQL (several hosts).
//!
//! The owners write each fact's SQL once, in the subset both databases read the same way
//! (`?N` parameters, `ON CONFLICT` upserts, `RETURNING`, integers for times and flags); the few
//! statements that cannot be shared (full-text search, the schema) ask [`Connection::backend`].
//! Values cross as [`SqlRef`] — null, integer, real, text or bytes — as SQLite stores them; the
//! PostgreSQL driver converts each to the type the server asks for a parameter, and reads any
//! column of those kinds back (a boolean as an integer, `numeric` as a number).

use std::fmt;

pub(crate) mod pg;
mod pg_tls;

#[cfg(any(test, feature = "internals"))]
pub use pg::round_trips as postgres_round_trips;


/// Which database a connection talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

/// A value as a statement takes or a row gives it, borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SqlRef<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

impl SqlRef<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Int(_) => "an integer",
            Self::Real(_) => "a real number",
            Self::Text(_) => "text",
            Self::Blob(_) => "bytes",
        }
    }
}

/// A value as a statement takes or a row gives it, owned.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

impl SqlValue {
    pub fn as_ref(&self) -> SqlRef<'_> {
        match self {
            Self::Null => SqlRef::Null,
            Self::Int(i) => SqlRef::Int(*i),
            Self::Real(f) => SqlRef::Real(*f),
            Self::Text(s) => SqlRef::Text(s),
            Self::Blob(b) => SqlRef::Blob(b),
        }
    }

    /// Whether this is `v` (a real number: the same bits).
    pub fn is(&self, v: &SqlRef<'_>) -> bool {
        match (self, v) {
            (Self::Null, SqlRef::Null) => true,
            (Self::Int(a), SqlRef::Int(b)) => a == b,
            (Self::Real(a), SqlRef::Real(b)) => a.to_bits() == b.to_bits(),
            (Self::Text(a), SqlRef::Text(b)) => a == b,
            (Self::Blob(a), SqlRef::Blob(b)) => a == b,
            _ => false,
        }
    }
}

impl From<SqlRef<'_>> for SqlValue {
    fn from(v: SqlRef<'_>) -> Self {
        match v {
            SqlRef::Null => Self::Null,
            SqlRef::Int(i) => Self::Int(i),
            SqlRef::Real(f) => Self::Real(f),
            SqlRef::Text(s) => Self::Text(s.to_string()),
            SqlRef::Blob(b) => Self::Blob(b.to_vec()),
        }
    }
}

impl FromSql for SqlValue {
    fn column_result(v: SqlRef<'_>) -> FromSqlResult<Self> {
        Ok(v.into())
    }
}

/// Errors of a statement.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A statement that must return a row returned none.
    #[error("the query returned no rows")]
    NoRows,
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("{0}")]
    Postgres(String),
    /// A column does not read as the type asked for.
    #[error("column {column}: {message}")]
    Conversion { column: usize, message: String },
    /// Parameters given do not match the statement's.
    #[error("the statement takes {wanted} parameter(s), {given} given")]
    Parameters { wanted: usize, given: usize },
}

impl Error {
    /// A column whose value keel cannot read as `e` says.
    pub fn conversion(column: usize, e: impl fmt::Display) -> Self {
        Self::Conversion { column, message: e.to_string() }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A value a column does not read as.
#[derive(Debug)]
pub struct FromSqlError(pub String);

impl fmt::Display for FromSqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromSqlError {
    pub fn other(e: impl fmt::Display) -> Self {
        Self(e.to_string())
    }
    fn wanted(what: &str, got: SqlRef<'_>) -> Self {
        Self(format!("expected {what}, found {}", got.kind()))
    }
}

pub type FromSqlResult<T> = std::result::Result<T, FromSqlError>;

/// A value a statement can take.
pub trait ToSql {
    fn to_sql(&self) -> SqlRef<'_>;
}

/// A value a column can be read as.
pub trait FromSql: Sized {
    fn column_result(v: SqlRef<'_>) -> FromSqlResult<Self>;
}

impl<T: ToSql + ?Sized> ToSql for &T {
    fn to_sql(&self) -> SqlRef<'_> {
        (**self).to_sql()
    }
}
impl ToSql for str {
    fn to_sql(&self) -> SqlRef<'_> {
        SqlRef::Text(self)
    }
}
impl ToSql for String {
    fn to_sql(&self) -> SqlRef<'_> {
        SqlRef::Text(self)
    }
}
impl ToSql for [u8] {
    fn to_sql(&self) -> SqlRef<'_> {
        SqlRef::Blob(self)
    }
}
impl ToSql for Vec<u8> {
    fn to_sql(&self) -> SqlRef<'_> {
        SqlRef::Blob(self)
    }
}
impl ToSql for bool {
    fn to_sql(&self) -> SqlRef<'_> {
        SqlRef::Int(i64::from(*self))
    }
}
impl ToSql for f64 {
    fn to_sql(&self) -> SqlRef<'_> {
        SqlRef::Real(*self)
    }
}
impl<T: ToSql> ToSql for Option<T> {
    fn to_sql(&self) -> SqlRef<'_> {
        match self {
            Some(v) => v.to_sql(),
            None => SqlRef::Null,
        }
    }
}
impl ToSql for SqlRef<'_> {
    fn to_sql(&self) -> SqlRef<'_> {
        *self
    }
}

macro_rules! int_to_sql {
    ($($t:ty),*) => {$(
        impl ToSql for $t {
            fn to_sql(&self) -> SqlRef<'_> {
                // Values past i64 (never stored by keel) saturate rather than wrap.
                SqlRef::Int(i64::try_from(*self).unwrap_or(i64::MAX))
            }
        }
        impl FromSql for $t {
            fn column_result(v: SqlRef<'_>) -> FromSqlResult<Self> {
                match v {
                    SqlRef::Int(i) => <$t>::try_from(i).map_err(|_| {
                        FromSqlError(format!("{i} is out of range for {}", stringify!($t)))
                    }),
                    other => Err(FromSqlError::wanted("an integer", other)),
                }
            }
        }
    )*};
}
int_to_sql!(i64, i32, u32, u64, usize, u16, u8, i16);

impl FromSql for bool {
    fn column_result(v: SqlRef<'_>) -> FromSqlResult<Self> {
        match v {
            SqlRef::Int(i) => Ok(i != 0),
            other => Err(FromSqlError::wanted("a flag", other)),
        }
    }
}
impl FromSql for f64 {
    fn column_result(v: SqlRef<'_>) -> FromSqlResult<Self> {
        match v {
            SqlRef::Real(f) => Ok(f),
            SqlRef::Int(i) => Ok(i as f64),
            other => Err(FromSqlError::wanted("a number", other)),
        }
    }
}
impl FromSql for String {
    fn column_result(v: SqlRef<'_>) -> FromSqlResult<Self> {
        match v {
            SqlRef::Text(s) => Ok(s.to_string()),
            other => Err(FromSqlError::wanted("text", other)),
        }
    }
}
impl FromSql for Vec<u8> {
    fn column_result(v: SqlRef<'_>) -> FromSqlResult<Self> {
        match v {
            SqlRef::Blob(b) => Ok(b.to_vec()),
            SqlRef::Text(s) => Ok(s.as_bytes().to_vec()),
            other => Err(FromSqlError::wanted("bytes", other)),
        }
    }
}
impl<T: FromSql> FromSql for Option<T> {
    fn column_result(v: SqlRef<'_>) -> FromSqlResult<Self> {
        match v {
            SqlRef::Null => Ok(None),
            v => T::column_result(v).map(Some),
        }
    }
}

/// The parameters of one execution: `[]`, `[a]`, `[a, b]` of one type, or `params![a, b, …]`.
pub trait Params {
    fn values(&self) -> Vec<SqlRef<'_>>;
}

impl Params for () {
    fn values(&self) -> Vec<SqlRef<'_>> {
        Vec::new()
    }
}
impl Params for [&dyn ToSql; 0] {
    fn values(&self) -> Vec<SqlRef<'_>> {
        Vec::new()
    }
}
macro_rules! array_params {
    ($($n:literal)*) => {$(
        impl<T: ToSql> Params for [T; $n] {
            fn values(&self) -> Vec<SqlRef<'_>> {
                self.iter().map(ToSql::to_sql).collect()
            }
        }
    )*};
}
array_params!(1 2 3 4 5 6 7 8 9 10 11 12);
impl Params for &[&dyn ToSql] {
    fn values(&self) -> Vec<SqlRef<'_>> {
        self.iter().map(|v| v.to_sql()).collect()
    }
}
impl Params for &[SqlRef<'_>] {
    fn values(&self) -> Vec<SqlRef<'_>> {
        self.to_vec()
    }
}
impl<const N: usize> Params for &[&dyn ToSql; N] {
    fn values(&self) -> Vec<SqlRef<'_>> {
        self.iter().map(|v| v.to_sql()).collect()
    }
}

/// Parameters of mixed types: `params![id, seq, text]`.
macro_rules! params {
    () => { &[] as &[&dyn $crate::sql::ToSql] };
    ($($p:expr),+ $(,)?) => { &[$(&$p as &dyn $crate::sql::ToSql),+] as &[&dyn $crate::sql::ToSql] };
}
pub(crate) use params;

/// Turns "no row" into `None`.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(Error::NoRows) => Ok(None),
            Err(Error::Sqlite(rusqlite::Error::QueryReturnedNoRows)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A connection to the store's database.
pub struct Connection {
    inner: Inner,
}

enum Inner {
    Sqlite(rusqlite::Connection),
    Postgres(Box<pg::PgConn>),
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Connection({})", self.backend().name())
    }
}

impl From<rusqlite::Connection> for Connection {
    fn from(c: rusqlite::Connection) -> Self {
        Self { inner: Inner::Sqlite(c) }
    }
}

impl Connection {
    pub(crate) fn postgres(c: pg::PgConn) -> Self {
        Self { inner: Inner::Postgres(Box::new(c)) }
    }

    /// Which database this is.
    pub fn backend(&self) -> Backend {
        match self.inner {
            Inner::Sqlite(_) => Backend::Sqlite,
            Inner::Postgres(_) => Backend::Postgres,
        }
    }

    /// The SQLite connection, when this is one (for what only SQLite has: pragmas, its
    /// settings).
    pub fn sqlite(&self) -> Option<&rusqlite::Connection> {
        match &self.inner {
            Inner::Sqlite(c) => Some(c),
            Inner::Postgres(_) => None,
        }
    }

    pub(crate) fn pg(&self) -> Option<&pg::PgConn> {
        match &self.inner {
            Inner::Sqlite(_) => None,
            Inner::Postgres(c) => Some(c.as_ref()),
        }
    }

    /// A statement, from this connection's cache when it was prepared before.
    pub fn prepare_cached(&self, sql: &str) -> Result<Statement<'_>> {
        Ok(Statement {
            inner: match &self.inner {
                Inner::Sqlite(c) => StmtInner::SqliteCached(c.prepare_cached(sql)?),
                Inner::Postgres(c) => StmtInner::Postgres(c, c.prepare(sql)?),
            },
        })
    }

    /// A statement prepared for this use (on PostgreSQL kept in the connection's cache all the
    /// same: a statement is prepared there in a round trip of its own).
    pub fn prepare(&self, sql: &str) -> Result<Statement<'_>> {
        Ok(Statement {
            inner: match &self.inner {
                Inner::Sqlite(c) => StmtInner::Sqlite(c.prepare(sql)?),
                Inner::Postgres(c) => StmtInner::Postgres(c, c.prepare(sql)?),
            },
        })
    }

    /// Runs one statement; the rows it changed.
    pub fn execute<P: Params>(&self, sql: &str, params: P) -> Result<usize> {
        self.prepare(sql)?.execute(params)
    }

    /// The first row of one statement, mapped.
    pub fn query_row<T, P: Params, F>(&self, sql: &str, params: P, f: F) -> Result<T>
    where
        F: FnOnce(&Row<'_>) -> Result<T>,
    {
        self.prepare(sql)?.query_row(params, f)
    }

    /// Sends query `sql` ahead, for a statement of the open transaction to read later with
    /// the same parameters: on PostgreSQL the queries sent ahead cost one round trip between
    /// them, at the first read of one. A hint only — a read that finds nothing sent ahead asks
    /// the server as always; SQLite, in process, has no round trip to save and ignores it.
    pub fn prefetch<P: Params>(&self, sql: &str, params: P) -> Result<()> {
        match &self.inner {
            Inner::Sqlite(_) => Ok(()),
            Inner::Postgres(c) => c.prefetch(&c.prepare(sql)?, &params.values()),
        }
    }

    /// Runs statements separated by `;`, without parameters.
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match &self.inner {
            Inner::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Inner::Postgres(c) => c.batch(sql),
        }
    }

    /// Runs a transaction-control statement (`BEGIN`, `SAVEPOINT op`, `COMMIT` …) from the
    /// statement cache where the database allows it.
    pub(crate) fn control(&self, sql: &str) -> Result<()> {
        match &self.inner {
            Inner::Sqlite(c) => Ok(c.prepare_cached(sql)?.execute([]).map(|_| ())?),
            Inner::Postgres(c) => c.batch(sql),
        }
    }

    /// Opens a write transaction (SQLite: `BEGIN IMMEDIATE`, taking the write lock at once);
    /// it rolls back when dropped uncommitted.
    pub fn transaction(&mut self) -> Result<Transaction<'_>> {
        self.control(self.begin_write())?;
        Ok(Transaction { conn: self, done: false })
    }

    /// Opens a read transaction: every statement of it sees one committed state. It ends when
    /// committed or dropped.
    pub fn unchecked_transaction(&self) -> Result<Transaction<'_>> {
        self.control(match self.backend() {
            Backend::Sqlite => "BEGIN",
            Backend::Postgres => "BEGIN ISOLATION LEVEL REPEATABLE READ",
        })?;
        Ok(Transaction { conn: self, done: false })
    }

    /// The statement that opens a write transaction.
    pub(crate) fn begin_write(&self) -> &'static str {
        match self.backend() {
            Backend::Sqlite => "BEGIN IMMEDIATE",
            Backend::Postgres => "BEGIN",
        }
    }

    /// Whether `key` is new in this connection's open transaction (always, outside one, and on
    /// SQLite, whose one writer needs no lock of its own): for what a transaction on
    /// PostgreSQL needs once — a row it already locked, a notification it already sent. A
    /// rollback to a savepoint forgets every key.
    pub fn first_in_transaction(&self, key: &str) -> bool {
        match &self.inner {
            Inner::Sqlite(_) => true,
            Inner::Postgres(c) => c.first_in_transaction(key),
        }
    }

    /// Whether no transaction is open (the database may have ended one by itself).
    pub fn is_autocommit(&self) -> bool {
        match &self.inner {
            Inner::Sqlite(c) => c.is_autocommit(),
            Inner::Postgres(c) => !c.in_transaction(),
        }
    }

    /// Round trips to the server this connection has waited for (none on SQLite).
    pub fn round_trips(&self) -> u64 {
        match &self.inner {
            Inner::Sqlite(_) => 0,
            Inner::Postgres(c) => c.trips(),
        }
    }

    /// Rows changed by this connection since it opened (PostgreSQL: statements that may have
    /// changed rows).
    pub fn total_changes(&self) -> u64 {
        match &self.inner {
            Inner::Sqlite(c) => c.total_changes(),
            Inner::Postgres(c) => c.changes(),
        }
    }
}

/// A write transaction: [`commit`](Self::commit) it, or drop it to roll back.
pub struct Transaction<'c> {
    conn: &'c Connection,
    done: bool,
}

impl Transaction<'_> {
    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        self.conn.control("COMMIT")
    }
}

impl std::ops::Deref for Transaction<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if !self.done && !self.conn.is_autocommit() {
            let _ = self.conn.control("ROLLBACK");
        }
    }
}

/// A prepared statement.
pub struct Statement<'c> {
    inner: StmtInner<'c>,
}

enum StmtInner<'c> {
    Sqlite(rusqlite::Statement<'c>),
    SqliteCached(rusqlite::CachedStatement<'c>),
    Postgres(&'c pg::PgConn, pg::PgStatement),
}

/// A SQLite parameter, borrowed.
struct Bind<'a>(SqlRef<'a>);

impl rusqlite::ToSql for Bind<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self.0 {
            SqlRef::Null => ValueRef::Null,
            SqlRef::Int(i) => ValueRef::Integer(i),
            SqlRef::Real(f) => ValueRef::Real(f),
            SqlRef::Text(s) => ValueRef::Text(s.as_bytes()),
            SqlRef::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

fn binds<'a>(values: &'a [SqlRef<'a>]) -> rusqlite::ParamsFromIter<impl Iterator<Item = Bind<'a>>> {
    rusqlite::params_from_iter(values.iter().map(|v| Bind(*v)))
}

impl<'c> Statement<'c> {
    fn sqlite(&mut self) -> Option<&mut rusqlite::Statement<'c>> {
        match &mut self.inner {
            StmtInner::Sqlite(s) => Some(s),
            StmtInner::SqliteCached(s) => Some(s),
            StmtInner::Postgres(..) => None,
        }
    }

    /// Runs the statement; the rows it changed.
    pub fn execute<P: Params>(&mut self, params: P) -> Result<usize> {
        let values = params.values();
        if let StmtInner::Postgres(c, s) = &self.inner {
            return c.execute(s, &values);
        }
        let s = self.sqlite().ok_or(Error::NoRows)?;
        Ok(s.execute(binds(&values))?)
    }

    /// Runs a statement whose outcome the caller does not read (rows changed, rows returned).
    /// On PostgreSQL, inside a write transaction, it is sent without waiting for the server:
    /// its reply is read in the round trip of the next statement that waits (at the latest the
    /// `COMMIT`), and an error it met fails that statement — so only a statement whose error
    /// fails the whole operation belongs here. Elsewhere it is [`execute`](Self::execute).
    pub fn execute_pipelined<P: Params>(&mut self, params: P) -> Result<()> {
        let values = params.values();
        if let StmtInner::Postgres(c, s) = &self.inner {
            return c.execute_pipelined(s, &values);
        }
        let s = self.sqlite().ok_or(Error::NoRows)?;
        s.execute(binds(&values))?;
        Ok(())
    }

    /// Whether the statement returns a row.
    pub fn exists<P: Params>(&mut self, params: P) -> Result<bool> {
        let values = params.values();
        if let StmtInner::Postgres(c, s) = &self.inner {
            return Ok(!c.query(s, &values)?.is_empty());
        }
        let s = self.sqlite().ok_or(Error::NoRows)?;
        Ok(s.exists(binds(&values))?)
    }

    /// The first row, mapped by `f`.
    pub fn query_row<T, P: Params, F>(&mut self, params: P, f: F) -> Result<T>
    where
        F: FnOnce(&Row<'_>) -> Result<T>,
    {
        let values = params.values();
        if let StmtInner::Postgres(c, s) = &self.inner {
            let rows = c.query(s, &values)?;
            let row = rows.first().ok_or(Error::NoRows)?;
            return f(&Row { inner: RowInner::Postgres(row) });
        }
        let s = self.sqlite().ok_or(Error::NoRows)?;
        let mut rows = s.query(binds(&values))?;
        match rows.next()? {
            Some(r) => f(&Row { inner: RowInner::Sqlite(r) }),
            None => Err(Error::NoRows),
        }
    }

    /// Every row, mapped by `f`.
    pub fn query_map<T, P: Params, F>(&mut self, params: P, mut f: F) -> Result<MappedRows<T>>
    where
        F: FnMut(&Row<'_>) -> Result<T>,
    {
        let values = params.values();
        let mut out = Vec::new();
        if let StmtInner::Postgres(c, s) = &self.inner {
            for row in c.query(s, &values)? {
                out.push(f(&Row { inner: RowInner::Postgres(&row) }));
            }
        } else {
            let s = self.sqlite().ok_or(Error::NoRows)?;
            let mut rows = s.query(binds(&values))?;
            loop {
                match rows.next() {
                    Ok(Some(r)) => out.push(f(&Row { inner: RowInner::Sqlite(r) })),
                    Ok(None) => break,
                    Err(e) => {
                        out.push(Err(e.into()));
                        break;
                    }
                }
            }
        }
        Ok(MappedRows { rows: out.into_iter() })
    }
}

/// The mapped rows of a query, in order.
pub struct MappedRows<T> {
    rows: std::vec::IntoIter<Result<T>>,
}

impl<T> Iterator for MappedRows<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        self.rows.next()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.rows.size_hint()
    }
}

/// How a column is named: by its position, from 0.
pub trait ColumnIndex {
    fn index(self) -> usize;
}

impl ColumnIndex for usize {
    fn index(self) -> usize {
        self
    }
}

/// One row of a result.
pub struct Row<'r> {
    inner: RowInner<'r>,
}

enum RowInner<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    Postgres(&'r pg::PgRow),
}

impl Row<'_> {
    /// Column `idx` (from 0), read as `T`.
    pub fn get<I: ColumnIndex, T: FromSql>(&self, idx: I) -> Result<T> {
        let idx = idx.index();
        let convert = |v: SqlRef<'_>| T::column_result(v).map_err(|e| Error::conversion(idx, e));
        match &self.inner {
            RowInner::Sqlite(r) => {
                use rusqlite::types::ValueRef;
                let v = r.get_ref(idx)?;
                convert(match v {
                    ValueRef::Null => SqlRef::Null,
                    ValueRef::Integer(i) => SqlRef::Int(i),
                    ValueRef::Real(f) => SqlRef::Real(f),
                    ValueRef::Text(t) => {
                        SqlRef::Text(std::str::from_utf8(t).map_err(|e| Error::conversion(idx, e))?)
                    }
                    ValueRef::Blob(b) => SqlRef::Blob(b),
                })
            }
            RowInner::Postgres(r) => pg::column(r, idx, convert),
        }
    }
}
