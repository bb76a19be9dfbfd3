//! What an approval would let a call change on disk. For a call that writes a file — its input
//! has a string `path` and a string `content`, as `fs_write_file`'s does — the person deciding
//! sees the content as text and a unified diff against the file there now, read through the
//! session's grants the way the tool would reach it (the same directory handles, no link
//! followed out of a grant), never by a host path taken from the input.

use std::io::Read;
use std::path::{Component, Path};

use serde::Serialize;

use crate::grant::Grant;
use crate::session::ApprovalUnit;

/// Largest current file read for a diff; a larger one is named with its size instead.
const MAX_READ: u64 = 1 << 20;

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
    /// large, unreadable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
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
        let diff = match &current {
            Some(before) if before != &content => similar::TextDiff::from_lines(before, &content)
                .unified_diff()
                .context_radius(3)
                .header(&format!("{path} (now)"), &format!("{path} (after the call)"))
                .to_string(),
            _ => String::new(),
        };
        Some(Self { path, content, current_bytes, diff, note })
    }

    /// One line saying what the call does to the file: `writes 133 bytes to /out/report.md,
    /// a new file` / `…, replacing 120 bytes` / `…, the same content as now`.
    pub fn summary(&self) -> String {
        let bytes = crate::units::format_size(self.content.len() as u64);
        let what = match (self.current_bytes, &self.note) {
            (_, Some(note)) => format!("not compared with the file there now: {note}"),
            (None, None) => "a new file".to_string(),
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
    let mut file = match dir.open(&rel) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("the current file cannot be read ({e})")),
    };
    let meta = file.metadata().map_err(|e| format!("the current file cannot be read ({e})"))?;
    if meta.is_dir() {
        return Err("a directory is there now".to_string());
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
