//! The approval routes: the units a caller may see, and their decisions.

use super::*;

#[derive(Deserialize, IntoParams)]
pub struct ApprovalsQuery {
    /// Only this session's.
    pub session: Option<String>,
    /// Decided ones too (default: pending only).
    #[serde(default)]
    pub all: bool,
}

/// Approval units the caller may see: what exactly would run, and what it may touch.
#[utoipa::path(get, path = "/approvals", params(ApprovalsQuery), responses((status = 200, body = Object), (status = 404, body = ErrorBody)))]
pub(super) async fn list_approvals(
    State(app): Shared,
    caller: Caller,
    Query(q): Query<ApprovalsQuery>,
) -> Result<Json<Value>, Failure> {
    let units = visible_approvals(&app, &caller, q.session.as_deref(), !q.all).await?;
    Ok(Json(json!({"ok": true, "approvals": units})))
}

/// The approval units `caller` may see, each with whether the caller may decide it.
pub(crate) async fn visible_approvals(
    app: &App,
    caller: &Caller,
    session: Option<&str>,
    pending_only: bool,
) -> Result<Vec<Value>, Failure> {
    let views = app.harness.approvals(&caller.who(), session, pending_only).await?;
    let mut out = Vec::new();
    for view in views {
        let mut v = serde_json::to_value(&view.unit)
            .map_err(|e| Failure::new("internal", e.to_string()))?;
        v["may_decide"] = json!(view.may_decide);
        v["verdict"] = json!(view.unit.verdict());
        if let Some(c) = &view.change {
            v["change"] = json!(c);
            v["change"]["summary"] = json!(c.summary());
        }
        out.push(keel::api::shown::approval(&caller.who(), v));
    }
    Ok(out)
}

#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    /// Why (recorded; the model is told on a rejection).
    pub reason: Option<String>,
}

/// Approves a pending call and resumes its session's turn in the server. Exactly one decision
/// wins: a unit already decided answers 409 `not_pending`.
#[utoipa::path(post, path = "/approvals/{id}/approve", params(("id" = String, Path)), request_body(content = DecideBody, description = "optional"), responses((status = 200, body = Object), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(super) async fn approve(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
    req: Result<Json<DecideBody>, JsonRejection>,
) -> Result<Json<Value>, Failure> {
    decide(&app, &caller, &id, Decision::Approve, optional_body(req)?).await
}

/// Rejects a pending call (the model is told) and resumes its session's turn.
#[utoipa::path(post, path = "/approvals/{id}/reject", params(("id" = String, Path)), request_body(content = DecideBody, description = "optional"), responses((status = 200, body = Object), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(super) async fn reject(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
    req: Result<Json<DecideBody>, JsonRejection>,
) -> Result<Json<Value>, Failure> {
    decide(&app, &caller, &id, Decision::Reject, optional_body(req)?).await
}

/// A body that may be left out entirely.
fn optional_body<T: Default>(req: Result<Json<T>, JsonRejection>) -> Result<T, Failure> {
    match req {
        Err(JsonRejection::MissingJsonContentType(_)) => Ok(T::default()),
        other => body(other),
    }
}

/// Records `caller`'s decision on unit `id` if they may make it, then resumes the session.
pub(crate) async fn decide(
    app: &Arc<App>,
    caller: &Caller,
    id: &str,
    decision: Decision,
    req: DecideBody,
) -> Result<Json<Value>, Failure> {
    let reason = req.reason.filter(|r| !r.trim().is_empty());
    let unit = app.harness.decide(&caller.who(), id, decision, reason, None).await?;
    app.run_in_background(unit.session_id.to_string());
    Ok(Json(json!({"ok": true, "unit": unit})))
}
