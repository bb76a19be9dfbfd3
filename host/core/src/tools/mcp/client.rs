//! Connections to external MCP servers, and their tools as host tools of the catalog.
//!
//! A stdio server is a child process started with only the environment it was added with
//! (`--env`) plus `PATH` and `HOME`; its stderr is kept (the last [`STDERR_TAIL`] bytes, shown
//! in errors) and never read as protocol. A streamable HTTP server is reached with keel's own
//! HTTP client (no redirects). Either way a message is at most [`MAX_MESSAGE`] bytes.
//!
//! [`Pool`] keeps one connection per server per process, started on the first call. A server
//! found stopped is restarted once; if it stops again before a call succeeds, it is left
//! stopped for the rest of the process and each call says so.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use tokio::io::AsyncReadExt;

use crate::sandbox::{CallError, ToolErrorKind};
use crate::tools::{HostCall, HostFuture, HostTool, SourceKind, ToolRecord};

use super::{McpError, Offer, PinnedTool, ServerInfo, ServerSpec, Transport};

/// The largest message keel reads from a server (a longer line or event is dropped).
pub const MAX_MESSAGE: usize = 8 * 1024 * 1024;

/// Bytes of a server's stderr kept for error messages.
pub const STDERR_TAIL: usize = 4096;

/// How long `initialize` and `tools/list` may take when a server starts.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The most tools keel reads from one server's `tools/list`, over all its pages (it takes at
/// most 256 of them; the rest are listed as skipped).
pub const MAX_LISTED_TOOLS: usize = 1024;

/// The most pages of one `tools/list`.
pub const MAX_LIST_PAGES: usize = 64;

/// The most bytes (as JSON) of the tools of one `tools/list`, over all its pages.
pub const MAX_LIST_BYTES: usize = 16 * 1024 * 1024;

/// Lists a server's tools page by page, stopping with an error as soon as it passes
/// [`MAX_LISTED_TOOLS`], [`MAX_LIST_PAGES`] or [`MAX_LIST_BYTES`], or repeats a cursor: a
/// server that pages without end costs one page at a time, not all of them.
pub async fn list_tools_bounded(
    peer: &rmcp::Peer<RoleClient>,
) -> Result<Vec<rmcp::model::Tool>, String> {
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    let mut seen = std::collections::HashSet::new();
    let mut bytes = 0usize;
    for page in 1.. {
        let params = rmcp::model::PaginatedRequestParams::default().with_cursor(cursor.clone());
        let result = peer.list_tools(Some(params)).await.map_err(|e| e.to_string())?;
        bytes += result
            .tools
            .iter()
            .map(|t| serde_json::to_vec(t).map_or(0, |v| v.len()))
            .sum::<usize>();
        tools.extend(result.tools);
        let stop = if tools.len() > MAX_LISTED_TOOLS {
            Some(format!("more than {MAX_LISTED_TOOLS} tools"))
        } else if bytes > MAX_LIST_BYTES {
            Some(format!("more than {} MiB of tool descriptions", MAX_LIST_BYTES >> 20))
        } else {
            None
        };
        if let Some(what) = stop {
            return Err(format!(
                "tools/list gave {what} (page {page}); keel stopped reading: the server offers \
                 more than keel takes from one server"
            ));
        }
        match result.next_cursor {
            Some(next) if !next.is_empty() => {
                if page >= MAX_LIST_PAGES {
                    return Err(format!(
                        "tools/list went on past {MAX_LIST_PAGES} pages; keel stopped reading"
                    ));
                }
                if !seen.insert(next.clone()) {
                    return Err(format!(
                        "tools/list gave the cursor of an earlier page again (page {page}); keel \
                         stopped reading"
                    ));
                }
                cursor = Some(next);
            }
            _ => break,
        }
    }
    Ok(tools)
}

/// The last bytes a child process wrote to stderr.
#[derive(Debug, Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
        if self.0.len() > STDERR_TAIL {
            let cut = self.0.len() - STDERR_TAIL;
            self.0.drain(..cut);
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0).trim().to_string()
    }
}

/// A running connection to one server.
pub struct Live {
    spec: ServerSpec,
    service: RunningService<RoleClient, ClientConfig>,
    stderr: Arc<Mutex<Tail>>,
    /// The child process (stdio); killed when the connection is dropped.
    child: Mutex<Option<tokio::process::Child>>,
    /// What the server offered when its tools were last listed on this connection.
    offer: Mutex<Offer>,
}

