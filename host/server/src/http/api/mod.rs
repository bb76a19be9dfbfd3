//! The JSON API under `/api/v1`. Each handler checks who may do what, then calls one use case
//! of the core API; errors are the core API's envelope, with the status of their kind.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, OpenApi, ToSchema};

use super::auth::Caller;
use super::{App, Failure, MAX_JSON_BODY};
use keel::protocol::sessions::Access;
use keel::protocol::sessions::Decision;
use keel::protocol::tools::InstallMode;

mod access;
mod approvals;
mod events;
mod tools;
mod travel;

use access::{add_token, list_tokens, revoke_token};
pub(crate) use approvals::{DecideBody, decide, visible_approvals};
use approvals::{approve, list_approvals, reject};
use events::{events, files};
use tools::{get_tool, list_tools, presets, remove_tool, too_large, upload_tool};
use travel::{fork, replay, rewind};

type Shared = State<Arc<App>>;

/// The API's routes (nested under `/api/v1`).
pub fn routes(app: Arc<App>) -> Router {
    let upload = app.options.max_upload;
    Router::new()
        .route("/openapi.json", get(openapi))
        .route("/whoami", get(whoami))
        .route("/sessions", get(list_sessions).post(create_session).delete(prune_sessions))
        .route("/sessions/{id}", get(get_session).delete(delete_session))
        .route("/sessions/{id}/title", post(set_title))
        .route("/sessions/{id}/timeline", get(timeline))
        .route("/sessions/{id}/input", post(send_input))
        .route("/sessions/{id}/interrupt", post(interrupt))
        .route("/sessions/{id}/evidence/{step}", get(evidence))
        .route("/sessions/{id}/events", get(events))
        .route("/sessions/{id}/files", get(files))
        .route("/sessions/{id}/workgroup", get(workgroup))
        .route("/sessions/{id}/policy", post(change_policy))
        .route("/sessions/{id}/model", post(change_model))
        .route("/sessions/{id}/rewind", post(rewind))
        .route("/sessions/{id}/replay", post(replay))
        .route("/sessions/{id}/fork", post(fork))
        .route("/approvals", get(list_approvals))
        .route("/approvals/{id}/approve", post(approve))
        .route("/approvals/{id}/reject", post(reject))
        .route("/presets", get(presets))
        .route("/tokens", get(list_tokens).post(add_token))
        .route("/tokens/{name}", axum::routing::delete(revoke_token))
        .route("/tools", get(list_tools))
        .route("/tools", post(upload_tool).layer(DefaultBodyLimit::max(upload.saturating_add(1))))
        .route("/tools/{name}", get(get_tool).delete(remove_tool))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
        .layer(axum::middleware::from_fn_with_state(upload, refuse_declared_oversize))
        .layer(axum::middleware::from_fn(envelope_errors))
        .with_state(app)
}

/// Puts every error the router or an extractor answers in plain text (a malformed query
/// string or path parameter, a method the route does not take, a body that does not read) in
/// the API's JSON envelope: a client parses one shape whatever went wrong.
async fn envelope_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let res = next.run(req).await;
    let status = res.status();
    let json = res
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || json {
        return res;
    }
    let allow = res.headers().get(header::ALLOW).cloned();
    let text = match axum::body::to_bytes(res.into_body(), 4096).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => String::new(),
    };
    let kind = match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => "input",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::REQUEST_TIMEOUT => "body_timeout",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        _ => "internal",
    };
    let message = match (text.is_empty(), status) {
        (false, _) => text,
        (true, StatusCode::METHOD_NOT_ALLOWED) => format!(
            "this endpoint does not take that method{}: see /api/v1/openapi.json",
            allow
                .as_ref()
                .and_then(|a| a.to_str().ok())
                .map(|a| format!(" (it takes {a})"))
                .unwrap_or_default()
        ),
        (true, s) => s.canonical_reason().unwrap_or("the request failed").to_string(),
    };
    let mut f = Failure::new(kind, message);
    f.status = status;
    let mut res = f.into_response();
    if let Some(a) = allow {
        res.headers_mut().insert(header::ALLOW, a);
    }
    res
}

