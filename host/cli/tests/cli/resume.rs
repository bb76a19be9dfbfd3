//! Continuing a session and creating one are different words: `--session ID` continues one
//! that exists (a mistyped id is an error with the closest ids, and nothing is created),
//! `--new-session ID` creates one, `--continue` continues the user's most recent one. And a
//! session continued elsewhere: `keel session set` moves it to another model server.

use keel_tests::mock_model::{MockModel, Reply};
use serde_json::Value;

use super::run::{args, keel_async};

fn ids(list: &Value) -> Vec<String> {
    let mut ids: Vec<String> =
        list.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mistyped_session_is_an_error_and_continue_finds_the_users_latest() {
    let model =
        MockModel::start((0..8).map(|i| Reply::text(&format!("answer {i}"))).collect()).await;
    let url = model.url();
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let run = |flags: &[&str]| {
        let mut a =
            args(&["run", "a task", "--model-url", &url, "--model", "m", "--no-preprocess"]);
        a.extend(args(flags));
        keel_async(h.clone(), a)
    };
    let turns = |id: &str| {
        let list = super::json_of(&super::keel(home.path(), &["session", "list", "--json"]));
        list.as_array().unwrap().iter().find(|s| s["id"] == id).unwrap()["turns"].as_i64().unwrap()
    };

    let out = run(&["--new-session", "release", "--user", "carol"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run(&["--new-session", "other", "--user", "bob"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    // A mistyped id: refused with the closest id, and no session appears.
    let out = run(&["--session", "relase"]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("session `relase` does not exist (did you mean `release`?)"), "{err}");
    assert!(err.contains("nothing was created") && err.contains("--new-session relase"), "{err}");
    let out = run(&["--session", "relase", "--json"]).await;
    let v = super::json_of(&out);
    assert_eq!(v["error"]["kind"], "not_found", "{v}");
    let list = super::json_of(&super::keel(home.path(), &["session", "list", "--json"]));
    assert_eq!(ids(&list), ["other", "release"]);
    assert_eq!(model.requests().len(), 2, "a refused run calls no model");

    // An id that is taken cannot be created again.
    let out = run(&["--new-session", "release"]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("session `release` exists; continue it with --session release"), "{err}");

    // --continue: the user's most recently active session, not the newest of the home.
    let before = (turns("release"), turns("other"));
    let out = run(&["--continue", "--user", "carol", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(super::json_of(&out)["session_id"], "release");
    assert_eq!((turns("release"), turns("other")), (before.0 + 1, before.1));
    let out = run(&["--continue", "--user", "bob", "--json"]).await;
    assert_eq!(super::json_of(&out)["session_id"], "other");

    let out = run(&["--continue", "--user", "nobody"]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no session of user `local:nobody` in this home to continue"), "{err}");

    // The words do not combine.
    let out = run(&["--continue", "--session", "release"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}

/// A session whose model server moved goes on at the new one: `keel session set` changes the
/// server, the model and the window, records who did, and the next turn's request goes there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moves_to_another_model_server() {
    let old = MockModel::start(vec![Reply::text("from the old server")]).await;
    let new = MockModel::start(vec![Reply::text("from the new server")]).await;
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let (old_url, new_url) = (old.url(), new.url());
    let out = keel_async(
        h.clone(),
        args(&["run", "first", "--new-session", "mv", "--model-url", &old_url, "--model", "a"]),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    // Refusals first: nothing to change, a URL that is not http(s), an unknown session.
    for (flags, kind) in [
        (vec!["mv"], "input"),
        (vec!["mv", "--model-url", "ftp://example.org/v1"], "input"),
        (vec!["vm", "--model", "b"], "not_found"),
    ] {
        let mut a = args(&["session", "set", "--json"]);
        a.extend(args(&flags));
        let out = keel_async(h.clone(), a).await;
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        assert_eq!(super::json_of(&out)["error"]["kind"], kind, "{flags:?}");
    }

    let set = ["session", "set", "mv", "--model-url", &new_url, "--model", "b"];
    let out =
        keel_async(h.clone(), args(&[&set[..], &["--context-window", "8192"]].concat())).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        text.trim(),
        format!("session mv: a at {old_url} → b at {new_url} (window 8192 tokens)")
    );
    // The same again changes nothing and says so.
    let out = keel_async(h.clone(), args(&set)).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("already uses b at"), "{out:?}");

    let out = keel_async(h.clone(), args(&["run", "second", "--session", "mv", "--json"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(super::json_of(&out)["answer"], "from the new server");
    assert_eq!(old.requests().len(), 1, "the old server got only the first turn");
    let sent: Value = serde_json::from_slice(&new.requests()[0]).unwrap();
    assert_eq!(sent["model"], "b");
    let history = sent.to_string();
    assert!(history.contains("first") && history.contains("from the old server"), "{history}");

    let events = super::keel(home.path(), &["session", "events", "mv", "--json"]);
    let changed: Vec<Value> = String::from_utf8_lossy(&events.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["kind"] == "model_changed")
        .collect();
    assert_eq!(changed.len(), 1, "one change, not two");
    assert_eq!(changed[0]["from"]["base_url"], old_url.trim_end_matches('/'));
    assert_eq!(changed[0]["to"]["model"], "b");
    assert_eq!(changed[0]["to"]["context_window"], 8192);
    assert!(changed[0]["by"].as_str().unwrap().starts_with("local user "), "{}", changed[0]);
}

/// Finding sessions (by state, activity, text, count) and tidying them: `delete` removes
/// every fact of one session and nothing of another, `prune` deletes the idle ones not active
/// for a while, with a dry run first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_found_by_text_and_state_and_deleted_whole() {
    let model =
        MockModel::start((0..6).map(|i| Reply::text(&format!("answer {i}"))).collect()).await;
    let url = model.url();
    let home = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    for (id, task) in [
        ("orders", "Check orders.csv for ragged rows"),
        ("release", "Write a release checklist"),
        ("notes", "Summarize the meeting notes"),
    ] {
        let a = args(&["run", task, "--new-session", id, "--model-url", &url, "--model", "m"]);
        let out = keel_async(h.clone(), [a, args(&["--no-preprocess"])].concat()).await;
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let listed = |flags: &[&str]| {
        let mut a = vec!["session", "list", "--json"];
        a.extend(flags);
        let list = super::json_of(&super::keel(home.path(), &a));
        list.as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    // The most recently active first; a text in a goal or in the history (an answer).
    assert_eq!(listed(&[]), ["notes", "release", "orders"]);
    assert_eq!(listed(&["--search", "CHECKLIST"]), ["release"]);
    assert_eq!(listed(&["--search", "answer 0"]), ["orders"]);
    assert_eq!(listed(&["--search", "100%"]), Vec::<String>::new());
    assert_eq!(listed(&["--state", "idle", "--limit", "2"]), ["notes", "release"]);
    assert_eq!(listed(&["--state", "failed"]), Vec::<String>::new());
    assert_eq!(listed(&["--since", "1h"]).len(), 3);
    let out = super::keel(home.path(), &["session", "list", "--state", "sleepy"]);
    assert_eq!(out.status.code(), Some(2));
    let text =
        String::from_utf8_lossy(&super::keel(home.path(), &["session", "list"]).stdout).to_string();
    let header = text.lines().next().unwrap();
    assert!(header.contains("ACTIVE") && header.ends_with("TITLE"), "{text}");
    assert!(text.contains("just now") && text.contains("Write a release checklist"), "{text}");

    // A title replaces the goal in lists, and is found by --search; --clear removes it.
    let out = super::keel(home.path(), &["session", "title", "release", "Release 1.2 prep"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(listed(&["--search", "1.2 PREP"]), ["release"]);
    let text =
        String::from_utf8_lossy(&super::keel(home.path(), &["session", "list"]).stdout).to_string();
    assert!(text.contains("Release 1.2 prep") && !text.contains("Write a release"), "{text}");
    let out = super::keel(home.path(), &["session", "title", "release", "two\nlines", "--json"]);
    assert_eq!(super::json_of(&out)["error"]["kind"], "input");
    let out = super::keel(home.path(), &["session", "title", "nope", "x", "--json"]);
    assert_eq!(super::json_of(&out)["error"]["kind"], "not_found");
    super::keel(home.path(), &["session", "title", "release", "--clear"]);
    assert_eq!(listed(&["--search", "1.2"]), Vec::<String>::new());

    // Delete: every row of the session, in every table that names sessions, and nothing of
    // the others. (On PostgreSQL, which enforces the tables' references to `sessions`, the
    // delete succeeding says as much; the rows are counted in SQLite's file.)
    let sqlite = !super::on_postgres();
    let rows_of = |id: &str| -> Vec<(String, i64)> {
        if !sqlite {
            return Vec::new();
        }
        let c = rusqlite::Connection::open(home.path().join("keel.db")).unwrap();
        let tables: Vec<String> = c
            .prepare(
                "SELECT m.name FROM sqlite_master m, pragma_table_info(m.name) p
                 WHERE m.type = 'table' AND p.name = 'session_id'",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut rows: Vec<(String, i64)> = tables
            .into_iter()
            .map(|t| {
                let n = c
                    .query_row(
                        &format!("SELECT COUNT(*) FROM {t} WHERE session_id=?1"),
                        [id],
                        |r| r.get(0),
                    )
                    .unwrap();
                (t, n)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        let n: i64 =
            c.query_row("SELECT COUNT(*) FROM sessions WHERE id=?1", [id], |r| r.get(0)).unwrap();
        if n > 0 {
            rows.push(("sessions".into(), n));
        }
        rows
    };
    assert!(!sqlite || rows_of("orders").len() > 5, "{:?}", rows_of("orders"));
    let kept_before = rows_of("release");
    let out = super::keel(home.path(), &["session", "delete", "orders", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(rows_of("orders"), Vec::<(String, i64)>::new());
    assert_eq!(rows_of("release"), kept_before);
    let out = super::keel(home.path(), &["session", "delete", "orders", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(super::json_of(&out)["error"]["kind"], "not_found");
    let out = super::keel(home.path(), &["session", "show", "release", "--json"]);
    assert_eq!(super::json_of(&out)["messages"].as_array().map(Vec::len), Some(2));
    if sqlite {
        let dangling = rusqlite::Connection::open(home.path().join("keel.db"))
            .unwrap()
            .query_row("PRAGMA foreign_key_check", [], |_| Ok(()))
            .is_ok();
        assert!(!dangling, "a row points at the deleted session");
    }

    // Prune: nothing is that old; with a dry run everything idle is listed, nothing deleted.
    let prune = |flags: &[&str]| {
        let mut a = vec!["session", "prune", "--json"];
        a.extend(flags);
        super::json_of(&super::keel(home.path(), &a))
    };
    assert_eq!(prune(&["--older-than", "1h"])["deleted"], serde_json::json!([]));
    let dry = prune(&["--older-than", "0s", "--dry-run"]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(ids(&dry["deleted"]), ["notes", "release"]);
    assert_eq!(listed(&[]).len(), 2, "a dry run deletes nothing");
    let done = prune(&["--older-than", "0s", "--state", "idle"]);
    assert_eq!(ids(&done["deleted"]), ["notes", "release"]);
    assert_eq!(listed(&[]), Vec::<String>::new());
}

/// A grant written as Docker writes a volume (`HOST:GUEST`) is refused with keel's spelling.
#[test]
fn a_docker_style_grant_is_answered_with_keels_spelling() {
    let home = tempfile::tempdir().unwrap();
    let data = super::data_dir();
    let out = super::keel(
        home.path(),
        &[
            "run",
            "x",
            "--grant",
            &format!("{data}:/data:rw"),
            "--model-url",
            "http://127.0.0.1:9/v1",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("did you mean `{data}=/data:rw`?")), "{err}");
}
