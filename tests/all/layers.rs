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
        "metrics", "names", "plan", "policy", "shown", "signing", "stored", "units",
    ],
    // Project instructions, read through a grant.
    &["oci", "live", "project"],
    &["store"],
    &["config"],
    &["search"],
    &["memory"],
    &["model"],
    &["understand"],
    &["secrets"],
    // Signing keys sealed for another home or a CI job, and found in the environment.
    &["keys"],
    &["control"],
    &["sandbox"],
    &["skills"],
    &["tools"],
    // The session kernel, then the feature owners beside it (each imports the kernel, never
    // the other way: the kernel runs the reactions they register), `SessionMeta` composed
    // above them, request assembly on the meta, and the read views of it all.
    &["session"],
    &["preparation"],
    &["workgroup"],
    &["compaction"],
    &["meta"],
    &["assembly"],
    &["views"],
    &["agent"],
    &["brain"],
    &["access"],
    // What a pending approval would change on disk (the harness keeps each unit's once).
    &["change"],
    // Putting back what a session's calls changed on disk (the journal's change sets and
    // pre-images, through the grants).
    &["undo"],
    &["harness"],
    &["api"],
    // The front-ends' vocabulary: re-exports of the owners' types, beside the use cases.
    &["protocol"],
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

/// The module path (from the crate root) of a source file: `session/steps.rs` is
/// `[session, steps]`, `session/mod.rs` is `[session]`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut path: Vec<String> =
        rel.iter().map(|s| s.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
    if path.last().is_some_and(|l| l == "mod" || l == "lib") {
        path.pop();
    }
    path
}

