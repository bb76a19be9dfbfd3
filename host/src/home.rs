//! Where keel keeps its state.
//!
//! ```text
//! HOME/keel.db                               the SQLite store (catalog, sessions, events)
//! HOME/components/<sha256>.wasm              installed components, content-addressed
//! HOME/cache/<engine-hash>/<sha256>.cwasm    compiled artifacts (+ .sha256 digest)
//! ```
//! HOME is `--home DIR`, else `$KEEL_HOME`, else `$XDG_DATA_HOME/keel`, else
//! `~/.local/share/keel`.

use std::path::{Path, PathBuf};

/// The resolved paths of a keel home.
#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// The home at `root` (created if missing).
    pub fn at(root: impl Into<PathBuf>) -> std::io::Result<Self> {
        let root = root.into();
        std::fs::create_dir_all(root.join("components"))?;
        std::fs::create_dir_all(root.join("cache"))?;
        Ok(Self { root })
    }

    /// The default home (see the module docs), ignoring `--home`.
    pub fn default_root() -> PathBuf {
        if let Some(dir) = std::env::var_os("KEEL_HOME").filter(|d| !d.is_empty()) {
            return PathBuf::from(dir);
        }
        if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
            return PathBuf::from(dir).join("keel");
        }
        match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
            Some(home) => PathBuf::from(home).join(".local").join("share").join("keel"),
            None => PathBuf::from(".keel"),
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

    /// Where the component with `digest` is stored.
    pub fn component_path(&self, digest: &str) -> PathBuf {
        self.root.join("components").join(format!("{digest}.wasm"))
    }
}
