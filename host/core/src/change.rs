//! What an approval would let a call change on disk. For a call that writes a file — its input
//! has a string `path` and a string `content`, as `fs_write_file`'s does — the person deciding
//! sees the content as text and a unified diff against the file there now, read through the
//! session's grants the way the tool would reach it (the same directory handles, no link
//! followed out of a grant), never by a host path taken from the input.

//!
//! A change is bounded: only a regular file is read (opened without blocking, its type checked
//! on the handle, so a FIFO or a device put there cannot hold the reader), at most 1 MiB of
//! it, and the diff is given [`DIFF_TIME`] and at most [`MAX_CHANGED_LINES`] changed lines —
//! past them the change says "diff too large: N lines changed" instead. [`Changes`] computes
//! each pending unit's change once for the file as it is, and again only when that file
//! changes.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::path::{Component, Path};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use crate::grant::Grant;
use crate::session::ApprovalUnit;

/// Largest current file read for a diff; a larger one is named with its size instead.
const MAX_READ: u64 = 1 << 20;

/// The time a diff may take; past it, the diff is approximated (coarser, never wrong).
pub const DIFF_TIME: Duration = Duration::from_millis(250);

/// The most changed lines (removed and added) a diff shows; past them the change says how
/// many there are instead.
pub const MAX_CHANGED_LINES: usize = 5_000;

/// A file write an approval would allow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileChange {
    /// The path as the tool sees it (`/data/report.md`).
    pub path: String,
    /// The content the call writes.
    pub content: String,
    /// The size of the file there now; `None`: there is none, the call creates it.
    pub current_bytes: Option<u64>,
    /// A unified diff from the file there now to `content` (empty when they are the same or
    /// when the current file could not be compared: see `note`).
    pub diff: String,
    /// Why there is no diff against the current file (outside the grants, not text, too
    /// large, not a regular file, unreadable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Lines changed (removed and added), when there are too many to show a diff of
    /// (`diff` is empty then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff_too_large: Option<usize>,
}

impl FileChange {
    /// The change a pending unit's call would make, if its input writes a file.
    pub fn of(unit: &ApprovalUnit) -> Option<Self> {
        let input: serde_json::Value = serde_json::from_str(&unit.input).ok()?;
        let path = input.get("path")?.as_str()?.to_string();
        let content = input.get("content")?.as_str()?.to_string();
        let (current, note) = match read_current(&unit.grants, &path) {
            Ok(current) => (current, None),
            Err(why) => (None, Some(why)),
        };
        let current_bytes = current.as_ref().map(|c| c.len() as u64);
        let (diff, diff_too_large) = match &current {
            Some(before) if before != &content => bounded_diff(&path, before, &content),
            _ => (String::new(), None),
        };
        Some(Self { path, content, current_bytes, diff, note, diff_too_large })
    }

    /// One line saying what the call does to the file: `writes 133 bytes to /out/report.md,
    /// a new file` / `…, replacing 120 bytes` / `…, the same content as now`.
    pub fn summary(&self) -> String {
        let bytes = crate::units::format_size(self.content.len() as u64);
        let what = match (self.current_bytes, &self.note) {
            (_, Some(note)) => format!("not compared with the file there now: {note}"),
            (None, None) => "a new file".to_string(),
            (Some(n), None) if self.diff_too_large.is_some() => format!(
                "replacing {} (diff too large: {} lines changed)",
                crate::units::format_size(n),
                self.diff_too_large.unwrap_or_default()
            ),
            (Some(_), None) if self.diff.is_empty() => "the same content as now".to_string(),
            (Some(n), None) => format!("replacing {}", crate::units::format_size(n)),
        };
        format!("writes {bytes} to {}, {what}", self.path)
    }
}

/// At most `max` lines of `text`, and how many were left out.
pub fn cut_lines(text: &str, max: usize) -> (Vec<&str>, usize) {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= max {
        return (lines, 0);
    }
    let omitted = lines.len() - max;
    (lines[..max].to_vec(), omitted)
}

/// The text of the file at guest path `path` now, reached through the grant that holds it:
/// `Ok(None)` when there is no file there, `Err` with the reason it cannot be compared.
fn read_current(grants: &[Grant], path: &str) -> Result<Option<String>, String> {
    let (grant, rel) = grants
        .iter()
        .filter_map(|g| below(&g.guest, path).map(|rel| (g, rel)))
        .max_by_key(|(g, _)| g.guest.len())
        .ok_or_else(|| "the path is outside every directory granted to the session".to_string())?;
    if rel.as_os_str().is_empty() {
        return Err("the path names a granted directory itself".to_string());
    }
    let dir = grant.open().map_err(|e| e.to_string())?;
    // Without blocking: a FIFO opened for reading would wait for a writer. The type is
    // checked on the handle, so a file swapped for a FIFO after a look is caught too.
    let mut options = cap_std::fs::OpenOptions::new();
    options.read(true);
    cap_std::fs::OpenOptionsExt::custom_flags(&mut options, libc_nonblock());
    let mut file = match dir.open_with(&rel, &options) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("the current file cannot be read ({e})")),
    };
    let meta = file.metadata().map_err(|e| format!("the current file cannot be read ({e})"))?;
    if meta.is_dir() {
        return Err("a directory is there now".to_string());
    }
    if !meta.is_file() {
        return Err("what is there now is not a regular file (a FIFO, socket or device)".into());
    }
    if meta.len() > MAX_READ {
        return Err(format!(
            "the current file is {}, past the {} compared",
            crate::units::format_size(meta.len()),
            crate::units::format_size(MAX_READ)
        ));
    }
    let mut bytes = Vec::new();
    file.by_ref()
        .take(MAX_READ + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("the current file cannot be read ({e})"))?;
    String::from_utf8(bytes).map(Some).map_err(|_| "the current file is not UTF-8 text".to_string())
}

