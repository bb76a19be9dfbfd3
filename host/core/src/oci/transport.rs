//! The HTTP side of one registry operation: where a request may go, what credentials go with
//! it, and how much of an answer is read, for how long.
//!
//! The rules, each enforced here and nowhere else:
//! - **Credentials stay home.** The registry's credentials (and a token got with them) go only
//!   to the registry's own scheme, host and port. A redirect, an upload `Location` or a
//!   `Bearer realm` elsewhere is spoken to without them.
//! - **Never a downgrade.** From HTTPS, only HTTPS; plain HTTP only from a loopback registry
//!   to a loopback address. Redirects are followed by hand (at most [`MAX_REDIRECTS`]), each
//!   hop checked, so no library follows one for us.
//! - **Every answer is read through a cap**: refused on its `Content-Length` first, then cut
//!   at the cap while it streams.
//! - **Every operation is bounded in time**: an overall deadline, and a minimum rate over a
//!   window, both settings ([`Limits`]); the error names the one that ran out.

use std::time::{Duration, Instant};

use reqwest::header::{self, HeaderValue};
use reqwest::{Method, Response, StatusCode, Url};

use super::{Credentials, OciError};

/// Redirects followed for one request, at most.
pub const MAX_REDIRECTS: usize = 5;
/// Bytes of an error answer read, at most (the rest is not read).
pub const MAX_ERROR_BYTES: u64 = 64 * 1024;
/// Bytes of a token answer read, at most.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// Time bounds of one registry operation (a pull, a push, a resolve): `[registry]` in
/// `keel.toml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The whole operation, from its first request to its last byte
    /// (`pull_timeout_secs`, default 600).
    pub timeout: Duration,
    /// The slowest transfer accepted, in bytes per second over each [`Self::rate_window`]
    /// (`min_rate_bytes_per_sec`, default 1024).
    pub min_rate: u64,
    /// The window the rate is measured over; also the longest wait for an answer's headers
    /// (`rate_window_secs`, default 30).
    pub rate_window: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(600),
            min_rate: 1024,
            rate_window: Duration::from_secs(30),
        }
    }
}

/// Whether `host` (a URL's host, brackets removed) is a loopback address or `localhost`.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The scheme, host and port of `url`: what a credential is bound to.
fn origin(url: &Url) -> (String, String, Option<u16>) {
    (
        url.scheme().to_string(),
        url.host_str().unwrap_or_default().to_ascii_lowercase(),
        url.port_or_known_default(),
    )
}

/// The client of one registry operation.
pub(super) struct Transport {
    http: reqwest::Client,
    /// `SCHEME://REGISTRY/`.
    home: Url,
    /// The registry as the reference names it (for messages).
    pub registry: String,
    credentials: Option<Credentials>,
    /// The `Authorization` header the registry accepted last (Basic, or a Bearer token).
    auth: std::sync::Mutex<Option<HeaderValue>>,
    limits: Limits,
    deadline: Instant,
    /// The host of a token realm the credentials were withheld from, if any (for messages).
    withheld: std::sync::Mutex<Option<String>>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport").field("registry", &self.registry).finish_non_exhaustive()
    }
}

