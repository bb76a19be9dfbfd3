//! keel as an MCP server (`keel mcp serve`).
//!
//! The admin fixes the grants, the tools and the policy when the server starts; a client can
//! neither widen nor change them. Each MCP connection (a stdio process, or one
//! `Mcp-Session-Id` of the streamable HTTP endpoint) is a keel session created at
//! `initialize`: every `tools/call` is a direct call of that session (see
//! `Brain::call_direct`) — the ToolService chain, the journal, the events and evidence of
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

use crate::api::{CONTROL_TOOLS, DELEGATION_TOOLS, SessionSpec};
use crate::cancel::CancelToken;
use crate::harness::Harness;
use crate::sandbox::Grant;
use crate::session::{ApprovalUnit, Decision, Policy};

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
    /// The connection's session, created at `initialize`, with its policy.
    session: Arc<tokio::sync::OnceCell<(String, Policy)>>,
    /// One call of the session at a time (a session has one runner).
    calls: Arc<tokio::sync::Mutex<()>>,
}

impl KeelServer {
    /// A server for one connection over `transport` (`stdio` or `http`).
    pub fn new(harness: Harness, config: Arc<ServeConfig>, transport: &'static str) -> Self {
        Self { harness, config, transport, session: Arc::default(), calls: Arc::default() }
    }

    /// Checks what the server offers (the tools exist) before it accepts a connection.
    pub fn check(harness: &Harness, config: &ServeConfig) -> Result<(), crate::api::ApiError> {
        Grant::check_disjoint(&config.grants)
            .map_err(|e| crate::api::ApiError::Grant(e.to_string()))?;
        harness
            .tools
            .check_grants(&config.grants)
            .map_err(|e| crate::api::ApiError::Grant(e.to_string()))?;
        for t in config.tools.iter().flatten() {
            harness
                .tools
                .resolve(t)
                .map_err(|e| crate::api::ApiError::NotInstalled(e.to_string()))?;
        }
        Ok(())
    }

    /// The connection's session id, once `initialize` created it.
    pub fn session_id(&self) -> Option<&str> {
        self.session.get().map(|(id, _)| id.as_str())
    }

    async fn open_session(&self, client: &InitializeRequestParams) -> Result<(), ErrorData> {
        let c = &self.config;
        let tools = match &c.tools {
            Some(t) => Some(t.clone()),
            None => Some(
                self.harness
                    .tools()
                    .map_err(internal)?
                    .into_iter()
                    .map(|t| t.name)
                    .filter(|n| {
                        !CONTROL_TOOLS.contains(&n.as_str())
                            && !DELEGATION_TOOLS.contains(&n.as_str())
                    })
                    .collect(),
            ),
        };
        let spec = SessionSpec { id: None, tools, ..(**c).clone() };
        let id = self.harness.create_session(spec).await.map_err(internal)?;
        let meta = self.harness.session(&id).await.map_err(internal)?;
        let info = client.client_info.clone();
        self.harness
            .engine
            .client_connected(
                &id,
                info.name,
                info.version,
                client.protocol_version.to_string(),
                self.transport.to_string(),
            )
            .await
            .map_err(internal)?;
        let _ = self.session.set((id.to_string(), meta.policy));
        Ok(())
    }

