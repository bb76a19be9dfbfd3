//! Directory grants: the only filesystem a tool can see.
//!
//! A grant mounts one host directory at one guest path, read-only or read-write. Grants are
//! validated when they are made (the host directory exists and is a directory; guest paths are
//! absolute, normalised and do not overlap), so the WASI context built from them is exactly
//! what the admin asked for.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

/// Access a grant gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Read files and list directories only.
    Ro,
    /// Also create, modify, rename and delete inside the directory.
    Rw,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ro => "ro",
            Self::Rw => "rw",
        })
    }
}

/// One host directory mounted into the guest.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Grant {
    /// Canonical host directory.
    pub host: PathBuf,
    /// Absolute guest path it is mounted at (e.g. `/data`).
    pub guest: String,
    pub access: Access,
}

/// Why a grant is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("grant `{spec}`: expected HOST_DIR[=GUEST_PATH][:ro|:rw], e.g. ./data=/data:ro")]
    Syntax { spec: String },
    #[error("grant `{spec}`: host directory {host} cannot be used: {reason}")]
    HostDir { spec: String, host: String, reason: String },
    #[error(
        "grant `{spec}`: guest path `{guest}` must be absolute and normalised (like /data), without `..`"
    )]
    GuestPath { spec: String, guest: String },
    #[error("grants `{a}` and `{b}` overlap at guest path `{guest}`; give each its own guest path")]
    Overlap { a: String, b: String, guest: String },
}

impl Grant {
    /// A grant of `host` at `guest`, validated.
    pub fn new(host: impl AsRef<Path>, guest: &str, access: Access) -> Result<Self, GrantError> {
        let spec = format!("{}={guest}:{access}", host.as_ref().display());
        Self::build(&spec, host.as_ref(), guest, access)
    }

    fn build(spec: &str, host: &Path, guest: &str, access: Access) -> Result<Self, GrantError> {
        let host_err = |reason: String| GrantError::HostDir {
            spec: spec.to_string(),
            host: host.display().to_string(),
            reason,
        };
        let canonical = host.canonicalize().map_err(|e| host_err(e.to_string()))?;
        if !canonical.is_dir() {
            return Err(host_err("not a directory".into()));
        }
        let guest = normalise_guest(guest)
            .ok_or_else(|| GrantError::GuestPath { spec: spec.to_string(), guest: guest.into() })?;
        Ok(Self { host: canonical, guest, access })
    }

    /// Checks that no two grants share or nest guest paths.
    pub fn check_disjoint(grants: &[Grant]) -> Result<(), GrantError> {
        for (i, a) in grants.iter().enumerate() {
            for b in &grants[i + 1..] {
                let nested = |x: &str, y: &str| {
                    x == y || x == "/" || y.strip_prefix(x).is_some_and(|r| r.starts_with('/'))
                };
                if nested(&a.guest, &b.guest) || nested(&b.guest, &a.guest) {
                    return Err(GrantError::Overlap {
                        a: a.to_string(),
                        b: b.to_string(),
                        guest: b.guest.clone(),
                    });
                }
            }
        }
        Ok(())
    }
}

impl Grant {
    /// A grant for a sub-session, narrowed from `parents` (its parent's grants): `spec` is
    /// `GUEST_PATH[:ro|:rw]` naming the same directory as one of them or one below it, with
    /// the same or weaker access (default: the parent's). The directory must exist and stay
    /// inside the parent's host directory once links are resolved. Never widens.
    pub fn narrow(parents: &[Grant], spec: &str) -> Result<Grant, String> {
        let (path, access) = match spec.rsplit_once(':') {
            Some((p, "ro")) => (p, Some(Access::Ro)),
            Some((p, "rw")) => (p, Some(Access::Rw)),
            _ => (spec, None),
        };
        let guest = normalise_guest(path).ok_or_else(|| {
            format!("grant `{spec}`: name an absolute guest path like /data/sub, without `..`, optionally with :ro or :rw")
        })?;
        let parent = parents
            .iter()
            .find(|g| {
                g.guest == guest
                    || g.guest == "/"
                    || guest.strip_prefix(g.guest.as_str()).is_some_and(|r| r.starts_with('/'))
            })
            .ok_or_else(|| {
                let mine: Vec<String> =
                    parents.iter().map(|g| format!("{}:{}", g.guest, g.access)).collect();
                format!(
                    "grant `{spec}` would widen this session's grants: `{guest}` is inside none of them ({})",
                    if mine.is_empty() { "it has none".to_string() } else { mine.join(", ") }
                )
            })?;
        let access = access.unwrap_or(parent.access);
        if access == Access::Rw && parent.access == Access::Ro {
            return Err(format!(
                "grant `{spec}` would widen this session's grants: `{}` is read-only here",
                parent.guest
            ));
        }
        let rel = guest.strip_prefix(parent.guest.as_str()).unwrap_or("").trim_start_matches('/');
        let host = if rel.is_empty() { parent.host.clone() } else { parent.host.join(rel) };
        let canonical = host
            .canonicalize()
            .map_err(|e| format!("grant `{spec}`: `{guest}` cannot be used: {e}"))?;
        if !canonical.starts_with(&parent.host) {
            return Err(format!(
                "grant `{spec}` would widen this session's grants: `{guest}` leads outside `{}` through a link",
                parent.guest
            ));
        }
        if !canonical.is_dir() {
            return Err(format!("grant `{spec}`: `{guest}` is not a directory"));
        }
        Ok(Grant { host: canonical, guest, access })
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}:{}", self.host.display(), self.guest, self.access)
    }
}

/// `/a/b` stays `/a/b`; `/a/./b/` becomes `/a/b`; relative paths and `..` are refused.
fn normalise_guest(guest: &str) -> Option<String> {
    let path = Path::new(guest);
    if !path.is_absolute() {
        return None;
    }
    let mut out = String::new();
    for part in path.components() {
        match part {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(p) => {
                out.push('/');
                out.push_str(p.to_str()?);
            }
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    Some(out)
}

impl FromStr for Grant {
    type Err = GrantError;

    /// Parses `HOST_DIR[=GUEST_PATH][:ro|:rw]`. The guest path defaults to `/` plus the host
    /// directory's name; access defaults to read-only.
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let syntax = || GrantError::Syntax { spec: spec.to_string() };
        let (rest, access) = if let Some(r) = spec.strip_suffix(":ro") {
            (r, Access::Ro)
        } else if let Some(r) = spec.strip_suffix(":rw") {
            (r, Access::Rw)
        } else {
            (spec, Access::Ro)
        };
        let (host, guest) = match rest.split_once('=') {
            Some((h, g)) => (h, g.to_string()),
            None => {
                let canonical =
                    Path::new(rest).canonicalize().map_err(|e| GrantError::HostDir {
                        spec: spec.to_string(),
                        host: rest.to_string(),
                        reason: e.to_string(),
                    })?;
                let name = canonical.file_name().and_then(|n| n.to_str()).ok_or_else(syntax)?;
                (rest, format!("/{name}"))
            }
        };
        if host.is_empty() || guest.is_empty() {
            return Err(syntax());
        }
        Self::build(spec, Path::new(host), &guest, access)
    }
}
