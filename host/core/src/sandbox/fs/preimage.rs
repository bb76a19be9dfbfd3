//! Pre-images: what a call's changes replace, kept so that a person can undo them.
//!
//! The guard takes a file's content at the moment a tool is about to change it — opened for
//! writing or truncation, unlinked, renamed away or renamed onto — through the same directory
//! handles the tool reaches it by, before the operation runs: inside the call (and its
//! workspace lease), never a second read racing the tool. Only objects that existed when the
//! call began are taken (what the call created needs none: undoing it removes it), each once,
//! by identity (device and inode), so a rename cannot make one file count twice. A symbolic
//! link is kept by its target; a regular file by its bytes and mode, within [`UndoBounds`]:
//! past the per-file or the per-call bound it is recorded as not kept, with why.
//!
//! A call that changes nothing reads nothing: the cost is on the files a tool writes.

use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{MetadataExt, OpenOptions};
use wasmtime::component::Resource;
use wasmtime_wasi::filesystem::Descriptor;
use wasmtime_wasi::p2::FsResult;

use super::GuardedFs;

/// Bytes of one file's pre-image kept at most, by default.
pub const DEFAULT_MAX_FILE: u64 = 8 << 20;
/// Bytes of pre-images one call keeps at most, by default.
pub const DEFAULT_MAX_CALL: u64 = 64 << 20;

/// How much of what a call replaces is kept (`[undo]` in keel.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UndoBounds {
    pub max_file: u64,
    pub max_call: u64,
}

impl Default for UndoBounds {
    fn default() -> Self {
        Self { max_file: DEFAULT_MAX_FILE, max_call: DEFAULT_MAX_CALL }
    }
}

/// What was there before a call changed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Captured {
    /// A regular file: its bytes and permission bits.
    File { bytes: Arc<Vec<u8>>, mode: u32 },
    /// A symbolic link: its target, as written.
    Link { target: String },
    /// Not kept, and why (over a bound, unreadable).
    NotKept { reason: String },
}

/// The pre-images one call took, by identity (device, inode).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreImages {
    pub by_identity: HashMap<(u64, u64), Captured>,
    /// Bytes kept so far (of files).
    pub bytes: u64,
}

impl PreImages {
    /// What was taken of the object that had identity `(dev, ino)` when the call began.
    pub fn of(&self, dev: u64, ino: u64) -> Option<&Captured> {
        self.by_identity.get(&(dev, ino))
    }
}

impl GuardedFs<'_> {
    /// Takes the pre-image of the object at `path` below `fd` (the target of a final link with
    /// `follow`) if the call keeps pre-images,
    /// the object exists, the call did not create it and it was not taken yet. Never fails the
    /// operation: what cannot be read is recorded as not kept.
    pub(super) async fn take_preimage(
        &mut self,
        fd: &Resource<Descriptor>,
        path: &str,
        follow: bool,
    ) -> FsResult<()> {
        let Some(bounds) = self.guard.policy.undo else { return Ok(()) };
        let Some(base) = self.host_dir(fd)? else { return Ok(()) };
        let Some((holder, name)) = super::reach::resolve(&base, path, follow) else {
            return Ok(());
        };
        let Ok(meta) = holder.symlink_metadata(&name) else { return Ok(()) };
        let key = (meta.dev(), meta.ino());
        if self.guard.preimages.by_identity.contains_key(&key) {
            return Ok(());
        }
        // What this call created needs no pre-image (its identity is wasi's metadata hash).
        if !follow
            && let Some(id) = self.identity_at(fd, path).await
            && self.guard.created.contains(&id)
        {
            return Ok(());
        }
        let left = bounds.max_call.saturating_sub(self.guard.preimages.bytes);
        let captured = if meta.is_symlink() {
            match holder.read_link(&name) {
                Ok(t) => Captured::Link { target: t.to_string_lossy().into_owned() },
                Err(e) => Captured::NotKept { reason: format!("its link could not be read: {e}") },
            }
        } else if !meta.is_file() {
            // A directory: undoing recreates it empty (its files are kept one by one).
            return Ok(());
        } else if meta.len() > bounds.max_file {
            Captured::NotKept {
                reason: format!(
                    "it was {}, over the bound of {} a file ([undo] max_file)",
                    crate::units::format_size(meta.len()),
                    crate::units::format_size(bounds.max_file)
                ),
            }
        } else if meta.len() > left {
            Captured::NotKept {
                reason: format!(
                    "the call had kept {} already, and the bound of a call is {} ([undo] max_call)",
                    crate::units::format_size(self.guard.preimages.bytes),
                    crate::units::format_size(bounds.max_call)
                ),
            }
        } else {
            let limit = meta.len().min(bounds.max_file);
            let read = tokio::task::spawn_blocking(move || read_file(&holder, &name, limit)).await;
            match read {
                Ok(Ok((bytes, mode))) => {
                    self.guard.preimages.bytes += bytes.len() as u64;
                    Captured::File { bytes: Arc::new(bytes), mode }
                }
                Ok(Err(why)) => Captured::NotKept { reason: why },
                Err(e) => Captured::NotKept { reason: format!("it could not be read: {e}") },
            }
        };
        self.guard.preimages.by_identity.insert(key, captured);
        Ok(())
    }
}

/// The bytes (at most `limit`) and permission bits of the regular file `name` in `dir`, not
/// following a link.
fn read_file(dir: &cap_std::fs::Dir, name: &str, limit: u64) -> Result<(Vec<u8>, u32), String> {
    let mut opts = OpenOptions::new();
    opts.read(true).follow(FollowSymlinks::No);
    let file = dir.open_with(name, &opts).map_err(|e| format!("it could not be opened: {e}"))?;
    let mode = file.metadata().map(|m| m.mode() & 0o7777).unwrap_or(0o644);
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("it could not be read: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err("it grew while it was read".into());
    }
    Ok((bytes, mode))
}
