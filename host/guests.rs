// Builds WebAssembly guest crates of this workspace for `wasm32-wasip2` from a build script.
//
// Shared by `host/core/build.rs` (the first-party plugins it embeds) and `tests/build.rs` (the test
// guests). It runs a nested `cargo build` with its own target directory (`target/guests`), so
// the guest build never waits on, or fights with, the outer build's lock.

use std::path::{Path, PathBuf};
use std::process::Command;

pub const GUEST_TARGET: &str = "wasm32-wasip2";
pub const GUEST_PROFILE: &str = "guest";

/// The workspace root: the nearest directory above the crate that runs the build script whose
/// `Cargo.toml` declares the workspace.
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    manifest
        .ancestors()
        .skip(1)
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|t| t.lines().any(|l| l.trim() == "[workspace]"))
        })
        .map(Path::to_path_buf)
        .unwrap_or(manifest)
}

/// Runs `cargo build` for `wasm32-wasip2` with `args` and returns the directory holding the
/// built artifacts. Panics with the guest build's output on failure: that is a build error.
pub fn cargo_build_guests(args: &[&str]) -> PathBuf {
    let root = workspace_root();
    let target_dir = root.join("target").join("guests");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .arg("build")
        .arg("--target")
        .arg(GUEST_TARGET)
        .arg("--profile")
        .arg(GUEST_PROFILE)
        .args(args)
        .env("CARGO_TARGET_DIR", &target_dir)
        // The outer build's flags and wrappers are for the host target, not for guests.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_MAKEFLAGS");
    let status = cmd.status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!(
            "building the wasm32-wasip2 guests failed ({s}): {cmd:?}\n\
             If the target is missing, run `rustup target add wasm32-wasip2`."
        ),
        Err(e) => panic!("cannot run cargo to build the wasm32-wasip2 guests: {e}"),
    }
    for dir in ["sdk", "wit"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    target_dir.join(GUEST_TARGET).join(GUEST_PROFILE)
}
