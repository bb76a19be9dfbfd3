//! Where a tool's implementation comes from, behind ToolService's resolve step.
//!
//! A tool is either a WebAssembly component installed in the home (pinned by the file's
//! sha256, run in the sandbox) or code in the host process: a control tool (plans, skills,
//! tool discovery, sub-sessions) or a tool of an MCP server. Every source has an
//! *implementation digest* — the component's sha256, or the digest a host tool gives for
//! its code and spec — which approvals bind and evidence records. Whatever the source, a call
//! passes the same checks first (loaded, input schema, policy, approval gate, budget ceiling);
//! only the run differs.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use crate::sandbox::{Budget, CallError, CallReport, CancelToken, Grant};

use super::ToolRecord;

crate::stored_enum! {
    /// The kind of a tool's source, as evidence and `keel tool list` name it.
    pub enum SourceKind: "tool source" {
        /// A WebAssembly component installed in the home.
        Component = "component",
        /// A control tool implemented by keel itself.
        Control = "control",
        /// A tool of an external MCP server.
        Mcp = "mcp",
    }
}

/// A future a host tool returns.
pub type HostFuture<'a> =
    Pin<Box<dyn Future<Output = Result<serde_json::Value, CallError>> + Send + 'a>>;

/// What a host tool's call may see: the session's grants, the call's budget and its cancel
/// token. The deadline and cancellation are enforced around the call; a tool that does long
/// work should also watch `cancel` itself.
#[derive(Debug, Clone, Copy)]
pub struct HostCall<'a> {
    pub grants: &'a [Grant],
    pub budget: &'a Budget,
    pub cancel: Option<&'a CancelToken>,
}

/// A tool implemented in the host process.
pub trait HostTool: Send + Sync {
    /// Control or MCP (never [`SourceKind::Component`]).
    fn kind(&self) -> SourceKind;
    /// The tool as the model sees it and as the policy classes it. Its `component` field
    /// names the provider (`keel:control`, `mcp:SERVER`).
    fn record(&self) -> &ToolRecord;
    /// sha256 (hex) of what runs: the implementation's version and the tool's spec. An
    /// approval binds it; a change of it needs a fresh approval.
    fn digest(&self) -> &str;
    /// Runs one call whose input has passed the schema, policy and approval checks.
    fn call<'a>(&'a self, input: serde_json::Value, ctx: HostCall<'a>) -> HostFuture<'a>;
}

/// A resolved tool's source.
#[derive(Clone)]
pub enum ToolSource {
    /// The installed component whose digest is [`Resolved::digest`](super::Resolved::digest).
    Component,
    /// Code in the host process.
    Host(Arc<dyn HostTool>),
}

impl fmt::Debug for ToolSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Component => f.write_str("Component"),
            Self::Host(h) => write!(f, "Host({}, {})", h.kind(), h.record().name),
        }
    }
}

/// Runs a host tool under the call's deadline and cancel token, with its output capped as a
/// component's is. The report has the shape a component call's has (no fuel, memory, stdio or
/// filesystem figures: host code has none of them).
pub(super) async fn run_host(
    tool: &dyn HostTool,
    input: serde_json::Value,
    ctx: HostCall<'_>,
) -> CallReport<serde_json::Value> {
    let started = Instant::now();
    let limit = ctx.budget.timeout;
    let cancelled = async {
        match ctx.cancel {
            Some(c) => c.cancelled().await,
            None => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        r = tokio::time::timeout(limit, tool.call(input, ctx)) => match r {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout { limit }),
        },
        () = cancelled => Err(CallError::Cancelled),
    };
    let result = result.and_then(|value| {
        let bytes = serde_json::to_vec(&value).map(|v| v.len() as u64).unwrap_or(u64::MAX);
        match bytes > ctx.budget.max_output {
            true => {
                Err(CallError::OutputTooLarge { bytes: Some(bytes), limit: ctx.budget.max_output })
            }
            false => Ok(value),
        }
    });
    CallReport {
        result,
        stdout: Default::default(),
        stderr: Default::default(),
        logs: Vec::new(),
        dropped_logs: 0,
        progress: None,
        fuel_used: 0,
        memory_peak: 0,
        duration: started.elapsed(),
        fs: Default::default(),
        control_requests: Vec::new(),
        net: Default::default(),
    }
}
