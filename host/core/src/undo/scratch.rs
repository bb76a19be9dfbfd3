//! A scratch copy of a session's grants: what a replay runs recorded calls against, so that
//! nothing of the session's own files is touched. Copied through each grant's directory
//! handle without following a link (a link is copied as a link), bounded in bytes and entries.

use std::io::{Read, Write};
use std::path::Path;

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};

/// Bytes a scratch copy holds at most.
pub const MAX_SCRATCH_BYTES: u64 = 256 << 20;
/// Entries a scratch copy holds at most.
pub const MAX_SCRATCH_ENTRIES: usize = 20_000;

/// What a copy has taken so far.
#[derive(Debug, Default)]
pub struct Copied {
    pub bytes: u64,
    pub entries: usize,
}

/// Copies the tree of `from` into `to` (a directory that exists), or says why not (a bound
/// passed, a read or write that failed).
pub fn copy_tree(from: &Dir, to: &Path, copied: &mut Copied) -> Result<(), String> {
    for entry in from.entries().map_err(|e| format!("a granted directory cannot be read: {e}"))? {
        let entry = entry.map_err(|e| format!("a granted directory cannot be read: {e}"))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        copied.entries += 1;
        if copied.entries > MAX_SCRATCH_ENTRIES {
            return Err(format!(
                "the grants hold more than {MAX_SCRATCH_ENTRIES} entries, more than a replay copies"
            ));
        }
        let meta = entry.metadata().map_err(|e| format!("{name}: {e}"))?;
        let target = to.join(name);
        if meta.is_symlink() {
            let link = from.read_link(name).map_err(|e| format!("{name}: {e}"))?;
            std::os::unix::fs::symlink(link, &target).map_err(|e| format!("{name}: {e}"))?;
        } else if meta.is_dir() {
            std::fs::create_dir(&target).map_err(|e| format!("{name}: {e}"))?;
            let sub = from.open_dir_nofollow(name).map_err(|e| format!("{name}: {e}"))?;
            copy_tree(&sub, &target, copied)?;
        } else if meta.is_file() {
            copied.bytes += meta.len();
            if copied.bytes > MAX_SCRATCH_BYTES {
                return Err(format!(
                    "the grants hold more than {} MiB, more than a replay copies",
                    MAX_SCRATCH_BYTES >> 20
                ));
            }
            let mut opts = OpenOptions::new();
            opts.read(true).follow(FollowSymlinks::No);
            let mut src = from.open_with(name, &opts).map_err(|e| format!("{name}: {e}"))?;
            let mut dst = std::fs::File::create(&target).map_err(|e| format!("{name}: {e}"))?;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = src.read(&mut buf).map_err(|e| format!("{name}: {e}"))?;
                if n == 0 {
                    break;
                }
                dst.write_all(&buf[..n]).map_err(|e| format!("{name}: {e}"))?;
            }
        }
    }
    Ok(())
}
