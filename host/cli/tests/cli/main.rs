//! The `keel` command end to end: real binary, real home directory, first-party tools.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::{Value, json};

mod abuse;
mod author;
mod boundaries;
mod console;
mod docs;
mod fork;
mod hostile_registry;
mod hosts;
mod mcp;
mod net;
mod reach;
mod registry;
mod resume;
mod run;
mod serve;
mod setup;
mod signing;
mod skills;
mod telemetry;
mod terminal;
mod undo;
mod workgroup;

fn keel(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel")).arg("--home").arg(home).args(args).output().unwrap()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("stdout is not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout))
    })
}

/// Whether the suite runs on PostgreSQL (`with-postgres`: every home a database of its own).
fn on_postgres() -> bool {
    std::env::var_os("KEEL_TEST_POSTGRES").is_some_and(|v| !v.is_empty())
}

/// The name of the admin token `keel serve` makes for itself: on a shared store (the suite on
/// PostgreSQL) it carries the host's name, as every host's does.
fn serve_token_name() -> String {
    if !on_postgres() {
        return "keel-serve".into();
    }
    let host =
        std::env::var("KEEL_HOST_ID").ok().filter(|h| !h.trim().is_empty()).unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string()
        });
    format!("keel-serve@{host}")
}

fn data_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data").display().to_string()
}

