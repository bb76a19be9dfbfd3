//! keel as an MCP server (`keel mcp serve`).
//!
//! The admin fixes the grants, the tools and the policy when the server starts; a client can
//! neither widen nor change them. Each MCP connection (a stdio process, or one
//! `Mcp-Session-Id` of the streamable HTTP endpoint) is a keel session created at
//! `initialize`: every `tools/call` is a direct call of that session (see
//! `Harness::call_in_session`) — the ToolService chain, the journal, the events and evidence of
//! input and output. A call the policy asks about is put to the person through MCP
//! elicitation when the client declares it; otherwise it is refused with the `--allow` that
//! would permit it. It never runs unapproved.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ElicitRequestParams,
    ElicitationAction, ElicitationSchema, Implementation, InitializeRequestParams,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler};

use keel::api::{CONTROL_TOOLS, DELEGATION_TOOLS, SessionSpec};
use keel::protocol::sessions::CancelToken;
use keel::protocol::sessions::{ApprovalUnit, Decision, Policy};
use keel::protocol::setup::Harness;

/// How long a person has to answer an elicitation.
pub const ELICITATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// What the admin fixed when the server started: the template of every connection's
/// session (its `id` is ignored; `tools: None` offers every installed tool but keel's control
/// tools). An MCP session runs no model itself; its `model` is what input sent to it later
/// (`keel session send`) would use.
pub type ServeConfig = SessionSpec;

/// The MCP server of one connection.
#[derive(Clone)]
pub struct KeelServer {
    harness: Harness,
    config: Arc<ServeConfig>,
    transport: &'static str,
    /// What the client said in `initialize`.
    client: Arc<std::sync::OnceLock<InitializeRequestParams>>,
    /// The connection's session, with its policy and the tools it offers (fixed when it was
    /// created): created at its first `tools/call`, so a connection that never calls a tool
    /// leaves nothing behind.
    session: Arc<tokio::sync::OnceCell<Opened>>,
    /// One call of the session at a time (a session has one runner).
    calls: Arc<tokio::sync::Mutex<()>>,
}

impl KeelServer {
    /// A server for one connection over `transport` (`stdio` or `http`).
    pub fn new(harness: Harness, config: Arc<ServeConfig>, transport: &'static str) -> Self {
        Self {
            harness,
            config,
            transport,
            client: Arc::default(),
            session: Arc::default(),
            calls: Arc::default(),
        }
    }

    /// Checks what the server offers (the tools exist) before it accepts a connection.
    pub fn check(harness: &Harness, config: &ServeConfig) -> Result<(), keel::api::ApiError> {
        harness.check_session_parts(
            &keel::api::Caller::Operator,
            &config.grants,
            config.tools.as_deref(),
        )
    }

    /// The connection's session id, once its first `tools/call` created it.
    pub fn session_id(&self) -> Option<&str> {
        self.session.get().map(|o| o.id.as_str())
    }

    /// The tools the connection may call: those of its session, once it exists (fixed then),
    /// else those it would be offered now.
    fn offered(&self) -> Result<Vec<String>, ErrorData> {
        match self.session.get() {
            Some(o) => Ok(o.offered.clone()),
            None => self.to_offer(),
        }
    }

    /// The tools a session of this server offers: those the admin named, else every installed
    /// tool but keel's control and delegation tools. The session loads keel's control tools
    /// too (every session does), but a client calls only what it was offered: a control tool
    /// runs only when the admin named it.
    fn to_offer(&self) -> Result<Vec<String>, ErrorData> {
        Ok(match &self.config.tools {
            Some(t) => t.clone(),
            None => self
                .harness
                .tools(&keel::api::Caller::Operator)
                .map_err(internal)?
                .into_iter()
                .map(|t| t.name)
                .filter(|n| {
                    !CONTROL_TOOLS.contains(&n.as_str()) && !DELEGATION_TOOLS.contains(&n.as_str())
                })
                .collect(),
        })
    }

