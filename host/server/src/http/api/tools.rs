//! The catalog routes: grant presets, tools, and uploads of components (streamed to a file,
//! refused past the size cap as soon as it is passed).

use super::*;

/// The grant presets users may name (`keel grant preset add`).
#[utoipa::path(get, path = "/presets", responses((status = 200, body = Object)))]
pub(super) async fn presets(State(app): Shared, caller: Caller) -> Result<Json<Value>, Failure> {
    let presets = app.harness.presets(&caller.who()).await?;
    let shown: Vec<Value> = presets
        .into_iter()
        .map(|p| {
            if caller.is_admin() {
                json!(p)
            } else {
                // A user sees what a preset lets a session touch, not where it is on the host.
                json!({
                    "name": p.name,
                    "user_decides": p.user_decides,
                    "grants": keel::api::shown::grants(&caller.who(), &p.grants),
                })
            }
        })
        .collect();
    Ok(Json(json!({"ok": true, "presets": shown})))
}

/// The installed tools.
#[utoipa::path(get, path = "/tools", responses((status = 200, body = Object)))]
pub(super) async fn list_tools(State(app): Shared, caller: Caller) -> Result<Json<Value>, Failure> {
    Ok(Json(json!({"ok": true, "tools": app.harness.tools(&caller.who())?})))
}

/// A component (or the one providing a tool), with its tools: digest, effect, schemas.
#[utoipa::path(get, path = "/tools/{name}", params(("name" = String, Path)), responses((status = 200, body = Object), (status = 404, body = ErrorBody)))]
pub(super) async fn get_tool(
    State(app): Shared,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, Failure> {
    let (component, tools) = app.harness.tool(&caller.who(), &name)?;
    let component = keel::api::shown::component(&caller.who(), &component);
    Ok(Json(json!({"ok": true, "component": component, "tools": tools})))
}

#[derive(Deserialize, IntoParams)]
pub struct UploadQuery {
    /// The component's name.
    pub name: String,
    /// Replace an installed component of that name.
    #[serde(default)]
    pub upgrade: bool,
    /// With `upgrade`: accept a version that widens what the component can do (a higher
    /// effect class, a new authority-bearing import, a new tool); without it such an upgrade
    /// is refused (409, `wider`), naming each change.
    #[serde(default)]
    pub accept_wider: bool,
}

/// Installs a component (admins only): the body is the `.wasm` file. It is validated,
/// compiled and pinned by its SHA-256 like `keel tool install`.
#[utoipa::path(post, path = "/tools", params(UploadQuery), request_body(content = Vec<u8>, content_type = "application/wasm"), responses((status = 201, body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub(super) async fn upload_tool(
    State(app): Shared,
    caller: Caller,
    Query(q): Query<UploadQuery>,
    upload: axum::body::Body,
) -> Result<(StatusCode, Json<Value>), Failure> {
    // Who may upload is settled before a byte of the body is read.
    caller.require_admin("installing a tool")?;
    let bytes = spool(upload, app.options.max_upload).await?;
    let mode = InstallMode::of(q.upgrade, q.accept_wider);
    let source = format!("uploaded by {}", caller.principal.decider());
    let report = app.harness.install_tool(&caller.who(), &bytes, &q.name, &source, mode).await?;
    Ok((StatusCode::CREATED, Json(json!({"ok": true, "installed": report}))))
}

/// Reads an upload through an unlinked temporary file, refusing it as soon as it passes
/// `max` bytes; returns its bytes once it arrived whole. What a slow or aborted upload holds
/// meanwhile is the file, not memory.
pub(super) async fn spool(body: axum::body::Body, max: usize) -> Result<Vec<u8>, Failure> {
    use futures_util::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
    let io = |e: std::io::Error| Failure::new("io", format!("cannot keep the upload: {e}"));
    let mut file = tokio::fs::File::from_std(tempfile::tempfile().map_err(io)?);
    let mut stream = body.into_data_stream();
    let mut size = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            let text = format!("the upload did not arrive whole: {e}");
            body_failure(&e, text)
        })?;
        size += chunk.len();
        if size > max {
            return Err(too_large(max));
        }
        file.write_all(&chunk).await.map_err(io)?;
    }
    file.rewind().await.map_err(io)?;
    let mut bytes = Vec::with_capacity(size);
    file.read_to_end(&mut bytes).await.map_err(io)?;
    Ok(bytes)
}

pub(super) fn too_large(max: usize) -> Failure {
    Failure::new("too_large", format!("the request body is larger than {max} bytes"))
}

/// Removes a component (admins only). Sessions that pinned it keep their record of it.
#[utoipa::path(delete, path = "/tools/{name}", params(("name" = String, Path)), responses((status = 200, body = Object), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(super) async fn remove_tool(
    State(app): Shared,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, Failure> {
    let (component, tools) = app.harness.remove_tool(&caller.who(), &name)?;
    Ok(Json(json!({"ok": true, "removed": component, "tools": tools})))
}
