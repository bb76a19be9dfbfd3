//! For tool authors: `keel wit` (the contract a component implements, for any toolchain) and
//! `keel tool new` (a standalone project that builds a working tool, with a test).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use serde_json::json;

use super::{EXIT_REFUSED, EXIT_SETUP, fail};

/// The `keel:tool` WIT package: what every tool component exports and may import.
pub const TOOL_WIT: &str = include_str!("../../../../wit/tool.wit");

/// The version of the `keel:tool` package keel accepts, read from its `package` line.
pub fn tool_wit_version() -> &'static str {
    TOOL_WIT
        .lines()
        .find_map(|l| l.trim().strip_prefix("package keel:tool@"))
        .map_or("", |v| v.trim_end_matches(';'))
}

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
        }
        return ExitCode::SUCCESS;
    };
    let file = dir.join("tool.wit");
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, TOOL_WIT)) {
        return fail(a.json, "io", &format!("cannot write {}: {e}", file.display()), EXIT_SETUP);
    }
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "package": "keel:tool", "version": version, "file": file})
        );
    } else {
        println!("wrote keel:tool@{version} to {}", file.display());
    }
    ExitCode::SUCCESS
}

/// The language of a new tool project.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// Rust with keel-sdk.
    Rust,
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
    /// Depend on the keel-sdk at PATH (a directory holding its Cargo.toml) instead of the
    /// registry's.
    #[arg(long, value_name = "PATH")]
    sdk: Option<PathBuf>,
    /// Where to create the project (default: ./NAME). It must not exist, or be empty.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `keel tool new`.
pub fn new(a: NewArgs) -> ExitCode {
    if !keel::names::valid_component_name(&a.name) {
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
    let sdk = match &a.sdk {
        None => format!("\"{}\"", sdk_requirement()),
        Some(p) => match sdk_path(p) {
            Ok(p) => format!("{{ path = {} }}", toml_string(&p.display().to_string())),
            Err(why) => return fail(a.json, "invalid_input", &why, EXIT_REFUSED),
        },
    };
    let files = rust_project(&a.name, a.effect, &sdk);
    let mut written = Vec::new();
    for (path, text) in &files {
        let file = dir.join(path);
        let made = file
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&file, text));
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
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "dir": dir, "lang": "rust", "tool": tool_name(&a.name), "files": written})
        );
    } else {
        println!(
            "created {} ({} files): a Rust tool `{}`",
            dir.display(),
            written.len(),
            tool_name(&a.name)
        );
        println!("next:");
        println!("  cd {}", dir.display());
        println!("  cargo test");
        println!("  cargo build --release --target wasm32-wasip2");
        println!(
            "  keel tool install target/wasm32-wasip2/release/{}.wasm --name {}",
            lib_name(&a.name),
            a.name
        );
    }
    ExitCode::SUCCESS
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

/// The files of a new Rust tool project, by path inside it.
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
    let readme = format!(
        r#"# {name}

A keel tool component: the tool `{tool}` counts the words and characters of a text. Change
`src/lib.rs` to make it yours — each tool is a function from a `serde` input type to a `serde`
output type; doc comments become the descriptions in its schemas.

```sh
cargo test                                          # the tool's logic, natively
rustup target add wasm32-wasip2                     # once
cargo build --release --target wasm32-wasip2        # the component
keel tool install target/wasm32-wasip2/release/{lib}.wasm --name {name}
keel tool call {tool} --input '{{"text": "hello keel"}}'
```

After a change, `keel tool install … --upgrade` replaces the installed component and shows what
changed.

`wit/tool.wit` is the contract the component implements (`keel:tool@{version}`), for reference
and for other toolchains (`keel wit` prints it).
"#
    );
    vec![
        ("Cargo.toml", cargo),
        ("src/lib.rs", lib_rs),
        ("README.md", readme),
        ("wit/tool.wit", TOOL_WIT.to_string()),
        (".gitignore", "/target\n".to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wit_version_is_read_from_its_package_line() {
        assert_eq!(tool_wit_version(), "0.1.0");
        assert_eq!(sdk_requirement(), "0.1");
    }
}
