//! Compiling components, bounded, and the on-disk cache of compiled artifacts.
//!
//! Artifacts live at `CACHE/<engine-hash>/<component-sha256>.cwasm`, each with a sidecar
//! `.sha256` sidecar holding the artifact's own digest (BLAKE3), written when keel produced it. An artifact is
//! deserialized only after its bytes hash to that digest; anything else (a tampered or
//! truncated file, a missing sidecar) is discarded and the component recompiled from its
//! `.wasm`, whose digest is checked first.

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

    fn paths(&self, digest: &str) -> (PathBuf, PathBuf) {
        (self.dir.join(format!("{digest}.cwasm")), self.dir.join(format!("{digest}.cwasm.sha256")))
    }

    /// Loads the verified cached artifact of `digest`, if there is one. Returns the reason
    /// when an artifact exists but cannot be trusted (it is then removed).
    pub fn load(&self, engine: &Engine, digest: &str) -> (Option<Component>, Option<String>) {
        let (artifact, sidecar) = self.paths(digest);
        let Ok(file) = std::fs::File::open(&artifact) else { return (None, None) };
        let expected = std::fs::read_to_string(&sidecar).unwrap_or_default();
        let found = match blake3::Hasher::new().update_reader(file) {
            Ok(h) => format!("blake3:{}", h.finalize().to_hex()),
            Err(e) => format!("unreadable: {e}"),
        };
        let reason = if expected.trim() != found {
            format!("cached artifact {} does not match its recorded digest", artifact.display())
        } else {
            match deserialize_file(engine, &artifact) {
                Ok(c) => return (Some(c), None),
                Err(e) => format!("cached artifact {} cannot be loaded: {e:#}", artifact.display()),
            }
        };
        let _ = std::fs::remove_file(&artifact);
        let _ = std::fs::remove_file(&sidecar);
        (None, Some(reason))
    }

    /// Writes the artifact of `component` for `digest` (atomically: temp file + rename).
    pub fn store(&self, component: &Component, digest: &str) -> Result<(), LoadError> {
        let io = |context: &str| {
            let context = context.to_string();
            move |source| LoadError::Cache { context, source }
        };
        let bytes = component.serialize().map_err(|e| LoadError::Cache {
            context: "serializing the compiled component".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        std::fs::create_dir_all(&self.dir).map_err(io("creating the cache directory"))?;
        let (artifact, sidecar) = self.paths(digest);
        let tmp = artifact.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, &bytes).map_err(io("writing the artifact"))?;
        std::fs::write(&sidecar, artifact_digest(&bytes))
            .map_err(io("writing the artifact digest"))?;
        std::fs::rename(&tmp, &artifact).map_err(io("publishing the artifact"))?;
        Ok(())
    }

    /// Loads `digest` from the cache, or compiles `wasm` (after checking its digest) and
    /// caches the result.
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        digest: &str,
        wasm: &Path,
        max_bytes: u64,
        timeout: Duration,
    ) -> Result<(Component, LoadSource), LoadError> {
        let (cached, reason) = self.load(engine, digest);
        if let Some(c) = cached {
            return Ok((c, LoadSource::Cache));
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
        self.store(&component, digest)?;
        let source = match reason {
            Some(reason) => LoadSource::Recompiled { reason, elapsed },
            None => LoadSource::Compiled { elapsed },
        };
        Ok((component, source))
    }
}

/// Digest of an artifact's bytes (BLAKE3: the check runs on every load, and BLAKE3 hashes a
/// 1.3 MB artifact about three times faster than SHA-256 here).
fn artifact_digest(bytes: &[u8]) -> String {
    format!("blake3:{}", blake3::hash(bytes).to_hex())
}

#[allow(unsafe_code)]
fn deserialize_file(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // SAFETY: the file's bytes hashed to the digest keel recorded when it serialized this
    // artifact with an engine of the same compatibility hash (the cache directory is keyed by
    // it), so it is an artifact wasmtime produced, unmodified; wasmtime also checks its header
    // and engine settings. The file is mapped rather than copied; a process that could rewrite
    // it between the check and the mapping already owns the keel home (database included), so
    // the check guards against corruption and tampering at rest, not against the home's owner.
    unsafe { Component::deserialize_file(engine, path) }
}
