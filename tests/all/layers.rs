//! The library's layers: every top-level module of `host/src` has a place in [`LAYERS`], and a
//! module may use (`crate::…`, outside its tests and comments) only modules of a layer below
//! its own — never one above, never one beside it — so the modules form no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules, bottom first.
const LAYERS: &[&[&str]] = &[
    // Leaves: no import of another module of the library.
    &[
        "builtin", "caller", "cancel", "crash", "digest", "grant", "home", "ids", "listen",
        "names", "plan", "policy", "stored", "tls", "units",
    ],
    &["store"],
    &["config"],
    &["search"],
    &["memory"],
    &["model"],
    &["understand"],
    &["secrets"],
    &["control"],
    &["sandbox"],
    &["skills"],
    &["tools"],
    &["session"],
    &["agent"],
    &["brain"],
    &["access"],
    &["harness"],
    &["api"],
    &["mcp", "serve"],
    &["commands"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without its test module and its comments.
fn code(text: &str) -> String {
    let body = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => text,
    };
    body.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// The top-level modules a piece of code names through `crate::`: `crate::x` and each first
/// segment of a `crate::{x, y::z}` group (root macros, `crate::m!`, aside).
fn used(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut start) = (0usize, true);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if c.is_whitespace() => {}
                    _ if start => {
                        out.insert(ident(&group[i..]));
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            // `crate::name!` is a macro exported at the root (`stored_enum!`, from `stored`,
            // a leaf), not a module.
            if !rest[name.len()..].starts_with('!') {
                out.insert(name);
            }
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

#[test]
fn no_module_imports_one_above_or_beside_it() {
    let place: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, layer)| layer.iter().map(move |m| (*m, i)))
        .collect();
    let root = src();
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut upward: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    let mut unplaced = BTreeSet::new();
    for path in &all {
        let rel = path.strip_prefix(&root).unwrap().to_string_lossy().to_string();
        let top = rel.split('/').next().unwrap().trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(&from) = place.get(top.as_str()) else {
            unplaced.insert(top);
            continue;
        };
        for to in used(&code(&std::fs::read_to_string(path).unwrap())) {
            if to == top {
                continue;
            }
            match place.get(to.as_str()) {
                None => {
                    unplaced.insert(to);
                }
                Some(&level) if level >= from => {
                    upward.entry((top.clone(), to)).or_default().insert(rel.clone());
                }
                Some(_) => {}
            }
        }
    }
    assert!(unplaced.is_empty(), "modules with no place in LAYERS: {unplaced:?}");
    assert!(upward.is_empty(), "imports that point up or sideways: {upward:#?}");
}

#[test]
fn the_import_reader_sees_paths_and_groups() {
    let code = code(
        "use crate::a::B;\nuse crate::{c, d::E, f::{G, h::I}};\n// crate::comment\n\
         crate::m! { x }\nfn x() { crate::j::k(); }\n#[cfg(test)]\nmod tests { use crate::t; }",
    );
    let got: Vec<String> = used(&code).into_iter().collect();
    assert_eq!(got, ["a", "c", "d", "f", "j"]);
}
