//! The use cases of registries: publishing components and skills as OCI artifacts,
//! installing them by reference (digests checked, then signatures, then imports, then
//! compile), and finding installed components whose tag now names other bytes.

use super::skills::SkillRegistry;
use super::*;
use crate::oci::{ArtifactKind, Credentials, OciError, OciRef, Pushed, Registry};
use crate::tools::Origin;

/// One installed component from a registry, against what its tag names today.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outdated {
    pub name: String,
    /// What it is: `component`, `skill`, or `skill-component` (a component a skill bundled,
    /// which follows its skill's tag: upgrade the skill).
    pub kind: OutdatedKind,
    /// The reference it was installed from.
    pub reference: String,
    /// The manifest digest it was installed at.
    pub installed: String,
    /// What the reference's tag names now (`None` when it could not be asked, or when the
    /// reference is pinned by digest and cannot move).
    pub current: Option<String>,
    /// Whether the tag now names another digest.
    pub outdated: bool,
    /// The reference that installs exactly what `current` names, refusing if the tag moves
    /// again before it runs (`REFERENCE:TAG@DIGEST`); only when outdated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<String>,
    /// Why the registry could not be asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The version installed: the one the component carries, else the tag it was installed
    /// by when that is a version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The repository's tags that are versions above the installed one, lowest first (empty
    /// when the installed version is not known or the tags could not be listed).
    pub newer: Vec<String>,
}

/// What an [`Outdated`] row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutdatedKind {
    Component,
    Skill,
    SkillComponent,
}

/// Options of an install from a registry.
#[derive(Debug, Clone, Default)]
pub struct RegistryInstall<'a> {
    /// The component name (default: the repository's last part).
    pub name: Option<&'a str>,
    /// Replace an installed component (or skill) of that name.
    pub upgrade: bool,
    /// With `upgrade`: accept a version that widens what a component can do.
    pub accept_wider: bool,
    /// With `upgrade`: install an artifact older than the one installed (a tag moved back).
    pub allow_downgrade: bool,
    /// Install even without a trusted signature covering the package (recorded).
    pub allow_unsigned: bool,
    /// The secret holding the registry's credentials (`USER:PASSWORD`): bound to the
    /// reference's registry, sent nowhere else.
    pub auth: Option<&'a str>,
}

/// A credential bound to one registry: `REGISTRY=SECRET` (`ghcr.io=ghcr-login`,
/// `127.0.0.1:5000=ci`), as `keel tool outdated --auth` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryAuth {
    /// Host, and port if any, as references name it.
    pub registry: String,
    /// The secret holding `USER:PASSWORD`.
    pub secret: String,
}

impl std::str::FromStr for RegistryAuth {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let Some((registry, secret)) = s.split_once('=') else {
            return Err(format!(
                "`{}` names no registry: a credential is bound to one registry, so write \
                 REGISTRY=SECRET (e.g. ghcr.io=ghcr-login)",
                s.chars().take(80).collect::<String>()
            ));
        };
        let probe = format!("oci://{registry}/x:1");
        let r = probe.parse::<OciRef>().map_err(|_| {
            format!(
                "`{registry:.80}` is not a registry: write a host with a `.`, a port, or localhost"
            )
        })?;
        if secret.is_empty() {
            return Err(format!("no secret is named for {registry}"));
        }
        Ok(Self { registry: r.registry.to_ascii_lowercase(), secret: secret.to_string() })
    }
}

fn parse(reference: &str) -> Result<OciRef, ApiError> {
    Ok(reference.parse::<OciRef>().map_err(OciError::from)?)
}

/// The source an install from `r` records: the tag it follows (without the digest an upgrade
/// pinned it to), else the digest.
fn recorded(r: &OciRef) -> String {
    match (&r.tag, &r.digest) {
        (Some(_), Some(_)) => r.by_tag().map(|t| t.to_string()).unwrap_or_else(|| r.to_string()),
        _ => r.to_string(),
    }
}

/// The component name a repository suggests: its last part, as a component name.
fn name_of(r: &OciRef) -> String {
    let last = r.repository.rsplit('/').next().unwrap_or(&r.repository);
    last.replace('.', "-").to_lowercase()
}

