//! Context compaction against the scripted loopback server: the threshold, legal boundaries,
//! active-turn compaction, approvals across a compaction, redaction, and a summary call that
//! answers badly.

use keel::agent::compact::Compaction;
use keel::agent::{LoopGuards, TurnOutcome};
use keel::assembly::Assembly;
use keel::brain::Submitted;
use keel::compaction::CheckpointStatus;
use keel::ids::SessionId;
use keel::meta::SessionMeta;
use keel::sandbox::{Access, Budget, CancelToken, Grant};
use keel::session::{Decision, NewSession, Policy, RuntimeState, SessionEvent};
use keel::views::Views;
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::{answered, harness_with_session, install_effects, no_events, system_of};
use serde_json::Value;

const SUMMARY_MARK: &str = "Earlier conversation, summarized";

/// Session `id` with the model at `url`, a context window of `window` tokens, `tools`,
/// grants and a policy (task understanding off).
use keel_tests::windowed_session as session;

async fn harness(dir: &std::path::Path, url: &str) -> keel::harness::Harness {
    harness_with_session(dir, url, "unused", &[], Vec::new(), LoopGuards::default()).await
}

/// A harness with the effect tools installed and session `id` (window `window`, `tools`)
/// granted a fresh work directory read-write; with the home and the work directory.
async fn effects_session(
    url: &str,
    id: &str,
    window: Option<u64>,
    tools: &[&str],
) -> (keel::harness::Harness, tempfile::TempDir, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), url).await;
    install_effects(&h).await;
    let grants = vec![Grant::new(work.path(), "/work", Access::Rw).unwrap()];
    session(&h, id, url, window, tools, grants, Policy::default()).await;
    (h, dir, work)
}

fn messages(body: &[u8]) -> Vec<Value> {
    keel_tests::request_messages(body)
}

/// Every tool message of a request answers a call of an assistant message before it in the
/// same request: a call and its result are never split.
fn assert_calls_whole(body: &[u8]) {
    let msgs = messages(body);
    let mut open: Vec<String> = Vec::new();
    for m in &msgs {
        if let Some(calls) = m["tool_calls"].as_array() {
            open.extend(calls.iter().map(|c| c["id"].as_str().unwrap().to_string()));
        }
        if m["role"] == "tool" {
            let id = m["tool_call_id"].as_str().unwrap();
            assert!(open.iter().any(|o| o == id), "a result without its call: {id} in {msgs:?}");
        }
    }
    assert_ne!(msgs.get(1).map(|m| m["role"].clone()), Some(Value::from("tool")));
}