impl Live {
    /// What the server offered when its tools were last listed on this connection.
    pub fn offer(&self) -> Offer {
        self.offer.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Whether the server's tool `pinned.remote`, as last listed, is what was accepted; `None`
    /// when it no longer offers it.
    fn matches(&self, pinned: &PinnedTool) -> Option<bool> {
        let offer = self.offer.lock().unwrap_or_else(PoisonError::into_inner);
        let t = offer.tools.iter().find(|t| t.pinned.remote == pinned.remote)?;
        Some(t.pinned.digest == pinned.digest)
    }

    /// Lists the server's tools again on this connection: the accepted pins moved (an accept
    /// by this or another keel process), so this connection's list may be older than them.
    async fn relist(&self) -> Result<(), String> {
        let tools = tokio::time::timeout(START_TIMEOUT, list_tools_bounded(self.service.peer()))
            .await
            .map_err(|_| format!("tools/list did not answer within {START_TIMEOUT:?}"))??;
        let mut offer = self.offer.lock().unwrap_or_else(PoisonError::into_inner);
        *offer = super::offer(&self.spec, offer.info.clone(), &tools);
        Ok(())
    }

    /// The server's stderr tail, if any, as a suffix for an error message.
    fn stderr_note(&self) -> String {
        let tail = self.stderr.lock().unwrap_or_else(PoisonError::into_inner).text();
        match tail.is_empty() {
            true => String::new(),
            false => format!("; its stderr ends with: {}", tail),
        }
    }

    /// Whether the connection ended: its service loop stopped, or its process exited.
    fn stopped(&self) -> bool {
        let exited = self
            .child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
            .is_some_and(|c| !matches!(c.try_wait(), Ok(None)));
        exited || self.service.is_closed()
    }

    /// Closes the connection (and stops a child process).
    pub async fn close(mut self) {
        let _ = self.service.close_with_timeout(Duration::from_secs(2)).await;
    }
}

fn client_info() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("keel", env!("CARGO_PKG_VERSION")),
    )
    .with_protocol_version(super::PROTOCOL_VERSIONS[0].clone())
}

/// Starts (or reaches) the server of `spec`, initializes it and lists its tools.
pub async fn connect(spec: &ServerSpec) -> Result<Live, McpError> {
    let fail = |detail: String| McpError::Connect { server: spec.name.clone(), detail };
    let stderr = Arc::new(Mutex::new(Tail::default()));
    let (service, child) = match &spec.transport {
        Transport::Stdio { command, args, env } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args).env_clear();
            for key in ["PATH", "HOME"] {
                if let Some(v) = std::env::var_os(key) {
                    cmd.env(key, v);
                }
            }
            cmd.envs(env)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true);
            let mut child =
                cmd.spawn().map_err(|e| fail(format!("cannot start `{command}`: {e}")))?;
            let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
                return Err(fail("the child process has no stdin or stdout".into()));
            };
            if let Some(mut err) = child.stderr.take() {
                let (tail, server) = (stderr.clone(), spec.name.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    while let Ok(n) = err.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        tracing::debug!(server = %server, "stderr: {}", String::from_utf8_lossy(&buf[..n]));
                        tail.lock().unwrap_or_else(PoisonError::into_inner).push(&buf[..n]);
                    }
                });
            }
            let transport = rmcp::transport::async_rw::AsyncRwTransport::new_client(stdout, stdin)
                .with_max_line_length(MAX_MESSAGE);
            let started = tokio::time::timeout(START_TIMEOUT, client_info().serve(transport)).await;
            let note = || {
                let tail = stderr.lock().unwrap_or_else(PoisonError::into_inner).text();
                match tail.is_empty() {
                    true => String::new(),
                    false => format!("; its stderr ends with: {}", tail),
                }
            };
            match started {
                Ok(Ok(s)) => (s, Some(child)),
                Ok(Err(e)) => return Err(fail(format!("initialize failed: {e}{}", note()))),
                Err(_) => {
                    return Err(fail(format!(
                        "initialize did not complete within {START_TIMEOUT:?}{}",
                        note()
                    )));
                }
            }
        }
        Transport::Http { url, headers } => {
            crate::tls::init();
            let http = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(crate::model::USER_AGENT)
                .build()
                .map_err(|e| fail(format!("cannot build the HTTP client: {e}")))?;
            let mut custom = HashMap::new();
            let mut auth = None;
            for (k, v) in headers {
                if k.eq_ignore_ascii_case("authorization")
                    && let Some(token) = v.strip_prefix("Bearer ")
                {
                    auth = Some(token.to_string());
                    continue;
                }
                let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                    .map_err(|e| fail(format!("header `{k}`: {e}")))?;
                let value = reqwest::header::HeaderValue::from_str(v)
                    .map_err(|e| fail(format!("header `{k}`: {e}")))?;
                custom.insert(name, value);
            }
            let mut config =
                rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                    url.as_str(),
                )
                .custom_headers(custom)
                .max_sse_event_size(MAX_MESSAGE);
            if let Some(token) = auth {
                config = config.auth_header(token);
            }
            let transport =
                rmcp::transport::StreamableHttpClientTransport::with_client(http, config);
            match tokio::time::timeout(START_TIMEOUT, client_info().serve(transport)).await {
                Ok(Ok(s)) => (s, None),
                Ok(Err(e)) => return Err(fail(format!("initialize failed: {e}"))),
                Err(_) => {
                    return Err(fail(format!(
                        "initialize did not complete within {START_TIMEOUT:?}"
                    )));
                }
            }
        }
    };
    let info = service
        .peer_info()
        .map(|i| ServerInfo {
            name: i.server_info.as_ref().map(|s| s.name.clone()).unwrap_or_default(),
            version: i.server_info.as_ref().map(|s| s.version.clone()).unwrap_or_default(),
            protocol: i.protocol_version.to_string(),
        })
        .unwrap_or_default();
    let mut live = Live {
        spec: spec.clone(),
        service,
        stderr,
        child: Mutex::new(child),
        offer: Mutex::new(Offer { info: info.clone(), tools: Vec::new(), skipped: Vec::new() }),
    };
    let tools =
        match tokio::time::timeout(START_TIMEOUT, list_tools_bounded(live.service.peer())).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                let note = live.stderr_note();
                live.close().await;
                return Err(fail(format!("tools/list failed: {e}{note}")));
            }
            Err(_) => {
                live.close().await;
                return Err(fail(format!("tools/list did not answer within {START_TIMEOUT:?}")));
            }
        };
    live.offer = Mutex::new(super::offer(spec, info, &tools));
    Ok(live)
}

