//! The web console: server-rendered pages (minijinja templates, every value escaped) and one
//! small script that keeps them live over the events stream. Login is by pasting a token;
//! the console then holds an HttpOnly, SameSite=Strict cookie. Every state-changing form
//! checks the request's origin and the login's CSRF token.

use std::sync::Arc;

use axum::extract::{Form, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use minijinja::Environment;
use serde::Deserialize;
use serde_json::{Value, json};

use super::api::{self, DecideBody};
use super::auth::{self, Caller, LOGIN_COOKIE};
use super::{App, Failure};
use keel::protocol::sessions::Decision;

mod travel;

type Shared = State<Arc<App>>;

const TEMPLATES: &[(&str, &str)] = &[
    ("base.html", include_str!("templates/base.html")),
    ("login.html", include_str!("templates/login.html")),
    ("sessions.html", include_str!("templates/sessions.html")),
    ("session_rows.html", include_str!("templates/session_rows.html")),
    ("session.html", include_str!("templates/session.html")),
    ("timeline.html", include_str!("templates/timeline.html")),
    ("approvals.html", include_str!("templates/approvals.html")),
    ("approval_list.html", include_str!("templates/approval_list.html")),
    ("change.html", include_str!("templates/change.html")),
    ("decide.html", include_str!("templates/decide.html")),
    ("tools.html", include_str!("templates/tools.html")),
    ("tool.html", include_str!("templates/tool.html")),
    ("files.html", include_str!("templates/files.html")),
    ("tokens.html", include_str!("templates/tokens.html")),
    ("rewind.html", include_str!("templates/rewind.html")),
    ("fork.html", include_str!("templates/fork.html")),
    ("error.html", include_str!("templates/error.html")),
];

const SCRIPT: &str = include_str!("static/console.js");
const STYLE: &str = include_str!("static/console.css");

/// The console's templates, with HTML escaping of every value.
pub fn templates() -> Result<Environment<'static>, String> {
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::Html);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
    env.add_filter("when", |ms: i64| when(ms));
    for (name, text) in TEMPLATES {
        env.add_template(name, text).map_err(|e| format!("console template {name}: {e}"))?;
    }
    Ok(env)
}

/// `ms` since the Unix epoch as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn when(ms: i64) -> String {
    let full = keel::protocol::text::format_time(ms);
    full.get(..19).map_or(full.clone(), |t| t.replacen('T', " ", 1))
}

pub fn routes(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(sessions_page))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/static/console.js", get(script))
        .route("/static/console.css", get(style))
        .route("/sessions/new", post(new_session))
        .route("/sessions/rows", get(session_rows))
        .route("/sessions/{id}", get(session_page))
        .route("/sessions/{id}/fragment", get(timeline_fragment))
        .route("/sessions/{id}/files", get(files_page))
        .route("/sessions/{id}/input", post(send_input))
        .route("/sessions/{id}/interrupt", post(interrupt))
        .route("/sessions/{id}/delete", post(delete_session))
        .route("/sessions/{id}/title", post(set_title))
        .route("/sessions/{id}/policy", post(change_policy))
        .route("/sessions/{id}/model", post(change_model))
        .route("/sessions/{id}/rewind", get(travel::rewind_page).post(travel::rewind))
        .route("/sessions/{id}/fork", get(travel::fork_page).post(travel::fork))
        .route("/tokens", get(tokens_page).post(add_token))
        .route("/tokens/{name}/revoke", post(revoke_token))
        .route("/approvals", get(approvals_page))
        .route("/approvals/list", get(approval_list))
        .route("/approvals/{id}/decide", post(decide))
        .route("/tools", get(tools_page))
        .route("/tools/{name}", get(tool_page))
        .with_state(app)
}

async fn script() -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], SCRIPT).into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// A console page's caller: the login cookie (or a bearer token); without one, the login page.
pub struct Viewer(Caller);