fn filler(tag: &str, n: usize) -> String {
    format!("{tag} {}", "lorem ipsum dolor sit amet ".repeat(n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_threshold_compacts_and_the_next_request_holds_the_summary_not_the_range() {
    let model = MockModel::start(vec![
        Reply::text(&filler("answer-one", 10)),
        Reply::text(&filler("answer-two", 10)),
        Reply::text("three done"),
    ])
    .await;
    model.push_summary(vec![
        Reply::summary("the third task", &["the first task is asked"]),
        Reply::summary("the third task", &["the first is answered"]),
        Reply::summary("the third task", &["the second task is asked"]),
        Reply::summary("the third task", &["the first two are answered"]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "t", &model.url(), Some(512), &[], Vec::new(), Policy::default()).await;
    let cancel = CancelToken::new();
    for (i, task) in ["task-one", "task-two", "task-three"].iter().enumerate() {
        let out = h
            .internals()
            .brain
            .submit(&SessionId::from("t"), &filler(task, 10), &cancel, &no_events())
            .await
            .unwrap();
        assert!(!answered(out).is_empty(), "turn {i}");
    }
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    // The first two fit; the third passed 0.8 × 512 tokens and was compacted first. Each summary request is sized whole against the window less its reply's reserve: a
    // 512-token window holds one message per call here, so the range goes over four calls,
    // each given the summary so far.
    let summaries = model.summary_requests();
    assert_eq!(summaries.len(), 4);
    let text = |i: usize| String::from_utf8_lossy(&summaries[i]).to_string();
    let (first, second, last) = (text(0), text(1), text(3));
    assert!(first.contains("task-one") && !first.contains("answer-one"), "{first}");
    assert!(first.contains(r#"\"previous_summary\":null"#), "{first}");
    assert!(second.contains("answer-one") && second.contains("the first task is asked"));
    assert!(last.contains("answer-two") && !last.contains("task-one"), "{last}");
    assert!(last.contains("the second task is asked"), "{last}");
    for r in &summaries {
        let v: serde_json::Value = serde_json::from_slice(r).unwrap();
        assert_eq!(v["max_tokens"], 128);
    }
    assert!(first.contains("\"stream\":false"));
    let third = String::from_utf8(requests[2].clone()).unwrap();
    assert!(third.contains(SUMMARY_MARK), "{third}");
    assert!(third.contains("the first two are answered"));
    // The compacted messages are gone from the history; the session goal (the first input,
    // a SessionMeta fact) is in the system message, in full now that its message is not.
    let history = serde_json::to_string(&messages(&requests[2])[1..]).unwrap();
    assert!(!history.contains("task-one") && !history.contains("answer-two"), "{third}");
    assert!(
        system_of(&requests[2])
            .contains("Session goal (also the current phase goal): task-one lorem")
    );
    assert!(third.contains("task-three"));
    // The record keeps everything, and the evidence of the third request is exact.
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("t")).await.unwrap();
    assert_eq!(t.messages.len(), 6);
    let spans: Vec<_> =
        t.checkpoints.iter().map(|c| (c.status, c.from, c.to, c.anchor, c.turn)).collect();
    assert_eq!(
        spans,
        [
            (CheckpointStatus::Promoted, 1, 2, None, Some(3)),
            (CheckpointStatus::Promoted, 3, 4, None, Some(3))
        ]
    );
    assert_eq!(t.context_start, 4);
    let cp = &t.checkpoints[1];
    // The active request is keel's — the turn's own message — never the model's.
    assert!(cp.summary.as_ref().unwrap().active_user_request.starts_with("task-three lorem"));
    assert!(cp.tokens_after.unwrap() < cp.tokens_before.unwrap());
    let (_, body) =
        Assembly::of(h.internals().engine).evidence(&SessionId::from("t"), Some(3)).await.unwrap();
    assert_eq!(body, requests[2]);
    let (n, sbody) = keel::compaction::Compaction::of(h.internals().engine)
        .evidence(&SessionId::from("t"), None)
        .await
        .unwrap();
    // (the evidence of a compaction made over several calls is its last call's request)
    assert_eq!((n, sbody), (2, summaries[3].clone()));
    // State and events: compressing while it ran, then running again.
    let events = h.internals().engine.events_after(&SessionId::from("t"), 0, 1000).await.unwrap();
    let kinds: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.event {
            SessionEvent::State { state, .. } => Some(format!("state {state}")),
            SessionEvent::CompactionStarted { from, to, .. } => Some(format!("start {from}-{to}")),
            SessionEvent::CheckpointPrepared { checkpoint } => {
                Some(format!("prepared {checkpoint}"))
            }
            SessionEvent::Compacted { checkpoint, .. } => Some(format!("compacted {checkpoint}")),
            _ => None,
        })
        .collect();
    let at = kinds.iter().position(|k| k == "state compressing").expect("compressing shown");
    assert_eq!(
        kinds[at..at + 10],
        [
            "state compressing",
            "start 1-2",
            "prepared 1",
            "compacted 1",
            "state running",
            "state compressing",
            "start 3-4",
            "prepared 2",
            "compacted 2",
            "state running"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_active_turn_with_a_long_tool_loop_compacts_mid_turn_and_finishes_with_calls_whole() {
    // Twelve steps of two parallel calls each, every result about 600 bytes: the turn passes
    // the threshold several times and keeps its user message as the anchor.
    let mut script = Vec::new();
    for i in 0..12 {
        let a = format!(r#"{{"text":"{}"}}"#, filler(&format!("out-{i}-a"), 20));
        let b = format!(r#"{{"text":"{}"}}"#, filler(&format!("out-{i}-b"), 20));
        script.push(Reply::calls(&[
            (&format!("c{i}a"), "echo", a.as_str()),
            (&format!("c{i}b"), "echo", b.as_str()),
        ]));
    }
    script.push(Reply::text("all twelve done"));
    let model = MockModel::start(script).await;
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "loop", &model.url(), Some(2048), &["echo"], Vec::new(), Policy::default()).await;
    let task = "run the twelve echo steps and report";
    let out = h
        .internals()
        .brain
        .submit(&SessionId::from("loop"), task, &CancelToken::new(), &no_events())
        .await
        .unwrap();
    assert_eq!(answered(out), "all twelve done");
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("loop")).await.unwrap();
    let promoted: Vec<_> =
        t.checkpoints.iter().filter(|c| c.status == CheckpointStatus::Promoted).collect();
    assert!(promoted.len() >= 2, "{:?}", t.checkpoints);
    assert!(promoted.iter().all(|c| c.turn == Some(1)));
    assert!(promoted.iter().any(|c| c.anchor == Some(1)), "{:?}", t.checkpoints);
    let requests = model.requests();
    let window_bytes = 2048 * 4;
    for (i, r) in requests.iter().enumerate() {
        assert_calls_whole(r);
        assert!(r.len() <= window_bytes, "request {i} is {} bytes", r.len());
    }
    // After a compaction inside the turn the request repeats the user message verbatim.
    let last = messages(requests.last().unwrap());
    assert_eq!(last[1]["role"], "user");
    assert_eq!(last[1]["content"], task);
    assert!(system_of(requests.last().unwrap()).contains(SUMMARY_MARK));
    // The boundaries never split a call from its results.
    for cp in &promoted {
        let next = t.messages.iter().find(|m| m.seq == cp.to + 1);
        assert!(
            next.is_none_or(|m| m.role != "tool"),
            "checkpoint {} ends before a result",
            cp.seq
        );
    }
    // Every request's evidence rebuilds byte for byte.
    for (i, r) in requests.iter().enumerate() {
        let (_, body) = Assembly::of(h.internals().engine)
            .evidence(&SessionId::from("loop"), Some(i as i64 + 1))
            .await
            .unwrap();
        assert_eq!(&body, r, "evidence of step {}", i + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_naive_boundary_inside_a_call_group_moves_to_a_legal_one() {
    // One reply with six calls and long results: the byte-count boundary would fall between
    // the results; the only legal ones are before the call or after its last result.
    let calls: Vec<(String, String)> = (0..6)
        .map(|i| (format!("g{i}"), format!(r#"{{"text":"{}"}}"#, filler(&format!("r{i}"), 30))))
        .collect();
    let refs: Vec<(&str, &str, &str)> =
        calls.iter().map(|(id, a)| (id.as_str(), "echo", a.as_str())).collect();
    let model = MockModel::start(vec![
        Reply::text(&filler("first answer", 40)),
        Reply::calls(&refs),
        Reply::text("grouped done"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "g", &model.url(), None, &["echo"], Vec::new(), Policy::default()).await;
    let cancel = CancelToken::new();
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("g"), &filler("first", 40), &cancel, &no_events())
            .await
            .unwrap(),
    );
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("g"), "second: six echoes", &cancel, &no_events())
            .await
            .unwrap(),
    );
    // Messages: 1 user, 2 answer, 3 user, 4 the six calls, 5–10 their results, 11 answer.
    // Outside a turn the kept history starts at a user message: legal boundaries are 2 and
    // 11. Keeping ~2,000 bytes would cut between the results (after 8); it takes 11.
    let freeze = |keep: i64| {
        h.internals().db.read(move |c| {
            use keel::compaction::{Aim, Trigger, freeze_in};
            freeze_in(c, "g", Trigger::Threshold, Aim { keep_bytes: Some(keep), input_bytes: None })
        })
    };
    let f = freeze(2000).await.unwrap().unwrap();
    assert_eq!((f.prev_context_start, f.to), (0, 11));
    assert_eq!(f.messages.len(), 11);
    // With room for everything after the first turn, the earliest legal boundary is taken.
    let f = freeze(20_000).await.unwrap().unwrap();
    assert_eq!(f.to, 2);
    // Manual: as much as is legal.
    match h.internals().brain.compact(&SessionId::from("g"), &cancel, &no_events()).await.unwrap() {
        Compaction::Compacted { from, context_start, .. } => {
            assert_eq!((from, context_start), (1, 11))
        }
        other => panic!("{other:?}"),
    }
    // Nothing is left after the context start: a second compaction has nothing to do.
    assert_eq!(
        h.internals().brain.compact(&SessionId::from("g"), &cancel, &no_events()).await.unwrap(),
        Compaction::Nothing
    );
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("g")).await.unwrap().runtime.state,
        RuntimeState::Idle
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_approval_and_its_open_step_survive_a_compaction() {
    let model = MockModel::start(vec![
        Reply::text(&filler("earlier answer", 30)),
        Reply::calls(&[("s1", "effect_send", r#"{"label":"after-compaction"}"#)]),
        Reply::text("sent after compaction"),
    ])
    .await;
    let (h, _dir, work) = effects_session(&model.url(), "ap", None, &["effect_send"]).await;
    let cancel = CancelToken::new();
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("ap"), &filler("earlier task", 30), &cancel, &no_events())
            .await
            .unwrap(),
    );
    let waiting = h
        .internals()
        .brain
        .submit(&SessionId::from("ap"), "send the label", &cancel, &no_events())
        .await
        .unwrap();
    let Submitted::Ran(TurnOutcome::WaitingApproval(units)) = waiting else {
        panic!("{waiting:?}")
    };
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("ap"))
            .await
            .unwrap()
            .runtime
            .state,
        RuntimeState::WaitingApproval
    );
    match h.internals().brain.compact(&SessionId::from("ap"), &cancel, &no_events()).await.unwrap()
    {
        // Up to the active turn's user message (3), which stays; its open step is not history.
        Compaction::Compacted { context_start, .. } => assert_eq!(context_start, 2),
        other => panic!("{other:?}"),
    }
    let meta = SessionMeta::read(h.internals().engine, &SessionId::from("ap")).await.unwrap();
    assert_eq!(meta.runtime.state, RuntimeState::WaitingApproval);
    assert!(h.internals().engine.load_open_step(&SessionId::from("ap")).await.unwrap().is_some());
    let pending = h.internals().engine.approvals(Some("ap"), true).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].id, units[0]);
    h.internals().brain.decide(&units[0], Decision::Approve, None, None).await.unwrap().unwrap();
    let out = h
        .internals()
        .brain
        .drain(&SessionId::from("ap"), &cancel, &no_events())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answered(out), "sent after compaction");
    assert_eq!(keel_tests::log_lines(work.path(), "sent.log").len(), 1);
    let last = model.requests().pop().unwrap();
    let msgs = messages(&last);
    assert_eq!(msgs[1]["content"], "send the label");
    assert_eq!(msgs[2]["tool_calls"][0]["id"], "s1");
    assert_eq!(msgs[3]["tool_call_id"], "s1");
    // The compacted turn is gone from the history (the session goal, a SessionMeta fact, is
    // still in the system message).
    assert!(msgs[1..].iter().all(|m| !m.to_string().contains("earlier task")));
    assert_calls_whole(&last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redacted_canary_reaches_no_summary_request_and_no_summary() {
    const CANARY: &str = "CANARY-7f3a9e51";
    let model = MockModel::start(vec![
        Reply::calls(&[("r1", "read", r#"{"path":"/work/secret.txt"}"#)]),
        Reply::text("read it"),
        Reply::text("second answer"),
    ])
    .await;
    // A model that echoes what it saw tries to put the canary into the summary.
    model.push_summary(vec![Reply::summary(&format!("use {CANARY}"), &[CANARY])]);
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("secret.txt"), format!("token={CANARY}\n")).unwrap();
    let h = harness(dir.path(), &model.url()).await;
    let grants = vec![Grant::new(work.path(), "/work", Access::Ro).unwrap()];
    let policy = Policy { redact: vec!["CANARY-[0-9a-f]+".into()], ..Policy::default() };
    session(&h, "red", &model.url(), None, &["read"], grants, policy).await;
    let cancel = CancelToken::new();
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("red"), "read the secret file", &cancel, &no_events())
            .await
            .unwrap(),
    );
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("red"), "and then?", &cancel, &no_events())
            .await
            .unwrap(),
    );
    assert!(matches!(
        h.internals().brain.compact(&SessionId::from("red"), &cancel, &no_events()).await.unwrap(),
        Compaction::Compacted { .. }
    ));
    let summary_req = model.summary_requests();
    assert_eq!(summary_req.len(), 1);
    let text = String::from_utf8_lossy(&summary_req[0]);
    assert!(text.contains("[redacted]"), "the result is there, redacted: {text}");
    for r in model.requests().iter().chain(summary_req.iter()) {
        assert!(!String::from_utf8_lossy(r).contains(CANARY));
    }
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("red")).await.unwrap();
    let stored = serde_json::to_string(&t).unwrap();
    assert!(!stored.contains(CANARY), "the timeline (messages, journal, summary) holds it");
    let s = t.checkpoints[0].summary.as_ref().unwrap();
    assert_eq!(s.active_user_request, "and then?", "keel's: the last request summarized");
    assert_eq!(s.notes, vec!["[redacted]"]);
    // A pattern that is not a regular expression is refused when the session is created.
    let bad = Policy { redact: vec!["(".into()], ..Policy::default() };
    let e = h
        .internals()
        .engine
        .create(NewSession {
            pins: Default::default(),
            id: Some("bad".into()),
            grants: Vec::new(),
            net: Default::default(),
            tools: Vec::new(),
            policy: bad,
            budget: Budget::default(),
            model: keel::model::ModelConfig::new(&model.url(), "m"),
            system_prompt: String::new(),
            guards: None,
            preprocess: None,
            user: None,
            named_tools: false,
            owner: None,
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not a regular expression"), "{e}");
}

/// A summary answer that cannot be read is asked for once more; refused twice, keel makes
/// the summary itself from the session's record and the turn goes on with a compacted
/// context; a later compaction whose retry succeeds replaces it with the model's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_summary_is_asked_for_once_more_then_keel_compacts_mechanically() {
    let model = MockModel::start(vec![
        Reply::text(&filler("a1", 40)),
        Reply::text(&filler("a2", 40)),
        Reply::text("third answered after a mechanical compaction"),
    ])
    .await;
    model.push_summary(vec![
        Reply::completion("not json at all"),
        Reply::completion(r#"{"notes":{"n":1}}"#),
        Reply::completion("```json\n[\"a list\"]\n```"),
        Reply::summary("the fourth task", &["a model's note"]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "bad", &model.url(), Some(1536), &[], Vec::new(), Policy::default()).await;
    let cancel = CancelToken::new();
    let id = SessionId::from("bad");
    for t in ["t1", "t2"] {
        answered(
            h.internals().brain.submit(&id, &filler(t, 40), &cancel, &no_events()).await.unwrap(),
        );
    }
    // Past the threshold: two refused answers, then keel's own summary.
    let third = h.internals().brain.submit(&id, "t3", &cancel, &no_events()).await.unwrap();
    assert_eq!(answered(third), "third answered after a mechanical compaction");
    let t = Views::of(h.internals().engine).timeline(&id).await.unwrap();
    assert!(t.context_start > 0);
    let cp = &t.checkpoints[0];
    assert_eq!((cp.status, cp.attempts), (CheckpointStatus::Promoted, 2));
    let error = cp.error.as_deref().unwrap();
    assert!(error.contains("`notes` is an object, not a list of strings"), "{error}");
    let s = cp.summary.as_ref().unwrap();
    assert!(s.mechanical && s.active_user_request == "t3", "{s:?}");
    assert!(s.notes.iter().any(|n| n.starts_with("the user asked: t1 lorem")), "{s:?}");
    let last = model.requests().last().unwrap().clone();
    let history = serde_json::to_string(&messages(&last)[1..]).unwrap();
    assert!(!history.contains("t1 lorem ipsum dolor sit amet lorem"), "{history}");
    let system = system_of(&last);
    assert!(system.contains("summarized by keel from the session's record"), "{system}");
    // On demand: a refused answer, then a good one — the model's summary replaces keel's.
    assert!(matches!(
        h.internals().brain.compact(&id, &cancel, &no_events()).await.unwrap(),
        Compaction::Compacted { .. }
    ));
    let t = Views::of(h.internals().engine).timeline(&id).await.unwrap();
    let cp = t.checkpoints.last().unwrap();
    assert_eq!(cp.status, CheckpointStatus::Promoted);
    assert!(cp.attempts >= 2, "{}", cp.attempts);
    // (the retry is given half the range; the rest is a call of its own)
    let s = cp.summary.as_ref().unwrap();
    assert!(!s.mechanical && !s.notes.is_empty(), "{s:?}");
    assert!(model.summary_requests().len() >= 4);
}

/// Real servers answer in JSON mode only or ignore the schema, and real models take
/// liberties: a string for a list, lists left out, the object in a code fence or in a
/// sentence, fields of their own. Each such summary is read (and the compaction promoted);
/// what was missing is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_in_the_shapes_real_models_answer_are_read() {
    let shapes: [(&str, &str); 5] = [
        (
            r#"{"active_user_request":"r1","decisions":[],"constraints":[],"open_questions":[],"next_actions":[],"notes":"one note"}"#,
            "a string for a list",
        ),
        (r#"{"active_user_request":"r2","notes":["kept"]}"#, "missing lists"),
        ("```json\n{\"active_user_request\": \"r3\", \"notes\": [\"kept\"]}\n```", "a code fence"),
        (
            "Here is the summary you asked for:\n{\"active_user_request\": \"r4\", \"notes\": [\"kept\"]}\nLet me know if you need more.",
            "prose around it",
        ),
        (
            r#"{"active_user_request":"r5","notes":["kept"],"confidence":0.9,"artifacts":["x"]}"#,
            "fields of its own",
        ),
    ];
    let model =
        MockModel::start((0..shapes.len()).map(|i| Reply::text(&format!("answer {i}"))).collect())
            .await;
    model.push_summary(shapes.iter().map(|(s, _)| Reply::completion(s)).collect());
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "loose", &model.url(), None, &[], Vec::new(), Policy::default()).await;
    let cancel = CancelToken::new();
    for (i, (_, what)) in shapes.iter().enumerate() {
        answered(
            h.internals()
                .brain
                .submit(&SessionId::from("loose"), &format!("task {i}"), &cancel, &no_events())
                .await
                .unwrap(),
        );
        let done = h
            .internals()
            .brain
            .compact(&SessionId::from("loose"), &cancel, &no_events())
            .await
            .unwrap();
        assert!(matches!(done, Compaction::Compacted { .. }), "{what}: {done:?}");
        let t = Views::of(h.internals().engine).timeline(&SessionId::from("loose")).await.unwrap();
        let cp = t.checkpoints.last().unwrap();
        assert_eq!(cp.status, CheckpointStatus::Promoted, "{what}");
        assert_eq!(cp.attempts, 1, "{what}: read at the first answer");
        let summary = cp.summary.as_ref().unwrap();
        // The model's `active_user_request` is ignored: keel's is the request it summarized.
        assert_eq!(summary.active_user_request, format!("task {i}"), "{what}");
        let want = if i == 0 { "one note" } else { "kept" };
        assert_eq!(summary.notes, vec![want.to_string()], "{what}");
        assert!(summary.decisions.is_empty() && summary.next_actions.is_empty(), "{what}");
        // The journal's facts are never the model's.
        assert!(summary.artifacts.is_empty(), "{what}");
    }
    assert_eq!(model.summary_requests().len(), shapes.len(), "no answer was asked for again");
}

/// The issue a small window showed: a compaction inside a turn summarized the step that had
/// just run (a non-idempotent call and its result), and the next request held only the
/// anchor, so a model acting on the last message would run the call again. Now every request
/// of the turn holds the last complete step after the anchor, verbatim, and a summary of the
/// turn's earlier steps lists their calls and outcomes from the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_inside_a_turn_keeps_the_step_that_just_ran() {
    let long = |tag: &str| format!(r#"{{"label":"{tag} {}"}}"#, "x".repeat(1500));
    let model = MockModel::start(vec![
        Reply::text(&filler("first answer", 90)),
        Reply::text(&filler("second answer", 90)),
        Reply::calls(&[("a1", "effect_append", long("one").as_str())]),
        Reply::calls(&[("a2", "effect_append", long("two").as_str())]),
        Reply::calls(&[("a3", "effect_append", long("three").as_str())]),
        Reply::text("appended three lines"),
    ])
    .await;
    let (h, _dir, work) =
        effects_session(&model.url(), "keep", Some(2048), &["effect_append"]).await;
    let cancel = CancelToken::new();
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("keep"), &filler("t1", 20), &cancel, &no_events())
            .await
            .unwrap(),
    );
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("keep"), &filler("t2", 20), &cancel, &no_events())
            .await
            .unwrap(),
    );
    let out = h
        .internals()
        .brain
        .submit(&SessionId::from("keep"), "append three lines", &cancel, &no_events())
        .await
        .unwrap();
    assert_eq!(answered(out), "appended three lines");
    assert_eq!(keel_tests::log_lines(work.path(), "effects.log").len(), 3);
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("keep")).await.unwrap();
    let in_turn: Vec<_> = t
        .checkpoints
        .iter()
        .filter(|c| c.status == CheckpointStatus::Promoted && c.turn == Some(3))
        .collect();
    assert!(!in_turn.is_empty(), "the turn compacted: {:?}", t.checkpoints);
    // Every request after a step holds that step — its call and its result — after the
    // anchor, whatever was compacted.
    let requests = model.requests();
    let turn: Vec<&Vec<u8>> = requests[2..].iter().collect();
    for (k, id) in ["a1", "a2", "a3"].iter().enumerate() {
        let msgs = messages(turn[k + 1]);
        assert_eq!(msgs[1]["content"], "append three lines", "the anchor heads the history");
        let call = msgs.iter().position(|m| m["tool_calls"][0]["id"] == *id);
        let result = msgs.iter().position(|m| m["tool_call_id"] == *id);
        assert!(
            matches!((call, result), (Some(c), Some(r)) if r == c + 1),
            "request after step {id} lacks it: {msgs:#?}"
        );
        assert_calls_whole(turn[k + 1]);
    }
    // The last request's summary names the turn's earlier calls, from the journal.
    let last = system_of(turn[3]);
    assert!(last.contains(SUMMARY_MARK), "{last}");
    assert!(
        last.contains("Calls already run in the current turn (from the tool journal"),
        "{last}"
    );
    assert!(last.contains("effect_append {\"label\":\"one"), "{last}");
    assert!(last.contains("→ ok"), "{last}");
    let listed = &in_turn.last().unwrap().summary.as_ref().unwrap().turn_calls;
    assert!(listed.iter().all(|c| c.turn == 3 && c.outcome == "ok" && c.tool == "effect_append"));
    assert!(listed.iter().all(|c| c.input.chars().count() <= 81), "inputs are cut: {listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_cannot_fit_fails_the_turn_with_a_clear_message() {
    let model = MockModel::start(vec![Reply::text("never sent")]).await;
    model.push_summary(vec![Reply::completion("no"), Reply::completion("still no")]);
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "big", &model.url(), Some(512), &[], Vec::new(), Policy::default()).await;
    // One input larger than the whole window: nothing before it can be compacted.
    let out = h
        .internals()
        .brain
        .submit(&SessionId::from("big"), &filler("huge", 120), &CancelToken::new(), &no_events())
        .await
        .unwrap();
    let Submitted::Ran(TurnOutcome::Failed(msg)) = out else { panic!("{out:?}") };
    assert!(msg.contains("the model's context window of 512 holds 380"), "{msg}");
    assert!(msg.contains("--context-window"), "{msg}");
    assert!(model.requests().is_empty());
    let id = SessionId::from("big");
    let meta = SessionMeta::read(h.internals().engine, &id).await.unwrap();
    assert_eq!(meta.runtime.state, RuntimeState::Failed);
    // The model call the turn announced is closed, and the request that was not sent is kept
    // for a person to read (`keel session evidence --refused`).
    let events = h.internals().engine.events_after(&id, 0, 1000).await.unwrap();
    let calls: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.event {
            SessionEvent::ModelCallStarted { step, .. } => Some(format!("started {step}")),
            SessionEvent::ModelCallFailed { step, error, http_status: None, .. }
                if error.starts_with("not sent: the next request needs about") =>
            {
                Some(format!("failed {step}"))
            }
            _ => None,
        })
        .collect();
    assert_eq!(calls, ["started 1", "failed 1"]);
    let refused = Views::of(h.internals().engine).timeline(&id).await.unwrap().refused_requests;
    assert_eq!(refused.len(), 1);
    assert!(refused[0].request_bytes > 3000);
    // The input is kept.
    assert_eq!(
        Views::of(h.internals().engine)
            .timeline(&SessionId::from("big"))
            .await
            .unwrap()
            .messages
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_server_refuses_as_too_long_is_compacted_and_sent_again() {
    // No window configured: the server's refusal is what tells. (Its context, 3,000 tokens,
    // holds a summary call: one smaller than the call's own instructions could not.)
    let model = MockModel::start_with_context(
        vec![
            Reply::text(&filler("one", 220)),
            Reply::text(&filler("two", 220)),
            Reply::text("three after an overflow compaction"),
        ],
        12_000,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "of", &model.url(), None, &[], Vec::new(), Policy::default()).await;
    let cancel = CancelToken::new();
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("of"), &filler("first", 10), &cancel, &no_events())
            .await
            .unwrap(),
    );
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("of"), &filler("second", 10), &cancel, &no_events())
            .await
            .unwrap(),
    );
    let out = h
        .internals()
        .brain
        .submit(&SessionId::from("of"), "third", &cancel, &no_events())
        .await
        .unwrap();
    assert_eq!(answered(out), "three after an overflow compaction");
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("of")).await.unwrap();
    assert_eq!(t.checkpoints.len(), 1);
    assert_eq!(t.checkpoints[0].trigger, keel::compaction::Trigger::Overflow);
    let requests = model.requests();
    assert!(requests[requests.len() - 2].len() > 12_000, "the refused request");
    assert!(requests.last().unwrap().len() <= 12_000);
    assert!(model.summary_requests().iter().all(|r| r.len() <= 12_000));
}

/// A server whose refusal names no window still teaches one: the session keeps a window
/// below the request it refused, so the next turns are sized to it and are not refused again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_guessed_from_a_refusal_that_names_none_is_kept_with_the_session() {
    let model = MockModel::start_with_unnamed_context(
        vec![
            Reply::text(&filler("one", 220)),
            Reply::text(&filler("two", 220)),
            Reply::text("three after an overflow compaction"),
            Reply::text(&filler("four", 220)),
            Reply::text("five"),
        ],
        12_000,
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "guess", &model.url(), None, &[], Vec::new(), Policy::default()).await;
    let cancel = CancelToken::new();
    let id = SessionId::from("guess");
    let brain = h.internals().brain;
    for input in [filler("first", 10), filler("second", 10)] {
        answered(brain.submit(&id, &input, &cancel, &no_events()).await.unwrap());
    }
    let meta = SessionMeta::read(h.internals().engine, &id).await.unwrap();
    assert_eq!(meta.config.model.context_window, None, "nothing refused yet");
    let out = brain.submit(&id, "third", &cancel, &no_events()).await.unwrap();
    assert_eq!(answered(out), "three after an overflow compaction");
    let meta = SessionMeta::read(h.internals().engine, &id).await.unwrap();
    let window = meta.config.model.context_window.expect("a window kept from the refusal");
    assert!(window < 3_000, "below the refused request: {window}");
    // The next turns are sized to that window: the server refuses nothing more.
    for input in [filler("fourth", 10), "fifth".to_string()] {
        answered(brain.submit(&id, &input, &cancel, &no_events()).await.unwrap());
    }
    let requests = model.requests();
    assert_eq!(requests.iter().filter(|r| r.len() > 12_000).count(), 1, "one refusal, the first");
    assert!(requests.iter().rev().take(2).all(|r| r.len() <= 12_000));
    let t = Views::of(h.internals().engine).timeline(&id).await.unwrap();
    assert_eq!(t.checkpoints[0].trigger, keel::compaction::Trigger::Overflow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_calls_in_the_compacted_range_stay_failed_in_the_summary() {
    let model = MockModel::start(vec![
        Reply::calls(&[("f1", "read", r#"{"path":"/work/missing.txt"}"#)]),
        Reply::text("the file is missing"),
        Reply::text("noted"),
    ])
    .await;
    // The summary call does not mention the failure: the journal does.
    model.push_summary(vec![Reply::summary("read a file", &["all went well"])]);
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    let grants = vec![Grant::new(work.path(), "/work", Access::Ro).unwrap()];
    session(&h, "fail", &model.url(), None, &["read"], grants, Policy::default()).await;
    let cancel = CancelToken::new();
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("fail"), "read the missing file", &cancel, &no_events())
            .await
            .unwrap(),
    );
    assert!(matches!(
        h.internals().brain.compact(&SessionId::from("fail"), &cancel, &no_events()).await.unwrap(),
        Compaction::Compacted { .. }
    ));
    let summary_req = String::from_utf8_lossy(&model.summary_requests()[0]).to_string();
    assert!(summary_req.contains(r#"\"failed_calls\":[{\"error_kind\""#), "{summary_req}");
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("fail")).await.unwrap();
    let failed = &t.checkpoints[0].summary.as_ref().unwrap().failed_calls;
    assert_eq!(failed.len(), 1);
    assert_eq!((failed[0].tool.as_str(), failed[0].step), ("read", 1));
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("fail"), "what happened?", &cancel, &no_events())
            .await
            .unwrap(),
    );
    let system = system_of(model.requests().last().unwrap());
    let line = format!("- read failed: {} (step 1)", failed[0].error_kind);
    assert!(system.contains("Calls that failed (from the tool journal):"), "{system}");
    assert!(system.contains(&line), "{system}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_that_arrive_during_a_compaction_wait_in_the_inbox_and_run_after_in_order() {
    let model = MockModel::start(vec![
        Reply::text(&filler("first answer", 20)),
        Reply::text("answer to A"),
        Reply::text("answer to B"),
    ])
    .await;
    // A slow summary call: the inputs arrive while it runs.
    model.push_summary(vec![Reply::Delay(
        std::time::Duration::from_millis(800),
        Box::new(Reply::summary("first", &[])),
    )]);
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "in", &model.url(), None, &[], Vec::new(), Policy::default()).await;
    let cancel = CancelToken::new();
    answered(
        h.internals()
            .brain
            .submit(&SessionId::from("in"), &filler("first", 20), &cancel, &no_events())
            .await
            .unwrap(),
    );
    let compactor = {
        let h = h.clone();
        tokio::spawn(async move {
            h.internals()
                .brain
                .compact(&SessionId::from("in"), &CancelToken::new(), &no_events())
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("in"))
            .await
            .unwrap()
            .runtime
            .state,
        RuntimeState::Compressing
    );
    // Another host process on the same home (its own runner identity).
    let other = harness(dir.path(), &model.url()).await;
    for text in ["input A", "input B"] {
        let out = other
            .internals()
            .brain
            .submit(&SessionId::from("in"), text, &cancel, &no_events())
            .await
            .unwrap();
        assert!(matches!(out, Submitted::Queued { .. }), "{out:?}");
    }
    // Still compressing: an input does not change the state of a compaction.
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("in"))
            .await
            .unwrap()
            .runtime
            .state,
        RuntimeState::Compressing
    );
    let done = compactor.await.unwrap().unwrap();
    assert!(matches!(done, Compaction::Compacted { .. }), "{done:?}");
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("in")).await.unwrap();
    let users: Vec<String> = t
        .messages
        .iter()
        .filter(|m| m.role == "user")
        .map(|m| m.body["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(users[1..], ["input A", "input B"]);
    assert_eq!(t.state, RuntimeState::Idle);
    assert_eq!(t.pending_inputs, 0);
    // The first request after the compaction holds its summary.
    assert!(system_of(&model.requests()[1]).contains(SUMMARY_MARK));
}

/// A summary call that fails does not stop a turn past its threshold: keel compacts
/// mechanically, and the turn's later steps fit without another summary call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_summary_call_does_not_stop_the_turn() {
    let model = MockModel::start(vec![
        Reply::text("ok"),
        Reply::calls(&[("e1", "echo", r#"{"text":"hi"}"#)]),
        Reply::text("finished after a mechanical compaction"),
    ])
    .await;
    model.push_summary(vec![Reply::completion("no"), Reply::completion("still no")]);
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "once", &model.url(), Some(1536), &[], Vec::new(), Policy::default()).await;
    let cancel = CancelToken::new();
    let id = SessionId::from("once");
    answered(
        h.internals().brain.submit(&id, &filler("u1", 70), &cancel, &no_events()).await.unwrap(),
    );
    let out =
        h.internals().brain.submit(&id, &filler("u2", 80), &cancel, &no_events()).await.unwrap();
    assert_eq!(answered(out), "finished after a mechanical compaction");
    let sizes: Vec<usize> = model.requests().iter().map(Vec::len).collect();
    assert_eq!(model.summary_requests().len(), 2, "{sizes:?}");
    let t = Views::of(h.internals().engine).timeline(&id).await.unwrap();
    assert_eq!(t.checkpoints.len(), 1, "{:?}", t.checkpoints);
    assert_eq!(t.checkpoints[0].status, CheckpointStatus::Promoted);
    assert!(t.checkpoints[0].summary.as_ref().unwrap().mechanical);
    // Every request kept room for the reply: under 0.85 × (1,536 − 192) tokens of 4 bytes.
    for r in &model.requests() {
        assert!(r.len() <= 4570, "{}", r.len());
    }
}

/// A completion cut by the token limit (`finish_reason: length`) with `content`.
fn cut_reply(content: &str) -> Reply {
    Reply::Json(serde_json::json!({"id": "x", "object": "chat.completion", "created": 0,
        "model": "m", "choices": [{"index": 0, "finish_reason": "length",
        "message": {"role": "assistant", "content": content}}]}))
}

/// A session of two answered turns whose summary calls will get `summaries`.
async fn two_turns_then(
    summaries: Vec<Reply>,
) -> (MockModel, tempfile::TempDir, keel::harness::Harness, SessionId) {
    let model = MockModel::start(vec![Reply::text(&filler("one", 20)), Reply::text("two")]).await;
    model.push_summary(summaries);
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "s", &model.url(), None, &[], Vec::new(), Policy::default()).await;
    let cancel = CancelToken::new();
    let id = SessionId::from("s");
    for q in ["check orders", "again"] {
        answered(h.internals().brain.submit(&id, q, &cancel, &no_events()).await.unwrap());
    }
    (model, dir, h, id)
}

/// What a small model answers when it loops: one entry, again and again, until cut.
fn looping_summary() -> String {
    let entry = "\"the user asked to check the orders file\"";
    format!(
        "{{\"active_user_request\": \"check orders\", \"decisions\": [{}",
        std::iter::repeat_n(entry, 40).collect::<Vec<_>>().join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_outgrew_the_server_s_context_recovers_in_summary_calls_that_fit() {
    // A server whose context is 12,000 bytes (3,000 tokens) and refuses every request past it,
    // summary requests included; no window is configured: its refusal is what tells.
    let context = 12_000;
    let mut script: Vec<Reply> =
        (0..6).map(|i| Reply::text(&filler(&format!("answer-{i}"), 70))).collect();
    script.push(Reply::text("seventh, after the compaction"));
    script.push(Reply::text("eighth"));
    let model = MockModel::start_with_context(script, context).await;
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "grow", &model.url(), None, &[], Vec::new(), Policy::default()).await;
    let cancel = CancelToken::new();
    let id = SessionId::from("grow");
    for i in 0..7 {
        let out = h
            .internals()
            .brain
            .submit(&id, &filler(&format!("question-{i}"), 8), &cancel, &no_events())
            .await
            .unwrap();
        answered(out);
    }
    // The turn after it still fits: the session is not stuck.
    let out = h.internals().brain.submit(&id, "and now?", &cancel, &no_events()).await.unwrap();
    assert_eq!(answered(out), "eighth");
    let t = Views::of(h.internals().engine).timeline(&id).await.unwrap();
    let done: Vec<_> = t.checkpoints.iter().filter(|c| c.summary.is_some()).collect();
    assert!(!done.is_empty(), "{:#?}", t.checkpoints);
    assert_eq!(done[0].trigger, keel::compaction::Trigger::Overflow);
    // Every summary request fit the server's context with room for its reply, and asked for
    // a reply that fits the window (a quarter of it: 750 tokens).
    let summaries = model.summary_requests();
    assert!(!summaries.is_empty());
    for r in &summaries {
        assert!(r.len() <= context, "a summary request of {} bytes was sent", r.len());
        let v: serde_json::Value = serde_json::from_slice(r).unwrap();
        assert_eq!(v["max_tokens"], 750, "{}", v["max_tokens"]);
        // The request and its whole reply fit the window (the server counts 4 bytes a token).
        assert!(r.len() / 4 + 750 <= context / 4, "{} bytes leave no room to answer", r.len());
    }
    // The range did not fit one call: it was summarized over several, each given the summary
    // so far.
    assert!(summaries.len() >= 2, "{} summary calls", summaries.len());
    let second = String::from_utf8_lossy(&summaries[1]);
    assert!(second.contains(r#"\"previous_summary\":{"#), "{second}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_that_repeats_an_entry_until_cut_is_asked_again_with_a_note() {
    let (model, _dir, h, id) = two_turns_then(vec![
        cut_reply(&looping_summary()),
        Reply::summary("check orders", &["ok"]),
    ])
    .await;
    let cancel = CancelToken::new();
    let out = h.internals().brain.compact(&id, &cancel, &no_events()).await.unwrap();
    assert!(matches!(out, Compaction::Compacted { .. }), "{out:?}");
    // The refused call, its retry with half the messages, and a call for the other half.
    let requests = model.summary_requests();
    assert_eq!(requests.len(), 3);
    let (first, retry) =
        (String::from_utf8_lossy(&requests[0]), String::from_utf8_lossy(&requests[1]));
    // keel's limits are in the schema, sized so that full lists fit the reply (2,048 tokens
    // here): a server that follows it cannot loop past them, nor be cut by the token limit.
    assert!(first.contains(r#""maxItems":8"#) && first.contains(r#""maxLength":92"#), "{first}");
    // The retry is not the same bytes: it says why the last answer was refused.
    assert_ne!(first, retry);
    assert!(!first.contains("note_on_your_last_answer"));
    assert!(retry.contains("note_on_your_last_answer"), "{retry}");
    assert!(retry.contains("cut by the token limit after repeating one entry"), "{retry}");
}

/// A summary the model cannot make — refused twice — does not stop the compaction: keel
/// makes one from the session's record (marked mechanical in the checkpoint, the event and
/// the system message), keeping the refused answer and its cause; a later summary replaces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_refused_twice_names_the_cause_and_keel_compacts_mechanically() {
    let (model, _dir, h, id) =
        two_turns_then(vec![cut_reply(&looping_summary()), cut_reply(&looping_summary())]).await;
    let cancel = CancelToken::new();
    let out = h.internals().brain.compact(&id, &cancel, &no_events()).await.unwrap();
    assert!(matches!(out, Compaction::Compacted { .. }), "{out:?}");
    // The refused answer is kept with the checkpoint, as the model wrote it, and its cause.
    let t = Views::of(h.internals().engine).timeline(&id).await.unwrap();
    let cp = t.checkpoints.last().unwrap();
    assert_eq!(cp.status, CheckpointStatus::Promoted);
    let why = cp.error.as_deref().unwrap();
    assert!(why.contains("cut by the token limit after repeating one entry 39 times"), "{why}");
    assert!(!why.contains("not JSON"), "{why}");
    assert_eq!(cp.reply.as_deref(), Some(looping_summary().as_str()));
    let s = cp.summary.as_ref().unwrap();
    assert!(s.mechanical);
    assert_eq!(s.active_user_request, "again");
    assert!(s.notes.iter().any(|n| n == "the user asked: check orders"), "{:?}", s.notes);
    assert!(s.decisions.is_empty(), "nothing of the refused answer is kept: {s:?}");
    let events = h.internals().engine.events_after(&id, 0, 1000).await.unwrap();
    assert!(events.iter().any(|e| matches!(&e.event,
        SessionEvent::Compacted { mechanical: Some(m), .. } if m.contains("repeating one entry"))));
    assert!(!events.iter().any(|e| matches!(&e.event, SessionEvent::CompactionFailed { .. })));
    // The next request says the summary is keel's.
    model.push(vec![Reply::text("three")]);
    answered(h.internals().brain.submit(&id, "third", &cancel, &no_events()).await.unwrap());
    let system = system_of(model.requests().last().unwrap());
    assert!(system.contains("summarized by keel from the session's record"), "{system}");
    // Not JSON at all is named as such; a later good answer replaces the mechanical summary.
    model.push_summary(vec![Reply::completion("I cannot"), Reply::completion("Sorry.")]);
    assert!(matches!(
        h.internals().brain.compact(&id, &cancel, &no_events()).await.unwrap(),
        Compaction::Compacted { .. }
    ));
    let t = Views::of(h.internals().engine).timeline(&id).await.unwrap();
    let cp = t.checkpoints.last().unwrap();
    assert!(cp.error.as_deref().unwrap().contains("not the JSON object asked for"));
    assert!(cp.summary.as_ref().unwrap().mechanical);
    model.push(vec![Reply::text("four")]);
    answered(h.internals().brain.submit(&id, "fourth", &cancel, &no_events()).await.unwrap());
    model.push_summary(vec![Reply::summary("x", &["a model's note"])]);
    assert!(matches!(
        h.internals().brain.compact(&id, &cancel, &no_events()).await.unwrap(),
        Compaction::Compacted { .. }
    ));
    let t = Views::of(h.internals().engine).timeline(&id).await.unwrap();
    let s = t.checkpoints.last().unwrap().summary.clone().unwrap();
    assert!(!s.mechanical && s.notes == vec!["a model's note"], "{s:?}");
}

/// Small windows as people run them with small local models: every turn reads a file whose
/// result is a third of the window or more, and the server refuses — as llama.cpp does — any
/// request past its context. Every turn is answered: older turns are compacted, and where the
/// step that just ran does not fit whole, its result is cut to fit (head and tail kept, the
/// whole result in the journal), the request's evidence rebuilding byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_windows_with_large_results_answer_every_turn() {
    for (window, result_bytes, turns) in
        [(4000u64, 6 * 1024, 8), (2048, 3 * 1024, 6), (2048, 6 * 1024, 4)]
    {
        let mut script = Vec::new();
        for i in 0..turns {
            script.push(Reply::calls(&[(
                &format!("r{i}"),
                "read",
                r#"{"path":"/work/data.txt"}"#,
            )]));
            script.push(Reply::text(&format!("answer {i}")));
        }
        // The server's context: 4 bytes a token, as keel estimates until usage is reported.
        let model = MockModel::start_with_context(script, window as usize * 4).await;
        let dir = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let line = "0123456789 the quick brown fox jumps over the lazy dog\n";
        let data: String = line.repeat(result_bytes / line.len() + 1);
        std::fs::write(work.path().join("data.txt"), &data).unwrap();
        let h = harness(dir.path(), &model.url()).await;
        let grants = vec![Grant::new(work.path(), "/work", Access::Ro).unwrap()];
        session(&h, "small", &model.url(), Some(window), &["read"], grants, Policy::default())
            .await;
        let cancel = CancelToken::new();
        let id = SessionId::from("small");
        for i in 0..turns {
            let out = h
                .internals()
                .brain
                .submit(&id, &format!("read data.txt and report line {i}"), &cancel, &no_events())
                .await
                .unwrap();
            assert_eq!(answered(out), format!("answer {i}"), "window {window}, turn {i}");
        }
        let requests = model.requests();
        assert_eq!(requests.len(), turns * 2, "window {window}: none refused");
        let t = Views::of(h.internals().engine).timeline(&id).await.unwrap();
        assert!(t.refused_requests.is_empty(), "{:?}", t.refused_requests);
        assert!(t.checkpoints.iter().all(|c| c.status == CheckpointStatus::Promoted));
        // Every request after a read holds the read's call and its result (cut or whole),
        // and its evidence is exact.
        let mut cut = 0;
        for (k, body) in requests.iter().enumerate().filter(|(k, _)| k % 2 == 1) {
            let msgs = messages(body);
            let result = msgs.iter().find(|m| m["tool_call_id"] == format!("r{}", k / 2));
            let content = result.and_then(|m| m["content"].as_str()).unwrap_or_else(|| {
                panic!("window {window}: request {k} lacks the step's result: {msgs:#?}")
            });
            if content.contains("keel cut") {
                cut += 1;
                assert!(content.contains("the whole result is kept in the session's journal"));
            }
            assert_calls_whole(body);
            let (_, evidence) =
                Assembly::of(h.internals().engine).evidence(&id, Some(k as i64 + 1)).await.unwrap();
            assert_eq!(&evidence, body, "window {window}: the evidence of request {k}");
        }
        eprintln!(
            "window {window}: {turns} turns answered, {} compactions, {cut} results cut to fit",
            t.checkpoints.len()
        );
        if result_bytes > window as usize * 2 {
            assert_eq!(cut, turns, "a 6 KB result does not fit a 2,048-token window whole");
        }
    }
}
