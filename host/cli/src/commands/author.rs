//! For tool authors: `keel wit` (the contract a component implements, for any toolchain) and
//! `keel tool new` (a standalone project that builds a working tool, with a test).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde_json::json;

use super::sdk::{
    TOOL_WIT, VENDOR_DIR, VENDORED_DEPENDENCY, WIT_FILES, tool_wit_version, vendored_sdk, write_wit,
};
use super::{EXIT_REFUSED, EXIT_SETUP, fail};

#[derive(Args)]
pub struct WitArgs {
    /// Write the package to DIR/tool.wit (DIR is created) instead of printing it.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Print JSON (the package's name, version and, with --out, the file written).
    #[arg(long)]
    json: bool,
}

/// `keel wit`.
pub fn wit(a: WitArgs) -> ExitCode {
    let version = tool_wit_version();
    let Some(dir) = a.out else {
        if a.json {
            println!(
                "{}",
                json!({"ok": true, "package": "keel:tool", "version": version, "wit": TOOL_WIT})
            );
        } else {
            print!("{TOOL_WIT}");
            eprintln!(
                "keel: this is tool.wit; its control-tool world imports keel:control — `keel wit --out DIR` writes both, as a bindings generator needs them"
            );
        }
        return ExitCode::SUCCESS;
    };
    let files = match write_wit(&dir) {
        Ok(f) => f,
        Err(e) => {
            return fail(a.json, "io", &format!("cannot write {}: {e}", dir.display()), EXIT_SETUP);
        }
    };
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "package": "keel:tool", "version": version, "file": dir.join("tool.wit"), "files": files})
        );
    } else {
        println!(
            "wrote keel:tool@{version} to {} (with deps/control/, the package its control-tool world imports)",
            dir.join("tool.wit").display()
        );
    }
    ExitCode::SUCCESS
}

/// The language of a new tool project.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// Rust with keel-sdk.
    Rust,
    /// Python with componentize-py (pinned as in keel's examples).
    Python,
    /// JavaScript with componentize-js (pinned as in keel's examples).
    Js,
}

/// componentize-py's pin: the examples' requirements, one place for the version.
const PYTHON_REQUIREMENTS: &str = include_str!("../../../../examples/python-tool/requirements.txt");

/// componentize-js's pin, from the examples' package.json.
fn componentize_js_version() -> &'static str {
    const PACKAGE: &str = include_str!("../../../../examples/js-tool/package.json");
    PACKAGE
        .split("\"@bytecodealliance/componentize-js\":")
        .nth(1)
        .and_then(|rest| rest.split('"').nth(1))
        .unwrap_or("0.23.0")
}

/// The effect class a new tool declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EffectClass {
    /// Reads only; changes nothing anywhere (may run in parallel, re-run after a crash).
    ReadOnly,
    /// Creates or modifies files inside the granted workspace.
    WorkspaceWrite,
    /// Acts outside the workspace (sends a message, calls a service).
    External,
    /// Deletes or overwrites data in a way that cannot be undone.
    Destructive,
}

impl EffectClass {
    fn wit(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::WorkspaceWrite => "workspace-write",
            Self::External => "external",
            Self::Destructive => "destructive",
        }
    }

    fn sdk(self) -> &'static str {
        match self {
            Self::ReadOnly => "ReadOnly",
            Self::WorkspaceWrite => "WorkspaceWrite",
            Self::External => "External",
            Self::Destructive => "Destructive",
        }
    }
}

