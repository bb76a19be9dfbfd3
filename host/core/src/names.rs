//! Leaf: the naming rules of what is installed (components, tools, skills) and the install
//! time as it is stored — shared by the tool catalog, skills and MCP servers, so none of them
//! reaches into another for a rule.

use std::time::SystemTime;

/// Longest tool name.
pub const MAX_TOOL_NAME: usize = 64;

/// Checks a component name: lowercase letters, digits, `-` and `_`, starting with a letter.
pub fn valid_component_name(name: &str) -> bool {
    valid_name(name, &['_', '-'])
}

/// Checks a tool name: lowercase letters, digits and `_`, starting with a letter.
pub fn valid_tool_name(name: &str) -> bool {
    valid_name(name, &['_'])
}

fn valid_name(name: &str, extra: &[char]) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_TOOL_NAME
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || extra.contains(&c))
}

/// An install time as stored: seconds since the epoch, as text.
pub fn now() -> String {
    let secs =
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format!("{secs}")
}