/// The failure of a request body that could not be read: it took too long (408), or the
/// connection broke.
fn body_failure(e: &(dyn std::error::Error + 'static), fallback: String) -> Failure {
    if crate::listen::is_body_timeout(e) {
        Failure::new("body_timeout", e.to_string())
    } else {
        Failure::new("input", fallback)
    }
}

/// Refuses a request whose declared `Content-Length` is past its route's limit at once,
/// without reading the body (an upload of a component; JSON otherwise).
async fn refuse_declared_oversize(
    State(max_upload): State<usize>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let upload = req.method() == axum::http::Method::POST && req.uri().path().ends_with("/tools");
    let max = if upload { max_upload } else { MAX_JSON_BODY };
    match declared {
        Some(n) if n > max as u64 => too_large(max).into_response(),
        _ => next.run(req).await,
    }
}

async fn not_found() -> Failure {
    Failure::new("not_found", "no such API endpoint: see /api/v1/openapi.json")
}

/// A JSON body, refused with the envelope (413 past the size limit, 415 without the JSON
/// content type, 400 when it does not parse).
fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, Failure> {
    match body {
        Ok(Json(v)) => Ok(v),
        Err(e) if crate::listen::is_body_timeout(&e) => Err(body_failure(&e, String::new())),
        Err(e) => {
            let kind = match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => "too_large",
                StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
                _ => "input",
            };
            let mut f = Failure::new(kind, e.body_text());
            if kind == "too_large" {
                f.message = format!("the request body is larger than {MAX_JSON_BODY} bytes");
            }
            Err(f)
        }
    }
}

/// Refused and failed requests.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    /// Always `false`.
    pub ok: bool,
    pub error: ErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable: `input`, `grant`, `unauthorized`, `forbidden`, `not_found`, `conflict`,
    /// `not_pending`, `too_large`, …
    pub kind: String,
    pub message: String,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "keel",
        description = "keel's HTTP API: sessions, their timelines and events, approvals, tools. \
                       Every request needs `Authorization: Bearer TOKEN` (`keel token add`)."
    ),
    paths(
        whoami, list_sessions, create_session, get_session, timeline, send_input, interrupt,
        evidence, events::events, events::files, approvals::list_approvals, approvals::approve,
        approvals::reject, tools::presets, tools::list_tools, tools::upload_tool, tools::get_tool,
        tools::remove_tool, workgroup, change_policy, change_model, delete_session,
        prune_sessions, set_title, access::list_tokens, access::add_token,
        access::revoke_token, travel::rewind, travel::replay, travel::fork
    ),
    components(schemas(ErrorBody, ErrorDetail)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.servers = Some(vec![utoipa::openapi::Server::new("/api/v1")]);
    }
}

/// The OpenAPI document of this API, generated from the handlers.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

async fn openapi() -> Response {
    let doc = openapi_document();
    match doc.to_pretty_json() {
        Ok(text) => ([(header::CONTENT_TYPE, "application/json")], text).into_response(),
        Err(e) => Failure::new("internal", e.to_string()).into_response(),
    }
}

#[derive(Serialize, ToSchema)]
pub struct WhoAmI {
    pub name: String,
    /// `admin` or `user`.
    pub role: String,
}

/// Who the token belongs to.
#[utoipa::path(get, path = "/whoami", responses((status = 200, body = WhoAmI), (status = 401, body = ErrorBody)))]
async fn whoami(caller: Caller) -> Json<WhoAmI> {
    Json(WhoAmI { name: caller.principal.name, role: caller.principal.role.to_string() })
}

/// One grant as the API takes and shows it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantSpec {
    /// An absolute host directory, under one of the server's grant roots.
    pub host: String,
    /// Where the session's tools see it (default: `/` and the directory's name).
    pub guest: Option<String>,
    /// `ro` (default) or `rw`.
    #[schema(value_type = Option<String>)]
    pub access: Option<Access>,
}

/// Policy adjustments by tool name or effect class.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// Run without asking (admins only).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Ask a person first.
    #[serde(default)]
    pub ask: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

