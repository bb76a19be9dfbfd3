//! The `keel:tool/host` interface: structured logs and progress from a running tool.
//!
//! Follows the Ctx + View + `add_to_linker` shape: [`HostApiCtx`] is the per-call state owned by
//! the store, [`HostApi`] borrows it and implements the generated `Host` trait, and
//! [`add_to_linker`] wires it into a linker. Everything a guest sends is bounded: at most
//! [`MAX_LOG_RECORDS`] records of at most [`MAX_LOG_MESSAGE`] bytes each are kept.

use wasmtime::component::{HasData, Linker};

/// Generated bindings for `wit/` (the control world: the tool world plus `keel:control/plan`);
/// the only place they are generated in the host.
pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "keel:tool/control-tool",
    });
}

pub use bindings::keel::tool::host::LogLevel;
pub use bindings::keel::tool::types::{Effect as WitEffect, ToolError as WitToolError, ToolSpec};

/// Log records kept per call; later ones are counted, not kept.
pub const MAX_LOG_RECORDS: usize = 1000;
/// Bytes kept of one log message.
pub const MAX_LOG_MESSAGE: usize = 4096;

/// One log record a tool sent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LogRecord {
    pub level: &'static str,
    pub message: String,
}

/// The latest progress a tool reported.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Progress {
    pub done: u64,
    pub total: Option<u64>,
    pub message: String,
}

/// Per-call state of the host interface.
#[derive(Debug, Default)]
pub struct HostApiCtx {
    pub logs: Vec<LogRecord>,
    pub dropped_logs: u64,
    pub progress: Option<Progress>,
}

/// A borrowed view of [`HostApiCtx`] that implements the generated `Host` traits.
pub struct HostApi<'a> {
    ctx: &'a mut HostApiCtx,
}

impl<'a> HostApi<'a> {
    pub fn new(ctx: &'a mut HostApiCtx) -> Self {
        Self { ctx }
    }
}

fn bounded(mut text: String) -> String {
    if text.len() > MAX_LOG_MESSAGE {
        let mut cut = MAX_LOG_MESSAGE;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

impl bindings::keel::tool::host::Host for HostApi<'_> {
    fn log(&mut self, level: LogLevel, message: String) {
        if self.ctx.logs.len() >= MAX_LOG_RECORDS {
            self.ctx.dropped_logs += 1;
            return;
        }
        let level = match level {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        };
        self.ctx.logs.push(LogRecord { level, message: bounded(message) });
    }

    fn progress(&mut self, done: u64, total: Option<u64>, message: String) {
        self.ctx.progress = Some(Progress { done, total, message: bounded(message) });
    }
}

impl bindings::keel::tool::types::Host for HostApi<'_> {}

struct HasHostApi;

impl HasData for HasHostApi {
    type Data<'a> = HostApi<'a>;
}

/// Adds `keel:tool/host` (and the function-less `keel:tool/types`) to `linker`.
pub fn add_to_linker<T: 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> HostApi<'_>,
) -> wasmtime::Result<()> {
    bindings::keel::tool::host::add_to_linker::<T, HasHostApi>(linker, get)?;
    bindings::keel::tool::types::add_to_linker::<T, HasHostApi>(linker, get)?;
    Ok(())
}
