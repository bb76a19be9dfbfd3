//! Who a request comes from: the bearer token it carries (the API), or the console's login
//! cookie. Checked on every request against the stored tokens, so a revoked token stops at
//! once, whichever way it was presented.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};

use super::{App, Failure};
use keel::protocol::access::{AccessError, Principal};

/// The console's login cookie.
pub const LOGIN_COOKIE: &str = "keel_login";

/// How long a console login lasts.
pub const LOGIN_TTL: Duration = Duration::from_secs(12 * 3600);

/// A console login: the token it was made with (by hash), its CSRF token and when it ends.
#[derive(Debug, Clone)]
pub struct Login {
    pub token_hash: String,
    pub csrf: String,
    pub until: Instant,
}

/// How a request proved who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    Bearer,
    /// The console's cookie, with the login's CSRF token.
    Cookie {
        login: String,
        csrf: String,
    },
}

/// The principal of a request and how it proved it.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: Principal,
    pub via: Via,
    /// The SHA-256 of the token the request carried (directly, or through its login).
    pub token_hash: String,
}

impl Caller {
    pub fn is_admin(&self) -> bool {
        self.principal.is_admin()
    }

    /// Who asks, as the core's use cases take it (they decide what it may see and do).
    pub fn who(&self) -> keel::api::Caller {
        keel::api::Caller::Api(self.principal.clone())
    }

    /// Refuses a caller who is not an admin, naming what was asked — the core's rule, asked
    /// early where a handler must decide before it reads a request's body.
    pub fn require_admin(&self, what: &str) -> Result<(), Failure> {
        Ok(self.who().require_admin(what)?)
    }

    /// The login's CSRF token (empty for a bearer caller).
    pub fn csrf(&self) -> &str {
        match &self.via {
            Via::Cookie { csrf, .. } => csrf,
            Via::Bearer => "",
        }
    }
}

/// Compares two secrets in time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The bearer token of a request, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The value of cookie `name`, if the request carries it.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// A new random secret (a login id or a CSRF token).
pub fn secret() -> Result<String, Failure> {
    keel::protocol::access::new_token().map_err(Failure::from)
}

impl App {
    /// The principal whose token hashes to `hash`: `KEEL_API_TOKEN`'s admin, or a stored token.
    pub async fn principal_of_hash(&self, hash: &str) -> Result<Principal, Failure> {
        if let Some(env) = &self.options.env_admin
            && same_secret(env, hash)
        {
            return Ok(Principal::env_admin());
        }
        Ok(self.harness.authenticate_hash(hash).await?)
    }

    /// The login of cookie value `id`, if it exists and has not ended.
    pub(crate) fn login(&self, id: &str) -> Option<Login> {
        let mut logins = self.logins.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        logins.retain(|_, l| l.until > now);
        logins.get(id).cloned()
    }

    /// Starts a console login for the token that hashes to `token_hash`; returns the cookie
    /// value.
    pub(crate) fn start_login(&self, token_hash: String) -> Result<String, Failure> {
        let id = secret()?;
        let login = Login { token_hash, csrf: secret()?, until: Instant::now() + LOGIN_TTL };
        self.logins.lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone(), login);
        Ok(id)
    }

    /// Ends a console login; the event streams it opened end with it (each re-checks its
    /// caller now).
    pub(crate) fn end_login(&self, id: &str) {
        self.logins.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        self.access.send_modify(|_| {});
    }

    /// Who made a request. Bearer tokens work for every request; the login cookie only for
    /// reading the API (`GET`) and for the console, whose forms carry the CSRF token.
    ///
    /// The request's seat in the listener's budget is claimed for the principal found: its
    /// body gets the full deadline, and a user past their share of connections is refused
    /// (429) here.
    pub async fn caller(&self, parts: &Parts, cookie_allowed: bool) -> Result<Caller, Failure> {
        let seat = parts.extensions.get::<crate::listen::Seat>();
        let checking = seat.map(crate::listen::Seat::verifying);
        let caller = self.identify(parts, cookie_allowed).await?;
        if let Some(seat) = seat {
            seat.claim(&caller.principal.id(), caller.is_admin())
                .map_err(|e| Failure::new("too_many_requests", e.to_string()))?;
        }
        drop(checking);
        Ok(caller)
    }

    /// Who made a request, without claiming its seat.
    pub(crate) async fn identify(
        &self,
        parts: &Parts,
        cookie_allowed: bool,
    ) -> Result<Caller, Failure> {
        if let Some(token) = bearer(&parts.headers) {
            let token_hash = keel::protocol::access::token_hash(token);
            let principal = self.principal_of_hash(&token_hash).await?;
            return Ok(Caller { principal, via: Via::Bearer, token_hash });
        }
        if let Some(id) = cookie(&parts.headers, LOGIN_COOKIE) {
            if !cookie_allowed {
                return Err(AccessError::Unauthorized(
                    "changing state through the API needs `Authorization: Bearer TOKEN` \
                     (the console's login works through the console's own forms)"
                        .into(),
                )
                .into());
            }
            if let Some(login) = self.login(id) {
                let principal = self.principal_of_hash(&login.token_hash).await?;
                return Ok(Caller {
                    principal,
                    via: Via::Cookie { login: id.to_string(), csrf: login.csrf },
                    token_hash: login.token_hash,
                });
            }
        }
        Err(AccessError::Unauthorized(
            "no token: send `Authorization: Bearer TOKEN` (see `keel token add`)".into(),
        )
        .into())
    }
}

