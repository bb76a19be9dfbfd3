//! Continuing a session and creating one are different words: `--session ID` continues one
//! that exists (a mistyped id is an error with the closest ids, and nothing is created),
//! `--new-session ID` creates one, `--continue` continues the user's most recent one.

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
