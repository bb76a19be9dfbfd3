//! `keel serve`: the HTTP API (`/api/v1`, described by `/api/v1/openapi.json`) and the web
//! console (`/`), a front-end over the use cases of [`keel::api`] like the CLI and the MCP
//! server. It owns no session state: every fact it shows or changes goes through the
//! [`Harness`]; the only state of its own is the console's logins, in memory.
//!
//! Who may do what is decided here, per request, from the token the request carries (see
//! [`keel::protocol::access`]): a bearer token for the API, or the console's login cookie (which names
//! a token by its hash, so revoking the token ends its logins too).

pub mod api;
pub mod auth;
pub mod console;
pub mod files;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use keel::api::{ApiError, SessionSpec};
use keel::protocol::access::{AccessError, GrantRoots};
use keel::protocol::setup::Harness;

/// The default address of `keel serve`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7420";

/// Largest JSON request body.
pub const MAX_JSON_BODY: usize = 1024 * 1024;

/// The name under which `keel serve` stores the admin token it writes to the home.
pub const HOME_TOKEN_NAME: &str = "keel-serve";

/// The name of the admin principal of `KEEL_API_TOKEN`.
pub use keel::protocol::access::ENV_TOKEN_NAME;

/// What the server is started with.
pub struct ServeOptions {
    /// What a new session is made of unless the request says otherwise (model, task
    /// understanding, budget, loop guards, policy, system prompt).
    pub template: SessionSpec,
    /// Where admins may grant host directories.
    pub roots: GrantRoots,
    /// The SHA-256 of `KEEL_API_TOKEN`, an admin token of this process only.
    pub env_admin: Option<String>,
    /// Largest tool upload (the sandbox's component size limit).
    pub max_upload: usize,
    /// Timeouts and the connection cap (`[serve]` in keel.toml).
    pub bounds: crate::listen::Bounds,
    /// Why no session can be created (no model is configured): the server still serves the
    /// console, approvals, sessions and tools; creating a session answers this, with what to
    /// configure (`None`: the template's model is configured).
    pub no_model: Option<String>,
}

/// The server's state: the harness, its options and the console's logins.
pub struct App {
    pub harness: Arc<Harness>,
    pub options: ServeOptions,
    pub(crate) logins: Mutex<HashMap<String, auth::Login>>,
    pub(crate) templates: minijinja::Environment<'static>,
    /// The tokens' version as last seen (see [`App::watch_access`]): event streams re-check
    /// their caller when it moves (and when a login ends).
    pub(crate) access: tokio::sync::watch::Sender<i64>,
    /// Set when the server stops: open event streams end at once rather than hold the
    /// drain of their connections.
    pub(crate) stopping: tokio::sync::watch::Sender<bool>,
    /// The connections of every listener serving this app (the API's, the metrics').
    budget: crate::listen::Budget,
}

impl App {
    pub fn new(harness: Arc<Harness>, options: ServeOptions) -> Result<Arc<Self>, String> {
        Ok(Arc::new(Self {
            harness,
            logins: Mutex::new(HashMap::new()),
            templates: console::templates()?,
            access: tokio::sync::watch::Sender::new(0),
            stopping: tokio::sync::watch::Sender::new(false),
            budget: crate::listen::Budget::new(options.bounds),
            options,
        }))
    }

    /// The connection budget every listener serving this app shares: the API's and the
    /// metrics listener's connections count against one cap.
    pub fn budget(&self) -> crate::listen::Budget {
        self.budget.clone()
    }

    /// Runs session `id`'s queued inputs (or its open turn) in the background; a session
    /// another runner holds is left to it. The runner runs in the span current here (a
    /// request's: the turns it runs are part of the request's trace).
    pub fn run_in_background(self: &Arc<Self>, id: String) {
        self.harness.resume_in_background(&keel::api::Caller::Operator, &id);
    }
}

/// The server: the API under `/api/v1`, the console at `/`, the metrics at `/metrics` (an
/// admin token's).
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .nest("/api/v1", api::routes(Arc::clone(&app)))
        .merge(console::routes(Arc::clone(&app)))
        .merge(Router::new().route("/metrics", axum::routing::get(metrics)).with_state(app.clone()))
        .layer(axum::middleware::from_fn(security_headers))
        .layer(axum::middleware::from_fn_with_state(app, traced))
}

/// `GET /metrics`: the Prometheus text page, for an admin token.
async fn metrics(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
    caller: auth::Caller,
) -> Result<Response, Failure> {
    let page = app.harness.metrics(&caller.who()).await?;
    Ok(([(axum::http::header::CONTENT_TYPE, keel::protocol::setup::metrics::CONTENT_TYPE)], page)
        .into_response())
}

/// The metrics page alone, without a token: for a listener of its own (`--metrics-listen`),
/// which only the scraper should reach.
pub fn metrics_router(app: Arc<App>) -> Router {
    let page = move || {
        let app = Arc::clone(&app);
        async move {
            match app.harness.metrics(&keel::api::Caller::Operator).await {
                Ok(page) => (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        keel::protocol::setup::metrics::CONTENT_TYPE,
                    )],
                    page,
                )
                    .into_response(),
                Err(e) => Failure::from(e).into_response(),
            }
        }
    };
    Router::new().route("/metrics", axum::routing::get(page)).layer(axum::middleware::from_fn(
        |req: axum::extract::Request, next: axum::middleware::Next| async move {
            let host = req.headers().get(axum::http::header::HOST).and_then(|h| h.to_str().ok());
            let local = req
                .extensions()
                .get::<crate::listen::Seat>()
                .is_some_and(|s| s.local().ip().is_loopback());
            if local && !host.is_some_and(crate::listen::loopback_host) {
                return Failure::new(
                    "forbidden",
                    "the metrics listener on loopback answers only a loopback `Host`",
                )
                .into_response();
            }
            next.run(req).await
        },
    ))
}

