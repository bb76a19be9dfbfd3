//! The use cases of what sessions can use: skills, long-term memory, a session's loaded
//! capabilities, and its compaction.

use super::*;
use crate::compaction::Compaction;
use crate::ids::SessionId;
use crate::preparation::Preparation;

/// What installing a skill did: the skill, and the install of each component it bundles.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SkillInstallReport {
    #[serde(flatten)]
    pub installed: crate::skills::SkillInstalled,
    pub components: Vec<InstallReport>,
}

/// A session's capabilities: each loaded tool and skill with how it arrived, and the
/// orchestration of each turn that prepared capabilities.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionCapabilities {
    pub capabilities: Vec<crate::preparation::capabilities::Capability>,
    pub orchestrations: Vec<crate::preparation::orchestration::Orchestration>,
}

/// Skills, long-term memory and a session's capabilities.
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
        registry: Option<super::registry::SkillRegistry>,
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

    /// The memories of `user` (of every user when `None`), oldest first. A user named without
    /// a kind is a local one (`alice` is `local:alice`; `token:alice` names an API token's).
    pub async fn memories(
        &self,
        caller: &Caller,
        user: Option<&str>,
    ) -> Result<Vec<crate::memory::Memory>, ApiError> {
        caller.require_admin("reading long-term memory")?;
        let u = user.map(str::to_string);
        Ok(self.db.read(move |c| crate::memory::list_in(c, u.as_deref())).await?)
    }

    /// Remembers `text` (with `tags`) for `user`; returns its id.
    pub async fn add_memory(
        &self,
        caller: &Caller,
        user: &str,
        text: &str,
        tags: &[String],
    ) -> Result<i64, ApiError> {
        caller.require_admin("writing long-term memory")?;
        let (u, t, g) = (user.to_string(), text.to_string(), tags.to_vec());
        Ok(self.db.run(move |c| crate::memory::add_in(c, &u, &t, &g, None)).await?)
    }

    /// Removes memory `id` of `user`.
    pub async fn remove_memory(
        &self,
        caller: &Caller,
        user: &str,
        id: i64,
    ) -> Result<crate::memory::Memory, ApiError> {
        caller.require_admin("removing a memory")?;
        let u = user.to_string();
        Ok(self.db.run(move |c| crate::memory::remove_in(c, &u, id)).await?)
    }

    /// Session `id`'s capabilities, how each arrived, and its orchestrations.
    pub async fn capabilities(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<SessionCapabilities, ApiError> {
        let id = &self.checked(caller, id).await?;
        let (capabilities, orchestrations) = Preparation::of(&self.engine).capabilities(id).await?;
        Ok(SessionCapabilities { capabilities, orchestrations })
    }

    /// Unloads a tool or skill from session `id` (the explicit removal path: nothing else
    /// removes a capability).
    pub async fn unload(
        &self,
        caller: &Caller,
        id: &str,
        kind: crate::preparation::capabilities::Kind,
        name: &str,
    ) -> Result<(), ApiError> {
        let id = &SessionId::from(id);
        caller.require_admin("unloading a capability")?;
        Ok(Preparation::of(&self.engine).unload(id, kind, name).await?)
    }

    /// Compacts session `id` now (see [`Brain::compact`](crate::brain::Brain::compact)); inputs
    /// that arrived meanwhile are run afterwards.
    pub async fn compact(
        &self,
        caller: &Caller,
        id: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<crate::agent::compact::Compaction, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(self.brain.compact(id, cancel, events).await?)
    }

    /// Session `id`'s checkpoints, oldest first.
    pub async fn checkpoints(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Vec<crate::compaction::CheckpointRecord>, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Compaction::of(&self.engine).checkpoints(id).await?)
    }

    /// The exact request of checkpoint `n`'s summary call (the last checkpoint's if `None`).
    pub async fn compaction_evidence(
        &self,
        caller: &Caller,
        id: &str,
        n: Option<i64>,
    ) -> Result<(i64, Vec<u8>), ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Compaction::of(&self.engine).evidence(id, n).await?)
    }

    /// The last answer of checkpoint `n`'s summary call (the last checkpoint's if `None`), as
    /// the model wrote it: a refused one too.
    pub async fn compaction_reply(
        &self,
        caller: &Caller,
        id: &str,
        n: Option<i64>,
    ) -> Result<(i64, String), ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Compaction::of(&self.engine).reply(id, n).await?)
    }

    /// The exact request of turn `turn`'s orchestration call (the last one made if `None`).
    pub async fn orchestration_evidence(
        &self,
        caller: &Caller,
        id: &str,
        turn: Option<i64>,
    ) -> Result<(i64, Vec<u8>), ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Preparation::of(&self.engine).orchestration_evidence(id, turn).await?)
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