#[derive(Args)]
pub struct NewArgs {
    /// The component's name: lowercase letters, digits, `_` and `-`, starting with a letter.
    /// Its example tool is named the same, with `_` for `-`.
    name: String,
    /// The language of the project.
    #[arg(long, value_enum, default_value = "rust")]
    lang: Lang,
    /// The effect class the example tool declares (keel enforces it: a read-only tool cannot
    /// write).
    #[arg(long, value_enum, default_value = "read-only", value_name = "CLASS")]
    effect: EffectClass,
    /// Depend on the keel-sdk at PATH (a directory holding its Cargo.toml, e.g. the `sdk/` of
    /// a keel checkout) instead of the copy this keel writes into the project's `vendor/`.
    #[arg(long, value_name = "PATH", conflicts_with = "sdk_version")]
    sdk: Option<PathBuf>,
    /// Depend on keel-sdk VERSION from the registry (crates.io) instead of the copy this keel
    /// writes into the project's `vendor/`.
    #[arg(long, value_name = "VERSION")]
    sdk_version: Option<String>,
    /// Where to create the project (default: ./NAME). It must not exist, or be empty.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `keel tool new`.
pub fn new(a: NewArgs) -> ExitCode {
    if !keel::protocol::text::valid_component_name(&a.name) {
        return fail(
            a.json,
            "invalid_input",
            &format!(
                "`{}` is not a valid component name: use lowercase letters, digits, `_` and `-`, starting with a letter",
                a.name
            ),
            EXIT_REFUSED,
        );
    }
    let dir = a.dir.clone().unwrap_or_else(|| PathBuf::from(&a.name));
    if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
        return fail(
            a.json,
            "conflict",
            &format!("{} exists and is not empty: choose another name or --dir", dir.display()),
            EXIT_REFUSED,
        );
    }
    if (a.sdk.is_some() || a.sdk_version.is_some()) && a.lang != Lang::Rust {
        return fail(
            a.json,
            "invalid_input",
            "--sdk and --sdk-version are for Rust projects (--lang rust)",
            EXIT_REFUSED,
        );
    }
    let vendored = a.lang == Lang::Rust && a.sdk.is_none() && a.sdk_version.is_none();
    let files: Vec<(String, String)> = match a.lang {
        Lang::Rust => {
            let sdk = match (&a.sdk, &a.sdk_version) {
                (Some(p), _) => match sdk_path(p) {
                    Ok(p) => format!("{{ path = {} }}", toml_string(&p.display().to_string())),
                    Err(why) => return fail(a.json, "invalid_input", &why, EXIT_REFUSED),
                },
                (None, Some(v)) => match sdk_version(v) {
                    Ok(v) => toml_string(&v),
                    Err(why) => return fail(a.json, "invalid_input", &why, EXIT_REFUSED),
                },
                (None, None) => VENDORED_DEPENDENCY.to_string(),
            };
            let mut files = owned(rust_project(&a.name, a.effect, &sdk));
            if vendored {
                match vendored_sdk() {
                    Ok(sdk) => files.extend(sdk),
                    Err(why) => return fail(a.json, "internal", &why, EXIT_SETUP),
                }
            }
            files
        }
        Lang::Python => owned(python_project(&a.name, a.effect)),
        Lang::Js => owned(js_project(&a.name, a.effect)),
    };
    let lang = a.lang.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default();
    let mut written = Vec::new();
    for (path, text) in &files {
        let file = dir.join(path);
        let made = file
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&file, text))
            .and_then(|()| executable_if_script(&file));
        if let Err(e) = made {
            return fail(
                a.json,
                "io",
                &format!("cannot write {}: {e}", file.display()),
                EXIT_SETUP,
            );
        }
        written.push(path.to_string());
    }
    // The contract, with the package it refers to, as `keel wit --out` writes it.
    if let Err(e) = write_wit(&dir.join("wit")) {
        return fail(a.json, "io", &format!("cannot write {}/wit: {e}", dir.display()), EXIT_SETUP);
    }
    written.extend(WIT_FILES.iter().map(|(path, _)| format!("wit/{path}")));
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "dir": dir, "lang": lang, "tool": tool_name(&a.name), "files": written})
        );
    } else {
        println!(
            "created {} ({} files): a {lang} tool `{}`",
            dir.display(),
            written.len(),
            tool_name(&a.name)
        );
        if vendored {
            println!(
                "(keel-sdk {} is in {VENDOR_DIR}, written from this keel: the project builds anywhere with Rust; `--sdk-version {}` depends on the registry's instead)",
                env!("CARGO_PKG_VERSION"),
                sdk_requirement()
            );
        }
        println!("next (also in its README.md):");
        println!("  cd {}", dir.display());
        let wasm = match a.lang {
            Lang::Rust => {
                println!("  cargo test");
                println!("  cargo build --release --target wasm32-wasip2");
                format!("target/wasm32-wasip2/release/{}.wasm", lib_name(&a.name))
            }
            Lang::Python => {
                println!("  python3 -m unittest");
                println!("  ./build.sh");
                format!("{}.wasm", lib_name(&a.name))
            }
            Lang::Js => {
                println!("  npm install && npm test");
                println!("  npm run build");
                format!("{}.wasm", lib_name(&a.name))
            }
        };
        println!("  keel tool test");
        println!("  keel tool install {wasm}");
        println!(
            "while you work: keel tool dev --input '{{\"text\": \"hello keel\"}}' (rebuilds and calls on every save)"
        );
    }
    ExitCode::SUCCESS
}

/// A project's build script (`*.sh`) is made executable, as its README runs it.
fn executable_if_script(file: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    if file.extension().is_some_and(|e| e == "sh") {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o755))?;
    }
    #[cfg(not(unix))]
    let _ = file;
    Ok(())
}

