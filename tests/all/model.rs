//! The model provider against servers that behave like the real ones: slow local streams and
//! silent servers (G6), failures that repeat whatever is sent and garbled replies (G2), a
//! context window the history outgrows, token usage, and replies cut or empty.

use keel::assembly::Assembly;
use keel::ids::SessionId;
use keel::meta::SessionMeta;
use keel::views::Views;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel::agent::{Event, LoopGuards, TurnOutcome};
use keel::brain::Submitted;
use keel::model::{ModelConfig, Usage};
use keel::sandbox::CancelToken;
use keel::session::RuntimeState;
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::{harness_with_session, no_events, session_with_model};
use serde_json::{Value, json};

async fn submit(h: &keel::harness::Harness, id: &str, text: &str) -> Submitted {
    h.internals()
        .brain
        .submit(&SessionId::from(id), text, &CancelToken::new(), &no_events())
        .await
        .unwrap()
}

fn failed(out: Submitted) -> String {
    match out {
        Submitted::Ran(TurnOutcome::Failed(e)) => e,
        other => panic!("expected a failed turn, got {other:?}"),
    }
}

/// A harness with no session yet.
async fn harness(dir: &std::path::Path, url: &str) -> keel::harness::Harness {
    // The helper creates a session; one named `_` is left unused.
    harness_with_session(dir, url, "_", &["echo"], Vec::new(), LoopGuards::default()).await
}

fn config(url: &str, timeout_ms: u64, max_retries: u32) -> ModelConfig {
    let mut m = ModelConfig::new(url, "test-model");
    m.timeout_ms = timeout_ms;
    m.max_retries = max_retries;
    m
}

/// G6: `--model-timeout` is the longest wait without progress. A stream that takes far longer
/// than it in all, but never pauses that long, succeeds; a server that sends nothing, or stops
/// in the middle of a stream, fails naming the setting and its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_a_slow_live_stream_succeeds_and_a_silent_server_fails_naming_the_setting() {
    let words = ["A ", "slow ", "local ", "model ", "streams ", "this."];
    let mut events: Vec<Value> =
        words.iter().map(|w| json!({"choices": [{"index": 0, "delta": {"content": w}}]})).collect();
    events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
    let gap = Duration::from_millis(150);
    let late = || Reply::Delay(Duration::from_secs(3), Box::new(Reply::text("too late")));
    let model = MockModel::start(vec![Reply::Drip { events, gap }, late(), late()]).await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path(), &model.url()).await;
    session_with_model(&h, "slow", &[], config(&model.url(), 400, 1)).await;
    let started = std::time::Instant::now();
    assert_eq!(
        submit(&h, "slow", "go").await,
        Submitted::Ran(TurnOutcome::Answer("A slow local model streams this.".into()))
    );
    // 7 gaps of 150 ms: well past the 400 ms limit in all.
    assert!(started.elapsed() >= Duration::from_millis(1000), "{:?}", started.elapsed());

    let e = failed(submit(&h, "slow", "again").await);
    assert!(e.contains("after 2 attempt(s)"), "a silent server is tried again: {e}");
    for named in ["--model-timeout", "KEEL_MODEL_TIMEOUT", "timeout_ms", "400 ms", "400ms"] {
        assert!(e.contains(named), "the error names {named}: {e}");
    }
    assert!(e.contains("the reply to begin"), "{e}");
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("slow"))
            .await
            .unwrap()
            .runtime
            .state,
        RuntimeState::Failed
    );
}

/// G6, in the middle of a stream: a server that stops sending for longer than the limit
/// fails the call, naming what keel waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g6_a_stream_that_stops_mid_way_fails_naming_the_setting() {
    let model = MockModel::start(vec![Reply::Drip {
        events: vec![
            json!({"choices": [{"index": 0, "delta": {"content": "Be"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "gun"}}]}),
        ],
        gap: Duration::from_millis(700),
    }])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path(), &model.url()).await;
    session_with_model(&h, "stall", &[], config(&model.url(), 300, 0)).await;
    let e = failed(submit(&h, "stall", "go").await);
    assert!(e.contains("after 1 attempt(s)") && e.contains("300ms"), "{e}");
    assert!(e.contains("the reply to begin") || e.contains("the next part of the reply"), "{e}");
    // Nothing of the cut stream was committed.
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("stall")).await.unwrap();
    assert_eq!(t.messages.len(), 1);
}

