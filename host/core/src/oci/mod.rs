//! Components and skills as OCI artifacts: references (`oci://REGISTRY/REPOSITORY:TAG` or
//! `…@sha256:DIGEST`), pushing and pulling over the OCI distribution protocol, and the checks a
//! pull makes before anything it fetched is used.
//!
//! A component is published in the wasm OCI artifact layout other wasm tools read: an OCI
//! image manifest whose config has the media type `application/vnd.wasm.config.v0+json`
//! (created, architecture `wasm`, os `wasip2`, the layer digests, the component's imports and
//! exports) and one layer `application/wasm` holding the component's bytes unchanged (its
//! embedded signature included). A skill is one layer per file, each named by the
//! `org.opencontainers.image.title` annotation, under keel's own config media type.
//!
//! keel speaks the protocol itself ([`transport`]) so that every rule of trust is its own:
//! credentials go only to the registry they were given for, no redirect downgrades HTTPS,
//! every answer is read through a cap, every operation has a deadline and a minimum rate, and
//! every blob comes from the registry the reference names (a descriptor's `urls` are never
//! followed). Plain HTTP is used only for a registry on a loopback address. This module knows
//! nothing of the catalog or of trust: it hands back bytes whose digests it has checked.

mod manifest;
mod reference;
pub mod transport;

use std::fmt;

use reqwest::header::HeaderValue;
use reqwest::{Method, StatusCode};

pub use manifest::{Descriptor, Manifest, older};
pub use reference::{BadReference, OciRef, valid_digest};
pub use transport::Limits;
use transport::Transport;

/// The config media type of a wasm component artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of a wasm component artifact.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The config media type of a keel skill bundle.
pub const SKILL_CONFIG_MEDIA_TYPE: &str = "application/vnd.keel.skill.config.v1+json";
/// The media type of one file of a skill bundle.
pub const SKILL_FILE_MEDIA_TYPE: &str = "application/vnd.keel.skill.file.v1";
/// The media type of a skill bundle's detached signature (its config and its one layer).
pub const SKILL_SIGNATURE_MEDIA_TYPE: &str = "application/vnd.keel.skill.signature.v1+json";
/// Largest signature artifact layer accepted.
pub const MAX_SIGNATURE_BYTES: u64 = 16 * 1024;
/// The media type of an OCI image manifest.
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The annotation naming a layer's file.
pub const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";
/// The annotation holding an artifact's version (what `publish` writes: the tag).
pub const VERSION_ANNOTATION: &str = "org.opencontainers.image.version";
/// The annotation holding when an artifact was made (RFC 3339).
pub const CREATED_ANNOTATION: &str = "org.opencontainers.image.created";
/// Largest manifest accepted.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;
/// Largest config blob accepted.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// What an artifact holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    /// A WebAssembly component (one `application/wasm` layer).
    Component,
    /// A skill bundle (one layer per file).
    Skill,
    /// A skill bundle's detached signature (one small JSON layer), kept beside the bundle
    /// under the tag [`signature_tag`].
    SkillSignature,
}

/// The tag a skill bundle's signature is kept under, in the bundle's repository:
/// `sha256-HEX.keel-sig` for the manifest `sha256:HEX`.
pub fn signature_tag(manifest_digest: &str) -> String {
    format!("{}.keel-sig", manifest_digest.replacen(':', "-", 1))
}

impl ArtifactKind {
    fn config_media_type(self) -> &'static str {
        match self {
            Self::Component => WASM_CONFIG_MEDIA_TYPE,
            Self::Skill => SKILL_CONFIG_MEDIA_TYPE,
            Self::SkillSignature => SKILL_SIGNATURE_MEDIA_TYPE,
        }
    }
    fn layer_media_type(self) -> &'static str {
        match self {
            Self::Component => WASM_LAYER_MEDIA_TYPE,
            Self::Skill => SKILL_FILE_MEDIA_TYPE,
            Self::SkillSignature => SKILL_SIGNATURE_MEDIA_TYPE,
        }
    }
    fn what(self) -> &'static str {
        match self {
            Self::Component => "wasm component",
            Self::Skill => "keel skill bundle",
            Self::SkillSignature => "keel skill signature",
        }
    }
}

