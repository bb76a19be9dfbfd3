//! File-change reconciliation: what a call created, modified and deleted in its writable
//! grants.
//!
//! The host walks each read-write grant before and after the call through `cap-std`, from a
//! directory handle of the grant: it never follows a symlink (links are recorded as links, by
//! their target text), never leaves the grant, and stops at [`MAX_ENTRIES`] entries. A file
//! counts as modified when its size, inode, modification time **or status-change time**
//! differs: a guest can set a file's modification time back, but setting it moves the
//! status-change time, which no guest can set. Created and modified files are hashed (sha256)
//! after the call within [`MAX_HASH_BYTES`] per change set; a file past that bound is
//! reported by size, inode and status-change time with `hashed: false`.
//!
//! The walk and the hashing are blocking work. A small workspace is walked (and a little
//! hashed) where the call is — [`INLINE_ENTRIES`] entries and [`INLINE_HASH_BYTES`] bytes at
//! most, as bounded as a guest's own file I/O, which also runs on the calling thread; past
//! those bounds the work moves off the async threads ([`snapshot_inline`] says when). Both
//! stop when the call's [`CancelToken`] fires, and the change set then says it is incomplete.

use std::collections::BTreeMap;
use std::io::Read;

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use sha2::{Digest, Sha256};

use crate::grant::Opened;
use crate::sandbox::{Captured, PreImages};
use crate::sandbox::{Access, CancelToken};

/// Entries walked per grant at most; past it the change set is marked incomplete.
pub const MAX_ENTRIES: usize = 100_000;
/// Directory depth walked at most.
pub const MAX_DEPTH: usize = 64;
/// Entries a walk may visit on the calling thread before it is redone off the async threads.
pub const INLINE_ENTRIES: usize = 1024;
/// Bytes a change set may hash on the calling thread; more is hashed off the async threads.
pub const INLINE_HASH_BYTES: u64 = 1 << 20;
/// Bytes hashed per change set at most; files past it are listed unhashed.
pub const MAX_HASH_BYTES: u64 = 64 << 20;

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
    ctime_ns: i64,
    ino: u64,
    dev: u64,
}

/// A snapshot of the writable grants' metadata.
#[derive(Debug, Default)]
pub struct Snapshot {
    entries: BTreeMap<String, Meta>,
    complete: bool,
    /// The walk stopped at the entry bound it was given.
    at_bound: bool,
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
    /// Set on a created or modified file that was not hashed (too large for what was left
    /// of [`MAX_HASH_BYTES`], unreadable, or the work was cancelled): the file is then known
    /// by its size, `inode` and `ctime_ns`.
    #[serde(skip_serializing_if = "is_true")]
    pub hashed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inode: Option<u64>,
    /// Status-change time, in nanoseconds since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ctime_ns: Option<i64>,
    /// A modified or deleted file's content before the call, by sha256 (kept in the store: the
    /// call can be undone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_sha256: Option<String>,
    /// A modified or deleted file's permission bits before the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_mode: Option<u32>,
    /// A modified or deleted link's target before the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_link: Option<String>,
    /// Why what this change replaced was not kept (over a bound, unreadable, not seen): it
    /// cannot be undone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_restorable: Option<String>,
}

fn is_true(b: &bool) -> bool {
    *b
}

impl Change {
    fn plain(path: &str, kind: Kind, size: u64) -> Self {
        Self {
            path: path.to_string(),
            kind: kind_name(kind),
            size,
            sha256: None,
            hashed: true,
            inode: None,
            ctime_ns: None,
            before_sha256: None,
            before_mode: None,
            before_link: None,
            not_restorable: None,
        }
    }
}

/// The pre-images a change set refers to, to keep with its journal entry, and the bound of
/// the session's pre-images they are kept within (`[undo] max_session`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    pub blobs: Vec<KeptBytes>,
    pub session_bound: u64,
}

/// The bytes of a pre-image a change set refers to by `sha256`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptBytes {
    pub sha256: String,
    pub bytes: std::sync::Arc<Vec<u8>>,
}

/// What a call changed in its writable grants.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ChangeSet {
    pub created: Vec<Change>,
    pub modified: Vec<Change>,
    pub deleted: Vec<Change>,
    /// False when a walk stopped at its bound or was cancelled; the lists may then miss
    /// changes.
    pub complete: bool,
    /// The pre-images the changes refer to, each once, to keep with the call's journal entry.
    #[serde(skip)]
    pub kept: Kept,
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