/// Per-call limits; a user may only lower the server's.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    pub fuel: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub memory: Option<u64>,
}

/// A new session and its first input.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// The first input: the task, in plain words.
    pub input: String,
    /// Chosen id (letters, digits, `-`, `_`), else a generated one.
    pub id: Option<String>,
    /// Host directories to grant (admins only, under the server's grant roots).
    pub grants: Option<Vec<GrantSpec>>,
    /// A grant preset an admin defined (`keel grant preset add`); instead of `grants`.
    pub preset: Option<String>,
    /// The tools the model sees (default: every installed tool).
    pub tools: Option<Vec<String>>,
    pub policy: Option<PolicySpec>,
    pub budget: Option<BudgetSpec>,
    /// A model name on the server's model endpoint (default: the server's model).
    pub model: Option<String>,
    /// The user the session works for (admins only; a user's sessions work for that user).
    pub user: Option<String>,
    /// Make it a main session: it delegates to sub-sessions of its workgroup, within these
    /// limits (a user may only keep or lower the defaults).
    pub main: Option<MainSpec>,
}

/// The limits of a main session's workgroup; each absent one takes its default.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MainSpec {
    /// Live children of one session, at most (default 8).
    pub max_children: Option<u32>,
    /// How deep delegation goes (default 2).
    pub max_depth: Option<u32>,
    /// Seconds one request of a child may take (default 1800).
    pub child_deadline_secs: Option<u64>,
    /// Seconds after which a parent is told a child still works (default 600; 0: never).
    pub wait_notice_secs: Option<u64>,
    /// Model steps of the whole workgroup, at most.
    pub max_steps: Option<i64>,
    /// Tokens of the whole workgroup, at most.
    pub max_tokens: Option<i64>,
}

impl From<MainSpec> for keel::api::WorkgroupRequest {
    fn from(m: MainSpec) -> Self {
        Self {
            max_children: m.max_children,
            max_depth: m.max_depth,
            child_deadline_secs: m.child_deadline_secs,
            wait_notice_secs: m.wait_notice_secs,
            max_steps: m.max_steps,
            max_tokens: m.max_tokens,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct Accepted {
    pub session_id: String,
    /// The session's state when the input was committed; its turn runs in the server.
    pub state: String,
    /// The input's sequence number in the session's inbox.
    pub inbox_seq: i64,
}

/// Creates a session and queues its first input; the turn runs in the server.
#[utoipa::path(post, path = "/sessions", request_body = CreateSession, responses(
    (status = 202, description = "created; its turn runs in the server", body = Accepted),
    (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
    (status = 403, description = "a grant outside the grant roots, or a user asking for what only admins may", body = ErrorBody),
    (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
async fn create_session(
    State(app): Shared,
    caller: Caller,
    req: Result<Json<CreateSession>, JsonRejection>,
) -> Result<(StatusCode, Json<Accepted>), Failure> {
    let req = body(req)?;
    if req.input.trim().is_empty() {
        return Err(Failure::new("input", "the input is empty: say what to do"));
    }
    let request = keel::api::SessionRequest {
        id: req.id,
        grants: req
            .grants
            .unwrap_or_default()
            .into_iter()
            .map(|g| keel::api::GrantRequest { host: g.host, guest: g.guest, access: g.access })
            .collect(),
        preset: req.preset,
        tools: req.tools,
        policy: req.policy.map(|p| keel::api::PolicyRequest {
            allow: p.allow,
            ask: p.ask,
            deny: p.deny,
        }),
        budget: req.budget.map(|b| keel::api::BudgetRequest {
            fuel: b.fuel,
            timeout_ms: b.timeout_ms,
            memory: b.memory,
        }),
        model: req.model,
        user: req.user,
        main: req.main.map(Into::into),
    };
    let id = create_for(&app, &caller, request).await?;
    let seq = app.harness.queue(&caller.who(), &id, &req.input).await?;
    let state = app.harness.session(&caller.who(), &id).await?.runtime.state.to_string();
    app.run_in_background(id.to_string());
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted { session_id: id.into_string(), state, inbox_seq: seq }),
    ))
}

/// Creates the session a request asks for, from the server's template, checked against what
/// the caller may do (by the core); the caller owns it.
pub(crate) async fn create_for(
    app: &App,
    caller: &Caller,
    request: keel::api::SessionRequest,
) -> Result<keel::protocol::ids::SessionId, Failure> {
    let o = &app.options;
    if let Some(why) = &o.no_model {
        return Err(Failure::new("no_model", why.clone()));
    }
    Ok(app.harness.create_session_for(&caller.who(), &o.template, &o.roots, request).await?)
}

/// Which sessions a listing shows; every filter is optional.
#[derive(Deserialize, IntoParams, Default)]
#[serde(deny_unknown_fields)]
pub struct SessionsQuery {
    /// Only sessions in these states, comma-separated (`idle`, `running`,
    /// `waiting_approval`, `failed`, `interrupted` …).
    pub state: Option<String>,
    /// Only sessions active within this long: a whole number and `s`, `m`, `h`, `d` or `w`
    /// (`2h`, `7d`).
    pub since: Option<String>,
    /// Only sessions whose title, goal or messages hold this text (case aside).
    pub search: Option<String>,
    /// Only sessions that work for this user.
    pub user: Option<String>,
    /// At most this many, the most recently active first.
    pub limit: Option<usize>,
}

/// The states a comma-separated list names, or the input error naming the one that is not a
/// state.
fn states_of(text: Option<&str>) -> Result<Vec<keel::protocol::sessions::RuntimeState>, Failure> {
    text.unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse().map_err(|_| {
                Failure::new(
                    "input",
                    format!(
                        "`{}` is not a session state: idle, preparing_context, running, \
                         waiting_approval, compressing, interrupted or failed",
                        s.escape_debug()
                    ),
                )
            })
        })
        .collect()
}

