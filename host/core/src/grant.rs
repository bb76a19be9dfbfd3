//! Directory grants: the only filesystem a tool can see.
//!
//! A grant mounts one host directory at one guest path, read-only or read-write. Grants are
//! validated when they are made (the host directory exists and is a directory; guest paths are
//! absolute, normalised and do not overlap), so the WASI context built from them is exactly
//! what the admin asked for.
//!
//! A grant is a **directory**, not a path: it records the identity (device and inode) of the
//! directory it named when it was given, and every use opens it again without following any
//! link ([`Grant::open`]) and refuses to go on if what it opens is another directory
//! ([`GrantMoved`]). A sub-session's grant is opened from its ancestor's directory handle, one
//! component at a time, never from an ambient path: a link a tool planted inside the
//! parent's grant cannot lead the child out.

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
    /// The directory's identity when the grant was given (`None` only for grants stored by an
    /// older keel, which are opened without following links but not compared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<DirId>,
    /// For a sub-session's grant: the top-level grant it was narrowed from, which it is opened
    /// through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<Within>,
}

/// The identity of a directory: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DirId {
    pub dev: u64,
    pub ino: u64,
}

/// Where a narrowed grant lives: the top-level granted directory (its canonical path and
/// identity) and the path below it, opened one component at a time without following links.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Within {
    pub host: PathBuf,
    pub id: Option<DirId>,
    pub rel: String,
}

/// A grant whose directory is no longer the one it named when it was given: it was replaced
/// by a link, moved, or removed. The call is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "grant_moved: the grant `{grant}` no longer opens to the directory it was given for ({why}); nothing was run — grant the directory again"
)]
pub struct GrantMoved {
    pub grant: String,
    pub why: String,
}

/// A grant that cannot be used for a call: its directory moved, it lies on a filesystem no
/// tool may see, or it could not be opened (the process is out of descriptors, say — said as
/// what it is, never as a move).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantUnusable {
    #[error(transparent)]
    Moved(#[from] GrantMoved),
    #[error("the grant `{grant}` {}", pseudo_reason(fs))]
    Pseudo { grant: String, fs: &'static str },
    #[error("the grant `{grant}` could not be opened: {error}; nothing was run")]
    Unopened { grant: String, error: String, exhausted: bool },
}

impl GrantUnusable {
    /// The failure kind of a call refused for it (one of `FailureKind`'s names).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Moved(_) => "grant_moved",
            Self::Pseudo { .. } => "grant",
            Self::Unopened { exhausted: true, .. } => "busy",
            Self::Unopened { .. } => "io",
        }
    }
}

/// Why a directory on the pseudo-filesystem `fs` is never granted.
fn pseudo_reason(fs: &str) -> String {
    format!(
        "is on a `{fs}` filesystem, which shows processes (keel's own memory and environment among them), the kernel or devices; no tool may be granted it"
    )
}

/// A grant `grant` that could not be opened for `e` (after `context`), said as it is.
fn unopened(grant: &Grant, context: &str, e: &std::io::Error) -> GrantUnusable {
    let exhausted = out_of_descriptors(e);
    let left = if exhausted { " — keel's process has no file descriptor left" } else { "" };
    GrantUnusable::Unopened {
        grant: grant.to_string(),
        exhausted,
        error: format!("{context}{e}{left}"),
    }
}

/// Whether an error is the process (or the system) running out of file descriptors.
pub fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(EMFILE | ENFILE))
}

/// `EMFILE` and `ENFILE`: too many open files in the process, in the system.
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;

