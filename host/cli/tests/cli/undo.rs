//! Undo through the binary: a session writes, creates, deletes and edits files in its grant;
//! `keel session rewind` puts them back as they were at each step (compared by digest), says
//! what it would do with diffs in a dry run, leaves a file edited outside keel alone unless
//! forced, and lists what it cannot undo.

use std::path::Path;

use keel_tests::mock_model::{MockModel, Reply};
use serde_json::{Value, json};

use super::{json_of, keel};

fn sha(path: &Path) -> Option<String> {
    std::fs::read(path).ok().map(|b| keel::digest::sha256_hex(&b))
}

fn write(path: &str, content: &str) -> String {
    json!({"path": path, "content": content}).to_string()
}

fn rewind(home: &Path, id: &str, to: i64, extra: &[&str]) -> (Option<i32>, Value) {
    let to = to.to_string();
    let mut args = vec!["session", "rewind", id, "--to", &to, "--json"];
    args.extend(extra);
    let out = keel(home, &args);
    (out.status.code(), json_of(&out))
}

/// Runs `task` as the new session `id` on the model at `url`, granted `grant`: it must end
/// with an answer.
fn run_session(home: &Path, id: &str, task: &str, url: &str, grant: &str, extra: &[&str]) {
    let mut args = vec![
        "run",
        task,
        "--new-session",
        id,
        "--model-url",
        url,
        "--model",
        "m",
        "--grant",
        grant,
    ];
    args.extend(extra);
    args.push("--json");
    let out = keel(home, &args);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

fn outcome<'a>(v: &'a Value, path: &str) -> &'a str {
    v["rewind"]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["path"] == path)
        .and_then(|p| p["outcome"].as_str())
        .unwrap_or_else(|| panic!("{path} is not in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewind_puts_files_back_as_they_were_at_each_step() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "fs_write_file", &write("/w/a.txt", "two\n"))]),
        Reply::calls(&[("c2", "fs_write_file", &write("/w/new/c.txt", "sea\n"))]),
        Reply::calls(&[("c3", "fs_delete_files", &json!({"paths": ["/w/b.txt"]}).to_string())]),
        Reply::calls(&[("c4", "fs_write_file", &write("/w/a.txt", "three\n"))]),
        Reply::text("done"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    std::fs::write(w.join("a.txt"), "one\n").unwrap();
    std::fs::write(w.join("b.txt"), "bee\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(w.join("b.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let grant = format!("{}=/w:rw", w.display());
    let url = model.url();
    run_session(home.path(), "u", "tidy the notes", &url, &grant, &["--allow", "fs_delete_files"]);
    // What each step left, for the digests a rewind must give back.
    let one = keel::digest::sha256_hex(b"one\n");
    let two = keel::digest::sha256_hex(b"two\n");
    let bee = keel::digest::sha256_hex(b"bee\n");
    assert_eq!(std::fs::read_to_string(w.join("a.txt")).unwrap(), "three\n");
    assert!(!w.join("b.txt").exists() && w.join("new/c.txt").exists());
    // The journal says what each change replaced.
    let calls = json_of(&keel(home.path(), &["session", "show", "u", "--json"]));
    let changes: Vec<Value> = calls["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["changes"].as_str().map(|t| serde_json::from_str(t).unwrap()))
        .collect();
    assert_eq!(changes[0]["modified"][0]["before_sha256"], one.as_str(), "{changes:?}");
    assert_eq!(changes[2]["deleted"][0]["before_sha256"], bee.as_str(), "{changes:?}");
    assert_eq!(changes[2]["deleted"][0]["before_mode"], 0o600);

    // A dry run says what would change, with the diff, and writes nothing.
    let (code, v) = rewind(home.path(), "u", 3, &["--dry-run"]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(outcome(&v, "/w/a.txt"), "would");
    let diff = v["rewind"]["paths"][0]["diff"].as_str().unwrap();
    assert!(diff.contains("-three") && diff.contains("+two"), "{diff}");
    assert_eq!(std::fs::read_to_string(w.join("a.txt")).unwrap(), "three\n");

    // To step 3: the last edit is undone.
    let (code, v) = rewind(home.path(), "u", 3, &[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(sha(&w.join("a.txt")), Some(two.clone()));
    // To step 2: the deleted file is back, with its mode.
    let (code, v) = rewind(home.path(), "u", 2, &[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(outcome(&v, "/w/b.txt"), "done");
    assert_eq!(sha(&w.join("b.txt")), Some(bee.clone()));
    let mode = std::fs::metadata(w.join("b.txt")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(sha(&w.join("a.txt")), Some(two.clone()), "a.txt as it was at step 2");

    // Someone edits c.txt outside keel: rewinding to step 0 leaves it, a conflict (exit 1);
    // the rest goes back.
    std::fs::write(w.join("new/c.txt"), "mine\n").unwrap();
    let (code, v) = rewind(home.path(), "u", 0, &[]);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(outcome(&v, "/w/new/c.txt"), "conflict");
    assert_eq!(std::fs::read_to_string(w.join("new/c.txt")).unwrap(), "mine\n");
    assert_eq!(sha(&w.join("a.txt")), Some(one.clone()));
    assert_eq!(outcome(&v, "/w/b.txt"), "already");
    // Forced, it is removed too; then everything is as it was before the first call.
    let (code, v) = rewind(home.path(), "u", 0, &["--force-path", "/w/new/c.txt"]);
    assert_eq!(code, Some(0), "{v}");
    assert!(!w.join("new/c.txt").exists());
    let mut names: Vec<String> = std::fs::read_dir(w)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt", "b.txt"], "the directory the session made is gone too");

    // Each rewind is recorded with who made it.
    let events = keel(home.path(), &["session", "events", "u"]);
    let text = String::from_utf8_lossy(&events.stdout);
    assert_eq!(text.matches("rewind to step").count(), 4, "{text}");
    assert!(text.contains("rewound to step 0"), "{text}");
    // A step past the last, or a session that does not exist: clear refusals.
    let (code, v) = rewind(home.path(), "u", 99, &[]);
    assert_eq!(code, Some(2), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("past its last"), "{v}");
    let (code, _) = rewind(home.path(), "nope", 0, &[]);
    assert_eq!(code, Some(2));
}

/// A rewind killed after its first file leaves each file as it was or as it is (no
/// half-written file), `session show` says it was cut short, a rewind to another step is
/// refused until it is finished, and running it again finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_killed_midway_leaves_whole_files_and_finishes_when_run_again() {
    let model = MockModel::start(vec![
        Reply::calls(&[
            ("c1", "fs_write_file", &write("/w/a.txt", "A2\n")),
            ("c2", "fs_write_file", &write("/w/b.txt", "B2\n")),
            ("c3", "fs_write_file", &write("/w/c.txt", "C2\n")),
        ]),
        Reply::text("done"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    for n in ["a", "b", "c"] {
        std::fs::write(w.join(format!("{n}.txt")), format!("{}1\n", n.to_uppercase())).unwrap();
    }
    let grant = format!("{}=/w:rw", w.display());
    let url = model.url();
    run_session(home.path(), "k", "edit", &url, &grant, &[]);
    let killed = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home.path())
        .args(["session", "rewind", "k", "--to", "0"])
        .env("KEEL_CRASH_AT", "mid_rewind:1")
        .output()
        .unwrap();
    assert_eq!(killed.status.code(), None, "killed by the crash point: {killed:?}");
    let mut restored = 0;
    for n in ["a", "b", "c"] {
        let text = std::fs::read_to_string(w.join(format!("{n}.txt"))).unwrap();
        let up = n.to_uppercase();
        assert!(text == format!("{up}1\n") || text == format!("{up}2\n"), "{n}: {text:?}");
        restored += usize::from(text == format!("{up}1\n"));
    }
    assert_eq!(restored, 1, "one file was put back before the kill");
    let show = keel(home.path(), &["session", "show", "k"]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("rewind  to step 0 was cut short"), "{text}");
    // The console's page of the session says so too, with the way to finish it.
    {
        let s = super::serve::Server::start(home.path(), &url, &[]);
        let page = super::serve::client()
            .get(format!("{}/sessions/k", s.base))
            .bearer_auth(&s.admin)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(page.contains("id=\"rewind-cut-short\"") && page.contains("rewind?to=0"), "{page}");
    }
    let (code, v) = rewind(home.path(), "k", 1, &[]);
    assert_eq!(code, Some(2), "another step waits for the first: {v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("was cut short"), "{v}");
    let (code, v) = rewind(home.path(), "k", 0, &[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["rewind"]["resumed"], true);
    for n in ["a", "b", "c"] {
        let up = n.to_uppercase();
        assert_eq!(
            std::fs::read_to_string(w.join(format!("{n}.txt"))).unwrap(),
            format!("{up}1\n")
        );
    }
    let stray: Vec<String> = std::fs::read_dir(w)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("keel-rewind"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
    let show = keel(home.path(), &["session", "show", "k"]);
    assert!(!String::from_utf8_lossy(&show.stdout).contains("cut short"));
}

/// Over the API: an admin previews and rewinds; another user's token is told the session
/// does not exist, and a user who may not decide its approvals may not rewind their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewind_over_the_api_is_for_those_who_may_decide() {
    use super::serve::{Server, client, get, post, token, wait_for};
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "fs_write_file", &write("/w/notes.md", "# new\n"))]),
        Reply::text("written"),
        Reply::text("hello"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let project = roots.path().join("p");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("notes.md"), "# old\n").unwrap();
    let s = Server::start(home.path(), &model.url(), &[roots.path()]);
    let c = client();
    let grant = json!([{"host": project.display().to_string(), "guest": "/w", "access": "rw"}]);
    let (status, v) = post(
        &c,
        &s.api("/sessions"),
        &s.admin,
        json!({"input": "rewrite the notes", "grants": grant, "id": "api"}),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    wait_for(&c, &s, "api", "idle", |v| v["state"] == "idle").await;
    assert_eq!(std::fs::read_to_string(project.join("notes.md")).unwrap(), "# new\n");
    let url = s.api("/sessions/api/rewind");
    // Another user: no such session.
    let eve = token(home.path(), "eve", "user");
    let (status, _) = post(&c, &url, &eve, json!({"to": 0})).await;
    assert_eq!(status, 404);
    // A user's own session, with no preset letting them decide: refused.
    let (status, v) =
        post(&c, &s.api("/sessions"), &eve, json!({"input": "hi", "id": "eves"})).await;
    assert_eq!(status, 202, "{v}");
    wait_for(&c, &s, "eves", "idle", |v| v["state"] == "idle").await;
    let (status, v) = post(&c, &s.api("/sessions/eves/rewind"), &eve, json!({"to": 0})).await;
    assert_eq!(status, 403, "{v}");
    // The admin: a preview writes nothing, the rewind puts the file back.
    let (status, v) = post(&c, &url, &s.admin, json!({"to": 0, "dry_run": true})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["rewind"]["paths"][0]["outcome"], "would", "{v}");
    assert!(v["rewind"]["paths"][0]["diff"].as_str().unwrap().contains("+# old"), "{v}");
    assert_eq!(std::fs::read_to_string(project.join("notes.md")).unwrap(), "# new\n");
    let (status, v) = post(&c, &url, &s.admin, json!({"to": 0})).await;
    assert_eq!((status, v["ok"].as_bool()), (reqwest::StatusCode::OK, Some(true)), "{v}");
    assert_eq!(std::fs::read_to_string(project.join("notes.md")).unwrap(), "# old\n");
    let (status, v) = post(&c, &url, &s.admin, json!({"to": "zero"})).await;
    assert_eq!(status, 400, "{v}");
    // Replay over the API: the write is skipped (nothing is run), and the same rule holds.
    let replay = s.api("/sessions/api/replay");
    let (status, v) = post(&c, &replay, &s.admin, json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["replay"]["calls"][0]["outcome"], "skipped", "{v}");
    let (status, _) = post(&c, &replay, &eve, json!({"at": 0})).await;
    assert_eq!(status, 404);
    // The conversation goes back with the files: the messages after step 0 leave the context.
    let (status, v) = post(&c, &url, &s.admin, json!({"to": 0, "conversation": true})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["rewind"]["conversation"]["outcome"], "done", "{v}");
    assert_eq!(v["rewind"]["conversation"]["rewind"]["resent"], 0, "{v}");
    // Fork: another user's session does not exist for them; a user forks their own, and the
    // fork is theirs; another model server is an admin's to choose.
    let (status, _) = post(&c, &s.api("/sessions/api/fork"), &eve, json!({"at": 0})).await;
    assert_eq!(status, 404);
    let fork = s.api("/sessions/eves/fork");
    let (status, v) = post(&c, &fork, &eve, json!({"at": 1, "id": "eves-again"})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!((v["fork"]["from"].as_str(), v["fork"]["at"].as_i64()), (Some("eves"), Some(1)));
    let (status, v) = get(&c, &s.api("/sessions/eves-again"), &eve).await;
    assert_eq!(status, 200, "{v}");
    let (status, v) =
        post(&c, &fork, &eve, json!({"at": 1, "model_url": "http://127.0.0.1:9/v1"})).await;
    assert_eq!(status, 403, "{v}");
    let (status, v) = post(&c, &fork, &eve, json!({"at": 1, "colour": "red"})).await;
    assert_eq!(status, 400, "{v}");
}

/// Replay: the recorded read-only, idempotent calls run again against a scratch copy of the
/// grants; an output that differs now is flagged with its diff (exit 1), a write and a
/// non-idempotent read are never run, and the session's files are not touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_runs_recorded_reads_again_and_flags_what_changed() {
    let model = MockModel::start(vec![
        Reply::calls(&[
            ("r1", "fs_read_file", r#"{"path":"/w/notes.md"}"#),
            ("l1", "fs_list_dir", r#"{"path":"/w/sub"}"#),
        ]),
        Reply::calls(&[("w1", "fs_write_file", &write("/w/out.txt", "out\n"))]),
        Reply::text("read and wrote"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    std::fs::write(w.join("notes.md"), "# notes\nfirst\n").unwrap();
    std::fs::create_dir(w.join("sub")).unwrap();
    std::fs::write(w.join("sub/x.txt"), "x\n").unwrap();
    let grant = format!("{}=/w:rw", w.display());
    let url = model.url();
    run_session(home.path(), "rp", "read", &url, &grant, &[]);
    let replay = |extra: &[&str]| {
        let mut args = vec!["session", "replay", "rp", "--tools-only", "--json"];
        args.extend(extra);
        let out = keel(home.path(), &args);
        (out.status.code(), json_of(&out))
    };
    let of = |v: &Value, tool: &str| -> Value {
        v["replay"]["calls"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["tool"] == tool)
            .cloned()
            .unwrap()
    };
    let (code, v) = replay(&[]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(of(&v, "fs_read_file")["outcome"], "same", "{v}");
    assert_eq!(of(&v, "fs_list_dir")["outcome"], "same", "{v}");
    assert_eq!(of(&v, "fs_write_file")["outcome"], "skipped");
    assert!(of(&v, "fs_write_file")["why"].as_str().unwrap().contains("workspace-write"));
    // The file read changed since: flagged, with the diff; nothing of the session changes.
    std::fs::write(w.join("notes.md"), "# notes\nsecond\n").unwrap();
    let (code, v) = replay(&[]);
    assert_eq!(code, Some(1), "{v}");
    let read = of(&v, "fs_read_file");
    assert_eq!(read["outcome"], "changed", "{v}");
    let diff = read["diff"].as_str().unwrap();
    assert!(diff.contains("first") && diff.contains("second"), "{diff}");
    assert_eq!(of(&v, "fs_list_dir")["outcome"], "same");
    assert!(
        !w.join("out.txt").exists()
            || std::fs::read_to_string(w.join("out.txt")).unwrap() == "out\n"
    );
    // After step 1 only the write is left: skipped.
    let (code, v) = replay(&["--at", "1"]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["replay"]["calls"].as_array().unwrap().len(), 1, "{v}");
    // Without --tools-only: refused, saying why.
    let out = keel(home.path(), &["session", "replay", "rp"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tools-only"));
}

/// A tool author's regression check: a session's recorded calls of `note_summary` (version
/// 1) replayed after version 2 is installed flag the changed output, with both versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_flags_the_changed_output_of_a_new_tool_version() {
    let model = MockModel::start(vec![
        Reply::calls(&[("s1", "note_summary", r#"{"path":"/w/notes.md"}"#)]),
        Reply::text("summarized"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("notes.md"), "one two\nthree\n").unwrap();
    let v1 = keel_tests::guests::SUMMARY_V1_COMPONENT;
    let v2 = keel_tests::guests::SUMMARY_V2_COMPONENT;
    let out = keel(home.path(), &["tool", "install", v1, "--name", "summary", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let grant = format!("{}=/w", work.path().display());
    let url = model.url();
    run_session(home.path(), "v", "summarize", &url, &grant, &[]);
    let replay = || {
        let out = keel(home.path(), &["session", "replay", "v", "--tools-only", "--json"]);
        (out.status.code(), json_of(&out))
    };
    let (code, v) = replay();
    assert_eq!((code, &v["replay"]["calls"][0]["outcome"]), (Some(0), &json!("same")), "{v}");
    let out =
        keel(home.path(), &["tool", "install", v2, "--name", "summary", "--upgrade", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, v) = replay();
    assert_eq!(code, Some(1), "{v}");
    let call = &v["replay"]["calls"][0];
    assert_eq!(call["outcome"], "changed", "{v}");
    assert_ne!(call["recorded_digest"], call["digest_now"], "{v}");
    assert!(call["diff"].as_str().unwrap().contains("+  \"words\": 3"), "{v}");
}
