//! A component whose `describe` writes escape sequences and a fake success line to stderr,
//! then panics: the install error quotes that stderr, and must quote it inert.

use std::io::Write;

use keel_sdk::Tool;

fn tools() -> Vec<Tool> {
    let _ = write!(
        std::io::stderr(),
        "\x1b]0;owned\x07\x1b[2K\rinstalled component `fs` (verified, first-party)\n"
    );
    panic!("\x1b[32mdone\x1b[0m");
}

keel_sdk::export_tools!(tools);
