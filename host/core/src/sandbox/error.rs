//! Typed errors of the sandbox: why a component cannot be loaded, and why a call failed.

use std::time::Duration;

use crate::failure::FailureKind;

/// Why a component cannot be installed or loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("not a WebAssembly file: {reason}")]
    NotWasm { reason: String },
    #[error(
        "this is a core WebAssembly module, not a component: keel tools are components. \
         Build the tool for the `wasm32-wasip2` target (or wrap the module with \
         `wasm-tools component new`)"
    )]
    CoreModule,
    #[error("the component is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    #[error("compiling the component took longer than the limit of {limit:?}; it was abandoned")]
    CompileTimeout { limit: Duration },
    #[error("the component is not valid WebAssembly: {source:#}")]
    Compile {
        #[source]
        source: wasmtime::Error,
    },
    #[error(
        "the component does not target the keel tool world (`keel:tool/tool@0.1.0`): {reason}. \
         Build it with keel-sdk, or against wit/tool.wit"
    )]
    WrongWorld { reason: String },
    #[error("the component imports interfaces that are not granted to tools: {}",
        .imports.iter().map(|(i, why)| format!("`{i}` ({why})")).collect::<Vec<_>>().join(", "))]
    UngrantedImports { imports: Vec<(String, &'static str)> },
    #[error("the component cannot be linked against keel's host: {}",
        if .missing.is_empty() { format!("{:#}", .source) }
        else { format!("these imports are missing or have another type: {}", .missing.join("; ")) })]
    Link {
        #[source]
        source: wasmtime::Error,
        /// Every import the host could not satisfy (`` `interface`: `function` (why) ``).
        missing: Vec<String>,
    },
    #[error(
        "component file {path} does not match its pinned digest (expected sha256 {expected}, \
         found {found}); reinstall the tool from a trusted file"
    )]
    DigestMismatch { path: String, expected: String, found: String },
    #[error("artifact cache: {context}: {source}")]
    Cache {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot set up the sandbox engine: {source:#}")]
    Engine {
        #[source]
        source: wasmtime::Error,
    },
}

/// The kind of typed error a tool returned (the WIT `tool-error` variant).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorKind {
    InvalidInput,
    UnknownTool,
    NotFound,
    Denied,
    Failed,
}

/// Why one call did not produce an output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The tool ran and returned a typed error.
    #[error("{message}")]
    Tool { kind: ToolErrorKind, message: String },
    #[error("the call ran past its deadline of {limit:?} and was stopped")]
    Timeout { limit: Duration },
    #[error("the call used all of its {limit} units of fuel and was stopped")]
    FuelExhausted { limit: u64 },
    #[error("the call exceeded its memory limit: {detail}")]
    MemoryLimit { detail: String },
    #[error("the tool overflowed its call stack (unbounded recursion?)")]
    StackOverflow,
    /// The output (or an error message, or any string the guest returned) was over the cap.
    /// `bytes` is its size when the host learned it without copying it.
    #[error(
        "the tool's output is {}, over the limit of {limit} bytes; it was discarded",
        match .bytes { Some(b) => format!("{b} bytes"), None => format!("more than {limit} bytes") }
    )]
    OutputTooLarge { bytes: Option<u64>, limit: u64 },
    #[error("the tool returned output that is not valid JSON: {reason}")]
    InvalidOutput { reason: String },
    #[error("the call was cancelled")]
    Cancelled,
    /// The guest trapped (a panic, an `unreachable`, an out-of-bounds access …).
    #[error("the tool crashed: {detail}")]
    Crashed { detail: String },
    /// The host could not set the call up (for example a grant's directory vanished).
    #[error("the call could not be set up: {detail}")]
    Setup { detail: String },
}

impl CallError {
    /// The error's kind, as a call's result carries it.
    pub fn failure(&self) -> FailureKind {
        match self {
            Self::Tool { kind, .. } => match kind {
                ToolErrorKind::InvalidInput => FailureKind::InvalidInput,
                ToolErrorKind::UnknownTool => FailureKind::UnknownTool,
                ToolErrorKind::NotFound => FailureKind::NotFound,
                ToolErrorKind::Denied => FailureKind::Denied,
                ToolErrorKind::Failed => FailureKind::Failed,
            },
            Self::Timeout { .. } => FailureKind::Timeout,
            Self::FuelExhausted { .. } => FailureKind::FuelExhausted,
            Self::MemoryLimit { .. } => FailureKind::MemoryLimit,
            Self::StackOverflow => FailureKind::StackOverflow,
            Self::OutputTooLarge { .. } => FailureKind::OutputTooLarge,
            Self::InvalidOutput { .. } => FailureKind::InvalidOutput,
            Self::Cancelled => FailureKind::Cancelled,
            Self::Crashed { .. } => FailureKind::Crashed,
            Self::Setup { .. } => FailureKind::Setup,
        }
    }

    /// A stable, machine-readable name of the error's kind.
    pub fn kind(&self) -> &'static str {
        self.failure().as_str()
    }

    /// True when running the same call again could succeed without changing anything
    /// (the failure came from the environment, not from the tool or its input).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Timeout { .. } | Self::Cancelled | Self::Setup { .. } => true,
            Self::Tool { .. }
            | Self::FuelExhausted { .. }
            | Self::MemoryLimit { .. }
            | Self::StackOverflow
            | Self::OutputTooLarge { .. }
            | Self::InvalidOutput { .. }
            | Self::Crashed { .. } => false,
        }
    }
}