    /// The connection's session and its policy, created on first use.
    async fn session(&self) -> Result<&Opened, ErrorData> {
        self.session.get_or_try_init(|| self.open_session()).await
    }

    async fn open_session(&self) -> Result<Opened, ErrorData> {
        let Some(client) = self.client.get() else { return Err(not_initialized()) };
        let c = &self.config;
        let offered = self.to_offer()?;
        let spec = SessionSpec { id: None, tools: Some(offered.clone()), ..(**c).clone() };
        let id = self
            .harness
            .create_session(&keel::api::Caller::Operator, spec)
            .await
            .map_err(internal)?;
        let meta =
            self.harness.session(&keel::api::Caller::Operator, &id).await.map_err(internal)?;
        let info = client.client_info.clone();
        self.harness
            .client_connected(
                &keel::api::Caller::Operator,
                &id,
                info.name,
                info.version,
                client.protocol_version.to_string(),
                self.transport.to_string(),
            )
            .await
            .map_err(internal)?;
        Ok(Opened { id: id.to_string(), policy: meta.config.policy, offered })
    }

    /// The tools the session offers (before it exists: those it would load, as installed
    /// now), as MCP describes them.
    async fn tool_list(&self) -> Result<Vec<Tool>, ErrorData> {
        if self.client.get().is_none() {
            return Err(not_initialized());
        }
        let pins = match self.session_id() {
            Some(id) => {
                let meta = self
                    .harness
                    .session(&keel::api::Caller::Operator, id)
                    .await
                    .map_err(internal)?;
                meta.capabilities.tool_pins
            }
            None => Default::default(),
        };
        let offered = self.offered()?;
        let records = self
            .harness
            .tools_pinned(&keel::api::Caller::Operator, &offered, &pins)
            .map_err(internal)?;
        let mut out = Vec::new();
        for t in &records {
            let input = match &t.input_schema {
                serde_json::Value::Object(o) => o.clone(),
                _ => continue,
            };
            let mut tool = Tool::new(t.name.clone(), t.description.clone(), Arc::new(input))
                .annotate(keel::protocol::tools::mcp::annotations(t.effect, t.idempotent));
            if let Some(serde_json::Value::Object(o)) = &t.output_schema {
                tool = tool.with_raw_output_schema(Arc::new(o.clone()));
            }
            out.push(tool);
        }
        Ok(out)
    }
}

/// A connection's session once created.
struct Opened {
    id: String,
    policy: Policy,
    /// The tools it offers, fixed at creation: nothing else is called through it.
    offered: Vec<String>,
}

fn internal(e: impl std::fmt::Display) -> ErrorData {
    ErrorData::internal_error(e.to_string(), None)
}

fn not_initialized() -> ErrorData {
    ErrorData::invalid_request("the connection is not initialized", None)
}

/// The text a person sees when asked: exactly what would run.
fn question(unit: &ApprovalUnit) -> String {
    let input = serde_json::from_str::<serde_json::Value>(&unit.input)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| unit.input.clone());
    let grants = match unit.grants.is_empty() {
        true => "none".to_string(),
        false => unit
            .grants
            .iter()
            .map(|g| format!("{} as {} ({})", g.host.display(), g.guest, g.access))
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!(
        "keel asks before this call: {}.\n\nTool: {} ({}), implementation sha256:{}\nSession: {}\n\
         Directories it may touch: {grants}\nInput:\n{input}\n\nApprove this call?",
        unit.why, unit.tool, unit.effect, unit.component_digest, unit.session_id
    )
}