impl FromRequestParts<Arc<App>> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Response> {
        match app.caller(parts, true).await {
            Ok(c) => Ok(Viewer(c)),
            Err(f) if f.status == StatusCode::UNAUTHORIZED => {
                Err(Redirect::to("/login").into_response())
            }
            Err(f) => Err(page_error(app, &f)),
        }
    }
}

fn render(app: &App, name: &str, ctx: Value) -> Response {
    match app.templates.get_template(name).and_then(|t| t.render(&ctx)) {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!("console template {name}: {e:#}");
            (StatusCode::INTERNAL_SERVER_ERROR, "the page could not be rendered").into_response()
        }
    }
}

fn page_error(app: &App, f: &Failure) -> Response {
    let mut res = render(app, "error.html", json!({"kind": f.kind, "message": f.message}));
    *res.status_mut() = f.status;
    res
}

fn page(app: &App, viewer: &Caller, name: &str, mut ctx: Value) -> Response {
    ctx["me"] = json!({"name": viewer.principal.name, "role": viewer.principal.role.as_str(), "admin": viewer.is_admin()});
    ctx["csrf"] = json!(viewer.csrf());
    render(app, name, ctx)
}

fn or_error(app: &App, r: Result<Response, Failure>) -> Response {
    r.unwrap_or_else(|f| page_error(app, &f))
}

async fn login_page(State(app): Shared) -> Response {
    render(&app, "login.html", json!({}))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(app): Shared, headers: HeaderMap, Form(f): Form<LoginForm>) -> Response {
    if let Err(e) = auth::check_origin(&headers) {
        return page_error(&app, &e);
    }
    let hash = keel::protocol::access::token_hash(&f.token);
    if let Err(e) = app.principal_of_hash(&hash).await {
        let mut res = render(&app, "login.html", json!({"error": e.message}));
        *res.status_mut() = StatusCode::UNAUTHORIZED;
        return res;
    }
    let id = match app.start_login(hash) {
        Ok(id) => id,
        Err(e) => return page_error(&app, &e),
    };
    let secure = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    let cookie = format!(
        "{LOGIN_COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
        auth::LOGIN_TTL.as_secs(),
        if secure { "; Secure" } else { "" }
    );
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(
    State(app): Shared,
    Viewer(v): Viewer,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Response {
    if let Err(e) = auth::check_form(&headers, &v, &f.csrf) {
        return page_error(&app, &e);
    }
    if let auth::Via::Cookie { login, .. } = &v.via {
        app.end_login(login);
    }
    let cookie = format!("{LOGIN_COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/login")).into_response()
}

/// The states the sessions page filters by.
const LISTED_STATES: &[&str] =
    &["idle", "running", "waiting_approval", "compressing", "interrupted", "failed"];

async fn sessions_ctx(app: &App, v: &Caller, q: &api::SessionsQuery) -> Result<Value, Failure> {
    let sessions = app.harness.find_sessions(&v.who(), &q.filter()?).await?;
    let presets: Vec<String> =
        app.harness.presets(&v.who()).await?.into_iter().map(|p| p.name).collect();
    let roots: Vec<String> = match v.is_admin() {
        true => app.options.roots.roots().iter().map(|r| r.display().to_string()).collect(),
        false => Vec::new(),
    };
    Ok(json!({
        "sessions": sessions,
        "presets": presets,
        "filter": {"search": q.search, "state": q.state},
        "states": LISTED_STATES,
        "roots": roots,
    }))
}

async fn sessions_page(
    State(app): Shared,
    Viewer(v): Viewer,
    Query(q): Query<api::SessionsQuery>,
) -> Response {
    let r = sessions_ctx(&app, &v, &q).await.map(|ctx| page(&app, &v, "sessions.html", ctx));
    or_error(&app, r)
}

async fn session_rows(
    State(app): Shared,
    Viewer(v): Viewer,
    Query(q): Query<api::SessionsQuery>,
) -> Response {
    let r = sessions_ctx(&app, &v, &q).await.map(|ctx| page(&app, &v, "session_rows.html", ctx));
    or_error(&app, r)
}

#[derive(Deserialize)]
struct NewSessionForm {
    #[serde(default)]
    csrf: String,
    input: String,
    #[serde(default)]
    preset: String,
    /// Host directories (admins), one per line: `HOST_DIR[=GUEST][:ro|:rw]`.
    #[serde(default)]
    grants: String,
    /// Tools or effect classes, comma-separated.
    #[serde(default)]
    allow: String,
    #[serde(default)]
    ask: String,
    #[serde(default)]
    deny: String,
}

/// The words of a comma- or space-separated list.
fn words(text: &str) -> Vec<String> {
    text.split([',', ' ', '\n'])
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect()
}

async fn new_session(
    State(app): Shared,
    Viewer(v): Viewer,
    headers: HeaderMap,
    Form(f): Form<NewSessionForm>,
) -> Response {
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        if f.input.trim().is_empty() {
            return Err(Failure::new("input", "the input is empty: say what to do"));
        }
        let grants = f
            .grants
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(keel::api::GrantRequest::parse)
            .collect::<Result<Vec<_>, _>>()?;
        let policy = keel::api::PolicyRequest {
            allow: words(&f.allow),
            ask: words(&f.ask),
            deny: words(&f.deny),
        };
        let policy =
            (!(policy.allow.is_empty() && policy.ask.is_empty() && policy.deny.is_empty()))
                .then_some(policy);
        let preset = Some(f.preset).filter(|p| !p.is_empty());
        let request = keel::api::SessionRequest { preset, grants, policy, ..Default::default() };
        let id = api::create_for(&app, &v, request).await?;
        api::queue_and_run(&app, &v.who(), &id, &f.input).await?;
        Ok(Redirect::to(&format!("/sessions/{id}")).into_response())
    }
    .await;
    or_error(&app, r)
}

