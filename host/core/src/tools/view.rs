//! The catalog in memory: the installed tools at one catalog version, resolved to the source
//! that runs them, and the service's cache of the newest version.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::sql::Connection;

use crate::store::StoreError;

use super::source::{HostTool, ToolSource};
use super::{ComponentRecord, ToolRecord, ToolService, ToolServiceError, catalog, install};

/// A resolved tool: its record, the digest of its implementation (the component's sha256, or
/// a host tool's digest) and the source that runs it.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub record: ToolRecord,
    pub digest: String,
    pub source: ToolSource,
}

impl Resolved {
    pub(super) fn component(record: ToolRecord, digest: String) -> Self {
        Self { record, digest, source: ToolSource::Component }
    }

    pub(super) fn host(tool: &Arc<dyn HostTool>) -> Self {
        Self {
            record: tool.record().clone(),
            digest: tool.digest().to_string(),
            source: ToolSource::Host(tool.clone()),
        }
    }
}

/// The catalog at one version, in memory and immutable: the installed tools, and their
/// serialized schemas per loaded-tool list (built on first use). A step resolves its calls
/// against the catalog its request was assembled from, so the model's schemas and the
/// components that run are the same.
#[derive(Debug)]
pub struct Catalog {
    version: i64,
    /// The generation of the service's host tools this catalog includes.
    hosts: u64,
    tools: HashMap<String, Arc<Resolved>>,
    /// Every kept version of every tool, by (name, component digest).
    versions: HashMap<(String, String), Arc<Resolved>>,
    /// Serialized `tools` arrays by loaded-tool list (each with the digest it resolves to)
    /// and form (compact or not).
    tools_json: Mutex<HashMap<SchemasKey, Option<Arc<str>>>>,
}

/// Tool names with the component digest each resolves to.
type ResolvedList = Vec<(String, String)>;

/// A serialized `tools` array's key: the tools it lists and their form.
type SchemasKey = (ResolvedList, SchemaForm);

/// A session's pins: the component digest it loaded, by tool name.
pub type ToolPins = std::collections::BTreeMap<String, String>;

impl Catalog {
    /// The installed tool `name`, if any.
    pub fn get(&self, name: &str) -> Option<Arc<Resolved>> {
        self.tools.get(name).cloned()
    }

    /// The version of `name` a session with `pins` runs: the pinned component digest when
    /// the tool is pinned (kept even after an upgrade), else the installed one. A host tool
    /// is the one this process has: its code cannot be kept at an older version (an approval
    /// still binds its digest).
    pub fn get_pinned(&self, name: &str, pins: &ToolPins) -> Option<Arc<Resolved>> {
        let current = self.tools.get(name);
        match pins.get(name) {
            Some(d)
                if current.is_none_or(|c| {
                    &c.digest != d && matches!(c.source, ToolSource::Component)
                }) =>
            {
                self.versions.get(&(name.to_string(), d.clone())).cloned()
            }
            _ => current.cloned(),
        }
    }

    /// The loaded tools as the model sees them — the OpenAI `tools` array (name, description,
    /// input schema), serialized once per tool list. `None` when no loaded tool is installed.
    #[cfg(any(test, feature = "internals"))]
    pub fn tools_json(&self, loaded: &[String]) -> Option<Arc<str>> {
        self.tools_json_pinned(loaded, &ToolPins::new())
    }

    /// [`tools_json`](Self::tools_json) for a session with `pins`: each tool as the version
    /// the session runs.
    #[cfg(any(test, feature = "internals"))]
    pub fn tools_json_pinned(&self, loaded: &[String], pins: &ToolPins) -> Option<Arc<str>> {
        self.tools_json_as(loaded, pins, SchemaForm::Full)
    }