/// The kind of pseudo-filesystem the open directory `dir` is on, when it is one that exposes
/// processes (`/proc`: every process's memory, environment, open files), the kernel or
/// devices — told by the filesystem's type, not by its path, so a bind mount of `/proc`
/// elsewhere is known too. (`devtmpfs` reports the type of `tmpfs` and cannot be told apart;
/// its device nodes are refused one by one when a tool opens them.)
#[cfg(target_os = "linux")]
pub fn pseudo_fs(dir: impl std::os::fd::AsFd) -> Option<&'static str> {
    let st = rustix::fs::fstatfs(dir).ok()?;
    Some(match (st.f_type as u64) & 0xffff_ffff {
        0x9fa0 => "proc",
        0x6265_6572 => "sysfs",
        0x6462_6720 => "debugfs",
        0x7472_6163 => "tracefs",
        0x7363_6673 => "securityfs",
        0x0027_e0eb => "cgroup",
        0x6367_7270 => "cgroup2",
        0xcafe_4a11 => "bpf",
        0x6265_6570 => "configfs",
        0x6165_676c => "pstore",
        0xde5e_81e4 => "efivarfs",
        0x1cd1 => "devpts",
        0x1980_0202 => "mqueue",
        0x6573_5543 => "fusectl",
        0x4249_4e4d => "binfmt_misc",
        0xf97c_ff8c => "selinuxfs",
        0x4341_5d53 => "smackfs",
        0x6e73_6673 => "nsfs",
        _ => return None,
    })
}

#[cfg(not(target_os = "linux"))]
pub fn pseudo_fs<T>(_dir: T) -> Option<&'static str> {
    None
}

/// Opens `path` — absolute, or below `base` — in one `openat2` that follows no link
/// (`RESOLVE_NO_SYMLINKS`, and `RESOLVE_BENEATH` below a base). `None` where the kernel has no
/// `openat2`: the caller walks the path a component at a time instead.
#[cfg(target_os = "linux")]
fn open_strict(
    base: Option<&cap_std::fs::Dir>,
    path: &Path,
) -> Option<std::io::Result<cap_std::fs::Dir>> {
    use rustix::fs::{Mode, OFlags, ResolveFlags, openat2};
    // No O_NOFOLLOW: RESOLVE_NO_SYMLINKS refuses a link in any component, the last one too,
    // with ELOOP (O_NOFOLLOW would say ENOTDIR for a last one).
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let opened = match base {
        Some(dir) => openat2(dir, path, flags, Mode::empty(), resolve | ResolveFlags::BENEATH),
        None => openat2(rustix::fs::CWD, path, flags, Mode::empty(), resolve),
    };
    match opened {
        Ok(fd) => Some(Ok(cap_std::fs::Dir::from_std_file(std::fs::File::from(fd)))),
        Err(e) if e == rustix::io::Errno::NOSYS => None,
        Err(e) => Some(Err(e.into())),
    }
}

#[cfg(not(target_os = "linux"))]
fn open_strict(
    _base: Option<&cap_std::fs::Dir>,
    _path: &Path,
) -> Option<std::io::Result<cap_std::fs::Dir>> {
    None
}

/// Opens `path` (absolute) from the root following no link.
fn open_no_links(path: &Path) -> std::io::Result<cap_std::fs::Dir> {
    use cap_fs_ext::DirExt;
    if let Some(opened) = open_strict(None, path) {
        return opened;
    }
    let mut dir = cap_std::fs::Dir::open_ambient_dir("/", cap_std::ambient_authority())?;
    for part in path.components() {
        match part {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => dir = dir.open_dir_nofollow(name)?,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(std::io::Error::other("the path is not canonical"));
            }
        }
    }
    Ok(dir)
}

/// Opens `rel` below `dir` following no link.
fn open_below(dir: &cap_std::fs::Dir, rel: &str) -> std::io::Result<cap_std::fs::Dir> {
    use cap_fs_ext::DirExt;
    if rel.split('/').any(|p| p == "..") {
        return Err(std::io::Error::other("`..` in a grant"));
    }
    if !rel.is_empty()
        && let Some(opened) = open_strict(Some(dir), Path::new(rel))
    {
        return opened;
    }
    let mut out = dir.try_clone()?;
    for name in rel.split('/').filter(|p| !p.is_empty() && *p != ".") {
        out = match out.open_dir_nofollow(name) {
            Ok(d) => d,
            // Said as a link (ELOOP) whatever the platform reports for one.
            Err(_) if out.symlink_metadata(name).is_ok_and(|m| m.file_type().is_symlink()) => {
                return Err(std::io::Error::from_raw_os_error(ELOOP));
            }
            Err(e) => return Err(e),
        };
    }
    Ok(out)
}