/// Asks the client's person about `unit` through elicitation.
async fn elicit(
    peer: rmcp::service::Peer<RoleServer>,
    who: String,
    unit: ApprovalUnit,
) -> (Decision, Option<String>) {
    let schema = ElicitationSchema::builder()
        .required_bool_with("approve", |b| {
            b.title("Approve").description("Run this call exactly as shown")
        })
        .optional_string("reason")
        .build_unchecked();
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: question(&unit),
        requested_schema: schema,
    };
    let answer = peer.create_elicitation_with_timeout(params, Some(ELICITATION_TIMEOUT)).await;
    let reason = |said: Option<&serde_json::Value>, what: &str| {
        let said = said.and_then(|c| c["reason"].as_str()).filter(|r| !r.is_empty());
        Some(match said {
            Some(r) => format!("{what} in MCP client {who} (elicitation): {r}"),
            None => format!("{what} in MCP client {who} (elicitation)"),
        })
    };
    match answer {
        Ok(r) => match r.action {
            ElicitationAction::Accept
                if r.content.as_ref().is_some_and(|c| c["approve"] == serde_json::json!(true)) =>
            {
                (Decision::Approve, reason(r.content.as_ref(), "approved"))
            }
            ElicitationAction::Accept => (Decision::Reject, reason(r.content.as_ref(), "rejected")),
            ElicitationAction::Decline => (Decision::Reject, reason(None, "declined")),
            _ => (Decision::Reject, reason(None, "cancelled")),
        },
        Err(e) => {
            (Decision::Reject, Some(format!("the elicitation in MCP client {who} failed: {e}")))
        }
    }
}

impl ServerHandler for KeelServer {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("keel", env!("CARGO_PKG_VERSION")))
            .with_protocol_version(keel::protocol::tools::mcp::PROTOCOL_VERSIONS[0].clone())
            .with_instructions(
                "keel's governed tools. Each call runs under the grants, policy and budget the \
                 admin fixed; a call the policy asks about needs the person's approval.",
            )
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(keel::protocol::tools::mcp::PROTOCOL_VERSIONS)
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let result = self.negotiate_initialize(&request)?;
        let _ = self.client.set(request);
        Ok(result)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tool_list().await?))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = request.name.to_string();
        // Only what the server offers runs: a name outside it (keel's control tools included)
        // is refused before a session exists for it.
        if !self.offered()?.contains(&tool) {
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool `{}`: this server offers only the tools of `tools/list`",
                    tool.chars().take(80).collect::<String>().escape_debug()
                ),
                None,
            ));
        }
        let Opened { id, policy, .. } = self.session().await?;
        let input = serde_json::Value::Object(request.arguments.unwrap_or_default()).to_string();
        let _one = self.calls.lock().await;
        let cancel = CancelToken::new();
        let on_cancel = (context.ct.clone(), cancel.clone());
        let watch = tokio::spawn(async move {
            on_cancel.0.cancelled().await;
            on_cancel.1.cancel();
        });
        let peer = context.peer.clone();
        let can_ask =
            peer.supported_elicitation_modes().contains(&rmcp::service::ElicitationMode::Form);
        let who = peer
            .peer_info()
            .map(|i| format!("`{}` {}", i.client_info.name, i.client_info.version))
            .unwrap_or_else(|| "(unnamed)".into());
        let call = self
            .harness
            .call_in_session(
                &keel::api::Caller::Operator,
                id,
                &tool,
                &input,
                &cancel,
                |unit| async move {
                    match can_ask {
                        true => Some(elicit(peer, who, unit).await),
                        false => None,
                    }
                },
            )
            .await;
        watch.abort();
        let call = call.map_err(internal)?;
        let result = match (call.output, call.ran) {
            (Some(value), _) => {
                let text = policy.redact(&value.to_string()).into_owned();
                let structured =
                    serde_json::from_str::<serde_json::Value>(&text).ok().filter(|v| v.is_object());
                let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
                r.structured_content = structured;
                r
            }
            (None, true) => CallToolResult::error(vec![ContentBlock::text(call.result.content)]),
            (None, false) => {
                let mut text = call.result.content;
                if call.ask_reason.is_some() {
                    // The client could not be asked: say how the call could run.
                    let mut error: serde_json::Value =
                        serde_json::from_str(&text).unwrap_or_default();
                    let message = error["error"]["message"].as_str().unwrap_or_default();
                    error["error"]["message"] = format!(
                        "{}. This MCP client cannot be asked (it does not declare elicitation): \
                         restart `keel mcp serve` with `--allow {tool}` to let the call run \
                         without asking.",
                        message.trim_end_matches('.')
                    )
                    .into();
                    text = error.to_string();
                }
                CallToolResult::error(vec![ContentBlock::text(text)])
            }
        };
        Ok(result.into())
    }
}

