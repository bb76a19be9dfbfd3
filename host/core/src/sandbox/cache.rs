//! Compiling components, bounded, and the on-disk cache of compiled artifacts.
//!
//! Artifacts live at `CACHE/<engine-hash>/<component-sha256>.cwasm`. The artifact's own
//! digest (BLAKE3) is returned when keel writes it, and the caller keeps it in the database —
//! never beside the file, where whoever can write the file could write its digest too. An
//! artifact is deserialized only after its bytes hash to the digest the caller recorded;
//! anything else (a tampered, truncated or foreign file, or one with no recorded digest) is
//! discarded and the component recompiled from its `.wasm`, whose digest is checked first.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;

use crate::digest::sha256_hex;
use std::time::{Duration, Instant};

use wasmtime::Engine;
use wasmtime::component::Component;

use super::error::LoadError;

/// Where a loaded component came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadSource {
    /// Deserialized from a verified cached artifact.
    Cache,
    /// Compiled now (no usable artifact); the artifact was written for next time.
    Compiled { elapsed: Duration },
    /// A cached artifact failed verification and was replaced.
    Recompiled { reason: String, elapsed: Duration },
}

/// Checks the first bytes: a component, not a core module, not something else.
pub fn check_header(bytes: &[u8]) -> Result<(), LoadError> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(LoadError::NotWasm {
            reason: "it does not start with the `\\0asm` magic bytes".into(),
        });
    }
    match &bytes[4..8] {
        [1, 0, 0, 0] => Err(LoadError::CoreModule),
        [0x0d, 0, 1, 0] => Ok(()),
        other => Err(LoadError::NotWasm {
            reason: format!("unknown WebAssembly version/layer bytes {other:02x?}"),
        }),
    }
}

/// Compiles `bytes`, refusing oversized input and abandoning a compile that runs past
/// `timeout` (the compile thread finishes in the background; its result is dropped).
pub fn compile(
    engine: &Engine,
    bytes: Arc<[u8]>,
    max_bytes: u64,
    timeout: Duration,
) -> Result<Component, LoadError> {
    let size = bytes.len() as u64;
    if size > max_bytes {
        return Err(LoadError::TooLarge { size, limit: max_bytes });
    }
    check_header(&bytes)?;
    let (tx, rx) = mpsc::channel();
    let engine = engine.clone();
    std::thread::Builder::new()
        .name("keel-compile".into())
        .spawn(move || {
            let _ = tx.send(Component::new(&engine, &bytes[..]));
        })
        .map_err(|source| LoadError::Cache {
            context: "spawning the compile thread".into(),
            source,
        })?;
    match rx.recv_timeout(timeout) {
        Ok(Ok(component)) => Ok(component),
        Ok(Err(source)) => Err(LoadError::Compile { source }),
        Err(_) => Err(LoadError::CompileTimeout { limit: timeout }),
    }
}

/// The artifact cache of one engine.
pub struct ArtifactCache {
    dir: PathBuf,
}

