//! Secret bindings: which secret keel fills into which header of requests to one destination,
//! and how (`Bearer`, basic, the value alone). A binding names the secret, never holds it.

use super::*;

/// A secret bound to one destination (`--secret NAME@[http://]HOST[:PORT][:header=H]
/// [:format=F]`): the egress hook writes header `H` as `F` with `{}` replaced by the value on
/// requests to exactly that (scheme, host, port), and substitutes the placeholder
/// `{{secret:NAME}}` there only.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SecretBinding {
    pub name: String,
    pub scheme: Scheme,
    pub host: String,
    pub port: u16,
    /// Lowercase header name.
    pub header: String,
    /// The header's value, with `{}` where the secret goes.
    pub format: String,
    /// Where the egress hook may fill in the placeholder `{{secret:NAME}}` (`:in=`; default:
    /// headers only, so the bound service never receives the credential as content it stores).
    #[serde(default)]
    pub fill: Fill,
}

/// The parts of a request a secret's placeholder may be filled into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fill {
    pub header: bool,
    /// The URL: path and query.
    pub query: bool,
    pub body: bool,
}

impl Default for Fill {
    fn default() -> Self {
        Self { header: true, query: false, body: false }
    }
}

impl fmt::Display for Fill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<&str> =
            [(self.header, "header"), (self.query, "query"), (self.body, "body")]
                .into_iter()
                .filter_map(|(on, name)| on.then_some(name))
                .collect();
        f.write_str(&parts.join(","))
    }
}

impl SecretBinding {
    pub fn binds(&self, scheme: Scheme, host: &str, port: u16) -> bool {
        self.scheme == scheme && self.port == port && self.host == host
    }

    /// The placeholder a guest writes where this secret goes.
    pub fn placeholder(&self) -> String {
        placeholder(&self.name)
    }
}

/// `{{secret:NAME}}`.
pub fn placeholder(name: &str) -> String {
    format!("{{{{secret:{name}}}}}")
}

impl FromStr for SecretBinding {
    type Err = NetGrantError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        const WHAT: &str = "secret grant";
        let syntax = || {
            err(
                WHAT,
                spec,
                "expected NAME@HOST[:PORT][:header=NAME][:in=header,query,body][:format=TEXT WITH {}], e.g. GITHUB_TOKEN@api.github.com",
            )
        };
        let (name, rest) = spec.split_once('@').ok_or_else(syntax)?;
        if !valid_secret_name(name) {
            return Err(err(WHAT, spec, "a secret name is 1 to 64 letters, digits, `_` or `-`"));
        }
        let (scheme, rest) = if let Some(r) = rest.strip_prefix("https://") {
            (Scheme::Https, r)
        } else if let Some(r) = rest.strip_prefix("http://") {
            (Scheme::Http, r)
        } else {
            (Scheme::Https, rest)
        };
        // The options come after the destination; `format=` takes the rest of the text (it
        // may hold `:`).
        let (dest, mut options) = match rest
            .find(":header=")
            .into_iter()
            .chain(rest.find(":format="))
            .chain(rest.find(":in="))
            .min()
        {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (host, port) = split_host_port(dest);
        let port = match port {
            Some(p) => parse_port(WHAT, spec, p)?,
            None => scheme.default_port(),
        };
        let host = normalise_host(host).ok_or_else(syntax)?;
        let (mut header, mut format) = ("authorization".to_string(), "Bearer {}".to_string());
        let mut fill = Fill::default();
        while !options.is_empty() {
            if let Some(f) = options.strip_prefix("format=") {
                format = f.to_string();
                break;
            }
            if let Some(places) = options.strip_prefix("in=") {
                let (places, next) = match places.find(':') {
                    Some(i) => (&places[..i], &places[i + 1..]),
                    None => (places, ""),
                };
                fill = Fill { header: false, query: false, body: false };
                for p in places.split(',') {
                    match p {
                        "header" => fill.header = true,
                        "query" => fill.query = true,
                        "body" => fill.body = true,
                        other => {
                            return Err(err(
                                WHAT,
                                spec,
                                format!(
                                    "`{other}` is not a place a placeholder is filled in: use in=header,query,body or a part of it"
                                ),
                            ));
                        }
                    }
                }
                options = next;
                continue;
            }
            let Some(h) = options.strip_prefix("header=") else { return Err(syntax()) };
            let (h, next) = match h.find(':') {
                Some(i) => (&h[..i], &h[i + 1..]),
                None => (h, ""),
            };
            if h.is_empty()
                || !h.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(err(WHAT, spec, format!("`{h}` is not a header name")));
            }
            header = h.to_ascii_lowercase();
            options = next;
        }
        if format.matches("{}").count() != 1 {
            return Err(err(
                WHAT,
                spec,
                "the format holds `{}` exactly once, where the secret goes",
            ));
        }
        if format.bytes().any(|b| b.is_ascii_control()) {
            return Err(err(WHAT, spec, "the format may not hold control characters"));
        }
        Ok(Self { name: name.to_string(), scheme, host, port, header, format, fill })
    }
}

impl fmt::Display for SecretBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}@{}://{}:{} (header {}: {}; placeholder in {})",
            self.name,
            self.scheme.as_str(),
            HostPattern::Exact(self.host.clone()),
            self.port,
            self.header,
            self.format,
            self.fill
        )
    }
}
