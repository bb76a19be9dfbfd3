//! Where keel keeps its state, and the rules that keep it keel's own.
//!
//! ```text
//! HOME/keel.db                               the SQLite store (catalog, sessions, events)
//! HOME/components/<sha256>.wasm              installed components, content-addressed
//! HOME/cache/<engine-hash>/<sha256>.cwasm    compiled artifacts (their digests are in keel.db)
//! HOME/secrets.age, HOME/secrets.key         the secrets broker's store and its key
//! ```
//! HOME is `--home DIR`, else `$KEEL_HOME`, else `$XDG_DATA_HOME/keel`, else
//! `~/.local/share/keel`.
//!
//! The home is private: created `0700`, every file keel writes in it `0600` (a home made by an
//! older keel, or by hand, is tightened when it is opened, with a notice). No tool ever
//! reaches it: a directory grant that contains the home, lies inside it, or contains the
//! secrets key is refused ([`Home::check_grant`]) wherever a grant is made and again at each
//! call.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The resolved paths of a keel home.
#[derive(Debug, Clone)]
pub struct Home {
    /// Canonical (links resolved), so grants — canonical too — compare with it as paths.
    root: PathBuf,
}

/// Permission bits a private directory and a private file have.
#[cfg(unix)]
const PRIVATE_DIR: u32 = 0o700;
#[cfg(unix)]
const PRIVATE_FILE: u32 = 0o600;

impl Home {
    /// The home at `root`, created (`0700`) if missing. An existing home whose directories or
    /// files others may read is tightened, with a warning that says what changed.
    pub fn at(root: impl Into<PathBuf>) -> std::io::Result<Self> {
        let root = root.into();
        create_private_dir(&root)?;
        let root = root.canonicalize()?;
        create_private_dir(&root.join("components"))?;
        create_private_dir(&root.join("cache"))?;
        let tightened = tighten(&root)?;
        if tightened > 0 {
            tracing::warn!(
                "the keel home {} was readable by other users: {tightened} file(s) and directories made private to you (0700 directories, 0600 files)",
                root.display()
            );
        }
        Ok(Self { root })
    }

    /// The default home (see the module docs), ignoring `--home`.
    pub fn default_root() -> PathBuf {
        Self::default_root_from().0
    }

    /// The default home and the variable it came from (`KEEL_HOME`, `XDG_DATA_HOME`, `HOME`;
    /// `default` for `.keel` when none is set).
    pub fn default_root_from() -> (PathBuf, &'static str) {
        if let Some(dir) = std::env::var_os("KEEL_HOME").filter(|d| !d.is_empty()) {
            return (PathBuf::from(dir), "KEEL_HOME");
        }
        if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
            return (PathBuf::from(dir).join("keel"), "XDG_DATA_HOME");
        }
        match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
            Some(home) => (PathBuf::from(home).join(".local").join("share").join("keel"), "HOME"),
            None => (PathBuf::from(".keel"), "default"),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn database(&self) -> PathBuf {
        self.root.join("keel.db")
    }

    pub fn cache_dir(&self) -> PathBuf {
        self.root.join("cache")
    }

    /// The secrets broker's key file.
    pub fn secrets_key(&self) -> PathBuf {
        self.root.join("secrets.key")
    }

    /// Where the component with `digest` is stored.
    pub fn component_path(&self, digest: &str) -> PathBuf {
        self.root.join("components").join(format!("{digest}.wasm"))
    }

    /// Refuses a grant of `dir` (a canonical host directory) that contains this home, lies
    /// inside it, or contains its secrets key: a tool given such a grant could read every
    /// secret, replace compiled code or rewrite `keel.toml`. The error names the home and how
    /// to move it.
    ///
    /// Paths are compared first, then **identities**: the directory `dir` opens to (no link
    /// followed) must be neither the home nor a directory inside it, nor one of the
    /// directories the home lies below — a second path to the same directory (a bind mount of
    /// the user's home, an NFS or autofs path, systemd's `BindPaths=`) is the same directory.
    /// A mount made *inside* the granted tree that leads into the home is not seen here; the
    /// filesystem guard refuses every object opened inside the home at its use
    /// ([`Boundary`]).
    pub fn check_grant(&self, dir: &Path) -> Result<(), String> {
        match self.boundary() {
            Ok(b) => self.check_grant_in(dir, &b),
            Err(_) => self.check_grant_in(dir, &Boundary::empty(self.root.clone())),
        }
    }

