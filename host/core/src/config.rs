//! The keel home's settings file, `HOME/keel.toml`, and the environment variables that
//! override it. Each table is read here and only here:
//!
//! ```toml
//! [model]                    # see harness::model_config; KEEL_MODEL_URL, KEEL_MODEL
//! base_url = "http://localhost:8080/v1"
//! model = "local"
//! context_window = 32768     # with it, requests past compact_at (0.8) of it compact first
//!
//! [store]
//! synchronous = "full"       # full (default) | normal | off; KEEL_SYNCHRONOUS overrides
//!
//! [serve]                    # keel serve: the HTTP API and console
//! listen = "127.0.0.1:7420"
//! grant_roots = ["/srv/projects"]  # admins grant only directories under these
//! header_timeout_secs = 10   # these four bound every HTTP front-end's connections
//! body_timeout_secs = 60
//! idle_timeout_secs = 60
//! max_connections = 1024    # for every listener of the process together
//! max_connections_per_user = 256  # requests in progress of one user's token (default: a quarter)
//! metrics_listen = "127.0.0.1:9464"  # GET /metrics without a token, for the scraper only
//!
//! [telemetry]                # traces over OTLP/HTTP; OTEL_EXPORTER_OTLP_ENDPOINT overrides
//! otlp_endpoint = "http://localhost:4318"
//! capture_content = false    # prompts, replies, tool inputs and outputs in spans
//! service_name = "keel"      # OTEL_SERVICE_NAME overrides
//!
//! [mcp]                      # keel mcp serve
//! token = "…"                # KEEL_MCP_TOKEN; at least 16 characters
//! max_sessions = 64          # --http: MCP sessions open at once
//! session_idle_secs = 300    # --http: an idle MCP session is closed (a call in flight is activity)
//! max_sessions_per_client = 16  # --http: MCP sessions of one client address
//! ```
//!
//! A missing file is an empty one; a file that does not parse, an unknown key inside a table or
//! a value out of range is an error naming the file and the key.

use std::path::PathBuf;

use crate::home::Home;
use crate::store::Synchronous;

/// A setting that cannot work: a file that does not parse, an unknown key, a value out of
/// range, an environment variable that does not read. The message names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl ConfigError {
    /// The stable kind of every setting error: `config`.
    pub fn kind(&self) -> &'static str {
        "config"
    }
}

/// One effective setting: its key (`model.base_url`), its value (`None`: unset) and where
/// the value came from — a flag (`--model-url`), a variable (`KEEL_MODEL_URL`), the file
/// (`keel.toml [model] base_url`), `default` or `unset`. A credential's value is never one:
/// only whether it is set.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Setting {
    pub key: String,
    pub value: Option<String>,
    pub from: String,
}

impl From<String> for ConfigError {
    fn from(message: String) -> Self {
        Self(message)
    }
}

/// The `[model]` table: every key optional (flags and environment fill in or override).
#[derive(serde::Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct ModelTable {
    pub base_url: Option<String>,
    pub model: Option<String>,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    pub timeout_ms: Option<u64>,
    pub stream: Option<bool>,
    /// Ask for token usage when streaming (`stream_options`); false for a server that
    /// rejects the field.
    pub stream_usage: Option<bool>,
    pub max_retries: Option<u32>,
    /// The model's context window in tokens: requests past `compact_at` of it are preceded by
    /// a compaction.
    pub context_window: Option<u64>,
    /// The fraction of `context_window` a request may fill (default 0.8).
    pub compact_at: Option<f64>,
    /// Goals, plan, summary and memories in a second system message after the stable
    /// instructions (default true); false for a server whose chat template refuses one.
    pub notes_message: Option<bool>,
    /// `[model.preprocess]`: the task-understanding call.
    pub preprocess: Option<PreprocessTable>,
}

/// The `[model.preprocess]` table: the task-understanding call of new sessions. Every key
/// optional; the server and model default to the session's.
#[derive(serde::Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct PreprocessTable {
    /// `false` turns the call off for new sessions (as `--no-preprocess` does).
    pub enabled: Option<bool>,
    pub base_url: Option<String>,
    pub model: Option<String>,
    pub max_tokens: Option<u32>,
    pub timeout_ms: Option<u64>,
    /// `json_schema` (default), `json_object`, or `none` for a server that refuses
    /// `response_format`.
    pub response_format: Option<String>,
}