/// The session's page after a change made by one of its forms (a session id is letters,
/// digits, `-` and `_`).
fn back_to(id: &str) -> Response {
    Redirect::to(&format!("/sessions/{id}")).into_response()
}

async fn delete_session(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Response {
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        app.harness.delete_session(&v.who(), &id).await?;
        Ok(Redirect::to("/").into_response())
    }
    .await;
    or_error(&app, r)
}

#[derive(Deserialize)]
struct TitleForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    title: String,
}

async fn set_title(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(f): Form<TitleForm>,
) -> Response {
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        let title = Some(f.title.trim().to_string()).filter(|t| !t.is_empty());
        app.harness.set_session_title(&v.who(), &id, title).await?;
        Ok(back_to(&id))
    }
    .await;
    or_error(&app, r)
}

#[derive(Deserialize)]
struct PolicyForm {
    #[serde(default)]
    csrf: String,
    rule: String,
    tool: String,
    #[serde(default)]
    under: String,
}

async fn change_policy(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(f): Form<PolicyForm>,
) -> Response {
    use keel::protocol::sessions::PolicyChange;
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        let under = Some(f.under.trim().to_string()).filter(|u| !u.is_empty());
        let change = match (f.rule.as_str(), under) {
            ("allow", under) => PolicyChange::Allow { tool: f.tool, under },
            ("ask", None) => PolicyChange::Ask { tool: f.tool },
            ("deny", None) => PolicyChange::Deny { tool: f.tool },
            ("ask" | "deny", Some(_)) => {
                return Err(Failure::new("input", "a path prefix goes with allow only"));
            }
            _ => return Err(Failure::new("input", "the rule is allow, ask or deny")),
        };
        app.harness.change_policy(&v.who(), &id, change).await?;
        Ok(back_to(&id))
    }
    .await;
    or_error(&app, r)
}

#[derive(Deserialize)]
struct ModelForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    model_url: String,
    #[serde(default)]
    model: String,
    #[serde(default)]
    context_window: String,
}