    /// The loaded tools in schema form `form` ([`SchemaForm`]), for a session with `pins`.
    pub fn tools_json_as(
        &self,
        loaded: &[String],
        pins: &ToolPins,
        form: SchemaForm,
    ) -> Option<Arc<str>> {
        let resolved: Vec<Arc<Resolved>> =
            loaded.iter().filter_map(|name| self.get_pinned(name, pins)).collect();
        let key: Vec<(String, String)> =
            resolved.iter().map(|r| (r.record.name.clone(), r.digest.clone())).collect();
        let key = (key, form);
        let mut memo = self.tools_json.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(hit) = memo.get(&key) {
            return hit.clone();
        }
        let items: Vec<serde_json::Value> = resolved
            .iter()
            .map(|r| {
                let (mut description, mut parameters) =
                    (r.record.description.clone(), r.record.input_schema.clone());
                match form {
                    SchemaForm::Full => {}
                    SchemaForm::Compact => {
                        description = first_sentence(&description, COMPACT_DESCRIPTION);
                        compact_schema(&mut parameters, false);
                    }
                    SchemaForm::Minimal => {
                        description = first_sentence(&description, MINIMAL_DESCRIPTION);
                        compact_schema(&mut parameters, true);
                    }
                }
                serde_json::json!({"type": "function", "function": {
                    "name": r.record.name, "description": description,
                    "parameters": parameters}})
            })
            .collect();
        let json: Option<Arc<str>> =
            (!items.is_empty()).then(|| serde_json::Value::Array(items).to_string().into());
        memo.insert(key, json.clone());
        json
    }

    /// The digests `loaded` resolves to now, for the tools that are installed: what a session
    /// pins when it loads them.
    pub fn current_pins(&self, loaded: &[String]) -> ToolPins {
        loaded
            .iter()
            .filter_map(|n| self.tools.get(n).map(|r| (n.clone(), r.digest.clone())))
            .collect()
    }
}

/// How much of the tools' own descriptions a request carries: keel's fixed part of a request
/// is kept within a share of the context window, and the schemas give way first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemaForm {
    /// As the tools describe themselves.
    Full,
    /// Descriptions cut to their first sentence; examples, titles and schema noise dropped
    /// (`compact_schema`).
    Compact,
    /// As compact, the tool's description cut shorter ([`MINIMAL_DESCRIPTION`]), and its
    /// parameters' descriptions and length and count bounds dropped: names, types, enums
    /// and required lists — what a call must have — are what is left (keel checks the rest
    /// when the call is made, and says what was wrong).
    Minimal,
}

/// Characters of a tool's description its compact schema keeps, at most.
pub const COMPACT_DESCRIPTION: usize = 160;

/// Characters of a tool's description its minimal schema keeps, at most.
pub const MINIMAL_DESCRIPTION: usize = 72;

/// Characters of a parameter's description a compact schema keeps, at most.
pub const COMPACT_PARAMETER: usize = 80;

/// `text`'s first sentence (up to the first `. ` or line break), at most `max` characters
/// (cut with `…`).
pub fn first_sentence(text: &str, max: usize) -> String {
    let text = text.trim();
    let end = [text.find(". ").map(|i| i + 1), text.find('\n')].into_iter().flatten().min();
    let sentence = end.map_or(text, |e| &text[..e]).trim_end();
    if sentence.chars().count() <= max {
        return sentence.to_string();
    }
    let mut cut: String = sentence.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// A JSON Schema as a small context window gets it: every description cut to its first
/// sentence ([`COMPACT_PARAMETER`] characters at most); examples, titles, comments, the
/// `$schema` URI, formats and null defaults dropped; an optional field's `["T", "null"]` type
/// written `"T"` (it is optional by not being required). Names, types, enums, required lists
/// and bounds — what a call must satisfy — are kept.
///
/// `minimal` also drops every description and the length and count bounds (the
/// [`SchemaForm::Minimal`] form).
pub fn compact_schema(schema: &mut serde_json::Value, minimal: bool) {
    use serde_json::Value;
    let Value::Object(map) = schema else { return };
    for k in ["examples", "example", "title", "$comment", "$schema", "format"] {
        map.remove(k);
    }
    if minimal {
        for k in ["description", "minLength", "maxLength", "minItems", "maxItems"] {
            map.remove(k);
        }
    }
    if map.get("default").is_some_and(Value::is_null) {
        map.remove("default");
    }
    if let Some(Value::Array(types)) = map.get("type")
        && types.len() == 2
        && let Some(other) = types.iter().find(|t| *t != "null")
        && types.iter().any(|t| t == "null")
    {
        let other = other.clone();
        map.insert("type".into(), other);
    }
    if let Some(Value::String(d)) = map.get_mut("description") {
        *d = first_sentence(d, COMPACT_PARAMETER);
    }
    for (key, value) in map.iter_mut() {
        match (key.as_str(), value) {
            // Maps of names to schemas: a property may be called `title` or `description`.
            ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(m)) => {
                m.values_mut().for_each(|v| compact_schema(v, minimal));
            }
            ("anyOf" | "oneOf" | "allOf" | "prefixItems" | "items", Value::Array(a)) => {
                a.iter_mut().for_each(|v| compact_schema(v, minimal));
            }
            (
                "items" | "additionalProperties" | "not" | "if" | "then" | "else" | "contains",
                v @ Value::Object(_),
            ) => compact_schema(v, minimal),
            _ => {}
        }
    }
}