/// The `[store]` table.
#[derive(serde::Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct StoreTable {
    pub synchronous: Option<String>,
    /// `postgres://…`: the store is that PostgreSQL database (several hosts may share it).
    pub url: Option<String>,
}

/// The `[tools]` table.
#[derive(serde::Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct ToolsTable {
    /// SHA-256 digests (hex, as `keel tool list` shows them) of components an admin trusts
    /// with keel's control interfaces (`keel:control/plan`); first-party components are
    /// trusted without being listed.
    #[serde(default)]
    pub control_trusted: Vec<String>,
}

/// The `[mcp]` table.
#[derive(serde::Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct McpTable {
    /// The bearer token `keel mcp serve --http` requires of clients (`KEEL_MCP_TOKEN`
    /// overrides it); needed for any address other than loopback.
    pub token: Option<String>,
    /// MCP sessions `keel mcp serve --http` keeps open at once (default 64).
    pub max_sessions: Option<usize>,
    /// Seconds after which an MCP session with no request and no call in flight is closed
    /// (default 300).
    pub session_idle_secs: Option<u64>,
    /// MCP sessions one client address keeps open at once (default 16; clients on loopback
    /// share one address).
    pub max_sessions_per_client: Option<usize>,
}

impl McpTable {
    /// The HTTP endpoint's session bounds: each setting given, else its default; checked.
    pub fn http_limits(&self) -> Result<HttpLimits, String> {
        let d = HttpLimits::default();
        let l = HttpLimits {
            max_sessions: self.max_sessions.unwrap_or(d.max_sessions),
            session_idle: self
                .session_idle_secs
                .map(std::time::Duration::from_secs)
                .unwrap_or(d.session_idle),
            max_per_client: self
                .max_sessions_per_client
                .unwrap_or(d.max_per_client)
                .min(self.max_sessions.unwrap_or(d.max_sessions)),
        };
        if !(1..=65_536).contains(&l.max_sessions) {
            return Err("[mcp] max_sessions must be 1 to 65536".into());
        }
        if l.max_per_client == 0 {
            return Err("[mcp] max_sessions_per_client must be 1 to max_sessions".into());
        }
        if !(1..=86_400).contains(&l.session_idle.as_secs()) {
            return Err("[mcp] session_idle_secs must be 1 to 86400".into());
        }
        Ok(l)
    }
}

/// The bounds of `keel mcp serve --http` beyond its connections' (`[mcp]` in keel.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// MCP sessions open at once, at most; an `initialize` past it is refused (503).
    pub max_sessions: usize,
    /// An MCP session with no request in progress, no call in flight and no request for this
    /// long is closed. A call waiting for its elicitation answer is in flight: it is never
    /// cut by this.
    pub session_idle: std::time::Duration,
    /// MCP sessions one client address keeps open at once; an `initialize` past it is
    /// refused (429).
    pub max_per_client: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_sessions: 64,
            session_idle: std::time::Duration::from_secs(300),
            max_per_client: 16,
        }
    }
}

/// The `[telemetry]` table: traces exported over OTLP/HTTP (`OTEL_EXPORTER_OTLP_ENDPOINT`
/// overrides the endpoint).
#[derive(serde::Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct TelemetryTable {
    /// The OTLP/HTTP collector's base URL (`http://localhost:4318`): spans go to
    /// `/v1/traces` under it. None: no traces are exported.
    pub otlp_endpoint: Option<String>,
    /// Whether spans carry prompts, replies and tool inputs and outputs (default false).
    #[serde(default)]
    pub capture_content: bool,
    /// The `service.name` of the spans (default `keel`; `OTEL_SERVICE_NAME` overrides it).
    pub service_name: Option<String>,
}