/// One server's connection in a [`Pool`].
#[derive(Default)]
struct Slot {
    live: Option<Arc<Live>>,
    /// Whether the last connection stopped (the next start is a restart).
    stopped: bool,
    /// Restarts since the last call that succeeded.
    restarts: u32,
    /// Why the server is left stopped, once it stopped again after a restart.
    dead: Option<String>,
}

/// The connections of this process, one per server, started on first use.
#[derive(Default)]
pub struct Pool {
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>,
}

impl Pool {
    fn slot(&self, server: &str) -> Arc<tokio::sync::Mutex<Slot>> {
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(server.to_string())
            .or_default()
            .clone()
    }

    /// The running connection to `spec`'s server: started if it is not, restarted once if it
    /// stopped.
    async fn live(&self, spec: &ServerSpec) -> Result<Arc<Live>, CallError> {
        let slot = self.slot(&spec.name);
        let mut slot = slot.lock().await;
        if let Some(why) = &slot.dead {
            return Err(CallError::Setup { detail: why.clone() });
        }
        let mut note = String::new();
        if let Some(live) = slot.live.take() {
            if live.spec == *spec && !live.stopped() {
                slot.live = Some(live.clone());
                return Ok(live);
            }
            if live.spec == *spec {
                note = live.stderr_note();
                slot.stopped = true;
            }
        }
        if slot.stopped {
            if slot.restarts >= 1 {
                let why = format!(
                    "the MCP server `{}` stopped again after a restart; it is not restarted \
                     again in this process{note}",
                    spec.name
                );
                slot.dead = Some(why.clone());
                return Err(CallError::Setup { detail: why });
            }
            slot.restarts += 1;
            tracing::warn!(server = %spec.name, "the MCP server stopped; restarting it once{note}");
        }
        let live =
            Arc::new(connect(spec).await.map_err(|e| CallError::Setup { detail: e.to_string() })?);
        slot.live = Some(live.clone());
        slot.stopped = false;
        Ok(live)
    }

    /// Replaces the connection `old` with a new one (it is closed), unless another call
    /// replaced it already; returns the current connection.
    async fn reconnect(&self, spec: &ServerSpec, old: &Arc<Live>) -> Result<Arc<Live>, CallError> {
        let slot = self.slot(&spec.name);
        let mut slot = slot.lock().await;
        if let Some(current) = &slot.live
            && !Arc::ptr_eq(current, old)
        {
            return Ok(current.clone());
        }
        slot.live = None;
        let live =
            Arc::new(connect(spec).await.map_err(|e| CallError::Setup { detail: e.to_string() })?);
        slot.live = Some(live.clone());
        Ok(live)
    }

