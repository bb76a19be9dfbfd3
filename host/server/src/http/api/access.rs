//! The access routes: API tokens, for admins. A token's secret is answered once, when it is
//! made; only its hash is kept.

use super::*;

/// Every token: names, roles and when each was made (never a secret). Admins only.
#[utoipa::path(get, path = "/tokens", responses((status = 200, body = Object), (status = 403, body = ErrorBody)))]
pub(super) async fn list_tokens(
    State(app): Shared,
    caller: Caller,
) -> Result<Json<Value>, Failure> {
    let tokens = app.harness.tokens(&caller.who()).await?;
    Ok(Json(json!({"ok": true, "tokens": tokens})))
}

/// A token to make.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    /// Its name: who or what uses it.
    pub name: String,
    /// `user` (the default) or `admin`.
    pub role: Option<String>,
}

/// Makes a token and answers its secret, the only time it is shown. Admins only.
#[utoipa::path(post, path = "/tokens", request_body = TokenBody, responses((status = 200, description = "name, role, token (the secret)", body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(super) async fn add_token(
    State(app): Shared,
    caller: Caller,
    req: Result<Json<TokenBody>, JsonRejection>,
) -> Result<Json<Value>, Failure> {
    let req = body(req)?;
    let role: keel::protocol::access::Role = req.role.as_deref().unwrap_or("user").parse()?;
    let token = app.harness.token_add(&caller.who(), req.name.trim(), role).await?;
    Ok(Json(json!({"ok": true, "name": req.name.trim(), "role": role, "token": token})))
}

/// Revokes a token: every request carrying it is refused from now on, its console logins end
/// and its open event streams close. Admins only.
#[utoipa::path(delete, path = "/tokens/{name}", params(("name" = String, Path)), responses((status = 200, body = Object), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(super) async fn revoke_token(
    State(app): Shared,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, Failure> {
    let revoked = app.harness.token_revoke(&caller.who(), &name).await?;
    Ok(Json(json!({"ok": true, "revoked": revoked})))
}
