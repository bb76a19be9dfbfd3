//! Installing and removing components: validation of the file and of its tools'
//! descriptions, the catalog rows, and the component file in the home.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use crate::sandbox::{Budget, LoadError, RawSpec};

use super::catalog::{self, ComponentRecord, ToolRecord};
use super::{ToolService, ToolServiceError};

pub use crate::names::{MAX_TOOL_NAME, now, valid_component_name, valid_tool_name};
/// Longest tool description.
pub const MAX_DESCRIPTION: usize = 4096;
/// Most tools one component may describe.
pub const MAX_TOOLS_PER_COMPONENT: usize = 256;
/// Largest schema accepted, in bytes.
pub const MAX_SCHEMA_BYTES: usize = 256 * 1024;

fn parse_schema(
    tool: &str,
    which: &str,
    text: &str,
    problems: &mut Vec<String>,
) -> Option<serde_json::Value> {
    if text.len() > MAX_SCHEMA_BYTES {
        problems.push(format!(
            "`{tool}`: {which} schema is {} bytes, over {MAX_SCHEMA_BYTES}",
            text.len()
        ));
        return None;
    }
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            problems.push(format!("`{tool}`: {which} schema is not JSON: {e}"));
            return None;
        }
    };
    if let Err(e) = jsonschema::meta::validate(&value) {
        problems.push(format!(
            "`{tool}`: {which} schema is not a valid JSON Schema: {e} (at {})",
            e.instance_path()
        ));
        return None;
    }
    if let Err(e) = jsonschema::validator_for(&value) {
        problems.push(format!("`{tool}`: {which} schema cannot be compiled: {e}"));
        return None;
    }
    Some(value)
}

