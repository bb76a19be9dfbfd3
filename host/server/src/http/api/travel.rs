//! The time-travel routes: rewinding what a session's calls changed (and its conversation),
//! replaying its recorded reads, forking it at a step.

use super::*;

/// A rewind: the step to go back to, and what to do about paths changed since the session's
/// last call.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindBody {
    /// Files as they were after this step's calls (0: before the session's first call).
    pub to: i64,
    /// Only say what would change (with a diff of each file); write nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Put back every path changed since the session's last call too.
    #[serde(default)]
    pub force: bool,
    /// Put back these paths although they changed since.
    #[serde(default)]
    pub force_paths: Vec<String>,
    /// Take the conversation back too, once every file is back: the messages after the step
    /// leave the model's context, and the next turn continues from the step.
    #[serde(default)]
    pub conversation: bool,
}

impl RewindBody {
    pub(crate) fn options(self) -> keel::api::RewindOptions {
        let force = keel::api::RewindForce::from_flags(self.force, self.force_paths);
        keel::api::RewindOptions { dry_run: self.dry_run, force, conversation: self.conversation }
    }
}

/// Puts back what the session's calls after step `to` changed inside its grants, each file as
/// it was; a path changed since the session's last call is a conflict, left alone unless
/// forced. `rewind.paths` says what happened to each (`done`, `would`, `already`, `conflict`,
/// `not_restorable`, `refused`, `failed`), `rewind.not_undone` the calls whose effects are
/// outside the grants. With `conversation`, `rewind.conversation` says what became of the
/// conversation (`done`, `would`, `nothing`, `not_done` with why). Whoever may decide the session's approvals may rewind it; refused
/// (409) while a turn runs.
#[utoipa::path(post, path = "/sessions/{id}/rewind", params(("id" = String, Path)), request_body = RewindBody, responses((status = 200, description = "ok (false when paths were left), rewind", body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(super) async fn rewind(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
    req: Result<Json<RewindBody>, JsonRejection>,
) -> Result<Json<Value>, Failure> {
    let req = body(req)?;
    let to = req.to;
    let report = app.harness.rewind(&caller.who(), &id, to, req.options()).await?;
    let left = report.left().count();
    let mut v = json!(report);
    if !caller.is_admin() {
        let meta = app.harness.session(&caller.who(), &id).await?;
        keel::api::shown::Hidden::of_session(&caller.who(), &meta).value(&mut v);
    }
    Ok(Json(json!({"ok": left == 0, "rewind": v})))
}

/// A replay: the calls after which step to run again.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayBody {
    /// Run again the calls after this step (default 0: every call).
    #[serde(default)]
    pub at: i64,
}

/// Runs again the session's recorded read-only, idempotent calls after step `at`, with the
/// tools installed now, against a scratch copy of its grants, and says for each whether its
/// output is the recorded one (`same`, `changed` with a diff and both component digests, or
/// `skipped` with why). Nothing of the session changes. Whoever may decide the session's
/// approvals may.
#[utoipa::path(post, path = "/sessions/{id}/replay", params(("id" = String, Path)), request_body = ReplayBody, responses((status = 200, description = "ok (false when an output changed), replay", body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(super) async fn replay(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
    req: Result<Json<ReplayBody>, JsonRejection>,
) -> Result<Json<Value>, Failure> {
    let at = body(req)?.at;
    let report = app.harness.replay(&caller.who(), &id, at).await?;
    let changed = report.changed();
    let mut v = json!(report);
    if !caller.is_admin() {
        let meta = app.harness.session(&caller.who(), &id).await?;
        keel::api::shown::Hidden::of_session(&caller.who(), &meta).value(&mut v);
    }
    Ok(Json(json!({"ok": changed == 0, "replay": v})))
}

/// A fork: the step, and what the fork changes of the original's settings.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    /// The fork's history is the session's up to the results of this step (0: before its
    /// first request).
    pub at: i64,
    /// The fork's id (default: a new one).
    #[serde(default)]
    pub id: Option<String>,
    /// Another model server's base URL (admins only).
    #[serde(default)]
    pub model_url: Option<String>,
    /// Another model.
    #[serde(default)]
    pub model: Option<String>,
    /// Another context window, in tokens.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// Every grant read-only.
    #[serde(default)]
    pub read_only: bool,
    /// Grants the fork does not get, by guest path.
    #[serde(default)]
    pub drop_grants: Vec<String>,
}

impl ForkBody {
    pub(crate) fn options(self) -> keel::api::ForkOptions {
        keel::api::ForkOptions {
            id: self.id,
            model: keel::protocol::sessions::ModelChange {
                base_url: self.model_url,
                model: self.model,
                context_window: self.context_window,
            },
            read_only: self.read_only,
            drop_grants: self.drop_grants,
        }
    }
}

/// Makes a new session whose history is this one's up to step `at`: the same settings,
/// grants (narrowed by `read_only` and `drop_grants`), goals and plan, its origin recorded.
/// The original is untouched; the files its grants reach are shared. Whoever may see the
/// session may fork it; another model server needs an admin. A session of a workgroup is
/// refused (409).
#[utoipa::path(post, path = "/sessions/{id}/fork", params(("id" = String, Path)), request_body = ForkBody, responses((status = 200, description = "ok, fork: the new session", body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(super) async fn fork(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
    req: Result<Json<ForkBody>, JsonRejection>,
) -> Result<Json<Value>, Failure> {
    let req = body(req)?;
    let at = req.at;
    let report = app.harness.fork(&caller.who(), &id, at, req.options()).await?;
    let mut v = json!(report);
    if !caller.is_admin() {
        let meta = app.harness.session(&caller.who(), &report.session_id).await?;
        keel::api::shown::Hidden::of_session(&caller.who(), &meta).value(&mut v);
    }
    Ok(Json(json!({"ok": true, "fork": v})))
}