#[test]
fn quick_start_call_on_a_granted_directory() {
    let home = tempfile::tempdir().unwrap();
    let grant = format!("{}=/data:ro", data_dir());
    let input = r#"{"path":"/data/orders.csv","expected_columns":7}"#;
    let out = keel(
        home.path(),
        &["tool", "call", "csv_inspect", "--grant", &grant, "--input", input, "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_of(&out);
    assert_eq!(v["ok"], json!(true));
    assert_eq!(
        v["output"]["ragged_rows"],
        json!([{"line": 4, "columns": 6}, {"line": 6, "columns": 8}])
    );
    assert_eq!(v["error"], Value::Null);
    // The first-party tools were installed on first use, with progress on stderr.
    assert!(String::from_utf8_lossy(&out.stderr).contains("installing first-party tool component"));
    // A second run reuses the compiled artifacts: no install step.
    let out =
        keel(home.path(), &["tool", "call", "csv_inspect", "--grant", &grant, "--input", input]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("installing"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"ragged_count\": 2"));
}

#[test]
fn list_inspect_remove() {
    let home = tempfile::tempdir().unwrap();
    let out = keel(home.path(), &["tool", "list", "--json"]);
    let names: Vec<String> = json_of(&out)
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "csv_inspect",
            "fs_delete_files",
            "fs_list_dir",
            "fs_read_file",
            "fs_search",
            "fs_write_file",
            "http_fetch",
            "memory_find",
            "memory_write",
            "plan_create",
            "plan_update",
            "session_ask",
            "session_interrupt",
            "session_send",
            "session_spawn",
            "session_status",
            "skills_find",
            "skills_load",
            "task_complete",
            "tools_find",
            "tools_select"
        ]
    );
    // keel's control tools read as `control`, not as the read-only class they are run under.
    let out = keel(home.path(), &["tool", "list", "--json"]);
    let control: Vec<bool> =
        json_of(&out).as_array().unwrap().iter().map(|t| t["control"] == true).collect();
    assert_eq!(control.iter().filter(|c| **c).count(), 14, "{control:?}");
    let out = keel(home.path(), &["tool", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |name: &str| text.lines().find(|l| l.starts_with(name)).unwrap().to_string();
    assert!(line("plan_create ").split_whitespace().nth(3) == Some("control"), "{text}");
    assert!(line("fs_read_file ").split_whitespace().nth(3) == Some("read-only"), "{text}");
    assert!(line("fs_read_file ").split_whitespace().nth(2) == Some("0.1.0"), "{text}");
    // Dates, not epoch seconds.
    let out = keel(home.path(), &["tool", "inspect", "plan_create"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let installed = text.lines().find(|l| l.starts_with("installed ")).unwrap();
    assert!(installed.contains(".000Z (") && installed.ends_with(')'), "{installed}");
    assert!(
        installed.split_whitespace().nth(1).is_some_and(|d| d.starts_with("20")),
        "{installed}"
    );
    assert!(text.contains("effect      control"), "{text}");
    let out = keel(home.path(), &["tool", "inspect", "fs_delete_files", "--json"]);
    let v = json_of(&out);
    assert_eq!(v["tools"][0]["effect"], json!("destructive"));
    assert_eq!(v["tools"][0]["input_schema"]["required"], json!(["paths"]));
    assert_eq!(v["component"]["builtin"], json!(true));
    let out = keel(home.path(), &["tool", "remove", "fs", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_of(&out)["error"]["kind"], json!("builtin"));
    let out = keel(home.path(), &["tool", "inspect", "nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tool or component named `nope`"));
}

#[test]
fn errors_are_typed_and_exit_codes_distinguish_them() {
    let home = tempfile::tempdir().unwrap();
    let grant = format!("{}=/data:ro", data_dir());
    // The tool ran and failed: exit 1, typed error.
    let out = keel(
        home.path(),
        &[
            "tool",
            "call",
            "fs_read_file",
            "--grant",
            &grant,
            "--input",
            r#"{"path":"/data/none.txt"}"#,
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_of(&out)["error"]["kind"], json!("not_found"));
    // Refused before running: exit 2, the error names the field.
    let out =
        keel(home.path(), &["tool", "call", "fs_read_file", "--input", r#"{"path":1}"#, "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_of(&out);
    assert_eq!(v["error"]["kind"], json!("invalid_input"));
    assert!(v["error"]["message"].as_str().unwrap().contains("field `/path`"));
    // A model URL that cannot work is refused before a session is created.
    for url in ["notaurl", "ftp://127.0.0.1/v1"] {
        let out =
            keel(home.path(), &["run", "hello", "--model-url", url, "--model", "m", "--json"]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let v = json_of(&out);
        assert_eq!(v["error"]["kind"], json!("config"));
        assert!(v["error"]["message"].as_str().unwrap().contains(url), "{v}");
    }
    let list = keel(home.path(), &["session", "list", "--json"]);
    assert_eq!(json_of(&list), json!([]), "no session was created");
    // An empty task or message is refused.
    let out = keel(home.path(), &["run", "  ", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(json_of(&out)["error"]["kind"], json!("input"));
    let out = keel(home.path(), &["session", "send", "any", "", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(json_of(&out)["error"]["message"].as_str().unwrap().contains("empty"));
    // So is a turn's step limit: at least one model call.
    let out = keel(home.path(), &["run", "hello", "--max-steps", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--max-steps"), "{out:?}");
    // Budget flags are validated by the parser.
    let out = keel(home.path(), &["tool", "call", "fs_read_file", "--timeout", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a duration"));
    let out =
        keel(home.path(), &["tool", "call", "fs_read_file", "--grant", "/definitely/missing=/m"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used"));
    // A write into a read-only grant is denied, and the message says so.
    let out = keel(
        home.path(),
        &[
            "tool",
            "call",
            "fs_write_file",
            "--grant",
            &grant,
            "--input",
            r#"{"path":"/data/x.txt","content":"x"}"#,
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("error (denied)"));
    // A budget stops a call: exit 1, `fuel_exhausted`.
    let out = keel(
        home.path(),
        &[
            "tool",
            "call",
            "fs_search",
            "--grant",
            &grant,
            "--input",
            r#"{"path":"/data","pattern":"x"}"#,
            "--fuel",
            "1000",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_of(&out)["error"]["kind"], json!("fuel_exhausted"));
}

#[test]
fn install_refuses_what_is_not_a_component() {
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let out = keel(home.path(), &["tool", "install", core.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_of(&out);
    assert_eq!(v["error"]["kind"], json!("load"));
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("core WebAssembly module, not a component")
    );
    let out = keel(home.path(), &["tool", "install", "/definitely/missing.wasm"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /definitely/missing.wasm"));
}

#[test]
fn write_calls_print_their_change_set() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let grant = format!("{}=/w:rw", ws.path().display());
    let out = keel(
        home.path(),
        &[
            "tool",
            "call",
            "fs_write_file",
            "--grant",
            &grant,
            "--input",
            r#"{"path":"/w/out.md","content":"\u001b[31mred"}"#,
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    let v = json_of(&out);
    assert_eq!(v["changes"]["created"][0]["path"], json!("/w/out.md"));
    assert_eq!(v["changes"]["created"][0]["size"], json!(8));
    assert_eq!(std::fs::read(ws.path().join("out.md")).unwrap(), b"\x1b[31mred");
    // Text mode renders control characters inert.
    let out = keel(
        home.path(),
        &["tool", "call", "fs_read_file", "--grant", &grant, "--input", r#"{"path":"/w/out.md"}"#],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains('\x1b') && stdout.contains("\\u001b[31mred"), "{stdout}");
}

#[test]
fn a_bad_synchronous_mode_in_the_environment_stops_every_command_before_it_opens_the_store() {
    let home = tempfile::tempdir().unwrap();
    let run = |args: &[&str], sync: &str| {
        Command::new(env!("CARGO_BIN_EXE_keel"))
            .env("KEEL_SYNCHRONOUS", sync)
            .arg("--home")
            .arg(home.path())
            .args(args)
            .output()
            .unwrap()
    };
    for args in [&["session", "list", "--json"][..], &["tool", "list", "--json"][..]] {
        let out = run(args, "fsync-sometimes");
        assert_eq!(out.status.code(), Some(3), "{args:?}: {out:?}");
        let v = json_of(&out);
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("KEEL_SYNCHRONOUS") && message.contains("`fsync-sometimes`"),
            "{v}"
        );
        assert!(message.contains("full") && message.contains("normal") && message.contains("off"));
    }
    assert!(!home.path().join("keel.db").exists());
    // A valid mode (any case) works.
    let out = run(&["session", "list", "--json"], "NORMAL");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// True when `text` holds a raw control character other than a newline, or a bidi override
/// or zero-width character.
fn has_raw_controls(text: &str) -> bool {
    text.chars().any(|c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

#[test]
fn h3_tool_text_is_inert_on_every_terminal_path_one_line_per_field() {
    let home = tempfile::tempdir().unwrap();
    // A failing describe's stderr, quoted in the install error.
    let out = keel(home.path(), &["tool", "install", keel_tests::guests::FORGER_INSTALL_COMPONENT]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!has_raw_controls(&stderr), "{stderr:?}");
    assert!(!stderr.lines().any(|l| l.starts_with("installed")), "{stderr}");
    assert!(stderr.contains("\\u{1b}]0;owned"), "{stderr}");
    // A description with a newline, a fake row, bidi and zero-width characters.
    let out = keel(home.path(), &["tool", "install", keel_tests::guests::FORGER_COMPONENT]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!has_raw_controls(&stdout), "{stdout:?}");
    assert_eq!(stdout.lines().filter(|l| l.contains("forged_row")).count(), 1, "{stdout}");
    let out = keel(home.path(), &["tool", "list"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!has_raw_controls(&stdout), "{stdout:?}");
    assert!(!stdout.lines().any(|l| l.starts_with("forged_row")), "{stdout}");
    let line = stdout.lines().find(|l| l.starts_with("forge ")).unwrap();
    assert!(line.contains("Harmless.\\u{a}forged_row") && line.contains("\\u{202e}"), "{line}");
    let out = keel(home.path(), &["tool", "inspect", "forge"]);
    assert!(!has_raw_controls(&String::from_utf8_lossy(&out.stdout)));
    // Logs, stderr, stdout and progress: inert and visibly the tool's.
    let out = keel(home.path(), &["tool", "call", "forge"]);
    assert_eq!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!has_raw_controls(&stderr), "{stderr:?}");
    for l in stderr.lines().filter(|l| l.contains("installed component")) {
        assert!(
            l.starts_with("tool stderr │ ")
                || l.starts_with("tool stdout │ ")
                || l.starts_with("tool log [info] │ ")
                || l.starts_with("keel: last progress 1/2: \\u{1b}[31m"),
            "a tool line passes for keel's: {l:?}"
        );
    }
    assert!(stderr.contains("more log records of the tool were dropped"), "{stderr}");
    // --json keeps the exact text, and says what was dropped and the last progress.
    let v = json_of(&keel(home.path(), &["tool", "call", "forge", "--json"]));
    assert_eq!(v["dropped_logs"], json!(1200 - keel::sandbox::MAX_LOG_RECORDS));
    assert_eq!(
        v["logs"][0]["message"],
        json!("keel: installed component `fs` (verified, first-party)\n\u{1b}[1A line 0")
    );
    assert_eq!(
        v["progress"],
        json!({"done": 1, "total": 2, "message": "\u{1b}[31mkeel: installed component `fs` (verified, first-party)\u{202e}"})
    );
    assert_eq!(v["fs"]["denied"], json!([]));
}

/// A reader that goes away (`keel session list | head`) ends the command quietly: no panic,
/// the shell's SIGPIPE status.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let home = tempfile::tempdir().unwrap();
    assert!(keel(home.path(), &["tool", "list"]).status.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home.path())
        .args(["tool", "list"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(141), "{err}");
}