impl Harness {
    /// A client of `r`'s registry, with the credentials in the secret `auth` (bound to that
    /// registry: the client sends them nowhere else), under the home's `[registry]` limits.
    fn registry(&self, r: &OciRef, auth: Option<&str>) -> Result<Registry, ApiError> {
        let credentials = match auth {
            None => None,
            Some(name) => {
                let store = crate::secrets::SecretStore::new(self.tools.home().root());
                let values =
                    store.get(&[name.to_string()]).map_err(crate::tools::ToolServiceError::from)?;
                let value = values.into_iter().next().map(|(_, v)| v);
                let value = value.ok_or_else(|| ApiError::Input(format!("no secret `{name}`")))?;
                Some(
                    Credentials::from_secret(value.expose())
                        .map_err(|e| ApiError::Input(format!("secret `{name}`: {e}")))?,
                )
            }
        };
        let limits = crate::config::registry_limits(self.tools.home())?;
        Ok(Registry::new(r, credentials, limits)?)
    }

    /// Publishes a component file to `reference` (which names a tag) as a wasm OCI artifact,
    /// its bytes unchanged. The file must be a component; nothing is compiled.
    pub async fn publish_tool(
        &self,
        caller: &Caller,
        bytes: Vec<u8>,
        reference: &str,
        auth: Option<&str>,
    ) -> Result<Pushed, ApiError> {
        caller.require_admin("publishing a tool")?;
        let r = parse(reference)?;
        let sandbox = self.tools.sandbox();
        let limit = sandbox.limits().max_component_bytes;
        if bytes.len() as u64 > limit {
            let size = bytes.len() as u64;
            let e = crate::sandbox::LoadError::TooLarge { size, limit };
            return Err(crate::tools::ToolServiceError::from(e).into());
        }
        let checked = crate::sandbox::check_header(&bytes)
            .and_then(|()| Ok((sandbox.imports(&bytes)?, sandbox.exports(&bytes)?)));
        let (imports, exports) = checked.map_err(crate::tools::ToolServiceError::from)?;
        let carried = crate::sandbox::carried(&bytes);
        let (version, name) = (carried.version.as_deref(), carried.name.as_deref());
        let registry = self.registry(&r, auth)?;
        Ok(registry.push_component(&r, bytes, imports, exports, version, name).await?)
    }

    /// Installs the component `reference` names: pulled with every digest checked, then
    /// refused unless a trusted key whose scope covers the package signed it (or
    /// `allow_unsigned`), and only then inspected, compiled and installed as a local file is.
    pub async fn install_tool_from(
        &self,
        caller: &Caller,
        reference: &str,
        opts: &RegistryInstall<'_>,
    ) -> Result<InstallReport, ApiError> {
        caller.require_admin("installing a tool")?;
        let r = parse(reference)?;
        let limit = self.tools.sandbox().limits().max_component_bytes;
        let registry = self.registry(&r, opts.auth)?;
        let manifest = registry.manifest(&r, ArtifactKind::Component).await?;
        let name = opts.name.map(str::to_string).unwrap_or_else(|| name_of(&r));
        if opts.upgrade && !opts.allow_downgrade {
            self.refuse_downgrade(&name, &r, &manifest, ArtifactKind::Component, opts.auth).await?;
        }
        let pulled = registry.fetch(&r, &manifest, limit).await?;
        let bytes = pulled.files.into_iter().next().map(|f| f.1).unwrap_or_default();
        let origin = Origin::Registry {
            reference: recorded(&r),
            manifest_digest: pulled.digest,
            package: r.package(),
            allow_unsigned: opts.allow_unsigned,
        };
        let mode = InstallMode::of(opts.upgrade, opts.accept_wider);
        Ok(self.tools.install_from(&bytes, &name, &origin, mode).await?)
    }