/// The error number of a link where a directory was expected (`ELOOP`).
const ELOOP: i32 = 40;
/// The error number of a file where a directory was expected (`ENOTDIR`).
const ENOTDIR: i32 = 20;
/// The error number of a missing component (`ENOENT`).
const ENOENT: i32 = 2;

/// The identity of an open directory.
pub fn dir_id(dir: &cap_std::fs::Dir) -> std::io::Result<DirId> {
    use cap_std::fs::MetadataExt;
    let m = dir.dir_metadata()?;
    Ok(DirId { dev: m.dev(), ino: m.ino() })
}

/// Why opening a grant failed, in words: a link or a missing component is the common case.
fn open_failure(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(ELOOP) => "a component of its path is now a symbolic link".into(),
        Some(ENOTDIR) => "a component of its path is no longer a directory".into(),
        Some(ENOENT) => "it no longer exists at its path".into(),
        _ => e.to_string(),
    }
}

/// A grant opened for one call: its directory handle (identity checked) beside what it
/// grants. Everything a call does in the directory — the guest's WASI, the change set — goes
/// through this handle, never through the path again.
#[derive(Debug, Clone)]
pub struct Opened {
    pub grant: Grant,
    pub dir: std::sync::Arc<cap_std::fs::Dir>,
}

impl std::ops::Deref for Opened {
    type Target = Grant;

    fn deref(&self) -> &Grant {
        &self.grant
    }
}

impl Grant {
    /// [`Grant::open`], kept with the grant.
    pub fn opened(&self) -> Result<Opened, GrantUnusable> {
        Ok(Opened { grant: self.clone(), dir: std::sync::Arc::new(self.open()?) })
    }

    /// Opens the granted directory for one use: its path walked without following any link
    /// (through the top-level grant's handle for a narrowed grant), then its identity compared
    /// with the one recorded when it was given, and its filesystem checked (no pseudo-
    /// filesystem: [`pseudo_fs`]).
    pub fn open(&self) -> Result<cap_std::fs::Dir, GrantUnusable> {
        let moved = |why: String| GrantMoved { grant: self.to_string(), why };
        // A missing component or a link is a move; anything else (out of descriptors, no
        // permission) is said as it is.
        let failed = |e: std::io::Error, context: &str| -> GrantUnusable {
            match e.raw_os_error() {
                Some(ELOOP | ENOTDIR | ENOENT) => {
                    moved(format!("{context}{}", open_failure(&e))).into()
                }
                _ => unopened(self, context, &e),
            }
        };
        let check = |dir: &cap_std::fs::Dir, want: Option<DirId>, what: &str| match want {
            None => Ok(()),
            Some(want) => match dir_id(dir) {
                Ok(found) if found == want => Ok(()),
                Ok(_) => {
                    Err(GrantUnusable::from(moved(format!("{what} is another directory now"))))
                }
                Err(e) => Err(failed(e, "")),
            },
        };
        let dir = match &self.within {
            None => {
                let dir = open_no_links(&self.host).map_err(|e| failed(e, ""))?;
                check(&dir, self.id, "its path")?;
                dir
            }
            Some(w) => {
                let top = open_no_links(&w.host)
                    .map_err(|e| failed(e, "the directory it was narrowed from: "))?;
                check(&top, w.id, "the directory it was narrowed from")?;
                let dir = open_below(&top, &w.rel).map_err(|e| failed(e, ""))?;
                check(&dir, self.id, "its path")?;
                dir
            }
        };
        if let Some(fs) = pseudo_fs(&dir) {
            return Err(GrantUnusable::Pseudo { grant: self.to_string(), fs });
        }
        Ok(dir)
    }