    /// [`Home::check_grant`] against identities already read.
    pub fn check_grant_in(&self, dir: &Path, boundary: &Boundary) -> Result<(), String> {
        let why = if dir.starts_with(&self.root) {
            "lies inside"
        } else if self.root.starts_with(dir) || self.secrets_key().starts_with(dir) {
            "contains"
        } else {
            match open_dir_id(dir) {
                Ok(id) if boundary.dirs.contains(&id) => "is (another path to) a directory inside",
                Ok(id) if boundary.above.contains(&id) => {
                    "is another path to a directory that contains"
                }
                _ => return Ok(()),
            }
        };
        Err(format!(
            "{} {why} keel's home {} (its database, secrets and compiled tools); no tool may reach it: grant another directory, or keep the home elsewhere with --home DIR or KEEL_HOME",
            dir.display(),
            self.root.display()
        ))
    }

    /// The identities of this home's directories and files, and of the directories it lies
    /// below, read now (see [`Boundary`]).
    pub fn boundary(&self) -> std::io::Result<Boundary> {
        let mut b = Boundary {
            root: self.root.clone(),
            dirs: HashSet::new(),
            files: HashSet::new(),
            above: HashSet::new(),
        };
        // The home's tree: a few directories (components, cache/<engine>, live) and the files
        // in them; bounded, so a home someone filled by hand cannot stall a call.
        let mut stack = vec![self.root.clone()];
        let mut seen = 0usize;
        while let Some(dir) = stack.pop() {
            let meta = std::fs::symlink_metadata(&dir)?;
            b.dirs.insert(FileId::of(&meta));
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for entry in entries.flatten() {
                seen += 1;
                if seen > MAX_HOME_ENTRIES {
                    break;
                }
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_dir() {
                    stack.push(entry.path());
                } else if meta.is_file() {
                    b.files.insert(FileId::of(&meta));
                }
            }
        }
        let mut up = self.root.parent();
        while let Some(dir) = up {
            if let Ok(meta) = std::fs::metadata(dir) {
                b.above.insert(FileId::of(&meta));
            }
            up = dir.parent();
        }
        Ok(b)
    }
}

/// Entries of a home read for its [`Boundary`] at most.
const MAX_HOME_ENTRIES: usize = 100_000;

/// The identity of a file or directory: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    #[cfg(unix)]
    pub fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self { dev: meta.dev(), ino: meta.ino() }
    }

    #[cfg(not(unix))]
    pub fn of(_meta: &std::fs::Metadata) -> Self {
        Self { dev: 0, ino: 0 }
    }
}

/// The identity of the directory at `path`.
fn open_dir_id(path: &Path) -> std::io::Result<FileId> {
    Ok(FileId::of(&std::fs::metadata(path)?))
}

/// What no grant may reach, by identity rather than by path: the home and every directory in
/// it, every file in it (the secrets key and store, the database, the configuration, the API
/// token, components and compiled code — a hard link to one is the same file), and the
/// directories the home lies below. Read afresh for each call (a home holds a few directories
/// and one file per component: tens of microseconds), so a file keel replaced since — the
/// secrets store is rewritten through a rename — is known by its new identity.
///
/// Why identities, checked at each object a tool opens, rather than a walk of the granted
/// tree: a walk is only as good as the moment it ran and is bounded by the tree's size; a
/// second path into the home (a bind mount made inside the tree, a hard link placed there)
/// can appear at any time. Every path a tool names is resolved to the directory that holds
/// its last component, and that directory's identity is compared here before the operation
/// runs; a directory or file the tool opens is compared once it is open.
#[derive(Debug, Clone)]
pub struct Boundary {
    root: PathBuf,
    dirs: HashSet<FileId>,
    files: HashSet<FileId>,
    above: HashSet<FileId>,
}

impl Boundary {
    fn empty(root: PathBuf) -> Self {
        Self { root, dirs: HashSet::new(), files: HashSet::new(), above: HashSet::new() }
    }

    /// Why a directory with identity `id` may not be used by a tool, if it may not.
    pub fn refuse_dir(&self, id: FileId) -> Option<String> {
        self.dirs.contains(&id).then(|| {
            format!(
                "it is keel's home {}, or a directory inside it, reached by another path",
                self.root.display()
            )
        })
    }

