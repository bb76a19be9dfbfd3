//! File-change reconciliation: what a call created, modified and deleted in its writable
//! grants.
//!
//! The host walks each read-write grant before and after the call through `cap-std`, from a
//! directory handle of the grant: it never follows a symlink (links are recorded as links, by
//! their target text), never leaves the grant, and stops at [`MAX_ENTRIES`] entries. Created
//! and modified files are hashed (sha256) after the call.

use std::collections::BTreeMap;
use std::io::Read;

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};
use sha2::{Digest, Sha256};

use crate::sandbox::{Access, Grant};

/// Entries walked per grant at most; past it the change set is marked incomplete.
pub const MAX_ENTRIES: usize = 100_000;
/// Directory depth walked at most.
pub const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Meta {
    kind: Kind,
    size: u64,
    mtime_ns: i128,
    ino: u64,
}

/// A snapshot of the writable grants' metadata.
#[derive(Debug, Default)]
pub struct Snapshot {
    entries: BTreeMap<String, Meta>,
    complete: bool,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Change {
    /// Guest path (as the tool saw it).
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: &'static str,
    /// Size after the call (before, for deletions).
    pub size: u64,
    /// sha256 of the new content (created/modified regular files only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// What a call changed in its writable grants.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ChangeSet {
    pub created: Vec<Change>,
    pub modified: Vec<Change>,
    pub deleted: Vec<Change>,
    /// False when a walk stopped at its bound; the lists may then miss changes.
    pub complete: bool,
}

impl ChangeSet {
    pub fn is_empty(&self) -> bool {
        self.created.is_empty() && self.modified.is_empty() && self.deleted.is_empty()
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::File => "file",
        Kind::Dir => "dir",
        Kind::Symlink => "symlink",
        Kind::Other => "other",
    }
}

/// Walks every read-write grant.
pub fn snapshot(grants: &[Grant]) -> Snapshot {
    let mut snap = Snapshot { entries: BTreeMap::new(), complete: true };
    for g in grants.iter().filter(|g| g.access == Access::Rw) {
        match Dir::open_ambient_dir(&g.host, ambient_authority()) {
            Ok(dir) => walk(&dir, &g.guest, 0, &mut snap),
            Err(_) => snap.complete = false,
        }
    }
    snap
}

fn walk(dir: &Dir, guest: &str, depth: usize, snap: &mut Snapshot) {
    let Ok(entries) = dir.entries() else {
        snap.complete = false;
        return;
    };
    for entry in entries.flatten() {
        if snap.entries.len() >= MAX_ENTRIES {
            snap.complete = false;
            return;
        }
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            snap.complete = false;
            continue;
        };
        // `DirEntry::metadata` does not follow symlinks.
        let Ok(meta) = entry.metadata() else { continue };
        let ft = meta.file_type();
        let kind = if ft.is_symlink() {
            Kind::Symlink
        } else if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else {
            Kind::Other
        };
        let path = if guest == "/" { format!("/{name}") } else { format!("{guest}/{name}") };
        let mtime_ns = meta
            .modified()
            .ok()
            .and_then(|t| t.into_std().duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        let ino = {
            use cap_std::fs::MetadataExt;
            meta.ino()
        };
        snap.entries.insert(path.clone(), Meta { kind, size: meta.len(), mtime_ns, ino });
        if kind == Kind::Dir {
            if depth + 1 >= MAX_DEPTH {
                snap.complete = false;
                continue;
            }
            if let Ok(sub) = dir.open_dir_nofollow(&name) {
                walk(&sub, &path, depth + 1, snap);
            }
        }
    }
}

/// Compares two snapshots and hashes what was created or modified.
pub fn diff(before: &Snapshot, after: &Snapshot, grants: &[Grant]) -> ChangeSet {
    let mut set = ChangeSet { complete: before.complete && after.complete, ..Default::default() };
    for (path, m) in &after.entries {
        let change = |with_hash: bool| Change {
            path: path.clone(),
            kind: kind_name(m.kind),
            size: m.size,
            sha256: if with_hash && m.kind == Kind::File { hash(grants, path) } else { None },
        };
        match before.entries.get(path) {
            None => set.created.push(change(true)),
            Some(old) if old.kind != m.kind => {
                set.deleted.push(Change {
                    path: path.clone(),
                    kind: kind_name(old.kind),
                    size: old.size,
                    sha256: None,
                });
                set.created.push(change(true));
            }
            Some(old) if m.kind != Kind::Dir && old != m => set.modified.push(change(true)),
            Some(_) => {}
        }
    }
    for (path, m) in &before.entries {
        if !after.entries.contains_key(path) {
            set.deleted.push(Change {
                path: path.clone(),
                kind: kind_name(m.kind),
                size: m.size,
                sha256: None,
            });
        }
    }
    set
}

/// sha256 of the regular file at guest `path`, opened inside its grant without following
/// symlinks.
fn hash(grants: &[Grant], path: &str) -> Option<String> {
    let g = grants.iter().filter(|g| g.access == Access::Rw).find(|g| {
        g.guest == "/" || path.strip_prefix(&g.guest).is_some_and(|r| r.starts_with('/'))
    })?;
    let rel = if g.guest == "/" { &path[1..] } else { &path[g.guest.len() + 1..] };
    let dir = Dir::open_ambient_dir(&g.host, ambient_authority()).ok()?;
    let mut opts = OpenOptions::new();
    opts.read(true).follow(FollowSymlinks::No);
    let mut file = dir.open_with(rel, &opts).ok()?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Some(hex::encode(hasher.finalize()))
}
