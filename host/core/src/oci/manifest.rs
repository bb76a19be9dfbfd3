//! OCI image manifests as keel reads and writes them: only the fields keel uses are read (a
//! descriptor's `urls` are not among them: every blob comes from the registry the reference
//! names).

use std::collections::BTreeMap;

use super::{CREATED_ANNOTATION, OCI_MANIFEST_MEDIA_TYPE, TITLE_ANNOTATION, VERSION_ANNOTATION};

/// What a manifest request accepts: one artifact's manifest.
pub(super) const ACCEPT: &str = OCI_MANIFEST_MEDIA_TYPE;

/// The media types of an index (an OCI image index or a Docker manifest list): several
/// artifacts under one name, never installed as one.
const INDEX_MEDIA_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

pub(super) fn is_index(media_type: &str) -> bool {
    let base = media_type.split(';').next().unwrap_or("").trim();
    INDEX_MEDIA_TYPES.contains(&base)
}

/// Now, as a manifest's times are written.
pub(super) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// One blob a manifest names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub media_type: String,
    /// `sha256:` and 64 hex digits (checked).
    pub digest: String,
    pub size: u64,
    /// The title annotation: a skill file's path.
    pub title: Option<String>,
}

/// A manifest, checked as far as the protocol goes (the kind of artifact is the caller's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The digest of its bytes.
    pub digest: String,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    pub annotations: BTreeMap<String, String>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    schema_version: Option<u32>,
    media_type: Option<String>,
    config: Option<RawDescriptor>,
    #[serde(default)]
    layers: Vec<RawDescriptor>,
    #[serde(default)]
    manifests: Option<serde_json::Value>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDescriptor {
    media_type: String,
    digest: String,
    size: i64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

impl RawDescriptor {
    fn checked(self, what: &str) -> Result<Descriptor, String> {
        if !super::valid_digest(&self.digest) {
            return Err(format!("{what}'s digest is not sha256: {:.80}", self.digest));
        }
        let size = u64::try_from(self.size)
            .map_err(|_| format!("{what}'s size is negative ({})", self.size))?;
        Ok(Descriptor {
            media_type: self.media_type,
            digest: self.digest,
            size,
            title: self.annotations.get(TITLE_ANNOTATION).cloned(),
        })
    }
}

impl Manifest {
    /// Parses a manifest's bytes (whose digest is `digest`): an OCI image manifest, not an
    /// index. The error says what it is instead.
    pub(super) fn parse(raw: &[u8], digest: String) -> Result<Self, String> {
        let m: RawManifest = serde_json::from_slice(raw)
            .map_err(|e| format!("its manifest is not an OCI image manifest: {e}"))?;
        if m.media_type.as_deref().is_some_and(is_index) || m.manifests.is_some() {
            return Err("it is an image index (several artifacts), not one artifact".into());
        }
        if let Some(t) = m.media_type.as_deref()
            && t != OCI_MANIFEST_MEDIA_TYPE
        {
            return Err(format!("its manifest is {t:.100}"));
        }
        if m.schema_version != Some(2) {
            return Err("its manifest is not schema version 2".into());
        }
        let config = m.config.ok_or("its manifest has no config")?.checked("the config")?;
        let layers =
            m.layers.into_iter().map(|l| l.checked("a layer")).collect::<Result<Vec<_>, _>>()?;
        Ok(Self { digest, config, layers, annotations: m.annotations })
    }

    /// The bytes of a manifest of `config` (its bytes and media type) and `layers` (media type,
    /// title, bytes), annotated with `labels`: its version, and the time it was made and its
    /// title when given.
    pub(super) fn encode(
        config_media_type: &str,
        config: &[u8],
        layers: &[(&str, Option<String>, Vec<u8>)],
        labels: &super::Labels,
    ) -> Vec<u8> {
        let descriptor = |media_type: &str, bytes: &[u8], title: Option<&String>| {
            let mut d = serde_json::json!({
                "mediaType": media_type,
                "digest": super::sha256_digest(bytes),
                "size": bytes.len(),
            });
            if let Some(t) = title {
                d["annotations"] = serde_json::json!({ TITLE_ANNOTATION: t });
            }
            d
        };
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST_MEDIA_TYPE,
            "config": descriptor(config_media_type, config, None),
            "layers": layers.iter().map(|(t, title, b)| descriptor(t, b, title.as_ref()))
                .collect::<Vec<_>>(),
            "annotations": labels.annotations(),
        });
        serde_json::to_vec(&manifest).unwrap_or_default()
    }

    /// The version annotation `publish` wrote (the tag it was published under), if any.
    pub fn version(&self) -> Option<&str> {
        self.annotations.get(VERSION_ANNOTATION).map(String::as_str)
    }

    /// When it was made, by its annotation, if any.
    pub fn created(&self) -> Option<&str> {
        self.annotations.get(CREATED_ANNOTATION).map(String::as_str)
    }
}

