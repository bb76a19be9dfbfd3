//! The README's quick starts, run as a newcomer copies them: each `sh` block through `sh`, with
//! `keel` on the `PATH` as `cargo install` puts it, from the repository's root. (Every `keel`
//! command line of the README and the guides is also parsed by the binary's own tests.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use keel_tests::mock_model::{MockModel, Reply};
use serde_json::json;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The text of the README section whose heading starts with `heading`.
fn section(readme: &str, heading: &str) -> String {
    let start = readme.find(&format!("\n## {heading}")).expect(heading);
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end].to_string()
}

/// The `sh` blocks of a text, in order.
fn sh_blocks(text: &str) -> Vec<String> {
    text.split("```sh\n").skip(1).map(|b| b.split("\n```").next().unwrap().to_string()).collect()
}

/// A directory holding `keel` (the binary under test), to put first on the `PATH`.
fn bin_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_keel"), dir.path().join("keel")).unwrap();
    dir
}

/// Runs `script` with `sh -e` in `cwd`, `keel` on the `PATH`, the keel home `home`.
fn sh(script: &str, cwd: &Path, bin: &Path, home: &Path, env: &[(&str, &str)]) -> Output {
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new("sh");
    cmd.arg("-ec").arg(script).current_dir(cwd).env("PATH", path).env("KEEL_HOME", home);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn shown(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Quick start 1, the sandbox: the calls run; the refused one fails as its comment says.
#[test]
fn readme_quick_start_1_the_sandbox_runs_as_written() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let blocks = sh_blocks(&section(&readme, "1. "));
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    let bin = bin_dir();
    let home = tempfile::tempdir().unwrap();
    let out = sh(&blocks[0], &repo(), bin.path(), home.path(), &[]);
    assert!(out.status.success(), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("csv_inspect"), "{stdout}");
    // The second block's command fails, with the error its comment shows.
    let (command, expected) = blocks[1].split_once("\n# error: … ").unwrap();
    let out = sh(command, &repo(), bin.path(), home.path(), &[]);
    assert!(!out.status.success(), "{}", shown(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains(expected.trim()), "{}", shown(&out));
}

/// Quick start 2, an agent turn with one approval, against the scripted server standing in
/// for the local model (the block's `export` lines name a real one): the turn stops before
/// the write and says how to decide; the write's diff is there to review.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_quick_start_2_an_agent_turn_stops_for_its_approval() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "csv_inspect", r#"{"path":"/data/orders.csv"}"#)]),
        Reply::calls(&[(
            "c2",
            "fs_write_file",
            &json!({"path": "/out/report.md", "content": "# problems\n- row 4\n"}).to_string(),
        )]),
    ])
    .await;
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let blocks = sh_blocks(&section(&readme, "2. "));
    let script: String = blocks[0]
        .lines()
        .filter(|l| !l.trim_start().starts_with("export ") && !l.trim_start().starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(script.contains("keel run"), "{script}");
    let bin = bin_dir();
    let home = tempfile::tempdir().unwrap();
    let url = model.url();
    let repo = repo();
    let (out, home) = tokio::task::spawn_blocking(move || {
        let env = [("KEEL_MODEL_URL", url.as_str()), ("KEEL_MODEL", "m")];
        (sh(&script, &repo, bin.path(), home.path(), &env), home)
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(4), "waits for approval: {}", shown(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("✓ csv_inspect /data/orders.csv"), "{err}");
    assert!(err.contains("⏸ fs_write_file /out/report.md (19 bytes) needs approval"), "{err}");
    let list = super::keel(home.path(), &["approvals"]);
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("change    writes 19B to /out/report.md"), "{text}");
    assert!(text.contains("│ # problems"), "{text}");
}

/// Quick start 3, a tool: `keel tool new`, its test, the component built and called by its
/// file, then installed — in a directory outside the repository, with `./sdk` the checkout's.
#[test]
fn readme_quick_start_3_a_new_tool_builds_runs_and_installs() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let blocks = sh_blocks(&section(&readme, "3. "));
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(repo().join("sdk"), work.path().join("sdk")).unwrap();
    let bin = bin_dir();
    let home = tempfile::tempdir().unwrap();
    let out = sh(&blocks[0], work.path(), bin.path(), home.path(), &[]);
    assert!(out.status.success(), "{}", shown(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\"words\": 3") || stdout.contains("\"words\":3"), "{stdout}");
    let listed = super::keel(home.path(), &["tool", "list", "--json"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("word_stats"), "{}", shown(&listed));
}
