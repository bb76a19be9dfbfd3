//! The owner spine end to end against a scripted OpenAI-compatible server on loopback:
//! turns, tool calls, ordering, protocol faults (G1, G2, G3), loop guards, interruption (A7),
//! one runner per session (C4) and request evidence.

use keel::ids::SessionId;
use keel::meta::SessionMeta;
use keel::preparation::Preparation;
use keel::views::Views;
use std::time::{Duration, Instant};

use keel::agent::{LoopGuards, TurnOutcome};
use keel::brain::Submitted;
use keel::sandbox::{Access, CancelToken, Grant};
use keel::session::RuntimeState;
use keel_tests::harness_with_session;
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::no_events;
use serde_json::{Value, json};

fn ws() -> (tempfile::TempDir, Vec<Grant>) {
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("a.txt"), "alpha\n").unwrap();
    let g = vec![Grant::new(t.path(), "/w", Access::Rw).unwrap()];
    (t, g)
}

fn bodies(h: &keel::harness::Harness, id: &str) -> Vec<Value> {
    let rt = tokio::runtime::Handle::current();
    let t = tokio::task::block_in_place(|| {
        rt.block_on(Views::of(h.internals().engine).timeline(&SessionId::from(id)))
    })
    .unwrap();
    t.messages.into_iter().map(|m| m.body).collect()
}

async fn submit(h: &keel::harness::Harness, id: &str, text: &str) -> Submitted {
    h.internals()
        .brain
        .submit(&SessionId::from(id), text, &CancelToken::new(), &no_events())
        .await
        .unwrap()
}

