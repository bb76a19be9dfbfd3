//! Why a tool operation could not be carried out, with a stable kind per case.

use crate::failure::FailureKind;
use crate::sandbox::{CallError, GrantError, LoadError};
use crate::store::StoreError;

use super::LeaseBusy;

/// Why a tool operation could not be carried out (before or around the sandbox run; failures
/// inside the run are [`CallError`]s in the [`CallOutcome`](super::CallOutcome)).
#[derive(Debug, thiserror::Error)]
pub enum ToolServiceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Grant(#[from] GrantError),
    #[error(transparent)]
    Busy(#[from] LeaseBusy),
    #[error(transparent)]
    NetGrant(#[from] crate::sandbox::net::NetGrantError),
    #[error(transparent)]
    Secret(#[from] crate::secrets::SecretError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "`{name}` is not a valid component name: use lowercase letters, digits, `-` and `_`, \
         starting with a letter (pass --name NAME)"
    )]
    InvalidComponentName { name: String },
    #[error("no tool or component named `{name}` is installed; installed tools: {available}")]
    NotInstalled { name: String, available: String },
    #[error("the component has no tool `{tool}`; its tools: {tools}")]
    NotInComponent { tool: String, tools: String },
    #[error("`{name}` is a first-party component and cannot be removed")]
    Builtin { name: String },
    #[error("`{name}` is provided by keel itself (`{provider}`), not by an installed component")]
    HostTool { name: String, provider: String },
    #[error(
        "`{name}` is the name of a first-party component; another component cannot take or \
         replace it (install it under another name with --name NAME)"
    )]
    Reserved { name: String },
    #[error(
        "`{name}` (the name this component file goes by) is the name of a first-party \
         component; keel does not run another component under it: give it another name (its \
         `keel:component` section, or its file name)"
    )]
    ReservedFile { name: String },
    #[error(
        "a component named `{name}` is already installed (sha256:{digest}); replacing it needs \
         `keel tool install --upgrade`, which shows what changes"
    )]
    AlreadyInstalled { name: String, digest: String },
    #[error("the component's `describe` call failed: {error}")]
    Describe { error: CallError },
    #[error("the component's tool descriptions are not acceptable:\n  - {}", .problems.join("\n  - "))]
    InvalidSpecs { problems: Vec<String> },
    #[error("tool names already belong to other components: {}; remove those first or rename the tools",
        .clashes.iter().map(|(t, c)| format!("`{t}` (component `{c}`)")).collect::<Vec<_>>().join(", "))]
    NameClash { clashes: Vec<(String, String)> },
    #[error("input for `{tool}` is rejected: {}", .problems.join("; "))]
    InvalidInput { tool: String, problems: Vec<String> },
    #[error("the tool `{name}` is not loaded in this session; loaded tools: {loaded}")]
    NotLoaded { name: String, loaded: String },
    #[error("{reason}")]
    PolicyDenied { reason: String },
    #[error("{reason}; the call needs an approval")]
    NeedsApproval { reason: String },
    #[error(
        "approval `{unit}` was given for another tool, component or input than this call's; \
         the call needs its own approval"
    )]
    ApprovalNotBound { unit: String },
    #[error("{what} {asked} exceeds the host's ceiling of {ceiling}")]
    OverCeiling { what: &'static str, asked: u64, ceiling: u64 },
    #[error(
        "`{name}` is an MCP server (added with `keel mcp add`), not a component: \
         `keel mcp remove {name}` removes it, and a component needs another name"
    )]
    McpServer { name: String },
    #[error(transparent)]
    Mcp(#[from] crate::tools::mcp::McpError),
    /// A grant's directory is not the one it was given for any more.
    #[error(transparent)]
    GrantUnusable(#[from] crate::sandbox::GrantUnusable),
    /// A grant would let a tool reach keel's own home.
    #[error("grant `{grant}`: {reason}")]
    HomeGrant { grant: String, reason: String },
    /// An upgrade that widens what the component can do, without the admin's word.
    #[error(
        "upgrading `{name}` widens what it can do: {}; nothing was installed. Accept it with --accept-wider after reading it",
        changes.join("; ")
    )]
    Wider { name: String, changes: Vec<String> },
    /// A registry artifact older than the one installed, without the admin's word.
    #[error(
        "{reference} is older than the installed `{name}` ({why}): a tag moved back is a downgrade; nothing was fetched or installed. Install it anyway with --allow-downgrade"
    )]
    Downgrade { name: String, reference: String, why: String },
    /// A registry component's signature does not let it in; refused before it is compiled.
    #[error(
        "refused before compiling: {reason} (trust the publisher with `keel trust add NAME KEY \
         --packages GLOB`, or install it unsigned on purpose with --allow-unsigned)"
    )]
    Unverified { package: String, reason: String },
}