/// An age (`30d`) as the time that long ago, in ms since the Unix epoch.
fn ago_ms(what: &str, text: &str) -> Result<i64, Failure> {
    let age = keel::protocol::text::parse_age(text)
        .map_err(|e| Failure::new("input", format!("{what}: {e}")))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Ok(now.saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX)))
}

impl SessionsQuery {
    /// The core's filter this query asks for.
    pub(crate) fn filter(&self) -> Result<keel::api::SessionFilter, Failure> {
        Ok(keel::api::SessionFilter {
            states: states_of(self.state.as_deref())?,
            active_since_ms: self.since.as_deref().map(|t| ago_ms("since", t)).transpose()?,
            inactive_since_ms: None,
            user: self.user.clone().filter(|u| !u.trim().is_empty()),
            search: self.search.clone().filter(|t| !t.trim().is_empty()),
            limit: self.limit,
        })
    }
}

/// The sessions the caller may see, the most recently active first, filtered by state,
/// activity, text (title, goal and messages, through the full-text index) and user.
#[utoipa::path(get, path = "/sessions", params(SessionsQuery), responses((status = 200, description = "sessions: id, title, state, turns, steps, session_goal, created_at, last_activity, owner", body = Object), (status = 400, body = ErrorBody)))]
async fn list_sessions(
    State(app): Shared,
    caller: Caller,
    Query(q): Query<SessionsQuery>,
) -> Result<Json<Value>, Failure> {
    let sessions = app.harness.find_sessions(&caller.who(), &q.filter()?).await?;
    Ok(Json(json!({"ok": true, "sessions": sessions})))
}

/// Deletes a session and every fact of it in one transaction (admins only). Refused while a
/// turn runs (409) and for a session of a workgroup, whose results another session holds.
#[utoipa::path(delete, path = "/sessions/{id}", params(("id" = String, Path)), responses((status = 200, body = Object), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn delete_session(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Failure> {
    app.harness.delete_session(&caller.who(), &id).await?;
    Ok(Json(json!({"ok": true, "deleted": id})))
}