/// Registry credentials: a user name and a password or token, read from a secret whose value
/// is `USER:PASSWORD`. `Debug` shows no password.
#[derive(Clone)]
pub struct Credentials {
    user: String,
    password: zeroize::Zeroizing<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials").field("user", &self.user).finish_non_exhaustive()
    }
}

impl Credentials {
    /// From a secret's value, `USER:PASSWORD`.
    pub fn from_secret(value: &str) -> Result<Self, String> {
        match value.split_once(':') {
            Some((user, password)) if !user.is_empty() && !password.is_empty() => Ok(Self {
                user: user.to_string(),
                password: zeroize::Zeroizing::new(password.to_string()),
            }),
            _ => Err("a registry credential's value is USER:PASSWORD (or USER:TOKEN)".into()),
        }
    }

    /// The `Authorization: Basic …` value, marked sensitive.
    fn basic_header(&self) -> HeaderValue {
        use base64::Engine as _;
        let pair = zeroize::Zeroizing::new(format!("{}:{}", self.user, &*self.password));
        let encoded = base64::engine::general_purpose::STANDARD.encode(pair.as_bytes());
        let mut v = HeaderValue::from_str(&format!("Basic {encoded}"))
            .unwrap_or_else(|_| HeaderValue::from_static("Basic"));
        v.set_sensitive(true);
        v
    }
}

/// What went wrong speaking to a registry.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error(transparent)]
    Reference(#[from] BadReference),
    #[error("cannot reach the registry {registry}: {message}")]
    Unreachable { registry: String, message: String },
    #[error(
        "the registry {registry} refused access: {message} (give credentials with --auth SECRET, a secret whose value is USER:PASSWORD)"
    )]
    Unauthorized { registry: String, message: String },
    #[error("{reference} is not in the registry: {message}")]
    NotFound { reference: String, message: String },
    #[error(
        "digest check failed: {what} should hash to {expected}, but what the registry sent hashes to {actual}"
    )]
    Digest { what: String, expected: String, actual: String },
    #[error("{reference} is not a {expected}: {found}")]
    WrongKind { reference: String, expected: &'static str, found: String },
    #[error("{what} is {size} bytes, over the limit of {limit}")]
    TooLarge { what: String, size: u64, limit: u64 },
    #[error("{what} runs past its limit of {limit} bytes; the rest was not read")]
    Overflow { what: String, limit: u64 },
    #[error("the registry {registry} answered outside the OCI distribution protocol: {message}")]
    Protocol { registry: String, message: String },
    #[error("refused to follow the registry {registry}: {message}")]
    Refused { registry: String, message: String },
    #[error(
        "the registry {registry} did not finish within {} s (the deadline of one pull or push: [registry] pull_timeout_secs in keel.toml)",
        limit.as_secs()
    )]
    Deadline { registry: String, limit: std::time::Duration },
    #[error(
        "the registry {registry} sent {what} at {rate} bytes/s over {} s, under the minimum of {} bytes/s ([registry] min_rate_bytes_per_sec and rate_window_secs in keel.toml)",
        limits.rate_window.as_secs(), limits.min_rate
    )]
    TooSlow { registry: String, what: String, rate: u64, limits: Limits },
    #[error(
        "{reference}: the tag now names {now}, not {expected}; run `keel tool outdated` again to see what it names"
    )]
    TagMoved { reference: String, expected: String, now: String },
}

