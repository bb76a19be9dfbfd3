//! Network grants: which (scheme, host, port) a tool may send HTTP requests to, the loopback
//! exceptions a test needs, and the destinations each secret is bound to.
//!
//! Grants are parsed and checked when they are made, stored with the session like directory
//! grants, and matched by the egress hook on every request. Nothing here holds a secret's
//! value: a [`SecretBinding`] names the secret.

use std::fmt;
use std::str::FromStr;

use crate::secrets::valid_secret_name;

mod binding;

pub use binding::SecretBinding;

/// Bytes a call may send and receive over the network in all, by default (`--net-max-bytes`).
pub const DEFAULT_NET_MAX_BYTES: u64 = 16 << 20;
/// Requests a call may start in all, by default (`--net-max-requests`).
pub const DEFAULT_NET_MAX_REQUESTS: u64 = 256;
/// Requests of one call that may be in flight at once; one more is refused until one ends.
pub const MAX_CONCURRENT_REQUESTS: usize = 16;

/// The scheme of a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    Https,
    Http,
}

impl Scheme {
    pub fn default_port(self) -> u16 {
        match self {
            Self::Https => 443,
            Self::Http => 80,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Https => "https",
            Self::Http => "http",
        }
    }
}

/// A host a grant names: exactly one name, or every name below a domain (`*.example.com`
/// matches `api.example.com` and `a.b.example.com`, not `example.com`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostPattern {
    Exact(String),
    Below(String),
}

impl HostPattern {
    pub fn matches(&self, host: &str) -> bool {
        match self {
            Self::Exact(h) => h == host,
            Self::Below(d) => {
                host.len() > d.len() + 1
                    && host.ends_with(d.as_str())
                    && host.as_bytes()[host.len() - d.len() - 1] == b'.'
            }
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(h) if h.contains(':') => write!(f, "[{h}]"),
            Self::Exact(h) => f.write_str(h),
            Self::Below(d) => write!(f, "*.{d}"),
        }
    }
}

/// One destination a tool may send requests to (`--net [http://]HOST[:PORT]`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetRule {
    pub scheme: Scheme,
    pub host: HostPattern,
    pub port: u16,
}

impl NetRule {
    pub fn allows(&self, scheme: Scheme, host: &str, port: u16) -> bool {
        self.scheme == scheme && self.port == port && self.host.matches(host)
    }
}

impl fmt::Display for NetRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}", self.scheme.as_str(), self.host, self.port)
    }
}

/// Why a network grant is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} `{spec}`: {reason}")]
pub struct NetGrantError {
    pub what: &'static str,
    pub spec: String,
    pub reason: String,
}

fn err(what: &'static str, spec: &str, reason: impl Into<String>) -> NetGrantError {
    NetGrantError { what, spec: spec.to_string(), reason: reason.into() }
}

/// A host name or IP literal as it is matched: lowercase, no trailing dot, IPv6 without
/// brackets.
pub fn normalise_host(host: &str) -> Option<String> {
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Some(host);
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    (host.len() <= 253 && host.split('.').all(label_ok)).then_some(host)
}

/// Splits `HOST[:PORT]` (IPv6 literals in brackets) into the host and the port text.
fn split_host_port(s: &str) -> (&str, Option<&str>) {
    if s.starts_with('[') {
        return match s.find(']') {
            Some(end) => (&s[..=end], s[end + 1..].strip_prefix(':')),
            None => (s, None),
        };
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, Some(p)),
        _ => (s, None),
    }
}

fn parse_port(what: &'static str, spec: &str, p: &str) -> Result<u16, NetGrantError> {
    p.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| err(what, spec, format!("`{p}` is not a port (1 to 65535)")))
}

impl FromStr for NetRule {
    type Err = NetGrantError;

    /// Parses `[http://|https://]HOST[:PORT]`: an exact host or `*.domain`, https unless the
    /// grant says `http://`, the scheme's default port unless it names one.
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        const WHAT: &str = "network grant";
        let (scheme, rest) = if let Some(r) = spec.strip_prefix("https://") {
            (Scheme::Https, r)
        } else if let Some(r) = spec.strip_prefix("http://") {
            (Scheme::Http, r)
        } else if spec.contains("://") {
            return Err(err(WHAT, spec, "only https:// and http:// destinations can be granted"));
        } else {
            (Scheme::Https, spec)
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains('/') || rest.contains('@') || rest.contains('?') {
            return Err(err(
                WHAT,
                spec,
                "name a host and optionally a port (HOST[:PORT]), not a URL path",
            ));
        }
        let (host, port) = split_host_port(rest);
        let port = match port {
            Some(p) => parse_port(WHAT, spec, p)?,
            None => scheme.default_port(),
        };
        let host = match host.strip_prefix("*.") {
            Some(domain) => {
                let d = normalise_host(domain)
                    .filter(|d| d.contains('.') && d.parse::<std::net::IpAddr>().is_err())
                    .ok_or_else(|| {
                        err(WHAT, spec, "a wildcard names a domain with a dot, like *.example.com")
                    })?;
                HostPattern::Below(d)
            }
            None => HostPattern::Exact(normalise_host(host).ok_or_else(|| {
                err(
                    WHAT,
                    spec,
                    "expected [http://]HOST[:PORT] or *.DOMAIN[:PORT], e.g. api.github.com",
                )
            })?),
        };
        Ok(Self { scheme, host, port })
    }
}