/// Walks every read-write grant (blocking; stops early, incomplete, when `cancel` fires).
pub fn snapshot(grants: &[Opened], cancel: Option<&CancelToken>) -> Snapshot {
    walk_grants(grants, cancel, MAX_ENTRIES)
}

/// Walks every read-write grant if it holds at most [`INLINE_ENTRIES`] entries; `None` when
/// it holds more (walk it with [`snapshot`], off the async threads).
pub fn snapshot_inline(grants: &[Opened], cancel: Option<&CancelToken>) -> Option<Snapshot> {
    let snap = walk_grants(grants, cancel, INLINE_ENTRIES);
    (!snap.at_bound).then_some(snap)
}

/// Bytes [`diff`] would hash for these snapshots (the files created or modified).
pub fn bytes_to_hash(before: &Snapshot, after: &Snapshot) -> u64 {
    after
        .entries
        .iter()
        .filter(|(path, m)| m.kind == Kind::File && before.entries.get(*path) != Some(m))
        .map(|(_, m)| m.size)
        .fold(0u64, u64::saturating_add)
}

fn walk_grants(grants: &[Opened], cancel: Option<&CancelToken>, bound: usize) -> Snapshot {
    let mut snap = Snapshot { entries: BTreeMap::new(), complete: true, at_bound: false };
    for g in grants.iter().filter(|g| g.access == Access::Rw) {
        walk(&g.dir, &g.guest, 0, &mut snap, cancel, bound);
    }
    snap
}

fn cancelled(cancel: Option<&CancelToken>) -> bool {
    cancel.is_some_and(CancelToken::is_cancelled)
}

