//! A tool author's path, from where an author stands: `keel wit`, `keel tool new` and the
//! tools guide's "Write your first tool" recipe built outside this workspace with cargo, the
//! component checked and called before it is installed (`inspect --wasm`, `call --wasm`,
//! `--input @FILE` and `-`), then installed and called.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use super::{json_of, keel};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Where the author projects of these tests build: one directory, kept between runs, so the
/// SDK and its dependencies compile once (the projects themselves are outside the workspace).
fn author_target() -> PathBuf {
    repo().join("target").join("authoring")
}

/// Runs cargo in `dir` (a project outside the workspace) as an author would.
fn cargo(dir: &Path, args: &[&str]) {
    let out = Command::new(env!("CARGO"))
        .current_dir(dir)
        .args(args)
        .env("CARGO_TARGET_DIR", author_target())
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo {args:?} in {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn component(lib: &str) -> PathBuf {
    author_target().join("wasm32-wasip2").join("release").join(format!("{lib}.wasm"))
}

fn keel_with_stdin(home: &Path, args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn keel_wit_prints_and_writes_the_tool_contract() {
    let home = tempfile::tempdir().unwrap();
    let out = keel(home.path(), &["wit"]);
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let wit = std::fs::read_to_string(repo().join("wit/tool.wit")).unwrap();
    assert_eq!(printed, wit, "`keel wit` prints the package keel accepts, as it is");
    assert!(printed.contains("package keel:tool@0.1.0;"));

    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("wit");
    let out = keel(home.path(), &["wit", "--out", out_dir.to_str().unwrap(), "--json"]);
    assert!(out.status.success());
    let v = json_of(&out);
    assert_eq!((v["package"].clone(), v["version"].clone()), (json!("keel:tool"), json!("0.1.0")));
    assert_eq!(std::fs::read_to_string(out_dir.join("tool.wit")).unwrap(), wit);
    for dep in ["types", "plan", "capabilities", "sessions"] {
        let path = format!("wit/deps/control/{dep}.wit");
        assert_eq!(
            std::fs::read_to_string(out_dir.join(format!("deps/control/{dep}.wit"))).unwrap(),
            std::fs::read_to_string(repo().join(&path)).unwrap(),
            "{path} is written beside tool.wit"
        );
    }
}

#[test]
fn keel_tool_new_refuses_a_bad_name_a_taken_directory_and_a_wrong_sdk() {
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let at = |n: &str| dir.path().join(n).display().to_string();
    let out = keel(home.path(), &["tool", "new", "Bad Name", "--dir", &at("x"), "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_of(&out)["error"]["kind"], json!("invalid_input"));

    std::fs::create_dir(dir.path().join("taken")).unwrap();
    std::fs::write(dir.path().join("taken/keep.txt"), "mine").unwrap();
    let out = keel(home.path(), &["tool", "new", "taken", "--dir", &at("taken"), "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_of(&out)["error"]["kind"], json!("conflict"));
    assert_eq!(std::fs::read_to_string(dir.path().join("taken/keep.txt")).unwrap(), "mine");

    let out = keel(home.path(), &["tool", "new", "t", "--dir", &at("t"), "--sdk", &at("taken")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no keel-sdk here"));
    assert!(!dir.path().join("t").exists(), "nothing is written for a refused request");

    let out =
        keel(home.path(), &["tool", "new", "t", "--dir", &at("t"), "--sdk-version", "latest"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a version such as 0.1"));
    let out = keel(
        home.path(),
        &["tool", "new", "t", "--lang", "python", "--dir", &at("t"), "--sdk-version", "0.1"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("are for Rust projects"));
    assert!(!dir.path().join("t").exists(), "nothing is written for a refused request");

    // --sdk-version asks the registry for that version, and vendors nothing.
    let out =
        keel(home.path(), &["tool", "new", "reg", "--dir", &at("reg"), "--sdk-version", "0.1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let manifest = std::fs::read_to_string(dir.path().join("reg/Cargo.toml")).unwrap();
    assert!(manifest.contains("keel-sdk = \"0.1\""), "{manifest}");
    assert!(!dir.path().join("reg/vendor").exists());
}

/// The scaffold, built and tested with cargo outside the workspace from the SDK it vendors
/// (nothing of the checkout), checked and called as a file, then installed and called by name;
/// a write-class scaffold (on the checkout's SDK, `--sdk`) declares its effect.
#[test]
fn a_new_tool_project_builds_outside_the_workspace_and_is_called_before_and_after_install() {
    // What this test runs is the README's "Write a tool" block, command for command.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let block = readme
        .split("## 3. Write a tool")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split("\n```").next())
        .expect("the README's tool block");
    assert_eq!(
        block.lines().collect::<Vec<_>>(),
        [
            "keel tool new word-stats",
            "cd word-stats",
            "cargo test",
            "cargo build --release --target wasm32-wasip2",
            r#"keel tool call --wasm target/wasm32-wasip2/release/word_stats.wasm word_stats --input '{"text":"three little words"}'"#,
            "keel tool install target/wasm32-wasip2/release/word_stats.wasm",
        ]
    );
    let home = tempfile::tempdir().unwrap();
    let projects = tempfile::tempdir().unwrap();
    let dir = projects.path().join("word-stats");
    let sdk = repo().join("sdk");
    let out =
        keel(home.path(), &["tool", "new", "word-stats", "--dir", dir.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_of(&out);
    assert_eq!(v["tool"], json!("word_stats"));
    for f in [
        "Cargo.toml",
        "src/lib.rs",
        "README.md",
        "wit/tool.wit",
        ".gitignore",
        "vendor/keel-sdk/Cargo.toml",
        "vendor/keel-sdk/wit/tool.wit",
        "vendor/keel-sdk-macros/src/lib.rs",
    ] {
        assert!(dir.join(f).is_file(), "{f} is written");
    }
    // The project names nothing outside itself: it builds on any machine with Rust.
    let manifests =
        ["Cargo.toml", "vendor/keel-sdk/Cargo.toml", "vendor/keel-sdk-macros/Cargo.toml"]
            .map(|m| std::fs::read_to_string(dir.join(m)).unwrap());
    for m in &manifests {
        assert!(!m.contains(repo().to_str().unwrap()) && !m.contains("workspace = true"), "{m}");
    }
    assert!(
        manifests[0].contains(r#"keel-sdk = { path = "vendor/keel-sdk" }"#),
        "{}",
        manifests[0]
    );
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    assert!(readme.contains("keel tool install target/wasm32-wasip2/release/word_stats.wasm"));

    cargo(&dir, &["test", "--quiet"]);
    cargo(&dir, &["build", "--release", "--target", "wasm32-wasip2", "--quiet"]);
    let wasm = component("word_stats");
    let file = wasm.to_str().unwrap();

    // Checked as install would, nothing installed.
    let out =
        keel(home.path(), &["tool", "inspect", "--wasm", file, "--as", "word-stats", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_of(&out);
    assert_eq!(v["accepted"], json!(true));
    assert_eq!(v["tools"][0]["name"], json!("word_stats"));
    assert_eq!(v["tools"][0]["effect"], json!("read-only"));
    assert_eq!(v["tools"][0]["input_schema"]["properties"]["text"]["type"], json!("string"));
    assert!(v["tools"][0]["output_schema"]["properties"]["words"].is_object());
    assert!(
        v["imports"].as_array().unwrap().iter().any(|i| i
            .as_str()
            .unwrap()
            .starts_with("keel:tool/")
            || i.as_str().unwrap().starts_with("wasi:"))
    );

    // Called as a file: input from a file, then from stdin.
    let input = projects.path().join("input.json");
    std::fs::write(&input, r#"{"text": "one two three"}"#).unwrap();
    let at_input = format!("@{}", input.display());
    let out = keel(
        home.path(),
        &["tool", "call", "--wasm", file, "word_stats", "--input", &at_input, "--json"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_of(&out);
    assert_eq!(v["output"], json!({"words": 3, "characters": 13}));
    assert_eq!(v["compiled_ms"], Value::Null, "the inspect compiled it; the call loads it: {v}");
    let out = keel_with_stdin(
        home.path(),
        &["tool", "call", "--wasm", file, "word_stats", "--input", "-", "--json"],
        r#"{"text": "héllo"}"#,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json_of(&out)["output"], json!({"words": 1, "characters": 5}));
    // The tool's own refusal, and a tool the file does not have.
    let out = keel(
        home.path(),
        &["tool", "call", "--wasm", file, "word_stats", "--input", r#"{"txt": 1}"#, "--json"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stdout));
    let out = keel(home.path(), &["tool", "call", "--wasm", file, "nope", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_of(&out);
    assert_eq!(v["error"]["kind"], json!("not_installed"));
    assert!(v["error"]["message"].as_str().unwrap().contains("its tools: word_stats"), "{v}");
    // Nothing of it reached the catalog.
    let listed = json_of(&keel(home.path(), &["tool", "list", "--json"]));
    assert!(!listed.to_string().contains("word_stats"), "{listed}");

    // Installed as the README says, then called by name.
    let out = keel(home.path(), &["tool", "install", file, "--name", "word-stats", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = keel(
        home.path(),
        &["tool", "call", "word_stats", "--input", r#"{"text": "hello keel"}"#, "--json"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json_of(&out)["output"]["words"], json!(2));

    // The effect flag is the class the tool declares.
    let ext = projects.path().join("notify");
    let out = keel(
        home.path(),
        &[
            "tool",
            "new",
            "notify",
            "--effect",
            "external",
            "--sdk",
            sdk.to_str().unwrap(),
            "--dir",
            ext.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    cargo(&ext, &["build", "--release", "--target", "wasm32-wasip2", "--quiet"]);
    let out = keel(
        home.path(),
        &["tool", "inspect", "--wasm", component("notify").to_str().unwrap(), "--json"],
    );
    let v = json_of(&out);
    assert_eq!(v["tools"][0]["effect"], json!("external"));
    assert_eq!(v["tools"][0]["idempotent"], json!(false));
}

/// `inspect --wasm` says what install would refuse, and why, before anything is installed.
#[test]
fn inspect_wasm_names_what_install_would_refuse() {
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let out = keel(home.path(), &["tool", "inspect", "--wasm", core.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_of(&out);
    assert_eq!(v["accepted"], json!(false));
    assert!(v["refusal"].as_str().unwrap().contains("core WebAssembly module"), "{v}");

    // A component that imports an interface keel does not grant: refused before compiling.
    let vault = keel_tests::guests::VAULT_IMPORT_COMPONENT;
    let out = keel(home.path(), &["tool", "inspect", "--wasm", vault]);
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("install    would refuse it"), "{text}");
    assert!(!text.contains("compile "), "it was not compiled: {text}");

    // A name another component's tool has: refused as a clash, with the tools it describes.
    let effects = keel_tests::guests::EFFECTS_COMPONENT;
    assert!(keel(home.path(), &["tool", "install", effects, "--name", "effects"]).status.success());
    let out = keel(home.path(), &["tool", "inspect", "--wasm", effects, "--as", "other", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_of(&out);
    assert_eq!(v["refusal_kind"], json!("name_clash"));
    assert!(!v["tools"].as_array().unwrap().is_empty());
    let missing = keel(home.path(), &["tool", "inspect", "--wasm", "/definitely/missing.wasm"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("cannot read /definitely/missing.wasm")
    );
}

/// The tools guide's "Write your first tool", as a newcomer runs it: `cargo new`, `cargo add`, the
/// recipe's `src/lib.rs` as written, built for wasm32-wasip2, installed and called.
#[test]
fn the_readme_first_tool_recipe_compiles_as_written_and_runs() {
    let readme = std::fs::read_to_string(repo().join("docs/tools.md")).unwrap();
    let section = readme.split("## Write your first tool").nth(1).expect("the recipe section");
    let lib_rs = section
        .split("`src/lib.rs`:")
        .nth(1)
        .and_then(|s| s.split("```rust\n").nth(1))
        .and_then(|s| s.split("\n```").next())
        .expect("the recipe's src/lib.rs block");
    let projects = tempfile::tempdir().unwrap();
    let sdk = repo().join("sdk");
    cargo(projects.path(), &["new", "--lib", "word_count", "--quiet"]);
    let dir = projects.path().join("word_count");
    cargo(&dir, &["add", "keel-sdk", "--path", sdk.to_str().unwrap(), "--quiet"]);
    cargo(&dir, &["add", "serde", "--features", "derive", "--quiet"]);
    let mut manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    manifest.push_str("\n[lib]\ncrate-type = [\"cdylib\"]\n");
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(dir.join("src/lib.rs"), lib_rs).unwrap();
    cargo(&dir, &["build", "--release", "--target", "wasm32-wasip2", "--quiet"]);

    let home = tempfile::tempdir().unwrap();
    let docs = tempfile::tempdir().unwrap();
    std::fs::write(docs.path().join("notes.md"), "three little words").unwrap();
    let wasm = component("word_count");
    let out = keel(home.path(), &["tool", "install", wasm.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let grant = format!("{}=/data", docs.path().display());
    let out = keel(
        home.path(),
        &[
            "tool",
            "call",
            "word_count",
            "--grant",
            &grant,
            "--input",
            r#"{"path":"/data/notes.md"}"#,
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json_of(&out)["output"], json!({"words": 3}));
}

/// keel-sdk is ready to publish: packaged with its derive macros (published together, the
/// macros first), the WIT contract inside the package, and the packaged crates build.
#[test]
fn the_sdk_packages_with_its_macros_and_the_wit_contract() {
    let target = author_target().join("package");
    let out = Command::new(env!("CARGO"))
        .current_dir(repo())
        .args(["package", "-p", "keel-sdk-macros", "-p", "keel-sdk", "--allow-dirty", "--quiet"])
        .arg("--target-dir")
        .arg(&target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo package failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = Command::new("tar")
        .arg("tzf")
        .arg(target.join("package").join("keel-sdk-0.1.0.crate"))
        .output()
        .unwrap();
    let files = String::from_utf8_lossy(&listed.stdout);
    for f in
        ["keel-sdk-0.1.0/wit/tool.wit", "keel-sdk-0.1.0/README.md", "keel-sdk-0.1.0/src/lib.rs"]
    {
        assert!(files.lines().any(|l| l == f), "{f} is in the package: {files}");
    }
}

/// The toolchains of the examples (`examples/build.sh` installs them under
/// `target/examples-toolchains` on first use, pinned as the scaffolds pin them).
fn example_toolchains() -> PathBuf {
    let tools = repo().join("target").join("examples-toolchains");
    let ready = tools.join("venv/bin/componentize-py").exists()
        && tools.join("js/node_modules/@bytecodealliance/componentize-js").is_dir();
    if !ready {
        let out = tempfile::tempdir().unwrap();
        let status =
            Command::new(repo().join("examples/build.sh")).arg(out.path()).status().unwrap();
        assert!(status.success(), "examples/build.sh failed: {status}");
    }
    tools
}

fn run_in(dir: &Path, program: &str, args: &[&str], env: &[(&str, &Path)]) {
    let mut cmd = Command::new(program);
    cmd.current_dir(dir).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} in {} failed:\n{}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `keel tool new --lang python` and `--lang js`, tested and built with their pinned
/// toolchains as the projects' READMEs say, then installed and called.
#[test]
#[ignore = "scaffolds tier: builds Python and JavaScript components (componentize-py, componentize-js)"]
fn scaffolds_in_python_and_javascript_build_install_and_run() {
    let tools = example_toolchains();
    let home = tempfile::tempdir().unwrap();
    let projects = tempfile::tempdir().unwrap();

    let py = projects.path().join("py-count");
    let out = keel(
        home.path(),
        &["tool", "new", "py-count", "--lang", "python", "--dir", py.to_str().unwrap(), "--json"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json_of(&out)["lang"], json!("python"));
    let pinned =
        std::fs::read_to_string(repo().join("examples/python-tool/requirements.txt")).unwrap();
    assert_eq!(std::fs::read_to_string(py.join("requirements.txt")).unwrap(), pinned);
    run_in(&py, "python3", &["-m", "unittest", "--quiet"], &[]);
    let componentize = tools.join("venv/bin/componentize-py");
    run_in(&py, "./build.sh", &[], &[("COMPONENTIZE_PY", &componentize)]);

    let js = projects.path().join("js-count");
    let out = keel(
        home.path(),
        &[
            "tool",
            "new",
            "js-count",
            "--lang",
            "js",
            "--effect",
            "external",
            "--dir",
            js.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::os::unix::fs::symlink(tools.join("js/node_modules"), js.join("node_modules")).unwrap();
    run_in(&js, "npm", &["test", "--silent"], &[]);
    run_in(&js, "npm", &["run", "build", "--silent"], &[]);

    for (dir, file, name, tool, effect) in [
        (&py, "py_count.wasm", "py-count", "py_count", "read-only"),
        (&js, "js_count.wasm", "js-count", "js_count", "external"),
    ] {
        // The project's two cases pass in the sandbox, from its directory.
        let out = keel_in(home.path(), dir, &["tool", "test", "--json"]);
        assert!(out.status.success(), "{tool}: {}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(json_of(&out)["passed"], json!(2), "{tool}");
        // Installed under the name and version the build wrote into it (no --name).
        let wasm = dir.join(file);
        let out = keel(home.path(), &["tool", "install", wasm.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let installed = json_of(&out)["install"]["component"].clone();
        assert_eq!(
            (installed["name"].clone(), installed["version"].clone()),
            (json!(name), json!("0.1.0"))
        );
        let v = json_of(&keel(home.path(), &["tool", "inspect", tool, "--json"]));
        assert_eq!(v["tools"][0]["effect"], json!(effect));
        // The schemas came from the annotations (Python) and the JSDoc (JavaScript).
        let text = &v["tools"][0]["input_schema"]["properties"]["text"];
        assert_eq!(text["description"], json!("The text to count."), "{tool}: {v}");
        assert_eq!(v["tools"][0]["input_schema"]["required"], json!(["text"]), "{tool}");
        assert_eq!(
            v["tools"][0]["output_schema"]["properties"]["words"]["type"],
            json!("integer"),
            "{tool}"
        );
        assert_eq!(
            v["tools"][0]["description"],
            json!("Counts the words and characters of a text.")
        );
        let out = keel(
            home.path(),
            &["tool", "call", tool, "--input", r#"{"text": "one two three"}"#, "--json"],
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(json_of(&out)["output"], json!({"words": 3, "characters": 13}), "{tool}");
        let out = keel(home.path(), &["tool", "call", tool, "--input", r#"{"text": 7}"#, "--json"]);
        assert_eq!(out.status.code(), Some(2), "{tool}: the input schema refuses it");
        let message = json_of(&out)["error"]["message"].as_str().unwrap().to_string();
        assert!(message.contains("text"), "{tool}: {message}");
    }
}

/// keel in `dir` (a project outside the workspace), its cargo builds sharing this file's
/// target directory.
fn keel_command(home: &Path, dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_keel"));
    c.current_dir(dir)
        .arg("--home")
        .arg(home)
        .args(args)
        .env("CARGO_TARGET_DIR", author_target())
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    c
}

/// [`keel_command`], run to its end.
fn keel_in(home: &Path, dir: &Path, args: &[&str]) -> std::process::Output {
    keel_command(home, dir, args).output().unwrap()
}

/// A new Rust project `name` made by `keel tool new` in `projects`: its directory.
fn new_project(home: &Path, projects: &Path, name: &str) -> PathBuf {
    let dir = projects.join(name);
    let out = keel(home, &["tool", "new", name, "--dir", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("keel tool test"));
    dir
}

/// The author's loop from the project directory: `keel tool test` runs the scaffold's two
/// cases (green, then red ones), and the component is installed under the name and version it
/// carries — one name rule for install and inspect.
#[test]
fn tool_test_runs_a_new_projects_cases_and_install_takes_the_name_it_carries() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let projects = tempfile::tempdir().unwrap();
    let dir = new_project(h, projects.path(), "t-dev");

    // Not built yet (the shared target directory may hold an earlier run's): the error names
    // the build command.
    let _ = std::fs::remove_file(component("t_dev"));
    let out = keel_in(h, &dir, &["tool", "test", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let message = json_of(&out)["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("cargo build --release --target wasm32-wasip2"), "{message}");

    // Built with the project's own command, then its two cases pass in the sandbox.
    let out = keel_in(h, &dir, &["tool", "test", "--build", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_of(&out);
    assert_eq!((v["passed"].clone(), v["failed"].clone()), (json!(2), json!(0)), "{v}");
    let names: Vec<&str> =
        v["cases"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["counts_words", "refuses_a_missing_text"]);
    assert_eq!(v["cases"][0]["result"]["output"], json!({"words": 2, "characters": 9}));
    assert_eq!(v["cases"][1]["result"]["error"]["kind"], json!("invalid_input"));

    // Red: a wrong output, an error that did not come, each named with why.
    let tests = dir.join("tests");
    std::fs::write(
        tests.join("wrong_count.json"),
        r#"{"input": {"text": "two words"}, "output": {"words": 3}}"#,
    )
    .unwrap();
    std::fs::write(
        tests.join("wants_an_error.json"),
        r#"{"input": {"text": "x"}, "error": "invalid_input"}"#,
    )
    .unwrap();
    let out = keel_in(h, &dir, &["tool", "test", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    let v = json_of(&out);
    assert_eq!((v["passed"].clone(), v["failed"].clone()), (json!(2), json!(2)), "{v}");
    let problem = |name: &str| {
        let c = v["cases"].as_array().unwrap().iter().find(|c| c["name"] == json!(name)).unwrap();
        c["problem"].as_str().unwrap_or("").to_string()
    };
    assert!(problem("wrong_count").contains(r#"expected output {"words":3}"#), "{v}");
    assert!(problem("wants_an_error").contains("expected error invalid_input, got output"), "{v}");
    let out = keel_in(h, &dir, &["tool", "test"]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("FAIL  wrong_count") && shown.contains("2 passed, 2 failed"), "{shown}");
    // A case file with a typo is refused, naming the field.
    std::fs::remove_file(tests.join("wants_an_error.json")).unwrap();
    std::fs::write(tests.join("wrong_count.json"), r#"{"inputs": {}}"#).unwrap();
    let out = keel_in(h, &dir, &["tool", "test", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(json_of(&out)["error"]["message"].as_str().unwrap().contains("unknown field `inputs`"));
    std::fs::remove_file(tests.join("wrong_count.json")).unwrap();

    // What the last save of `keel tool dev` left is not this test's (see the scaffolds tier).
    // Installed under the name and version the component carries (no --name).
    let wasm = component("t_dev");
    let out = keel(h, &["tool", "install", wasm.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(json_of(&out)["install"]["component"]["name"], json!("t-dev"));
    let listed = json_of(&keel(h, &["tool", "list", "--json"]));
    let row = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["component"] == json!("t-dev"))
        .unwrap()
        .clone();
    assert_eq!(row["version"], json!("0.1.0"), "{listed}");
    // Other bytes of it, in a versioned file name: inspect and install say the same thing.
    let lib = dir.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap();
    let changed = source.replace("split_whitespace().count()", "split_whitespace().count() * 10");
    assert_ne!(changed, source);
    std::fs::write(&lib, changed).unwrap();
    cargo(&dir, &["build", "--release", "--target", "wasm32-wasip2", "--quiet"]);
    let versioned = projects.path().join("t_dev-0.2.0.wasm");
    std::fs::copy(&wasm, &versioned).unwrap();
    let file = versioned.to_str().unwrap();
    let inspected = json_of(&keel(h, &["tool", "inspect", "--wasm", file, "--json"]));
    assert_eq!(inspected["name"], json!("t-dev"), "{inspected}");
    assert_eq!(inspected["carried"], json!({"name": "t-dev", "version": "0.1.0"}), "{inspected}");
    assert_eq!(inspected["refusal_kind"], json!("already_installed"), "{inspected}");
    let out = keel(h, &["tool", "install", file, "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let refused = json_of(&out)["error"].clone();
    assert_eq!(refused["kind"], inspected["refusal_kind"]);
    assert_eq!(refused["message"], inspected["refusal"]);
    assert!(refused["message"].as_str().unwrap().contains("--upgrade"), "{refused}");
}

/// `keel tool dev` on a new project: a call at start, another after each save (rebuilt with
/// cargo) and each input typed on its stdin, and a failed build reported. In the scaffolds
/// tier: it times cargo builds, which the default tier's parallel tests slow down.
#[test]
#[ignore = "scaffolds tier: times cargo builds of a project while it is watched"]
fn scaffolds_tool_dev_rebuilds_on_each_save_and_calls_again() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let projects = tempfile::tempdir().unwrap();
    let dir = new_project(h, projects.path(), "t-watch");
    // tool dev: a call at start, another after each save and each input typed on stdin.
    let mut child =
        keel_command(h, &dir, &["tool", "dev", "--json", "--input", r#"{"text": "a b c"}"#])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel::<Value>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(serde_json::from_str(&line).unwrap_or(Value::String(line)));
        }
    });
    let next = |after: &str| {
        lines
            .recv_timeout(std::time::Duration::from_secs(300))
            .unwrap_or_else(|e| panic!("tool dev printed nothing after {after}: {e}"))
    };
    let first = next("starting");
    assert_eq!(
        (first["event"].clone(), first["trigger"].clone()),
        (json!("call"), json!("start")),
        "{first}"
    );
    assert_eq!(first["call"]["output"]["words"], json!(3), "{first}");
    let lib = dir.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap();
    let tenfold = source.replace(
        "words: input.text.split_whitespace().count()",
        "words: input.text.split_whitespace().count() * 10",
    );
    assert_ne!(tenfold, source, "the scaffold's count is where this test changes it");
    std::fs::write(&lib, &tenfold).unwrap();
    let changed = next("a save");
    assert_eq!(changed["trigger"], json!("change"), "{changed}");
    assert_eq!(changed["changed"], json!(["src/lib.rs"]), "{changed}");
    assert_eq!(changed["call"]["output"]["words"], json!(30), "{changed}");
    let edit_to_output = changed["edit_to_output_ms"].as_f64().unwrap();
    let build = changed["build_ms"].as_f64().unwrap();
    assert!(edit_to_output >= build, "{changed}");
    eprintln!(
        "tool dev, Rust scaffold: edit → output {edit_to_output:.0} ms (build {build:.0} ms)"
    );
    writeln!(stdin, r#"{{"text": "one"}}"#).unwrap();
    let typed = next("an input on stdin");
    assert_eq!(typed["trigger"], json!("input"), "{typed}");
    assert_eq!(typed["build_ms"], Value::Null, "an input calls the last build: {typed}");
    assert_eq!(typed["call"]["output"]["words"], json!(10), "{typed}");
    std::fs::write(&lib, "this is not Rust").unwrap();
    let broken = next("a broken save");
    assert_eq!(
        (broken["event"].clone(), broken["kind"].clone()),
        (json!("failed"), json!("build_failed")),
        "{broken}"
    );
    // Mended: the last input again (one word, ten times over).
    std::fs::write(&lib, &tenfold).unwrap();
    assert_eq!(next("the mended save")["call"]["output"]["words"], json!(10));
    let _ = child.kill();
    let _ = child.wait();
}