async fn change_model(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(f): Form<ModelForm>,
) -> Response {
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        let given = |s: String| Some(s.trim().to_string()).filter(|s| !s.is_empty());
        let context_window = given(f.context_window)
            .map(|w| {
                w.parse::<u64>().map_err(|_| {
                    Failure::new("input", "the context window is a number of tokens, e.g. 8192")
                })
            })
            .transpose()?;
        let change = keel::protocol::sessions::ModelChange {
            base_url: given(f.model_url),
            model: given(f.model),
            context_window,
        };
        app.harness.set_session_model(&v.who(), &id, change).await?;
        Ok(back_to(&id))
    }
    .await;
    or_error(&app, r)
}

/// The class a page gives a line of a unified diff: `add`, `del`, `hunk` or `ctx`.
pub(super) fn diff_class(line: &str) -> &'static str {
    match line.chars().next() {
        Some('+') if !line.starts_with("+++") => "add",
        Some('-') if !line.starts_with("---") => "del",
        Some('@') => "hunk",
        _ => "ctx",
    }
}

/// The tokens page: every token, a form to make one and, once, the secret of the one just
/// made.
async fn tokens_ctx(app: &App, v: &Caller, made: Option<Value>) -> Result<Value, Failure> {
    let tokens = app.harness.tokens(&v.who()).await?;
    let tokens: Vec<Value> = tokens
        .into_iter()
        .map(|t| json!({"name": t.name, "role": t.role, "created_at": t.created_at}))
        .collect();
    Ok(json!({"tokens": tokens, "made": made}))
}

async fn tokens_page(State(app): Shared, Viewer(v): Viewer) -> Response {
    let r = tokens_ctx(&app, &v, None).await.map(|ctx| page(&app, &v, "tokens.html", ctx));
    or_error(&app, r)
}

#[derive(Deserialize)]
struct TokenForm {
    #[serde(default)]
    csrf: String,
    name: String,
    #[serde(default)]
    role: String,
}

async fn add_token(
    State(app): Shared,
    Viewer(v): Viewer,
    headers: HeaderMap,
    Form(f): Form<TokenForm>,
) -> Response {
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        let role: keel::protocol::access::Role =
            if f.role.is_empty() { "user" } else { f.role.as_str() }.parse()?;
        let name = f.name.trim().to_string();
        let token = app.harness.token_add(&v.who(), &name, role).await?;
        let made = json!({"name": name, "role": role, "token": token});
        let mut res =
            tokens_ctx(&app, &v, Some(made)).await.map(|c| page(&app, &v, "tokens.html", c))?;
        // The secret is on this page only: no cache keeps it.
        res.headers_mut()
            .insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-store"));
        Ok(res)
    }
    .await;
    or_error(&app, r)
}

async fn revoke_token(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(name): Path<String>,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Response {
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        app.harness.token_revoke(&v.who(), &name).await?;
        Ok(Redirect::to("/tokens").into_response())
    }
    .await;
    or_error(&app, r)
}

/// Lines of a tool's output past which it starts collapsed.
const LONG_OUTPUT_LINES: usize = 20;
/// Bytes of a tool's output past which it starts collapsed.
const LONG_OUTPUT_BYTES: usize = 2000;

