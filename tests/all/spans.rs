//! Owner operations carry tracing spans whose fields — `session_id`, `turn`, `step`, `call_id`,
//! `tool` — let one turn's log lines be picked out of a busy host's.

use std::io::Write;
use std::sync::{Arc, Mutex};

use keel::agent::{LoopGuards, TurnOutcome};
use keel::brain::Submitted;
use keel::sandbox::{Access, CancelToken, Grant};
use keel_tests::harness_with_session;
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::no_events;
use tracing_subscriber::fmt::format::FmtSpan;

/// What the log writes, kept.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buf {
    type Writer = Buf;
    fn make_writer(&'a self) -> Buf {
        self.clone()
    }
}

// One thread: the runner's tasks run where the test's subscriber is the default.
#[tokio::test(flavor = "current_thread")]
async fn a_turn_s_spans_name_its_session_turn_step_call_and_tool() {
    let log = Buf::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("keel=info")
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(log.clone())
        .finish();
    // This thread's, and every task of the runtime runs on it.
    let _guard = tracing::subscriber::set_default(subscriber);

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
    let out = h.brain.submit("s1", "What does a.txt say?", &CancelToken::new(), &no_events()).await;
    assert_eq!(out.unwrap(), Submitted::Ran(TurnOutcome::Answer("It says alpha.".into())));

    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let closed = |path: &str| text.lines().any(|l| l.contains(path) && l.contains("close"));
    // Each span's close line carries the spans it runs in, outermost first.
    let turn = "runner{session_id=s1}:turn{session_id=s1 turn=1}";
    for path in [
        format!("{turn}:model_call{{step=1}}"),
        format!("{turn}:tool_call{{step=1 call_id=call_1 tool=fs_read_file}}"),
        format!(
            "{turn}:tool_call{{step=1 call_id=call_1 tool=fs_read_file}}:call_chain{{tool=fs_read_file}}"
        ),
        format!("{turn}:model_call{{step=2}}"),
        turn.to_string(),
        "runner{session_id=s1}".to_string(),
    ] {
        assert!(closed(&path), "no span closed at `{path}` in the log:\n{text}");
    }
}