/// Serves MCP on this process's stdin and stdout until the client closes them.
pub async fn serve_stdio(harness: Harness, config: Arc<ServeConfig>) -> Result<(), String> {
    use rmcp::ServiceExt;
    let server = KeelServer::new(harness, config, "stdio");
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("the MCP connection failed to start: {e}"))?;
    running.waiting().await.map_err(|e| format!("the MCP connection failed: {e}"))?;
    Ok(())
}

/// The bounds of `keel mcp serve --http` beyond its connections' (`[mcp]` in keel.toml).
pub use keel::protocol::setup::config::HttpLimits;

/// Serves MCP over streamable HTTP at `http://LISTENER/mcp` until `shutdown` completes. With
/// `token`, every request must carry `Authorization: Bearer TOKEN` (401 otherwise); requests
/// whose `Host` is not loopback are refused unless a token is set, and a request whose
/// `Origin` is not the server itself (or, on loopback, a loopback origin) is refused (403), as
/// the transport specification requires against DNS rebinding. At most
/// `limits.max_sessions` MCP sessions are open; one idle for `limits.session_idle` is closed.
/// The rule of exposure: an MCP server on an address other than loopback needs a bearer
/// token. The refusal, when `token` is `None` and `addr` is not loopback.
pub fn check_exposure(addr: std::net::SocketAddr, token: Option<&str>) -> Result<(), String> {
    if token.is_none() && !addr.ip().is_loopback() {
        return Err(format!(
            "serving MCP on {addr}, which is not a loopback address, needs a bearer token: set \
             KEEL_MCP_TOKEN or `[mcp] token` in keel.toml"
        ));
    }
    Ok(())
}

pub async fn serve_http(
    harness: Harness,
    config: Arc<ServeConfig>,
    listener: tokio::net::TcpListener,
    token: Option<String>,
    bounds: crate::listen::Bounds,
    limits: HttpLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    use rmcp::transport::streamable_http_server::session::local::{
        LocalSessionManager, SessionConfig,
    };
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let addr =
        listener.local_addr().map_err(|e| format!("cannot read the listening address: {e}"))?;
    check_exposure(addr, token.as_deref())?;
    let mut http =
        StreamableHttpServerConfig::default().with_max_request_body_bytes(MAX_REQUEST_BODY);
    if token.is_some() {
        // The token is the gate; the Host check (against DNS rebinding) is for loopback.
        http = http.disable_allowed_hosts();
    }
    let mut manager = LocalSessionManager::default();
    let mut sessions = SessionConfig::default();
    // The gate owns idle expiry (it knows which sessions have a call in flight): the
    // transport's own keep-alive would cut a call waiting for its elicitation answer.
    sessions.keep_alive = None;
    manager.session_config = sessions;
    let manager = Arc::new(manager);
    // A long-lived front-end keeps the store's sessions running: on a shared store, the
    // sessions of a host that stopped are taken over.
    let running =
        harness.keep_sessions_running(&keel::api::Caller::Operator).map_err(|e| e.to_string())?;
    let service = StreamableHttpService::new(
        move || Ok(KeelServer::new(harness.clone(), config.clone(), "http")),
        manager.clone(),
        http,
    );
    let gate = Arc::new(Gate {
        token: token.map(Into::into),
        manager,
        limits,
        loopback: addr.ip().is_loopback(),
        sessions: Default::default(),
    });
    let sweeper = tokio::spawn(gate.clone().expire_idle());
    let router =
        axum::Router::new().nest_service("/mcp", service).layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let gate = gate.clone();
                async move { gate.pass(req, next).await }
            },
        ));
    let budget = crate::listen::Budget::new(bounds);
    let served = crate::listen::serve(listener, router, budget, shutdown).await;
    sweeper.abort();
    drop(running);
    served
}