const FS: &[&str] = &["fs_read_file", "fs_write_file", "fs_list_dir"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tool_turn_and_byte_identical_evidence() {
    let (t, g) = ws();
    let model = MockModel::start(vec![
        Reply::calls(&[("call_1", "fs_read_file", r#"{"path": "/w/a.txt"}"#)]),
        Reply::text("The file says alpha."),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "s1", FS, g, LoopGuards::default()).await;
    let out = submit(&h, "s1", "What does a.txt say?").await;
    assert_eq!(out, Submitted::Ran(TurnOutcome::Answer("The file says alpha.".into())));
    let msgs = bodies(&h, "s1");
    assert_eq!(msgs.len(), 4);
    assert_eq!(msgs[0], json!({"role": "user", "content": "What does a.txt say?"}));
    assert_eq!(
        msgs[1]["tool_calls"][0]["function"],
        json!({"name": "fs_read_file", "arguments": r#"{"path": "/w/a.txt"}"#})
    );
    assert_eq!(msgs[2]["role"], "tool");
    assert_eq!(msgs[2]["tool_call_id"], "call_1");
    let result: Value = serde_json::from_str(msgs[2]["content"].as_str().unwrap()).unwrap();
    assert_eq!(result["content"], "alpha");
    assert_eq!(msgs[3], json!({"role": "assistant", "content": "The file says alpha."}));
    let meta = SessionMeta::read(h.internals().engine, &SessionId::from("s1")).await.unwrap();
    assert_eq!(meta.runtime.state, RuntimeState::Idle);
    // Evidence: what the server received, byte for byte.
    let received = model.requests();
    assert_eq!(received.len(), 2);
    for (i, body) in received.iter().enumerate() {
        let (step, evidence) = keel::assembly::Assembly::of(h.internals().engine)
            .evidence(&SessionId::from("s1"), Some(i as i64 + 1))
            .await
            .unwrap();
        assert_eq!(step, i as i64 + 1);
        assert_eq!(&evidence, body, "evidence of step {step} differs from the request");
    }
    let first: Value = serde_json::from_slice(&received[0]).unwrap();
    assert_eq!(first["model"], "test-model");
    assert_eq!(first["stream"], true);
    assert_eq!(first["tools"].as_array().unwrap().len(), 3);
    assert!(first["messages"][0]["content"].as_str().unwrap().contains("- /w (read-write)"));
    drop(t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_calls_run_in_parallel_and_commit_in_model_order() {
    let model = MockModel::start(vec![
        Reply::calls(&[
            ("a", "sleep", r#"{"ms": 600}"#),
            ("b", "sleep", r#"{"ms": 10}"#),
            ("c", "sleep", r#"{"ms": 300}"#),
        ]),
        Reply::text("slept"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "p",
        &["sleep"],
        vec![],
        LoopGuards::default(),
    )
    .await;
    let started = Instant::now();
    assert_eq!(
        submit(&h, "p", "sleep three times").await,
        Submitted::Ran(TurnOutcome::Answer("slept".into()))
    );
    assert!(
        started.elapsed() < Duration::from_millis(900 + 400),
        "not parallel: {:?}",
        started.elapsed()
    );
    let ids: Vec<String> = bodies(&h, "p")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["a", "b", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn side_effects_run_in_order_with_intent_then_result() {
    let (t, g) = ws();
    let model = MockModel::start(vec![
        Reply::calls(&[
            ("w", "fs_write_file", r#"{"path": "/w/b.txt", "content": "bravo"}"#),
            ("r", "fs_read_file", r#"{"path": "/w/b.txt"}"#),
        ]),
        Reply::text("wrote and read"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "w", FS, g, LoopGuards::default()).await;
    submit(&h, "w", "write then read").await;
    let msgs = bodies(&h, "w");
    let read: Value = serde_json::from_str(msgs[3]["content"].as_str().unwrap()).unwrap();
    assert_eq!(read["content"], "bravo", "the read ran after the write");
    let write: Value = serde_json::from_str(msgs[2]["content"].as_str().unwrap()).unwrap();
    assert_eq!(write["changes"]["created"][0]["path"], "/w/b.txt");
    let tl = Views::of(h.internals().engine).timeline(&SessionId::from("w")).await.unwrap();
    let statuses: Vec<(String, String)> =
        tl.tool_calls.iter().map(|c| (c.entry.tool.clone(), c.entry.status.to_string())).collect();
    assert_eq!(
        statuses,
        [("fs_write_file".to_string(), "done".to_string()), ("fs_read_file".into(), "done".into())]
    );
    assert!(tl.tool_calls[0].entry.changes.as_deref().unwrap().contains("/w/b.txt"));
    drop(t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_g3_bad_calls_become_typed_tool_errors_and_the_loop_goes_on() {
    let (t, g) = ws();
    let model = MockModel::start(vec![
        Reply::calls(&[
            ("x", "fs_read_file", r#"{"path": "/w/a.txt""#),
            ("y", "rm_rf", "{}"),
            ("z", "fs_read_file", r#"{"path": 7}"#),
            ("z", "fs_read_file", r#"  {"path": "/w/a.txt"}  "#),
        ]),
        Reply::text("handled"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "g", FS, g, LoopGuards::default()).await;
    assert_eq!(submit(&h, "g", "go").await, Submitted::Ran(TurnOutcome::Answer("handled".into())));
    let msgs = bodies(&h, "g");
    let kinds: Vec<String> = msgs[2..6]
        .iter()
        .map(|m| {
            let v: Value = serde_json::from_str(m["content"].as_str().unwrap()).unwrap();
            v["error"]["kind"].as_str().unwrap_or("ok").to_string()
        })
        .collect();
    assert_eq!(kinds, ["invalid_input", "unknown_tool", "invalid_input", "duplicate_call_id"]);
    assert!(
        msgs[4]["content"].as_str().unwrap().contains("/path"),
        "G3: the error names the field"
    );
    assert!(msgs[3]["content"].as_str().unwrap().contains("available tools: fs_read_file"));
    // Every call got exactly one result, under a unique id.
    let ids: Vec<&str> = msgs[1]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["x", "y", "z", "z#3"]);
    drop(t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_retryable_failures_are_retried_then_fail_clearly_without_partial_commit() {
    let model = MockModel::start(vec![
        Reply::Status { code: 429, retry_after: Some(0), body: "slow down".into() },
        Reply::Sse {
            events: vec![json!({"choices": [{"delta": {"content": "partial"}}]})],
            cut: true,
        },
        Reply::Empty,
        Reply::text("finally"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(home.path(), &model.url(), "r", FS, vec![], LoopGuards::default())
        .await;
    // max_retries = 2: 429, truncated, empty would be 3 failures — set 3 for this session.
    let out = submit(&h, "r", "hello").await;
    // Three failures exhaust two retries.
    match out {
        Submitted::Ran(TurnOutcome::Failed(e)) => {
            assert!(e.contains("after 3 attempt(s)") && e.contains("empty body"), "{e}")
        }
        other => panic!("expected failure, got {other:?}"),
    }
    assert_eq!(bodies(&h, "r"), [json!({"role": "user", "content": "hello"})], "no partial commit");
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("r")).await.unwrap().runtime.state,
        RuntimeState::Failed
    );
    // The next input runs normally (the scripted answer is next).
    assert_eq!(
        submit(&h, "r", "again").await,
        Submitted::Ran(TurnOutcome::Answer("finally".into()))
    );
    model.push(vec![
        Reply::Status { code: 500, retry_after: None, body: "boom".into() },
        Reply::Status { code: 503, retry_after: None, body: "boom".into() },
        Reply::Status { code: 500, retry_after: None, body: "boom".into() },
        Reply::Status { code: 400, retry_after: None, body: "bad request".into() },
    ]);
    let out = submit(&h, "r", "third").await;
    assert!(
        matches!(&out, Submitted::Ran(TurnOutcome::Failed(e)) if e.contains("HTTP 500")),
        "{out:?}"
    );
    // 400 is not retried.
    let out = submit(&h, "r", "fourth").await;
    assert!(
        matches!(&out, Submitted::Ran(TurnOutcome::Failed(e)) if e.contains("after 1 attempt(s)") && e.contains("HTTP 400")),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loop_guards_end_the_turn_with_a_notice() {
    let home = tempfile::tempdir().unwrap();
    let same = || Reply::calls(&[("c", "echo", r#"{"text": "again"}"#)]);
    let model = MockModel::start(vec![same(), same(), same(), same()]).await;
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "rep",
        &["echo", "boom"],
        vec![],
        LoopGuards::default(),
    )
    .await;
    match submit(&h, "rep", "loop").await {
        Submitted::Ran(TurnOutcome::Stopped(n)) => assert!(n.contains("repeated 3 times"), "{n}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(model.requests().len(), 3);
    let failing = || Reply::calls(&[("c", "boom", "{}")]);
    model.push((0..6).map(|_| failing()).collect());
    let guards = LoopGuards { max_repeats: 100, ..LoopGuards::default() };
    let h =
        harness_with_session(home.path(), &model.url(), "err", &["echo", "boom"], vec![], guards)
            .await;
    match submit(&h, "err", "fail").await {
        Submitted::Ran(TurnOutcome::Stopped(n)) => {
            assert!(n.contains("5 tool calls failed in a row"), "{n}")
        }
        other => panic!("{other:?}"),
    }
    let varied = |i: usize| Reply::calls(&[("c", "echo", &format!(r#"{{"text": "{i}"}}"#))]);
    model.push((0..5).map(varied).collect());
    let guards = LoopGuards { max_steps: 4, ..LoopGuards::default() };
    let h =
        harness_with_session(home.path(), &model.url(), "steps", &["echo"], vec![], guards).await;
    match submit(&h, "steps", "count").await {
        Submitted::Ran(TurnOutcome::Stopped(n)) => {
            assert!(n.contains("limit of 4 model calls"), "{n}")
        }
        other => panic!("{other:?}"),
    }
    let last = bodies(&h, "steps").pop().unwrap();
    assert!(last["content"].as_str().unwrap().starts_with("[keel] Turn stopped"));
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("steps"))
            .await
            .unwrap()
            .runtime
            .state,
        RuntimeState::Idle
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a7_interrupt_during_a_model_call_and_during_a_running_tool() {
    let home = tempfile::tempdir().unwrap();
    let model = MockModel::start(vec![
        Reply::Delay(Duration::from_secs(20), Box::new(Reply::text("too late"))),
        Reply::calls(&[("s", "spin", "{}")]),
        Reply::text("resumed"),
    ])
    .await;
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "int",
        &["spin"],
        vec![],
        LoopGuards::default(),
    )
    .await;
    for _ in 0..2 {
        let h2 = h.clone();
        let interrupter = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            h2.internals().engine.request_interrupt(&SessionId::from("int")).await.unwrap();
        });
        let started = Instant::now();
        assert_eq!(submit(&h, "int", "work").await, Submitted::Ran(TurnOutcome::Interrupted));
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
        interrupter.await.unwrap();
        assert_eq!(
            SessionMeta::read(h.internals().engine, &SessionId::from("int"))
                .await
                .unwrap()
                .runtime
                .state,
            RuntimeState::Interrupted
        );
    }
    // The interrupted tool call was closed with a result: no orphan call in the history.
    let msgs = bodies(&h, "int");
    let calls: usize = msgs.iter().filter_map(|m| m["tool_calls"].as_array()).map(Vec::len).sum();
    let results = msgs.iter().filter(|m| m["role"] == "tool").count();
    assert_eq!((calls, results), (1, 1));
    assert!(msgs.last().unwrap()["content"].as_str().unwrap().contains("cancelled"));
    // The next input continues cleanly.
    assert_eq!(
        submit(&h, "int", "go on").await,
        Submitted::Ran(TurnOutcome::Answer("resumed".into()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c4_two_hosts_one_session_one_runner_nothing_lost_order_kept() {
    let home = tempfile::tempdir().unwrap();
    let model = MockModel::start(vec![
        Reply::Delay(Duration::from_millis(500), Box::new(Reply::text("answer one"))),
        Reply::text("answer two"),
        Reply::text("answer three"),
    ])
    .await;
    let a = harness_with_session(
        home.path(),
        &model.url(),
        "c4",
        &["echo"],
        vec![],
        LoopGuards::default(),
    )
    .await;
    // A second, independent host on the same database (its own writer and runner identity).
    let b = harness_with_session(
        home.path(),
        &model.url(),
        "c4",
        &["echo"],
        vec![],
        LoopGuards::default(),
    )
    .await;
    assert_ne!(a.internals().brain.owner(), b.internals().brain.owner());
    let first = tokio::spawn({
        let a = a.clone();
        async move { submit(&a, "c4", "one").await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let second = submit(&b, "c4", "two").await;
    let third = submit(&b, "c4", "three").await;
    assert!(matches!(second, Submitted::Queued { .. }), "{second:?}");
    assert!(matches!(third, Submitted::Queued { .. }), "{third:?}");
    assert!(matches!(first.await.unwrap(), Submitted::Ran(TurnOutcome::Answer(_))));
    let msgs = bodies(&a, "c4");
    let texts: Vec<&str> = msgs.iter().map(|m| m["content"].as_str().unwrap_or("")).collect();
    assert_eq!(texts, ["one", "answer one", "two", "answer two", "three", "answer three"]);
    assert_eq!(model.requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_function_call_and_non_streamed_replies_are_understood() {
    let home = tempfile::tempdir().unwrap();
    let model = MockModel::start(vec![
        Reply::Json(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null,
            "function_call": {"name": "echo", "arguments": "{\"text\": \"legacy\"}"}}, "finish_reason": "function_call"}]})),
        Reply::Json(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "echo", "arguments": "{\"text\": \"modern\"}"}}]}, "finish_reason": "tool_calls"}]})),
        Reply::Json(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}]})),
    ])
    .await;
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "leg",
        &["echo"],
        vec![],
        LoopGuards::default(),
    )
    .await;
    assert_eq!(submit(&h, "leg", "hi").await, Submitted::Ran(TurnOutcome::Answer("done".into())));
    let results: Vec<Value> = bodies(&h, "leg")
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| serde_json::from_str(m["content"].as_str().unwrap()).unwrap())
        .collect();
    assert_eq!(results, [json!({"text": "legacy"}), json!({"text": "modern"})]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_never_reaches_the_database_or_the_evidence() {
    const KEY: &str = "sk-canary-5e1f0c2a9d";
    let home = tempfile::tempdir().unwrap();
    let model = MockModel::start(vec![Reply::text("ok")]).await;
    harness_with_session(home.path(), &model.url(), "k", &["echo"], vec![], LoopGuards::default())
        .await;
    let keyed = keel::harness::Harness::open(
        keel::home::Home::at(home.path()).unwrap(),
        keel_tests::test_limits(),
        Some(KEY.to_string()),
        LoopGuards::default(),
        &|_| {},
    )
    .await
    .unwrap();
    assert_eq!(submit(&keyed, "k", "hi").await, Submitted::Ran(TurnOutcome::Answer("ok".into())));
    let (_, evidence) = keel::assembly::Assembly::of(keyed.internals().engine)
        .evidence(&SessionId::from("k"), None)
        .await
        .unwrap();
    assert!(!String::from_utf8_lossy(&evidence).contains(KEY));
    // The session's events (in the files scanned below) were written too.
    assert!(keyed.internals().engine.last_event(&SessionId::from("k")).await.unwrap() >= 6);
    for file in ["keel.db", "keel.db-wal"] {
        let bytes = std::fs::read(home.path().join(file)).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&bytes).contains(KEY), "the key is in {file}");
    }
}

/// Assembly reads a session's history incrementally (rows are append-only): messages appended
/// by this engine or by another process are all in the next request, and the request is byte
/// for byte what a fresh engine, reading every row, assembles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assembly_sees_every_new_message_and_meta_change_and_matches_a_full_read() {
    use keel::session::{NewSession, Policy, SessionEngine};
    let home = tempfile::tempdir().unwrap();
    let path = home.path().join("keel.db");
    let a = SessionEngine::new(keel_tests::db_of(&path), keel::harness::REACTIONS);
    // Session `s`, no tools or grants, with `prompt`.
    let session = |prompt: &str| NewSession {
        pins: Default::default(),
        user: None,
        named_tools: true,
        owner: None,
        id: Some("s".into()),
        grants: Vec::new(),
        net: Default::default(),
        tools: Vec::new(),
        policy: Policy::default(),
        budget: keel::sandbox::Budget::default(),
        model: keel::model::ModelConfig::new("http://127.0.0.1:9/v1", "m"),
        system_prompt: prompt.into(),
        guards: None,
        preprocess: None,
    };
    a.create(session("p")).await.unwrap();
    let b = SessionEngine::new(keel_tests::db_of(&path), keel::harness::REACTIONS);
    for i in 0..6 {
        // Alternate the writer: this engine, then "another process".
        let writer = if i % 2 == 0 { &a } else { &b };
        writer.submit(&SessionId::from("s"), &format!("message {i}")).await.unwrap();
        writer.begin_turn(&SessionId::from("s")).await.unwrap().unwrap();
        let (mine, full) = assemble_twice(&a, &path).await;
        assert_eq!(mine.1.history_to, i + 1);
        let text = String::from_utf8(mine.1.body.to_vec()).unwrap();
        for j in 0..=i {
            assert!(text.contains(&format!("message {j}")), "step {i} lacks message {j}");
        }
        assert_eq!(mine, full, "step {i}: cached and full reads differ");
    }
    // The meta changes in another process: its state, its tools (through SessionEngine), and
    // — as a later keel might — its prompt and model by plain SQL, which the database itself
    // versions (migration 5). Each is seen at once, and matches a full read.
    b.set_state(&SessionId::from("s"), keel::session::RuntimeState::Failed, Some("x".into()))
        .await
        .unwrap();
    let (mine, full) = assemble_twice(&a, &path).await;
    assert_eq!(mine.0.runtime.state, keel::session::RuntimeState::Failed);
    assert_eq!(mine, full);
    let version = mine.1.meta_version;
    Preparation::of(&b)
        .add_tools(&SessionId::from("s"), vec!["fs_read_file".into()])
        .await
        .unwrap();
    let (mine, full) = assemble_twice(&a, &path).await;
    assert_eq!(mine.0.capabilities.loaded_tools, ["fs_read_file"]);
    assert_eq!(mine.1.tools.as_ref().unwrap().text.as_ref(), "[\"fs_read_file\"]");
    assert_eq!(mine, full);
    let other = keel_tests::store_of(&path);
    other
        .execute(
            match other.backend() {
                keel::sql::Backend::Sqlite => {
                    "UPDATE session_config SET system_prompt='a new prompt', model=json_set(model, '$.model', 'm2')"
                }
                keel::sql::Backend::Postgres => {
                    "UPDATE session_config SET system_prompt='a new prompt', model=jsonb_set(model::jsonb, '{model}', '\"m2\"')::text"
                }
            },
            [],
        )
        .unwrap();
    let (mine, full) = assemble_twice(&a, &path).await;
    assert_eq!(mine.1.meta_version, version + 2, "one bump per change");
    assert!(mine.1.system.text.contains("a new prompt"));
    assert!(mine.1.head.text.contains("\"m2\""));
    assert_eq!(mine, full);
    other.execute("DELETE FROM session_grants", []).unwrap();
    other
        .execute(
            "INSERT INTO session_grants (session_id, host, guest, access) VALUES ('s', '/tmp', '/t', 'ro')",
            [],
        )
        .unwrap();
    let (mine, full) = assemble_twice(&a, &path).await;
    assert!(mine.1.system.text.contains("- /t (read-only)"));
    assert_eq!(mine, full);
    // A new session under the same id (keel deletes no session today; a later one might),
    // with a longer history and, by construction, the same meta version: nothing cached for
    // the old one is used.
    let (old_version, old_to) = (mine.1.meta_version, mine.1.history_to);
    other
        .execute_batch(match other.backend() {
            keel::sql::Backend::Sqlite => "PRAGMA foreign_keys=OFF;",
            // The test cluster's user is its superuser: foreign keys unchecked, as above.
            keel::sql::Backend::Postgres => "SET session_replication_role = replica;",
        })
        .unwrap();
    other
        .execute_batch(
            "DELETE FROM messages; DELETE FROM session_grants; DELETE FROM inbox;
             DELETE FROM evidence; DELETE FROM tool_calls; DELETE FROM runner_leases;
             DELETE FROM session_config; DELETE FROM sessions;",
        )
        .unwrap();
    b.create(session("born again")).await.unwrap();
    for i in 0..=old_to {
        b.submit(&SessionId::from("s"), &format!("again {i}")).await.unwrap();
        b.begin_turn(&SessionId::from("s")).await.unwrap().unwrap();
    }
    other
        .execute("UPDATE sessions SET meta_version=?1, created_at=created_at+1", [old_version])
        .unwrap();
    let (mine, full) = assemble_twice(&a, &path).await;
    assert_eq!(mine.1.meta_version, old_version);
    assert!(mine.1.system.text.contains("born again"));
    assert!(!String::from_utf8_lossy(&mine.1.body).contains("message 0"));
    assert_eq!(mine, full);
}

type Assembly = (keel::meta::SessionMeta, keel::assembly::Assembled);

/// The next request of session `s`, assembled by `engine` (with whatever it has cached) and by
/// a fresh engine reading everything.
async fn assemble_twice(
    engine: &keel::session::SessionEngine,
    path: &std::path::Path,
) -> (Assembly, Assembly) {
    // The tool schemas as a catalog would hand them out: one shared text per tool set.
    static SCHEMAS: std::sync::Mutex<Vec<(Vec<String>, std::sync::Arc<str>)>> =
        std::sync::Mutex::new(Vec::new());
    let tools = |_: &keel::sql::Connection,
                 m: &keel::meta::SessionMeta,
                 _: keel::assembly::Schemas|
     -> Option<std::sync::Arc<str>> {
        if m.capabilities.loaded_tools.is_empty() {
            return None;
        }
        let mut known = SCHEMAS.lock().unwrap();
        if let Some((_, json)) = known.iter().find(|(t, _)| *t == m.capabilities.loaded_tools) {
            return Some(json.clone());
        }
        let json: std::sync::Arc<str> =
            serde_json::to_string(&m.capabilities.loaded_tools).unwrap().into();
        known.push((m.capabilities.loaded_tools.clone(), json.clone()));
        Some(json)
    };
    let mine =
        keel::assembly::Assembly::of(engine).assemble(&SessionId::from("s"), tools).await.unwrap();
    let fresh =
        keel::session::SessionEngine::new(keel_tests::db_of(path), keel::harness::REACTIONS);
    let full =
        keel::assembly::Assembly::of(&fresh).assemble(&SessionId::from("s"), tools).await.unwrap();
    (mine, full)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_parts_are_stored_once_and_again_when_they_change() {
    let (t, g) = ws();
    let model = MockModel::start(vec![
        Reply::calls(&[("call_1", "fs_read_file", r#"{"path": "/w/a.txt"}"#)]),
        Reply::text("alpha"),
        Reply::calls(&[("call_2", "fs_list_dir", r#"{"path": "/w"}"#)]),
        Reply::text("one file"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "s",
        &["fs_read_file"],
        g,
        LoopGuards::default(),
    )
    .await;
    assert!(matches!(submit(&h, "s", "Read a.txt").await, Submitted::Ran(TurnOutcome::Answer(_))));
    // The session's tool schemas change: the new ones must be stored with the next request.
    Preparation::of(h.internals().engine)
        .add_tools(&SessionId::from("s"), vec!["fs_list_dir".into()])
        .await
        .unwrap();
    assert!(matches!(submit(&h, "s", "List /w").await, Submitted::Ran(TurnOutcome::Answer(_))));
    let received = model.requests();
    assert_eq!(received.len(), 4);
    for (i, body) in received.iter().enumerate() {
        let (step, evidence) = keel::assembly::Assembly::of(h.internals().engine)
            .evidence(&SessionId::from("s"), Some(i as i64 + 1))
            .await
            .unwrap();
        assert_eq!(&evidence, body, "evidence of step {step} differs from the request");
        // A fresh engine, which knows of no stored part, rebuilds it the same way.
        let fresh = keel::session::SessionEngine::new(
            keel_tests::db_of(&home.path().join("keel.db")),
            keel::harness::REACTIONS,
        );
        assert_eq!(
            &keel::assembly::Assembly::of(&fresh)
                .evidence(&SessionId::from("s"), Some(step))
                .await
                .unwrap()
                .1,
            body
        );
    }
    // One head, one system message, one notes message (the goals), two sets of tool
    // schemas: each stored once.
    let c = keel_tests::store_of(&home.path().join("keel.db"));
    let blobs: i64 = c
        .query_row(
            "SELECT COUNT(*) FROM blobs WHERE hash NOT IN
             (SELECT body_sha256 FROM task_transitions WHERE body_sha256 IS NOT NULL)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(blobs, 5);
    let steps: i64 =
        c.query_row("SELECT steps FROM sessions WHERE id='s'", [], |r| r.get(0)).unwrap();
    assert_eq!(steps, 4, "the session's step counter follows its requests");
    drop(t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_oversized_and_absurd_replies_fail_clearly_and_the_session_goes_on() {
    let limit = keel::model::MAX_REPLY_BYTES;
    let huge = "x".repeat(limit + 1);
    let model = MockModel::start(vec![
        // A 200 larger than the limit: refused, not retried.
        Reply::Json(json!({"choices": [{"message": {"role": "assistant", "content": huge}}]})),
        // Error bodies larger than the limit: only their start is read, then retried as usual
        // (once: the same 500 twice is the server's answer to these bytes).
        Reply::Status { code: 500, retry_after: None, body: "y".repeat(limit + 1) },
        Reply::Status { code: 500, retry_after: None, body: "y".repeat(limit + 1) },
        // A stream delta naming call index 2^60: refused before room is made for the calls.
        Reply::Sse {
            events: vec![json!({"choices": [{"delta": {"tool_calls": [
                {"index": 1u64 << 60, "id": "c", "function": {"name": "echo", "arguments": "{}"}}
            ]}}]})],
            cut: false,
        },
        Reply::text("still here"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "big", FS, vec![], LoopGuards::default())
            .await;
    let failed = |out: Submitted| match out {
        Submitted::Ran(TurnOutcome::Failed(e)) => e,
        other => panic!("expected a failed turn, got {other:?}"),
    };
    let e = failed(submit(&h, "big", "one").await);
    assert!(e.contains("after 1 attempt(s)") && e.contains("larger than 32 MiB"), "{e}");
    let e = failed(submit(&h, "big", "two").await);
    assert!(e.contains("after 2 attempt(s)") && e.contains("HTTP 500"), "{e}");
    assert!(e.len() < 2_200, "the error shows only the start of the body ({} bytes)", e.len());
    let e = failed(submit(&h, "big", "three").await);
    assert!(
        e.contains("after 1 attempt(s)") && e.contains("tool call index 1152921504606846976"),
        "{e}"
    );
    // Nothing of the refused replies was committed; the session answers the next input.
    let users: Vec<Value> =
        ["one", "two", "three"].iter().map(|t| json!({"role": "user", "content": t})).collect();
    assert_eq!(bodies(&h, "big"), users);
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("big"))
            .await
            .unwrap()
            .runtime
            .state,
        RuntimeState::Failed
    );
    assert_eq!(
        submit(&h, "big", "four").await,
        Submitted::Ran(TurnOutcome::Answer("still here".into()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guards_of_zero_are_raised_and_never_leave_a_turn_running() {
    // A turn with "at most 0 model calls" used to end without a model call and without
    // leaving the running state, so the next process took it for an unclean stop.
    let model = MockModel::start(vec![
        Reply::text("one call is allowed"),
        Reply::calls(&[("c1", "echo", r#"{"text": "x"}"#)]),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let zero = LoopGuards {
        max_steps: 0,
        max_repeats: 0,
        max_consecutive_errors: 0,
        max_parallel: 0,
        ..LoopGuards::default()
    };
    let h = harness_with_session(home.path(), &model.url(), "z", &["echo"], vec![], zero).await;
    assert_eq!(
        submit(&h, "z", "hello").await,
        Submitted::Ran(TurnOutcome::Answer("one call is allowed".into()))
    );
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("z")).await.unwrap().runtime.state,
        RuntimeState::Idle
    );
    // The step limit (1) ends the next turn after its one call, with the notice, idle.
    let out = submit(&h, "z", "call echo").await;
    assert!(
        matches!(&out, Submitted::Ran(TurnOutcome::Stopped(n)) if n.contains("limit of 1 model calls")),
        "{out:?}"
    );
    let meta = SessionMeta::read(h.internals().engine, &SessionId::from("z")).await.unwrap();
    assert_eq!(meta.runtime.state, RuntimeState::Idle);
    assert_eq!(meta.runtime.active_turn, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_url_that_cannot_work_fails_at_once_without_retries() {
    // A session whose stored URL is not http(s) (written before validation, or by hand).
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        "ftp://127.0.0.1/v1",
        "u",
        &["echo"],
        vec![],
        LoopGuards::default(),
    )
    .await;
    match submit(&h, "u", "hello").await {
        Submitted::Ran(TurnOutcome::Failed(e)) => {
            assert!(
                e.contains("after 1 attempt(s)") && e.contains("not an http:// or https:// URL"),
                "{e}"
            )
        }
        other => panic!("expected a failed turn, got {other:?}"),
    }
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("u")).await.unwrap().runtime.state,
        RuntimeState::Failed
    );
}

/// A redirect is not followed (a POST would be resent as a GET, or its key not sent to the new
/// host): the call fails at once, naming the new address, and nothing of it is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirecting_model_server_fails_the_call_at_once_naming_the_new_address() {
    for code in [301u16, 307] {
        let model = MockModel::start(vec![
            Reply::Redirect {
                code,
                location: "https://elsewhere.example/v1/chat/completions".into(),
            },
            Reply::text("never asked"),
        ])
        .await;
        let home = tempfile::tempdir().unwrap();
        let h = harness_with_session(
            home.path(),
            &model.url(),
            "r",
            &["echo"],
            vec![],
            LoopGuards::default(),
        )
        .await;
        match submit(&h, "r", "hello").await {
            Submitted::Ran(TurnOutcome::Failed(e)) => assert!(
                e.contains("after 1 attempt(s)")
                    && e.contains(&format!("HTTP {code}"))
                    && e.contains("https://elsewhere.example/v1/chat/completions"),
                "{e}"
            ),
            other => panic!("expected a failed turn, got {other:?}"),
        }
        assert_eq!(model.requests().len(), 1, "not followed, not retried");
        // Only the user's input is in the history: nothing of the call was committed.
        assert_eq!(bodies(&h, "r").len(), 1);
        assert_eq!(
            SessionMeta::read(h.internals().engine, &SessionId::from("r"))
                .await
                .unwrap()
                .runtime
                .state,
            RuntimeState::Failed
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_input_is_refused_and_leaves_nothing_behind() {
    let model = MockModel::start(vec![Reply::text("hello to you")]).await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "e",
        &["echo"],
        vec![],
        LoopGuards::default(),
    )
    .await;
    for empty in ["", "  \n\t"] {
        let err = h
            .internals()
            .brain
            .submit(&SessionId::from("e"), empty, &CancelToken::new(), &no_events())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }
    assert!(bodies(&h, "e").is_empty(), "nothing was appended");
    assert!(model.requests().is_empty(), "no model call was made");
    // No runner lease was left behind: the next input runs at once.
    assert_eq!(
        submit(&h, "e", "hello").await,
        Submitted::Ran(TurnOutcome::Answer("hello to you".into()))
    );
}

/// A step resolves its calls against the catalog read in its own snapshot (not through the
/// tool service's connection): a component another process installs between two turns is
/// offered to the model and runs at the next step; once that process removes it, it is
/// neither offered nor run. The catalog is loaded only when it changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_sees_the_catalog_another_process_changed() {
    let work = tempfile::tempdir().unwrap();
    let g = vec![Grant::new(work.path(), "/work", Access::Rw).unwrap()];
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "effect_peek", r#"{"label":"a"}"#)]),
        Reply::text("not there"),
        Reply::calls(&[("c2", "effect_peek", r#"{"label":"b"}"#)]),
        Reply::calls(&[("c3", "echo", r#"{"text":"hi"}"#)]),
        Reply::text("there"),
        Reply::calls(&[("c4", "effect_peek", r#"{"label":"c"}"#)]),
        Reply::text("gone"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "s",
        &["echo", "effect_peek"],
        g,
        LoopGuards::default(),
    )
    .await;
    assert_eq!(
        submit(&h, "s", "peek").await,
        Submitted::Ran(TurnOutcome::Answer("not there".into()))
    );
    let other = keel::tools::ToolService::open(
        keel::home::Home::at(home.path()).unwrap(),
        keel_tests::test_limits(),
        &|_| {},
    )
    .await
    .unwrap();
    let effects = std::fs::read(keel_tests::guests::EFFECTS_COMPONENT).unwrap();
    other.install(&effects, "effects", "test", false).await.unwrap();
    let loads = h.internals().tools.catalog_loads();
    assert_eq!(
        submit(&h, "s", "peek again").await,
        Submitted::Ran(TurnOutcome::Answer("there".into()))
    );
    assert_eq!(
        h.internals().tools.catalog_loads(),
        loads + 1,
        "loaded once for the change, not per step"
    );
    other.remove("effects").unwrap();
    assert_eq!(
        submit(&h, "s", "peek once more").await,
        Submitted::Ran(TurnOutcome::Answer("gone".into()))
    );

    let result =
        |m: &Value| -> Value { serde_json::from_str(m["content"].as_str().unwrap()).unwrap() };
    let msgs = bodies(&h, "s");
    let tool_results: Vec<Value> =
        msgs.iter().filter(|m| m["role"] == "tool").map(result).collect();
    assert_eq!(tool_results.len(), 4, "{msgs:#?}");
    assert_eq!(tool_results[0]["error"]["kind"], "not_installed", "{:?}", tool_results[0]);
    assert_eq!(tool_results[1], json!({"label": "b", "lines": 0}), "{:?}", tool_results[1]);
    assert!(tool_results[2]["error"].is_null(), "{:?}", tool_results[2]);
    assert_eq!(tool_results[3]["error"]["kind"], "not_installed", "{:?}", tool_results[3]);
    // What the model was offered at each request.
    let offered: Vec<Vec<String>> = model
        .requests()
        .iter()
        .map(|b| {
            let v: Value = serde_json::from_slice(b).unwrap();
            v["tools"]
                .as_array()
                .map(|t| {
                    t.iter().map(|t| t["function"]["name"].as_str().unwrap().to_string()).collect()
                })
                .unwrap_or_default()
        })
        .collect();
    let echo = vec!["echo".to_string()];
    let both = vec!["echo".to_string(), "effect_peek".to_string()];
    assert_eq!(
        offered,
        [echo.clone(), echo.clone(), both.clone(), both.clone(), both, echo.clone(), echo]
    );
}

/// H4: an upgrade never changes the implementation under a running session: it keeps the
/// component digest it loaded (requests and calls) until it is told to upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h4_a_session_keeps_the_component_version_it_loaded_until_told_to_upgrade() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "echo", r#"{"text":"one"}"#)]),
        Reply::text("first"),
        Reply::calls(&[("c2", "echo", r#"{"text":"two"}"#)]),
        Reply::text("second"),
        Reply::calls(&[("c3", "echo", r#"{"text":"three"}"#)]),
        Reply::text("third"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "s",
        &["echo"],
        Vec::new(),
        LoopGuards::default(),
    )
    .await;
    let old = h.internals().tools.resolve("echo").unwrap().digest.clone();
    let pins = h.internals().tools.current_pins(&["echo".to_string()]).unwrap();
    Preparation::of(h.internals().engine)
        .pin_tools(&SessionId::from("s"), pins, false)
        .await
        .unwrap();
    assert_eq!(submit(&h, "s", "one").await, Submitted::Ran(TurnOutcome::Answer("first".into())));
    // The admin upgrades the component (a custom section: a new digest, the same tools).
    let mut bytes = std::fs::read(keel_tests::guests::HOSTILE_COMPONENT).unwrap();
    bytes.extend_from_slice(&[0, 8, 7]);
    bytes.extend_from_slice(b"upgrade");
    let r = h
        .internals()
        .tools
        .install_as(&bytes, "hostile", "test", keel::tools::InstallMode::Upgrade)
        .await
        .unwrap();
    let new = r.component.digest.clone();
    assert_ne!(old, new);
    assert!(home.path().join("components").join(format!("{old}.wasm")).exists());
    assert_eq!(submit(&h, "s", "two").await, Submitted::Ran(TurnOutcome::Answer("second".into())));
    // Pinning again without an upgrade keeps what the session loaded.
    let pins = h.internals().tools.current_pins(&["echo".to_string()]).unwrap();
    assert!(
        Preparation::of(h.internals().engine)
            .pin_tools(&SessionId::from("s"), pins.clone(), false)
            .await
            .unwrap()
            .is_empty()
    );
    let changed = Preparation::of(h.internals().engine)
        .pin_tools(&SessionId::from("s"), pins, true)
        .await
        .unwrap();
    assert_eq!(changed, vec![("echo".to_string(), Some(old.clone()), new.clone())]);
    assert_eq!(submit(&h, "s", "three").await, Submitted::Ran(TurnOutcome::Answer("third".into())));
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("s")).await.unwrap();
    let ran: Vec<(String, Option<String>)> = t
        .tool_calls
        .iter()
        .map(|c| (c.entry.call_id.to_string(), c.entry.component_digest.clone()))
        .collect();
    assert_eq!(
        ran,
        vec![
            ("c1".to_string(), Some(old.clone())),
            ("c2".to_string(), Some(old.clone())),
            ("c3".to_string(), Some(new.clone())),
        ]
    );
    assert_eq!(t.tool_pins.get("echo"), Some(&new));
}

/// G5: a reply cut by the token limit inside a tool call. The call is refused and the model
/// told it was cut off; the history stays valid for the strictest server (the mock answers
/// like llama.cpp: 500 on any tool-call arguments that are not a JSON object), and the
/// session keeps working; the raw text stays in the journal and the stored message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_a_tool_call_cut_by_the_token_limit_never_poisons_the_history() {
    let cut = Reply::Sse {
        events: vec![
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1",
                "type": "function", "function": {"name": "echo", "arguments": "{\"text\": \"abc"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
        ],
        cut: false,
    };
    let model = MockModel::start_strict(vec![
        cut,
        Reply::text("saw the cut"),
        Reply::text("still working"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "s",
        &["echo"],
        Vec::new(),
        LoopGuards::default(),
    )
    .await;
    assert_eq!(
        submit(&h, "s", "echo something long").await,
        Submitted::Ran(TurnOutcome::Answer("saw the cut".into()))
    );
    assert_eq!(
        submit(&h, "s", "and now?").await,
        Submitted::Ran(TurnOutcome::Answer("still working".into()))
    );
    let requests = model.requests();
    assert_eq!(requests.len(), 3, "no request was refused and retried");
    for body in &requests[1..] {
        let v: Value = serde_json::from_slice(body).unwrap();
        let assistant =
            v["messages"].as_array().unwrap().iter().find(|m| m["tool_calls"].is_array()).unwrap();
        assert_eq!(assistant["tool_calls"][0]["function"]["arguments"], "{}");
        let result =
            v["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap();
        let text = result["content"].as_str().unwrap();
        assert!(text.contains("cut off by the token limit"), "{text}");
    }
    // The raw text is kept: in the journal and in the stored message.
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("s")).await.unwrap();
    assert_eq!(t.tool_calls[0].entry.input, "{\"text\": \"abc");
    let stored = t.messages.iter().find(|m| m.body["tool_calls"].is_array()).unwrap();
    assert_eq!(stored.body["tool_calls"][0]["function"]["arguments"], "{\"text\": \"abc");
}

/// Identical calls in one reply count as one repeat: three identical parallel calls do not
/// end the turn (the repeat guard stops at 3 repeats in a row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_parallel_calls_in_one_reply_are_one_repeat() {
    let args = r#"{"text":"same"}"#;
    let model = MockModel::start(vec![
        Reply::calls(&[("a", "echo", args), ("b", "echo", args), ("c", "echo", args)]),
        Reply::text("done"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "s",
        &["echo"],
        Vec::new(),
        LoopGuards::default(),
    )
    .await;
    assert_eq!(
        submit(&h, "s", "echo thrice").await,
        Submitted::Ran(TurnOutcome::Answer("done".into()))
    );
    assert_eq!(model.requests().len(), 2);
    // Every request names keel and its version.
    let ua = format!("user-agent: keel/{}", env!("CARGO_PKG_VERSION"));
    assert!(
        model.heads().iter().all(|h| h.to_ascii_lowercase().contains(&ua)),
        "{:?}",
        model.heads()
    );
}

/// A session's loop guards are stored with it: every turn of it — whichever harness (and
/// whatever default) runs it — stops at its own limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_loop_guards_are_stored_and_used_by_every_turn() {
    let call =
        |n: usize| Reply::calls(&[(&format!("c{n}"), "echo", &format!(r#"{{"text":"{n}"}}"#))]);
    let model = MockModel::start((0..6).map(call).collect()).await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "_",
        &["echo"],
        Vec::new(),
        LoopGuards::default(),
    )
    .await;
    h.internals()
        .engine
        .create(keel::session::NewSession {
            pins: Default::default(),
            user: None,
            named_tools: true,
            owner: None,
            id: Some("g".into()),
            grants: Vec::new(),
            net: Default::default(),
            tools: vec!["echo".into()],
            policy: keel::session::Policy::default(),
            budget: keel::sandbox::Budget::default(),
            model: keel::model::ModelConfig::new(&model.url(), "m"),
            system_prompt: "p".into(),
            guards: Some(LoopGuards { max_steps: 2, ..LoopGuards::default() }),
            preprocess: None,
        })
        .await
        .unwrap();
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("g"))
            .await
            .unwrap()
            .config
            .guards
            .map(|g| g.max_steps),
        Some(2)
    );
    for text in ["one", "two"] {
        match submit(&h, "g", text).await {
            Submitted::Ran(TurnOutcome::Stopped(n)) => {
                assert!(n.contains("limit of 2 model calls"), "{n}")
            }
            other => panic!("expected the step limit, got {other:?}"),
        }
    }
    assert_eq!(model.requests().len(), 4, "two model calls per turn, not 24");
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("g")).await.unwrap();
    let notices = t
        .messages
        .iter()
        .filter(|m| {
            m.body["content"].as_str().is_some_and(|c| c.contains("limit of 2 model calls"))
        })
        .count();
    assert_eq!(notices, 2);
}

/// A turn with one read-only tool call commits three times: the input with the runner lease
/// and the turn's start (and, without task understanding, its transition); the step; the
/// answer with the state and the lease released. Task understanding adds one: its transition,
/// committed after its call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_with_one_read_only_call_commits_three_times() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "echo", r#"{"text":"a"}"#)]),
        Reply::text("one"),
        Reply::calls(&[("c2", "echo", r#"{"text":"b"}"#)]),
        Reply::text("two"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "c",
        &["echo"],
        Vec::new(),
        LoopGuards::default(),
    )
    .await;
    keel_tests::plain_session(&h, "p", &["echo"], &model.url()).await;
    for (session, answer, commits) in [("c", "one", 4), ("p", "two", 3)] {
        let before =
            h.internals().engine.db().stats().commits.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            submit(&h, session, "go").await,
            Submitted::Ran(TurnOutcome::Answer(answer.into()))
        );
        let after =
            h.internals().engine.db().stats().commits.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(after - before, commits, "commits of the turn answered {answer:?}");
    }
    // The lease went with the last commit: another runner may take the session at once.
    let other = harness_with_session(
        home.path(),
        &model.url(),
        "c",
        &["echo"],
        Vec::new(),
        LoopGuards::default(),
    )
    .await;
    assert!(other.internals().brain.try_acquire(&SessionId::from("c")).await.unwrap());
}

/// Two tasks of one process submit to one session at once: the lease row names the process,
/// so the Brain keeps them apart itself — the second input waits in the inbox and the first
/// task runs it after its own turn, never beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_of_one_process_never_run_one_session_at_once() {
    let model = MockModel::start(vec![
        Reply::Delay(Duration::from_millis(400), Box::new(Reply::text("one"))),
        Reply::text("two"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        dir.path(),
        &model.url(),
        "unused",
        &[],
        Vec::new(),
        LoopGuards::default(),
    )
    .await;
    keel_tests::plain_session(&h, "par", &[], &model.url()).await;
    let first = {
        let h = h.clone();
        tokio::spawn(async move { submit(&h, "par", "first").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = submit(&h, "par", "second").await;
    assert!(matches!(second, Submitted::Queued { .. }), "{second:?}");
    // The first task ran both turns, one after the other.
    assert_eq!(first.await.unwrap(), Submitted::Ran(TurnOutcome::Answer("two".into())));
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("par")).await.unwrap();
    let order: Vec<String> = t
        .messages
        .iter()
        .map(|m| format!("{} {}", m.role, m.body["content"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(order, ["user first", "assistant one", "user second", "assistant two"]);
    assert!(String::from_utf8_lossy(&model.requests()[1]).contains("\"one\""));
    assert_eq!(t.state, RuntimeState::Idle);
    // Nothing is left behind: a third input runs at once.
    model.push(vec![Reply::text("three")]);
    assert_eq!(
        submit(&h, "par", "third").await,
        Submitted::Ran(TurnOutcome::Answer("three".into()))
    );
}