impl Transport {
    /// A client of `registry` (HTTPS, or plain HTTP when `loopback`), whose deadline starts now.
    pub fn new(
        registry: &str,
        loopback: bool,
        credentials: Option<Credentials>,
        limits: Limits,
    ) -> Result<Self, OciError> {
        crate::tls::init();
        let scheme = if loopback { "http" } else { "https" };
        let home = Url::parse(&format!("{scheme}://{registry}/")).map_err(|e| {
            OciError::Protocol { registry: registry.into(), message: format!("bad address: {e}") }
        })?;
        let http = reqwest::Client::builder()
            // Redirects are followed by hand, each hop checked (`send`).
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10).min(limits.rate_window))
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| OciError::Unreachable {
                registry: registry.into(),
                message: e.to_string(),
            })?;
        Ok(Self {
            http,
            home,
            registry: registry.to_string(),
            credentials,
            auth: std::sync::Mutex::new(None),
            limits,
            deadline: Instant::now() + limits.timeout,
            withheld: std::sync::Mutex::new(None),
        })
    }

    /// `SCHEME://REGISTRY/v2/PATH`.
    pub fn url(&self, path: &str) -> Result<Url, OciError> {
        self.home.join(&format!("v2/{path}")).map_err(|e| self.protocol(format!("bad path: {e}")))
    }

    pub fn protocol(&self, message: String) -> OciError {
        OciError::Protocol { registry: self.registry.clone(), message }
    }

    fn refused(&self, message: String) -> OciError {
        OciError::Refused { registry: self.registry.clone(), message }
    }

    fn at_home(&self, url: &Url) -> bool {
        origin(url) == origin(&self.home)
    }

    /// Whether a request may go from `from` to `to`: HTTPS anywhere; plain HTTP only from
    /// plain HTTP on loopback to loopback. What is refused is refused before any connection.
    pub fn check_hop(&self, from: &Url, to: &Url, what: &str) -> Result<(), OciError> {
        let loopback = |u: &Url| u.host_str().is_some_and(is_loopback_host);
        match to.scheme() {
            "https" => Ok(()),
            "http" if from.scheme() == "http" && loopback(from) && loopback(to) => Ok(()),
            "http" => Err(self.refused(format!(
                "{what} goes from {} to plain HTTP ({}); keel never downgrades a registry's \
                 connection",
                from.scheme().to_uppercase(),
                shown_url(to)
            ))),
            other => Err(self.refused(format!("{what} names a `{other}:` URL"))),
        }
    }

    /// Why a refusal may have come: the credentials were withheld from a token realm on
    /// another host.
    pub fn withheld_note(&self) -> String {
        match self.withheld.lock().ok().and_then(|w| w.clone()) {
            Some(host) => format!(
                " (the credential was not sent to the token realm on {host}: a credential goes \
                 only to the registry it was given for)"
            ),
            None => String::new(),
        }
    }

    fn auth_header(&self) -> Option<HeaderValue> {
        self.auth.lock().ok().and_then(|a| a.clone())
    }

    fn set_auth(&self, value: HeaderValue) {
        if let Ok(mut a) = self.auth.lock() {
            *a = Some(value);
        }
    }

    fn timed_out(&self) -> OciError {
        OciError::Deadline { registry: self.registry.clone(), limit: self.limits.timeout }
    }

    /// Sends one request, authenticating at the registry and following redirects by the
    /// rules above; the answer's status is the caller's to judge.
    pub async fn send(
        &self,
        method: Method,
        url: Url,
        accept: Option<&str>,
        body: Option<(bytes::Bytes, &'static str)>,
    ) -> Result<Response, OciError> {
        let (mut method, mut url, mut body) = (method, url, body);
        let (mut hops, mut rounds) = (0, 0);
        loop {
            let mut req = self.http.request(method.clone(), url.clone());
            if let Some(a) = accept {
                req = req.header(header::ACCEPT, a);
            }
            match &body {
                Some((b, content_type)) => {
                    req = req.header(header::CONTENT_TYPE, *content_type).body(b.clone());
                }
                None if method == Method::PUT || method == Method::POST => {
                    req = req.header(header::CONTENT_LENGTH, "0");
                }
                None => {}
            }
            if self.at_home(&url)
                && let Some(a) = self.auth_header()
            {
                req = req.header(header::AUTHORIZATION, a);
            }
            // Headers come after the whole body: an upload gets the time its size takes at the
            // minimum rate, on top of the window.
            let sending = body.as_ref().map_or(0, |(b, _)| b.len() as u64);
            let resp = self.answer(req.send(), sending).await?;
            let status = resp.status();
            if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
                hops += 1;
                if hops > MAX_REDIRECTS {
                    return Err(self.protocol(format!("more than {MAX_REDIRECTS} redirects")));
                }
                let to = resp
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .and_then(|l| url.join(l).ok())
                    .ok_or_else(|| {
                        self.protocol(format!("a {status} without a usable Location"))
                    })?;
                self.check_hop(&url, &to, "a redirect")?;
                if matches!(status.as_u16(), 301..=303)
                    && method != Method::GET
                    && method != Method::HEAD
                {
                    (method, body) = (Method::GET, None);
                }
                url = to;
                continue;
            }
            if status == StatusCode::UNAUTHORIZED && self.at_home(&url) && rounds < 2 {
                rounds += 1;
                let challenge = resp
                    .headers()
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|c| c.to_str().ok())
                    .map(str::to_string);
                if let Some(c) = challenge
                    && self.authenticate(&c, &method).await?
                {
                    continue;
                }
            }
            return Ok(resp);
        }
    }

    /// Headers of an answer, within the deadline and the rate window.
    async fn answer(
        &self,
        sent: impl std::future::Future<Output = reqwest::Result<Response>>,
        sending: u64,
    ) -> Result<Response, OciError> {
        let upload = Duration::from_secs(sending / self.limits.min_rate.max(1));
        let until = self.deadline.min(Instant::now() + self.limits.rate_window + upload);
        match tokio::time::timeout_at(until.into(), sent).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(self.transport(e)),
            Err(_) if Instant::now() >= self.deadline => Err(self.timed_out()),
            Err(_) => Err(OciError::TooSlow {
                registry: self.registry.clone(),
                what: "an answer".into(),
                rate: 0,
                limits: self.limits,
            }),
        }
    }

    fn transport(&self, e: reqwest::Error) -> OciError {
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            message = format!("{message}: {s}");
            source = s.source();
        }
        if e.is_connect() || e.is_timeout() {
            OciError::Unreachable { registry: self.registry.clone(), message }
        } else {
            self.protocol(message)
        }
    }

    /// Answers a `WWW-Authenticate` challenge: `Basic` with the credentials, `Bearer` with a
    /// token from the realm (asked with the credentials only when the realm is the registry
    /// itself). Whether there is something new to try.
    async fn authenticate(&self, challenge: &str, method: &Method) -> Result<bool, OciError> {
        let (scheme, params) = parse_challenge(challenge);
        let before = self.auth_header();
        if scheme.eq_ignore_ascii_case("basic") {
            let Some(c) = &self.credentials else { return Ok(false) };
            let value = c.basic_header();
            if before.as_ref() == Some(&value) {
                return Ok(false);
            }
            self.set_auth(value);
            return Ok(true);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Ok(false);
        }
        let param = |k: &str| params.iter().find(|(n, _)| n.eq_ignore_ascii_case(k)).map(|p| &p.1);
        let realm = param("realm")
            .and_then(|r| Url::parse(r).ok())
            .ok_or_else(|| self.protocol("a Bearer challenge without a usable realm".into()))?;
        self.check_hop(&self.home, &realm, "the token realm")?;
        let mut token_url = realm.clone();
        {
            let mut q = token_url.query_pairs_mut();
            if let Some(s) = param("service") {
                q.append_pair("service", s);
            }
            if let Some(s) = param("scope") {
                q.append_pair("scope", s);
            } else if method != Method::GET && method != Method::HEAD {
                q.append_pair("scope", "pull,push");
            }
        }
        let mut req = self.http.get(token_url);
        // The credentials go to the realm only when it is the registry itself.
        if let Some(c) = &self.credentials {
            if self.at_home(&realm) {
                req = req.header(header::AUTHORIZATION, c.basic_header());
            } else if let Ok(mut w) = self.withheld.lock() {
                *w = realm.host_str().map(str::to_string);
            }
        }
        let resp = self.answer(req.send(), 0).await?;
        if !resp.status().is_success() {
            let status = resp.status();
            let text = self.error_text(resp).await;
            return Err(OciError::Unauthorized {
                registry: self.registry.clone(),
                message: format!("the token realm answered {status}: {text}"),
            });
        }
        let body = self.read(resp, MAX_TOKEN_BYTES, "the token answer").await?;
        #[derive(serde::Deserialize)]
        struct TokenAnswer {
            token: Option<String>,
            access_token: Option<String>,
        }
        let answer: TokenAnswer = serde_json::from_slice(&body)
            .map_err(|e| self.protocol(format!("the token answer is not JSON: {e}")))?;
        let token = answer.token.or(answer.access_token).filter(|t| !t.is_empty());
        let token = token.ok_or_else(|| self.protocol("the token answer has no token".into()))?;
        let value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| self.protocol("the token is not a header value".into()))?;
        if before.as_ref() == Some(&value) {
            return Ok(false);
        }
        self.set_auth(value);
        Ok(true)
    }

    /// Reads `resp`'s body, at most `cap` bytes (refused on its `Content-Length` first, then cut
    /// while it streams), within the deadline and at the minimum rate.
    pub async fn read(&self, resp: Response, cap: u64, what: &str) -> Result<Vec<u8>, OciError> {
        if let Some(len) = resp.content_length()
            && len > cap
        {
            return Err(OciError::TooLarge { what: what.to_string(), size: len, limit: cap });
        }
        let mut resp = resp;
        let mut out = Vec::with_capacity(resp.content_length().unwrap_or(0).min(cap) as usize);
        let mut window = (Instant::now(), 0u64);
        loop {
            if Instant::now() >= self.deadline {
                return Err(self.timed_out());
            }
            let window_end = window.0 + self.limits.rate_window;
            match tokio::time::timeout_at(self.deadline.min(window_end).into(), resp.chunk()).await
            {
                Ok(Ok(Some(chunk))) => {
                    if out.len() as u64 + chunk.len() as u64 > cap {
                        return Err(OciError::Overflow { what: what.to_string(), limit: cap });
                    }
                    window.1 += chunk.len() as u64;
                    out.extend_from_slice(&chunk);
                }
                Ok(Ok(None)) => return Ok(out),
                Ok(Err(e)) => return Err(self.transport(e)),
                Err(_) => {}
            }
            let now = Instant::now();
            if now >= window_end {
                let secs = self.limits.rate_window.as_secs_f64().max(0.001);
                if (window.1 as f64) < self.limits.min_rate as f64 * secs {
                    return Err(OciError::TooSlow {
                        registry: self.registry.clone(),
                        what: what.to_string(),
                        rate: (window.1 as f64 / secs) as u64,
                        limits: self.limits,
                    });
                }
                window = (now, 0);
            }
        }
    }

    /// The message of an error answer: its OCI error envelope's messages, or its first line,
    /// read through [`MAX_ERROR_BYTES`] (a body that is too large or too slow says so).
    pub async fn error_text(&self, resp: Response) -> String {
        let bytes = match self.read(resp, MAX_ERROR_BYTES, "an error answer").await {
            Ok(b) => b,
            Err(e) => return format!("({e})"),
        };
        #[derive(serde::Deserialize)]
        struct Envelope {
            errors: Vec<Entry>,
        }
        #[derive(serde::Deserialize)]
        struct Entry {
            #[serde(default)]
            code: String,
            #[serde(default)]
            message: String,
        }
        let text = match serde_json::from_slice::<Envelope>(&bytes) {
            Ok(env) => env
                .errors
                .iter()
                .map(|e| format!("{}: {}", e.code, e.message))
                .collect::<Vec<_>>()
                .join("; "),
            Err(_) => String::from_utf8_lossy(&bytes).lines().next().unwrap_or("").to_string(),
        };
        text.chars().filter(|c| !c.is_control()).take(300).collect()
    }
}