/// `O_NONBLOCK`, as the open flags take it.
fn libc_nonblock() -> i32 {
    rustix::fs::OFlags::NONBLOCK.bits() as i32
}

/// A unified diff from `before` to `after`, bounded: [`DIFF_TIME`] (then approximated) and
/// [`MAX_CHANGED_LINES`] (then no diff, and the count of changed lines).
fn bounded_diff(path: &str, before: &str, after: &str) -> (String, Option<usize>) {
    labeled_diff(path, before, after, "now", "after the call")
}

/// A unified diff from `before` to `after` bounded as an approval's is, its two sides named
/// (`a.txt (now)`, `a.txt (at step 3)`).
pub fn labeled_diff(
    path: &str,
    before: &str,
    after: &str,
    before_label: &str,
    after_label: &str,
) -> (String, Option<usize>) {
    let diff = similar::TextDiff::configure().timeout(DIFF_TIME).diff_lines(before, after);
    let changed: usize = diff
        .ops()
        .iter()
        .filter(|op| op.tag() != similar::DiffTag::Equal)
        .map(|op| op.old_range().len() + op.new_range().len())
        .sum();
    if changed > MAX_CHANGED_LINES {
        return (String::new(), Some(changed));
    }
    let text = diff
        .unified_diff()
        .context_radius(3)
        .header(&format!("{path} ({before_label})"), &format!("{path} ({after_label})"))
        .to_string();
    (text, None)
}

/// The changes of pending approval units, each computed once for the file as it is: a view
/// looks at the file's size and time (a `stat` through the grant) and reads and diffs it
/// again only when they moved. Bounded to the last [`Changes::KEPT`] units looked at.
#[derive(Default)]
pub struct Changes {
    seen: Mutex<Seen>,
}

/// The changes kept, by unit id, and the order they were first looked at.
#[derive(Default)]
struct Seen {
    by_unit: HashMap<String, Kept>,
    order: VecDeque<String>,
}

/// A unit's change as last computed: the path its input writes (`None`: not a write), the
/// file's stamp then, and the change.
struct Kept {
    path: Option<String>,
    stamp: String,
    change: Option<FileChange>,
}

impl Changes {
    /// Units whose change is kept at once.
    pub const KEPT: usize = 512;

    /// The change `unit`'s call would make, if its input writes a file. Blocking (it may
    /// read and diff a file): run it off the async workers.
    pub fn of(&self, unit: &ApprovalUnit) -> Option<FileChange> {
        let id = unit.id.to_string();
        let known = {
            let seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            seen.by_unit.get(&id).map(|k| (k.path.clone(), k.stamp.clone(), k.change.clone()))
        };
        let path = match known {
            Some((path, was, change)) => {
                if stamp(&unit.grants, path.as_deref()) == was {
                    return change;
                }
                path
            }
            None => serde_json::from_str::<serde_json::Value>(&unit.input)
                .ok()
                .and_then(|v| v.get("path").and_then(|p| p.as_str()).map(str::to_string)),
        };
        let stamp = stamp(&unit.grants, path.as_deref());
        let change = FileChange::of(unit);
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let kept = Kept { path, stamp, change: change.clone() };
        if seen.by_unit.insert(id.clone(), kept).is_none() {
            seen.order.push_back(id);
            while seen.order.len() > Self::KEPT {
                if let Some(old) = seen.order.pop_front() {
                    seen.by_unit.remove(&old);
                }
            }
        }
        change
    }
}

/// What the file at guest `path` looks like now without reading it: its size, time and type,
/// or why it cannot be looked at.
fn stamp(grants: &[Grant], path: Option<&str>) -> String {
    let Some(path) = path else { return "not a write".into() };
    let Some((grant, rel)) = grants
        .iter()
        .filter_map(|g| below(&g.guest, path).map(|rel| (g, rel)))
        .max_by_key(|(g, _)| g.guest.len())
    else {
        return "outside".into();
    };
    let dir = match grant.open() {
        Ok(d) => d,
        Err(e) => return format!("grant: {e}"),
    };
    match dir.metadata(&rel) {
        Ok(m) => format!("{} {:?} {:?}", m.len(), m.modified().ok(), m.file_type()),
        Err(e) => format!("{:?}", e.kind()),
    }
}

/// `path` relative to guest directory `guest`, when it is below it: compared component by
/// component, `.` skipped, refused outright when it holds `..`.
fn below(guest: &str, path: &str) -> Option<std::path::PathBuf> {
    let path = Path::new(path);
    if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
        return None;
    }
    let parts = |p: &Path| -> Vec<std::ffi::OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_os_string()),
                _ => None,
            })
            .collect()
    };
    let base = parts(Path::new(guest));
    let all = parts(path);
    if all.len() < base.len() || all[..base.len()] != base[..] {
        return None;
    }
    Some(all[base.len()..].iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_below_a_guest_directory_component_by_component() {
        assert_eq!(below("/data", "/data/a/b.md"), Some("a/b.md".into()));
        assert_eq!(below("/data", "/data/./b.md"), Some("b.md".into()));
        assert_eq!(below("/data", "/database/b.md"), None);
        assert_eq!(below("/data", "/data/../etc/passwd"), None);
        assert_eq!(below("/data", "data/b.md"), None);
        assert_eq!(below("/", "/x"), Some("x".into()));
    }

    #[test]
    fn long_text_is_cut_with_a_count() {
        assert_eq!(cut_lines("a\nb\nc", 5), (vec!["a", "b", "c"], 0));
        assert_eq!(cut_lines("a\nb\nc", 2), (vec!["a", "b"], 1));
    }
}
