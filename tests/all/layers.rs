//! The layers of keel's crates. The crates themselves are layered by Cargo: the core (`keel`,
//! `host/core`) is below the server library (`keel-server`, `host/server`), which is below the
//! `keel` binary (`host/cli`), and a dependency cycle between crates does not compile. Inside
//! a crate, every top-level module has a place in its list of layers, and a module may use
//! (`crate::…`, outside its tests and comments) only modules of a layer below its own — never
//! one above, never one beside it — so the modules form no cycle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The core's top-level modules, bottom first.
const CORE: &[&[&str]] = &[
    // The TLS provider every client installs (HTTP, OCI, PostgreSQL): imports nothing.
    &["tls"],
    // The database interface (values, statements, rows; SQLite and PostgreSQL drivers, the
    // latter over TLS): the one module the leaves' stored types implement conversions for.
    &["sql"],
    // Leaves: no import of another module of the library but `tls` and `sql`.
    &[
        "builtin", "caller", "cancel", "crash", "digest", "failure", "grant", "home", "ids",
        "metrics", "names", "plan", "policy", "signing", "stored", "units",
    ],
    &["oci", "live"],
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
    // What a pending approval would change on disk (the harness keeps each unit's once).
    &["change"],
    &["harness"],
    &["api"],
];

/// The server library's modules, bottom first: the two front-ends share the listener and
/// nothing else.
const SERVER: &[&[&str]] = &[&["listen", "telemetry"], &["http", "mcp"]];

fn src(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../host").join(krate).join("src")
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

/// Imports that break the layers: (from, to) → the files that make them.
type Breaches = BTreeMap<(String, String), BTreeSet<String>>;

/// The imports of `krate`'s modules that point up or sideways, and the modules with no place.
fn misplaced(krate: &str, layers: &[&[&str]]) -> (Breaches, BTreeSet<String>) {
    let place: BTreeMap<&str, usize> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, layer)| layer.iter().map(move |m| (*m, i)))
        .collect();
    let root = src(krate);
    let mut all = Vec::new();
    files(&root, &mut all);
    let mut upward = Breaches::new();
    let mut unplaced = BTreeSet::new();
    for path in &all {
        let rel = path.strip_prefix(&root).unwrap().to_string_lossy().to_string();
        let top = rel.split('/').next().unwrap().trim_end_matches(".rs").to_string();
        if top == "lib" {
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
    (upward, unplaced)
}

#[test]
fn no_module_imports_one_above_or_beside_it() {
    for (krate, layers) in [("core", CORE), ("server", SERVER)] {
        let (upward, unplaced) = misplaced(krate, layers);
        assert!(unplaced.is_empty(), "{krate}: modules with no place in its layers: {unplaced:?}");
        assert!(upward.is_empty(), "{krate}: imports that point up or sideways: {upward:#?}");
    }
}

/// The approval gate's token is made only where SessionEngine consumes an approval: its
/// constructor is visible to the whole core, so this is what keeps the gate closed.
#[test]
fn only_the_session_makes_a_consumed_approval() {
    let root = src("core");
    let mut all = Vec::new();
    files(&root, &mut all);
    let makers: Vec<String> = all
        .iter()
        .filter(|p| code(&std::fs::read_to_string(p).unwrap()).contains("ConsumedApproval::new("))
        .map(|p| p.strip_prefix(&root).unwrap().to_string_lossy().to_string())
        .collect();
    assert_eq!(makers, ["session/steps.rs"]);
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