    /// Forgets `live` after it stopped during a call: the next call restarts the server.
    async fn lost(&self, server: &str, live: &Arc<Live>) {
        let slot = self.slot(server);
        let mut slot = slot.lock().await;
        if slot.live.as_ref().is_some_and(|l| Arc::ptr_eq(l, live)) {
            slot.live = None;
            slot.stopped = true;
        }
    }

    /// Marks a call of `server` as succeeded: a later stop may be restarted again.
    async fn succeeded(&self, server: &str) {
        let slot = self.slot(server);
        slot.lock().await.restarts = 0;
    }

    /// Calls `pinned` on `spec`'s server with `input`. The tool must still be what was
    /// accepted (its digest as the server describes it now); the output is the structured
    /// content, or the text, or the content blocks ([`super::output_of`]).
    pub async fn call(
        &self,
        spec: &ServerSpec,
        pinned: &PinnedTool,
        input: serde_json::Value,
    ) -> Result<serde_json::Value, CallError> {
        let mut live = self.live(spec).await?;
        let mut matches = live.matches(pinned);
        if matches != Some(true) {
            // What was accepted differs from this connection's list: the list may be the
            // older of the two (an accept by this or another keel process). List again; if
            // the server still says what it said, it is the process from before the change:
            // connect anew (a stdio server starts again) and compare once more.
            if let Err(e) = live.relist().await {
                tracing::warn!(server = %spec.name, "listing the tools again failed: {e}");
            }
            matches = live.matches(pinned);
            if matches != Some(true) {
                live = self.reconnect(spec, &live).await?;
                matches = live.matches(pinned);
            }
        }
        match matches {
            Some(true) => {}
            found => {
                let what = match found {
                    Some(_) => {
                        "changed since it was accepted (its description, schemas or annotations)"
                    }
                    None => "is no longer offered by the server",
                };
                return Err(CallError::Tool {
                    kind: ToolErrorKind::Denied,
                    message: format!(
                        "the MCP tool `{}` of server `{}` {what}; `keel mcp refresh {}` shows the \
                         difference and `--accept` takes it",
                        pinned.remote, spec.name, spec.name
                    ),
                });
            }
        }
        let arguments = match input {
            serde_json::Value::Object(map) => map,
            other => {
                return Err(CallError::Tool {
                    kind: ToolErrorKind::InvalidInput,
                    message: format!("the input must be a JSON object, not {other}"),
                });
            }
        };
        let params = CallToolRequestParams::new(pinned.remote.clone()).with_arguments(arguments);
        let result = live.service.call_tool(params).await;
        match result {
            Ok(r) if r.is_error == Some(true) => {
                self.succeeded(&spec.name).await;
                Err(CallError::Tool { kind: ToolErrorKind::Failed, message: super::error_text(&r) })
            }
            Ok(r) => {
                self.succeeded(&spec.name).await;
                Ok(super::output_of(&r))
            }
            Err(ServiceError::McpError(e)) => Err(CallError::Tool {
                kind: ToolErrorKind::Failed,
                message: format!("the MCP server answered with error {}: {}", e.code.0, e.message),
            }),
            Err(ServiceError::Timeout { timeout }) => Err(CallError::Timeout { limit: timeout }),
            Err(ServiceError::Cancelled { .. }) => Err(CallError::Cancelled),
            Err(e @ (ServiceError::TransportClosed | ServiceError::TransportSend(_))) => {
                self.lost(&spec.name, &live).await;
                Err(CallError::Crashed {
                    detail: format!(
                        "the MCP server `{}` stopped during the call ({e}); its outcome is unknown{}",
                        spec.name,
                        live.stderr_note()
                    ),
                })
            }
            Err(e) => Err(CallError::Crashed {
                detail: format!("the MCP server `{}` failed the call: {e}", spec.name),
            }),
        }
    }
}

/// A tool of an external MCP server, as the catalog resolves it.
pub struct McpTool {
    pub record: ToolRecord,
    pub spec: Arc<ServerSpec>,
    pub pinned: PinnedTool,
    pub pool: Arc<Pool>,
}

impl HostTool for McpTool {
    fn kind(&self) -> SourceKind {
        SourceKind::Mcp
    }

    fn record(&self) -> &ToolRecord {
        &self.record
    }

    fn digest(&self) -> &str {
        &self.pinned.digest
    }

    fn call<'a>(&'a self, input: serde_json::Value, _ctx: HostCall<'a>) -> HostFuture<'a> {
        Box::pin(self.pool.call(&self.spec, &self.pinned, input))
    }
}
