//! Time travel in the conversation, through the binary: `keel session fork` makes a session
//! whose first request holds exactly the original's messages up to a step, and
//! `keel session rewind --conversation` takes a session's own conversation back to a step —
//! both compared byte for byte with what the model server received.

use std::path::Path;

use keel_tests::mock_model::{MockModel, Reply};
use serde_json::{Value, json};

use super::{json_of, keel};

fn write(path: &str, content: &str) -> String {
    json!({"path": path, "content": content}).to_string()
}

/// The elements of the top-level array `key` of the JSON object `body`, each as the exact
/// bytes it was sent as.
fn raw_elements(body: &[u8], key: &str) -> Vec<String> {
    let text = std::str::from_utf8(body).unwrap();
    let start = text.find(&format!("\"{key}\":[")).unwrap_or_else(|| panic!("no {key}: {text}"))
        + key.len()
        + 4;
    let (mut depth, mut in_string, mut escaped, mut from) = (0usize, false, false, start);
    let mut out = Vec::new();
    for (i, ch) in text[start..].char_indices().map(|(i, c)| (i + start, c)) {
        if in_string {
            match (escaped, ch) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match ch {
            '"' => in_string = true,
            '{' | '[' => depth += 1,
            '}' | ']' if depth > 0 => depth -= 1,
            ',' if depth == 0 => {
                out.push(text[from..i].to_string());
                from = i + 1;
            }
            ']' => {
                if i > from {
                    out.push(text[from..i].to_string());
                }
                return out;
            }
            _ => {}
        }
    }
    panic!("{key} does not end: {text}")
}

fn run(home: &Path, args: &[&str]) -> Value {
    let out = keel(home, args);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    json_of(&out)
}

/// The bytes `keel session evidence ID --step N` rebuilds.
fn evidence(home: &Path, id: &str, step: i64) -> Vec<u8> {
    let out = keel(home, &["session", "evidence", id, "--step", &step.to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_starts_from_the_originals_history_at_the_step_and_leaves_it_alone() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "fs_write_file", &write("/w/a.txt", "one\n"))]),
        Reply::calls(&[("c2", "fs_write_file", &write("/w/b.txt", "bee\n"))]),
        Reply::text("first done"),
        Reply::calls(&[("c3", "fs_write_file", &write("/w/c.txt", "sea\n"))]),
        Reply::text("second done"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let h = home.path();
    let grant = format!("{}=/w:rw", work.path().display());
    let url = model.url();
    let base = ["--model-url", url.as_str(), "--model", "m", "--grant", grant.as_str()];
    let mut args = vec!["run", "write a and b", "--new-session", "o"];
    args.extend(base);
    args.push("--json");
    run(h, &args);
    run(h, &["run", "now c", "--session", "o", "--json"]);
    let sent = model.requests();
    assert_eq!(sent.len(), 5, "five steps");
    let before = json_of(&keel(h, &["session", "show", "o", "--json"]));

    // Fork at step 2, in the middle of the first turn: after its calls' results.
    let v = run(h, &["session", "fork", "o", "--at", "2", "--new-id", "f", "--json"]);
    assert_eq!(v["fork"]["session_id"], "f", "{v}");
    assert_eq!((v["fork"]["from"].as_str(), v["fork"]["at"].as_i64()), (Some("o"), Some(2)));
    assert_eq!(v["fork"]["turn"], 1, "{v}");
    model.push(vec![Reply::text("forked answer")]);
    run(h, &["run", "try it another way", "--session", "f", "--json"]);
    let sent = model.requests();
    assert_eq!(sent.len(), 6);
    // The original's request of step 3 held the history up to step 2's results; the fork's
    // first request holds exactly those messages, byte for byte, then its new input.
    let original = raw_elements(&sent[2], "messages");
    let forked = raw_elements(&sent[5], "messages");
    assert_eq!(forked.len(), original.len() + 1, "{forked:?}");
    assert_eq!(forked[1..original.len()], original[1..], "the history up to the step");
    let new: Value = serde_json::from_str(forked.last().unwrap()).unwrap();
    assert_eq!(
        (new["role"].as_str(), new["content"].as_str()),
        (Some("user"), Some("try it another way"))
    );
    assert_eq!(
        raw_elements(&sent[5], "tools"),
        raw_elements(&sent[2], "tools"),
        "the same tools, as the same bytes"
    );
    // The fork's evidence rebuilds what the model was sent, and it holds the original's
    // evidence up to the step.
    assert_eq!(evidence(h, "f", 3), sent[5]);
    assert_eq!(evidence(h, "f", 2), sent[1]);
    // The fork says where it came from, holds the journal up to the step only, and works
    // for the same user with the same grants.
    let f = json_of(&keel(h, &["session", "show", "f", "--json"]));
    assert_eq!(f["forked_from"]["session"], "o", "{f}");
    assert_eq!(f["forked_from"]["step"], 2);
    let steps: Vec<i64> =
        f["tool_calls"].as_array().unwrap().iter().map(|c| c["step"].as_i64().unwrap()).collect();
    assert_eq!(steps, [1, 2]);
    assert_eq!(f["grants"], before["grants"]);
    assert_eq!(f["session_goal"], "write a and b", "the goals as they were at the step");
    let text = String::from_utf8_lossy(&keel(h, &["session", "show", "f"]).stdout).to_string();
    assert!(text.contains("fork    of session o at step 2"), "{text}");
    let events = String::from_utf8_lossy(&keel(h, &["session", "events", "f"]).stdout).to_string();
    assert!(events.contains("forked from session o at step 2 (by local user"), "{events}");
    // The original is untouched.
    let after = json_of(&keel(h, &["session", "show", "o", "--json"]));
    assert_eq!(after["messages"], before["messages"]);
    assert_eq!(after["tool_calls"], before["tool_calls"]);
    assert!(after.get("forked_from").is_none());

    // From step 0, to another model, read-only: an empty history, the other model's name.
    let v = run(
        h,
        &[
            "session",
            "fork",
            "o",
            "--at",
            "0",
            "--new-id",
            "g",
            "--model",
            "other",
            "--read-only",
            "--json",
        ],
    );
    assert_eq!(v["fork"]["model"]["model"], "other", "{v}");
    assert_eq!(v["fork"]["grants"][0]["access"], "ro", "{v}");
    model.push(vec![Reply::text("fresh")]);
    run(h, &["run", "start over", "--session", "g", "--json"]);
    let sent = model.requests();
    let last: Value = serde_json::from_slice(sent.last().unwrap()).unwrap();
    assert_eq!(last["model"], "other");
    let history: Vec<&Value> =
        last["messages"].as_array().unwrap().iter().filter(|m| m["role"] != "system").collect();
    assert_eq!(history.len(), 1, "only the new input: {last}");
    assert_eq!(history[0]["content"], "start over");
    let system = last["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("- /w (read-only)"), "{system}");
    let g = json_of(&keel(h, &["session", "show", "g", "--json"]));
    assert_eq!(g["settings_changes"][0]["setting"], "model", "{g}");

    // What cannot be forked says why, and makes nothing.
    for (args, code, says) in [
        (vec!["--at", "9"], 2, "step 9 is not one of them"),
        (vec!["--at", "1", "--drop-grant", "/nope"], 2, "no grant at `/nope`"),
        (vec!["--at", "1", "--new-id", "f"], 2, "already exists"),
        (vec!["--at", "1", "--new-id", "bad id"], 2, "is not valid"),
    ] {
        let mut all = vec!["session", "fork", "o"];
        all.extend(args);
        let out = keel(h, &all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{all:?}: {err}");
        assert!(err.contains(says), "{all:?}: {err}");
    }
    let list = json_of(&keel(h, &["session", "list", "--json"]));
    assert_eq!(list.as_array().unwrap().len(), 3, "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewinding_the_conversation_continues_from_the_step_with_the_files() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "fs_write_file", &write("/w/a.txt", "one\n"))]),
        Reply::calls(&[("c2", "fs_write_file", &write("/w/a.txt", "two\n"))]),
        Reply::text("done"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (h, w) = (home.path(), work.path());
    let grant = format!("{}=/w:rw", w.display());
    let url = model.url();
    run(
        h,
        &[
            "run",
            "write a",
            "--new-session",
            "o",
            "--model-url",
            &url,
            "--model",
            "m",
            "--grant",
            &grant,
            "--json",
        ],
    );
    let rewind = |extra: &[&str]| {
        let mut args = vec!["session", "rewind", "o", "--to", "1", "--conversation", "--json"];
        args.extend(extra);
        let out = keel(h, &args);
        (out.status.code(), json_of(&out))
    };
    // A dry run says what would leave the context, and changes nothing.
    let (code, v) = rewind(&["--dry-run"]);
    assert_eq!(code, Some(0), "{v}");
    let c = &v["rewind"]["conversation"];
    assert_eq!(c["outcome"], "would", "{v}");
    assert_eq!(
        (c["rewind"]["rewound_from"].as_i64(), c["rewind"]["rewound_to"].as_i64()),
        (Some(4), Some(6)),
        "{v}"
    );
    assert_eq!(c["rewind"]["resent"], 3, "the input, the step's call and its result");
    // A file edited outside keel is a conflict: the conversation stays until it is resolved.
    std::fs::write(w.join("a.txt"), "mine\n").unwrap();
    let (code, v) = rewind(&[]);
    assert_eq!(code, Some(1), "{v}");
    assert_eq!(v["rewind"]["conversation"]["outcome"], "not_done", "{v}");
    let show = json_of(&keel(h, &["session", "show", "o", "--json"]));
    assert_eq!(show["context_start"], 0);
    let (code, v) = rewind(&["--force-path", "/w/a.txt"]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["rewind"]["conversation"]["outcome"], "done", "{v}");
    assert_eq!(std::fs::read_to_string(w.join("a.txt")).unwrap(), "one\n");

    // The next turn continues from step 1: its request holds exactly what step 2's did, then
    // the new input.
    model.push(vec![Reply::text("stopped")]);
    run(h, &["run", "leave it at one", "--session", "o", "--json"]);
    let sent = model.requests();
    assert_eq!(sent.len(), 4);
    let at_step = raw_elements(&sent[1], "messages");
    let now = raw_elements(&sent[3], "messages");
    assert_eq!(now.len(), at_step.len() + 1, "{now:?}");
    assert_eq!(now[..at_step.len()], at_step[..]);
    // Every request's evidence still rebuilds: the one before the rewind and the one after.
    assert_eq!(evidence(h, "o", 3), sent[2]);
    assert_eq!(evidence(h, "o", 4), sent[3]);
    // The rewound messages stay in the store, marked.
    let text = String::from_utf8_lossy(&keel(h, &["session", "show", "o"]).stdout).to_string();
    assert!(text.contains("rewound the conversation to step 1 (by local user"), "{text}");
    assert!(text.contains("#6 turn 1 assistant (rewound)"), "{text}");
    assert!(text.contains("(sent again after a rewind)"), "{text}");
    // Nothing after the step: nothing to do.
    let (code, v) = {
        let out = keel(h, &["session", "rewind", "o", "--to", "4", "--conversation", "--json"]);
        (out.status.code(), json_of(&out))
    };
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["rewind"]["conversation"]["outcome"], "nothing", "{v}");

    // Once a compaction summarized the context the step had, the conversation cannot go back
    // there: refused, pointing at a fork, before a file is written.
    let out = keel(h, &["session", "compact", "o"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, v) = rewind(&[]);
    assert_eq!(code, Some(2), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("keel session fork o --at 1"), "{v}");
}