/// The keel-sdk version a new project asks the registry for: this keel's.
fn sdk_requirement() -> String {
    let v = env!("CARGO_PKG_VERSION");
    let mut parts = v.split('.');
    match (parts.next(), parts.next()) {
        (Some("0"), Some(minor)) => format!("0.{minor}"),
        (Some(major), _) => major.to_string(),
        _ => v.to_string(),
    }
}

/// A registry version requirement for keel-sdk (`0.1`, `=0.1.0`, `^0.2`), refused when it is
/// anything but one.
fn sdk_version(v: &str) -> Result<String, String> {
    let v = v.trim();
    let requirement = v.trim_start_matches(['=', '^', '~']);
    let ok = !requirement.is_empty()
        && requirement.split('.').count() <= 3
        && requirement.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if ok {
        Ok(v.to_string())
    } else {
        Err(format!("--sdk-version `{v}` is not a version such as 0.1 or =0.1.0"))
    }
}

/// Files by path, owned.
fn owned(files: Vec<(&'static str, String)>) -> Vec<(String, String)> {
    files.into_iter().map(|(p, t)| (p.to_string(), t)).collect()
}

/// The SDK directory `p` names, absolute, once checked to hold keel-sdk's manifest.
fn sdk_path(p: &Path) -> Result<PathBuf, String> {
    let dir = std::fs::canonicalize(p)
        .map_err(|e| format!("--sdk {}: cannot read the directory: {e}", p.display()))?;
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
    if !manifest.lines().any(|l| l.trim() == "name = \"keel-sdk\"") {
        return Err(format!(
            "--sdk {}: no keel-sdk here (its Cargo.toml names another package, or is missing); give the `sdk` directory of a keel checkout",
            p.display()
        ));
    }
    Ok(dir)
}

fn toml_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

fn tool_name(name: &str) -> String {
    name.replace('-', "_")
}

fn lib_name(name: &str) -> String {
    name.replace('-', "_")
}

/// The two cases every scaffold comes with (`keel tool test` runs them): an output, and the
/// input schema's refusal.
fn test_cases() -> Vec<(&'static str, String)> {
    vec![
        (
            "tests/counts_words.json",
            r#"{
  "description": "counts the words and characters of a text",
  "input": {"text": "two words"},
  "output": {"words": 2, "characters": 9}
}
"#
            .to_string(),
        ),
        (
            "tests/refuses_a_missing_text.json",
            r#"{
  "description": "the input schema requires `text`",
  "input": {},
  "error": "invalid_input"
}
"#
            .to_string(),
        ),
    ]
}