impl OciError {
    /// A short name of the kind of failure, for `--json` output and exit codes.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Reference(_) => "invalid_reference",
            Self::Unreachable { .. } => "registry_unreachable",
            Self::Unauthorized { .. } => "registry_unauthorized",
            Self::NotFound { .. } => "not_found",
            Self::Digest { .. } => "digest_mismatch",
            Self::WrongKind { .. } => "wrong_artifact",
            Self::TooLarge { .. } | Self::Overflow { .. } => "too_large",
            Self::Protocol { .. } => "registry_protocol",
            Self::Refused { .. } => "registry_refused",
            Self::Deadline { .. } => "registry_timeout",
            Self::TooSlow { .. } => "registry_too_slow",
            Self::TagMoved { .. } => "tag_moved",
        }
    }
}

/// What a push published.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Pushed {
    /// The reference pushed to (with its tag).
    pub reference: String,
    /// The manifest's digest.
    pub digest: String,
    /// The reference by digest, which always names these bytes.
    pub pinned: String,
    /// Bytes of the layers.
    pub size: u64,
    /// The tag already named these very layers under the same version: nothing was pushed,
    /// and `digest` is the manifest that was there (publishing the same bytes again is a
    /// no-op, so the tag does not move).
    pub unchanged: bool,
    /// The version annotation of the manifest: the version the component carries, else the
    /// tag.
    pub version: String,
}

/// What a manifest says of its artifact besides its blobs: the version (the component's own
/// when it carries one, else the tag), the title (the component's name, when it carries one)
/// and, only for an artifact without a version of its own, when it was made. An artifact that
/// carries its version is published with a manifest that depends on nothing but its bytes and
/// labels, so publishing it again makes the same digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Labels {
    pub version: String,
    pub title: Option<String>,
    pub created: Option<String>,
}

impl Labels {
    /// The labels of an artifact without a version of its own: the tag, and now.
    pub fn tagged(tag: &str) -> Self {
        Self { version: tag.to_string(), title: None, created: Some(manifest::now()) }
    }

    /// The labels of a component that carries `version` (and maybe its name): no time.
    pub fn carried(version: &str, title: Option<&str>) -> Self {
        Self { version: version.to_string(), title: title.map(str::to_string), created: None }
    }

    fn annotations(&self) -> serde_json::Value {
        let mut a = serde_json::Map::new();
        a.insert(VERSION_ANNOTATION.into(), self.version.clone().into());
        if let Some(c) = &self.created {
            a.insert(CREATED_ANNOTATION.into(), c.clone().into());
        }
        if let Some(t) = &self.title {
            a.insert(TITLE_ANNOTATION.into(), t.clone().into());
        }
        a.into()
    }
}

/// The config time of an artifact that carries its version (the wasm config requires one).
pub const REPRODUCIBLE_TIME: &str = "1970-01-01T00:00:00Z";

/// Most tags a repository's list is read for (`tool outdated`); the list is read through
/// [`MAX_MANIFEST_BYTES`] as well.
pub const MAX_TAGS: usize = 10_000;

/// What a pull fetched, every digest checked.
#[derive(Debug)]
pub struct Pulled {
    /// The manifest's digest (what the tag named when it was pulled).
    pub digest: String,
    /// The layers: the title annotation (empty for a component's layer) and the bytes.
    pub files: Vec<(String, Vec<u8>)>,
}

/// A client of one registry for one operation (its deadline starts when it is made).
#[derive(Debug)]
pub struct Registry {
    t: Transport,
}

fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", crate::digest::sha256_hex(bytes))
}

impl Registry {
    /// A client of `reference`'s registry: HTTPS, or plain HTTP for a loopback registry. The
    /// credentials are bound to that registry: nothing else ever receives them.
    pub fn new(
        reference: &OciRef,
        credentials: Option<Credentials>,
        limits: Limits,
    ) -> Result<Self, OciError> {
        let t = Transport::new(&reference.registry, reference.is_loopback(), credentials, limits)?;
        Ok(Self { t })
    }

