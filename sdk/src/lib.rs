//! # keel-sdk: write keel tools in plain Rust
//!
//! A keel tool is a WebAssembly component that exports the `keel:tool/tools` interface of
//! keel's WIT contract (`wit/tool.wit`). This crate hides the component plumbing: a tool is a
//! plain Rust function from a `serde` input type to a `serde` output type, its JSON Schemas are
//! derived from those types with [`schemars`], and one macro, [`export_tools!`], exports the
//! component.
//!
//! ```no_run
//! use keel_sdk::{Effect, JsonSchema, Tool, ToolError};
//! use serde::{Deserialize, Serialize};
//!
//! /// Input of `greet`.
//! #[derive(Deserialize, JsonSchema)]
//! struct GreetInput {
//!     /// Who to greet.
//!     name: String,
//! }
//!
//! /// Output of `greet`.
//! #[derive(Serialize, JsonSchema)]
//! struct GreetOutput {
//!     greeting: String,
//! }
//!
//! fn greet(input: GreetInput) -> Result<GreetOutput, ToolError> {
//!     if input.name.is_empty() {
//!         return Err(ToolError::InvalidInput("`name` must not be empty".into()));
//!     }
//!     keel_sdk::log(keel_sdk::LogLevel::Info, "greeting someone");
//!     Ok(GreetOutput { greeting: format!("Hello, {}!", input.name) })
//! }
//!
//! fn tools() -> Vec<Tool> {
//!     vec![Tool::new("greet", "Greets someone by name.", Effect::ReadOnly, greet).idempotent()]
//! }
//!
//! keel_sdk::export_tools!(tools);
//! ```
//!
//! Build it as a `cdylib` for `wasm32-wasip2` (`cargo build --release --target
//! wasm32-wasip2`); the resulting `.wasm` file is a component that `keel tool install` accepts.
//!
//! Inside a tool, the standard library's file APIs work on the directories the admin granted
//! to the session (for example `std::fs::read_to_string("/data/orders.csv")`); everything else
//! (environment, arguments, sockets, other paths) is absent.
#![deny(missing_docs)]

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Derives the JSON Schema of a tool's input or output type from its fields and doc comments
/// (`serde` and `schemars` attributes apply). It needs no dependency besides `keel-sdk`; the
/// trait it implements is [`schemars::JsonSchema`].
pub use keel_sdk_macros::JsonSchema;
pub use schemars;
pub use serde_json;

/// Bindings generated from keel's WIT contract. Used by [`export_tools!`]; not part of the
/// stable API.
#[doc(hidden)]
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "keel:tool/tool",
        pub_export_macro: true,
        export_macro_name: "__export_keel_tool",
        default_bindings_module: "::keel_sdk::bindings",
    });
}

use bindings::keel::tool::host as wit_host;
use bindings::keel::tool::types as wit;

/// What a tool may do to the world. keel uses it to decide approvals, ordering and crash
/// recovery, so declare it honestly: a tool that writes files is not [`Effect::ReadOnly`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Reads only; changes nothing anywhere.
    ReadOnly,
    /// Creates or modifies files inside the granted workspace.
    WorkspaceWrite,
    /// Acts outside the workspace (sends a message, calls a service).
    External,
    /// Deletes or overwrites data in a way that cannot be undone.
    Destructive,
}

/// Why a tool call failed. The message should say what was wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolError {
    /// The input did not match what the tool expects.
    InvalidInput(String),
    /// A resource the input names does not exist.
    NotFound(String),
    /// Access was refused (outside the grants, or a read-only grant).
    Denied(String),
    /// The tool ran but could not do what was asked.
    Failed(String),
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidInput(m) => write!(f, "invalid input: {m}"),
            Self::NotFound(m) => write!(f, "not found: {m}"),
            Self::Denied(m) => write!(f, "denied: {m}"),
            Self::Failed(m) => write!(f, "failed: {m}"),
        }
    }
}

impl std::error::Error for ToolError {}