/// Every request is an `http_request` span — its method, its route (the pattern, never the
/// ids in the path), its status — whose parent is the caller's trace when the request carries
/// a W3C `traceparent` header and proves who it is: a turn the request starts is part of that
/// trace. A request without a valid credential starts a trace of its own (its `traceparent`,
/// sampling flags included, is ignored). Counted in the HTTP metrics by status class.
async fn traced(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use tracing::Instrument;
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let mut parent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 128)
        .map(str::to_string);
    let req = match parent {
        Some(_) => {
            let (parts, body) = req.into_parts();
            if app.identify(&parts, true).await.is_err() {
                parent = None;
            }
            axum::extract::Request::from_parts(parts, body)
        }
        None => req,
    };
    let span = tracing::info_span!(
        "http_request",
        otel.name = %format_args!("{} {route}", req.method()),
        otel.kind = "server",
        otel.parent = parent.as_deref().unwrap_or(""),
        http.request.method = %req.method(),
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
    );
    let res = next.run(req).instrument(span.clone()).await;
    let status = res.status().as_u16();
    span.record("http.response.status_code", status);
    let class = match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    keel::protocol::setup::metrics::HTTP_REQUESTS.inc(&[class]);
    res
}

/// Headers every response carries: a strict Content-Security-Policy (scripts and styles only
/// from the server's own files, no inline code, no framing), no MIME sniffing, and no
/// referrer to other sites (`same-origin`: with `no-referrer` a browser sends `Origin: null`
/// on the console's own forms, which the origin check refuses).
async fn security_headers(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    for (name, value) in [
        (
            "content-security-policy",
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
        ("x-frame-options", "DENY"),
        ("cross-origin-opener-policy", "same-origin"),
    ] {
        h.insert(name, axum::http::HeaderValue::from_static(value));
    }
    res
}

/// A refused or failed request: the core API's error envelope with the HTTP status of its
/// kind.
#[derive(Debug)]
pub struct Failure {
    pub status: StatusCode,
    pub kind: String,
    pub message: String,
}

impl Failure {
    pub fn new(kind: &str, message: impl Into<String>) -> Self {
        Self { status: status_of(kind), kind: kind.to_string(), message: message.into() }
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Self::new(e.kind(), e.to_string())
    }
}

impl From<AccessError> for Failure {
    fn from(e: AccessError) -> Self {
        Self::new(e.kind(), e.to_string())
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "ok": false,
            "error": {"kind": self.kind, "message": self.message},
        });
        (self.status, axum::Json(body)).into_response()
    }
}

/// The HTTP status of an error kind of the core API.
pub fn status_of(kind: &str) -> StatusCode {
    match kind {
        "unauthorized" => StatusCode::UNAUTHORIZED,
        "forbidden" | "denied" | "policy_denied" => StatusCode::FORBIDDEN,
        "not_found" | "not_installed" | "unknown_tool" => StatusCode::NOT_FOUND,
        "conflict" | "not_pending" | "already_installed" | "exists" | "name_clash" | "busy"
        | "grant_moved" => StatusCode::CONFLICT,
        "too_large" => StatusCode::PAYLOAD_TOO_LARGE,
        "too_many_requests" => StatusCode::TOO_MANY_REQUESTS,
        "no_model" => StatusCode::SERVICE_UNAVAILABLE,
        "body_timeout" => StatusCode::REQUEST_TIMEOUT,
        "method_not_allowed" => StatusCode::METHOD_NOT_ALLOWED,
        "unsupported_media_type" => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "input" | "grant" | "config" | "wrong_session" | "invalid_input" | "invalid_name"
        | "reserved_name" | "invalid_skill" | "invalid_specs" | "load" | "describe_failed"
        | "builtin" | "mcp_server" | "host_tool" | "over_ceiling" => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Serves `app` on `listener` until `shutdown` completes; sessions that recovery found
/// resumable are resumed in the background first (the server is their runner now).
pub async fn serve(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    // What recovery found is resumed; on a shared store, a host that stopped is taken over.
    let operator = keel::api::Caller::Operator;
    app.harness.resume_recovered(&operator).map_err(|e| e.to_string())?;
    let running = app.harness.keep_sessions_running(&operator).map_err(|e| e.to_string())?;
    let watcher = app.watch_access();
    let budget = app.budget();
    let stopping = app.clone();
    let shutdown = async move {
        shutdown.await;
        stopping.stopping.send_replace(true);
    };
    let harness = app.harness.clone();
    let served = crate::listen::serve(listener, router(app), budget, shutdown).await;
    watcher.abort();
    drop(running);
    // A clean stop hands this host's sessions to the others now, not after the lease TTL.
    match harness.release_leases(&operator).await {
        Ok(0) => {}
        Ok(n) => tracing::info!("gave up {n} session leases for other hosts to take over"),
        Err(e) => tracing::warn!("giving up this host's session leases failed: {e}"),
    }
    served
}