/// The files of a new Rust tool project, by path inside it (the WIT is written beside them).
fn rust_project(name: &str, effect: EffectClass, sdk: &str) -> Vec<(&'static str, String)> {
    let tool = tool_name(name);
    let lib = lib_name(name);
    let idempotent = if effect == EffectClass::ReadOnly { ".idempotent()" } else { "" };
    let cargo = format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
description = "A keel tool component"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
keel-sdk = {sdk}
serde = {{ version = "1", features = ["derive"] }}

[profile.release]
opt-level = "s"
lto = true

# A project of its own, even when created inside another workspace.
[workspace]
"#
    );
    let lib_rs = format!(
        r#"//! The `{tool}` tool: counts the words and characters of a text.

use keel_sdk::{{Effect, JsonSchema, Tool, ToolError}};
use serde::{{Deserialize, Serialize}};

/// What `{tool}` takes. Doc comments become the descriptions in its input schema.
#[derive(Deserialize, JsonSchema)]
struct Input {{
    /// The text to count.
    text: String,
}}

/// What `{tool}` returns.
#[derive(Serialize, JsonSchema)]
struct Output {{
    /// Words: runs of characters between whitespace.
    words: usize,
    /// Characters (Unicode scalar values).
    characters: usize,
}}

fn count(input: Input) -> Result<Output, ToolError> {{
    if input.text.len() > 1 << 20 {{
        return Err(ToolError::InvalidInput("`text` is over 1 MiB: give a shorter text".into()));
    }}
    Ok(Output {{ words: input.text.split_whitespace().count(), characters: input.text.chars().count() }})
}}

fn tools() -> Vec<Tool> {{
    vec![Tool::new("{tool}", "Counts the words and characters of a text.", Effect::{effect}, count){idempotent}]
}}

keel_sdk::export_tools!(tools);

#[cfg(test)]
mod tests {{
    use super::*;

    #[test]
    fn counts_words_and_characters() {{
        let out = count(Input {{ text: "two words".into() }}).unwrap();
        assert_eq!((out.words, out.characters), (2, 9));
    }}

    #[test]
    fn refuses_a_text_over_the_limit() {{
        let big = "a".repeat((1 << 20) + 1);
        assert!(matches!(count(Input {{ text: big }}), Err(ToolError::InvalidInput(_))));
    }}
}}
"#,
        effect = effect.sdk(),
    );
    let version = tool_wit_version();
    let vendor = if sdk == VENDORED_DEPENDENCY {
        format!(
            "\n`{VENDOR_DIR}` (with `vendor/keel-sdk-macros`) is keel-sdk {}, as the keel that made this\nproject carries it: the project builds on any machine with Rust, nothing fetched from a\nkeel checkout. Once keel-sdk is on crates.io, `keel-sdk = \"{}\"` in `Cargo.toml` can take\nits place (and `vendor/` can go).\n",
            env!("CARGO_PKG_VERSION"),
            sdk_requirement()
        )
    } else {
        String::new()
    };
    let readme = format!(
        r#"# {name}

A keel tool component: the tool `{tool}` counts the words and characters of a text. Change
`src/lib.rs` to make it yours — each tool is a function from a `serde` input type to a `serde`
output type; doc comments become the descriptions in its schemas.

```sh
cargo test                                          # the tool's logic, natively
rustup target add wasm32-wasip2                     # once
cargo build --release --target wasm32-wasip2        # the component
keel tool test                                      # tests/*.json, in keel's sandbox
keel tool install target/wasm32-wasip2/release/{lib}.wasm
keel tool call {tool} --input '{{"text": "hello keel"}}'
```

While you work, `keel tool dev --input '{{"text": "hello keel"}}'` rebuilds on every save and
calls the tool again, printing its logs and output (a line of JSON typed on its stdin calls it
with that input). `tests/*.json` are the cases `keel tool test` runs: an `input`, and the
`output` expected (objects match on the fields given) or the `error` kind.

The component carries this crate's name and version (`Cargo.toml`): `keel tool install` names
it `{name}`, `keel tool list` shows the version, and `keel tool publish` labels it. After a
change, `keel tool install … --upgrade` replaces the installed component and shows what changed.

`wit/tool.wit` is the contract the component implements (`keel:tool@{version}`), for reference
and for other toolchains (`keel wit` prints it).
{vendor}"#
    );
    let mut files = vec![
        ("Cargo.toml", cargo),
        ("src/lib.rs", lib_rs),
        ("README.md", readme),
        (".gitignore", "/target\n".to_string()),
    ];
    files.extend(test_cases());
    files
}

/// Fills a template's placeholders: `{{tool}}`, `{{name}}`, `{{wasm}}`, `{{effect}}` and
/// `{{idempotent}}` (`true` or `false`, in the language's spelling).
fn fill(template: &str, name: &str, effect: EffectClass, python: bool) -> String {
    let idempotent = match (effect == EffectClass::ReadOnly, python) {
        (true, true) => "True",
        (false, true) => "False",
        (true, false) => "true",
        (false, false) => "false",
    };
    template
        .replace("{{tool}}", &tool_name(name))
        .replace("{{name}}", name)
        .replace("{{wasm}}", &format!("{}.wasm", lib_name(name)))
        .replace("{{effect}}", effect.wit())
        .replace("{{idempotent}}", idempotent)
}