/// The timeline of a session as the console shows it: its messages and, inline, each tool
/// call with its input, output, duration, changes and approval.
async fn timeline_ctx(app: &App, v: &Caller, id: &str) -> Result<Value, Failure> {
    let meta = app.harness.session(&v.who(), id).await?;
    let t = app.harness.timeline(&v.who(), id).await?;
    let t = keel::api::shown::timeline(&v.who(), &t);
    let approvals = api::visible_approvals(app, v, Some(id), false).await?;
    let calls: Vec<Value> = t["tool_calls"].as_array().cloned().unwrap_or_default();
    let evidence: Vec<i64> = t["model_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["step"].as_i64())
        .collect();
    let mut items = Vec::new();
    let mut shown = std::collections::HashSet::new();
    let call_view = |c: &Value| -> Value {
        let approval = c["approval_id"]
            .as_str()
            .and_then(|a| approvals.iter().find(|u| u["id"] == a))
            .cloned()
            .or_else(|| {
                approvals
                    .iter()
                    .find(|u| u["call_id"] == c["call_id"] && u["status"] == "pending")
                    .cloned()
            });
        let result = c["result"].as_str().map(pretty_text);
        let result_lines = result.as_deref().map_or(0, |r| r.lines().count());
        let result_bytes = result.as_deref().map_or(0, str::len);
        json!({
            "kind": "call",
            "step": c["step"],
            "tool": c["tool"],
            "input": pretty(&c["input"]),
            // A long output starts collapsed, with its size on the summary line.
            "result_long": result_lines > LONG_OUTPUT_LINES || result_bytes > LONG_OUTPUT_BYTES,
            "result_lines": result_lines,
            "result_bytes": result_bytes,
            "result": result,
            "status": c["status"],
            "error_kind": c["error_kind"],
            "duration_ms": c["duration_ms"],
            "changes": c["changes"].as_str().map(pretty_text),
            "logs": c["logs"].as_str().map(logs_text),
            "approval": approval,
        })
    };
    for m in t["messages"].as_array().into_iter().flatten() {
        let role = m["role"].as_str().unwrap_or_default();
        if role == "tool" {
            continue;
        }
        let text = m["text"].as_str().unwrap_or_default();
        if !text.is_empty() || role != "assistant" {
            items.push(json!({"kind": "message", "role": role, "turn": m["turn"], "text": text}));
        }
        for tc in m["calls"].as_array().into_iter().flatten() {
            if let Some(c) = calls.iter().find(|c| c["call_id"] == tc["id"]) {
                shown.insert(c["call_id"].as_str().unwrap_or_default().to_string());
                items.push(call_view(c));
            }
        }
    }
    // Calls with no message of their own (a waiting call, a direct call).
    for c in &calls {
        if !shown.contains(c["call_id"].as_str().unwrap_or_default()) {
            items.push(call_view(c));
        }
    }
    let last_event = app.harness.last_event(&v.who(), id).await?;
    // What waits for a decision goes first, with its buttons and the change it would make.
    let pending: Vec<Value> =
        approvals.iter().filter(|u| u["status"] == "pending").cloned().map(approval_view).collect();
    Ok(json!({
        "id": id,
        "title": t["title"],
        "unfinished_rewind": t["unfinished_rewind"],
        "forked_from": t["forked_from"],
        "conversation_rewinds": t["conversation_rewinds"],
        "changes": t["settings_changes"],
        "may_decide": v.who().may_decide(meta.config.owner.as_ref()),
        "pending": pending,
        "state": t["state"],
        "state_detail": t["state_detail"],
        "session_goal": t["session_goal"],
        "phase_goal": t["phase_goal"],
        "plan": t["plan"],
        "items": items,
        "evidence": evidence,
        "pending_inputs": t["pending_inputs"],
        "grants": keel::api::shown::grants(&v.who(), &meta.config.grants),
        "net": meta.config.net.lines(),
        "loaded_tools": meta.capabilities.loaded_tools,
        // What the session runs under (a user is not shown the model server's address).
        "settings": {
            "model": meta.config.model.summary(v.who().is_admin()),
            "policy": meta.config.policy.summary(),
            "budget": meta.config.budget.summary(),
        },
        "user": meta.config.user(),
        "owner": meta.config.owner,
        "last_event": last_event,
        "live": !matches!(meta.runtime.state, keel::protocol::sessions::RuntimeState::Idle | keel::protocol::sessions::RuntimeState::Failed),
    }))
}

/// What a call's tool wrote to its log, stderr and stdout (the journal's JSON), as lines.
fn logs_text(kept: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(kept) else { return kept.to_string() };
    let mut out = String::new();
    for r in v["logs"].as_array().into_iter().flatten() {
        let (level, message) = (r["level"].as_str(), r["message"].as_str());
        out.push_str(&format!("log [{}] {}\n", level.unwrap_or("?"), message.unwrap_or("")));
    }
    for stream in ["stderr", "stdout"] {
        for line in v[stream].as_str().unwrap_or("").lines() {
            out.push_str(&format!("{stream} │ {line}\n"));
        }
    }
    if let Some(cut) = v.get("cut") {
        out.push_str(&format!("({} more bytes were not kept)\n", cut["bytes"]));
    }
    out
}

/// A JSON text pretty-printed (as it was, if it is not JSON).
fn pretty_text(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_string())
}

