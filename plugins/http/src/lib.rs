//! `http`: keel's first-party HTTP client tool.
//!
//! `http_fetch` sends one request over `wasi:http` and returns the status, a safe subset of
//! the response headers, and the body as JSON (when it is JSON) or text, cut at `max_bytes`
//! with a marker. It follows redirects of GET and HEAD requests itself, each hop a new
//! request that keel's egress hook checks against the session's network grants: a redirect
//! to a destination that is not granted is refused, never followed silently.
//!
//! The tool never holds a credential: where the session binds a secret to the destination,
//! keel writes it into the request on the wire; a header or body may carry the placeholder
//! `{{secret:NAME}}`, which keel fills in for a bound destination only.

use keel_sdk::{Effect, JsonSchema, Tool, ToolError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasip2::io::streams::StreamError;

/// Body bytes returned by default.
const DEFAULT_MAX_BYTES: u64 = 256 * 1024;
/// Body bytes returned at most, whatever the input asks.
const MAX_MAX_BYTES: u64 = 4 * 1024 * 1024;
/// Redirects followed at most.
const MAX_REDIRECTS: usize = 5;
/// Response headers returned (the rest are left out: cookies and the like).
const SAFE_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "content-language",
    "content-encoding",
    "location",
    "etag",
    "last-modified",
    "date",
    "cache-control",
    "expires",
    "retry-after",
    "link",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
];

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct FetchInput {
    /// The URL: https://HOST[:PORT]/PATH?QUERY (http:// only where the session's grant says
    /// so).
    url: String,
    /// GET (default), HEAD, POST, PUT, PATCH, DELETE or OPTIONS.
    #[serde(default)]
    method: Option<String>,
    /// Request headers. A value may hold `{{secret:NAME}}`, which keel fills in for a
    /// destination the secret is bound to (and refuses anywhere else).
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    /// Request body (text; send JSON as text with a content-type header).
    #[serde(default)]
    body: Option<String>,
    /// Body bytes to return at most (default 262144; at most 4194304). The rest is cut with a
    /// marker.
    #[serde(default)]
    max_bytes: Option<u64>,
}

#[derive(Serialize, JsonSchema)]
struct FetchOutput {
    /// The URL that answered (after redirects).
    url: String,
    status: u16,
    /// A safe subset of the response headers (content type, length, caching, rate limits,
    /// location); cookies and the like are left out.
    headers: BTreeMap<String, String>,
    /// The body parsed, when it is JSON and was not cut.
    #[serde(skip_serializing_if = "Option::is_none")]
    json: Option<serde_json::Value>,
    /// The body as text, when it is not JSON (invalid UTF-8 replaced).
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    /// Body bytes read.
    bytes: u64,
    /// Whether the body was cut at `max_bytes`.
    truncated: bool,
    /// The redirects followed, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    redirects: Vec<String>,
}

/// A URL split into what `wasi:http` takes.
#[derive(Debug, Clone, PartialEq)]
struct Url {
    https: bool,
    authority: String,
    path_and_query: String,
}

impl Url {
    fn parse(url: &str) -> Result<Self, String> {
        let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(format!(
                "`{url}` is not an http(s) URL: it must start with https:// or http://"
            ));
        };
        let rest = rest.split('#').next().unwrap_or("");
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, pq) = rest.split_at(end);
        if authority.is_empty() {
            return Err(format!("`{url}` names no host"));
        }
        if authority.contains('@') {
            return Err(format!(
                "`{url}` carries credentials in the URL; keel writes a session's secrets into requests itself"
            ));
        }
        if authority.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("`{url}` has spaces or control characters in its host"));
        }
        let path_and_query = match pq {
            "" => "/".to_string(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_string(),
        };
        Ok(Self { https, authority: authority.to_string(), path_and_query })
    }

    fn shown(&self) -> String {
        format!(
            "{}://{}{}",
            if self.https { "https" } else { "http" },
            self.authority,
            self.path_and_query
        )
    }

    /// The target of a `Location` header, relative to this URL.
    fn join(&self, location: &str) -> Result<Self, String> {
        if location.starts_with("https://") || location.starts_with("http://") {
            return Self::parse(location);
        }
        if let Some(rest) = location.strip_prefix("//") {
            return Self::parse(&format!("{}://{rest}", if self.https { "https" } else { "http" }));
        }
        let path = if location.starts_with('/') {
            location.to_string()
        } else {
            let base = self.path_and_query.split('?').next().unwrap_or("/");
            let dir = &base[..base.rfind('/').map(|i| i + 1).unwrap_or(1)];
            format!("{dir}{location}")
        };
        Ok(Self { path_and_query: path, ..self.clone() })
    }
}