/// Every module path a piece of code names from `module`: `crate::a::b`, `super::x`,
/// `super::super::y`, `self::z`, each `use` group expanded (`crate::a::{b, c::{d}}` names
/// `a::b`, `a::c::d`), as absolute paths from the crate root. A glob (`super::*`) names its
/// module only.
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let ident = |s: &str| -> String {
        s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
    };
    // The paths of a path body (`a::b::{c, d}`, `e`, `*`) after `base`.
    fn expand(body: &str, base: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = base;
        let mut rest = body.trim_start();
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let (mut depth, mut start) = (0usize, 0usize);
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => {
                            expand(&group[start..i], path.clone(), out);
                            return;
                        }
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            expand(&group[start..i], path.clone(), out);
                            start = i + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            let name: String =
                rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if name.is_empty() || name == "self" {
                break;
            }
            rest = rest[name.len()..].trim_start();
            path.push(name);
            match rest.strip_prefix("::") {
                Some(r) => rest = r.trim_start(),
                None => break,
            }
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
    let mut out = Vec::new();
    for (at, _) in code.match_indices("::") {
        // The first segment of a path: `crate`, `super` or `self`, not preceded by `::` or an
        // identifier's character.
        let head_start = code[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let head = &code[head_start..at];
        if head_start >= 2 && &code[head_start - 2..head_start] == "::" {
            continue;
        }
        let mut base: Vec<String> = match head {
            "crate" => Vec::new(),
            "self" => module.to_vec(),
            "super" => module[..module.len().saturating_sub(1)].to_vec(),
            _ => continue,
        };
        let mut rest = &code[at + 2..];
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        // `crate::m!` is a root macro, not a module.
        let name = ident(rest);
        if !name.is_empty() && rest[name.len()..].starts_with('!') {
            continue;
        }
        expand(rest, base, &mut out);
    }
    out
}

/// The identifiers of a piece of code.
fn words(code: &str) -> BTreeSet<String> {
    code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

/// The identifiers of a piece of code that head a path (`name::`), not after another `::`.
fn path_heads(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("::") {
        let start = code[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        if start >= 2 && &code[start - 2..start] == "::" {
            continue;
        }
        out.insert(code[start..at].to_string());
    }
    out
}

/// What a glob of `module` (whose source is `text`) brings in from below it: each child module
/// (its name) and each name the module's own `use` declarations take from a child (`use
/// child::X`, `pub use self::child::{X, y::Z}`), with the path it comes from.
fn glob_names(
    text: &str,
    module: &[String],
    exists: &dyn Fn(&[String]) -> bool,
) -> Vec<(String, Vec<String>)> {
    let code = code(text);
    let mut out = Vec::new();
    for statement in code.split(';') {
        let Some(at) = statement.find("use ") else { continue };
        let head = statement[..at].trim();
        if !(head.is_empty() || head.starts_with("pub") || head.ends_with(']')) {
            continue;
        }
        let mut body = statement[at + 4..].trim().to_string();
        // A path relative to the module (`use child::X`) is `self::child::X`.
        let first: String =
            body.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let mut child = module.to_vec();
        child.push(first);
        if exists(&child) {
            body = format!("self::{body}");
        }
        for path in named_paths(&format!("use {body};"), module) {
            if path.len() > module.len() && path.starts_with(module) {
                out.push((path.last().unwrap().clone(), path));
            }
        }
    }
    for line in code.lines() {
        let line = line.trim();
        let decl = line.strip_prefix("pub ").or_else(|| line.strip_prefix("pub(crate) "));
        if let Some(name) = decl.unwrap_or(line).strip_prefix("mod ") {
            let name = name.trim_end_matches(';').trim().to_string();
            let mut path = module.to_vec();
            path.push(name.clone());
            out.push((name, path));
        }
    }
    out
}

/// Imports between the files of one folder that form a cycle: for every folder of `krate`
/// below its top level, the children (files and sub-folders) and the edges "a file of child A
/// names child B", with the cycles among them.
fn folder_cycles(krate: &str) -> Vec<(String, Vec<String>)> {
    let root = src(krate);
    let mut all = Vec::new();
    files(&root, &mut all);
    let modules: BTreeMap<Vec<String>, String> = all
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(&root).unwrap();
            (module_of(rel), std::fs::read_to_string(p).unwrap())
        })
        .collect();
    let exists = |m: &[String]| modules.contains_key(m);
    // folder → child → the children it names.
    let mut edges: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (module, text) in &modules {
        let code = code(text);
        let mut named = named_paths(&code, module);
        // A glob of an enclosing module (`use super::*`) brings in what that module imports
        // from its children, and the children themselves: each of those names the file uses
        // is an edge to the child it comes from.
        let (words, heads) = (words(&code), path_heads(&code));
        for ancestor in named.clone() {
            if ancestor.len() >= module.len() || !module.starts_with(&ancestor) {
                continue;
            }
            if let Some(text) = modules.get(&ancestor) {
                for (name, path) in glob_names(text, &ancestor, &exists) {
                    // A child module counts where it heads a path (`child::x`): its name
                    // alone is as often a variable's.
                    let is_module = exists(&path);
                    if (is_module && heads.contains(&name)) || (!is_module && words.contains(&name))
                    {
                        named.push(path);
                    }
                }
            }
        }
        for named in named {
            // Every folder both paths pass through, at the first segment where they part.
            let common = module.iter().zip(&named).take_while(|(a, b)| a == b).count();
            if common == 0 || common >= module.len() || common >= named.len() {
                continue;
            }
            let folder = module[..common].to_vec();
            let (from, to) = (module[common].clone(), named[common].clone());
            let mut target = folder.clone();
            target.push(to.clone());
            if exists(&target) {
                edges.entry(folder).or_default().entry(from).or_default().insert(to);
            }
        }
    }
    let mut cycles = Vec::new();
    for (folder, graph) in &edges {
        // Strongly connected components with more than one child (Tarjan's, recursive: the
        // folders are small).
        struct Walk<'a> {
            graph: &'a BTreeMap<String, BTreeSet<String>>,
            index: BTreeMap<&'a str, usize>,
            low: BTreeMap<&'a str, usize>,
            stack: Vec<&'a str>,
            found: Vec<Vec<String>>,
        }
        fn visit<'a>(w: &mut Walk<'a>, v: &'a str) {
            let n = w.index.len();
            w.index.insert(v, n);
            w.low.insert(v, n);
            w.stack.push(v);
            for t in w.graph.get(v).into_iter().flatten() {
                let t = t.as_str();
                if !w.index.contains_key(t) {
                    visit(w, t);
                    let low = w.low[v].min(w.low[t]);
                    w.low.insert(v, low);
                } else if w.stack.contains(&t) {
                    let low = w.low[v].min(w.index[t]);
                    w.low.insert(v, low);
                }
            }
            if w.low[v] == w.index[v] {
                let mut component = Vec::new();
                while let Some(t) = w.stack.pop() {
                    component.push(t.to_string());
                    if t == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    w.found.push(component);
                }
            }
        }
        let mut walk = Walk {
            graph,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            found: Vec::new(),
        };
        for v in graph.keys() {
            if !walk.index.contains_key(v.as_str()) {
                visit(&mut walk, v);
            }
        }
        for component in walk.found {
            cycles.push((folder.join("/"), component));
        }
    }
    cycles
}

/// One level down: inside every folder (the session kernel's, each feature owner's, and every
/// other), the files import one another without a cycle.
#[test]
fn no_folder_has_an_import_cycle() {
    for krate in ["core", "server", "cli"] {
        let cycles = folder_cycles(krate);
        assert!(
            cycles.is_empty(),
            "{krate}: files of one folder that import each other: {cycles:#?}"
        );
    }
}

#[test]
fn the_path_reader_resolves_super_self_and_groups() {
    let module: Vec<String> = ["session", "steps"].iter().map(|s| s.to_string()).collect();
    let code = code(
        "use super::{facts::{self, X}, calls};\nuse crate::store::{a, b::C};\n\
         fn f() { super::super::tools::t(); self::inner::g(); }\nuse super::*;\n\
         crate::stored_enum! {}",
    );
    let got: Vec<String> = named_paths(&code, &module).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        got,
        [
            "session::facts",
            "session::facts::X",
            "session::calls",
            "store::a",
            "store::b::C",
            "tools::t",
            "session::steps::inner::g",
            "session"
        ]
    );
}