/// G2: a failure that repeats whatever is sent is not retried (a 4xx; a 500 saying the
/// request could not be parsed; the same 500 twice), overload is retried to the end, and a
/// garbled 200 is retried once with its first bytes in the error. Every failed request keeps
/// its evidence, with the status the server gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_deterministic_failures_are_not_retried_and_a_garbled_reply_is_retried_once() {
    let status = |code: u16, body: &str| Reply::Status {
        code,
        retry_after: Some(0),
        body: body.to_string(),
    };
    let llama = json!({"error": {"code": 500, "type": "server_error",
        "message": "Failed to parse tool call arguments as JSON"}})
    .to_string();
    let html = "<html><body><h1>502 Bad Gateway</h1></body></html>";
    let model = MockModel::start(vec![
        status(500, &llama),
        status(404, "model `test-model` not found"),
        status(500, "boom"),
        status(500, "boom"),
        status(503, "busy"),
        status(503, "busy"),
        status(503, "busy"),
        status(503, "busy"),
        status(200, html),
        status(200, html),
        status(200, html),
        Reply::text("fine"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path(), &model.url()).await;
    session_with_model(&h, "d", &[], config(&model.url(), 10_000, 3)).await;
    let e = failed(submit(&h, "d", "one").await);
    assert!(e.contains("after 1 attempt(s)") && e.contains("Failed to parse"), "{e}");
    let e = failed(submit(&h, "d", "two").await);
    assert!(e.contains("after 1 attempt(s)") && e.contains("HTTP 404"), "{e}");
    let e = failed(submit(&h, "d", "three").await);
    assert!(e.contains("after 2 attempt(s)") && e.contains("boom"), "{e}");
    let e = failed(submit(&h, "d", "four").await);
    assert!(e.contains("after 4 attempt(s)") && e.contains("HTTP 503"), "{e}");
    let e = failed(submit(&h, "d", "five").await);
    assert!(e.contains("after 2 attempt(s)") && e.contains("neither JSON nor an event stream"));
    assert!(e.contains("<html><body><h1>502 Bad Gateway"), "the first bytes are shown: {e}");
    assert_eq!(
        submit(&h, "d", "six").await,
        Submitted::Ran(TurnOutcome::Answer("fine".into())),
        "one garbled reply, then a good one"
    );
    assert_eq!(model.requests().len(), 12);

    let t = Views::of(h.internals().engine).timeline(&SessionId::from("d")).await.unwrap();
    let refused: Vec<(i64, Option<u16>, u32)> =
        t.refused_requests.iter().map(|r| (r.turn, r.http_status, r.attempts)).collect();
    assert_eq!(
        refused,
        [
            (1, Some(500), 1),
            (2, Some(404), 1),
            (3, Some(500), 2),
            (4, Some(503), 4),
            (5, Some(200), 2)
        ]
    );
    // A refused request's evidence is the request the server got, byte for byte.
    let requests = model.requests();
    let (seq, body) = Assembly::of(h.internals().engine)
        .refused_evidence(&SessionId::from("d"), Some(2))
        .await
        .unwrap();
    assert_eq!((seq, &body), (2, &requests[1]));
    let (seq, body) = Assembly::of(h.internals().engine)
        .refused_evidence(&SessionId::from("d"), None)
        .await
        .unwrap();
    assert_eq!((seq, &body), (5, &requests[9]));
    let e = Assembly::of(h.internals().engine)
        .refused_evidence(&SessionId::from("d"), Some(9))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("no refused request 9"), "{e}");
}

fn report(words: usize) -> String {
    let mut text = String::from("Summarise this report in three lines:\n");
    for i in 0..words {
        text.push_str(&format!("w{i} "));
    }
    text
}