/// How often a running server looks for tokens changed by any process (`keel token revoke`).
pub const ACCESS_POLL: Duration = Duration::from_millis(200);

impl App {
    /// Whether `caller` still stands: its token not revoked, its console login not ended.
    pub async fn still_valid(&self, caller: &Caller) -> bool {
        if let Via::Cookie { login, .. } = &caller.via
            && self.login(login).is_none()
        {
            return false;
        }
        self.principal_of_hash(&caller.token_hash).await.is_ok()
    }

    /// Watches the tokens' version (one indexed read every [`ACCESS_POLL`]); when it moves,
    /// ends the console logins of tokens that no longer exist and tells every open event
    /// stream to check its caller again. Returns the watching task.
    pub(crate) fn watch_access(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let app = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut seen = None;
            loop {
                let Some(app) = app.upgrade() else { return };
                if let Ok(v) = app.harness.access_version().await
                    && seen != Some(v)
                {
                    if seen.is_some() {
                        app.end_revoked_logins().await;
                    }
                    seen = Some(v);
                    app.access.send_replace(v);
                }
                drop(app);
                tokio::time::sleep(ACCESS_POLL).await;
            }
        })
    }

    /// Ends every console login whose token was revoked.
    async fn end_revoked_logins(&self) {
        let logins: Vec<(String, String)> = {
            let logins = self.logins.lock().unwrap_or_else(|p| p.into_inner());
            logins.iter().map(|(id, l)| (id.clone(), l.token_hash.clone())).collect()
        };
        for (id, hash) in logins {
            if let Err(f) = self.principal_of_hash(&hash).await
                && f.kind == "unauthorized"
            {
                self.end_login(&id);
            }
        }
    }
}

/// The API's caller: a bearer token, or the console's cookie for `GET` requests.
impl FromRequestParts<Arc<App>> for Caller {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, Failure> {
        let safe = parts.method == Method::GET || parts.method == Method::HEAD;
        app.caller(parts, safe).await
    }
}

/// Checks a state-changing console request: it comes from the console's own origin (the
/// `Origin` header names the host the request was sent to) and carries the login's CSRF token.
pub fn check_form(headers: &HeaderMap, caller: &Caller, csrf: &str) -> Result<(), Failure> {
    check_origin(headers)?;
    if !same_secret(caller.csrf(), csrf) || csrf.is_empty() {
        return Err(AccessError::Forbidden(
            "the form's CSRF token does not match this login: reload the page".into(),
        )
        .into());
    }
    Ok(())
}

/// Refuses a state-changing request whose `Origin` is missing or is not the server itself.
pub fn check_origin(headers: &HeaderMap) -> Result<(), Failure> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let origin = headers.get(header::ORIGIN).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let same = !host.is_empty()
        && (origin == format!("http://{host}") || origin == format!("https://{host}"));
    if same {
        Ok(())
    } else {
        Err(AccessError::Forbidden(format!(
            "cross-origin request refused: Origin `{}` is not this server ({})",
            origin.escape_debug(),
            host.escape_debug()
        ))
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_and_bearer_tokens_are_read_exactly() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, "a=1; keel_login=xyz; b=2".parse().unwrap());
        h.insert(header::AUTHORIZATION, "Bearer  keel_abc ".parse().unwrap());
        assert_eq!(cookie(&h, LOGIN_COOKIE), Some("xyz"));
        assert_eq!(cookie(&h, "keel"), None);
        assert_eq!(bearer(&h), Some("keel_abc"));
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        assert!(same_secret("abc", "abc") && !same_secret("abc", "abd") && !same_secret("a", "ab"));
    }

    #[test]
    fn only_the_servers_own_origin_may_change_state() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "127.0.0.1:7420".parse().unwrap());
        assert!(check_origin(&h).is_err(), "no Origin");
        h.insert(header::ORIGIN, "http://evil.example".parse().unwrap());
        assert_eq!(check_origin(&h).unwrap_err().status, 403);
        h.insert(header::ORIGIN, "null".parse().unwrap());
        assert!(check_origin(&h).is_err());
        h.insert(header::ORIGIN, "http://127.0.0.1:7420".parse().unwrap());
        check_origin(&h).unwrap();
    }
}