/// A testing exception that lets requests to one host name and port reach a loopback
/// address (`--net-allow-loopback HOST:PORT`). Keyed on the name and the port: other allowed
/// names that resolve to loopback stay refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoopbackException {
    pub host: String,
    pub port: u16,
}

impl FromStr for LoopbackException {
    type Err = NetGrantError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        const WHAT: &str = "loopback exception";
        let (host, port) = split_host_port(spec);
        let port = port.ok_or_else(|| {
            err(WHAT, spec, "name the host and the port, e.g. localhost:8080 (for testing only)")
        })?;
        let port = parse_port(WHAT, spec, port)?;
        let host = normalise_host(host)
            .ok_or_else(|| err(WHAT, spec, "expected HOST:PORT, e.g. localhost:8080"))?;
        Ok(Self { host, port })
    }
}

impl fmt::Display for LoopbackException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", HostPattern::Exact(self.host.clone()), self.port)
    }
}

/// Everything a session (or a direct call) is granted on the network. Empty: no network.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct NetGrants {
    pub allow: Vec<NetRule>,
    pub loopback: Vec<LoopbackException>,
    pub secrets: Vec<SecretBinding>,
    /// Bytes a call may send (request lines, headers and bodies) and receive (response
    /// bodies) in all.
    pub max_bytes: u64,
    /// Requests a call may start in all (`--net-max-requests`).
    pub max_requests: u64,
}

impl Default for NetGrants {
    fn default() -> Self {
        Self {
            allow: Vec::new(),
            loopback: Vec::new(),
            secrets: Vec::new(),
            max_bytes: DEFAULT_NET_MAX_BYTES,
            max_requests: DEFAULT_NET_MAX_REQUESTS,
        }
    }
}

