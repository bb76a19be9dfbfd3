//! External MCP servers as a tool source, on the official Rust SDK (`rmcp`). (keel as an MCP
//! server is a front-end, in the `keel-server` crate.)
//!
//! - [`client`]: external MCP servers as keel tools. A server added with `keel mcp add` is a
//!   catalog entry of kind `mcp` whose tools are named `SERVER__TOOL` and pinned by a digest of
//!   (server identity, tool name, description, schemas, annotations); [`client::Pool`] starts
//!   servers lazily, keeps them per process and restarts a crashed one once.
//! - [`registry`]: the `mcp_servers` table — what was added and accepted.
//!
//! Annotations are the server's claims, not facts: an external tool is `external` unless the
//! admin trusts the annotations (`--trust-annotations`) or sets the class (`--effect`). An MCP
//! server runs with its own authority, outside the sandbox: keel governs *whether* a call is
//! made, not what the server does with it.

pub mod client;
pub mod registry;
mod servers;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::policy::Effect;

/// The protocol versions keel speaks (the handshake era), newest first.
pub const PROTOCOL_VERSIONS: &[rmcp::model::ProtocolVersion] =
    &[rmcp::model::ProtocolVersion::V_2025_11_25, rmcp::model::ProtocolVersion::V_2025_06_18];

/// The separator between a server's name and its tool's in a catalog name.
pub const SEPARATOR: &str = "__";

/// A server name's longest form (its tools' names must fit keel's 64 characters).
pub const MAX_SERVER_NAME: usize = 24;

/// Why an MCP operation failed.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error(
        "`{0}` is not a valid MCP server name: use 1 to {MAX_SERVER_NAME} lowercase letters, digits \
         and single `_`, starting with a letter (its tools are named NAME__TOOL)"
    )]
    InvalidName(String),
    #[error("no MCP server named `{0}` was added; see `keel mcp list`")]
    NotFound(String),
    #[error(
        "an MCP server or component named `{0}` exists already; remove it first or choose another name"
    )]
    Exists(String),
    #[error("{0}")]
    Input(String),
    /// The server could not be started, reached or initialized.
    #[error("MCP server `{server}`: {detail}")]
    Connect { server: String, detail: String },
    /// The server answered a request with an error, or not in time.
    #[error("MCP server `{server}`: {detail}")]
    Request { server: String, detail: String },
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

impl McpError {
    /// The error's kind, as a call's result carries it.
    pub fn failure(&self) -> crate::failure::FailureKind {
        use crate::failure::FailureKind;
        match self {
            Self::InvalidName(_) => FailureKind::InvalidName,
            Self::NotFound(_) => FailureKind::NotFound,
            Self::Exists(_) => FailureKind::Exists,
            Self::Input(_) => FailureKind::Input,
            Self::Connect { .. } => FailureKind::McpConnect,
            Self::Request { .. } => FailureKind::McpRequest,
            Self::Store(e) => e.failure(),
        }
    }

    /// A stable name of the error's kind.
    pub fn kind(&self) -> &'static str {
        self.failure().as_str()
    }
}

/// Checks a server name: `[a-z][a-z0-9_]*`, no `__`, no trailing `_`, at most
/// [`MAX_SERVER_NAME`] characters.
pub fn check_server_name(name: &str) -> Result<(), McpError> {
    let mut chars = name.chars();
    let ok = name.len() <= MAX_SERVER_NAME
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.contains(SEPARATOR)
        && !name.ends_with('_');
    if ok { Ok(()) } else { Err(McpError::InvalidName(name.to_string())) }
}

/// How keel reaches a server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "transport", rename_all = "snake_case")]
pub enum Transport {
    /// A child process speaking MCP on its stdin and stdout. Its environment is `env` plus
    /// `PATH` and `HOME`, nothing else.
    Stdio {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    /// A streamable HTTP endpoint, sent `headers` with every request.
    Http {
        url: String,
        #[serde(default)]
        headers: BTreeMap<String, String>,
    },
}

impl Transport {
    /// What identifies the server whatever its tools say: the command and its arguments, or
    /// the URL (environment values and headers, which may hold credentials, are left out).
    pub fn identity(&self) -> String {
        match self {
            Self::Stdio { command, args, .. } => {
                serde_json::json!({"stdio": command, "args": args}).to_string()
            }
            Self::Http { url, .. } => serde_json::json!({"http": url}).to_string(),
        }
    }