/// The newest catalog this service has seen. Its version is checked in one of two ways: on
/// this service's own connection, only when the database's `data_version` moved (another
/// connection committed — usually a session's commit, which leaves the catalog as it was);
/// or inside a caller's read transaction ([`ToolService::catalog_in`], a step's assembly).
/// Catalog versions only grow, so a newer catalog is never replaced by an older one; this
/// service's own writes clear it.
#[derive(Default)]
pub(super) struct CatalogCache {
    /// `PRAGMA data_version` of the own connection when the version was last read on it.
    data_version: Option<i64>,
    current: Option<Arc<Catalog>>,
    /// Times the catalog was loaded from the database.
    loads: u64,
}

impl ToolService {
    /// Every installed component.
    pub fn components(&self) -> Result<Vec<ComponentRecord>, ToolServiceError> {
        let db = self.db();
        let keys = super::trust::list_in(&db)?;
        let mut all = catalog::components(&db)?;
        for c in &mut all {
            c.signer_trusted = super::trust::still_trusted(&keys, c);
        }
        Ok(all)
    }

    /// Every installed tool, and the host tools of this process.
    pub fn tools(&self) -> Result<Vec<ToolRecord>, ToolServiceError> {
        let mut tools = catalog::tools(&self.db())?;
        let hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        tools.retain(|t| !hosts.tools.contains_key(&t.name));
        tools.extend(hosts.tools.values().map(|h| h.record().clone()));
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(tools)
    }

    /// Adds a tool implemented in the host process (a control or MCP tool) to the catalog.
    /// Its name must be a valid tool name that no installed tool or other host tool has.
    pub fn register_host_tool(&self, tool: Arc<dyn HostTool>) -> Result<(), ToolServiceError> {
        let name = tool.record().name.clone();
        if !install::valid_tool_name(&name) {
            return Err(ToolServiceError::InvalidSpecs {
                problems: vec![format!("`{name}` is not a valid tool name")],
            });
        }
        if tool.kind() == super::SourceKind::Component {
            return Err(ToolServiceError::InvalidSpecs {
                problems: vec![format!("host tool `{name}` says it is a component")],
            });
        }
        let installed = catalog::tool(&self.db(), &name)?;
        let mut hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        let owner = match (installed, hosts.tools.get(&name)) {
            (Some(t), _) => Some(t.component),
            (None, Some(h)) => Some(h.record().component.clone()),
            (None, None) => None,
        };
        if let Some(owner) = owner {
            return Err(ToolServiceError::NameClash { clashes: vec![(name, owner)] });
        }
        hosts.tools.insert(name, tool);
        hosts.generation += 1;
        drop(hosts);
        self.invalidate_catalog();
        Ok(())
    }

    /// The names of the host tools of this process, with the provider each belongs to.
    pub(super) fn host_tool_owners(&self, names: &[String]) -> Vec<(String, String)> {
        let hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        names
            .iter()
            .filter_map(|n| hosts.tools.get(n).map(|h| (n.clone(), h.record().component.clone())))
            .collect()
    }

    /// The component named `name`, or the component of the tool named `name`.
    pub fn component_for(
        &self,
        name: &str,
    ) -> Result<(ComponentRecord, Vec<ToolRecord>), ToolServiceError> {
        let db = self.db();
        let component = match catalog::component(&db, name)? {
            Some(c) => Some(c),
            None => match catalog::tool(&db, name)? {
                Some(t) => catalog::component(&db, &t.component)?,
                None => None,
            },
        };
        let Some(component) = component else {
            drop(db);
            return Err(self.not_installed(name));
        };
        let tools = catalog::tools_of(&db, &component.name)?;
        let mut component = component;
        component.signer_trusted =
            super::trust::still_trusted(&super::trust::list_in(&db)?, &component);
        Ok((component, tools))
    }

