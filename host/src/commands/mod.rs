//! One module per command.

pub mod approval;
pub mod run;
pub mod session;
pub mod tool;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use keel::sandbox::Budget;

use keel::home::Home;
use keel::sandbox::SandboxLimits;
use keel::tools::{ToolService, ToolServiceError};

/// The tool ran and returned an error (or was stopped by its budget).
pub const EXIT_TOOL_ERROR: u8 = 1;
/// The request was refused before anything ran (bad input, unknown tool, bad grant …).
pub const EXIT_REFUSED: u8 = 2;
/// keel itself could not start (home, database, engine).
pub const EXIT_SETUP: u8 = 3;

/// Opens the ToolService of `home`, with first-party tool installs reported on stderr.
pub async fn open_tools(home: PathBuf) -> Result<ToolService, String> {
    let home =
        Home::at(&home).map_err(|e| format!("cannot use keel home {}: {e}", home.display()))?;
    let progress = |msg: &str| eprintln!("keel: {msg}");
    ToolService::open(home, SandboxLimits::default(), &progress).await.map_err(|e| e.to_string())
}

/// Prints an error (as JSON with `--json`) and returns the exit code.
pub fn report_error(json: bool, err: &ToolServiceError) -> std::process::ExitCode {
    if json {
        let v = serde_json::json!({ "ok": false, "error": { "kind": err.kind(), "message": err.to_string() } });
        println!("{v}");
    } else {
        eprintln!("error: {err}");
    }
    std::process::ExitCode::from(EXIT_REFUSED)
}

/// Renders control characters (ANSI escapes included) inert for a terminal.
pub fn inert(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c if c.is_control() => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    out
}

/// The per-call budget flags shared by `keel tool call` and `keel run`.
#[derive(Args)]
pub struct BudgetArgs {
    /// Fuel per tool call (≈ WebAssembly instructions). Default 20000000000.
    #[arg(long)]
    fuel: Option<u64>,
    /// Wall-clock deadline per tool call, e.g. 500ms, 30s, 2m. Default 30s.
    #[arg(long, value_parser = keel::units::parse_duration)]
    timeout: Option<Duration>,
    /// Memory per tool call, e.g. 64MiB, 1G. Default 256MiB.
    #[arg(long, value_parser = keel::units::parse_size)]
    memory: Option<u64>,
}

impl BudgetArgs {
    /// The budget: the defaults with the given flags applied.
    pub fn budget(&self) -> Budget {
        let d = Budget::default();
        Budget {
            fuel: self.fuel.unwrap_or(d.fuel),
            timeout: self.timeout.unwrap_or(d.timeout),
            memory: self.memory.unwrap_or(d.memory),
            ..d
        }
    }
}
