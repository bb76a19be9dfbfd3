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

/// The name a component file installs as when none is given (`tool install FILE`, `tool
/// inspect --wasm`, `tool call --wasm` alike): the name the component carries, else the file
/// name's stem lowercased, with `_` as `-`, and a version suffix (`-1.1.0`, `-v2.0.0-rc.1`,
/// `@1.0.0`) left off.
pub fn component_name_for(carried: Option<&str>, stem: &str) -> String {
    if let Some(name) = carried.filter(|n| valid_component_name(n)) {
        return name.to_string();
    }
    let stem = stem.to_ascii_lowercase().replace('_', "-");
    let is_version = |rest: &str| {
        let rest = rest.strip_prefix('v').unwrap_or(rest);
        let core = rest.split(['-', '+']).next().unwrap_or("");
        core.starts_with(|c: char| c.is_ascii_digit())
            && core.chars().all(|c| c.is_ascii_digit() || c == '.')
    };
    let cut = stem
        .char_indices()
        .filter(|&(i, c)| i > 0 && (c == '-' || c == '@'))
        .find(|&(i, _)| is_version(&stem[i + 1..]))
        .map(|(i, _)| i);
    match cut {
        Some(i) => stem[..i].to_string(),
        None => stem,
    }
}

/// An install time as stored: seconds since the epoch, as text.
pub fn now() -> String {
    let secs =
        SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format!("{secs}")
}

/// The edit distance between `a` and `b`: insertions, deletions, substitutions and swaps of
/// two neighbouring characters (`audti` is one edit from `audit`), each edit counting one.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    // Three rows: two back (for a swap), the last, the current.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            row[j] = (last[j - 1] + cost).min(row[j - 1] + 1).min(last[j] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(before[j - 2] + 1);
            }
        }
        before = std::mem::replace(&mut last, row);
    }
    last[b.len()]
}

/// The names among `candidates` that `word` most likely meant: the closest by edit distance
/// (within a third of its length, at least one edit), else the first three that contain it — for
/// a "did you mean" in an error.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let candidates: Vec<&str> = candidates.into_iter().collect();
    let limit = (word.chars().count() / 3).max(1);
    let best = candidates
        .iter()
        .map(|c| (distance(word, c), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, c)| (*d, *c));
    if let Some((_, c)) = best {
        return vec![c];
    }
    if word.len() < 3 {
        return Vec::new();
    }
    // In the candidates' order: the caller lists the likelier kind first.
    let mut containing: Vec<&str> = candidates.into_iter().filter(|c| c.contains(word)).collect();
    containing.truncate(3);
    containing
}

/// ` (did you mean `a` or `b`?)`, or nothing when there is no suggestion.
pub fn did_you_mean(suggestions: &[&str]) -> String {
    match suggestions {
        [] => String::new(),
        [one] => format!(" (did you mean `{one}`?)"),
        more => {
            let quoted: Vec<String> = more.iter().map(|s| format!("`{s}`")).collect();
            format!(" (did you mean {}?)", quoted.join(" or "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closest_name_is_suggested_and_a_far_one_is_not() {
        let names = ["fs_write_file", "fs_read_file", "workspace-write", "read-only"];
        assert_eq!(closest("fs_wrte_file", names), ["fs_write_file"]);
        assert_eq!(closest("read-onyl", names), ["read-only"]);
        assert_eq!(closest("audti", ["audit", "other"]), ["audit"]);
        assert_eq!(distance("ab", "ba"), 1);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(closest("write", names), ["fs_write_file", "workspace-write"]);
        assert!(closest("zzz", names).is_empty());
        assert_eq!(did_you_mean(&["a", "b"]), " (did you mean `a` or `b`?)");
        assert_eq!(did_you_mean(&[]), "");
    }

    #[test]
    fn a_file_installs_as_the_name_it_carries_else_its_stem_without_a_version() {
        assert_eq!(component_name_for(Some("logq"), "whatever-9"), "logq");
        for (stem, name) in [
            ("logq-1.1.0", "logq"),
            ("logq", "logq"),
            ("Word_Stats", "word-stats"),
            ("logq-v2.0.0-rc.1", "logq"),
            ("logq@1.0.0", "logq"),
            ("tool-2fa-1.0.0", "tool-2fa"),
            ("tool-2fa", "tool-2fa"),
            ("base64", "base64"),
        ] {
            assert_eq!(component_name_for(None, stem), name, "{stem}");
            assert_eq!(component_name_for(Some("Not Valid"), stem), name, "{stem}");
        }
    }
}