    /// Refuses `manifest` (what `r` names now) as an upgrade of the installed component
    /// `name` when it is older than the installed one: by the version annotations `publish`
    /// writes when both are versions, else by their build times. The installed one's manifest
    /// is read again by its digest; when it cannot be read the comparison cannot be made, and
    /// that is a refusal too (`--allow-downgrade` installs anyway).
    async fn refuse_downgrade(
        &self,
        name: &str,
        r: &OciRef,
        manifest: &crate::oci::Manifest,
        kind: ArtifactKind,
        auth: Option<&str>,
    ) -> Result<(), ApiError> {
        let n = name.to_string();
        let installed = self
            .db
            .read(move |c| {
                Ok(match kind {
                    ArtifactKind::Skill => crate::skills::get_in(c, &n)?
                        .and_then(|s| Some((s.source, s.manifest_digest?))),
                    _ => crate::tools::catalog::component(c, &n)?
                        .and_then(|c| Some((c.source, c.manifest_digest?))),
                })
            })
            .await?;
        let Some((source, old_digest)) = installed else { return Ok(()) };
        let Ok(old_ref) = source.parse::<OciRef>() else { return Ok(()) };
        if old_digest == manifest.digest {
            return Ok(());
        }
        let old_digest = &old_digest;
        let old_ref = old_ref.by_digest(old_digest);
        // The credential goes only to its own registry.
        let auth = auth.filter(|_| old_ref.registry.eq_ignore_ascii_case(&r.registry));
        let refused = |why: String| crate::tools::ToolServiceError::Downgrade {
            name: name.to_string(),
            reference: r.to_string(),
            why,
        };
        let old_manifest = match self.registry(&old_ref, auth)?.manifest(&old_ref, kind).await {
            Ok(m) => m,
            Err(e) => {
                let why =
                    format!("the installed version's manifest cannot be read to compare: {e}");
                return Err(refused(why).into());
            }
        };
        match crate::oci::older(&old_manifest, manifest) {
            Some(why) => Err(refused(why).into()),
            None => Ok(()),
        }
    }

    /// The installed components and skills from a registry by tag, each against what its tag
    /// names now (a skill's bundled components against their skill's tag). Each tag is asked
    /// once, by reading its manifest as an install would. A registry that cannot be asked is
    /// reported on its rows, not as a failure of all. Each registry is asked with the
    /// credential bound to it in `auth`, if any; no credential goes to another registry.
    pub async fn tools_outdated(
        &self,
        caller: &Caller,
        auth: &[RegistryAuth],
    ) -> Result<Vec<Outdated>, ApiError> {
        caller.require_admin("checking installed tools against their registries")?;
        let mut rows = Vec::new();
        for c in self.tools.components()? {
            let Some(installed) = c.manifest_digest.clone() else { continue };
            let (kind, from) = match c.source.rsplit_once(" (skill ") {
                Some((from, _)) => (OutdatedKind::SkillComponent, from.to_string()),
                None => (OutdatedKind::Component, c.source.clone()),
            };
            // A skill's component follows its skill's tag, and has no version tags of its own.
            let version = c.version.clone().filter(|_| kind == OutdatedKind::Component);
            rows.push((c.name, kind, from, installed, version));
        }
        for s in self.db.read(crate::skills::list_in).await? {
            let Some(installed) = s.manifest_digest else { continue };
            rows.push((s.name, OutdatedKind::Skill, s.source, installed, None));
        }
        let mut asked: std::collections::BTreeMap<String, Result<String, String>> =
            Default::default();
        let mut listed: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        let mut out = Vec::new();
        for (name, kind, reference, installed, carried) in rows {
            let Ok(r) = reference.parse::<OciRef>() else { continue };
            let tag_version = r.tag.clone().filter(|t| crate::sandbox::parse_version(t).is_some());
            let version = carried.or(tag_version);
            let mut row = Outdated {
                name,
                kind,
                reference,
                installed,
                current: None,
                outdated: false,
                upgrade: None,
                error: None,
                version,
                newer: Vec::new(),
            };
            if let Some(by_tag) = r.by_tag() {
                let key = by_tag.to_string();
                let registry = by_tag.registry.to_ascii_lowercase();
                let secret = auth.iter().find(|a| a.registry == registry).map(|a| &*a.secret);
                if !asked.contains_key(&key) {
                    let now = self.registry(&by_tag, secret)?.resolve(&by_tag).await;
                    asked.insert(key.clone(), now.map_err(|e| e.to_string()));
                }
                let installed_version =
                    row.version.as_deref().and_then(crate::sandbox::parse_version);
                if let (Some(v), Some(Ok(_))) = (installed_version, asked.get(&key)) {
                    let repo = format!("{registry}/{}", by_tag.repository);
                    if !listed.contains_key(&repo) {
                        // A registry that lists no tags lists none here: the row says what
                        // the tag names, as before.
                        let tags = self.registry(&by_tag, secret)?.tags(&by_tag).await;
                        listed.insert(repo.clone(), tags.unwrap_or_default());
                    }
                    row.newer =
                        newer_versions(listed.get(&repo).map_or(&[][..], Vec::as_slice), &v);
                }
                match asked.get(&key) {
                    Some(Ok(now)) => {
                        row.outdated = *now != row.installed;
                        if row.outdated {
                            row.upgrade = Some(by_tag.by_tag_and_digest(now).to_string());
                        }
                        row.current = Some(now.clone());
                    }
                    Some(Err(e)) => row.error = Some(e.clone()),
                    None => {}
                }
            }
            out.push(row);
        }
        Ok(out)
    }