    /// This grant with the identity of the directory it names now (for a grant stored without
    /// one, or made from a preset stored without one).
    pub fn bound(mut self) -> Result<Self, GrantUnusable> {
        if self.id.is_none() {
            let dir = self.open()?;
            self.id = Some(dir_id(&dir).map_err(|e| unopened(&self, "", &e))?);
        }
        Ok(self)
    }
}

/// Why a grant is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("grant `{spec}`: expected HOST_DIR[=GUEST_PATH][:ro|:rw], e.g. ./data=/data:ro")]
    Syntax { spec: String },
    #[error(
        "grant `{spec}`: `:{suffix}` is not an access: use `:ro` (read-only, the default) or \
         `:rw` (read-write)"
    )]
    Access { spec: String, suffix: String },
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
        let dir = open_no_links(&canonical).map_err(|e| host_err(e.to_string()))?;
        if let Some(fs) = pseudo_fs(&dir) {
            return Err(host_err(format!("it {}", pseudo_reason(fs))));
        }
        let id = Some(dir_id(&dir).map_err(|e| host_err(e.to_string()))?);
        Ok(Self { host: canonical, guest, access, id, within: None })
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
        // Opened from the parent's directory, one component at a time, following no link: a
        // link inside the parent's grant never leads the child anywhere.
        let parent_dir = parent.open().map_err(|e| format!("grant `{spec}`: {e}"))?;
        let dir = open_below(&parent_dir, rel).map_err(|e| match e.raw_os_error() {
            Some(ELOOP) => format!(
                "grant `{spec}` would widen this session's grants: `{guest}` is reached through a link in `{}`, and a sub-session's grant follows no link (one can lead anywhere)",
                parent.guest
            ),
            Some(ENOTDIR) => format!("grant `{spec}`: `{guest}` is not a directory"),
            _ => format!("grant `{spec}`: `{guest}` cannot be used: {e}"),
        })?;
        if let Some(fs) = pseudo_fs(&dir) {
            return Err(format!("grant `{spec}`: `{guest}` {}", pseudo_reason(fs)));
        }
        let id = Some(dir_id(&dir).map_err(|e| format!("grant `{spec}`: {e}"))?);
        let host = if rel.is_empty() { parent.host.clone() } else { parent.host.join(rel) };
        let within = match &parent.within {
            None => Within { host: parent.host.clone(), id: parent.id, rel: rel.to_string() },
            Some(w) => Within {
                host: w.host.clone(),
                id: w.id,
                rel: [w.rel.as_str(), rel]
                    .iter()
                    .filter(|p| !p.is_empty())
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("/"),
            },
        };
        let within = (!within.rel.is_empty() || parent.within.is_some()).then_some(within);
        Ok(Grant { host, guest, access, id, within })
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
            // A last `:word` (no `/` in it) is an access that is neither `ro` nor `rw`: refused,
            // not taken as part of the path (`/data:rx` is a typo, not a directory).
            if let Some((_, suffix)) = spec.rsplit_once(':')
                && !suffix.contains('/')
                && suffix.len() <= 16
            {
                let suffix = suffix.to_string();
                return Err(GrantError::Access { spec: spec.to_string(), suffix });
            }
            (spec, Access::Ro)
        };
        let (host, guest) = match rest.split_once('=') {
            Some((h, g)) => (h, g.to_string()),
            None => {
                let canonical = Path::new(rest).canonicalize().map_err(|e| {
                    // `tests/data:/data` is Docker's way of writing a grant: say keel's.
                    let hint = rest
                        .rsplit_once(':')
                        .filter(|(h, g)| !h.is_empty() && g.starts_with('/'))
                        .map(|(h, g)| {
                            let access = spec[rest.len()..].to_string();
                            format!(
                                " (a grant is HOST_DIR=GUEST_PATH: did you mean `{h}={g}{access}`?)"
                            )
                        })
                        .unwrap_or_default();
                    GrantError::HostDir {
                        spec: spec.to_string(),
                        host: rest.to_string(),
                        reason: format!("{e}{hint}"),
                    }
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
