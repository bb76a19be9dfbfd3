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
    let mut code = String::from(
        "/// First-party tool components embedded in the binary: (name, bytes, SHA-256 of the\n\
         /// bytes in hex — computed here, so no process hashes megabytes at its start).\n",
    );
    code.push_str("pub const BUILTIN_COMPONENTS: &[(&str, &[u8], &str)] = &[\n");
    for (name, _, file) in PLUGINS {
        use sha2::Digest;
        let path = dir.join(file);
        let bytes =
            std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let digest: String =
            sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        code.push_str(&format!(
            "    ({name:?}, include_bytes!({:?}), {digest:?}),\n",
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