/// The `[serve]` table: `keel serve`, the HTTP API and console.
#[derive(serde::Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct ServeTable {
    /// The address to listen on (default 127.0.0.1:7420; `--listen` overrides it).
    pub listen: Option<String>,
    /// Host directories under which an admin may grant directories to sessions over the API
    /// (a grant outside them is refused; none listed: no API grants at all).
    #[serde(default)]
    pub grant_roots: Vec<PathBuf>,
    /// Seconds a request's headers may take to arrive (default 10). These four bounds hold
    /// for `keel mcp serve --http` too.
    pub header_timeout_secs: Option<u64>,
    /// Seconds a request's whole body may take to arrive (default 60).
    pub body_timeout_secs: Option<u64>,
    /// Seconds a connection may stay open with no request in progress (default 60).
    pub idle_timeout_secs: Option<u64>,
    /// Open connections at most (default 1024), for every listener of the process together;
    /// past it the longest-idle one is closed, then the oldest without a token.
    pub max_connections: Option<usize>,
    /// Requests in progress (event streams included) one user's token may hold at once
    /// (default: a quarter of `max_connections`). Admins have no share of their own: an
    /// eighth of the connections is always kept from users and requests without a token.
    pub max_connections_per_user: Option<usize>,
    /// A second address serving only `GET /metrics`, without a token (`--metrics-listen`
    /// overrides it): for a scraper on a network the API is not on.
    pub metrics_listen: Option<String>,
}

impl ServeTable {
    /// The listener's bounds: each setting given, else its default; checked.
    pub fn bounds(&self) -> Result<Bounds, String> {
        let d = Bounds::default();
        let secs = |v: Option<u64>, d: std::time::Duration| {
            v.map(std::time::Duration::from_secs).unwrap_or(d)
        };
        let b = Bounds {
            header_timeout: secs(self.header_timeout_secs, d.header_timeout),
            body_timeout: secs(self.body_timeout_secs, d.body_timeout),
            idle_timeout: secs(self.idle_timeout_secs, d.idle_timeout),
            max_connections: self.max_connections.unwrap_or(d.max_connections),
            max_per_user: self.max_connections_per_user,
        };
        b.check()?;
        Ok(b)
    }
}

/// The `[registry]` table: the bounds of every pull, push and tag lookup.
#[derive(serde::Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct RegistryTable {
    /// Seconds one registry operation (a whole pull: manifest and every blob) may take
    /// (default 600).
    pub pull_timeout_secs: Option<u64>,
    /// The slowest transfer accepted, in bytes per second over each window (default 1024).
    pub min_rate_bytes_per_sec: Option<u64>,
    /// Seconds the rate is measured over; also the longest wait for an answer to begin
    /// (default 30).
    pub rate_window_secs: Option<u64>,
}

impl RegistryTable {
    /// The limits these settings give, each unset one at its default.
    pub fn limits(&self) -> Result<crate::oci::Limits, String> {
        let d = crate::oci::Limits::default();
        let secs = |v: Option<u64>, d: std::time::Duration, key: &str| match v {
            Some(0) => Err(format!("[registry] {key} must be at least 1")),
            Some(v) => Ok(std::time::Duration::from_secs(v)),
            None => Ok(d),
        };
        Ok(crate::oci::Limits {
            timeout: secs(self.pull_timeout_secs, d.timeout, "pull_timeout_secs")?,
            min_rate: self.min_rate_bytes_per_sec.unwrap_or(d.min_rate),
            rate_window: secs(self.rate_window_secs, d.rate_window, "rate_window_secs")?,
        })
    }
}

/// The bounds of registry operations: `[registry]` in `keel.toml`, each unset one at its
/// default.
pub fn registry_limits(home: &Home) -> Result<crate::oci::Limits, ConfigError> {
    read(home)?
        .registry
        .unwrap_or_default()
        .limits()
        .map_err(|e| ConfigError(format!("{}: {e}", path(home).display())))
}

/// The `[undo]` table: how much of what tools change keel keeps to undo it (sizes such as
/// `8MiB`; `0` keeps nothing).
#[derive(serde::Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
pub struct UndoTable {
    /// One file's pre-image, at most (default 8MiB).
    pub max_file: Option<String>,
    /// The pre-images of one call, at most (default 64MiB).
    pub max_call: Option<String>,
    /// The pre-images of one session, at most (default 512MiB).
    pub max_session: Option<String>,
}

/// The bounds of the pre-images keel keeps, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UndoLimits {
    pub max_file: u64,
    pub max_call: u64,
    pub max_session: u64,
}

impl Default for UndoLimits {
    fn default() -> Self {
        Self { max_file: 8 << 20, max_call: 64 << 20, max_session: 512 << 20 }
    }
}

