//! Components and skills as OCI artifacts: references (`oci://REGISTRY/REPOSITORY:TAG` or
//! `…@sha256:DIGEST`), pushing and pulling over the OCI distribution protocol, and the digest
//! checks a pull makes before anything it fetched is used.
//!
//! A component is published in the wasm OCI artifact layout other wasm tools read: an OCI
//! image manifest whose config has the media type `application/vnd.wasm.config.v0+json`
//! (created, architecture `wasm`, os `wasip2`, the layer digests, the component's imports and
//! exports) and one layer `application/wasm` holding the component's bytes unchanged (its
//! embedded signature included). A skill is one layer per file, each named by the
//! `org.opencontainers.image.title` annotation, under keel's own config media type.
//!
//! Plain HTTP is used only for a registry on a loopback address; every other registry is
//! spoken to over HTTPS. This module knows nothing of the catalog or of trust: it hands back
//! bytes whose digests it has checked.

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;

/// The config media type of a wasm component artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of a wasm component artifact.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The config media type of a keel skill bundle.
pub const SKILL_CONFIG_MEDIA_TYPE: &str = "application/vnd.keel.skill.config.v1+json";
/// The media type of one file of a skill bundle.
pub const SKILL_FILE_MEDIA_TYPE: &str = "application/vnd.keel.skill.file.v1";
/// The annotation naming a layer's file.
pub const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";
/// Largest manifest accepted.
pub const MAX_MANIFEST_BYTES: usize = 1 << 20;
/// Largest config blob accepted.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// What an artifact holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    /// A WebAssembly component (one `application/wasm` layer).
    Component,
    /// A skill bundle (one layer per file).
    Skill,
}

impl ArtifactKind {
    fn config_media_type(self) -> &'static str {
        match self {
            Self::Component => WASM_CONFIG_MEDIA_TYPE,
            Self::Skill => SKILL_CONFIG_MEDIA_TYPE,
        }
    }
    fn layer_media_type(self) -> &'static str {
        match self {
            Self::Component => WASM_LAYER_MEDIA_TYPE,
            Self::Skill => SKILL_FILE_MEDIA_TYPE,
        }
    }
    fn what(self) -> &'static str {
        match self {
            Self::Component => "wasm component",
            Self::Skill => "keel skill bundle",
        }
    }
}