    /// Why a file with identity `id` may not be opened by a tool, if it may not.
    pub fn refuse_file(&self, id: FileId) -> Option<String> {
        self.files.contains(&id).then(|| {
            format!(
                "it is one of the files of keel's home {} (the secrets key, the secrets store, the database…), reached by another path or a hard link",
                self.root.display()
            )
        })
    }
}

/// Creates `dir` (and missing parents) with mode `0700`.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(PRIVATE_DIR);
    }
    b.create(dir)
}

/// Creates `path` empty with mode `0600` if it does not exist (so a file another library
/// creates there — SQLite's database, whose WAL and shared-memory files copy its mode — is
/// private from the start).
pub fn touch_private(path: &Path) -> std::io::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(PRIVATE_FILE);
    }
    opts.open(path).map(drop)
}

/// Writes `bytes` to `path` through a `0600` temporary file (synced) renamed into place.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(PRIVATE_FILE);
    }
    let mut f = opts.open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Makes the home and everything in it private (directories `0700`, files `0600`) when the
/// home directory itself is not; returns how many entries changed. Links are left alone.
#[cfg(unix)]
fn tighten(root: &Path) -> std::io::Result<usize> {
    use std::os::unix::fs::PermissionsExt;
    let loose = |m: &std::fs::Metadata| m.permissions().mode() & 0o077 != 0;
    let meta = std::fs::symlink_metadata(root)?;
    let top_level_loose = std::fs::read_dir(root)?.filter_map(Result::ok).any(|e| {
        !is_secrets_key(root, &e.path())
            && e.metadata().is_ok_and(|m| !m.file_type().is_symlink() && loose(&m))
    });
    if !loose(&meta) && !top_level_loose {
        return Ok(0);
    }
    let mut changed = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let meta = std::fs::symlink_metadata(&dir)?;
        if loose(&meta) {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(PRIVATE_DIR))?;
            changed += 1;
        }
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() && loose(&meta) && !is_secrets_key(root, &entry.path()) {
                std::fs::set_permissions(
                    entry.path(),
                    std::fs::Permissions::from_mode(PRIVATE_FILE),
                )?;
                changed += 1;
            }
        }
    }
    Ok(changed)
}

/// The secrets key is never tightened: a key others could read may have been read, and the
/// secrets broker refuses it until it is rotated (`keel secret rotate-key`).
#[cfg(unix)]
fn is_secrets_key(root: &Path, path: &Path) -> bool {
    path.parent() == Some(root) && path.file_name().is_some_and(|n| n == "secrets.key")
}

#[cfg(not(unix))]
fn tighten(_root: &Path) -> std::io::Result<usize> {
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_around_or_inside_the_home_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("a").join("keel")).unwrap();
        let root = home.root().to_path_buf();
        for refused in [root.clone(), root.join("cache"), root.parent().unwrap().to_path_buf()] {
            let e = home.check_grant(&refused).unwrap_err();
            assert!(e.contains(&root.display().to_string()) && e.contains("--home"), "{e}");
        }
        assert!(home.check_grant(Path::new("/")).is_err());
        // A sibling whose name starts like the home is not inside it.
        assert!(home.check_grant(&root.with_file_name("keel-data")).is_ok());
        assert!(home.check_grant(&dir.path().join("b")).is_ok());
    }

    #[cfg(unix)]
    #[test]
    fn a_loose_home_is_tightened_and_a_new_one_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        let home = Home::at(&root).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(home.root()), 0o700);
        assert_eq!(mode(&home.cache_dir()), 0o700);
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(root.join("keel.db"), "x").unwrap();
        std::fs::set_permissions(root.join("keel.db"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        std::fs::create_dir(root.join("cache").join("e")).unwrap();
        std::fs::set_permissions(
            root.join("cache").join("e"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        assert_eq!(tighten(&root).unwrap(), 3);
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("keel.db")), 0o600);
        assert_eq!(mode(&root.join("cache").join("e")), 0o700);
        assert_eq!(tighten(&root).unwrap(), 0);
        write_private(&root.join("f"), b"x").unwrap();
        assert_eq!(mode(&root.join("f")), 0o600);
    }
}