impl UndoTable {
    /// The bounds these settings give, each unset one at its default.
    pub fn limits(&self) -> Result<UndoLimits, String> {
        let d = UndoLimits::default();
        let size = |v: &Option<String>, d: u64, key: &str| match v {
            Some(t) => crate::units::parse_size(t).map_err(|e| format!("[undo] {key}: {e}")),
            None => Ok(d),
        };
        Ok(UndoLimits {
            max_file: size(&self.max_file, d.max_file, "max_file")?,
            max_call: size(&self.max_call, d.max_call, "max_call")?,
            max_session: size(&self.max_session, d.max_session, "max_session")?,
        })
    }
}

/// The bounds of the pre-images keel keeps: `[undo]` in `keel.toml`, each unset one at its
/// default.
pub fn undo_limits(home: &Home) -> Result<UndoLimits, ConfigError> {
    read(home)?
        .undo
        .unwrap_or_default()
        .limits()
        .map_err(|e| ConfigError(format!("{}: {e}", path(home).display())))
}

/// The whole file. Tables keel does not know are left alone (a newer keel's settings must not
/// stop an older one); unknown keys inside known tables are refused (a typo must not pass
/// silently).
#[derive(serde::Deserialize, Default, Debug)]
pub struct File {
    #[serde(default)]
    pub model: Option<ModelTable>,
    #[serde(default)]
    pub store: Option<StoreTable>,
    #[serde(default)]
    pub tools: Option<ToolsTable>,
    #[serde(default)]
    pub mcp: Option<McpTable>,
    #[serde(default)]
    pub serve: Option<ServeTable>,
    #[serde(default)]
    pub telemetry: Option<TelemetryTable>,
    #[serde(default)]
    pub registry: Option<RegistryTable>,
    #[serde(default)]
    pub undo: Option<UndoTable>,
}

/// The settings file of `home`.
pub fn path(home: &Home) -> PathBuf {
    home.root().join("keel.toml")
}

/// Reads `HOME/keel.toml` (an empty file when there is none).
pub fn read(home: &Home) -> Result<File, ConfigError> {
    let path = path(home);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            toml::from_str(&text).map_err(|e| ConfigError(format!("{}: {e}", path.display())))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(File::default()),
        Err(e) => Err(ConfigError(format!("cannot read {}: {e}", path.display()))),
    }
}

