//! The use cases of skills: installing one from a directory (or, through `registry.rs`, from
//! a registry) with the components it bundles, reading and removing them.

use super::*;
use crate::tools::Origin;

/// What installing a skill did: the skill, and the install of each component it bundles.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SkillInstallReport {
    #[serde(flatten)]
    pub installed: crate::skills::SkillInstalled,
    pub components: Vec<InstallReport>,
}

/// Where a skill installed from a registry came from, for its record and its components'.
pub(super) struct SkillRegistry {
    pub manifest_digest: String,
    pub package: String,
    pub allow_unsigned: bool,
    /// The trusted key whose signature covered the bundle (`None`: installed unsigned, on
    /// purpose).
    pub signer: Option<crate::tools::trust::TrustedKey>,
}

impl SkillRegistry {
    /// What the skill's record keeps of where it came from and who vouched for it.
    pub(super) fn provenance(&self) -> crate::skills::Provenance {
        crate::skills::Provenance {
            manifest_digest: self.manifest_digest.clone(),
            signer: self.signer.as_ref().map(|t| (t.name.clone(), t.public_key.clone())),
            unsigned_allowed: self.signer.is_none(),
        }
    }

    pub(super) fn origin(&self, source: String) -> Origin {
        Origin::Registry {
            reference: source,
            manifest_digest: self.manifest_digest.clone(),
            package: self.package.clone(),
            allow_unsigned: self.allow_unsigned,
        }
    }
}

/// Skills.
impl Harness {
    /// Reads, checks and installs the skill at `path` (a directory holding `SKILL.md`, or the
    /// file alone): its bundled components first, through the normal tool install (same
    /// validation, same reserved names), then the skill, pinned by the SHA-256 of its content.
    /// `upgrade` replaces an installed skill (and its components) of the same name.
    pub async fn install_skill(
        &self,
        caller: &Caller,
        path: &std::path::Path,
        mode: InstallMode,
    ) -> Result<SkillInstallReport, ApiError> {
        caller.require_admin("installing a skill")?;
        let pkg = crate::skills::read_package(path)?;
        self.install_skill_package(pkg, &path.display().to_string(), None, mode).await
    }

    /// Installs a checked skill package from `source` (a directory, or a registry reference
    /// with what it was pulled at): its components first, then the skill.
    pub(super) async fn install_skill_package(
        &self,
        pkg: crate::skills::SkillPackage,
        source: &str,
        registry: Option<SkillRegistry>,
        mode: InstallMode,
    ) -> Result<SkillInstallReport, ApiError> {
        let upgrade = mode != InstallMode::New;
        // Refused before its components are installed: other content under an installed
        // name needs `upgrade`.
        if !upgrade {
            let (name, digest) = (pkg.name.clone(), pkg.digest.clone());
            let current = self.db.read(move |c| crate::skills::get_in(c, &name)).await?;
            if let Some(old) = current.filter(|r| r.digest != digest) {
                return Err(crate::skills::installed_already(&old.name, &old.digest).into());
            }
        }
        // A skill installs or upgrades only the components its own source installed (the same
        // repository or directory, the same skill): never one another publisher installed.
        let own = skill_owner(&format!("{source} (skill {})", pkg.name));
        for (name, bytes) in &pkg.components {
            let n = name.clone();
            let installed = self.db.read(move |c| crate::tools::catalog::component(c, &n));
            // A first-party name is refused as reserved when the component is installed.
            let Some(old) = installed.await?.filter(|c| !c.builtin) else { continue };
            if old.digest != crate::sandbox::sha256_hex(bytes) && skill_owner(&old.source) != own {
                let by =
                    old.signer.as_deref().map(|s| format!(", signed by `{s}`")).unwrap_or_default();
                return Err(crate::store::StoreError::Conflict(format!(
                    "the skill's component `{name}` would replace the component `{name}` installed \
                     from {}{by}: a skill may install or upgrade only the components its own \
                     source installed (remove that component first if this skill should own it)",
                    old.source
                ))
                .into());
            }
        }
        // Every bundled component's signature before any is installed.
        if let Some(r) = &registry {
            for (name, bytes) in &pkg.components {
                self.tools.registry_verdict(bytes, &r.package, r.allow_unsigned).map_err(|e| {
                    match e {
                        crate::tools::ToolServiceError::Unverified { package, reason } => {
                            let reason = format!("the skill's component `{name}`: {reason}");
                            crate::tools::ToolServiceError::Unverified { package, reason }
                        }
                        other => other,
                    }
                })?;
            }
        }
        let mut components = Vec::new();
        for (name, bytes) in &pkg.components {
            let from = format!("{source} (skill {})", pkg.name);
            let origin = match &registry {
                Some(r) => r.origin(from),
                None => crate::tools::Origin::Local { source: from },
            };
            components.push(self.tools.install_from(bytes, name, &origin, mode).await?);
        }
        let source = source.to_string();
        let provenance = registry.map(|r| r.provenance());
        let installed = self
            .db
            .run(move |c| {
                crate::skills::install_from_in(c, &pkg, &source, provenance.as_ref(), upgrade)
            })
            .await?;
        Ok(SkillInstallReport { installed, components })
    }

    /// The installed skills, by name (any caller may read the catalog).
    pub async fn skills(
        &self,
        _caller: &Caller,
    ) -> Result<Vec<crate::skills::SkillRecord>, ApiError> {
        Ok(self.db.read(crate::skills::list_in).await?)
    }

    /// The installed skill `name` with the version it is installed at (its body); any caller
    /// may read it.
    pub async fn skill(
        &self,
        _caller: &Caller,
        name: &str,
    ) -> Result<(crate::skills::SkillRecord, crate::skills::SkillVersion), ApiError> {
        let n = name.to_string();
        let found = self
            .db
            .read(move |c| {
                let Some(r) = crate::skills::get_in(c, &n)? else { return Ok(None) };
                Ok(crate::skills::version_in(c, &r.digest)?.map(|v| (r, v)))
            })
            .await?;
        found.ok_or_else(|| crate::skills::SkillError::NotInstalled(name.to_string()).into())
    }

    /// Removes the installed skill `name` (sessions that loaded it keep their version; the
    /// components it bundled stay installed — remove them with `remove_tool`).
    pub async fn remove_skill(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<crate::skills::SkillRecord, ApiError> {
        caller.require_admin("removing a skill")?;
        let n = name.to_string();
        Ok(self.db.run(move |c| crate::skills::remove_in(c, &n)).await?)
    }
}

/// Who installed a component a skill bundles: its skill's package (a registry's
/// `REGISTRY/REPOSITORY`, whatever the tag; or the directory) and the skill's name, from the
/// component's recorded source `SOURCE (skill NAME)`. `None` for a component no skill
/// installed.
fn skill_owner(source: &str) -> Option<(String, String)> {
    let (from, skill) = source.strip_suffix(')')?.rsplit_once(" (skill ")?;
    let package = match from.parse::<crate::oci::OciRef>() {
        Ok(r) => r.package(),
        Err(_) => from.to_string(),
    };
    Some((package, skill.to_string()))
}