impl ToolError {
    /// Classifies an I/O error on `path`: missing files become [`ToolError::NotFound`],
    /// refused access (including paths outside every grant) [`ToolError::Denied`], the rest
    /// [`ToolError::Failed`].
    pub fn io(path: &str, err: &std::io::Error) -> Self {
        use std::io::ErrorKind;
        let text = err.to_string();
        match err.kind() {
            ErrorKind::NotFound if !text.contains("pre-opened") && inside_a_grant(path) => {
                Self::NotFound(format!("{path}: no such file or directory"))
            }
            ErrorKind::NotFound => {
                Self::Denied(format!("{path}: outside every directory granted to this session"))
            }
            ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => {
                Self::Denied(format!("{path}: access denied by the session's grants ({text})"))
            }
            _ if text.contains("pre-opened") || text.contains("capabilit") => {
                Self::Denied(format!("{path}: outside every directory granted to this session"))
            }
            _ => Self::Failed(format!("{path}: {text}")),
        }
    }
}

/// Whether the first component of `path` (e.g. `/data` of `/data/x.csv`) is reachable: in
/// the sandbox, only granted directories are.
fn inside_a_grant(path: &str) -> bool {
    let p = std::path::Path::new(path);
    match p.components().nth(1) {
        Some(first) if p.is_absolute() => std::path::Path::new("/").join(first).exists(),
        _ => !p.is_absolute(),
    }
}

type Handler = Box<dyn Fn(&str) -> Result<String, ToolError>>;

/// One tool: its description and the function that runs it.
pub struct Tool {
    name: &'static str,
    description: &'static str,
    effect: Effect,
    idempotent: bool,
    input_schema: fn() -> String,
    output_schema: fn() -> String,
    handler: Handler,
}

impl Tool {
    /// Declares a tool named `name` (lowercase letters, digits and `_`) that runs `run`.
    ///
    /// The input and output JSON Schemas are derived from `I` and `O`; doc comments on their
    /// fields become the schema's descriptions, which the model reads.
    pub fn new<I, O, F>(
        name: &'static str,
        description: &'static str,
        effect: Effect,
        run: F,
    ) -> Self
    where
        I: DeserializeOwned + schemars::JsonSchema,
        O: Serialize + schemars::JsonSchema,
        F: Fn(I) -> Result<O, ToolError> + 'static,
    {
        let handler = move |input: &str| -> Result<String, ToolError> {
            let input: I = serde_json::from_str(input)
                .map_err(|e| ToolError::InvalidInput(format!("{name}: {e}")))?;
            let output = run(input)?;
            serde_json::to_string(&output)
                .map_err(|e| ToolError::Failed(format!("{name}: cannot encode the output: {e}")))
        };
        Self {
            name,
            description,
            effect,
            idempotent: false,
            input_schema: schema_json::<I>,
            output_schema: schema_json::<O>,
            handler: Box::new(handler),
        }
    }

    /// Marks the tool idempotent: calling it twice with the same input has the same effect
    /// as calling it once. keel may re-run an idempotent call after a crash.
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }

    /// The tool's name.
    pub fn name(&self) -> &str {
        self.name
    }
}

fn schema_json<T: schemars::JsonSchema>() -> String {
    let schema = schemars::schema_for!(T);
    serde_json::to_string(&schema).unwrap_or_else(|_| String::from("{}"))
}

/// Severity of a log record sent to the host with [`log`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal progress.
    Info,
    /// Something unexpected that the tool handled.
    Warn,
    /// A failure.
    Error,
}

/// Sends a log record to the host, which keeps it with the call's result (bounded).
pub fn log(level: LogLevel, message: &str) {
    let level = match level {
        LogLevel::Trace => wit_host::LogLevel::Trace,
        LogLevel::Debug => wit_host::LogLevel::Debug,
        LogLevel::Info => wit_host::LogLevel::Info,
        LogLevel::Warn => wit_host::LogLevel::Warn,
        LogLevel::Error => wit_host::LogLevel::Error,
    };
    wit_host::log(level, message);
}