    /// The error an answer of `status` stands for.
    async fn failed(&self, reference: &OciRef, resp: reqwest::Response) -> OciError {
        let status = resp.status();
        let text = self.t.error_text(resp).await;
        let mut message = format!("{status}: {text}");
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            message.push_str(&self.t.withheld_note());
        }
        let registry = self.t.registry.clone();
        match status {
            StatusCode::NOT_FOUND => {
                OciError::NotFound { reference: reference.to_string(), message }
            }
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                OciError::Unauthorized { registry, message }
            }
            _ => OciError::Protocol { registry, message },
        }
    }

    /// Pushes a component (its bytes unchanged) to `reference`, which must name a tag, with
    /// the config other wasm tools read: its imports and exports. `version` and `name` are
    /// what the component carries, if anything ([`Labels`]).
    pub async fn push_component(
        &self,
        reference: &OciRef,
        bytes: Vec<u8>,
        imports: Vec<String>,
        exports: Vec<String>,
        version: Option<&str>,
        name: Option<&str>,
    ) -> Result<Pushed, OciError> {
        let labels = match version {
            Some(v) => Labels::carried(v, name),
            None => Labels::tagged(reference.tag.as_deref().unwrap_or_default()),
        };
        let mut config = serde_json::json!({
            "author": null,
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [sha256_digest(&bytes)],
            "component": {"exports": exports, "imports": imports, "target": null},
        });
        // The wasm config requires a time: a component that carries its version gets the Unix
        // epoch, so its config, like its manifest, depends only on its bytes and version.
        let created = labels.created.clone().unwrap_or_else(|| REPRODUCIBLE_TIME.to_string());
        config["created"] = created.into();
        let layers = vec![(WASM_LAYER_MEDIA_TYPE, None, bytes)];
        self.push(reference, ArtifactKind::Component, layers, config, labels).await
    }

    /// Pushes a skill's files (path and bytes, `SKILL.md` among them) to `reference`, one
    /// layer per file named by its title annotation.
    pub async fn push_skill(
        &self,
        reference: &OciRef,
        name: &str,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<Pushed, OciError> {
        let config = serde_json::json!({
            "created": manifest::now(),
            "name": name,
            "layerDigests": files.iter().map(|f| sha256_digest(&f.1)).collect::<Vec<_>>(),
        });
        let layers =
            files.into_iter().map(|(path, bytes)| (SKILL_FILE_MEDIA_TYPE, Some(path), bytes));
        let labels = Labels::tagged(reference.tag.as_deref().unwrap_or_default());
        self.push(reference, ArtifactKind::Skill, layers.collect(), config, labels).await
    }

    /// Pushes `signature` (the signature document's bytes) for the skill bundle `manifest_digest`
    /// in `reference`'s repository, under [`signature_tag`].
    pub async fn push_signature(
        &self,
        reference: &OciRef,
        manifest_digest: &str,
        signature: Vec<u8>,
    ) -> Result<Pushed, OciError> {
        let tagged =
            OciRef { tag: Some(signature_tag(manifest_digest)), digest: None, ..reference.clone() };
        let config = serde_json::json!({"created": manifest::now(), "signs": manifest_digest});
        let layers = vec![(SKILL_SIGNATURE_MEDIA_TYPE, None, signature)];
        let labels = Labels::tagged(tagged.tag.as_deref().unwrap_or_default());
        self.push(&tagged, ArtifactKind::SkillSignature, layers, config, labels).await
    }

    /// The signature document kept for the skill bundle `manifest_digest` in `reference`'s
    /// repository (read through [`MAX_SIGNATURE_BYTES`], its digests checked), or `None`
    /// when there is none.
    pub async fn signature(
        &self,
        reference: &OciRef,
        manifest_digest: &str,
    ) -> Result<Option<Vec<u8>>, OciError> {
        let tagged =
            OciRef { tag: Some(signature_tag(manifest_digest)), digest: None, ..reference.clone() };
        let m = match self.manifest(&tagged, ArtifactKind::SkillSignature).await {
            Ok(m) => m,
            Err(OciError::NotFound { .. }) => return Ok(None),
            // Something else under the signature's tag is no signature: an empty document,
            // which verifies with no key.
            Err(OciError::WrongKind { .. }) => return Ok(Some(Vec::new())),
            Err(e) => return Err(e),
        };
        let pulled = self.fetch(&tagged, &m, MAX_SIGNATURE_BYTES).await?;
        Ok(pulled.files.into_iter().next().map(|f| f.1))
    }

    async fn push(
        &self,
        reference: &OciRef,
        kind: ArtifactKind,
        layers: Vec<(&'static str, Option<String>, Vec<u8>)>,
        config: serde_json::Value,
        labels: Labels,
    ) -> Result<Pushed, OciError> {
        let Some(tag) = reference.tag.clone().filter(|_| reference.digest.is_none()) else {
            return Err(BadReference {
                reference: reference.to_string(),
                problem: "publishing needs a tag and no digest (the digest is what a push makes)"
                    .into(),
            }
            .into());
        };
        let size = layers.iter().map(|l| l.2.len() as u64).sum();
        if let Some(digest) = self.holds(reference, kind, &layers, &labels.version).await {
            return Ok(Pushed {
                reference: reference.to_string(),
                pinned: reference.by_digest(&digest).to_string(),
                digest,
                size,
                unchanged: true,
                version: labels.version,
            });
        }
        let config = serde_json::to_vec(&config).unwrap_or_default();
        let body = Manifest::encode(kind.config_media_type(), &config, &layers, &labels);
        let digest = sha256_digest(&body);
        for (_, _, bytes) in &layers {
            self.push_blob(reference, bytes).await?;
        }
        self.push_blob(reference, &config).await?;
        // The manifest as these bytes, so the digest printed is the digest stored.
        let url = self.t.url(&format!("{}/manifests/{tag}", reference.repository))?;
        let sent = Some((bytes::Bytes::from(body), OCI_MANIFEST_MEDIA_TYPE));
        let resp = self.t.send(Method::PUT, url, None, sent).await?;
        if !resp.status().is_success() {
            return Err(self.failed(reference, resp).await);
        }
        Ok(Pushed {
            reference: reference.to_string(),
            pinned: reference.by_digest(&digest).to_string(),
            digest,
            size,
            unchanged: false,
            version: labels.version,
        })
    }

    /// The digest of the manifest `reference`'s tag names now, when it holds exactly `layers`
    /// (media type, digest, size and title, in order) of `kind`, under version `version`: a
    /// push of them would only make a new build time. `None` when the tag is not there, holds
    /// something else, or cannot be read (the push then goes ahead and says what is wrong).
    async fn holds(
        &self,
        reference: &OciRef,
        kind: ArtifactKind,
        layers: &[(&'static str, Option<String>, Vec<u8>)],
        version: &str,
    ) -> Option<String> {
        let now = self.manifest(reference, kind).await.ok()?;
        let same = now.version() == Some(version)
            && now.layers.len() == layers.len()
            && now.layers.iter().zip(layers).all(|(d, (media_type, title, bytes))| {
                d.media_type == *media_type
                    && d.digest == sha256_digest(bytes)
                    && d.size == bytes.len() as u64
                    && d.title == *title
            });
        same.then_some(now.digest)
    }

    /// One blob, unless the repository holds it already: a upload session, then its bytes in
    /// one request to the `Location` the registry gave (spoken to without credentials when it
    /// is another host).
    async fn push_blob(&self, reference: &OciRef, bytes: &[u8]) -> Result<(), OciError> {
        let digest = sha256_digest(bytes);
        let repo = &reference.repository;
        let head = self.t.url(&format!("{repo}/blobs/{digest}"))?;
        let resp = self.t.send(Method::HEAD, head, None, None).await?;
        if resp.status().is_success() {
            return Ok(());
        }
        let start = self.t.url(&format!("{repo}/blobs/uploads/"))?;
        let resp = self.t.send(Method::POST, start.clone(), None, None).await?;
        if resp.status() != StatusCode::ACCEPTED {
            return Err(self.failed(reference, resp).await);
        }
        let mut at = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .and_then(|l| start.join(l).ok())
            .ok_or_else(|| self.t.protocol("an upload without a usable Location".into()))?;
        self.t.check_hop(&start, &at, "the upload location")?;
        at.query_pairs_mut().append_pair("digest", &digest);
        let body = Some((bytes::Bytes::copy_from_slice(bytes), "application/octet-stream"));
        let resp = self.t.send(Method::PUT, at, None, body).await?;
        if !resp.status().is_success() {
            return Err(self.failed(reference, resp).await);
        }
        Ok(())
    }

    /// The manifest `reference` names, read through [`MAX_MANIFEST_BYTES`] and checked: it
    /// hashes to the reference's digest (when it gives one; when it gives a tag too, the tag
    /// must still name it), it is one artifact of `kind` (not an index), its layers are of
    /// `kind`'s media type with sha256 digests. Nothing is fetched but the manifest.
    pub async fn manifest(
        &self,
        reference: &OciRef,
        kind: ArtifactKind,
    ) -> Result<Manifest, OciError> {
        let (raw, digest) = self.manifest_bytes(reference, reference.manifest_ref()).await?;
        if let (Some(_), Some(want)) = (&reference.tag, &reference.digest) {
            let tag = reference.tag.as_deref().unwrap_or_default();
            let (_, now) = self.manifest_bytes(reference, tag).await?;
            if now != *want {
                return Err(OciError::TagMoved {
                    reference: reference.to_string(),
                    expected: want.clone(),
                    now,
                });
            }
        }
        let wrong = |found: String| OciError::WrongKind {
            reference: reference.to_string(),
            expected: kind.what(),
            found,
        };
        let m = Manifest::parse(&raw, digest).map_err(wrong)?;
        if m.config.media_type != kind.config_media_type() {
            return Err(wrong(format!("its config is {:.100}", m.config.media_type)));
        }
        if m.layers.is_empty() || (kind != ArtifactKind::Skill && m.layers.len() != 1) {
            return Err(wrong(format!("it has {} layers", m.layers.len())));
        }
        for l in &m.layers {
            if l.media_type != kind.layer_media_type() {
                return Err(wrong(format!("a layer is {:.100}", l.media_type)));
            }
        }
        Ok(m)
    }

    /// The digest of what `reference` names now, from the manifest's bytes (what an install
    /// would get, not a header).
    pub async fn resolve(&self, reference: &OciRef) -> Result<String, OciError> {
        Ok(self.manifest_bytes(reference, reference.manifest_ref()).await?.1)
    }

    /// The tags of `reference`'s repository (`GET /v2/NAME/tags/list`), read through
    /// [`MAX_MANIFEST_BYTES`], at most [`MAX_TAGS`] of them.
    pub async fn tags(&self, reference: &OciRef) -> Result<Vec<String>, OciError> {
        let url = self.t.url(&format!("{}/tags/list?n={MAX_TAGS}", reference.repository))?;
        let resp = self.t.send(Method::GET, url, None, None).await?;
        if !resp.status().is_success() {
            return Err(self.failed(reference, resp).await);
        }
        let raw = self.t.read(resp, MAX_MANIFEST_BYTES, "the tag list").await?;
        #[derive(serde::Deserialize)]
        struct TagList {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let list: TagList = serde_json::from_slice(&raw).map_err(|e| OciError::Protocol {
            registry: reference.registry.clone(),
            message: format!("its tag list is not what the protocol says: {e}"),
        })?;
        Ok(list.tags.unwrap_or_default().into_iter().take(MAX_TAGS).collect())
    }

    /// A manifest's bytes and their digest, by tag or digest (`name`).
    async fn manifest_bytes(
        &self,
        reference: &OciRef,
        name: &str,
    ) -> Result<(Vec<u8>, String), OciError> {
        let url = self.t.url(&format!("{}/manifests/{name}", reference.repository))?;
        let accept = Some(manifest::ACCEPT);
        let resp = self.t.send(Method::GET, url, accept, None).await?;
        if !resp.status().is_success() {
            return Err(self.failed(reference, resp).await);
        }
        let said_index = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|c| c.to_str().ok())
            .is_some_and(manifest::is_index);
        let header_digest = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|d| d.to_str().ok())
            .map(str::to_string);
        let raw = self.t.read(resp, MAX_MANIFEST_BYTES, "the manifest").await?;
        let digest = sha256_digest(&raw);
        let expected = if name.starts_with("sha256:") { Some(name.to_string()) } else { None };
        if let Some(want) = expected.or(header_digest.filter(|d| d.starts_with("sha256:")))
            && want != digest
        {
            return Err(OciError::Digest {
                what: "the manifest".into(),
                expected: want,
                actual: digest,
            });
        }
        if said_index {
            return Err(OciError::WrongKind {
                reference: reference.to_string(),
                expected: "single artifact",
                found: "the registry serves it as an image index".into(),
            });
        }
        Ok((raw, digest))
    }

    /// Fetches the config and every layer of `m` (from the registry the reference names, never
    /// a descriptor's `urls`), refusing first when the layers hold more than `max_bytes`; each
    /// blob is read no further than its descriptor's size and must hash to its digest.
    pub async fn fetch(
        &self,
        reference: &OciRef,
        m: &Manifest,
        max_bytes: u64,
    ) -> Result<Pulled, OciError> {
        let total = m.layers.iter().fold(0u64, |a, l| a.saturating_add(l.size));
        if total > max_bytes {
            return Err(OciError::TooLarge {
                what: reference.to_string(),
                size: total,
                limit: max_bytes,
            });
        }
        if m.config.size > MAX_CONFIG_BYTES {
            return Err(OciError::TooLarge {
                what: "the config".into(),
                size: m.config.size,
                limit: MAX_CONFIG_BYTES,
            });
        }
        self.blob(reference, &m.config, "the config").await?;
        let mut files = Vec::with_capacity(m.layers.len());
        for l in &m.layers {
            let title = l.title.clone().unwrap_or_default();
            let what = if title.is_empty() {
                "the component".to_string()
            } else {
                format!("`{title:.200}`")
            };
            files.push((title, self.blob(reference, l, &what).await?));
        }
        Ok(Pulled { digest: m.digest.clone(), files })
    }

    /// [`manifest`](Self::manifest), then [`fetch`](Self::fetch).
    #[cfg(any(test, feature = "internals"))]
    pub async fn pull(
        &self,
        reference: &OciRef,
        kind: ArtifactKind,
        max_bytes: u64,
    ) -> Result<Pulled, OciError> {
        let m = self.manifest(reference, kind).await?;
        self.fetch(reference, &m, max_bytes).await
    }

    /// One blob, no longer than its descriptor says, hashing to its digest.
    async fn blob(
        &self,
        reference: &OciRef,
        d: &Descriptor,
        what: &str,
    ) -> Result<Vec<u8>, OciError> {
        let url = self.t.url(&format!("{}/blobs/{}", reference.repository, d.digest))?;
        let resp = self.t.send(Method::GET, url, None, None).await?;
        if !resp.status().is_success() {
            return Err(self.failed(reference, resp).await);
        }
        let bytes = self.t.read(resp, d.size, what).await?;
        let actual = sha256_digest(&bytes);
        if actual != d.digest || bytes.len() as u64 != d.size {
            return Err(OciError::Digest {
                what: what.to_string(),
                expected: d.digest.clone(),
                actual,
            });
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_user_colon_password_and_hide_it() {
        let c = Credentials::from_secret("ci:s3cret-token").expect("parses");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(Credentials::from_secret("no-colon").is_err());
        assert!(Credentials::from_secret(":pw").is_err());
        let h = c.basic_header();
        assert!(h.is_sensitive());
        assert_eq!(h.to_str().unwrap(), "Basic Y2k6czNjcmV0LXRva2Vu");
    }
}
