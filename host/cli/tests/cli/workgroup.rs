//! `keel run --main`, `keel workgroup`, `keel approvals --all-children` and `keel approve` of a
//! sub-session's call, through the real binary against the scripted model server.

use std::process::Output;
use std::time::Duration;

use super::run::{args, keel_async};

use keel_tests::mock_model::{MockModel, spawn_task, workgroup_responder};
use serde_json::json;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workgroup_waits_for_a_childs_approval_and_finishes_after_keel_approve() {
    let model = MockModel::start_fn(workgroup_responder(Duration::ZERO).responder).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let h = home.path().to_path_buf();
    let out = keel_async(
        h.clone(),
        args(&["tool", "install", keel_tests::guests::EFFECTS_COMPONENT, "--name", "effects"]),
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let grant = format!("{}=/work:rw", work.path().display());
    let task = spawn_task(
        "MAIN",
        &[("send the report", "CHILD S effect:effect_send", &[]), ("count", "CHILD C", &[])],
    );
    let url = model.url();
    let out = keel_async(
        h.clone(),
        args(&[
            "run",
            &task,
            "--main",
            "--new-session",
            "lead",
            "--grant",
            &grant,
            "--model-url",
            &url,
            "--model",
            "m",
            "--max-children",
            "4",
        ]),
    )
    .await;
    // One child waits for a decision: the command says so and exits with the waiting code.
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("keel: workgroup lead: 2 sub-sessions (1 live)"), "{err}");
    assert!(err.contains("waits for approval"), "{err}");

    let out =
        keel_async(h.clone(), args(&["workgroup", "show", "lead", "--json", "--events"])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let w = super::json_of(&out);
    assert_eq!(w["limits"]["max_live_children"], json!(4));
    let members = w["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    assert_eq!(members[0]["role"], json!("main"));
    let waiting: Vec<&serde_json::Value> =
        members.iter().filter(|m| m["state"] == json!("waiting_approval")).collect();
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0]["purpose"], json!("send the report"));
    let unit = waiting[0]["approvals"][0].as_str().unwrap().to_string();
    let kinds: Vec<&str> =
        w["event_list"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"approval_needed") && kinds.contains(&"result"), "{kinds:?}");

    let out = keel_async(h.clone(), args(&["workgroup", "show", "lead"])).await;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains(&format!("waits for approval {unit}")), "{text}");
    assert!(text.contains("done: result"), "{text}");

    let out = keel_async(h.clone(), args(&["workgroup", "list", "--json"])).await;
    assert_eq!(super::json_of(&out).as_array().unwrap().len(), 1);

    // The main session has no approval of its own; with --all-children its child's is listed.
    let out = keel_async(h.clone(), args(&["approvals", "--session", "lead", "--json"])).await;
    assert_eq!(super::json_of(&out), json!([]));
    let out = keel_async(
        h.clone(),
        args(&["approvals", "--session", "lead", "--all-children", "--json"]),
    )
    .await;
    let units = super::json_of(&out);
    assert_eq!(units.as_array().unwrap().len(), 1);
    assert_eq!(units[0]["id"], json!(unit));

    let out = keel_async(h.clone(), args(&["approve", &unit])).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(keel_tests::log_lines(work.path(), "sent.log"), vec!["S"]);
    let out = keel_async(h.clone(), args(&["workgroup", "show", "lead", "--json"])).await;
    let w = super::json_of(&out);
    for m in w["members"].as_array().unwrap() {
        assert_eq!(m["state"], json!("idle"), "{m}");
        assert!(m["approvals"].as_array().unwrap().is_empty());
    }
    let out = keel_async(h.clone(), args(&["session", "show", "lead", "--json"])).await;
    let show = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(show.contains("coordinator done: "), "{show}");

    // Bad input: limits without --main, an unknown workgroup.
    let out = keel_async(h.clone(), args(&["run", "x", "--max-children", "2"])).await;
    assert_eq!(out.status.code(), Some(2));
    let out = keel_async(h.clone(), args(&["workgroup", "show", "nope", "--json"])).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(super::json_of(&out)["error"]["kind"], json!("not_found"));
}