    /// The transport as shown to people: secrets (environment values, header values) hidden.
    pub fn shown(&self) -> serde_json::Value {
        match self {
            Self::Stdio { command, args, env } => serde_json::json!({
                "transport": "stdio", "command": command, "args": args,
                "env": env.keys().collect::<Vec<_>>(),
            }),
            Self::Http { url, headers } => serde_json::json!({
                "transport": "http", "url": url, "headers": headers.keys().collect::<Vec<_>>(),
            }),
        }
    }
}

/// An added server: its transport and how its tools are classed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerSpec {
    pub name: String,
    #[serde(flatten)]
    pub transport: Transport,
    /// The effect class of every tool of the server, set by the admin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    /// Whether the tools' annotations (read-only, destructive, idempotent hints) set their
    /// class when `effect` is not set.
    #[serde(default)]
    pub trust_annotations: bool,
    /// Whether its tools join every new session (`always`), or are found when needed through
    /// `tools_find` / `tools_select` or named with `--tools` (`on-demand`, the default).
    #[serde(default)]
    pub load: McpLoad,
}

crate::stored_enum! {
    /// When an MCP server's tools join a session (`keel mcp add --load`).
    #[derive(Default)]
    pub enum McpLoad: "MCP load mode" {
        /// Found through tool discovery (`tools_find`, `tools_select`) or named with `--tools`.
        #[default]
        OnDemand = "on-demand",
        /// Loaded into every new session that does not name its tools.
        Always = "always",
    }
}

/// What the server said of itself in `initialize`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServerInfo {
    pub name: String,
    pub version: String,
    pub protocol: String,
}

/// A tool of a server as keel accepted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedTool {
    /// Its catalog name, `SERVER__TOOL`.
    pub name: String,
    /// Its name on the server.
    pub remote: String,
    /// The annotations it claimed (as the server sent them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<serde_json::Value>,
    /// sha256 of (server identity, tool name, description, schemas, annotations).
    pub digest: String,
}

/// One tool a server offers, as keel would record it.
#[derive(Debug, Clone, PartialEq)]
pub struct Offered {
    pub pinned: PinnedTool,
    pub record: crate::tools::ToolRecord,
}

/// Everything `tools/list` and `initialize` said, turned into catalog entries.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    pub info: ServerInfo,
    pub tools: Vec<Offered>,
    /// Tools keel cannot take (an unusable schema, say), with why.
    pub skipped: Vec<(String, String)>,
}

/// The catalog name of a server's tool: `SERVER__TOOL` with the tool's name lowercased and
/// every character keel's tool names do not allow replaced by `_`; a name that would be too
/// long, or that another of the server's tools already maps to, ends in 8 hex characters of
/// the remote name's sha256 instead.
pub fn catalog_name(server: &str, remote: &str, taken: &[String]) -> String {
    let tool: String = remote
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    let name = format!("{server}{SEPARATOR}{tool}");
    let max = crate::tools::install::MAX_TOOL_NAME;
    if name.len() <= max && !taken.contains(&name) && !tool.is_empty() {
        return name;
    }
    let hash = &crate::digest::sha256_hex(remote.as_bytes())[..8];
    let keep = max.saturating_sub(server.len() + SEPARATOR.len() + 9).min(tool.len());
    format!("{server}{SEPARATOR}{}_{hash}", &tool[..keep]).replace("___", "__")
}

