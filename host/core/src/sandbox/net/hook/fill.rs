//! Secrets on the wire: `{{secret:NAME}}` placeholders in a request's URL, headers and body,
//! filled only where the secret's binding allows (its host, its places), encoded for where
//! each one stands.

use super::*;

const PLACEHOLDER_OPEN: &str = "{{secret:";

/// A part of a request a placeholder can be in.
#[derive(Clone, Copy)]
enum Place {
    Header,
    Query,
    Body,
}

impl Place {
    fn allowed(self, b: &SecretBinding) -> bool {
        match self {
            Self::Header => b.fill.header,
            Self::Query => b.fill.query,
            Self::Body => b.fill.body,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Header => "header",
            Self::Query => "query",
            Self::Body => "body",
        }
    }

    /// How the value is written there.
    fn encode(self, s: &str) -> String {
        match self {
            Self::Query => crate::secrets::url_encoded(s),
            Self::Header | Self::Body => s.to_string(),
        }
    }
}

/// `text` (in `place`) with each `{{secret:NAME}}` replaced by the value of `NAME` bound to
/// this destination; a placeholder of a secret not bound here, or not to be filled in this
/// part of the request, refuses the request.
fn substitute(
    text: &str,
    bound: &[&(SecretBinding, Secret)],
    all: &[(SecretBinding, Secret)],
    place: Place,
) -> Result<Option<String>, Stop> {
    if !text.contains(PLACEHOLDER_OPEN) {
        return Ok(None);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(PLACEHOLDER_OPEN) {
        out.push_str(&rest[..i]);
        let after = &rest[i + PLACEHOLDER_OPEN.len()..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[i..]);
            rest = "";
            break;
        };
        let name = &after[..end];
        match bound.iter().find(|(b, _)| b.name == name) {
            Some((b, _)) if !place.allowed(b) => {
                return Err(deny(format!(
                    "the request carries the placeholder of secret `{name}` in its {}, where its grant does not let keel write it (it is filled in: {}; a grant may say :in=header,query,body); nothing was sent",
                    place.name(),
                    b.fill
                )));
            }
            Some((_, value)) => out.push_str(&place.encode(value.expose())),
            None => {
                let elsewhere = all.iter().any(|(b, _)| b.name == name);
                return Err(deny(if elsewhere {
                    format!(
                        "the request carries the placeholder of secret `{name}`, which is not bound to this destination; nothing was sent"
                    )
                } else {
                    format!(
                        "the request carries the placeholder of secret `{name}`, which is granted to no destination of this call; nothing was sent"
                    )
                }));
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(Some(out))
}

/// Builds the request that goes on the wire: the origin-form URI, the guest's headers with
/// the auth headers replaced by the bound secrets' own, placeholders substituted. Returns it
/// with the size of its request line and headers.
pub(super) fn fill_secrets(
    parts: http::request::Parts,
    body: Bytes,
    bound: &[&(SecretBinding, Secret)],
    all: &[(SecretBinding, Secret)],
) -> Result<(http::Request<Full<Bytes>>, u64), Stop> {
    let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    // A placeholder in the URL arrives percent-encoded; look for it in both forms.
    let pq_text =
        pq.replace("%7B", "{").replace("%7b", "{").replace("%7D", "}").replace("%7d", "}");
    let pq = match substitute(&pq_text, bound, all, Place::Query)? {
        Some(filled) => filled,
        None => pq.to_string(),
    };
    let mut builder = http::Request::builder()
        .method(parts.method.clone())
        .uri(pq)
        .version(http::Version::HTTP_11);
    let strip = |name: &http::HeaderName| {
        !bound.is_empty()
            && (name == http::header::AUTHORIZATION
                || name == http::header::PROXY_AUTHORIZATION
                || bound.iter().any(|(b, _)| name.as_str() == b.header))
    };
    for (name, value) in &parts.headers {
        if strip(name) {
            continue;
        }
        let filled = match value.to_str() {
            Ok(text) => substitute(text, bound, all, Place::Header)?,
            Err(_) => None,
        };
        match filled {
            Some(text) => {
                let v = http::HeaderValue::from_str(&text).map_err(|_| {
                    deny(format!(
                        "header `{name}` is not a valid header value once its secret is filled in"
                    ))
                })?;
                builder = builder.header(name, v);
            }
            None => builder = builder.header(name, value),
        }
    }
    for (b, value) in bound {
        let text = b.format.replacen("{}", value.expose(), 1);
        let mut v = http::HeaderValue::from_str(&text).map_err(|_| {
            deny(format!("secret `{}` cannot be written into header `{}`", b.name, b.header))
        })?;
        v.set_sensitive(true);
        builder = builder.header(b.header.as_str(), v);
    }
    let body = match std::str::from_utf8(&body) {
        Ok(text) => match substitute(text, bound, all, Place::Body)? {
            Some(filled) => Bytes::from(filled),
            None => body,
        },
        Err(_) => body,
    };
    if !body.is_empty() || parts.headers.contains_key(http::header::CONTENT_LENGTH) {
        builder = builder.header(http::header::CONTENT_LENGTH, body.len());
    }
    let request = builder
        .body(Full::new(body))
        .map_err(|e| fail(format!("building the request: {e}"), Error::HttpRequestUriInvalid))?;
    let head = head_size(&request);
    Ok((request, head))
}

/// Bytes of `request`'s head as written: `METHOD PATH HTTP/1.1`, each header line, their
/// CRLFs, and the blank line.
fn head_size<B>(request: &http::Request<B>) -> u64 {
    let line = request.method().as_str().len() + 1 + request.uri().to_string().len() + 11;
    let headers: usize =
        request.headers().iter().map(|(n, v)| n.as_str().len() + 2 + v.len() + 2).sum();
    (line + headers + 2) as u64
}