fn method_of(name: &str) -> Result<Method, ToolError> {
    Ok(match name.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "PATCH" => Method::Patch,
        "DELETE" => Method::Delete,
        "OPTIONS" => Method::Options,
        other => {
            return Err(ToolError::InvalidInput(format!(
                "method `{other}` is not supported: use GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS"
            )));
        }
    })
}

/// What a `wasi:http` error means to the model.
fn explain(url: &Url, e: &ErrorCode) -> ToolError {
    let at = url.shown();
    match e {
        ErrorCode::HttpRequestDenied => ToolError::Denied(format!(
            "keel refused the request to {at} (HTTP-request-denied) before anything was sent: the destination is not granted to this session, resolves to a private address, or the request carries a secret placeholder not bound to it. The call's network report gives the reason."
        )),
        ErrorCode::HttpRequestBodySize(_) | ErrorCode::HttpResponseBodySize(_) => {
            ToolError::Failed(format!(
                "the request to {at} passed the call's network byte cap (HTTP-{}); ask for less, or ask for a higher --net-max-bytes",
                if matches!(e, ErrorCode::HttpRequestBodySize(_)) {
                    "request-body-size"
                } else {
                    "response-body-size"
                }
            ))
        }
        ErrorCode::DnsError(d) => ToolError::Failed(format!(
            "{at}: the host name cannot be resolved ({})",
            d.rcode.clone().unwrap_or_else(|| "DNS error".into())
        )),
        ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::HttpResponseTimeout => {
            ToolError::Failed(format!("{at}: the server did not answer before the call's deadline"))
        }
        other => ToolError::Failed(format!("{at}: the request failed: {other:?}")),
    }
}

/// A response as read: status, headers, body (up to the cap), and whether it was cut.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    truncated: bool,
}

/// Sends one request and reads its response (up to `max` body bytes).
fn exchange(
    url: &Url,
    method: &Method,
    headers: &BTreeMap<String, String>,
    body: Option<&[u8]>,
    max: u64,
) -> Result<Response, ToolError> {
    let fields = Fields::new();
    for (k, v) in headers {
        fields.append(&k.to_ascii_lowercase(), v.as_bytes()).map_err(|e| {
            ToolError::InvalidInput(format!("header `{k}` cannot be sent ({e:?}); hop-by-hop headers such as host or connection are set by the host"))
        })?;
    }
    let request = OutgoingRequest::new(fields);
    let bad = |what: &str| ToolError::InvalidInput(format!("{}: invalid {what}", url.shown()));
    request.set_method(method).map_err(|()| bad("method"))?;
    request
        .set_scheme(Some(if url.https { &Scheme::Https } else { &Scheme::Http }))
        .map_err(|()| bad("scheme"))?;
    request.set_authority(Some(&url.authority)).map_err(|()| bad("host"))?;
    request.set_path_with_query(Some(&url.path_and_query)).map_err(|()| bad("path"))?;
    let outgoing = request.body().map_err(|()| bad("body"))?;
    let pending = outgoing_handler::handle(request, None).map_err(|e| explain(url, &e))?;
    {
        let stream = outgoing.write().map_err(|()| bad("body stream"))?;
        for chunk in body.unwrap_or_default().chunks(4096) {
            // A refused request stops reading its body: the error comes from `pending`.
            if stream.blocking_write_and_flush(chunk).is_err() {
                break;
            }
        }
    }
    let _ = OutgoingBody::finish(outgoing, None);
    pending.subscribe().block();
    let response = match pending.get() {
        Some(Ok(Ok(r))) => r,
        Some(Ok(Err(e))) => return Err(explain(url, &e)),
        Some(Err(())) | None => {
            return Err(ToolError::Failed(format!("{}: the response was lost", url.shown())));
        }
    };
    let status = response.status();
    let headers: Vec<(String, String)> = response
        .headers()
        .entries()
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), String::from_utf8_lossy(&v).into_owned()))
        .collect();
    let incoming = response.consume().map_err(|()| bad("response body"))?;
    let stream = incoming.stream().map_err(|()| bad("response body stream"))?;
    let mut out = Vec::new();
    let mut truncated = false;
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => {
                let room = (max as usize).saturating_sub(out.len());
                if chunk.len() > room {
                    out.extend_from_slice(&chunk[..room]);
                    truncated = true;
                    break;
                }
                out.extend_from_slice(&chunk);
            }
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                return Err(ToolError::Failed(format!(
                    "{}: reading the response body failed after {} bytes: {} (the call's network byte cap or deadline may have been reached)",
                    url.shown(),
                    out.len(),
                    // The host's description is its first line (the rest is its trace).
                    e.to_debug_string().lines().next().unwrap_or("stream error")
                )));
            }
        }
    }
    Ok(Response { status, headers, body: out, truncated })
}

