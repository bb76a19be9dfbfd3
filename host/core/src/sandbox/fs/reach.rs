//! What a tool may reach inside its grants, checked on each object it names.
//!
//! A grant is checked when it is made and at each call (never keel's home, never a
//! pseudo-filesystem), but what lies below it can lead elsewhere by routes no path check
//! sees: a bind mount of the user's home inside the granted tree, a mount of `/proc`, a hard
//! link to the secrets key. So every operation that names a path is checked here before it
//! runs, by the **identity** of the directory that holds the object it names — the path
//! resolved below the descriptor as wasmtime-wasi resolves it (links inside the grant
//! followed, a final one only where the operation follows it) — against the home's
//! [`Boundary`] and the pseudo-filesystems ([`pseudo_fs`]); and every object a tool opens is
//! checked once open: a directory like a holder, a file by its identity (none of the home's
//! files, whatever its name or link), its type (files and directories only: no device node,
//! FIFO or socket), and, opened for writing, its links (all inside this grant).
//!
//! A path of one component needs no resolution: its holder is the descriptor itself, checked
//! when it was opened (a preopen is a grant, checked before the call).

use std::os::fd::AsFd;
use std::sync::Arc;

use cap_std::fs::Dir;
use wasmtime::component::Resource;
use wasmtime_wasi::filesystem::Descriptor;
use wasmtime_wasi::p2::FsResult;
use wasmtime_wasi::p2::bindings::filesystem::types::{ErrorCode, HostDescriptor};

use super::GuardedFs;
use crate::grant::pseudo_fs;
use crate::home::{Boundary, FileId};

/// Why an object that is neither a file nor a directory is refused.
const NOT_A_FILE: &str =
    "it is a device, a FIFO or a socket; a tool opens only files and directories";

/// Symbolic links followed while resolving one path, at most (as the kernel's limit).
const MAX_LINKS: usize = 40;
/// Entries of a grant read at most to find the other links of a file opened for writing.
pub const MAX_LINK_SCAN: usize = 20_000;

/// The identity of an open file or directory.
fn identity(fd: impl AsFd) -> std::io::Result<(FileId, rustix::fs::Stat)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((FileId { dev: st.st_dev, ino: st.st_ino }, st))
}

/// Why a tool may not use the directory `dir`, if it may not.
fn refuse_dir(boundary: Option<&Boundary>, dir: impl AsFd) -> Option<String> {
    if let Some(fs) = pseudo_fs(&dir) {
        return Some(format!(
            "it is on a `{fs}` filesystem, which shows processes (keel's own among them), the kernel or devices"
        ));
    }
    let (id, _) = identity(&dir).ok()?;
    boundary.and_then(|b| b.refuse_dir(id))
}

/// `path` split at its last component (`None` for the holder: the descriptor itself).
fn split(path: &str) -> (Option<&str>, &str) {
    let path = path.trim_end_matches('/');
    match path.rsplit_once('/') {
        Some(("", name)) => (Some("/"), name),
        Some((parent, name)) => (Some(parent), name),
        None => (None, path),
    }
}