/// Which sessions a prune deletes.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct PruneQuery {
    /// Sessions not active for this long (`30d`, `12h`); required.
    pub older_than: String,
    /// In these states, comma-separated (default: `idle,failed,interrupted`).
    pub state: Option<String>,
    /// Only say which would be deleted.
    #[serde(default)]
    pub dry_run: bool,
}

/// Deletes the sessions not active for `older_than` in the given states, each in its own
/// transaction (admins only); `dry_run=true` only lists them. A session that started running
/// meanwhile, or belongs to a workgroup, is kept and listed with why.
#[utoipa::path(delete, path = "/sessions", params(PruneQuery), responses((status = 200, description = "dry_run, deleted (sessions), kept (id, reason)", body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
async fn prune_sessions(
    State(app): Shared,
    caller: Caller,
    Query(q): Query<PruneQuery>,
) -> Result<Json<Value>, Failure> {
    let before = ago_ms("older_than", &q.older_than)?;
    let states = states_of(q.state.as_deref())?;
    let pruned = app.harness.prune_sessions(&caller.who(), before, states, q.dry_run).await?;
    Ok(Json(json!({"ok": true, "pruned": pruned})))
}

/// A session's title: shown in lists instead of its goal; `null` or empty takes it away.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TitleBody {
    pub title: Option<String>,
}

/// Gives a session a title (whoever may see the session may).
#[utoipa::path(post, path = "/sessions/{id}/title", params(("id" = String, Path)), request_body = TitleBody, responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn set_title(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
    req: Result<Json<TitleBody>, JsonRejection>,
) -> Result<Json<Value>, Failure> {
    let title = body(req)?.title.filter(|t| !t.trim().is_empty());
    app.harness.set_session_title(&caller.who(), &id, title.clone()).await?;
    Ok(Json(json!({"ok": true, "session_id": id, "title": title})))
}

/// A session: its settings, goals, plan, loaded capabilities and state.
#[utoipa::path(get, path = "/sessions/{id}", params(("id" = String, Path)), responses((status = 200, body = Object), (status = 404, body = ErrorBody)))]
async fn get_session(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Failure> {
    let meta = app.harness.session(&caller.who(), &id).await?;
    let capabilities = app.harness.capabilities(&caller.who(), &id).await?;
    let session = keel::api::shown::session(&caller.who(), &meta);
    Ok(Json(json!({"ok": true, "session": session, "capabilities": capabilities})))
}

/// The workgroup the session belongs to: its main session, limits, use, and every session
/// with its state, goal, delegation status and pending approvals.
#[utoipa::path(get, path = "/sessions/{id}/workgroup", params(("id" = String, Path)), responses((status = 200, body = Object), (status = 400, description = "a standalone session", body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn workgroup(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Failure> {
    let Some(main) = app.harness.workgroup_of(&caller.who(), &id).await? else {
        return Err(Failure::new(
            "input",
            format!("session `{}` is not part of a workgroup", id.escape_debug()),
        ));
    };
    let w = app.harness.workgroup(&caller.who(), &main).await?;
    let events = app.harness.workgroup_events(&caller.who(), &main).await?;
    Ok(Json(json!({"ok": true, "workgroup": w, "events": events})))
}

/// Everything the session did: turns, messages, tool calls, model calls, approvals.
#[utoipa::path(get, path = "/sessions/{id}/timeline", params(("id" = String, Path)), responses((status = 200, body = Object), (status = 404, body = ErrorBody)))]
async fn timeline(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Failure> {
    let t = app.harness.timeline(&caller.who(), &id).await?;
    Ok(Json(json!({"ok": true, "timeline": keel::api::shown::timeline(&caller.who(), &t)})))
}

/// One change of a session's policy: `rule` is `allow` (with `under`, a guest path prefix,
/// for calls under it only), `ask` or `deny`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyBody {
    pub rule: String,
    pub tool: String,
    pub under: Option<String>,
}