/// The files of a new Python tool project (componentize-py): the tools are functions marked
/// `@tool`, their schemas derived from their type annotations (`keel_tool.py`).
fn python_project(name: &str, effect: EffectClass) -> Vec<(&'static str, String)> {
    let tool = tool_name(name);
    let wasm = format!("{}.wasm", lib_name(name));
    let t = |template: &str| fill(template, name, effect, true);
    let build = format!(
        r#"#!/usr/bin/env bash
# Builds {wasm} with componentize-py (pinned in requirements.txt), installed into .venv on
# first use, then writes the project's name and version (pyproject.toml) into it.
# COMPONENTIZE_PY may name an installed componentize-py instead.
set -euo pipefail
cd "$(dirname "$0")"
tool="${{COMPONENTIZE_PY:-}}"
if [ -z "$tool" ]; then
  if [ ! -x .venv/bin/componentize-py ]; then
    python3 -m venv .venv
    .venv/bin/pip install --quiet -r requirements.txt
  fi
  tool=.venv/bin/componentize-py
fi
"$tool" -d wit -w tool componentize app -o {wasm}
python3 stamp.py {wasm}
"#
    );
    let readme = format!(
        r#"# {name}

A keel tool component in Python: the tool `{tool}` counts the words and characters of a text.
`logic.py` is what it does: each tool is a function marked `@tool`, and its input and output
schemas come from its type annotations (`Annotated[str, "description"]` describes a field, a
default makes it optional; see `keel_tool.py`), its description from its docstring. `app.py`
is the component (componentize-py's bindings of `wit/tool.wit`, generated into the module
`wit_world` at build time); it needs no change when you add a tool.

```sh
python3 -m unittest                       # the logic, natively
./build.sh                                # {wasm} (installs componentize-py into .venv once)
keel tool test                            # tests/*.json, in keel's sandbox
keel tool call --wasm {wasm} {tool} --input '{{"text": "hello keel"}}'
keel tool install {wasm}
```

While you work, `keel tool dev --input '{{"text": "hello keel"}}'` rebuilds on every save and
calls the tool again. The component carries `pyproject.toml`'s name and version (`stamp.py`
writes them): `keel tool install` names it `{name}`, `keel tool list` shows the version.

The component carries CPython (about 18 MB); keel compiles it once and loads the cached
artifact afterwards.
"#
    );
    let mut files = vec![
        ("app.py", t(include_str!("../../templates/python/app.py"))),
        ("logic.py", t(include_str!("../../templates/python/logic.py"))),
        ("keel_tool.py", t(include_str!("../../templates/python/keel_tool.py"))),
        ("test_logic.py", t(include_str!("../../templates/python/test_logic.py"))),
        ("stamp.py", t(include_str!("../../templates/python/stamp.py"))),
        ("pyproject.toml", t(include_str!("../../templates/python/pyproject.toml"))),
        ("requirements.txt", PYTHON_REQUIREMENTS.to_string()),
        ("build.sh", build),
        ("README.md", readme),
        (".gitignore", ".venv/\n__pycache__/\n*.wasm\n".to_string()),
    ];
    files.extend(test_cases());
    files
}

/// The files of a new JavaScript tool project (componentize-js): the tools are documented
/// functions, their schemas read from their JSDoc at build time (`schema.mjs`).
fn js_project(name: &str, effect: EffectClass) -> Vec<(&'static str, String)> {
    let tool = tool_name(name);
    let wasm = format!("{}.wasm", lib_name(name));
    let t = |template: &str| fill(template, name, effect, false);
    let package = format!(
        r#"{{
  "name": "{name}",
  "version": "0.1.0",
  "private": true,
  "type": "module",
  "description": "A keel tool component",
  "scripts": {{ "build": "node build.mjs", "test": "node --test test.mjs" }},
  "dependencies": {{ "@bytecodealliance/componentize-js": "{version}" }}
}}
"#,
        version = componentize_js_version(),
    );
    let readme = format!(
        r#"# {name}

A keel tool component in JavaScript: the tool `{tool}` counts the words and characters of a
text. `tool.js` holds the tools: each is a documented `export function`, listed in `TOOLS`,
and its input and output schemas come from its JSDoc (`@param {{string}} input.text …`,
`@returns {{{{words: integer}}}}`; `build.mjs` reads them with `schema.mjs`). `test.mjs` tests
the functions natively.

```sh
npm install && npm test
npm run build                             # {wasm}
keel tool test                            # tests/*.json, in keel's sandbox
keel tool call --wasm {wasm} {tool} --input '{{"text": "hello keel"}}'
keel tool install {wasm}
```

While you work, `keel tool dev --input '{{"text": "hello keel"}}'` rebuilds on every save and
calls the tool again. The component carries `package.json`'s name and version (`build.mjs`
writes them): `keel tool install` names it `{name}`, `keel tool list` shows the version.
"#
    );
    let mut files = vec![
        ("tool.js", t(include_str!("../../templates/js/tool.js"))),
        ("schema.mjs", t(include_str!("../../templates/js/schema.mjs"))),
        ("test.mjs", t(include_str!("../../templates/js/test.mjs"))),
        ("build.mjs", t(include_str!("../../templates/js/build.mjs"))),
        ("package.json", package),
        ("README.md", readme),
        (".gitignore", "node_modules/\n.build/\n*.wasm\n".to_string()),
    ];
    files.extend(test_cases());
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wit_version_is_read_from_its_package_line() {
        assert_eq!(tool_wit_version(), "0.1.0");
        assert_eq!(sdk_requirement(), "0.1");
        assert!(PYTHON_REQUIREMENTS.starts_with("componentize-py=="));
        assert_eq!(componentize_js_version().split('.').count(), 3);
    }
}