/// A registry reference: `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciRef {
    /// Host, and port if given (`ghcr.io`, `127.0.0.1:5000`).
    pub registry: String,
    /// The repository path (`acme/csv`).
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:` and 64 hex digits.
    pub digest: Option<String>,
}

/// Why a reference was refused.
#[derive(Debug, thiserror::Error)]
#[error(
    "`{reference}` is not a registry reference ({problem}); write oci://REGISTRY/REPOSITORY:TAG or oci://REGISTRY/REPOSITORY@sha256:DIGEST"
)]
pub struct BadReference {
    pub reference: String,
    pub problem: String,
}

fn valid_repository(repo: &str) -> bool {
    // Path components of lowercase letters and digits, joined by `.`, `_`, `__` or runs of `-`.
    !repo.is_empty()
        && repo.len() <= 255
        && repo.split('/').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"._-".contains(c))
                && !part.contains("..")
                && !part.contains("___")
        })
}

fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
}

/// Whether `digest` is `sha256:` and 64 lowercase hex digits.
pub fn valid_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64 && h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    })
}

fn valid_registry(host: &str) -> bool {
    let (name, port) = match host.rsplit_once(':') {
        Some((n, p)) if !n.ends_with(']') || host.starts_with('[') => (n, Some(p)),
        _ => (host, None),
    };
    let name_ok = if let Some(inner) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !name.is_empty()
            && name.len() <= 253
            && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'.' || c == b'-')
    };
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0));
    // Without a `.`, a `:` or `localhost`, the first part is a repository path, not a host.
    name_ok && port_ok && (name.contains('.') || port.is_some() || name == "localhost")
}

impl FromStr for OciRef {
    type Err = BadReference;

    fn from_str(s: &str) -> Result<Self, BadReference> {
        let bad = |problem: &str| BadReference {
            reference: s.chars().take(200).collect(),
            problem: problem.to_string(),
        };
        let rest = s.strip_prefix("oci://").ok_or_else(|| bad("it does not start with oci://"))?;
        let (registry, path) =
            rest.split_once('/').ok_or_else(|| bad("there is no repository after the registry"))?;
        if !valid_registry(registry) {
            return Err(bad(
                "the registry must be a host name with a `.`, a port, or `localhost` (ghcr.io, \
                 127.0.0.1:5000)",
            ));
        }
        let (path, digest) = match path.split_once('@') {
            Some((p, d)) => (p, Some(d.to_string())),
            None => (path, None),
        };
        if let Some(d) = &digest
            && !valid_digest(d)
        {
            return Err(bad("the digest must be sha256: and 64 lowercase hex digits"));
        }
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) => (r, Some(t.to_string())),
            None => (path, None),
        };
        if !valid_repository(repository) {
            return Err(bad(
                "the repository must be lowercase letters and digits, joined by `.`, `_`, `-` \
                 or `/`",
            ));
        }
        if let Some(t) = &tag
            && !valid_tag(t)
        {
            return Err(bad("a tag is letters, digits, `_`, `.` and `-`, at most 128"));
        }
        if tag.is_none() && digest.is_none() {
            return Err(bad("it names neither a tag nor a digest"));
        }
        Ok(Self { registry: registry.to_string(), repository: repository.to_string(), tag, digest })
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "oci://{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl OciRef {
    /// The package a publisher's trust scope is matched against: `REGISTRY/REPOSITORY`.
    pub fn package(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The same repository, by `digest` alone.
    pub fn by_digest(&self, digest: &str) -> Self {
        Self { tag: None, digest: Some(digest.to_string()), ..self.clone() }
    }

    /// The same repository and tag, with no digest.
    pub fn by_tag(&self) -> Option<Self> {
        self.tag.as_ref().map(|_| Self { digest: None, ..self.clone() })
    }

    /// Whether the registry is on a loopback address (`localhost`, `127.0.0.0/8`, `::1`): the
    /// only registries spoken to over plain HTTP.
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((h, p)) if p.parse::<u16>().is_ok() => h,
            _ => self.registry.as_str(),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    fn client_ref(&self) -> oci_client::Reference {
        let (r, p) = (self.registry.clone(), self.repository.clone());
        match (&self.tag, &self.digest) {
            (Some(t), Some(d)) => {
                oci_client::Reference::with_tag_and_digest(r, p, t.clone(), d.clone())
            }
            (None, Some(d)) => oci_client::Reference::with_digest(r, p, d.clone()),
            (Some(t), None) => oci_client::Reference::with_tag(r, p, t.clone()),
            (None, None) => oci_client::Reference::with_tag(r, p, "latest".into()),
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
    #[error("the registry {registry} answered outside the OCI distribution protocol: {message}")]
    Protocol { registry: String, message: String },
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
            Self::TooLarge { .. } => "too_large",
            Self::Protocol { .. } => "registry_protocol",
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
}

/// What a pull fetched, every digest checked.
#[derive(Debug)]
pub struct Pulled {
    /// The manifest's digest (what the tag named when it was pulled).
    pub digest: String,
    /// The layers: the title annotation (empty for a component's layer) and the bytes.
    pub files: Vec<(String, Vec<u8>)>,
}

/// A client of one registry.
pub struct Registry {
    client: oci_client::Client,
    auth: RegistryAuth,
    registry: String,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry").field("registry", &self.registry).finish_non_exhaustive()
    }
}

fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", crate::digest::sha256_hex(bytes))
}

/// A writer into memory that refuses to grow past `limit` bytes.
struct Capped {
    out: Vec<u8>,
    limit: u64,
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if (self.out.len() + buf.len()) as u64 > self.limit {
            return Poll::Ready(Err(std::io::Error::other(format!(
                "the registry sent more than the {} bytes the manifest gives",
                self.limit
            ))));
        }
        self.out.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl Registry {
    /// A client of `reference`'s registry: HTTPS, or plain HTTP for a loopback registry.
    pub fn new(reference: &OciRef, credentials: Option<&Credentials>) -> Self {
        crate::tls::init();
        let protocol = if reference.is_loopback() {
            ClientProtocol::HttpsExcept(vec![reference.registry.clone()])
        } else {
            ClientProtocol::Https
        };
        let client = oci_client::Client::new(ClientConfig {
            protocol,
            connect_timeout: Some(Duration::from_secs(10)),
            read_timeout: Some(Duration::from_secs(60)),
            user_agent: concat!("keel/", env!("CARGO_PKG_VERSION")),
            // One request per blob, with its digest: what every registry accepts.
            use_monolithic_push: true,
            ..ClientConfig::default()
        });
        let auth = match credentials {
            Some(c) => RegistryAuth::Basic(c.user.clone(), c.password.to_string()),
            None => RegistryAuth::Anonymous,
        };
        Self { client, auth, registry: reference.registry.clone() }
    }

    fn error(&self, reference: &OciRef, e: OciDistributionError) -> OciError {
        let registry = self.registry.clone();
        let message = e.to_string();
        match e {
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => {
                OciError::Unauthorized { registry, message }
            }
            OciDistributionError::ImageManifestNotFoundError(_) => {
                OciError::NotFound { reference: reference.to_string(), message }
            }
            OciDistributionError::DigestError(
                oci_client::errors::DigestError::VerificationError { expected, actual },
            ) => OciError::Digest { what: "a blob".into(), expected, actual },
            OciDistributionError::RegistryError { envelope, .. } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::BlobUnknown
                            | OciErrorCode::NotFound
                    )
                }) {
                    OciError::NotFound { reference: reference.to_string(), message }
                } else if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    OciError::Unauthorized { registry, message }
                } else {
                    OciError::Protocol { registry, message }
                }
            }
            OciDistributionError::ServerError { code: 404, .. } => {
                OciError::NotFound { reference: reference.to_string(), message }
            }
            OciDistributionError::ServerError { code: 401 | 403, .. } => {
                OciError::Unauthorized { registry, message }
            }
            OciDistributionError::RequestError(r) if r.is_connect() || r.is_timeout() => {
                let mut message = r.to_string();
                let mut source = std::error::Error::source(&r);
                while let Some(s) = source {
                    message = format!("{message}: {s}");
                    source = s.source();
                }
                OciError::Unreachable { registry, message }
            }
            _ => OciError::Protocol { registry, message },
        }
    }

    /// Pushes a component (its bytes unchanged) to `reference`, which must name a tag, with
    /// the config other wasm tools read: its imports and exports.
    pub async fn push_component(
        &self,
        reference: &OciRef,
        bytes: Vec<u8>,
        imports: Vec<String>,
        exports: Vec<String>,
    ) -> Result<Pushed, OciError> {
        let config = serde_json::json!({
            "created": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "author": null,
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [sha256_digest(&bytes)],
            "component": {"exports": exports, "imports": imports, "target": null},
        });
        let layer = ImageLayer::new(bytes, WASM_LAYER_MEDIA_TYPE.into(), None);
        self.push(reference, ArtifactKind::Component, vec![layer], config).await
    }

    /// Pushes a skill's files (path and bytes, `SKILL.md` among them) to `reference`, one
    /// layer per file named by its title annotation.
    pub async fn push_skill(
        &self,
        reference: &OciRef,
        name: &str,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<Pushed, OciError> {
        let layers: Vec<ImageLayer> = files
            .into_iter()
            .map(|(path, bytes)| {
                let annotations = BTreeMap::from([(TITLE_ANNOTATION.to_string(), path)]);
                ImageLayer::new(bytes, SKILL_FILE_MEDIA_TYPE.into(), Some(annotations))
            })
            .collect();
        let config = serde_json::json!({
            "created": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            "name": name,
            "layerDigests": layers.iter().map(|l| sha256_digest(&l.data)).collect::<Vec<_>>(),
        });
        self.push(reference, ArtifactKind::Skill, layers, config).await
    }

    async fn push(
        &self,
        reference: &OciRef,
        kind: ArtifactKind,
        layers: Vec<ImageLayer>,
        config: serde_json::Value,
    ) -> Result<Pushed, OciError> {
        if reference.tag.is_none() || reference.digest.is_some() {
            return Err(BadReference {
                reference: reference.to_string(),
                problem: "publishing needs a tag and no digest (the digest is what a push makes)"
                    .into(),
            }
            .into());
        }
        let config = Config::new(
            serde_json::to_vec(&config).unwrap_or_default(),
            kind.config_media_type().into(),
            None,
        );
        let manifest = OciImageManifest::build(&layers, &config, None);
        let body = serde_json::to_vec(&manifest).map_err(|e| OciError::Protocol {
            registry: self.registry.clone(),
            message: format!("cannot encode the manifest: {e}"),
        })?;
        let digest = sha256_digest(&body);
        let size = layers.iter().map(|l| l.data.len() as u64).sum();
        let cref = reference.client_ref();
        let err = |e| self.error(reference, e);
        self.client.store_auth_if_needed(&self.registry, &self.auth).await;
        for (layer, d) in layers.iter().zip(&manifest.layers) {
            self.client.push_blob(&cref, layer.data.clone(), &d.digest).await.map_err(err)?;
        }
        self.client.push_blob(&cref, config.data, &manifest.config.digest).await.map_err(err)?;
        // The manifest as these bytes, so the digest printed is the digest stored.
        let content_type = http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE);
        self.client.push_manifest_raw(&cref, body, content_type).await.map_err(err)?;
        Ok(Pushed {
            reference: reference.to_string(),
            pinned: reference.by_digest(&digest).to_string(),
            digest,
            size,
        })
    }

    /// The digest of the manifest `reference` names now (for a tag: what it names today).
    pub async fn resolve(&self, reference: &OciRef) -> Result<String, OciError> {
        let digest = self
            .client
            .fetch_manifest_digest(&reference.client_ref(), &self.auth)
            .await
            .map_err(|e| self.error(reference, e))?;
        if !valid_digest(&digest) {
            return Err(OciError::Protocol {
                registry: self.registry.clone(),
                message: format!("a manifest digest that is not sha256: {digest:.80}"),
            });
        }
        Ok(digest)
    }

    /// Pulls the artifact `reference` names, of `kind`, at most `max_bytes` in all. Checks, in
    /// order: the manifest hashes to the reference's digest (when it gives one), it is an
    /// artifact of `kind`, its sizes are within the limit, and each blob hashes to the digest
    /// the manifest gives. Nothing is returned unless every check passed.
    pub async fn pull(
        &self,
        reference: &OciRef,
        kind: ArtifactKind,
        max_bytes: u64,
    ) -> Result<Pulled, OciError> {
        let cref = reference.client_ref();
        let (raw, _) = self
            .client
            .pull_manifest_raw(&cref, &self.auth, &[OCI_IMAGE_MEDIA_TYPE])
            .await
            .map_err(|e| self.error(reference, e))?;
        if raw.len() > MAX_MANIFEST_BYTES {
            return Err(OciError::TooLarge {
                what: "the manifest".into(),
                size: raw.len() as u64,
                limit: MAX_MANIFEST_BYTES as u64,
            });
        }
        let digest = sha256_digest(&raw);
        if let Some(want) = &reference.digest
            && *want != digest
        {
            return Err(OciError::Digest {
                what: "the manifest".into(),
                expected: want.clone(),
                actual: digest,
            });
        }
        let wrong = |found: String| OciError::WrongKind {
            reference: reference.to_string(),
            expected: kind.what(),
            found,
        };
        let manifest: OciImageManifest = serde_json::from_slice(&raw)
            .map_err(|e| wrong(format!("its manifest is not an OCI image manifest: {e}")))?;
        if manifest.config.media_type != kind.config_media_type() {
            return Err(wrong(format!("its config is {:.100}", manifest.config.media_type)));
        }
        if manifest.layers.is_empty()
            || (kind == ArtifactKind::Component && manifest.layers.len() != 1)
        {
            return Err(wrong(format!("it has {} layers", manifest.layers.len())));
        }
        let mut total: u64 = 0;
        for l in &manifest.layers {
            if l.media_type != kind.layer_media_type() {
                return Err(wrong(format!("a layer is {:.100}", l.media_type)));
            }
            if !valid_digest(&l.digest) {
                return Err(wrong(format!("a layer's digest is not sha256: {:.80}", l.digest)));
            }
            total = total.saturating_add(u64::try_from(l.size).unwrap_or(u64::MAX));
        }
        if total > max_bytes {
            return Err(OciError::TooLarge {
                what: reference.to_string(),
                size: total,
                limit: max_bytes,
            });
        }
        if u64::try_from(manifest.config.size).unwrap_or(u64::MAX) > MAX_CONFIG_BYTES {
            return Err(OciError::TooLarge {
                what: "the config".into(),
                size: manifest.config.size.max(0) as u64,
                limit: MAX_CONFIG_BYTES,
            });
        }
        self.blob(reference, &manifest.config, "the config").await?;
        let mut files = Vec::with_capacity(manifest.layers.len());
        for l in &manifest.layers {
            let title = l
                .annotations
                .as_ref()
                .and_then(|a| a.get(TITLE_ANNOTATION))
                .cloned()
                .unwrap_or_default();
            let what = if title.is_empty() {
                "the component".to_string()
            } else {
                format!("`{title:.200}`")
            };
            files.push((title, self.blob(reference, l, &what).await?));
        }
        Ok(Pulled { digest, files })
    }

    /// One blob, no longer than its descriptor says, hashing to its digest.
    async fn blob(
        &self,
        reference: &OciRef,
        d: &OciDescriptor,
        what: &str,
    ) -> Result<Vec<u8>, OciError> {
        let limit = u64::try_from(d.size).unwrap_or(0);
        let mut out = Capped { out: Vec::new(), limit };
        self.client.pull_blob(&reference.client_ref(), d, &mut out).await.map_err(
            |e| match self.error(reference, e) {
                OciError::Digest { expected, actual, .. } => {
                    OciError::Digest { what: what.to_string(), expected, actual }
                }
                other => other,
            },
        )?;
        // Checked here too, whatever the protocol client did: the bytes keel uses are the ones
        // the manifest names.
        let actual = sha256_digest(&out.out);
        if actual != d.digest || out.out.len() as u64 != limit {
            return Err(OciError::Digest {
                what: what.to_string(),
                expected: d.digest.clone(),
                actual,
            });
        }
        Ok(out.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_print_back() {
        for s in [
            "oci://127.0.0.1:5000/acme/csv:1.0.0",
            "oci://ghcr.io/acme/tools/csv:latest",
            "oci://localhost/x@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "oci://[::1]:5000/a-b/c_d:v1@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ] {
            let r: OciRef = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(r.to_string(), s);
        }
        let r: OciRef = "oci://127.0.0.1:5000/acme/csv:1".parse().expect("parses");
        assert_eq!(r.package(), "127.0.0.1:5000/acme/csv");
        assert!(r.is_loopback());
        assert!(!"oci://ghcr.io/a:1".parse::<OciRef>().expect("parses").is_loopback());
        assert!("oci://[::1]:5/a:1".parse::<OciRef>().expect("parses").is_loopback());
        assert!(!"oci://127.example.com/a:1".parse::<OciRef>().expect("parses").is_loopback());
    }

    #[test]
    fn a_bad_reference_says_what_is_wrong() {
        for (s, why) in [
            ("ghcr.io/a:1", "oci://"),
            ("oci://ghcr.io", "no repository"),
            ("oci://acme/csv:1", "registry must be"),
            ("oci://ghcr.io/Acme:1", "repository must be"),
            ("oci://ghcr.io/a", "neither a tag"),
            ("oci://ghcr.io/a@sha256:xyz", "digest must be"),
            ("oci://ghcr.io/a:bad tag", "a tag is"),
            ("oci://ghcr.io/a/../b:1", "repository must be"),
            ("oci://ghcr.io:99999/a:1", "registry must be"),
        ] {
            let e = s.parse::<OciRef>().expect_err(s).to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn credentials_come_from_user_colon_password_and_hide_it() {
        let c = Credentials::from_secret("ci:s3cret-token").expect("parses");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(Credentials::from_secret("no-colon").is_err());
        assert!(Credentials::from_secret(":pw").is_err());
    }
}