/// Validates every spec and turns them into catalog records for `component`. Returns every
/// problem found, not just the first.
pub fn validate_specs(
    component: &str,
    specs: Vec<RawSpec>,
) -> Result<Vec<ToolRecord>, Vec<String>> {
    let mut problems = Vec::new();
    if specs.is_empty() {
        problems.push("`describe` returned no tools".to_string());
    }
    if specs.len() > MAX_TOOLS_PER_COMPONENT {
        problems.push(format!(
            "`describe` returned {} tools, over {MAX_TOOLS_PER_COMPONENT}",
            specs.len()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut records = Vec::new();
    for s in specs {
        let shown: String = s.name.chars().take(80).collect();
        if !valid_tool_name(&s.name) {
            problems.push(format!(
                "tool name {shown:?} is not well-formed: use lowercase letters, digits and `_`, \
                 starting with a letter, at most {MAX_TOOL_NAME} characters"
            ));
            continue;
        }
        if !seen.insert(s.name.clone()) {
            problems.push(format!("tool name `{}` is described twice", s.name));
            continue;
        }
        if s.description.trim().is_empty() || s.description.len() > MAX_DESCRIPTION {
            problems
                .push(format!("`{}`: description must be 1 to {MAX_DESCRIPTION} bytes", s.name));
        }
        let input = parse_schema(&s.name, "input", &s.input_schema, &mut problems);
        if let Some(v) = &input
            && v.get("type").and_then(|t| t.as_str()) != Some("object")
        {
            problems.push(format!(
                "`{}`: input schema must describe an object (\"type\": \"object\")",
                s.name
            ));
        }
        let output = match &s.output_schema {
            Some(text) => parse_schema(&s.name, "output", text, &mut problems).map(Some),
            None => Some(None),
        };
        let (Some(input), Some(output)) = (input, output) else { continue };
        let spec_digest = crate::sandbox::sha256_hex(
            serde_json::json!({
                "name": s.name, "description": s.description, "input_schema": input,
                "output_schema": output, "effect": s.effect, "idempotent": s.idempotent,
            })
            .to_string()
            .as_bytes(),
        );
        records.push(ToolRecord {
            name: s.name,
            component: component.to_string(),
            description: s.description,
            input_schema: input,
            output_schema: output,
            effect: s.effect,
            idempotent: s.idempotent,
            spec_digest,
        });
    }
    if problems.is_empty() { Ok(records) } else { Err(problems) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, schema: &str) -> RawSpec {
        RawSpec {
            name: name.into(),
            description: "does things".into(),
            input_schema: schema.into(),
            output_schema: None,
            effect: crate::policy::Effect::ReadOnly,
            idempotent: true,
        }
    }

    #[test]
    fn names() {
        assert!(valid_tool_name("fs_read_file"));
        assert!(!valid_tool_name("Fs"));
        assert!(!valid_tool_name("1fs"));
        assert!(!valid_tool_name("fs-read"));
        assert!(!valid_tool_name(""));
        assert!(valid_component_name("my-tool_2"));
    }

    #[test]
    fn every_problem_is_reported() {
        let obj = r#"{"type":"object"}"#;
        let err = validate_specs(
            "c",
            vec![
                spec("ok", obj),
                spec("ok", obj),
                spec("Bad", obj),
                spec("s", "{"),
                spec("t", r#"{"type":"string"}"#),
                spec("u", r#"{"type": 5}"#),
            ],
        )
        .unwrap_err();
        assert_eq!(err.len(), 5, "{err:#?}");
        assert!(err[0].contains("described twice"));
        assert!(err[1].contains("not well-formed"));
        assert!(err[2].contains("not JSON"));
        assert!(err[3].contains("must describe an object"));
        assert!(err[4].contains("not a valid JSON Schema"));
    }
}

/// A component that imports `wasi:http` can reach the network: each of its tools must
/// declare the `external` effect (or `destructive`), so the policy treats it as one that acts
/// outside the workspace.
pub fn check_networked(tools: &[ToolRecord]) -> Result<(), Vec<String>> {
    use crate::policy::Effect;
    let problems: Vec<String> = tools
        .iter()
        .filter(|t| !matches!(t.effect, Effect::External | Effect::Destructive))
        .map(|t| {
            format!(
                "`{}`: the component imports wasi:http (it can send requests over the network), so the tool must declare the `external` effect; it declares `{}`",
                t.name, t.effect
            )
        })
        .collect();
    if problems.is_empty() { Ok(()) } else { Err(problems) }
}

/// Budget of the `describe` call made at install time.
pub fn describe_budget() -> Budget {
    Budget {
        fuel: 2_000_000_000,
        timeout: Duration::from_secs(10),
        memory: 128 << 20,
        ..Budget::default()
    }
}

/// How `install` treats a component name that is already taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstallMode {
    /// A new component: a name already installed is refused (the same file again is fine).
    New,
    /// Replaces the installed component of that name (`keel tool install --upgrade`), unless
    /// the new version widens what it can do ([`super::widening`]).
    Upgrade,
    /// [`Self::Upgrade`], accepting a wider version (`--upgrade --accept-wider`).
    UpgradeWider,
    /// A first-party component, installed or updated by keel itself.
    Builtin,
}

impl InstallMode {
    /// `New`, or an upgrade that accepts a wider version only when `accept_wider`.
    pub fn of(upgrade: bool, accept_wider: bool) -> Self {
        match (upgrade, accept_wider) {
            (false, _) => Self::New,
            (true, false) => Self::Upgrade,
            (true, true) => Self::UpgradeWider,
        }
    }
}

/// Where a component being installed comes from.
#[derive(Debug, Clone)]
pub enum Origin {
    /// A local file (or a file a local skill bundles), named by `source`. A signature is not
    /// required; the trusted key covering the component's name that made one is recorded.
    Local { source: String },
    /// A registry artifact whose digests the pull checked. A signature by a trusted key whose
    /// scope covers `package` is required before anything reads its imports or compiles it,
    /// unless `allow_unsigned` (then the record says so).
    Registry { reference: String, manifest_digest: String, package: String, allow_unsigned: bool },
}

impl Origin {
    fn source(&self) -> &str {
        match self {
            Self::Local { source } | Self::Registry { reference: source, .. } => source,
        }
    }
}

/// What `install` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InstallReport {
    pub component: ComponentRecord,
    pub tools: Vec<ToolRecord>,
    /// Digest of the version this one replaced, if any.
    pub replaced: Option<String>,
    /// What an upgrade changed, tool by tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeDiff>,
    pub compile_ms: f64,
}

/// Compiled artifacts kept for component files that are not installed (`keel tool call
/// --wasm`, `inspect --wasm`), the most recently used first; an installed component's is
/// always kept.
pub const FILE_ARTIFACTS_KEPT: usize = 8;

/// A component that passed install's checks (see [`ToolService::check_component`]).
pub struct Checked {
    pub digest: String,
    /// Whether it carries an embedded signature, and the trusted key (covering its name) that
    /// made it, if one did.
    pub signed: bool,
    pub signer: Option<super::trust::TrustedKey>,
    /// The interfaces it imports (packages and versions).
    pub imports: Vec<String>,
    /// Whether it imports `wasi:http`.
    pub networked: bool,
    pub prepared: Arc<crate::sandbox::Prepared>,
    pub tools: Vec<ToolRecord>,
    pub compile_ms: f64,
    /// Whether its compiled artifact came from the cache (no compile).
    pub cached: bool,
}

/// What install would do with a component file (`keel tool inspect --wasm`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileInspection {
    /// The component name it was checked as.
    pub name: String,
    pub digest: String,
    pub size: u64,
    /// Whether it carries an embedded signature, and the trusted key that made it.
    pub signed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signer: Option<super::trust::TrustedKey>,
    /// Whether install would accept it.
    pub accepted: bool,
    /// Why install would refuse it, and the error kind (`None`: it would be accepted).
    pub refusal: Option<String>,
    pub refusal_kind: Option<String>,
    pub imports: Vec<String>,
    pub networked: bool,
    /// The tools it describes, with their schemas (empty when a check before describing
    /// refused it).
    pub tools: Vec<ToolRecord>,
    pub compile_ms: Option<f64>,
    /// The name and version the component carries.
    pub carried: crate::sandbox::Carried,
}

/// What an upgrade changes in a component's tools (a changed description, schema, effect
/// class or idempotence is a changed spec, and needs fresh approvals).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct UpgradeDiff {
    pub old_digest: String,
    pub new_digest: String,
    pub changed: Vec<String>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// What it widens (accepted with `--accept-wider`); empty when nothing.
    #[serde(skip_serializing_if = "super::widening::Widening::is_empty")]
    pub widened: super::widening::Widening,
}

/// Compares the tools of two versions of a component.
fn upgrade_diff(
    old_digest: &str,
    new_digest: &str,
    old: &[ToolRecord],
    new: &[ToolRecord],
) -> UpgradeDiff {
    let mut d = UpgradeDiff {
        old_digest: old_digest.to_string(),
        new_digest: new_digest.to_string(),
        ..UpgradeDiff::default()
    };
    for t in new {
        match old.iter().find(|o| o.name == t.name) {
            None => d.added.push(t.name.clone()),
            Some(o) if o.spec_digest != t.spec_digest => d.changed.push(t.name.clone()),
            Some(_) => {}
        }
    }
    d.removed = old
        .iter()
        .filter(|o| !new.iter().any(|t| t.name == o.name))
        .map(|o| o.name.clone())
        .collect();
    d
}

impl ToolService {
    /// Validates and installs a component: it must be a component (not a core module), target
    /// the keel tool world, import only granted interfaces, and describe well-formed tools with
    /// valid JSON Schemas whose names no other component uses. Replaces an earlier version of
    /// the same component name.
    pub async fn install(
        &self,
        bytes: &[u8],
        name: &str,
        source: &str,
        builtin: bool,
    ) -> Result<InstallReport, ToolServiceError> {
        let mode = if builtin { InstallMode::Builtin } else { InstallMode::New };
        self.install_as(bytes, name, source, mode).await
    }

    /// [`install`](Self::install) with an explicit [`InstallMode`]: the names of first-party
    /// components are reserved to them, and replacing an installed component needs
    /// [`InstallMode::Upgrade`].
    pub async fn install_as(
        &self,
        bytes: &[u8],
        name: &str,
        source: &str,
        mode: InstallMode,
    ) -> Result<InstallReport, ToolServiceError> {
        self.install_from(bytes, name, &Origin::Local { source: source.to_string() }, mode).await
    }

    /// [`install_as`](Self::install_as) from an [`Origin`]. In order: the name, then for a
    /// registry artifact the signature (its digests were checked by the pull), then
    /// [`check_component`](Self::check_component)'s imports, compile and descriptions.
    pub async fn install_from(
        &self,
        bytes: &[u8],
        name: &str,
        origin: &Origin,
        mode: InstallMode,
    ) -> Result<InstallReport, ToolServiceError> {
        let builtin = mode == InstallMode::Builtin;
        let digest = crate::sandbox::sha256_hex(bytes);
        let existing = self.admit_name(name, &digest, mode)?;
        // A registry artifact's signature, before anything reads its imports or compiles it.
        let verified = match origin {
            Origin::Local { .. } => None,
            Origin::Registry { package, allow_unsigned, .. } => {
                Some(self.registry_verdict(bytes, package, *allow_unsigned)?)
            }
        };
        let Checked { prepared, tools, compile_ms, signer, imports, .. } =
            self.check_component(bytes, name).await?;
        let widened = match existing.as_ref().filter(|o| o.digest != digest && !builtin) {
            Some(old) => {
                let old_imports = self
                    .installed_bytes(&old.digest)
                    .and_then(|b| self.sandbox.imports(&b).ok())
                    .unwrap_or_default();
                let old_tools = catalog::tools_of(&self.db(), name)?;
                super::widening::Widening::between(&old_tools, &tools, &old_imports, &imports)
            }
            None => super::widening::Widening::default(),
        };
        if !widened.is_empty() && mode != InstallMode::UpgradeWider {
            return Err(ToolServiceError::Wider {
                name: name.to_string(),
                changes: widened.lines(),
            });
        }
        let (signer, unsigned_allowed) = match verified {
            None => (signer, false),
            Some(key) => {
                let unsigned = key.is_none();
                (key, unsigned)
            }
        };
        let manifest_digest = match origin {
            Origin::Registry { manifest_digest, .. } => Some(manifest_digest.clone()),
            Origin::Local { .. } => None,
        };
        let clashes = self.clashes(name, &tools)?;
        if !clashes.is_empty() {
            return Err(ToolServiceError::NameClash { clashes });
        }
        let path = self.home.component_path(&digest);
        if !path.exists() {
            let io = |context: &str| {
                let context = context.to_string();
                move |source| ToolServiceError::Io { context, source }
            };
            crate::home::write_private(&path, bytes).map_err(io("writing the component file"))?;
        }
        catalog::share_file(&self.db(), &digest, bytes)?;
        let record = ComponentRecord {
            name: name.to_string(),
            digest: digest.clone(),
            size: bytes.len() as u64,
            source: origin.source().to_string(),
            builtin,
            installed_at: now(),
            kind: super::SourceKind::Component,
            signer_key: signer.as_ref().map(|t| t.public_key.clone()),
            signer_trusted: signer.as_ref().map(|_| true),
            signer: signer.map(|t| t.name),
            unsigned_allowed,
            manifest_digest,
            version: crate::sandbox::carried(bytes).version,
        };
        let (replaced, upgrade) = {
            let mut db = self.db();
            let old = catalog::component(&db, name)?.filter(|c| c.digest != digest);
            let upgrade = match &old {
                Some(o) => {
                    let mut d =
                        upgrade_diff(&o.digest, &digest, &catalog::tools_of(&db, name)?, &tools);
                    d.widened = widened;
                    Some(d)
                }
                None => None,
            };
            catalog::put(&mut db, &record, &tools)?;
            (old.map(|o| o.digest), upgrade)
        };
        // The replaced version's file stays: sessions that loaded it keep running it until
        // they are told to upgrade (`keel session upgrade-tools`).
        self.invalidate_catalog();
        self.prepared.lock().unwrap_or_else(PoisonError::into_inner).insert(digest, prepared);
        Ok(InstallReport { component: record, tools, replaced, upgrade, compile_ms })
    }

    /// The bytes of the installed component file `digest` (the home's copy, else the store's
    /// shared one), if either is there.
    fn installed_bytes(&self, digest: &str) -> Option<Vec<u8>> {
        std::fs::read(self.home.component_path(digest))
            .ok()
            .or_else(|| catalog::shared_file(&self.db(), digest).ok().flatten())
    }

    /// The trusted key whose signature on a registry component covers `package`; without one,
    /// the refusal naming what failed (unsigned, untrusted key, key outside its scope) — or,
    /// with `allow_unsigned`, `None`.
    pub fn registry_verdict(
        &self,
        bytes: &[u8],
        package: &str,
        allow_unsigned: bool,
    ) -> Result<Option<super::trust::TrustedKey>, ToolServiceError> {
        Self::admit(super::trust::verdict_in(&self.db(), bytes, package)?, package, allow_unsigned)
    }

    /// The trusted key whose detached signature (`document`, as the registry kept it) covers
    /// the skill bundle `manifest_digest` of `package`; without one, the refusal naming what
    /// failed — or, with `allow_unsigned`, `None`. Asked before any of the bundle's files is
    /// fetched.
    pub fn skill_verdict(
        &self,
        document: Option<&[u8]>,
        manifest_digest: &str,
        package: &str,
        allow_unsigned: bool,
    ) -> Result<Option<super::trust::TrustedKey>, ToolServiceError> {
        let verdict =
            super::trust::skill_verdict_in(&self.db(), document, manifest_digest, package)?;
        Self::admit(verdict, package, allow_unsigned)
    }

    fn admit(
        verdict: Result<super::trust::TrustedKey, super::trust::Unverified>,
        package: &str,
        allow_unsigned: bool,
    ) -> Result<Option<super::trust::TrustedKey>, ToolServiceError> {
        match verdict {
            Ok(key) => Ok(Some(key)),
            Err(_) if allow_unsigned => Ok(None),
            Err(why) => Err(ToolServiceError::Unverified {
                package: package.to_string(),
                reason: format!("`{package}`: {why}"),
            }),
        }
    }

    /// What install checks of a component, in its order, before anything is written: size and
    /// header, imports (refused before compiling), compile, the tools it describes and their
    /// schemas. `name` is the component name its tools would be recorded under.
    /// The compiled component of `bytes` (whose sha256 is `digest`), and whether it came from
    /// the artifact cache: checking, inspecting, calling or installing the same bytes again
    /// does not compile them. The artifact is kept as an installed component's is — its own
    /// digest recorded in the database, checked before it is loaded — and of the files that
    /// are not installed, only the [`FILE_ARTIFACTS_KEPT`] used last keep theirs.
    fn compiled(
        &self,
        bytes: &[u8],
        digest: &str,
    ) -> Result<(wasmtime::component::Component, bool), ToolServiceError> {
        let engine = self.sandbox.engine_hash()?.to_string();
        let recorded = catalog::artifact_digest(&self.db(), &engine, digest)?;
        if let Some(component) = self.sandbox.load_cached(digest, recorded.as_deref())? {
            // Used now: the last to be dropped.
            if let Some(r) = &recorded {
                catalog::record_artifact(&self.db(), &engine, digest, r)?;
            }
            return Ok((component, true));
        }
        let component = self.sandbox.compile(bytes)?;
        let written = self.sandbox.cache_artifact(&component, digest)?;
        catalog::record_artifact(&self.db(), &engine, digest, &written)?;
        // (The list first: the connection's guard is not held across the loop.)
        let strays = catalog::stray_artifacts(&self.db(), &engine, FILE_ARTIFACTS_KEPT)?;
        for stray in strays {
            if stray != digest {
                catalog::forget_artifact(&self.db(), &engine, &stray)?;
                self.sandbox.drop_artifact(&stray)?;
            }
        }
        Ok((component, false))
    }

    /// Whether the compiled form of `bytes` is in the artifact cache, recorded by keel.
    pub fn file_compiled(&self, bytes: &[u8]) -> Result<bool, ToolServiceError> {
        let digest = crate::sandbox::sha256_hex(bytes);
        let engine = self.sandbox.engine_hash()?.to_string();
        Ok(catalog::artifact_digest(&self.db(), &engine, &digest)?.is_some()
            && self.sandbox.has_artifact(&digest)?)
    }

    /// The first rule of an install (and of `inspect --wasm`, which says what install would
    /// do): the name is valid, not a first-party component's, not an MCP server's, and, unless
    /// `mode` replaces, not taken by other bytes. Returns the component installed under it.
    fn admit_name(
        &self,
        name: &str,
        digest: &str,
        mode: InstallMode,
    ) -> Result<Option<ComponentRecord>, ToolServiceError> {
        if !valid_component_name(name) {
            return Err(ToolServiceError::InvalidComponentName { name: name.to_string() });
        }
        let builtin = mode == InstallMode::Builtin;
        if !builtin && crate::builtin::BUILTIN_COMPONENTS.iter().any(|(n, _, _)| *n == name) {
            return Err(ToolServiceError::Reserved { name: name.to_string() });
        }
        let existing = catalog::component(&self.db(), name)?;
        if existing.as_ref().is_some_and(|c| c.kind == super::SourceKind::Mcp) {
            return Err(ToolServiceError::McpServer { name: name.to_string() });
        }
        if mode == InstallMode::New
            && let Some(old) = &existing
            && old.digest != digest
        {
            return Err(ToolServiceError::AlreadyInstalled {
                name: name.to_string(),
                digest: old.digest.clone(),
            });
        }
        Ok(existing)
    }

    pub async fn check_component(
        &self,
        bytes: &[u8],
        name: &str,
    ) -> Result<Checked, ToolServiceError> {
        let digest = crate::sandbox::sha256_hex(bytes);
        let limit = self.sandbox.limits().max_component_bytes;
        if bytes.len() as u64 > limit {
            return Err(LoadError::TooLarge { size: bytes.len() as u64, limit }.into());
        }
        crate::sandbox::check_header(bytes)?;
        // The signature before anything reads what the component imports or compiles it.
        let signed = crate::signing::is_signed(bytes);
        let signer = super::trust::signer_in(&self.db(), bytes, name)?;
        let started = std::time::Instant::now();
        let trusted = self.trusted_with_control(&digest);
        self.sandbox.check_imports(bytes, trusted)?;
        let imports = self.sandbox.imports(bytes)?;
        let networked = self.sandbox.imports_http(bytes)?;
        let (component, cached) = self.compiled(bytes, &digest)?;
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        let prepared = Arc::new(self.sandbox.prepare(&component, trusted)?);
        let report = self.sandbox.describe(&prepared, &describe_budget()).await;
        let specs = report.result.map_err(|error| ToolServiceError::Describe { error })?;
        let tools = validate_specs(name, specs)
            .map_err(|problems| ToolServiceError::InvalidSpecs { problems })?;
        if networked {
            check_networked(&tools)
                .map_err(|problems| ToolServiceError::InvalidSpecs { problems })?;
        }
        Ok(Checked {
            digest,
            signed,
            signer,
            imports,
            networked,
            prepared,
            tools,
            compile_ms,
            cached,
        })
    }

    /// The installed tools (another component's, or implemented in this process) whose names
    /// `tools` of component `name` would take.
    fn clashes(
        &self,
        name: &str,
        tools: &[ToolRecord],
    ) -> Result<Vec<(String, String)>, ToolServiceError> {
        let names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
        let mut clashes = catalog::clashes(&self.db(), name, &names)?;
        clashes.extend(self.host_tool_owners(&names));
        Ok(clashes)
    }

    /// What installing `bytes` as `name` would do, without installing: the checks install
    /// makes, and the names it would clash with. Nothing is written.
    pub async fn inspect_file(&self, bytes: &[u8], name: &str) -> FileInspection {
        let digest = crate::sandbox::sha256_hex(bytes);
        let size = bytes.len() as u64;
        let imports = self.sandbox.imports(bytes).unwrap_or_default();
        let carried = crate::sandbox::carried(bytes);
        let checked = match self.admit_name(name, &digest, InstallMode::New) {
            Ok(_) => self.check_component(bytes, name).await,
            Err(e) => Err(e),
        };
        match checked {
            Ok(c) => {
                // What install checks next: the names its tools would take.
                let refused = match self.clashes(name, &c.tools) {
                    Ok(clashes) if clashes.is_empty() => None,
                    Ok(clashes) => Some(ToolServiceError::NameClash { clashes }),
                    Err(e) => Some(e),
                };
                FileInspection {
                    name: name.to_string(),
                    digest,
                    size,
                    signed: c.signed,
                    signer: c.signer,
                    accepted: refused.is_none(),
                    refusal_kind: refused.as_ref().map(|e| e.kind().to_string()),
                    refusal: refused.map(|e| e.to_string()),
                    imports: c.imports,
                    networked: c.networked,
                    tools: c.tools,
                    compile_ms: Some(c.compile_ms),
                    carried,
                }
            }
            Err(e) => FileInspection {
                name: name.to_string(),
                digest,
                size,
                signed: crate::signing::is_signed(bytes),
                signer: None,
                accepted: false,
                refusal_kind: Some(e.kind().to_string()),
                refusal: Some(e.to_string()),
                imports,
                networked: false,
                tools: Vec::new(),
                compile_ms: None,
                carried,
            },
        }
    }

    /// Runs one call of a tool of the component in `bytes`, not installed: the checks install
    /// makes, then the governed call an installed tool gets (input schema, budget, grants,
    /// effect enforcement, lease, change set). The component is compiled in memory for this
    /// call; the catalog, the component files and the artifact cache are not touched.
    pub async fn call_file(
        &self,
        bytes: &[u8],
        name: &str,
        req: super::CallRequest<'_>,
    ) -> Result<super::CallOutcome, ToolServiceError> {
        // A first-party name is reserved here as at install: a file called `fs` is not keel's
        // `fs` (its trust, its name in records), unless it is those very bytes.
        if crate::builtin::BUILTIN_COMPONENTS.iter().any(|(n, b, _)| *n == name && *b != bytes) {
            return Err(ToolServiceError::ReservedFile { name: name.to_string() });
        }
        let checked = self.check_component(bytes, name).await?;
        let Some(record) = checked.tools.iter().find(|t| t.name == req.tool).cloned() else {
            let names: Vec<&str> = checked.tools.iter().map(|t| t.name.as_str()).collect();
            return Err(ToolServiceError::NotInComponent {
                tool: req.tool.to_string(),
                tools: names.join(", "),
            });
        };
        let digest = checked.digest.clone();
        let compiled_ms = (!checked.cached).then_some(checked.compile_ms);
        let resolved = Arc::new(super::Resolved::component(record, digest.clone()));
        // The call finds the component where it finds an installed one, for this call only:
        // an entry it adds is taken out again (an installed component of the same digest
        // keeps its own).
        let added = {
            let mut prepared = self.prepared.lock().unwrap_or_else(PoisonError::into_inner);
            let absent = !prepared.contains_key(&digest);
            if absent {
                prepared.insert(digest.clone(), checked.prepared);
            }
            absent
        };
        let outcome = self.call_as(req, Some(resolved)).await;
        if added {
            self.prepared.lock().unwrap_or_else(PoisonError::into_inner).remove(&digest);
        }
        outcome.map(|o| super::CallOutcome { compiled_ms, ..o })
    }

    /// Trusts the publisher key `key` as `name` for the packages `packages` matches.
    pub fn trust_add(
        &self,
        name: &str,
        key: &str,
        packages: &str,
    ) -> Result<super::trust::TrustedKey, ToolServiceError> {
        Ok(super::trust::add_in(&self.db(), name, key, packages)?)
    }

    /// The trusted publisher keys.
    pub fn trusted_keys(&self) -> Result<Vec<super::trust::TrustedKey>, ToolServiceError> {
        Ok(super::trust::list_in(&self.db())?)
    }

    /// Stops trusting the key named `name`.
    pub fn trust_remove(&self, name: &str) -> Result<super::trust::TrustedKey, ToolServiceError> {
        Ok(super::trust::remove_in(&self.db(), name)?)
    }

    /// The trusted keys (of those covering `package`) that signed `bytes`, and whether `bytes`
    /// carry a signature at all.
    pub fn signers_of(
        &self,
        bytes: &[u8],
        package: &str,
    ) -> Result<(bool, Option<super::trust::TrustedKey>), ToolServiceError> {
        let signed = crate::signing::is_signed(bytes);
        Ok((signed, super::trust::signer_in(&self.db(), bytes, package)?))
    }

    fn forget_file(&self, digest: &str) -> Result<(), ToolServiceError> {
        if !catalog::digest_in_use(&self.db(), digest)? {
            let _ = std::fs::remove_file(self.home.component_path(digest));
            catalog::unshare_file(&self.db(), digest)?;
        }
        Ok(())
    }

    /// Removes a component (by its name or one of its tools' names).
    pub fn remove(&self, name: &str) -> Result<(ComponentRecord, Vec<String>), ToolServiceError> {
        if let Some((name, provider)) = self.host_tool_owners(&[name.to_string()]).pop() {
            return Err(ToolServiceError::HostTool { name, provider });
        }
        let (component, _) = self.component_for(name)?;
        if component.kind == super::SourceKind::Mcp {
            return Err(ToolServiceError::McpServer { name: component.name });
        }
        if component.builtin {
            return Err(ToolServiceError::Builtin { name: component.name });
        }
        let (removed, digests) = catalog::remove(&mut self.db(), &component.name)?;
        self.invalidate_catalog();
        self.forget_file(&component.digest)?;
        for d in &digests {
            self.forget_file(d)?;
        }
        Ok((component, removed))
    }
}
