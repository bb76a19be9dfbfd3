//! What the binary carries for tool authors: the WIT contract a component implements, and
//! keel-sdk itself, which `keel tool new` writes into a project's `vendor/` so that the project
//! builds on any machine with Rust, before (or without) the SDK being on a registry.

use std::path::{Path, PathBuf};

/// The `keel:tool` WIT package: what every tool component exports and may import.
pub const TOOL_WIT: &str = include_str!("../../../../wit/tool.wit");

/// The whole WIT directory a bindings generator parses: `tool.wit` and the package it refers
/// to (`keel:control`, which only the trusted `control-tool` world imports), by path.
pub const WIT_FILES: &[(&str, &str)] = &[
    ("tool.wit", TOOL_WIT),
    ("deps/control/types.wit", include_str!("../../../../wit/deps/control/types.wit")),
    ("deps/control/plan.wit", include_str!("../../../../wit/deps/control/plan.wit")),
    (
        "deps/control/capabilities.wit",
        include_str!("../../../../wit/deps/control/capabilities.wit"),
    ),
    ("deps/control/sessions.wit", include_str!("../../../../wit/deps/control/sessions.wit")),
];

/// Writes [`WIT_FILES`] under `dir`; returns the files written.
pub fn write_wit(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for (path, text) in WIT_FILES {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&file, text)?;
        written.push(file);
    }
    Ok(written)
}

/// The version of the `keel:tool` package keel accepts, read from its `package` line.
pub fn tool_wit_version() -> &'static str {
    TOOL_WIT
        .lines()
        .find_map(|l| l.trim().strip_prefix("package keel:tool@"))
        .map_or("", |v| v.trim_end_matches(';'))
}

/// keel-sdk's sources, by path inside the SDK's directory.
const SDK_SOURCES: &[(&str, &str)] = &[
    ("src/lib.rs", include_str!("../../../../sdk/src/lib.rs")),
    ("README.md", include_str!("../../../../sdk/README.md")),
];

/// keel-sdk-macros' sources, by path inside its directory.
const MACROS_SOURCES: &[(&str, &str)] =
    &[("src/lib.rs", include_str!("../../../../sdk/macros/src/lib.rs"))];

/// The manifests as the repository has them (their fields and dependencies inherited from the
/// workspace's), resolved when a project is written.
const SDK_MANIFEST: &str = include_str!("../../../../sdk/Cargo.toml");
const MACROS_MANIFEST: &str = include_str!("../../../../sdk/macros/Cargo.toml");
const WORKSPACE_MANIFEST: &str = include_str!("../../../../Cargo.toml");

/// Where a project keeps the vendored SDK, and the dependency line that names it.
pub const VENDOR_DIR: &str = "vendor/keel-sdk";
pub const VENDORED_DEPENDENCY: &str = r#"{ path = "vendor/keel-sdk" }"#;

/// The files of the vendored SDK and its macros, by path inside a project: the sources, the
/// WIT the bindings are generated from, and manifests that stand alone (every field and
/// dependency the workspace gave them written out, the macros found beside the SDK).
pub fn vendored_sdk() -> Result<Vec<(String, String)>, String> {
    let workspace: toml::Table = WORKSPACE_MANIFEST
        .parse()
        .map_err(|e| format!("the workspace manifest this keel carries does not read: {e}"))?;
    let sdk =
        standalone(SDK_MANIFEST, &workspace, Some(("keel-sdk-macros", "../keel-sdk-macros")))?;
    let macros = standalone(MACROS_MANIFEST, &workspace, None)?;
    let mut files = vec![
        (format!("{VENDOR_DIR}/Cargo.toml"), sdk),
        ("vendor/keel-sdk-macros/Cargo.toml".to_string(), macros),
    ];
    files.extend(SDK_SOURCES.iter().map(|(p, t)| (format!("{VENDOR_DIR}/{p}"), t.to_string())));
    files.extend(WIT_FILES.iter().map(|(p, t)| (format!("{VENDOR_DIR}/wit/{p}"), t.to_string())));
    files.extend(
        MACROS_SOURCES.iter().map(|(p, t)| (format!("vendor/keel-sdk-macros/{p}"), t.to_string())),
    );
    Ok(files)
}