    /// Publishes the skill at `path` (checked as install checks it) to `reference`: one layer
    /// per file, `SKILL.md` and its bundled components among them.
    pub async fn publish_skill(
        &self,
        caller: &Caller,
        path: &std::path::Path,
        reference: &str,
        auth: Option<&str>,
        key: Option<&str>,
    ) -> Result<PublishedSkill, ApiError> {
        caller.require_admin("publishing a skill")?;
        let r = parse(reference)?;
        // The key is found before anything is pushed.
        let secret = key.map(|k| self.signing_secret(k)).transpose()?;
        let (files, problems) = crate::skills::read_files(path)?;
        let shown = path.display().to_string();
        let pkg = crate::skills::package_of(&shown, files.clone(), problems)?;
        let registry = self.registry(&r, auth)?;
        let pushed = registry.push_skill(&r, &pkg.name, files).await?;
        let signature = match (key, secret) {
            (Some(k), Some(secret)) => {
                Some(self.push_skill_signature(&registry, &r, &pushed.digest, k, &secret).await?)
            }
            _ => None,
        };
        Ok(PublishedSkill { publish: pushed, signature })
    }

    /// Signs the skill bundle `reference` names (by tag or digest) with the signing key `key`,
    /// and keeps the signature beside it in its repository.
    pub async fn sign_skill(
        &self,
        caller: &Caller,
        reference: &str,
        key: &str,
        auth: Option<&str>,
    ) -> Result<SkillSigned, ApiError> {
        caller.require_admin("signing a skill")?;
        let r = parse(reference)?;
        let secret = self.signing_secret(key)?;
        let registry = self.registry(&r, auth)?;
        let manifest = registry.manifest(&r, ArtifactKind::Skill).await?;
        self.push_skill_signature(&registry, &r, &manifest.digest, key, &secret).await
    }

    async fn push_skill_signature(
        &self,
        registry: &Registry,
        r: &OciRef,
        manifest_digest: &str,
        key: &str,
        secret: &crate::secrets::Secret,
    ) -> Result<SkillSigned, ApiError> {
        let sig = crate::tools::trust::SkillSignature::make(manifest_digest, secret.expose())
            .map_err(|e| ApiError::Input(format!("signing key `{key}`: {e}")))?;
        let doc = serde_json::to_vec(&sig).unwrap_or_default();
        let pushed = registry.push_signature(r, manifest_digest, doc).await?;
        Ok(SkillSigned {
            signs: r.by_digest(manifest_digest).to_string(),
            key: key.to_string(),
            public_key: sig.public_key,
            signature: pushed.reference,
        })
    }

    /// The secret of the signing key `name` (`keel key new`).
    fn signing_secret(&self, name: &str) -> Result<crate::secrets::Secret, ApiError> {
        // The home's key, else the one KEEL_SIGNING_KEY holds under that name (a CI job's).
        match crate::keys::find(self.tools.home().root(), name) {
            Ok(secret) => Ok(secret),
            Err(crate::keys::KeyError::Store(e)) => {
                Err(crate::tools::ToolServiceError::from(e).into())
            }
            Err(e) => Err(ApiError::Input(e.to_string())),
        }
    }

