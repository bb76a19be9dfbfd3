//! Owner operations carry tracing spans whose fields — `session_id`, `turn`, `step`, `call_id`,
//! `tool` — let one turn's log lines be picked out of a busy host's.
//!
//! The turn runs in a process of its own (this test binary, running only
//! [`turn_in_a_process_of_its_own`]) with a global subscriber: `tracing` caches whether a span's
//! call site is wanted the first time any thread reaches it, so a subscriber of one test among
//! many running at once would miss the call sites another test's thread reached first.

use keel::ids::SessionId;
use std::sync::{Arc, Mutex};

use keel::agent::{LoopGuards, TurnOutcome};
use keel::brain::Submitted;
use keel::sandbox::{Access, CancelToken, Grant};
use keel_tests::harness_with_session;
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::no_events;
use tracing_subscriber::fmt::format::FmtSpan;

/// Where the process of its own writes its log.
const LOG_FILE: &str = "KEEL_SPANS_TEST_LOG";

#[test]
fn a_turn_s_spans_name_its_session_turn_step_call_and_tool() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "spans::turn_in_a_process_of_its_own", "--ignored", "--test-threads=1"])
        .env(LOG_FILE, &log)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "the turn did not run");
    let text = std::fs::read_to_string(&log).unwrap();
    let closed = |path: &str| text.lines().any(|l| l.contains(path) && l.contains("close"));
    // Each span's close line carries the spans it runs in, outermost first.
    let turn = "runner{session_id=s1}:turn{session_id=s1 turn=1}";
    for path in [
        format!("{turn}:model_call{{step=1}}"),
        format!("{turn}:tool_call{{step=1 call_id=call_1 tool=fs_read_file}}"),
        // (the chain's and the turn's close lines carry what they recorded: the sandbox's
        // figures, the outcome)
        format!(
            "{turn}:tool_call{{step=1 call_id=call_1 tool=fs_read_file}}:call_chain{{tool=fs_read_file keel.effect=\"read-only\""
        ),
        format!("{turn}:model_call{{step=2}}"),
        "runner{session_id=s1}:turn{session_id=s1 turn=1 keel.outcome=\"answer\"}".to_string(),
        "runner{session_id=s1}".to_string(),
    ] {
        assert!(closed(&path), "no span closed at `{path}` in the log:\n{text}");
    }
}

/// The log, kept until the process ends.
#[derive(Clone)]
struct File(Arc<Mutex<std::fs::File>>);

impl std::io::Write for File {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().unwrap().flush()
    }
}

/// One tool turn under a global subscriber writing to `KEEL_SPANS_TEST_LOG`; run by the test
/// above in a process of its own, and a no-op anywhere else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by a_turn_s_spans_name_its_session_turn_step_call_and_tool in a process of its own"]
async fn turn_in_a_process_of_its_own() {
    let Some(path) = std::env::var_os(LOG_FILE) else { return };
    let file = File(Arc::new(Mutex::new(std::fs::File::create(path).unwrap())));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("keel=info")
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || file.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    let grants = vec![Grant::new(ws.path(), "/w", Access::Ro).unwrap()];
    let model = MockModel::start(vec![
        Reply::calls(&[("call_1", "fs_read_file", r#"{"path": "/w/a.txt"}"#)]),
        Reply::text("It says alpha."),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "s1",
        &["fs_read_file"],
        grants,
        LoopGuards::default(),
    )
    .await;
    let out = h
        .internals()
        .brain
        .submit(&SessionId::from("s1"), "What does a.txt say?", &CancelToken::new(), &no_events())
        .await;
    assert_eq!(out.unwrap(), Submitted::Ran(TurnOutcome::Answer("It says alpha.".into())));
}
