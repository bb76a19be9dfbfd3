//! The console's time-travel pages: a rewind's preview and its result, and the form that
//! forks a session at a step.

use super::*;

#[derive(Deserialize)]
pub(super) struct RewindQuery {
    to: i64,
}

/// A rewind's report as the page shows it: each diff as lines with a class.
fn rewind_view(report: &keel::api::RewindReport) -> Value {
    let mut v = json!(report);
    for p in v["paths"].as_array_mut().into_iter().flatten() {
        if let Some(diff) = p["diff"].as_str() {
            let lines: Vec<Value> =
                diff.lines().map(|l| json!({"text": l, "class": diff_class(l)})).collect();
            p["diff_lines"] = json!(lines);
        }
    }
    v
}

/// What a rewind to a step would do (a dry run: nothing is written), with the button that
/// does it.
pub(super) async fn rewind_page(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    Query(q): Query<RewindQuery>,
) -> Response {
    let r = async {
        let opts = keel::api::RewindOptions { dry_run: true, ..Default::default() };
        let report = app.harness.rewind(&v.who(), &id, q.to, opts).await?;
        Ok(page(&app, &v, "rewind.html", json!({"id": id, "r": rewind_view(&report)})))
    }
    .await;
    or_error(&app, r)
}

#[derive(Deserialize)]
pub(super) struct RewindForm {
    #[serde(default)]
    csrf: String,
    to: i64,
    #[serde(default)]
    force: String,
    #[serde(default)]
    conversation: String,
}

pub(super) async fn rewind(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(f): Form<RewindForm>,
) -> Response {
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        let force = keel::api::RewindForce::from_flags(f.force == "on", Vec::new());
        let opts = keel::api::RewindOptions {
            dry_run: false,
            force,
            conversation: f.conversation == "on",
        };
        let report = app.harness.rewind(&v.who(), &id, f.to, opts).await?;
        Ok(page(&app, &v, "rewind.html", json!({"id": id, "r": rewind_view(&report)})))
    }
    .await;
    or_error(&app, r)
}

#[derive(Deserialize)]
pub(super) struct ForkQuery {
    #[serde(default)]
    at: i64,
}

/// The form that forks a session at a step.
pub(super) async fn fork_page(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    Query(q): Query<ForkQuery>,
) -> Response {
    let r = async {
        let meta = app.harness.session(&v.who(), &id).await?;
        Ok(page(
            &app,
            &v,
            "fork.html",
            json!({
                "id": id,
                "at": q.at,
                "steps": meta.runtime.steps,
                "model": meta.config.model.summary(v.who().is_admin()),
                "grants": keel::api::shown::grants(&v.who(), &meta.config.grants),
            }),
        ))
    }
    .await;
    or_error(&app, r)
}

#[derive(Deserialize)]
pub(super) struct ForkForm {
    #[serde(default)]
    csrf: String,
    at: i64,
    #[serde(default)]
    model: String,
    #[serde(default)]
    read_only: String,
}

/// Forks the session and opens the fork's page.
pub(super) async fn fork(
    State(app): Shared,
    Viewer(v): Viewer,
    Path(id): Path<String>,
    headers: HeaderMap,
    Form(f): Form<ForkForm>,
) -> Response {
    let r = async {
        auth::check_form(&headers, &v, &f.csrf)?;
        let model = Some(f.model.trim().to_string()).filter(|m| !m.is_empty());
        let opts = keel::api::ForkOptions {
            model: keel::protocol::sessions::ModelChange { model, ..Default::default() },
            read_only: f.read_only == "on",
            ..Default::default()
        };
        let report = app.harness.fork(&v.who(), &id, f.at, opts).await?;
        Ok(back_to(&report.session_id))
    }
    .await;
    or_error(&app, r)
}