impl GuardedFs<'_> {
    /// The host directory behind a guest descriptor (`None`: a file; the operation fails on its
    /// own).
    pub(super) fn host_dir(&mut self, fd: &Resource<Descriptor>) -> FsResult<Option<Dir>> {
        match self.fs.table.get(fd)? {
            Descriptor::Dir(d) => {
                let dup = d.dir.try_clone().map_err(|_| ErrorCode::Busy)?;
                Ok(Some(Dir::from_std_file(dup)))
            }
            Descriptor::File(_) => Ok(None),
        }
    }

    /// Refuses `op` on `path` below `fd` when the directory that holds the object it names —
    /// or, for `.`/`..`, the directory itself — is one no tool may use. `follow`: a final
    /// link is followed (as the operation will). `object`: the object itself, when it exists,
    /// must be a file, a directory or a link, and not one of the home's files; `write` (with
    /// `object`): a file with other links must have them all inside the grant `fd` lies in.
    /// Checked before the operation runs, so nothing is truncated or created first.
    pub(super) async fn check_path(
        &mut self,
        op: &str,
        fd: &Resource<Descriptor>,
        path: &str,
        follow: bool,
        object: Option<bool>,
    ) -> FsResult<()> {
        let (parent, name) = split(path);
        if parent.is_none() && !follow && object.is_none() && name != ".." {
            return Ok(());
        }
        let Some(base) = self.host_dir(fd)? else { return Ok(()) };
        let boundary = self.guard.boundary.clone();
        let (holder, name) = match resolve(&base, path, follow) {
            Some(found) => found,
            // Does not resolve: the operation fails with its own error.
            None => return Ok(()),
        };
        if let Some(why) = refuse_dir(boundary.as_deref(), &holder) {
            return Err(self.guard.deny(op, path, &why));
        }
        let (Some(write), Ok(meta)) = (object, holder.symlink_metadata(&name)) else {
            return Ok(());
        };
        let why = if !(meta.is_file() || meta.is_dir() || meta.is_symlink()) {
            Some(NOT_A_FILE.to_string())
        } else if meta.is_file() {
            use cap_std::fs::MetadataExt;
            let id = FileId { dev: meta.dev(), ino: meta.ino() };
            match boundary.as_deref().and_then(|b| b.refuse_file(id)) {
                Some(why) => Some(why),
                None if write && meta.nlink() > 1 => {
                    let grant = self.guard.grant_of(fd);
                    self.links_outside(id, meta.nlink(), grant)
                }
                None => None,
            }
        } else {
            None
        };
        match why {
            Some(why) => Err(self.guard.deny(op, path, &why)),
            None => Ok(()),
        }
    }

    /// Checks what `open_at` opened — what [`Self::check_path`] saw may have been replaced
    /// since — and closes it again when it is refused.
    pub(super) fn check_opened(
        &mut self,
        path: &str,
        opened: Resource<Descriptor>,
    ) -> FsResult<Resource<Descriptor>> {
        let boundary = self.guard.boundary.clone();
        let refusal = match self.fs.table.get(&opened)? {
            Descriptor::Dir(d) => refuse_dir(boundary.as_deref(), &*d.dir),
            Descriptor::File(f) => match identity(&*f.file) {
                Err(e) => Some(format!("its identity could not be read: {e}")),
                Ok((id, st)) => {
                    if rustix::fs::FileType::from_raw_mode(st.st_mode)
                        != rustix::fs::FileType::RegularFile
                    {
                        Some(NOT_A_FILE.into())
                    } else {
                        boundary.as_deref().and_then(|b| b.refuse_file(id))
                    }
                }
            },
        };
        match refusal {
            None => Ok(opened),
            Some(why) => {
                let _ = HostDescriptor::drop(&mut self.fs, opened);
                Err(self.guard.deny("open", path, &why))
            }
        }
    }

    /// Why a file with `links` hard links may not be opened for writing through grant
    /// `grant`: unless every one of its links is inside that grant, a write through it changes
    /// a file elsewhere — a place this call was not granted.
    fn links_outside(&self, id: FileId, links: u64, grant: Option<usize>) -> Option<String> {
        let (_, dir) = grant.and_then(|g| self.guard.grants.get(g))?;
        let mut found = 0u64;
        let mut seen = 0usize;
        let mut stack: Vec<Arc<Dir>> = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = d.entries() else { continue };
            for entry in entries.flatten() {
                seen += 1;
                if seen > MAX_LINK_SCAN {
                    return Some(format!(
                        "it has {links} hard links, and the grant is too large ({MAX_LINK_SCAN} entries read) to confirm they are all inside it; a write through it could change a file outside the grant — give the file one link (copy it over itself: cp f f.tmp && mv f.tmp f)"
                    ));
                }
                let Ok(ft) = entry.file_type() else { continue };
                if ft.is_dir() {
                    if let Ok(sub) = entry.open_dir() {
                        stack.push(Arc::new(sub));
                    }
                } else if ft.is_file()
                    && let Ok(meta) = entry.metadata()
                {
                    use cap_std::fs::MetadataExt;
                    if meta.dev() == id.dev && meta.ino() == id.ino {
                        found += 1;
                    }
                }
            }
        }
        (found < links).then(|| {
            format!(
                "it has {links} hard links and only {found} are inside this grant: a write through it would change the file at a place this call was not granted — give the file one link (copy it over itself: cp f f.tmp && mv f.tmp f)"
            )
        })
    }
}

/// Resolves `path` below `base` to the directory holding its last component and that
/// component's name, following links inside as wasmtime-wasi does (a final one only when
/// `follow`). `None` when it does not resolve.
pub(super) fn resolve(base: &Dir, path: &str, follow: bool) -> Option<(Dir, String)> {
    let mut path = path.to_string();
    for _ in 0..MAX_LINKS {
        let (parent, name) = split(&path);
        let holder = match parent {
            None => base.try_clone().ok()?,
            Some(p) => base.open_dir(p).ok()?,
        };
        if name.is_empty() || name == "." || name == ".." {
            // The object is a directory: it is its own holder.
            return Some((
                base.open_dir(if path.is_empty() { "." } else { &path }).ok()?,
                ".".into(),
            ));
        }
        if follow && let Ok(target) = holder.read_link(name) {
            if target.is_absolute() {
                return None;
            }
            let target = target.to_str()?;
            path = match parent {
                None => target.to_string(),
                Some(p) => format!("{}/{target}", p.trim_end_matches('/')),
            };
            continue;
        }
        return Some((holder, name.to_string()));
    }
    None
}