fn pretty(v: &Value) -> String {
    match v {
        Value::String(s) => pretty_text(s),
        other => serde_json::to_string_pretty(other).unwrap_or_default(),
    }
}

async fn session_page(State(app): Shared, Viewer(v): Viewer, Path(id): Path<String>) -> Response {
    let r = timeline_ctx(&app, &v, &id).await.map(|ctx| page(&app, &v, "session.html", ctx));
    or_error(&app, r)
}

async fn timeline_fragment(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
) -> Response {
    let r = timeline_ctx(&app, &v, &id).await.map(|ctx| page(&app, &v, "timeline.html", ctx));
    or_error(&app, r)
}

#[derive(Deserialize)]
struct FilesQuery {
    grant: Option<String>,
    path: Option<String>,
}

async fn files_page(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    Query(q): Query<FilesQuery>,
) -> Response {
    let r = async {
        let meta = app.harness.session(&v.who(), &id).await?;
        let listing = match q.grant {
            Some(grant) => {
                let path = q.path.unwrap_or_default();
                Some(super::files::listing(&v.who(), &meta, grant, path).await?)
            }
            None => None,
        };
        let parent = listing
            .as_ref()
            .filter(|l| !l.path.is_empty())
            .map(|l| l.path.rsplit_once('/').map(|(p, _)| p.to_string()).unwrap_or_default());
        Ok(page(
            &app,
            &v,
            "files.html",
            json!({"id": id, "grants": keel::api::shown::grants(&v.who(), &meta.config.grants), "listing": listing, "parent": parent}),
        ))
    }
    .await;
    or_error(&app, r)
}

#[derive(Deserialize)]
struct InputForm {
    #[serde(default)]
    csrf: String,
    text: String,
}

async fn send_input(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(f): Form<InputForm>,
) -> Response {
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        api::queue_and_run(&app, &v.who(), &id, &f.text).await?;
        Ok(Redirect::to(&format!("/sessions/{id}")).into_response())
    }
    .await;
    or_error(&app, r)
}

async fn interrupt(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Response {
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        app.harness.interrupt(&v.who(), &id).await?;
        Ok(Redirect::to(&format!("/sessions/{id}")).into_response())
    }
    .await;
    or_error(&app, r)
}

/// Diff lines a page shows before the rest is cut with a count.
const DIFF_LINES: usize = 80;
/// Content lines of a new file a page shows before the rest is cut with a count.
const CONTENT_LINES: usize = 40;