impl ArtifactCache {
    /// The cache under `root` for the engine with compatibility hash `engine_hash`.
    pub fn new(root: &Path, engine_hash: &str) -> Self {
        Self { dir: root.join(engine_hash) }
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}.cwasm"))
    }

    /// Loads the cached artifact of `digest` if its bytes hash to `recorded` (the digest keel
    /// recorded, in its database, when it wrote the artifact). Returns the reason when an
    /// artifact exists but cannot be trusted (it is then removed); with no recorded digest a
    /// file found in the cache is never loaded.
    pub fn load(
        &self,
        engine: &Engine,
        digest: &str,
        recorded: Option<&str>,
    ) -> (Option<Component>, Option<String>) {
        let artifact = self.path(digest);
        let Ok(file) = std::fs::File::open(&artifact) else { return (None, None) };
        let reason = match recorded {
            None => {
                format!("cached artifact {} has no digest recorded by keel", artifact.display())
            }
            Some(expected) => {
                let found = match blake3::Hasher::new().update_reader(file) {
                    Ok(h) => format!("blake3:{}", h.finalize().to_hex()),
                    Err(e) => format!("unreadable: {e}"),
                };
                if expected != found {
                    format!(
                        "cached artifact {} does not match its recorded digest",
                        artifact.display()
                    )
                } else {
                    match deserialize_file(engine, &artifact) {
                        Ok(c) => return (Some(c), None),
                        Err(e) => format!(
                            "cached artifact {} cannot be loaded: {e:#}",
                            artifact.display()
                        ),
                    }
                }
            }
        };
        let _ = std::fs::remove_file(&artifact);
        (None, Some(reason))
    }

    /// Whether an artifact of `digest` is there.
    pub fn has(&self, digest: &str) -> bool {
        self.path(digest).is_file()
    }

    /// Removes the artifact of `digest`, if there is one.
    pub fn remove(&self, digest: &str) {
        let _ = std::fs::remove_file(self.path(digest));
    }

    /// Writes the artifact of `component` for `digest` (atomically: a private temporary file
    /// renamed into place) and returns the artifact's own digest, for the caller to record.
    pub fn store(&self, component: &Component, digest: &str) -> Result<String, LoadError> {
        let io = |context: &str| {
            let context = context.to_string();
            move |source| LoadError::Cache { context, source }
        };
        let bytes = component.serialize().map_err(|e| LoadError::Cache {
            context: "serializing the compiled component".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        crate::home::create_private_dir(&self.dir).map_err(io("creating the cache directory"))?;
        crate::home::write_private(&self.path(digest), &bytes)
            .map_err(io("writing the artifact"))?;
        Ok(artifact_digest(&bytes))
    }

    /// Loads `digest` from the cache (checked against `recorded`), or compiles `wasm` (after
    /// checking its digest) and caches the result. Returns the artifact digest to record when
    /// a new artifact was written.
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        digest: &str,
        recorded: Option<&str>,
        wasm: &Path,
        max_bytes: u64,
        timeout: Duration,
    ) -> Result<(Component, LoadSource, Option<String>), LoadError> {
        let (cached, reason) = self.load(engine, digest, recorded);
        if let Some(c) = cached {
            return Ok((c, LoadSource::Cache, None));
        }
        let bytes = std::fs::read(wasm).map_err(|source| LoadError::Cache {
            context: format!("reading component {}", wasm.display()),
            source,
        })?;
        let found = sha256_hex(&bytes);
        if found != digest {
            return Err(LoadError::DigestMismatch {
                path: wasm.display().to_string(),
                expected: digest.to_string(),
                found,
            });
        }
        let started = Instant::now();
        let component = compile(engine, bytes.into(), max_bytes, timeout)?;
        let elapsed = started.elapsed();
        let written = self.store(&component, digest)?;
        let source = match reason {
            Some(reason) => LoadSource::Recompiled { reason, elapsed },
            None => LoadSource::Compiled { elapsed },
        };
        Ok((component, source, Some(written)))
    }
}

/// Digest of an artifact's bytes (BLAKE3: the check runs on every load, and BLAKE3 hashes a
/// 1.3 MB artifact about three times faster than SHA-256 here).
fn artifact_digest(bytes: &[u8]) -> String {
    format!("blake3:{}", blake3::hash(bytes).to_hex())
}

#[allow(unsafe_code)]
fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: the file's bytes hashed to the digest keel recorded in its database when it
    // serialized this artifact with an engine of the same compatibility hash (the cache
    // directory is keyed by it), so it is an artifact wasmtime produced, unmodified; wasmtime
    // also checks its header and engine settings. The file is mapped rather than copied; the
    // home is private (0700) and no grant may reach it, so only its owner could rewrite the
    // file between the check and the mapping, and that owner owns the database too.
    unsafe { Component::deserialize_file(engine, path) }
}
