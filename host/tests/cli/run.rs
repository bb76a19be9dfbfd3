//! `keel run` and `keel session …` through the real binary, against a scripted
//! OpenAI-compatible server on loopback.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use keel_tests::mock_model::{MockModel, Reply};
use serde_json::{Value, json};

async fn keel_async(home: PathBuf, args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        super::keel(&home, &args)
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_show_evidence_through_the_binary() {
    let model = MockModel::start(vec![
        Reply::calls(&[(
            "c1",
            "csv_inspect",
            r#"{"path":"/data/orders.csv","expected_columns":7}"#,
        )]),
        Reply::text("Two rows are ragged: lines 4 and 6."),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let grant = format!("{}=/data:ro", super::data_dir());
    let url = model.url();
    let out = keel_async(
        home.path().to_path_buf(),
        args(&[
            "run",
            "Check orders.csv",
            "--session",
            "cli1",
            "--grant",
            &grant,
            "--model-url",
            &url,
            "--model",
            "m",
            "--json",
        ]),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = super::json_of(&out);
    assert_eq!(
        v,
        json!({"ok": true, "session_id": "cli1", "state": "idle", "outcome": "answer",
               "answer": "Two rows are ragged: lines 4 and 6.", "approvals": []})
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("✓ csv_inspect"), "{stderr}");
    let out =
        keel_async(home.path().to_path_buf(), args(&["session", "show", "cli1", "--json"])).await;
    let t = super::json_of(&out);
    assert_eq!(t["id"], "cli1");
    assert_eq!(t["state"], "idle");
    assert_eq!(t["messages"].as_array().unwrap().len(), 4);
    assert_eq!(t["tool_calls"][0]["tool"], "csv_inspect");
    // Evidence is byte-identical to what the server received.
    for (i, body) in model.requests().iter().enumerate() {
        let step = (i + 1).to_string();
        let out = keel_async(
            home.path().to_path_buf(),
            args(&["session", "evidence", "cli1", "--step", &step]),
        )
        .await;
        assert_eq!(&out.stdout, body, "step {step}");
    }
    let out = keel_async(home.path().to_path_buf(), args(&["session", "list", "--json"])).await;
    assert_eq!(super::json_of(&out)[0]["id"], "cli1");
    // No model configured: a clear refusal.
    let out = keel_async(home.path().to_path_buf(), args(&["run", "hello"])).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no model configured"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c4_two_processes_on_one_session() {
    let model = MockModel::start(vec![
        Reply::Delay(Duration::from_millis(2500), Box::new(Reply::text("first answer"))),
        Reply::text("second answer"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let url = model.url();
    let h = home.path().to_path_buf();
    let first = tokio::spawn(keel_async(
        h.clone(),
        args(&[
            "run",
            "first",
            "--session",
            "two",
            "--tools",
            "fs_read_file",
            "--model-url",
            &url,
            "--model",
            "m",
            "--json",
        ]),
    ));
    // Wait until the first process has created the session and holds its runner.
    let mut queued = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let out = keel_async(h.clone(), args(&["session", "show", "two", "--json"])).await;
        if out.status.success() && super::json_of(&out)["state"] == "running" {
            queued = Some(
                keel_async(h.clone(), args(&["session", "send", "two", "second", "--json"])).await,
            );
            break;
        }
    }
    let queued = queued.expect("the first process never started running");
    assert_eq!(super::json_of(&queued)["outcome"], "queued");
    let first = first.await.unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", String::from_utf8_lossy(&first.stderr));
    // The runner process drained the queued input too, in order.
    let out = keel_async(h.clone(), args(&["session", "show", "two", "--json"])).await;
    let texts: Vec<Value> = super::json_of(&out)["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"]["content"].clone())
        .collect();
    assert_eq!(
        texts,
        [json!("first"), json!("first answer"), json!("second"), json!("second answer")]
    );
}