    /// The tools the session offers, as MCP describes them.
    async fn tool_list(&self) -> Result<Vec<Tool>, ErrorData> {
        let Some(id) = self.session_id() else { return Err(not_initialized()) };
        let meta = self.harness.session(id).await.map_err(internal)?;
        let catalog = self.harness.tools.catalog().map_err(internal)?;
        let mut out = Vec::new();
        for name in meta.loaded_tools.iter().filter(|n| !CONTROL_TOOLS.contains(&n.as_str())) {
            let Some(r) = catalog.get_pinned(name, &meta.tool_pins) else { continue };
            let t = &r.record;
            let input = match &t.input_schema {
                serde_json::Value::Object(o) => o.clone(),
                _ => continue,
            };
            let mut tool = Tool::new(t.name.clone(), t.description.clone(), Arc::new(input))
                .annotate(super::annotations(t.effect, t.idempotent));
            if let Some(serde_json::Value::Object(o)) = &t.output_schema {
                tool = tool.with_raw_output_schema(Arc::new(o.clone()));
            }
            out.push(tool);
        }
        Ok(out)
    }
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
            .with_protocol_version(super::PROTOCOL_VERSIONS[0].clone())
            .with_instructions(
                "keel's governed tools. Each call runs under the grants, policy and budget the \
                 admin fixed; a call the policy asks about needs the person's approval.",
            )
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(super::PROTOCOL_VERSIONS)
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let result = self.negotiate_initialize(&request)?;
        if self.session.get().is_none() {
            self.open_session(&request).await?;
        }
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
        let Some((id, policy)) = self.session.get() else { return Err(not_initialized()) };
        let tool = request.name.to_string();
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
            .brain
            .call_direct(id, &tool, &input, &cancel, |unit| async move {
                match can_ask {
                    true => Some(elicit(peer, who, unit).await),
                    false => None,
                }
            })
            .await;
        watch.abort();
        let call = call.map_err(internal)?;
        let result = match call.outcome {
            Ok(o) => match o.report.result {
                Ok(value) => {
                    let text = policy.redact(&value.to_string()).into_owned();
                    let structured = serde_json::from_str::<serde_json::Value>(&text)
                        .ok()
                        .filter(|v| v.is_object());
                    let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
                    r.structured_content = structured;
                    r
                }
                Err(_) => CallToolResult::error(vec![ContentBlock::text(call.content)]),
            },
            Err(refusal) => {
                let hint = match &refusal.ask_reason {
                    Some(_) => format!(
                        " This MCP client cannot be asked (it does not declare elicitation): \
                         restart `keel mcp serve` with `--allow {tool}` to let the call run \
                         without asking."
                    ),
                    None => String::new(),
                };
                let text = serde_json::json!({"error": {
                    "kind": refusal.kind, "message": format!("{}.{hint}", refusal.message.trim_end_matches('.'))}})
                .to_string();
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

/// Serves MCP over streamable HTTP at `http://LISTENER/mcp` until `shutdown` completes. With
/// `token`, every request must carry `Authorization: Bearer TOKEN` (401 otherwise); requests
/// whose `Host` is not loopback are refused unless a token is set.
pub async fn serve_http(
    harness: Harness,
    config: Arc<ServeConfig>,
    listener: tokio::net::TcpListener,
    token: Option<String>,
    bounds: crate::listen::Bounds,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let mut http =
        StreamableHttpServerConfig::default().with_max_request_body_bytes(MAX_REQUEST_BODY);
    if token.is_some() {
        // The token is the gate; the Host check (against DNS rebinding) is for loopback.
        http = http.disable_allowed_hosts();
    }
    let service = StreamableHttpService::new(
        move || Ok(KeelServer::new(harness.clone(), config.clone(), "http")),
        Arc::new(LocalSessionManager::default()),
        http,
    );
    let token: Option<Arc<str>> = token.map(Into::into);
    let router =
        axum::Router::new().nest_service("/mcp", service).layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let token = token.clone();
                async move {
                    if let Some(t) = &token {
                        let given = req
                            .headers()
                            .get(axum::http::header::AUTHORIZATION)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.strip_prefix("Bearer "));
                        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), t.as_bytes())) {
                            return axum::response::IntoResponse::into_response((
                                axum::http::StatusCode::UNAUTHORIZED,
                                [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
                                "a bearer token is required (KEEL_MCP_TOKEN or [mcp] token)",
                            ));
                        }
                    }
                    next.run(req).await
                }
            },
        ));
    crate::listen::serve(listener, router, bounds.fitted(), shutdown).await
}

/// The largest request body the HTTP endpoint reads.
pub const MAX_REQUEST_BODY: usize = 4 * 1024 * 1024;

/// Compares two byte strings in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
