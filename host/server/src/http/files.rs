//! The file tree inside a session's grants, for the console and `GET
//! /sessions/{id}/files`. A directory is opened through the grant's directory handle
//! (cap-std), so no path — `..`, an absolute one, or a symlink pointing out — reaches outside
//! the grant; nothing outside a session's grants is ever read.

use super::Failure;
use keel::protocol::sessions::Grant;

/// Most entries listed of one directory.
pub const MAX_ENTRIES: usize = 1000;

/// One entry of a listed directory.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Entry {
    pub name: String,
    /// `dir`, `file`, `symlink` or `other`.
    pub kind: &'static str,
    /// Bytes, for a file.
    pub size: Option<u64>,
}

/// A listed directory inside a grant.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Listing {
    /// The grant's guest path.
    pub grant: String,
    pub access: String,
    /// The directory, relative to the grant (`""`: its root).
    pub path: String,
    pub entries: Vec<Entry>,
    /// Whether entries past [`MAX_ENTRIES`] were left out.
    pub truncated: bool,
}

/// [`list`] for `who` looking at session `meta`, off the async workers: a failure that names a
/// grant's host directory (one that moved, say) names its guest path for a user.
pub async fn listing(
    who: &keel::api::Caller,
    meta: &keel::protocol::sessions::SessionMeta,
    guest: String,
    path: String,
) -> Result<Listing, Failure> {
    let grants = meta.config.grants.clone();
    let listed = tokio::task::spawn_blocking(move || list(&grants, &guest, &path))
        .await
        .map_err(|e| Failure::new("internal", e.to_string()))?;
    listed.map_err(|mut f| {
        f.message = keel::api::shown::Hidden::of_session(who, meta).text(&f.message).into_owned();
        f
    })
}

/// Lists `path` (relative, `/`-separated) inside the grant mounted at `guest`.
pub fn list(grants: &[Grant], guest: &str, path: &str) -> Result<Listing, Failure> {
    let Some(grant) = grants.iter().find(|g| g.guest == guest) else {
        let known = grants.iter().map(|g| g.guest.as_str()).collect::<Vec<_>>().join(", ");
        return Err(Failure::new(
            "not_found",
            format!(
                "the session has no grant at `{}` (its grants: {})",
                guest.escape_debug(),
                if known.is_empty() { "none" } else { &known }
            ),
        ));
    };
    let rel = path.trim_matches('/');
    if rel.split('/').any(|part| part == "..") || rel.contains('\0') {
        return Err(Failure::new("input", "the path must stay inside the grant (no `..`)"));
    }
    let io = |e: std::io::Error| {
        let kind = if e.kind() == std::io::ErrorKind::NotFound { "not_found" } else { "input" };
        Failure::new(kind, format!("cannot list `{}` in grant {guest}: {e}", rel.escape_debug()))
    };
    // Through the grant's identity-checked handle, never its path: a directory swapped for a
    // link after the grant was given is refused, not followed.
    let root = grant.open().map_err(|e| Failure::new(e.kind(), e.to_string()))?;
    let dir = if rel.is_empty() { root } else { root.open_dir(rel).map_err(io)? };
    let mut entries = Vec::new();
    let mut truncated = false;
    for entry in dir.entries().map_err(io)? {
        let entry = entry.map_err(io)?;
        if entries.len() == MAX_ENTRIES {
            truncated = true;
            break;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let ft = entry.file_type().map_err(io)?;
        let (kind, size) = if ft.is_dir() {
            ("dir", None)
        } else if ft.is_file() {
            ("file", entry.metadata().ok().map(|m| m.len()))
        } else if ft.is_symlink() {
            ("symlink", None)
        } else {
            ("other", None)
        };
        entries.push(Entry { name, kind, size });
    }
    entries.sort_by(|a, b| (a.kind != "dir", &a.name).cmp(&(b.kind != "dir", &b.name)));
    Ok(Listing {
        grant: grant.guest.clone(),
        access: grant.access.to_string(),
        path: rel.to_string(),
        entries,
        truncated,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel::protocol::sessions::Access;

    #[test]
    fn a_listing_never_leaves_its_grant() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "s").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        let grants = vec![Grant::new(dir.path(), "/work", Access::Ro).unwrap()];
        let l = list(&grants, "/work", "").unwrap();
        let names: Vec<_> = l.entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert_eq!(names, [("sub", "dir"), ("a.txt", "file"), ("out", "symlink")]);
        assert_eq!(l.entries[1].size, Some(5));
        assert!(list(&grants, "/work", "../").is_err());
        assert!(list(&grants, "/work", "sub/../..").is_err());
        let e = list(&grants, "/work", "out").unwrap_err();
        assert_eq!(e.kind, "input", "{}", e.message);
        assert!(list(&grants, "/work", outside.path().to_str().unwrap()).is_err());
        assert_eq!(list(&grants, "/other", "").unwrap_err().status, 404);
        assert_eq!(list(&grants, "/work", "missing").unwrap_err().status, 404);
    }

    #[test]
    fn a_granted_directory_swapped_for_a_link_is_not_listed() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "s").unwrap();
        let root = tempfile::tempdir().unwrap();
        let work = root.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let grants = vec![Grant::new(&work, "/work", Access::Ro).unwrap()];
        assert!(list(&grants, "/work", "").is_ok());
        std::fs::rename(&work, root.path().join("old")).unwrap();
        std::os::unix::fs::symlink(outside.path(), &work).unwrap();
        let e = list(&grants, "/work", "").unwrap_err();
        assert_eq!(e.kind, "grant_moved", "{}", e.message);
        assert!(!e.message.contains("secret.txt"));
    }
}