/// The effect class and idempotence of a server's tool, by the server's settings: `--effect`
/// for every tool; else, with `--trust-annotations`, the hints with the specification's
/// defaults for what a tool leaves out (`readOnlyHint` false, `destructiveHint` true,
/// `idempotentHint` false, `openWorldHint` true): read-only → `read-only`; destructive →
/// `destructive` (so a tool with no annotations at all is `destructive`); neither, in a
/// closed world → `workspace-write`; neither, in an open world → `external`. Without either
/// setting every tool is `external`. Idempotence is claimed only by a trusted hint (or a
/// read-only class).
pub fn classify(spec: &ServerSpec, ann: Option<&rmcp::model::ToolAnnotations>) -> (Effect, bool) {
    if let Some(effect) = spec.effect {
        return (effect, effect == Effect::ReadOnly);
    }
    if !spec.trust_annotations {
        return (Effect::External, false);
    }
    // A tool without annotations has the specification's defaults: not read-only,
    // destructive, not idempotent, open world.
    let none = rmcp::model::ToolAnnotations::default();
    let a = ann.unwrap_or(&none);
    let idempotent = a.idempotent_hint.unwrap_or(false);
    if a.read_only_hint == Some(true) {
        (Effect::ReadOnly, true)
    } else if a.destructive_hint.unwrap_or(true) {
        (Effect::Destructive, idempotent)
    } else if a.open_world_hint == Some(false) {
        (Effect::WorkspaceWrite, idempotent)
    } else {
        (Effect::External, idempotent)
    }
}

/// The MCP annotations of a keel tool, from its effect class: read-only tools are read-only
/// (and idempotent); destructive tools are destructive; only `external` tools reach an open
/// world (a sandboxed component reaches only its grants).
pub fn annotations(effect: Effect, idempotent: bool) -> rmcp::model::ToolAnnotations {
    rmcp::model::ToolAnnotations::new()
        .read_only(effect == Effect::ReadOnly)
        .destructive(effect == Effect::Destructive)
        .idempotent(idempotent || effect == Effect::ReadOnly)
        .open_world(effect == Effect::External)
}

/// Builds the catalog entries of a server's `tools/list`.
pub fn offer(spec: &ServerSpec, info: ServerInfo, tools: &[rmcp::model::Tool]) -> Offer {
    let mut out = Offer { info, tools: Vec::new(), skipped: Vec::new() };
    let identity = serde_json::json!({"server": spec.name, "at": spec.transport.identity(), "name": out.info.name});
    let mut tools: Vec<&rmcp::model::Tool> = tools.iter().collect();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    use crate::tools::install::{MAX_DESCRIPTION, MAX_SCHEMA_BYTES, MAX_TOOLS_PER_COMPONENT};
    for t in tools {
        let remote = t.name.to_string();
        if out.tools.len() == MAX_TOOLS_PER_COMPONENT {
            out.skipped
                .push((remote, format!("a server offers at most {MAX_TOOLS_PER_COMPONENT} tools")));
            continue;
        }
        let input = serde_json::Value::Object((*t.input_schema).clone());
        if let Err(e) = jsonschema::validator_for(&input) {
            out.skipped.push((remote, format!("its input schema cannot be used: {e}")));
            continue;
        }
        let output = t.output_schema.as_ref().map(|o| serde_json::Value::Object((**o).clone()));
        // The limits of a component's tool descriptions hold for a server's too: every
        // request that loads the tool carries them.
        let size = |v: &serde_json::Value| v.to_string().len();
        let long = t.description.as_deref().unwrap_or_default().len() > MAX_DESCRIPTION;
        if long
            || size(&input) > MAX_SCHEMA_BYTES
            || output.as_ref().is_some_and(|o| size(o) > MAX_SCHEMA_BYTES)
        {
            out.skipped.push((
                remote,
                format!(
                    "its description is over {MAX_DESCRIPTION} bytes or a schema over {MAX_SCHEMA_BYTES} bytes"
                ),
            ));
            continue;
        }
        let ann = t.annotations.as_ref().and_then(|a| serde_json::to_value(a).ok());
        let description = t.description.as_deref().unwrap_or_default().to_string();
        let digest = crate::digest::sha256_hex(
            serde_json::json!([identity, remote, description, input, output, ann])
                .to_string()
                .as_bytes(),
        );
        let taken: Vec<String> = out.tools.iter().map(|o| o.pinned.name.clone()).collect();
        let name = catalog_name(&spec.name, &remote, &taken);
        let (effect, idempotent) = classify(spec, t.annotations.as_ref());
        let record = crate::tools::ToolRecord {
            name: name.clone(),
            component: spec.name.clone(),
            description,
            input_schema: input,
            output_schema: output,
            effect,
            idempotent,
            spec_digest: digest.clone(),
        };
        out.tools.push(Offered {
            pinned: PinnedTool { name, remote, annotations: ann, digest },
            record,
        });
    }
    out
}