impl ToolServiceError {
    /// The error's kind, as a call's result carries it.
    pub fn failure(&self) -> FailureKind {
        match self {
            Self::Store(_) => FailureKind::Store,
            Self::Load(_) => FailureKind::Load,
            Self::Config(_) => FailureKind::Config,
            Self::Grant(_) => FailureKind::Grant,
            Self::Busy(_) => FailureKind::Busy,
            Self::NetGrant(_) => FailureKind::Grant,
            Self::Secret(_) => FailureKind::Secrets,
            Self::Io { .. } => FailureKind::Io,
            Self::InvalidComponentName { .. } => FailureKind::InvalidName,
            Self::NotInstalled { .. } | Self::NotInComponent { .. } => FailureKind::NotInstalled,
            Self::Builtin { .. } => FailureKind::Builtin,
            Self::HostTool { .. } => FailureKind::HostTool,
            Self::Reserved { .. } | Self::ReservedFile { .. } => FailureKind::ReservedName,
            Self::AlreadyInstalled { .. } => FailureKind::AlreadyInstalled,
            Self::Describe { .. } => FailureKind::DescribeFailed,
            Self::InvalidSpecs { .. } => FailureKind::InvalidSpecs,
            Self::NameClash { .. } => FailureKind::NameClash,
            Self::InvalidInput { .. } => FailureKind::InvalidInput,
            Self::OverCeiling { .. } => FailureKind::OverCeiling,
            Self::NotLoaded { .. } => FailureKind::UnknownTool,
            Self::PolicyDenied { .. } => FailureKind::PolicyDenied,
            Self::NeedsApproval { .. } => FailureKind::NeedsApproval,
            Self::ApprovalNotBound { .. } => FailureKind::ApprovalNotBound,
            Self::McpServer { .. } => FailureKind::McpServer,
            Self::Mcp(e) => e.failure(),
            // The grant names its own kind (a leaf cannot name `FailureKind`); every name it
            // gives is one of them.
            Self::GrantUnusable(e) => e.kind().parse().unwrap_or(FailureKind::Grant),
            Self::HomeGrant { .. } => FailureKind::Grant,
            Self::Unverified { .. } => FailureKind::Unverified,
            Self::Wider { .. } => FailureKind::Wider,
            Self::Downgrade { .. } => FailureKind::Downgrade,
        }
    }

    /// A stable, machine-readable name of the error's kind.
    pub fn kind(&self) -> &'static str {
        self.failure().as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::{GrantMoved, GrantUnusable};

    #[test]
    fn every_kind_a_grant_names_is_a_failure_kind() {
        let grant = String::from("/x=/x:ro");
        for e in [
            GrantUnusable::Moved(GrantMoved { grant: grant.clone(), why: "gone".into() }),
            GrantUnusable::Pseudo { grant: grant.clone(), fs: "proc" },
            GrantUnusable::Unopened {
                grant: grant.clone(),
                error: "EMFILE".into(),
                exhausted: true,
            },
            GrantUnusable::Unopened { grant, error: "EACCES".into(), exhausted: false },
        ] {
            assert_eq!(e.kind().parse::<FailureKind>().ok().map(|k| k.as_str()), Some(e.kind()));
            assert_eq!(ToolServiceError::from(e.clone()).kind(), e.kind());
        }
    }
}