/// `manifest` with what it inherits from `workspace` written out: `field.workspace = true`
/// becomes the workspace's value, a dependency's `workspace = true` the workspace's entry (its
/// own `features` added); the lints table and the package's file list go, it is not
/// published, and dependency `path` (if given) moves to where the vendored copy is.
fn standalone(
    manifest: &str,
    workspace: &toml::Table,
    path: Option<(&str, &str)>,
) -> Result<String, String> {
    let broken = |what: &str| format!("the SDK manifest this keel carries: {what}");
    let mut m: toml::Table =
        manifest.parse().map_err(|e| broken(&format!("does not read: {e}")))?;
    let ws = workspace.get("workspace").and_then(toml::Value::as_table);
    let ws_package = ws.and_then(|w| w.get("package")).and_then(toml::Value::as_table);
    let ws_deps = ws.and_then(|w| w.get("dependencies")).and_then(toml::Value::as_table);
    let inherits = |v: &toml::Value| {
        v.as_table().and_then(|t| t.get("workspace")).and_then(toml::Value::as_bool) == Some(true)
    };
    let package = m
        .get_mut("package")
        .and_then(toml::Value::as_table_mut)
        .ok_or_else(|| broken("no [package]"))?;
    for (key, value) in package.iter_mut() {
        if inherits(value) {
            *value = ws_package
                .and_then(|p| p.get(key.as_str()))
                .cloned()
                .ok_or_else(|| broken(&format!("the workspace has no package.{key}")))?;
        }
    }
    package.remove("include");
    package.insert("publish".into(), toml::Value::Boolean(false));
    if let Some(deps) = m.get_mut("dependencies").and_then(toml::Value::as_table_mut) {
        for (name, value) in deps.iter_mut() {
            if inherits(value) {
                let mut entry = match ws_deps.and_then(|d| d.get(name.as_str())).cloned() {
                    Some(toml::Value::String(version)) => toml::Table::from_iter([(
                        "version".to_string(),
                        toml::Value::String(version),
                    )]),
                    Some(toml::Value::Table(t)) => t,
                    _ => return Err(broken(&format!("the workspace has no dependency {name}"))),
                };
                let extra = value
                    .as_table()
                    .and_then(|t| t.get("features"))
                    .and_then(toml::Value::as_array);
                if let Some(extra) = extra {
                    let features =
                        entry.entry("features").or_insert_with(|| toml::Value::Array(Vec::new()));
                    if let Some(list) = features.as_array_mut() {
                        list.extend(extra.iter().cloned());
                    }
                }
                *value = toml::Value::Table(entry);
            }
            if let Some((dep, to)) = path
                && name == dep
                && let Some(t) = value.as_table_mut()
            {
                t.insert("path".into(), toml::Value::String(to.into()));
            }
        }
    }
    m.remove("lints");
    // `[package]` first, as people write a manifest.
    let package = m.remove("package").unwrap_or_else(|| toml::Value::Table(toml::Table::new()));
    let write =
        |t: &toml::Value| toml::to_string(t).map_err(|e| broken(&format!("does not write: {e}")));
    Ok(format!(
        "# Vendored by `keel tool new` from keel {}: the SDK this keel carries.\n[package]\n{}\n{}",
        env!("CARGO_PKG_VERSION"),
        write(&package)?,
        write(&toml::Value::Table(m))?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vendored manifests stand alone: nothing left to inherit, the SDK's dependencies as
    /// the workspace pins them, the macros beside it.
    #[test]
    fn the_vendored_manifests_inherit_nothing_and_pin_what_the_workspace_pins() {
        let files = vendored_sdk().unwrap();
        let manifest = |p: &str| -> toml::Table {
            files.iter().find(|(f, _)| f == p).unwrap().1.parse().unwrap()
        };
        let sdk = manifest("vendor/keel-sdk/Cargo.toml");
        let macros = manifest("vendor/keel-sdk-macros/Cargo.toml");
        for m in [&sdk, &macros] {
            assert!(!toml::to_string(m).unwrap().contains("workspace"), "{m:?}");
            assert!(m.get("lints").is_none());
            assert_eq!(m["package"]["publish"].as_bool(), Some(false));
            assert_eq!(m["package"]["version"].as_str(), Some(env!("CARGO_PKG_VERSION")));
            assert_eq!(m["package"]["edition"].as_str(), Some("2024"));
        }
        assert_eq!(sdk["package"]["name"].as_str(), Some("keel-sdk"));
        let deps = sdk["dependencies"].as_table().unwrap();
        assert_eq!(deps["keel-sdk-macros"]["path"].as_str(), Some("../keel-sdk-macros"));
        assert_eq!(deps["serde_json"]["version"].as_str(), Some("1"));
        assert_eq!(deps["wit-bindgen"]["default-features"].as_bool(), Some(false));
        let ws: toml::Table = WORKSPACE_MANIFEST.parse().unwrap();
        assert_eq!(
            deps["wit-bindgen"]["version"],
            ws["workspace"]["dependencies"]["wit-bindgen"]["version"]
        );
        // Every WIT file the bindings are generated from, and the sources.
        for f in [
            "vendor/keel-sdk/wit/tool.wit",
            "vendor/keel-sdk/wit/deps/control/types.wit",
            "vendor/keel-sdk/src/lib.rs",
            "vendor/keel-sdk-macros/src/lib.rs",
        ] {
            assert!(files.iter().any(|(p, _)| p == f), "{f}");
        }
    }
}