impl NetGrants {
    /// No network: every request refused.
    pub fn none() -> &'static NetGrants {
        static NONE: std::sync::LazyLock<NetGrants> = std::sync::LazyLock::new(NetGrants::default);
        &NONE
    }

    pub fn is_empty(&self) -> bool {
        self.allow.is_empty()
    }

    /// Checks the grants fit together: every loopback exception and secret names a destination
    /// a rule allows; a secret goes over plain http only to a loopback test exception; a
    /// secret name is bound once per destination.
    pub fn check(&self) -> Result<(), NetGrantError> {
        for l in &self.loopback {
            let allowed = [Scheme::Https, Scheme::Http]
                .iter()
                .any(|s| self.allow.iter().any(|r| r.allows(*s, &l.host, l.port)));
            if !allowed {
                return Err(err(
                    "loopback exception",
                    &l.to_string(),
                    "no --net grant allows this host and port; grant it too",
                ));
            }
        }
        for (i, s) in self.secrets.iter().enumerate() {
            let spec = format!("{}@{}", s.name, s.host);
            if !self.allow.iter().any(|r| r.allows(s.scheme, &s.host, s.port)) {
                return Err(err(
                    "secret grant",
                    &spec,
                    format!(
                        "no --net grant allows {}://{}:{}; a secret is only sent where requests may go",
                        s.scheme.as_str(),
                        HostPattern::Exact(s.host.clone()),
                        s.port
                    ),
                ));
            }
            if s.scheme == Scheme::Http
                && !self.loopback.iter().any(|l| l.host == s.host && l.port == s.port)
            {
                return Err(err(
                    "secret grant",
                    &spec,
                    "a secret is sent over plain http only to a loopback test server (--net-allow-loopback); bind it to an https destination",
                ));
            }
            if self.secrets[..i]
                .iter()
                .any(|o| o.binds(s.scheme, &s.host, s.port) && o.header == s.header)
            {
                return Err(err(
                    "secret grant",
                    &spec,
                    format!(
                        "another secret already fills header `{}` for this destination",
                        s.header
                    ),
                ));
            }
        }
        if self.max_bytes == 0 {
            return Err(err("network byte cap", "0", "give at least 1 byte"));
        }
        Ok(())
    }

    /// The names of the secrets these grants bind.
    pub fn secret_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.secrets.iter().map(|s| s.name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// One line per grant, as shown wherever grants are shown.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self.allow.iter().map(|r| format!("net {r}")).collect();
        out.extend(self.loopback.iter().map(|l| format!("net loopback exception {l} (testing)")));
        out.extend(self.secrets.iter().map(|s| format!("secret {s}")));
        if !self.allow.is_empty() {
            out.push(format!("net at most {} bytes per call", self.max_bytes));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_with_https_and_the_default_port() {
        let r: NetRule = "api.github.com".parse().unwrap();
        assert_eq!(r.to_string(), "https://api.github.com:443");
        assert!(r.allows(Scheme::Https, "api.github.com", 443));
        assert!(!r.allows(Scheme::Https, "api.github.com", 8443));
        assert!(!r.allows(Scheme::Http, "api.github.com", 443));
        let r: NetRule = "http://LocalHost.:8080".parse().unwrap();
        assert_eq!(r.to_string(), "http://localhost:8080");
        let r: NetRule = "*.example.com".parse().unwrap();
        assert!(r.allows(Scheme::Https, "a.example.com", 443));
        assert!(r.allows(Scheme::Https, "a.b.example.com", 443));
        assert!(!r.allows(Scheme::Https, "example.com", 443));
        assert!(!r.allows(Scheme::Https, "badexample.com", 443));
        let r: NetRule = "[::1]:9000".parse().unwrap();
        assert_eq!(r.to_string(), "https://[::1]:9000");
        for bad in [
            "ftp://x.org",
            "x.org/path",
            "x.org:0",
            "x.org:99999",
            "*.com",
            "*.1.2.3.4",
            "",
            "a b.org",
            "user@x.org",
        ] {
            assert!(bad.parse::<NetRule>().is_err(), "{bad}");
        }
    }

    #[test]
    fn loopback_exceptions_need_a_port() {
        let l: LoopbackException = "localhost:8080".parse().unwrap();
        assert_eq!(l, LoopbackException { host: "localhost".into(), port: 8080 });
        assert!("localhost".parse::<LoopbackException>().is_err());
        assert!("[::1]:80".parse::<LoopbackException>().is_ok());
    }

    #[test]
    fn secret_bindings_parse_with_their_options() {
        let s: SecretBinding = "TOKEN@api.github.com".parse().unwrap();
        assert_eq!(
            (s.header.as_str(), s.format.as_str(), s.port),
            ("authorization", "Bearer {}", 443)
        );
        let s: SecretBinding =
            "K@http://localhost:9000:header=X-Api-Key:format={}".parse().unwrap();
        assert_eq!((s.scheme, s.host.as_str(), s.port), (Scheme::Http, "localhost", 9000));
        assert_eq!((s.header.as_str(), s.format.as_str()), ("x-api-key", "{}"));
        let s: SecretBinding = "K@h.org:format=token: {}".parse().unwrap();
        assert_eq!(s.format, "token: {}");
        for bad in [
            "K",
            "@h.org",
            "K K@h.org",
            "K@h.org:format=none",
            "K@h.org:format={} {}",
            "K@h.org:size=1",
            "K@h.org:header=a b",
        ] {
            assert!(bad.parse::<SecretBinding>().is_err(), "{bad}");
        }
    }

    #[test]
    fn grants_must_fit_together() {
        let g = |allow: &[&str], lo: &[&str], sec: &[&str]| NetGrants {
            allow: allow.iter().map(|s| s.parse().unwrap()).collect(),
            loopback: lo.iter().map(|s| s.parse().unwrap()).collect(),
            secrets: sec.iter().map(|s| s.parse().unwrap()).collect(),
            ..NetGrants::default()
        };
        assert!(g(&["h.org"], &[], &["K@h.org"]).check().is_ok());
        assert!(g(&["h.org"], &[], &["K@other.org"]).check().is_err());
        assert!(
            g(&["http://localhost:9"], &["localhost:9"], &["K@http://localhost:9"]).check().is_ok()
        );
        assert!(
            g(&["http://h.org"], &[], &["K@http://h.org"])
                .check()
                .unwrap_err()
                .to_string()
                .contains("plain http")
        );
        assert!(g(&["h.org"], &["localhost:9"], &[]).check().is_err());
        assert!(g(&["h.org"], &[], &["K@h.org", "L@h.org"]).check().is_err());
        assert!(g(&["h.org"], &[], &["K@h.org", "L@h.org:header=x-key"]).check().is_ok());
    }
}