fn walk(
    dir: &Dir,
    guest: &str,
    depth: usize,
    snap: &mut Snapshot,
    cancel: Option<&CancelToken>,
    bound: usize,
) {
    let Ok(entries) = dir.entries() else {
        snap.complete = false;
        return;
    };
    for entry in entries.flatten() {
        if snap.entries.len() >= bound || cancelled(cancel) {
            snap.at_bound |= snap.entries.len() >= bound;
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
        let (ino, dev, ctime_ns) = {
            use cap_std::fs::MetadataExt;
            (
                meta.ino(),
                meta.dev(),
                meta.ctime().saturating_mul(1_000_000_000).saturating_add(meta.ctime_nsec()),
            )
        };
        let meta = Meta { kind, size: meta.len(), mtime_ns, ctime_ns, ino, dev };
        snap.entries.insert(path.clone(), meta);
        if kind == Kind::Dir {
            if depth + 1 >= MAX_DEPTH {
                snap.complete = false;
                continue;
            }
            if let Ok(sub) = dir.open_dir_nofollow(&name) {
                walk(&sub, &path, depth + 1, snap, cancel, bound);
            }
        }
    }
}

/// Compares two snapshots and hashes what was created or modified, within
/// [`MAX_HASH_BYTES`] (blocking; stops hashing when `cancel` fires).
pub fn diff(
    before: &Snapshot,
    after: &Snapshot,
    grants: &[Opened],
    cancel: Option<&CancelToken>,
) -> ChangeSet {
    let mut set = ChangeSet { complete: before.complete && after.complete, ..Default::default() };
    let mut hash_left = MAX_HASH_BYTES;
    for (path, m) in &after.entries {
        let mut change = |set: &mut ChangeSet| {
            let mut c = Change::plain(path, m.kind, m.size);
            if m.kind != Kind::File {
                return c;
            }
            c.sha256 = if m.size <= hash_left && !cancelled(cancel) {
                hash(grants, path, m.size, cancel)
            } else {
                None
            };
            match &c.sha256 {
                Some(_) => hash_left -= m.size,
                None => {
                    if cancelled(cancel) {
                        set.complete = false;
                    }
                    c.hashed = false;
                    c.inode = Some(m.ino);
                    c.ctime_ns = Some(m.ctime_ns);
                }
            }
            c
        };
        match before.entries.get(path) {
            None => {
                let c = change(&mut set);
                set.created.push(c);
            }
            Some(old) if old.kind != m.kind => {
                set.deleted.push(Change::plain(path, old.kind, old.size));
                let c = change(&mut set);
                set.created.push(c);
            }
            Some(old) if m.kind != Kind::Dir && old != m => {
                let c = change(&mut set);
                set.modified.push(c);
            }
            Some(_) => {}
        }
    }
    for (path, m) in &before.entries {
        if !after.entries.contains_key(path) {
            set.deleted.push(Change::plain(path, m.kind, m.size));
        }
    }
    set
}

/// Marks each file and link the call modified or deleted with what it replaced: the
/// pre-image the sandbox kept of the object that was at its path when the call began
/// (`before_sha256`, `before_mode`, `before_link`, the bytes in `kept`), or why it cannot be
/// undone.
pub fn attach_preimages(
    set: &mut ChangeSet,
    before: &Snapshot,
    images: &PreImages,
    session_bound: u64,
) {
    let mut kept: Vec<KeptBytes> = Vec::new();
    for c in set.modified.iter_mut().chain(set.deleted.iter_mut()) {
        if !matches!(c.kind, "file" | "symlink") {
            continue;
        }
        let Some(m) = before.entries.get(&c.path) else { continue };
        match images.of(m.dev, m.ino) {
            Some(Captured::File { bytes, mode }) => {
                let sha = hex::encode(Sha256::digest(bytes.as_slice()));
                if !kept.iter().any(|k| k.sha256 == sha) {
                    kept.push(KeptBytes { sha256: sha.clone(), bytes: bytes.clone() });
                }
                c.before_sha256 = Some(sha);
                c.before_mode = Some(*mode);
            }
            Some(Captured::Link { target }) => c.before_link = Some(target.clone()),
            Some(Captured::NotKept { reason }) => c.not_restorable = Some(reason.clone()),
            None => {
                c.not_restorable =
                    Some("nothing was kept of it: the change was not seen as it was made".into())
            }
        }
    }
    set.kept = Kept { blobs: kept, session_bound };
}

/// sha256 of the regular file at guest `path`, opened inside its grant without following
/// symlinks; `None` when it cannot be read whole, holds more than `size` bytes (it grew since
/// the walk), or the work is cancelled.
fn hash(grants: &[Opened], path: &str, size: u64, cancel: Option<&CancelToken>) -> Option<String> {
    let g = grants.iter().filter(|g| g.access == Access::Rw).find(|g| {
        g.guest == "/" || path.strip_prefix(&g.guest).is_some_and(|r| r.starts_with('/'))
    })?;
    let rel = if g.guest == "/" { &path[1..] } else { &path[g.guest.len() + 1..] };
    let dir = &g.dir;
    let mut opts = OpenOptions::new();
    opts.read(true).follow(FollowSymlinks::No);
    let mut file = dir.open_with(rel, &opts).ok()?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut read = 0u64;
    loop {
        if cancelled(cancel) {
            return None;
        }
        let n = file.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        read += n as u64;
        if read > size {
            return None;
        }
        hasher.update(&buf[..n]);
    }
    Some(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Grant;

    #[test]
    fn a_cancelled_walk_or_hash_says_the_change_set_is_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), "a").unwrap();
        let grants = [Grant::new(dir.path(), "/w", Access::Rw).unwrap().opened().unwrap()];
        let before = snapshot(&grants, None);
        assert!(before.complete);
        std::fs::write(dir.path().join("b"), "b").unwrap();
        let cancel = CancelToken::new();
        cancel.cancel();
        assert!(!snapshot(&grants, Some(&cancel)).complete);
        // The walk finished before the cancellation, the hashing did not.
        let after = snapshot(&grants, None);
        let set = diff(&before, &after, &grants, Some(&cancel));
        assert!(!set.complete);
        assert_eq!(set.created.len(), 1);
        assert!(!set.created[0].hashed);
        let set = diff(&before, &after, &grants, None);
        assert!(set.complete && set.created[0].hashed);
    }

    #[test]
    fn only_a_small_workspace_is_walked_inline() {
        let dir = tempfile::tempdir().unwrap();
        let grants = [Grant::new(dir.path(), "/w", Access::Rw).unwrap().opened().unwrap()];
        for i in 0..INLINE_ENTRIES {
            std::fs::write(dir.path().join(format!("f{i}")), "x").unwrap();
        }
        let snap = snapshot_inline(&grants, None).expect("at the bound, walked inline");
        assert!(snap.complete);
        std::fs::write(dir.path().join("one-more"), "x").unwrap();
        assert!(snapshot_inline(&grants, None).is_none());
        let full = snapshot(&grants, None);
        assert!(full.complete && full.entries.len() == INLINE_ENTRIES + 1);
        std::fs::write(dir.path().join("big"), vec![0u8; 2 << 20]).unwrap();
        assert_eq!(bytes_to_hash(&full, &snapshot(&grants, None)), 2 << 20);
    }
}