/// What every request of the HTTP endpoint passes before the MCP service sees it.
struct Gate {
    token: Option<Arc<str>>,
    manager: Arc<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>,
    limits: HttpLimits,
    /// Whether the server listens on a loopback address.
    loopback: bool,
    /// The open MCP sessions as the gate sees them, by session id.
    sessions: std::sync::Mutex<std::collections::HashMap<String, Activity>>,
}

/// An MCP session's client and activity.
struct Activity {
    /// The address of the client that opened it.
    client: std::net::IpAddr,
    /// Requests of the session in progress (a `tools/call` is one until its answer is sent,
    /// elicitation included).
    in_flight: usize,
    /// When its last request ended.
    last: std::time::Instant,
}

/// A request of a session in progress: ends when its response body does.
struct InFlight {
    gate: Arc<Gate>,
    session: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut sessions = self.gate.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = sessions.get_mut(&self.session) {
            a.in_flight = a.in_flight.saturating_sub(1);
            a.last = std::time::Instant::now();
        }
    }
}

/// A response body that keeps its session's request in flight until it ends.
struct Holding {
    inner: axum::body::Body,
    _in_flight: InFlight,
}

impl http_body::Body for Holding {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Gate {
    /// Checks a request, claims its connection for its client, and passes it on; notes the
    /// session it opens, or the activity of the one it belongs to.
    async fn pass(
        self: Arc<Self>,
        req: axum::extract::Request,
        next: axum::middleware::Next,
    ) -> axum::response::Response {
        use axum::http::StatusCode;
        let post = req.method() == axum::http::Method::POST;
        if let Err(refused) = self.check(req.headers(), post).await {
            return refused;
        }
        let seat = req.extensions().get::<crate::listen::Seat>().cloned();
        let client = seat.as_ref().map_or(std::net::Ipv4Addr::LOCALHOST.into(), |s| s.peer().ip());
        if let Some(seat) = &seat
            && let Err(e) = seat.claim(&format!("mcp client {client}"), false)
        {
            return rpc_refusal(StatusCode::TOO_MANY_REQUESTS, &e.to_string());
        }
        let session =
            req.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        let Some(session) = session else {
            if post {
                let mine = {
                    let sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
                    sessions.values().filter(|a| a.client == client).count()
                };
                if mine >= self.limits.max_per_client {
                    return rpc_refusal(
                        StatusCode::TOO_MANY_REQUESTS,
                        &format!(
                            "{mine} MCP sessions of {client} are open, the most one client \
                             keeps ([mcp] max_sessions_per_client): close one first"
                        ),
                    );
                }
            }
            let res = next.run(req).await;
            if let Some(id) = res.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()) {
                let activity = Activity { client, in_flight: 0, last: std::time::Instant::now() };
                self.sessions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id.to_string(), activity);
            }
            return res;
        };
        if let Some(a) = self.sessions.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&session) {
            a.in_flight += 1;
        }
        let in_flight = InFlight { gate: self.clone(), session };
        let res = next.run(req).await;
        res.map(|b| axum::body::Body::new(Holding { inner: b, _in_flight: in_flight }))
    }

    /// Closes the sessions with no request in flight whose last request ended `session_idle`
    /// ago, and forgets those the transport closed; looks every quarter of `session_idle`
    /// (between 250 ms and 5 s).
    async fn expire_idle(self: Arc<Self>) {
        use rmcp::transport::streamable_http_server::session::SessionManager;
        let every = (self.limits.session_idle / 4)
            .clamp(std::time::Duration::from_millis(250), std::time::Duration::from_secs(5));
        loop {
            tokio::time::sleep(every).await;
            let open: std::collections::HashSet<String> =
                self.manager.sessions.read().await.keys().map(|k| k.to_string()).collect();
            let idle: Vec<String> = {
                let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
                sessions.retain(|id, _| open.contains(id));
                let expired =
                    |a: &Activity| a.in_flight == 0 && a.last.elapsed() >= self.limits.session_idle;
                let idle: Vec<String> =
                    sessions.iter().filter(|(_, a)| expired(a)).map(|(id, _)| id.clone()).collect();
                for id in &idle {
                    sessions.remove(id);
                }
                idle
            };
            for id in idle {
                if let Err(e) = self.manager.close_session(&id.as_str().into()).await {
                    tracing::debug!("closing the idle MCP session {id}: {e}");
                }
            }
        }
    }

    /// Checks a request's token, origin and (for a `post`) the session cap.
    async fn check(
        &self,
        headers: &axum::http::HeaderMap,
        post: bool,
    ) -> Result<(), axum::response::Response> {
        use axum::http::{StatusCode, header};
        use axum::response::IntoResponse;
        if let Some(t) = &self.token {
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), t.as_bytes())) {
                return Err((
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "a bearer token is required (KEEL_MCP_TOKEN or [mcp] token)",
                )
                    .into_response());
            }
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
            if !origin_allowed(origin.to_str().unwrap_or(""), host, self.loopback) {
                return Err(rpc_refusal(
                    StatusCode::FORBIDDEN,
                    &format!(
                        "Origin `{}` is not this server: a web page may not use it",
                        String::from_utf8_lossy(origin.as_bytes()).escape_debug()
                    ),
                ));
            }
        }
        // A POST without a session id starts a session (`initialize`).
        let starts = post && !headers.contains_key("mcp-session-id");
        if starts {
            let open = self.manager.sessions.read().await.len();
            if open >= self.limits.max_sessions {
                return Err(rpc_refusal(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!(
                        "{open} MCP sessions are open, the most this server keeps ([mcp] \
                         max_sessions); close one or try again when an idle one expires"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Whether a request's `Origin` may use the endpoint: the server's own origin (the `Host` it
/// was sent to), or, when the server listens on loopback, any loopback origin.
fn origin_allowed(origin: &str, host: &str, loopback: bool) -> bool {
    let Some(authority) =
        origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    if !host.is_empty() && authority.eq_ignore_ascii_case(host) {
        return true;
    }
    loopback && crate::listen::loopback_host(authority)
}

/// A refusal as a JSON-RPC error an MCP client can show.
fn rpc_refusal(status: axum::http::StatusCode, message: &str) -> axum::response::Response {
    use axum::response::IntoResponse;
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": null,
        "error": {"code": -32000, "message": message},
    });
    (status, axum::Json(body)).into_response()
}

/// The largest request body the HTTP endpoint reads.
pub const MAX_REQUEST_BODY: usize = 4 * 1024 * 1024;

/// Compares two byte strings in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_servers_own_origin_or_loopback_may_call() {
        use super::origin_allowed as ok;
        assert!(ok("http://127.0.0.1:8000", "127.0.0.1:8000", false));
        assert!(ok("http://localhost:3000", "127.0.0.1:8000", true));
        assert!(ok("http://[::1]:3000", "127.0.0.1:8000", true));
        assert!(!ok("http://localhost:3000", "10.0.0.5:8000", false));
        assert!(!ok("http://evil.example", "127.0.0.1:8000", true));
        assert!(!ok("null", "127.0.0.1:8000", true));
        assert!(!ok("http://127.0.0.1.evil.example", "127.0.0.1:8000", true));
    }

    /// The exposure rule is the server library's (`serve_http` checks the address it was given
    /// before serving anything), so an embedder that serves MCP without the CLI cannot leave
    /// a public address open.
    #[test]
    fn a_public_address_without_a_token_is_refused_by_the_server_itself() {
        use super::check_exposure;
        let public: std::net::SocketAddr = "0.0.0.0:7430".parse().unwrap();
        let err = check_exposure(public, None).unwrap_err();
        assert!(err.contains("needs a bearer token"), "{err}");
        assert!(check_exposure(public, Some("t")).is_ok());
        assert!(check_exposure("127.0.0.1:7430".parse().unwrap(), None).is_ok());
        assert!(check_exposure("[::1]:7430".parse().unwrap(), None).is_ok());
    }
}
