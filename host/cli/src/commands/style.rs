//! How much progress a command prints, and in which colours: set once from the command line
//! (`-v`) and the terminal (`NO_COLOR`), read by whatever prints to stderr.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

static VERBOSE: AtomicBool = AtomicBool::new(false);
static COLOUR: AtomicBool = AtomicBool::new(false);

/// Whether colours suit stderr: a terminal, and `NO_COLOR` unset or empty
/// (<https://no-color.org>).
pub fn colour_for_stderr() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Sets this process's style: `verbose` progress (every event's line, not the compact
/// default) and `colour` on stderr.
pub fn init(verbose: bool, colour: bool) {
    VERBOSE.store(verbose, Ordering::Relaxed);
    COLOUR.store(colour, Ordering::Relaxed);
}

/// Whether `-v` asked for event-level progress.
pub fn verbose() -> bool {
    VERBOSE.load(Ordering::Relaxed)
}

/// What a piece of text says, which picks its colour.
#[derive(Clone, Copy)]
pub enum Tone {
    /// Done well: green.
    Good,
    /// Failed, refused, an error: red.
    Bad,
    /// Waits for someone, or a warning: yellow.
    Waiting,
    /// What to look at: bold.
    Strong,
}

/// `text` in `tone`'s colour when colours are on, else as it is.
pub fn paint(tone: Tone, text: &str) -> String {
    if !COLOUR.load(Ordering::Relaxed) {
        return text.to_string();
    }
    let code = match tone {
        Tone::Good => "32",
        Tone::Bad => "31",
        Tone::Waiting => "33",
        Tone::Strong => "1",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

/// A progress line with its mark coloured: `✓` green, `✗` and `error:` red, `⏸` and
/// `warning:` yellow, `goal:` bold.
/// The rest of the line is left as it is (the text was made inert before).
pub fn mark(line: &str) -> String {
    let body = line.trim_start();
    let indent = &line[..line.len() - body.len()];
    for (prefix, tone) in [
        ("✓", Tone::Good),
        ("✗", Tone::Bad),
        ("⏸", Tone::Waiting),
        ("warning:", Tone::Waiting),
        ("error:", Tone::Bad),
        ("goal:", Tone::Strong),
    ] {
        if let Some(rest) = body.strip_prefix(prefix) {
            return format!("{indent}{}{rest}", paint(tone, prefix));
        }
    }
    line.to_string()
}