/// A non-empty environment variable (a credential among them, [`SECRET_ENV`], from what
/// [`take_secret_env`] kept when it was called).
pub fn env(key: &str) -> Option<String> {
    if let Some(taken) = TAKEN.get()
        && SECRET_ENV.contains(&key)
    {
        return taken.iter().find(|(k, _)| *k == key).map(|(_, v)| v.to_string());
    }
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// Environment variables whose values are credentials: the model's API key, the API's and
/// the MCP server's admin tokens, the PostgreSQL URL (which may hold a password).
pub const SECRET_ENV: &[&str] =
    &["KEEL_API_KEY", "OPENAI_API_KEY", "KEEL_API_TOKEN", "KEEL_MCP_TOKEN", "KEEL_DATABASE_URL"];

static TAKEN: std::sync::OnceLock<Vec<(&'static str, zeroize::Zeroizing<String>)>> =
    std::sync::OnceLock::new();

/// Reads the credentials of [`SECRET_ENV`] into keel's memory and takes them out of the
/// process's environment: removed from the variables a child process inherits, and their
/// bytes overwritten in the block the kernel shows as `/proc/PID/environ`. After it, [`env()`]
/// answers for them from memory. Called once, first thing in `main`, while the process has one
/// thread (changing the environment is only sound then).
#[allow(unsafe_code)]
pub fn take_secret_env() {
    let mut taken = Vec::new();
    for &key in SECRET_ENV {
        let Some(value) = std::env::var_os(key) else { continue };
        if let Some(v) = value.to_str().filter(|v| !v.is_empty()) {
            taken.push((key, zeroize::Zeroizing::new(v.to_string())));
        }
        scrub_environ(key);
        // SAFETY: called at the start of `main`, before any thread is started (see above), so
        // no other thread reads the environment while it changes.
        unsafe { std::env::remove_var(key) };
    }
    let _ = TAKEN.set(taken);
}

/// Overwrites the value of `key` in place in the process's environment block, where
/// `/proc/self/environ` reads it (removing the variable only unlinks its entry).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn scrub_environ(key: &str) {
    use std::ffi::c_char;
    unsafe extern "C" {
        static mut environ: *mut *mut c_char;
    }
    let prefix = format!("{key}=");
    // SAFETY: single-threaded (see `take_secret_env`); `environ` is the C library's
    // NUL-terminated array of NUL-terminated strings, each writable memory of this process
    // (the initial block on the stack, or strings `setenv` allocated). Only bytes before each
    // string's terminating NUL are written, so every string stays terminated.
    unsafe {
        let mut at = environ;
        if at.is_null() {
            return;
        }
        while !(*at).is_null() {
            let entry = *at;
            let text = std::ffi::CStr::from_ptr(entry).to_bytes();
            if text.starts_with(prefix.as_bytes()) {
                let value = entry.add(prefix.len());
                std::ptr::write_bytes(value, b'x', text.len() - prefix.len());
            }
            at = at.add(1);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn scrub_environ(_key: &str) {}

/// A non-empty environment variable parsed by `parse`; an error names the variable.
pub fn env_parsed<T>(
    key: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<T>, ConfigError> {
    env(key).map(|v| parse(v.trim()).map_err(|e| ConfigError(format!("{key}: {e}")))).transpose()
}

/// How durably the store commits: `KEEL_SYNCHRONOUS`, else `[store] synchronous` in
/// `keel.toml`, else `full`.
pub fn synchronous(home: &Home) -> Result<Synchronous, ConfigError> {
    Ok(synchronous_from(home)?.0)
}

/// [`synchronous`], and where it came from (`KEEL_SYNCHRONOUS`, the file, `default`).
fn synchronous_from(home: &Home) -> Result<(Synchronous, String), ConfigError> {
    if let Some(mode) = env_parsed("KEEL_SYNCHRONOUS", str::parse)? {
        return Ok((mode, "KEEL_SYNCHRONOUS".into()));
    }
    let file = read(home)?;
    match file.store.and_then(|s| s.synchronous) {
        Some(value) => value
            .parse()
            .map(|mode| (mode, "keel.toml [store] synchronous".into()))
            .map_err(|e| {
                ConfigError(format!("{}: [store] synchronous: {e}", path(home).display()))
            }),
        None => Ok((Synchronous::default(), "default".into())),
    }
}

/// The store's settings with where each came from, for `keel config`: its location (a
/// PostgreSQL URL without its password) and how durably it commits.
pub fn store_settings(home: &Home) -> Result<Vec<Setting>, ConfigError> {
    let (sync, sync_from) = synchronous_from(home)?;
    let location = store_location(home)?;
    let from = match store_url(home)? {
        Some((from, _)) => from,
        None => "default".to_string(),
    };
    Ok(vec![
        Setting { key: "store.location".into(), value: Some(location.display()), from },
        Setting { key: "store.synchronous".into(), value: Some(sync.pragma().to_ascii_lowercase()),
            from: sync_from,
         },
    ])
}

/// The PostgreSQL URL the store is to use, and where it was set: `KEEL_DATABASE_URL`, else
/// `[store] url`.
fn store_url(home: &Home) -> Result<Option<(String, String)>, ConfigError> {
    if let Some(url) = env("KEEL_DATABASE_URL") {
        return Ok(Some(("KEEL_DATABASE_URL".to_string(), url)));
    }
    Ok(read(home)?
        .store
        .and_then(|s| s.url)
        .map(|url| ("keel.toml [store] url".to_string(), url)))
}

/// Where the home's store is: the PostgreSQL database of `KEEL_DATABASE_URL`, else of
/// `[store] url` in `keel.toml`, else the home's SQLite file (committing as
/// [`synchronous`] says).
pub fn store_location(home: &Home) -> Result<crate::store::Location, ConfigError> {
    // A bad durability setting is refused whichever store it would apply to.
    let sync = synchronous(home)?;
    if let Some((from, url)) = store_url(home)? {
        let from = match from.strip_prefix("keel.toml ") {
            Some(key) => format!("{}: {key}", path(home).display()),
            None => from,
        };
        let url = url.trim().to_string();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(ConfigError(format!(
                "{from}: `{}` is not a PostgreSQL URL: use postgres://USER:PASSWORD@HOST:PORT/DATABASE \
                 (without a URL the store is the home's SQLite file)",
                crate::sql::pg::redact(&url)
            )));
        }
        return Ok(crate::store::Location::Postgres { url });
    }
    #[cfg(feature = "internals")]
    if let Some(url) = crate::store::per_home_test_database(home.root())
        .map_err(|e| ConfigError(format!("KEEL_TEST_POSTGRES: {e}")))?
    {
        return Ok(crate::store::Location::Postgres { url });
    }
    Ok(crate::store::Location::Sqlite { path: home.database(), sync })
}

/// The bounds of a front-end's connections (`keel.toml` `[serve]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub header_timeout: std::time::Duration,
    /// The body deadline of a request that proved who it is; one without a credential has
    /// [`Bounds::anonymous_body_timeout`].
    pub body_timeout: std::time::Duration,
    pub idle_timeout: std::time::Duration,
    pub max_connections: usize,
    /// Requests in progress one user may hold; `None`: [`Bounds::per_user`]'s default.
    pub max_per_user: Option<usize>,
}

impl Default for Bounds {
    fn default() -> Self {
        Self {
            header_timeout: std::time::Duration::from_secs(10),
            body_timeout: std::time::Duration::from_secs(60),
            idle_timeout: std::time::Duration::from_secs(60),
            max_connections: 1024,
            max_per_user: None,
        }
    }
}

impl Bounds {
    /// Checks the bounds: every timeout at least a second (at most a day), a cap of 1 to
    /// 65,536 connections that this process may open as files.
    pub fn check(&self) -> Result<(), String> {
        for (what, d) in [
            ("header_timeout_secs", self.header_timeout),
            ("body_timeout_secs", self.body_timeout),
            ("idle_timeout_secs", self.idle_timeout),
        ] {
            if d < std::time::Duration::from_secs(1) || d > std::time::Duration::from_secs(86_400) {
                return Err(format!("[serve] {what} must be 1 to 86400 seconds"));
            }
        }
        if !(1..=65_536).contains(&self.max_connections) {
            return Err("[serve] max_connections must be 1 to 65536".into());
        }
        if self.max_per_user.is_some_and(|n| n == 0 || n > self.max_connections) {
            return Err("[serve] max_connections_per_user must be 1 to max_connections".into());
        }
        Ok(())
    }

    /// The body deadline of a request that carries no credential yet (a login form, say):
    /// the header timeout, or the body timeout when that is shorter.
    pub fn anonymous_body_timeout(&self) -> std::time::Duration {
        self.header_timeout.min(self.body_timeout)
    }

    /// Requests in progress that carry no credential, at most, all together: an eighth of
    /// the connections (at least one). Past it, the oldest of them gives way.
    pub fn anonymous_share(&self) -> usize {
        (self.max_connections / 8).max(1)
    }

    /// Requests in progress of one user's token, at most: `max_connections_per_user`, else
    /// a quarter of the connections (at least one), never more than users may hold together.
    pub fn per_user(&self) -> usize {
        self.max_per_user.unwrap_or(self.max_connections / 4).clamp(1, self.users_share())
    }

    /// Requests in progress of every user's token together, at most: all connections but the
    /// admins' room (an eighth, at least one, unless there is a single connection).
    pub fn users_share(&self) -> usize {
        (self.max_connections - (self.max_connections / 8).max(1)).max(1)
    }

    /// The cap this process can keep: `max_connections`, lowered (with a warning) to leave
    /// room below the open-file limit for the database, components and logs. The soft limit
    /// is raised to the hard one first.
    pub fn fitted(mut self) -> Self {
        let limit = open_file_limit();
        const RESERVE: usize = 128;
        if let Some(limit) = limit
            && self.max_connections + RESERVE > limit
        {
            let fit = limit.saturating_sub(RESERVE).max(1);
            tracing::warn!(
                "[serve] max_connections {} does not fit the open-file limit {limit}: using {fit}",
                self.max_connections
            );
            self.max_connections = fit;
        }
        self
    }
}

/// The open-file limit after raising the soft limit to the hard one.
fn open_file_limit() -> Option<usize> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        let raised = rustix::process::Rlimit { current: l.maximum, maximum: l.maximum };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            l = raised;
        }
    }
    l.current.map(|c| usize::try_from(c).unwrap_or(usize::MAX))
}