    /// The error for a tool or component `name` that is not installed (it lists those that
    /// are).
    pub fn not_installed(&self, name: &str) -> ToolServiceError {
        let available = self
            .tools()
            .map(|t| t.into_iter().map(|t| t.name).collect::<Vec<_>>().join(", "))
            .unwrap_or_default();
        ToolServiceError::NotInstalled { name: name.to_string(), available }
    }

    pub(super) fn invalidate_catalog(&self) {
        let mut cache = self.catalog.lock().unwrap_or_else(PoisonError::into_inner);
        cache.data_version = None;
        cache.current = None;
    }

    /// Loads the catalog at the version `c` sees (inside `c`'s transaction, if it has one),
    /// with this process's host tools (which take the place of a component's tool of the same
    /// name installed by another process since they were registered).
    fn load_catalog(&self, c: &Connection, version: i64) -> Result<Catalog, ToolServiceError> {
        let components = catalog::components(c)?;
        let digests: HashMap<String, String> = components
            .iter()
            .filter(|c| c.kind == super::SourceKind::Component)
            .map(|c| (c.name.clone(), c.digest.clone()))
            .collect();
        let records = catalog::tools(c)?;
        let mcp = match components.iter().any(|c| c.kind == super::SourceKind::Mcp) {
            true => self.mcp_resolved(c, &records)?,
            false => Vec::new(),
        };
        let mut tools: HashMap<String, Arc<Resolved>> = records
            .into_iter()
            .filter_map(|record| {
                let digest = digests.get(&record.component)?.clone();
                Some((record.name.clone(), Arc::new(Resolved::component(record, digest))))
            })
            .collect();
        let mut versions: HashMap<(String, String), Arc<Resolved>> = catalog::tool_versions(c)?
            .into_iter()
            .map(|(record, digest)| {
                (
                    (record.name.clone(), digest.clone()),
                    Arc::new(Resolved::component(record, digest)),
                )
            })
            .collect();
        for resolved in mcp {
            let name = resolved.record.name.clone();
            versions.retain(|(n, _), _| *n != name);
            versions.insert((name.clone(), resolved.digest.clone()), resolved.clone());
            tools.insert(name, resolved);
        }
        let hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, tool) in &hosts.tools {
            let resolved = Arc::new(Resolved::host(tool));
            versions.retain(|(n, _), _| n != name);
            versions.insert((name.clone(), resolved.digest.clone()), resolved.clone());
            tools.insert(name.clone(), resolved);
        }
        let hosts = hosts.generation;
        Ok(Catalog { version, hosts, tools, versions, tools_json: Mutex::default() })
    }

    fn host_generation(&self) -> u64 {
        self.hosts.lock().unwrap_or_else(PoisonError::into_inner).generation
    }

    /// Keeps `loaded` as the current catalog unless a newer one is there already; returns the
    /// newest.
    fn keep_newest(&self, loaded: Catalog) -> Arc<Catalog> {
        let mut cache = self.catalog.lock().unwrap_or_else(PoisonError::into_inner);
        cache.loads += 1;
        match &cache.current {
            Some(current) if (current.version, current.hosts) >= (loaded.version, loaded.hosts) => {
                current.clone()
            }
            _ => {
                let loaded = Arc::new(loaded);
                cache.current = Some(loaded.clone());
                loaded
            }
        }
    }

    /// The current catalog, brought up to date on this service's connection: one cheap read
    /// when another connection committed since the last check, a reload only when the
    /// catalog itself changed.
    pub fn catalog(&self) -> Result<Arc<Catalog>, ToolServiceError> {
        let db = self.db();
        let data_version = catalog::data_version(&db)?;
        {
            let cache = self.catalog.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(current) = &cache.current
                && cache.data_version == Some(data_version)
            {
                return Ok(current.clone());
            }
        }
        // The version, and the catalog if it changed, from one read transaction: an install
        // committing meanwhile is seen whole or not at all (and moves `data_version` again).
        let tx = db.unchecked_transaction().map_err(StoreError::from)?;
        let data_version = catalog::data_version(&tx)?;
        let version = catalog::catalog_version(&tx)?;
        let hosts = self.host_generation();
        let current = {
            let mut cache = self.catalog.lock().unwrap_or_else(PoisonError::into_inner);
            cache.data_version = Some(data_version);
            cache.current.clone().filter(|c| c.version >= version && c.hosts >= hosts)
        };
        let current = match current {
            Some(current) => current,
            None => self.keep_newest(self.load_catalog(&tx, version)?),
        };
        // A read transaction: ending it cannot lose anything.
        tx.commit().map_err(StoreError::from)?;
        Ok(current)
    }

    /// The catalog as of `c`'s read transaction — a session's snapshot, so that a step's
    /// request and its calls see the catalog and the session's facts from one commit. Reads
    /// one row on `c` and nothing on this service's connection (whose lock every session's
    /// step would otherwise take); reloads (from `c`) only when the catalog changed.
    pub fn catalog_in(&self, c: &Connection) -> Result<Arc<Catalog>, ToolServiceError> {
        let version = catalog::catalog_version(c)?;
        let hosts = self.host_generation();
        {
            let cache = self.catalog.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(current) =
                cache.current.as_ref().filter(|c| c.version >= version && c.hosts >= hosts)
            {
                return Ok(current.clone());
            }
        }
        Ok(self.keep_newest(self.load_catalog(c, version)?))
    }

    /// How many times this service loaded the catalog from the database (for tests).
    #[doc(hidden)]
    #[cfg(any(test, feature = "internals"))]
    pub fn catalog_loads(&self) -> u64 {
        self.catalog.lock().unwrap_or_else(PoisonError::into_inner).loads
    }

    /// Step 1: the tool must be installed. Served from memory while the catalog is unchanged.
    pub fn resolve(&self, tool: &str) -> Result<Arc<Resolved>, ToolServiceError> {
        self.catalog()?.get(tool).ok_or_else(|| self.not_installed(tool))
    }

    /// Step 1 for a session: the version of `tool` the session pinned when it loaded it
    /// (kept after an upgrade), or the installed one if it is not pinned.
    pub fn resolve_pinned(
        &self,
        tool: &str,
        pins: &ToolPins,
    ) -> Result<Arc<Resolved>, ToolServiceError> {
        self.catalog()?.get_pinned(tool, pins).ok_or_else(|| self.not_installed(tool))
    }

    /// The component digests `tools` resolve to now (installed tools only).
    pub fn current_pins(&self, tools: &[String]) -> Result<ToolPins, ToolServiceError> {
        Ok(self.catalog()?.current_pins(tools))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compact_schema_keeps_what_a_call_must_satisfy() {
        let mut schema = serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "ReadInput",
            "type": "object",
            "additionalProperties": false,
            "required": ["path"],
            "properties": {
                "path": {"type": "string", "description": "Path of the file. Relative paths start at the grant.", "examples": ["/w/a.txt"]},
                "limit": {"type": ["integer", "null"], "format": "uint", "minimum": 0, "default": null},
                "title": {"type": "string", "description": "A property named title stays.", "default": "x"},
                "mode": {"anyOf": [{"type": "string", "enum": ["a", "b"], "title": "Mode"}]}
            }
        });
        let mut minimal = schema.clone();
        compact_schema(&mut schema, false);
        assert_eq!(
            schema,
            serde_json::json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["path"],
                "properties": {
                    "path": {"type": "string", "description": "Path of the file."},
                    "limit": {"type": "integer", "minimum": 0},
                    "title": {"type": "string", "description": "A property named title stays.", "default": "x"},
                    "mode": {"anyOf": [{"type": "string", "enum": ["a", "b"]}]}
                }
            })
        );
        compact_schema(&mut minimal, true);
        assert_eq!(
            minimal,
            serde_json::json!({
                "type": "object",
                "additionalProperties": false,
                "required": ["path"],
                "properties": {
                    "path": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 0},
                    "title": {"type": "string", "default": "x"},
                    "mode": {"anyOf": [{"type": "string", "enum": ["a", "b"]}]}
                }
            })
        );
        assert_eq!(first_sentence("One. Two.", 80), "One.");
        assert_eq!(first_sentence("line one\nline two", 80), "line one");
        assert_eq!(first_sentence(&"x".repeat(200), 10), format!("{}…", "x".repeat(9)));
        assert_eq!(first_sentence("v1.2 is out", 80), "v1.2 is out");
    }
}
