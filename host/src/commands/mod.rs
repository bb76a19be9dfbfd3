//! One module per command.

pub mod run;
pub mod session;
pub mod tool;

use std::path::PathBuf;

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