/// The task is sent once: a long first message is not repeated in the system message (which
/// refers to it by its start). A request that outgrows the server's context window fails at
/// once, saying so in plain words, and is kept as refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_is_sent_once_and_a_request_too_long_for_the_context_says_so() {
    let task = report(1700);
    assert!(task.len() > 8_000);
    // Room for the task once (and the rest of the request), not twice.
    let model =
        MockModel::start_with_context(vec![Reply::text("three lines"), Reply::text("x")], 14_000)
            .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path(), &model.url()).await;
    session_with_model(&h, "long", &[], config(&model.url(), 10_000, 3)).await;
    assert_eq!(
        submit(&h, "long", &task).await,
        Submitted::Ran(TurnOutcome::Answer("three lines".into()))
    );
    let first = String::from_utf8(model.requests()[0].clone()).unwrap();
    assert_eq!(first.matches("w1699 ").count(), 1, "the task is in the request once");
    let system = &keel_tests::system_of(first.as_bytes());
    assert!(
        system.contains(
            "Session goal (also the current phase goal): the task of the user message that \
             begins \"Summarise this report in three lines:…\""
        ),
        "{system}"
    );
    assert!(!system.contains("w0 w1"), "{system}");
    // A short goal is simply repeated.
    assert_eq!(keel::assembly::goal_reference("Fix the tests"), "Fix the tests");

    // An input larger than the window: the refusal names the server's context (3,500
    // tokens), which becomes the session's window, and compacts the session once (the first
    // turn is summarized); the input alone still does not fit, so the request is not sent
    // again — the turn fails saying so, and the request is kept, unsent.
    let e = failed(submit(&h, "long", &report(3200)).await);
    assert!(e.contains("the model's context window of 3500"), "{e}");
    assert!(e.contains("Start a new session"), "says what to do: {e}");
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("long")).await.unwrap();
    assert_eq!(t.refused_requests.len(), 1);
    assert_eq!(t.refused_requests[0].http_status, None);
    assert!(t.refused_requests[0].error.starts_with("not sent: "), "{:?}", t.refused_requests);
    assert_eq!(t.checkpoints.len(), 1);
    assert_eq!(t.checkpoints[0].trigger, keel::compaction::Trigger::Overflow);
    assert_eq!(model.requests().len(), 2);
    let meta = SessionMeta::read(h.internals().engine, &SessionId::from("long")).await.unwrap();
    assert_eq!(meta.config.model.context_window, Some(3500), "learned from the refusal");
    assert!(
        (t.refused_requests[0].request_bytes as usize) < model.requests().last().unwrap().len(),
        "compacted, though not enough"
    );
}

