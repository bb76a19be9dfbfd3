//! Builds the test guests (`tests/guests/examples/*.rs`) for `wasm32-wasip2` and generates
//! `pub const NAME_COMPONENT: &str = "<path>"` for each. A guest file that is not listed in
//! `GUESTS` fails the build, so no fixture is silently left out.

#[path = "../host/guests.rs"]
mod guests;

const GUESTS: &[&str] = &[
    "hostile",
    "wrong_world",
    "sockets",
    "bad_specs",
    "vault_import",
    "effects",
    "fs_effects",
    "wiping",
    "http_import",
    "missing_funcs",
    "forger",
    "forger_install",
    "plain_bindgen",
    "plan_import",
    "plan_import_v1",
    "net_readonly",
    "net_probe",
    "summary_v1",
    "summary_v2",
];

fn main() {
    let root = guests::workspace_root();
    let dir = guests::cargo_build_guests(&["-p", "keel-test-guests", "--examples"]);
    let examples = root.join("tests").join("guests").join("examples");
    let mut code = String::new();
    for entry in std::fs::read_dir(&examples).into_iter().flatten().flatten() {
        let name =
            entry.path().file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        if !GUESTS.contains(&name.as_str()) {
            panic!("test guest `{name}` is not listed in tests/build.rs GUESTS");
        }
    }
    for name in GUESTS {
        let path = dir.join("examples").join(format!("{name}.wasm"));
        code.push_str(&format!(
            "/// Test guest `{name}`.\npub const {}_COMPONENT: &str = {:?};\n",
            name.to_uppercase(),
            path.display().to_string()
        ));
    }
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    if let Err(e) = std::fs::write(out.join("guests.rs"), code) {
        panic!("cannot write guests.rs: {e}");
    }
    println!("cargo:rerun-if-changed={}", root.join("tests").join("guests").display());
    println!("cargo:rerun-if-changed=../host/guests.rs");
}