fn fetch(input: FetchInput) -> Result<FetchOutput, ToolError> {
    let mut url = Url::parse(&input.url).map_err(ToolError::InvalidInput)?;
    let method_name = input.method.clone().unwrap_or_else(|| "GET".into()).to_ascii_uppercase();
    let method = method_of(&method_name)?;
    let max = input.max_bytes.unwrap_or(DEFAULT_MAX_BYTES).clamp(1, MAX_MAX_BYTES);
    let headers = input.headers.clone().unwrap_or_default();
    let body = input.body.as_deref().map(str::as_bytes);
    let follows = matches!(method_name.as_str(), "GET" | "HEAD");
    let mut redirects = Vec::new();
    loop {
        let Response { status, headers: head, body: bytes, truncated } =
            exchange(&url, &method, &headers, body, max)?;
        let location = head.iter().find(|(k, _)| k == "location").map(|(_, v)| v.clone());
        if follows
            && matches!(status, 301 | 302 | 303 | 307 | 308)
            && let Some(loc) = location
        {
            if redirects.len() >= MAX_REDIRECTS {
                return Err(ToolError::Failed(format!(
                    "{}: more than {MAX_REDIRECTS} redirects; stopped at {loc}",
                    input.url
                )));
            }
            let next = url.join(&loc).map_err(ToolError::Failed)?;
            redirects.push(next.shown());
            url = next;
            continue;
        }
        let kept: BTreeMap<String, String> =
            head.into_iter().filter(|(k, _)| SAFE_HEADERS.contains(&k.as_str())).collect();
        let is_json = kept.get("content-type").is_some_and(|t| t.contains("json"));
        let json = if is_json && !truncated { serde_json::from_slice(&bytes).ok() } else { None };
        let text = match &json {
            Some(_) => None,
            None if bytes.is_empty() => None,
            None => {
                let mut t = String::from_utf8_lossy(&bytes).into_owned();
                if truncated {
                    t.push_str(&format!(
                        "\n[body truncated at {} bytes; ask with a larger max_bytes, or a narrower request, for more]",
                        bytes.len()
                    ));
                }
                Some(t)
            }
        };
        return Ok(FetchOutput {
            url: url.shown(),
            status,
            headers: kept,
            json,
            text,
            bytes: bytes.len() as u64,
            truncated,
            redirects,
        });
    }
}

fn tools() -> Vec<Tool> {
    vec![Tool::new(
        "http_fetch",
        "Sends one HTTP request (GET by default) to a destination the session is granted, and returns the status, a safe subset of the headers, and the body as JSON or text (cut at max_bytes with a marker). GET and HEAD follow up to 5 redirects, each checked against the grants. Credentials are added by keel for destinations they are bound to: never put a key in the input; write {{secret:NAME}} where a secret goes.",
        Effect::External,
        fetch,
    )]
}

keel_sdk::export_tools!(tools);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_and_join() {
        let u = Url::parse("https://api.example.com:8443/a/b?x=1#frag").unwrap();
        assert_eq!(
            (u.https, u.authority.as_str(), u.path_and_query.as_str()),
            (true, "api.example.com:8443", "/a/b?x=1")
        );
        assert_eq!(Url::parse("http://h?q").unwrap().path_and_query, "/?q");
        assert!(Url::parse("ftp://h/").is_err());
        assert!(Url::parse("https://user:pw@h/").is_err());
        assert_eq!(u.join("/c").unwrap().shown(), "https://api.example.com:8443/c");
        assert_eq!(u.join("c?y").unwrap().shown(), "https://api.example.com:8443/a/c?y");
        assert_eq!(u.join("http://other/").unwrap().shown(), "http://other/");
        assert_eq!(u.join("//other:1/p").unwrap().shown(), "https://other:1/p");
    }
}