/// A URL as shown in a message: scheme, host, port and path, no query (which may hold a
/// token) and no user information.
pub fn shown_url(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
    let path: String = url.path().chars().take(120).collect();
    format!("{}://{host}{port}{path}", url.scheme())
}

/// `Scheme k="v", k2=v2` → the scheme and its parameters.
fn parse_challenge(text: &str) -> (String, Vec<(String, String)>) {
    let text = text.trim();
    let (scheme, mut rest) = match text.split_once(' ') {
        Some((s, r)) => (s.to_string(), r.trim()),
        None => (text.to_string(), ""),
    };
    let mut params = Vec::new();
    while let Some((key, after)) = rest.split_once('=') {
        let key = key.trim().trim_start_matches(',').trim().to_string();
        let after = after.trim_start();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            (value, &quoted[end.min(quoted.len())..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        params.push((key, value));
        rest = next.trim_start().trim_start_matches(',');
    }
    (scheme, params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse_with_quoted_and_bare_values() {
        let (s, p) = parse_challenge(
            r#"Bearer realm="https://auth.example/token",service="reg, x",scope=repository:a:pull"#,
        );
        assert_eq!(s, "Bearer");
        let want = [
            ("realm", "https://auth.example/token"),
            ("service", "reg, x"),
            ("scope", "repository:a:pull"),
        ];
        let got: Vec<(&str, &str)> = p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, want);
        let (s, p) = parse_challenge(r#"Basic realm="a \"b\"""#);
        assert_eq!((s.as_str(), p), ("Basic", vec![("realm".into(), "a \"b\"".into())]));
    }

    #[test]
    fn hops_never_downgrade_and_plain_http_stays_on_loopback() {
        let t = Transport::new("127.0.0.1:5000", true, None, Limits::default()).unwrap();
        let u = |s: &str| Url::parse(s).unwrap();
        let ok = [
            ("http://127.0.0.1:5000/v2/", "http://127.0.0.1:6000/x"),
            ("http://127.0.0.1:5000/v2/", "https://blobs.example/x"),
            ("https://r.example/v2/", "https://s3.example/x"),
            ("http://[::1]:5/v2/", "http://localhost:7/x"),
        ];
        for (from, to) in ok {
            t.check_hop(&u(from), &u(to), "a redirect").unwrap_or_else(|e| panic!("{to}: {e}"));
        }
        let refused = [
            ("https://r.example/v2/", "http://r.example/x"),
            ("https://127.0.0.1:5000/v2/", "http://127.0.0.1:5000/x"),
            ("http://127.0.0.1:5000/v2/", "http://10.0.0.1/x"),
            ("http://127.0.0.1:5000/v2/", "file:///etc/passwd"),
        ];
        for (from, to) in refused {
            let e = t.check_hop(&u(from), &u(to), "a redirect").unwrap_err();
            assert_eq!(e.kind(), "registry_refused", "{to}");
        }
        assert_eq!(shown_url(&u("https://u:p@h.example:8/a?token=x")), "https://h.example:8/a");
    }
}