/// Why `new` is older than `old`, if it is: by their version annotations when both are
/// versions (`1.2.0`, `v1.2.0`), else by their build times; `None` when it is not older or
/// neither tells.
pub fn older(old: &Manifest, new: &Manifest) -> Option<String> {
    let version = |m: &Manifest| {
        m.version().and_then(|v| semver::Version::parse(v.strip_prefix('v').unwrap_or(v)).ok())
    };
    if let (Some(o), Some(n)) = (version(old), version(new))
        && n != o
    {
        return (n < o).then(|| format!("version {o} → {n}"));
    }
    let created =
        |m: &Manifest| m.created().and_then(|c| chrono::DateTime::parse_from_rfc3339(c).ok());
    match (created(old), created(new)) {
        (Some(o), Some(n)) if n < o => {
            Some(format!("built {} → {}", o.to_rfc3339(), n.to_rfc3339()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoded_manifest_parses_back_and_an_index_or_bad_digest_is_refused() {
        let layers = vec![("application/wasm", None, b"\0asm".to_vec())];
        let labels = super::super::Labels::tagged("1.0");
        let raw = Manifest::encode("application/vnd.wasm.config.v0+json", b"{}", &layers, &labels);
        let m = Manifest::parse(&raw, "sha256:x".into()).unwrap();
        assert_eq!(m.layers.len(), 1);
        assert_eq!(m.layers[0].size, 4);
        assert_eq!(m.version(), Some("1.0"));
        assert!(m.created().is_some());

        let index = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
        assert!(Manifest::parse(index, String::new()).unwrap_err().contains("image index"));
        let untyped_index = br#"{"schemaVersion":2,"manifests":[]}"#;
        assert!(Manifest::parse(untyped_index, String::new()).unwrap_err().contains("index"));
        let bad = br#"{"schemaVersion":2,"config":{"mediaType":"x","digest":"md5:1","size":1},"layers":[]}"#;
        assert!(Manifest::parse(bad, String::new()).unwrap_err().contains("not sha256"));
        assert!(is_index("application/vnd.oci.image.index.v1+json; charset=utf-8"));
    }

    #[test]
    fn older_goes_by_versions_then_by_build_times() {
        let m = |version: Option<&str>, created: Option<&str>| Manifest {
            digest: String::new(),
            config: Descriptor {
                media_type: String::new(),
                digest: String::new(),
                size: 0,
                title: None,
            },
            layers: Vec::new(),
            annotations: version
                .map(|v| (VERSION_ANNOTATION.to_string(), v.to_string()))
                .into_iter()
                .chain(created.map(|c| (CREATED_ANNOTATION.to_string(), c.to_string())))
                .collect(),
        };
        let (t1, t2) = (Some("2026-01-01T00:00:00Z"), Some("2026-06-01T00:00:00Z"));
        assert_eq!(
            older(&m(Some("1.2.0"), t1), &m(Some("v1.1.9"), t2)).unwrap(),
            "version 1.2.0 → 1.1.9"
        );
        assert_eq!(
            older(&m(Some("1.1.0"), t2), &m(Some("1.2.0"), t1)),
            None,
            "a newer version wins"
        );
        assert!(
            older(&m(Some("latest"), t2), &m(Some("latest"), t1)).unwrap().starts_with("built")
        );
        assert!(
            older(&m(Some("1.0.0"), t2), &m(Some("1.0.0"), t1)).is_some(),
            "same version, older build"
        );
        assert_eq!(older(&m(None, t1), &m(None, t2)), None);
        assert_eq!(older(&m(None, None), &m(None, t1)), None, "nothing to tell by");
    }
}