/// An approval unit as a page shows it: the exact input pretty-printed and, for a file write,
/// the diff (or a new file's content) as lines with a class each (`add`, `del`, `hunk`).
fn approval_view(mut u: Value) -> Value {
    u["input_pretty"] = json!(pretty(&u["input"]));
    // Where "always allow" would allow the tool: the directory of the path the call names.
    let input = match &u["input"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    u["under"] = json!(keel::protocol::sessions::call_directory(&input));
    let diff = u["change"]["diff"].as_str().unwrap_or_default().to_string();
    let content = u["change"]["content"].as_str().unwrap_or_default().to_string();
    if u["change"].is_object() {
        let (text, max, what) = if diff.is_empty() {
            (content.as_str(), CONTENT_LINES, "of the content")
        } else {
            (diff.as_str(), DIFF_LINES, "of the diff")
        };
        let (shown, omitted) = keel::api::cut_lines(text, max);
        let lines: Vec<Value> = shown
            .iter()
            .map(|l| {
                let class = if diff.is_empty() { "text" } else { diff_class(l) };
                json!({"text": l, "class": class})
            })
            .collect();
        u["change_lines"] = json!(lines);
        u["change_omitted"] = json!(omitted);
        u["change_what"] = json!(what);
    }
    u
}

async fn approvals_ctx(app: &App, v: &Caller) -> Result<Value, Failure> {
    let units = api::visible_approvals(app, v, None, true).await?;
    let units: Vec<Value> = units.into_iter().map(approval_view).collect();
    Ok(json!({"approvals": units}))
}

async fn approvals_page(State(app): Shared, Viewer(v): Viewer) -> Response {
    let r = approvals_ctx(&app, &v).await.map(|ctx| page(&app, &v, "approvals.html", ctx));
    or_error(&app, r)
}

async fn approval_list(State(app): Shared, Viewer(v): Viewer) -> Response {
    let r = approvals_ctx(&app, &v).await.map(|ctx| page(&app, &v, "approval_list.html", ctx));
    or_error(&app, r)
}

#[derive(Deserialize)]
struct DecideForm {
    #[serde(default)]
    csrf: String,
    decision: String,
    #[serde(default)]
    reason: String,
    /// Where to go afterwards: the session page or the queue.
    #[serde(default)]
    back: String,
}

async fn decide(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(f): Form<DecideForm>,
) -> Response {
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        let decision = match f.decision.as_str() {
            "approve" => Decision::Approve,
            "reject" => Decision::Reject,
            // Approve, and allow the tool for the rest of the session under the call's
            // directory (everywhere for a call naming no path): a policy change first, so that
            // a refused change decides nothing.
            "always" => {
                let unit = app.harness.approval(&v.who(), &id).await?;
                let under = keel::protocol::sessions::call_directory(&unit.input);
                let change =
                    keel::protocol::sessions::PolicyChange::Allow { tool: unit.tool, under };
                app.harness.change_policy(&v.who(), unit.session_id.as_str(), change).await?;
                Decision::Approve
            }
            _ => return Err(Failure::new("input", "the decision is approve, always or reject")),
        };
        let reason = Some(f.reason).filter(|r| !r.trim().is_empty());
        let Json(done) = api::decide(&app, &v, &id, decision, DecideBody { reason }).await?;
        let session = done["unit"]["session_id"].as_str().unwrap_or_default().to_string();
        let to =
            if f.back == "session" { format!("/sessions/{session}") } else { "/approvals".into() };
        Ok(Redirect::to(&to).into_response())
    }
    .await;
    or_error(&app, r)
}

async fn tools_page(State(app): Shared, Viewer(v): Viewer) -> Response {
    let r = app
        .harness
        .tools(&v.who())
        .map_err(Failure::from)
        .map(|tools| page(&app, &v, "tools.html", json!({ "tools": tools })));
    or_error(&app, r)
}

async fn tool_page(State(app): Shared, Viewer(v): Viewer, Path(name): Path<String>) -> Response {
    let r = app.harness.tool(&v.who(), &name).map_err(Failure::from).map(|(component, tools)| {
        let tools: Vec<Value> = tools
            .into_iter()
            .map(|t| {
                let mut j = serde_json::to_value(&t).unwrap_or_default();
                j["input_schema_pretty"] = json!(pretty(&j["input_schema"]));
                j["output_schema_pretty"] = json!(pretty(&j["output_schema"]));
                j
            })
            .collect();
        let component = keel::api::shown::component(&v.who(), &component);
        page(&app, &v, "tool.html", json!({"component": component, "tools": tools}))
    });
    or_error(&app, r)
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_read_as_utc() {
        assert_eq!(super::when(0), "1970-01-01 00:00:00");
        assert_eq!(super::when(1_764_633_600_000), "2025-12-02 00:00:00");
        assert_eq!(super::when(951_782_400_000 + 3_723_000), "2000-02-29 01:02:03");
    }

    #[test]
    fn the_templates_compile() {
        super::templates().unwrap();
    }
}
