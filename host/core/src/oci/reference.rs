//! Registry references: `oci://REGISTRY/REPOSITORY:TAG`, `…@sha256:DIGEST`, or both (a tag
//! that must still name that digest).

use std::fmt;
use std::str::FromStr;

/// A registry reference: `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciRef {
    /// Host, and port if given (`ghcr.io`, `127.0.0.1:5000`).
    pub registry: String,
    /// The repository path (`acme/csv`).
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:` and 64 hex digits.
    pub digest: Option<String>,
}

/// Why a reference was refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{reference}` is not a registry reference ({problem}); write oci://REGISTRY/REPOSITORY:TAG or oci://REGISTRY/REPOSITORY@sha256:DIGEST"
)]
pub struct BadReference {
    pub reference: String,
    pub problem: String,
}

fn valid_repository(repo: &str) -> bool {
    // Path components of lowercase letters and digits, joined by `.`, `_`, `__` or runs of `-`.
    !repo.is_empty()
        && repo.len() <= 255
        && repo.split('/').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
                && !part.contains("..")
                && !part.contains("___")
        })
}

fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
}

/// Whether `digest` is `sha256:` and 64 lowercase hex digits.
pub fn valid_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64 && h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    })
}

fn valid_registry(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) if !n.ends_with(']') || host.starts_with('[') => (n, Some(p)),
        _ => (host, None),
    };
    let name_ok = if let Some(inner) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !name.is_empty()
            && name.len() <= 253
            && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-')
    };
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    // Without a `.`, a `:` or `localhost`, the first part is a repository path, not a host.
    name_ok && port_ok && (name.contains('.') || port.is_some() || name == "localhost")
}

impl FromStr for OciRef {
    type Err = BadReference;

    fn from_str(s: &str) -> Result<Self, BadReference> {
        let bad = |problem: &str| BadReference {
            reference: s.chars().take(200).collect(),
            problem: problem.to_string(),
        };
        let rest = s.strip_prefix("oci://").ok_or_else(|| bad("it does not start with oci://"))?;
        let (registry, path) =
            rest.split_once('/').ok_or_else(|| bad("there is no repository after the registry"))?;
        if !valid_registry(registry) {
            return Err(bad(
                "the registry must be a host name with a `.`, a port, or `localhost` (ghcr.io, \
                 127.0.0.1:5000)",
            ));
        }
        let (path, digest) = match path.split_once('@') {
            Some((p, d)) => (p, Some(d.to_string())),
            None => (path, None),
        };
        if let Some(d) = &digest
            && !valid_digest(d)
        {
            return Err(bad("the digest must be sha256: and 64 lowercase hex digits"));
        }
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) => (r, Some(t.to_string())),
            None => (path, None),
        };
        if !valid_repository(repository) {
            return Err(bad(
                "the repository must be lowercase letters and digits, joined by `.`, `_`, `-` \
                 or `/`",
            ));
        }
        if let Some(t) = &tag
            && !valid_tag(t)
        {
            return Err(bad("a tag is letters, digits, `_`, `.` and `-`, at most 128"));
        }
        if tag.is_none() && digest.is_none() {
            return Err(bad("it names neither a tag nor a digest"));
        }
        Ok(Self { registry: registry.to_string(), repository: repository.to_string(), tag, digest })
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl OciRef {
    /// The package a publisher's trust scope is matched against: `REGISTRY/REPOSITORY`.
    pub fn package(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The same repository, by `digest` alone.
    pub fn by_digest(&self, digest: &str) -> Self {
        Self { tag: None, digest: Some(digest.to_string()), ..self.clone() }
    }

    /// The same repository and tag, pinned to `digest`: names that digest, and only while
    /// the tag still names it.
    pub fn by_tag_and_digest(&self, digest: &str) -> Self {
        Self { digest: Some(digest.to_string()), ..self.clone() }
    }

    /// The same repository and tag, with no digest.
    pub fn by_tag(&self) -> Option<Self> {
        self.tag.as_ref().map(|_| Self { digest: None, ..self.clone() })
    }

    /// Whether the registry is on a loopback address (`localhost`, `127.0.0.0/8`, `::1`): the
    /// only registries spoken to over plain HTTP.
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() => h,
            _ => self.registry.as_str(),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    /// What a manifest request names: the digest when there is one, else the tag.
    pub(super) fn manifest_ref(&self) -> &str {
        self.digest.as_deref().or(self.tag.as_deref()).unwrap_or("latest")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_print_back() {
        for s in [
            "oci://127.0.0.1:5000/acme/csv:1.0.0",
            "oci://ghcr.io/acme/tools/csv:latest",
            "oci://localhost/x@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "oci://[::1]:5000/a-b/c_d:v1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            let r: OciRef = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(r.to_string(), s);
        }
        let r: OciRef = "oci://127.0.0.1:5000/acme/csv:1".parse().expect("parses");
        assert_eq!(r.package(), "127.0.0.1:5000/acme/csv");
        assert!(r.is_loopback());
        assert!(!"oci://ghcr.io/a:1".parse::<OciRef>().expect("parses").is_loopback());
        assert!("oci://[::1]:5/a:1".parse::<OciRef>().expect("parses").is_loopback());
        assert!(!"oci://127.example.com/a:1".parse::<OciRef>().expect("parses").is_loopback());
    }

    #[test]
    fn a_bad_reference_says_what_is_wrong() {
        for (s, why) in [
            ("ghcr.io/a:1", "oci://"),
            ("oci://ghcr.io", "no repository"),
            ("oci://acme/csv:1", "registry must be"),
            ("oci://ghcr.io/Acme:1", "repository must be"),
            ("oci://ghcr.io/a", "neither a tag"),
            ("oci://ghcr.io/a@sha256:xyz", "digest must be"),
            ("oci://ghcr.io/a:bad tag", "a tag is"),
            ("oci://ghcr.io/a/../b:1", "repository must be"),
            ("oci://ghcr.io:99999/a:1", "registry must be"),
        ] {
            let e = s.parse::<OciRef>().expect_err(s).to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
    }
}
