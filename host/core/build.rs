//! Builds the first-party plugins (`plugins/*`) for `wasm32-wasip2` so the `keel` binary can
//! embed them: a fresh keel home has the first-party tools without an install step.

#[path = "../guests.rs"]
mod guests;

use std::path::PathBuf;

/// (tool component name, package, artifact file name)
const PLUGINS: &[(&str, &str, &str)] = &[
    ("fs", "keel-plugin-fs", "keel_plugin_fs.wasm"),
    ("csv", "keel-plugin-csv", "keel_plugin_csv.wasm"),
    ("control", "keel-plugin-control", "keel_plugin_control.wasm"),
    ("http", "keel-plugin-http", "keel_plugin_http.wasm"),
];

fn main() {
    let root = guests::workspace_root();
    let mut args = Vec::new();
    for (_, package, _) in PLUGINS {
        args.push("-p");
        args.push(package);
    }
    let dir = guests::cargo_build_guests(&args);
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let mut code =
        String::from("/// First-party tool components embedded in the binary: (name, bytes).\n");
    code.push_str("pub const BUILTIN_COMPONENTS: &[(&str, &[u8])] = &[\n");
    for (name, _, file) in PLUGINS {
        let path = dir.join(file);
        code.push_str(&format!(
            "    ({name:?}, include_bytes!({:?})),\n",
            path.display().to_string()
        ));
        println!("cargo:rerun-if-changed={}", root.join("plugins").join(name).display());
    }
    code.push_str("];\n");
    if let Err(e) = std::fs::write(out.join("builtin.rs"), code) {
        panic!("cannot write builtin.rs: {e}");
    }
    println!("cargo:rerun-if-changed=../guests.rs");
}