/// Reports progress of a long call: `done` units out of `total`, if known.
pub fn progress(done: u64, total: Option<u64>, message: &str) {
    wit_host::progress(done, total, message);
}

/// Implementation details of [`export_tools!`]. Not part of the stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::bindings::exports::keel::tool::tools::Guest;
    pub use crate::bindings::keel::tool::types::{ToolError, ToolSpec};

    use super::{Effect, Tool, wit};

    /// Describes every tool of the list.
    pub fn describe(tools: Vec<Tool>) -> Vec<ToolSpec> {
        tools
            .into_iter()
            .map(|t| ToolSpec {
                name: t.name.to_string(),
                description: t.description.to_string(),
                input_schema: (t.input_schema)(),
                output_schema: Some((t.output_schema)()),
                effect: match t.effect {
                    Effect::ReadOnly => wit::Effect::ReadOnly,
                    Effect::WorkspaceWrite => wit::Effect::WorkspaceWrite,
                    Effect::External => wit::Effect::External,
                    Effect::Destructive => wit::Effect::Destructive,
                },
                idempotent: t.idempotent,
            })
            .collect()
    }

    /// The bytes of `text` as an array of its length (for a custom section's contents).
    pub const fn bytes<const N: usize>(text: &str) -> [u8; N] {
        let b = text.as_bytes();
        let mut out = [0u8; N];
        let mut i = 0;
        while i < N {
            out[i] = b[i];
            i += 1;
        }
        out
    }

    /// Runs the tool called `name`.
    pub fn invoke(tools: Vec<Tool>, name: &str, input: &str) -> Result<String, ToolError> {
        let Some(tool) = tools.into_iter().find(|t| t.name == name) else {
            return Err(ToolError::UnknownTool(format!(
                "this component has no tool named `{name}`"
            )));
        };
        (tool.handler)(input).map_err(|e| match e {
            super::ToolError::InvalidInput(m) => ToolError::InvalidInput(m),
            super::ToolError::NotFound(m) => ToolError::NotFound(m),
            super::ToolError::Denied(m) => ToolError::Denied(m),
            super::ToolError::Failed(m) => ToolError::Failed(m),
        })
    }
}

/// Exports the tools returned by a function as a keel tool component.
///
/// `export_tools!(tools)` takes the path of a `fn() -> Vec<Tool>`; call it once, at the crate
/// root of a `cdylib` built for `wasm32-wasip2`. The component also carries the crate's name
/// (`_` read as `-`) and its package's version (custom sections `keel:component` and
/// `version`): keel installs it under that name, and `keel tool list` and `keel tool publish`
/// show and label that version.
#[macro_export]
macro_rules! export_tools {
    ($tools:path) => {
        #[doc(hidden)]
        #[cfg_attr(target_family = "wasm", unsafe(link_section = "version"))]
        #[used]
        static __KEEL_VERSION: [u8; ::core::env!("CARGO_PKG_VERSION").len()] =
            $crate::__private::bytes(::core::env!("CARGO_PKG_VERSION"));

        #[doc(hidden)]
        #[cfg_attr(target_family = "wasm", unsafe(link_section = "keel:component"))]
        #[used]
        static __KEEL_COMPONENT: [u8; ::core::env!("CARGO_CRATE_NAME").len()] =
            $crate::__private::bytes(::core::env!("CARGO_CRATE_NAME"));

        #[doc(hidden)]
        struct __KeelToolComponent;

        impl $crate::__private::Guest for __KeelToolComponent {
            fn describe() -> ::std::vec::Vec<$crate::__private::ToolSpec> {
                $crate::__private::describe($tools())
            }

            fn invoke(
                name: ::std::string::String,
                input: ::std::string::String,
            ) -> ::std::result::Result<::std::string::String, $crate::__private::ToolError> {
                $crate::__private::invoke($tools(), &name, &input)
            }
        }

        $crate::bindings::__export_keel_tool!(__KeelToolComponent with_types_in $crate::bindings);
    };
}
