//! Reading a file through a session's grants for a person who names it (`@/w/notes.md` in a
//! chat message): the same directories the session's tools reach, opened the same way (no
//! link out of a grant), bounded.

use std::io::Read;

use super::*;

/// Bytes of one attached file, at most.
pub const MAX_ATTACHED_BYTES: usize = 64 * 1024;

/// A file's text, read through a grant.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Attached {
    /// The guest path it was named by.
    pub path: String,
    pub text: String,
    /// Its size in bytes.
    pub bytes: usize,
}

impl Harness {
    /// The text of the file at guest path `path` of session `id`, read through the grant
    /// that holds it: refused outside every grant, for a path with `..`, a directory, a file
    /// that is not UTF-8 or is larger than [`MAX_ATTACHED_BYTES`].
    pub async fn read_granted(
        &self,
        caller: &Caller,
        id: &str,
        path: &str,
    ) -> Result<Attached, ApiError> {
        let meta = self.session(caller, id).await?;
        let relative = |guest: &str| -> Option<String> {
            let guest = guest.trim_end_matches('/');
            let rest = path.strip_prefix(guest)?;
            (rest.is_empty() || rest.starts_with('/'))
                .then(|| rest.trim_start_matches('/').to_string())
        };
        let Some((grant, rel)) =
            meta.config.grants.iter().find_map(|g| relative(&g.guest).map(|r| (g, r)))
        else {
            let granted: Vec<&str> = meta.config.grants.iter().map(|g| g.guest.as_str()).collect();
            return Err(ApiError::Grant(format!(
                "`{}` is outside every directory granted to session `{id}` (granted: {})",
                path.escape_debug(),
                if granted.is_empty() { "none".to_string() } else { granted.join(", ") }
            )));
        };
        if rel.is_empty() || rel.split('/').any(|p| p == ".." || p == ".") {
            return Err(ApiError::Input(format!(
                "`{}` does not name a file inside the grant {}",
                path.escape_debug(),
                grant.guest
            )));
        }
        let dir = grant.open().map_err(|e| ApiError::Grant(e.to_string()))?;
        let unreadable = |e: std::io::Error| {
            ApiError::Input(format!("cannot read `{}`: {e}", path.escape_debug()))
        };
        let file = dir.open(&rel).map_err(unreadable)?;
        if file.metadata().map_err(unreadable)?.is_dir() {
            return Err(ApiError::Input(format!("`{}` is a directory", path.escape_debug())));
        }
        let mut bytes = Vec::new();
        (&file).take(MAX_ATTACHED_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(unreadable)?;
        if bytes.len() > MAX_ATTACHED_BYTES {
            return Err(ApiError::Input(format!(
                "`{}` is larger than {} KiB: name a smaller file, or let the session read it with its tools",
                path.escape_debug(),
                MAX_ATTACHED_BYTES / 1024
            )));
        }
        let text = String::from_utf8(bytes)
            .map_err(|_| ApiError::Input(format!("`{}` is not UTF-8 text", path.escape_debug())))?;
        Ok(Attached { path: path.to_string(), bytes: text.len(), text })
    }
}