/// What changed between the accepted tools of a server and what it offers now.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ToolDiff {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Tools whose description, schemas or annotations changed, with a line-by-line view.
    pub changed: Vec<ChangedTool>,
}

/// One changed tool: what differs, old and new.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChangedTool {
    pub name: String,
    /// `(field, old, new)` for each field that differs.
    pub fields: Vec<(String, String, String)>,
}

impl ToolDiff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// Compares the accepted tools (`old`, with their pins) with an offer.
pub fn diff(old: &[(crate::tools::ToolRecord, PinnedTool)], new: &[Offered]) -> ToolDiff {
    let mut d = ToolDiff::default();
    for n in new {
        match old.iter().find(|(r, _)| r.name == n.record.name) {
            None => d.added.push(n.record.name.clone()),
            Some((r, p)) if p.digest != n.pinned.digest => {
                let mut fields = Vec::new();
                let mut field = |what: &str, a: String, b: String| {
                    if a != b {
                        fields.push((what.to_string(), a, b));
                    }
                };
                field("description", r.description.clone(), n.record.description.clone());
                field("input_schema", pretty(&r.input_schema), pretty(&n.record.input_schema));
                field(
                    "output_schema",
                    r.output_schema.as_ref().map(pretty).unwrap_or_default(),
                    n.record.output_schema.as_ref().map(pretty).unwrap_or_default(),
                );
                field(
                    "annotations",
                    p.annotations.as_ref().map(pretty).unwrap_or_default(),
                    n.pinned.annotations.as_ref().map(pretty).unwrap_or_default(),
                );
                if fields.is_empty() {
                    fields.push((
                        "server".into(),
                        "(as accepted)".into(),
                        "(its identity changed)".into(),
                    ));
                }
                d.changed.push(ChangedTool { name: n.record.name.clone(), fields });
            }
            Some(_) => {}
        }
    }
    for (r, _) in old {
        if !new.iter().any(|n| n.record.name == r.name) {
            d.removed.push(r.name.clone());
        }
    }
    d
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

/// Turns a `tools/call` result into keel's JSON output: the structured content when the tool
/// gave one; else the text when every block is text; else the content blocks as they came.
pub fn output_of(result: &rmcp::model::CallToolResult) -> serde_json::Value {
    if let Some(s) = &result.structured_content {
        return s.clone();
    }
    let texts: Option<Vec<&str>> =
        result.content.iter().map(|c| c.as_text().map(|t| t.text.as_str())).collect();
    match texts {
        Some(t) => serde_json::json!({"text": t.join("\n")}),
        None => serde_json::json!({
            "content": serde_json::to_value(&result.content).unwrap_or(serde_json::Value::Null)
        }),
    }
}

/// The text of a `tools/call` result that reports an error.
pub fn error_text(result: &rmcp::model::CallToolResult) -> String {
    let text: Vec<&str> =
        result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.as_str())).collect();
    match text.is_empty() {
        true => "the tool reported an error without a message".to_string(),
        false => text.join("\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_names_follow_keel_rules() {
        assert_eq!(catalog_name("every", "get-Sum", &[]), "every__get_sum");
        let taken = vec!["every__get_sum".to_string()];
        let second = catalog_name("every", "get_sum", &taken);
        assert!(
            second.starts_with("every__get_sum_") && second.len() == "every__get_sum_".len() + 8
        );
        let long = catalog_name("s", &"x".repeat(200), &[]);
        assert!(long.len() <= 64 && crate::tools::install::valid_tool_name(&long), "{long}");
        assert!(crate::tools::install::valid_tool_name(&catalog_name("s", "---", &[])));
        for bad in ["", "A", "1a", "a__b", "a_", &"a".repeat(25)] {
            assert!(check_server_name(bad).is_err(), "{bad}");
        }
        check_server_name("files_2").unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn tools_past_the_component_limits_are_skipped() {
        let spec = ServerSpec {
            name: "s".into(),
            transport: Transport::Http { url: "http://x".into(), headers: BTreeMap::new() },
            effect: None,
            trust_annotations: false,
            load: McpLoad::OnDemand,
        };
        let schema = || {
            std::sync::Arc::new(serde_json::Map::from_iter([(
                "type".to_string(),
                serde_json::json!("object"),
            )]))
        };
        let mut tools = vec![
            rmcp::model::Tool::new("ok", "fine", schema()),
            rmcp::model::Tool::new("long", "x".repeat(5000), schema()),
        ];
        for i in 0..300 {
            tools.push(rmcp::model::Tool::new(format!("t{i:03}"), "many", schema()));
        }
        let o = offer(&spec, ServerInfo::default(), &tools);
        assert_eq!(o.tools.len(), 256);
        assert!(o.tools.iter().any(|t| t.record.name == "s__ok"));
        assert!(o.skipped.iter().any(|(n, why)| n == "long" && why.contains("description")));
        assert_eq!(o.skipped.len(), 302 - 256);
        // Every field of the pin moves its digest.
        let again = offer(&spec, ServerInfo::default(), &tools[..1]);
        let mut changed = tools[0].clone();
        changed.description = Some("fine, and more".into());
        let other = offer(&spec, ServerInfo::default(), &[changed]);
        assert_ne!(again.tools[0].pinned.digest, other.tools[0].pinned.digest);
        let d =
            diff(&[(again.tools[0].record.clone(), again.tools[0].pinned.clone())], &other.tools);
        assert_eq!(d.changed[0].fields[0].0, "description");
    }

    #[test]
    fn classes_come_from_the_admin_not_the_server() {
        let mut spec = ServerSpec {
            name: "s".into(),
            transport: Transport::Http { url: "http://x".into(), headers: BTreeMap::new() },
            effect: None,
            trust_annotations: false,
            load: McpLoad::OnDemand,
        };
        let ro = rmcp::model::ToolAnnotations::new().read_only(true);
        assert_eq!(classify(&spec, Some(&ro)), (Effect::External, false));
        assert_eq!(classify(&spec, None), (Effect::External, false));
        spec.trust_annotations = true;
        use rmcp::model::ToolAnnotations as A;
        // The whole table: each hint given or left to the specification's default.
        let table: &[(Option<A>, Effect, bool)] = &[
            (None, Effect::Destructive, false),
            (Some(A::new()), Effect::Destructive, false),
            (Some(A::new().read_only(true)), Effect::ReadOnly, true),
            (Some(A::new().read_only(true).destructive(true)), Effect::ReadOnly, true),
            (Some(A::new().read_only(false)), Effect::Destructive, false),
            (Some(A::new().destructive(true).idempotent(true)), Effect::Destructive, true),
            (Some(A::new().destructive(false)), Effect::External, false),
            (Some(A::new().destructive(false).open_world(true)), Effect::External, false),
            (Some(A::new().destructive(false).open_world(false)), Effect::WorkspaceWrite, false),
            (
                Some(A::new().destructive(false).open_world(false).idempotent(true)),
                Effect::WorkspaceWrite,
                true,
            ),
            (Some(A::new().open_world(false)), Effect::Destructive, false),
        ];
        for (ann, effect, idempotent) in table {
            assert_eq!(classify(&spec, ann.as_ref()), (*effect, *idempotent), "{ann:?}");
        }
        spec.effect = Some(Effect::Destructive);
        assert_eq!(classify(&spec, Some(&ro)), (Effect::Destructive, false));
    }
}