/// Token usage: asked for when streaming, recorded per model call with its turn, request size
/// and finish reason; the estimate of the next request is calibrated by the last reported
/// usage and counts its bytes exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_usage_is_recorded_per_call_and_calibrates_the_estimate() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "echo", r#"{"text":"hi"}"#)]).with_usage(1000, 20, Some(800)),
        Reply::text("done").with_usage(1100, 5, None),
        Reply::text("second").with_usage(1200, 7, Some(1100)),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path(), &model.url()).await;
    session_with_model(&h, "u", &["echo"], config(&model.url(), 10_000, 0)).await;
    let before =
        Assembly::of(h.internals().engine).token_estimate(&SessionId::from("u")).await.unwrap();
    assert!(!before.calibrated);
    assert_eq!(before.bytes_per_token, keel::assembly::BYTES_PER_TOKEN);
    assert_eq!(submit(&h, "u", "say hi").await, Submitted::Ran(TurnOutcome::Answer("done".into())));
    let requests = model.requests();
    let first: Value = serde_json::from_slice(&requests[0]).unwrap();
    assert_eq!(first["stream_options"], json!({"include_usage": true}));

    let calls =
        Assembly::of(h.internals().engine).model_calls(&SessionId::from("u")).await.unwrap();
    type Row<'a> = (i64, Option<i64>, Option<&'a str>, Option<Usage>);
    let got: Vec<Row<'_>> = calls
        .iter()
        .map(|c| (c.step, c.turn, c.call.finish_reason.as_deref(), c.call.usage))
        .collect();
    let usage = |p, c, k| Some(Usage { prompt_tokens: p, completion_tokens: c, cached_tokens: k });
    assert_eq!(
        got,
        [
            (1, Some(1), Some("tool_calls"), usage(1000, 20, Some(800))),
            (2, Some(1), Some("stop"), usage(1100, 5, None)),
        ]
    );
    for (c, body) in calls.iter().zip(&requests) {
        assert_eq!(c.request_bytes, Some(body.len() as i64));
        assert_eq!(c.call.attempts, 1);
        assert!(c.call.duration_ms > 0.0);
    }

    // Calibrated by the last request: its bytes over its prompt tokens.
    let e = Assembly::of(h.internals().engine).token_estimate(&SessionId::from("u")).await.unwrap();
    assert!(e.calibrated);
    assert_eq!(e.bytes_per_token, requests[1].len() as f64 / 1100.0);
    assert_eq!(e.tokens, (e.bytes as f64 / e.bytes_per_token).ceil() as i64);
    // The next request is the estimate plus the user message to come (and its comma).
    assert_eq!(submit(&h, "u", "more").await, Submitted::Ran(TurnOutcome::Answer("second".into())));
    let user = json!({"role": "user", "content": "more"}).to_string();
    assert_eq!(model.requests()[2].len() as i64, e.bytes + 1 + user.len() as i64);
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("u")).await.unwrap();
    assert_eq!(t.model_calls.len(), 3);
    assert_eq!(t.model_calls[2].turn, Some(2));

    // A server that rejects `stream_options`: off for that session, and no usage comes.
    let plain = MockModel::start(vec![Reply::text("plain")]).await;
    let mut cfg = config(&plain.url(), 10_000, 0);
    cfg.stream_usage = false;
    session_with_model(&h, "plain", &[], cfg).await;
    assert_eq!(
        submit(&h, "plain", "hi").await,
        Submitted::Ran(TurnOutcome::Answer("plain".into()))
    );
    let body: Value = serde_json::from_slice(&plain.requests()[0]).unwrap();
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body.get("stream_options"), None);
    let calls =
        Assembly::of(h.internals().engine).model_calls(&SessionId::from("plain")).await.unwrap();
    assert_eq!(calls[0].call.usage, None);
    assert!(
        !Assembly::of(h.internals().engine)
            .token_estimate(&SessionId::from("plain"))
            .await
            .unwrap()
            .calibrated
    );
}

/// An answer cut by the token limit, or an empty one, is flagged: the reply's finish reason
/// and emptiness are reported as the turn runs, and kept with the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_cut_answer_is_flagged() {
    let cut = Reply::Sse {
        events: vec![
            json!({"choices": [{"index": 0, "delta": {"content": "The answer is"}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}),
        ],
        cut: false,
    };
    let empty = Reply::Sse {
        events: vec![json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})],
        cut: false,
    };
    let model = MockModel::start(vec![cut, empty]).await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path(), &model.url()).await;
    session_with_model(&h, "f", &[], config(&model.url(), 10_000, 0)).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let events: keel::agent::Events = Arc::new(move |e: &Event| {
        if let Event::ModelReplied { finish_reason, empty, .. } = e {
            sink.lock().unwrap().push((finish_reason.clone(), *empty));
        }
    });
    let cancel = CancelToken::new();
    assert_eq!(
        h.internals().brain.submit(&SessionId::from("f"), "q", &cancel, &events).await.unwrap(),
        Submitted::Ran(TurnOutcome::Answer("The answer is".into()))
    );
    assert_eq!(
        h.internals().brain.submit(&SessionId::from("f"), "q2", &cancel, &events).await.unwrap(),
        Submitted::Ran(TurnOutcome::Answer(String::new()))
    );
    assert_eq!(
        *seen.lock().unwrap(),
        [(Some("length".to_string()), false), (Some("stop".to_string()), true)]
    );
    let reasons: Vec<Option<String>> = Assembly::of(h.internals().engine)
        .model_calls(&SessionId::from("f"))
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.call.finish_reason)
        .collect();
    assert_eq!(reasons, [Some("length".to_string()), Some("stop".to_string())]);
}