/// Changes a session's policy for the rest of the session — allow a tool for good
/// (everywhere, or under a path prefix), ask before it again, deny it — recorded as a
/// `policy_changed` event. A caller who may decide the session's approvals may tighten; only
/// an admin widens (`allow`).
#[utoipa::path(post, path = "/sessions/{id}/policy", params(("id" = String, Path)), request_body = PolicyBody, responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn change_policy(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
    req: Result<Json<PolicyBody>, JsonRejection>,
) -> Result<Json<Value>, Failure> {
    use keel::protocol::sessions::PolicyChange;
    let req = body(req)?;
    let change = match (req.rule.as_str(), req.under) {
        ("allow", under) => PolicyChange::Allow { tool: req.tool, under },
        ("ask", None) => PolicyChange::Ask { tool: req.tool },
        ("deny", None) => PolicyChange::Deny { tool: req.tool },
        (rule, _) => {
            return Err(Failure::new(
                "input",
                format!(
                    "`{}` is not a policy change: rule is allow (with under for a prefix), ask or deny",
                    rule.escape_debug()
                ),
            ));
        }
    };
    let policy = app.harness.change_policy(&caller.who(), &id, change).await?;
    Ok(Json(json!({"ok": true, "session_id": id, "policy": policy.summary()})))
}

/// A session's next model: another server (admins), model or context window.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelBody {
    pub model_url: Option<String>,
    pub model: Option<String>,
    pub context_window: Option<u64>,
}

/// Moves a session to another model server (admins only: the host's model credentials go
/// where it points), model or context window; a `model_changed` event records it. Refused
/// while a turn runs.
#[utoipa::path(post, path = "/sessions/{id}/model", params(("id" = String, Path)), request_body = ModelBody, responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn change_model(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
    req: Result<Json<ModelBody>, JsonRejection>,
) -> Result<Json<Value>, Failure> {
    let req = body(req)?;
    let change = keel::protocol::sessions::ModelChange {
        base_url: req.model_url,
        model: req.model,
        context_window: req.context_window,
    };
    let (from, to) = app.harness.set_session_model(&caller.who(), &id, change).await?;
    Ok(Json(json!({"ok": true, "session_id": id, "from": from, "to": to})))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputBody {
    pub text: String,
}

/// Sends input to a session; its turn runs in the server (or the input waits for the one
/// running).
#[utoipa::path(post, path = "/sessions/{id}/input", params(("id" = String, Path)), request_body = InputBody, responses((status = 202, body = Accepted), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
async fn send_input(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
    req: Result<Json<InputBody>, JsonRejection>,
) -> Result<(StatusCode, Json<Accepted>), Failure> {
    let req = body(req)?;
    let accepted = queue_and_run(&app, &caller.who(), &id, &req.text).await?;
    Ok((StatusCode::ACCEPTED, Json(accepted)))
}

pub(crate) async fn queue_and_run(
    app: &Arc<App>,
    who: &keel::api::Caller,
    id: &str,
    text: &str,
) -> Result<Accepted, Failure> {
    let seq = app.harness.queue(who, id, text).await?;
    let state = app.harness.session(who, id).await?.runtime.state.to_string();
    app.run_in_background(id.to_string());
    Ok(Accepted { session_id: id.to_string(), state, inbox_seq: seq })
}

/// Interrupts a session: a running turn stops at its next check, a waiting one is closed.
#[utoipa::path(post, path = "/sessions/{id}/interrupt", params(("id" = String, Path)), responses((status = 200, body = Object), (status = 404, body = ErrorBody)))]
async fn interrupt(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Failure> {
    let before = app.harness.interrupt(&caller.who(), &id).await?;
    Ok(Json(json!({"ok": true, "session_id": id, "state_before": before.to_string()})))
}

/// The exact request body of a step's model call, checked against its recorded digest.
#[utoipa::path(get, path = "/sessions/{id}/evidence/{step}", params(("id" = String, Path), ("step" = i64, Path)), responses((status = 200, description = "the request body, byte for byte", content_type = "application/json"), (status = 404, body = ErrorBody)))]
async fn evidence(
    State(app): Shared,
    caller: Caller,
    Path((id, step)): Path<(String, i64)>,
) -> Result<Response, Failure> {
    let (_, bytes) = app.harness.evidence(&caller.who(), &id, Some(step)).await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], bytes).into_response())
}