#[test]
fn a_glob_brings_in_what_its_module_takes_from_its_children() {
    let module: Vec<String> = ["compaction"].iter().map(|s| s.to_string()).collect();
    let text = "mod checkpoints;\npub(crate) mod freeze;\npub use checkpoints::{Checkpoint, \
                settle};\nuse self::freeze::Frozen;\nuse crate::store::Db;\n\
                fn f() { freeze::not_an_import(); }";
    let exists = |m: &[String]| m.len() == 2 && ["checkpoints", "freeze"].contains(&m[1].as_str());
    let got: Vec<String> = glob_names(text, &module, &exists)
        .into_iter()
        .map(|(name, path)| format!("{name}={}", path.join("::")))
        .collect();
    assert_eq!(
        got,
        [
            "Checkpoint=compaction::checkpoints::Checkpoint",
            "settle=compaction::checkpoints::settle",
            "Frozen=compaction::freeze::Frozen",
            "checkpoints=compaction::checkpoints",
            "freeze=compaction::freeze",
        ]
    );
}

/// `code` with the contents of its string literals (`"…"`, `r"…"`, `r#"…"#`) and character
/// literals left out: a path in a message or a help text is not a use.
fn without_strings(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(['"', '\'']) {
        out.push_str(&rest[..at]);
        let quote = rest.as_bytes()[at];
        if quote == b'\'' {
            // A character literal ('x', '\n', '"'), not a lifetime ('a).
            let after = &rest[at + 1..];
            let end = if after.starts_with('\\') {
                after[2..].find('\'').map(|e| e + 3)
            } else {
                after
                    .chars()
                    .next()
                    .filter(|_| after[1..].starts_with('\''))
                    .map(|c| c.len_utf8() + 1)
            };
            match end {
                Some(e) => rest = &after[e..],
                None => {
                    out.push('\'');
                    rest = after;
                }
            }
            continue;
        }
        // A raw string: `r`, then hashes, then the quote.
        let hashes = rest[..at].chars().rev().take_while(|&c| c == '#').count();
        let raw = rest[..at - hashes].ends_with('r');
        let body = &rest[at + 1..];
        let end = if raw {
            let close = format!("\"{}", "#".repeat(hashes));
            body.find(&close).map(|e| e + close.len())
        } else {
            let mut escaped = false;
            body.char_indices()
                .find(|&(_, c)| {
                    let end = c == '"' && !escaped;
                    escaped = c == '\\' && !escaped;
                    end
                })
                .map(|(e, _)| e + 1)
        };
        out.push_str("\"\"");
        rest = end.map_or("", |e| &body[e..]);
    }
    out.push_str(rest);
    out
}

/// The first segments of the `keel::` paths a front-end's code names (`keel::x::…` and each
/// first segment of a `keel::{x, y::z}` group).
fn core_paths_of(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (at, _) in code.match_indices("keel::") {
        if code[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        // The path (or group) alone, read by the path reader with `crate::` for `keel::`.
        let rest = &code[at + "keel::".len()..];
        let mut depth = 0usize;
        let end = rest
            .char_indices()
            .find(|&(_, c)| match c {
                '{' => {
                    depth += 1;
                    false
                }
                '}' if depth > 0 => {
                    depth -= 1;
                    false
                }
                _ if depth > 0 => c == ';',
                c => !(c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            })
            .map_or(rest.len(), |(e, _)| e);
        let text = format!("crate::{}", &rest[..end]);
        out.extend(named_paths(&text, &[]).into_iter().filter_map(|p| p.into_iter().next()));
    }
    out
}

/// The front-ends — the server library and the `keel` binary — name the core only through
/// its use cases (`keel::api`) and its vocabulary (`keel::protocol`); the root's allocator is
/// the one other name. A path into an owner's module fails here, with the file that names it.
#[test]
fn front_ends_speak_only_the_use_cases_and_the_protocol() {
    for krate in ["server", "cli"] {
        let root = src(krate);
        let mut all = Vec::new();
        files(&root, &mut all);
        let mut reached: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for path in &all {
            let text = without_strings(&code(&std::fs::read_to_string(path).unwrap()));
            for first in core_paths_of(&text) {
                if !["api", "protocol", "Allocator"].contains(&first.as_str()) {
                    let rel = path.strip_prefix(&root).unwrap().to_string_lossy().to_string();
                    reached.entry(first).or_default().insert(rel);
                }
            }
        }
        assert!(reached.is_empty(), "{krate} reaches the core's owners directly: {reached:#?}");
    }
}

#[test]
fn the_front_end_reader_skips_strings_and_sees_groups() {
    let code = without_strings(
        "use keel::{api::Caller, protocol::ids};\nlet s = \"keel::model=debug\";\n\
         let r = r#\"keel::session\"#; let c = '\"'; fn f<'a>() { keel::store::x(); }",
    );
    let got: Vec<String> = core_paths_of(&code).into_iter().collect();
    assert_eq!(got, ["api", "protocol", "store"]);
}