    /// Installs the skill `reference` names: pulled with every digest checked, its files
    /// checked as a directory's are, its bundled components under the registry's rules
    /// (a trusted signature covering the package, or `allow_unsigned`).
    pub async fn install_skill_from(
        &self,
        caller: &Caller,
        reference: &str,
        opts: &RegistryInstall<'_>,
    ) -> Result<SkillInstallReport, ApiError> {
        caller.require_admin("installing a skill")?;
        let r = parse(reference)?;
        let limit = crate::skills::MAX_SKILL_BUNDLE_BYTES;
        let registry = self.registry(&r, opts.auth)?;
        let manifest = registry.manifest(&r, ArtifactKind::Skill).await?;
        let source = recorded(&r);
        // Names, counts and sizes as the manifest gives them, before any blob is fetched.
        let listed: Vec<(String, u64)> =
            manifest.layers.iter().map(|l| (l.title.clone().unwrap_or_default(), l.size)).collect();
        crate::skills::check_listing(&source, &listed)?;
        if opts.upgrade && !opts.allow_downgrade {
            // The skill's name is in its SKILL.md, not fetched yet: an installed skill from
            // the same repository is the one this would replace.
            let package = r.package();
            let same = self
                .db
                .read(crate::skills::list_in)
                .await?
                .into_iter()
                .find(|s| s.source.parse::<OciRef>().is_ok_and(|o| o.package() == package));
            if let Some(old) = same {
                self.refuse_downgrade(&old.name, &r, &manifest, ArtifactKind::Skill, opts.auth)
                    .await?;
            }
        }
        // Its signature, before any of its files is fetched: the text goes into prompts.
        let document = registry.signature(&r, &manifest.digest).await?;
        let signer = self.tools.skill_verdict(
            document.as_deref(),
            &manifest.digest,
            &r.package(),
            opts.allow_unsigned,
        )?;
        let pulled = registry.fetch(&r, &manifest, limit).await?;
        let files = crate::skills::files_from_registry(&source, pulled.files)?;
        let pkg = crate::skills::package_of(&source, files, Vec::new())?;
        let registry = SkillRegistry {
            manifest_digest: pulled.digest,
            package: r.package(),
            allow_unsigned: opts.allow_unsigned,
            signer,
        };
        let mode = InstallMode::of(opts.upgrade, opts.accept_wider);
        self.install_skill_package(pkg, &source, Some(registry), mode).await
    }
}

/// What `publish_skill` did: the bundle, and its signature when a key was given.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PublishedSkill {
    pub publish: Pushed,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<SkillSigned>,
}

/// A skill bundle's signature, kept beside it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SkillSigned {
    /// The bundle it signs, by digest.
    pub signs: String,
    /// The signing key's name and public key.
    pub key: String,
    pub public_key: String,
    /// Where the signature is kept (`…:sha256-HEX.keel-sig`).
    pub signature: String,
}

/// The tags among `tags` that are versions above `installed`, lowest first (a tag named
/// `1.2.0` and one named `v1.2.0` both count).
fn newer_versions(tags: &[String], installed: &semver::Version) -> Vec<String> {
    let mut newer: Vec<(semver::Version, &String)> = tags
        .iter()
        .filter_map(|t| Some((crate::sandbox::parse_version(t)?, t)))
        .filter(|(v, _)| v > installed)
        .collect();
    newer.sort();
    newer.into_iter().map(|(_, t)| t.clone()).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn newer_tags_are_the_versions_above_the_installed_one_lowest_first() {
        let tags: Vec<String> =
            ["latest", "1.0.0", "v1.2.0", "1.10.0", "0.9.0", "1.1.0-rc.1", "2.0.0-rc.1", "1.1.0"]
                .map(String::from)
                .to_vec();
        let installed = semver::Version::new(1, 1, 0);
        assert_eq!(super::newer_versions(&tags, &installed), ["v1.2.0", "1.10.0", "2.0.0-rc.1"]);
        assert!(super::newer_versions(&tags, &semver::Version::new(3, 0, 0)).is_empty());
    }
}
