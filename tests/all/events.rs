//! Durable session events: written with the facts they report, numbered per session, read
//! after a sequence number, and followed from another process's engine while a turn with an
//! approval runs.

use keel::ids::SessionId;
use std::time::Duration;

use keel::agent::{LoopGuards, TurnOutcome};
use keel::brain::Submitted;
use keel::sandbox::{Access, CancelToken, Grant};
use keel::session::{Decision, EventRow, RuntimeState, SessionEvent};
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::{harness_with_session, install_effects, no_events};

const TOOLS: &[&str] = &["effect_send", "effect_peek"];

/// A short, comparable form of an event.
fn short(e: &SessionEvent) -> String {
    match e {
        SessionEvent::InputAccepted { inbox_seq, .. } => format!("input {inbox_seq}"),
        SessionEvent::TurnStarted { turn } => format!("turn {turn}"),
        SessionEvent::UnderstandingStarted { turn, .. } => format!("understanding {turn}"),
        SessionEvent::TaskTransition { relation, mode, .. } => {
            format!("transition {} {mode}", relation.map(|r| r.as_str()).unwrap_or("-"))
        }
        SessionEvent::EnvironmentApplied { .. } => "environment".into(),
        SessionEvent::State { state, .. } => format!("state {state}"),
        SessionEvent::ModelCallStarted { step, .. } => format!("model {step}"),
        SessionEvent::ModelCallFinished { step, finish_reason, .. } => {
            format!("replied {step} {}", finish_reason.as_deref().unwrap_or("-"))
        }
        SessionEvent::ModelCallFailed { step, http_status, .. } => {
            format!("failed {step} {http_status:?}")
        }
        SessionEvent::ToolCall { tool, status, .. } => format!("{tool} {status}"),
        SessionEvent::ApprovalAsked { tool, .. } => format!("ask {tool}"),
        SessionEvent::ApprovalDecided { decision, .. } => format!("decided {decision}"),
        SessionEvent::Answer { text, .. } => format!("answer {text}"),
        SessionEvent::Notice { .. } => "notice".into(),
        SessionEvent::PlanChanged { version, .. } => format!("plan {version}"),
        SessionEvent::PhaseCompleted { .. } => "phase completed".into(),
        SessionEvent::CapabilitiesDiscovering { turn } => format!("discovering {turn}"),
        SessionEvent::CapabilitiesRecalled { call, .. } => format!("recalled call={call}"),
        SessionEvent::Orchestrated { .. } => "orchestrated".into(),
        SessionEvent::CapabilitiesAdded { via, tools, skills } => {
            format!("added {via} {} {}", tools.join(","), skills.join(","))
        }
        SessionEvent::CapabilityUnloaded { capability, name } => {
            format!("unloaded {capability} {name}")
        }
        SessionEvent::CompactionStarted { trigger, from, to, .. } => {
            format!("compacting {trigger} {from}-{to}")
        }
        SessionEvent::CheckpointPrepared { checkpoint } => format!("checkpoint {checkpoint}"),
        SessionEvent::Compacted { checkpoint, context_start, .. } => {
            format!("compacted {checkpoint} {context_start}")
        }
        SessionEvent::CompactionFailed { .. } => "compaction failed".into(),
        SessionEvent::CompactionAbandoned { .. } => "compaction abandoned".into(),
        SessionEvent::CheckpointDiscarded { checkpoint, .. } => format!("discarded {checkpoint}"),
        SessionEvent::Workgroup { event_kind, from, to, .. } => {
            format!("{event_kind} {from}->{to}")
        }
        SessionEvent::ClientConnected { client, transport, .. } => {
            format!("client {client} {transport}")
        }
        SessionEvent::ModelChanged { to, .. } => format!("model changed to {}", to.model),
        SessionEvent::PolicyChanged { change, .. } => format!("policy {change}"),
        SessionEvent::RewindStarted { to, .. } => format!("rewind to {to}"),
        SessionEvent::Rewound { to, .. } => format!("rewound to {to}"),
        SessionEvent::Forked { from, at, .. } => format!("forked from {from} at {at}"),
        SessionEvent::ConversationRewound { to, .. } => format!("conversation rewound to {to}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_report_every_visible_change_and_another_engine_follows_them() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "effect_send", r#"{"label":"hello"}"#)]).with_usage(50, 5, None),
        Reply::text("sent it"),
        Reply::Status { code: 400, retry_after: None, body: "bad".into() },
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let grants = vec![Grant::new(work.path(), "/work", Access::Rw).unwrap()];
    let h =
        harness_with_session(home.path(), &model.url(), "e", TOOLS, grants, LoopGuards::default())
            .await;
    install_effects(&h).await;
    // Another engine on the same home follows the session: what another process sees.
    let watcher =
        harness_with_session(home.path(), &model.url(), "e", TOOLS, vec![], LoopGuards::default())
            .await;
    let mut rx =
        watcher.internals().engine.follow(&SessionId::from("e"), 0, Duration::from_millis(20));

    let cancel = CancelToken::new();
    let out = h
        .internals()
        .brain
        .submit(&SessionId::from("e"), "send hello", &cancel, &no_events())
        .await
        .unwrap();
    let Submitted::Ran(TurnOutcome::WaitingApproval(units)) = out else {
        panic!("expected a wait for approval, got {out:?}")
    };
    h.internals().engine.decide(&units[0], Decision::Approve, None, None).await.unwrap().unwrap();
    assert_eq!(
        h.internals().brain.drain(&SessionId::from("e"), &cancel, &no_events()).await.unwrap(),
        Some(Submitted::Ran(TurnOutcome::Answer("sent it".into())))
    );
    // A refused request is an event too.
    let out = h
        .internals()
        .brain
        .submit(&SessionId::from("e"), "again", &cancel, &no_events())
        .await
        .unwrap();
    assert!(matches!(out, Submitted::Ran(TurnOutcome::Failed(_))), "{out:?}");

    let expected = [
        "input 1",
        "state preparing_context",
        "turn 1",
        "state running",
        "understanding 1",
        "transition uncertain initialize",
        "discovering 1",
        "recalled call=false",
        "environment",
        "model 1",
        "replied 1 tool_calls",
        "effect_send planned",
        "effect_send waiting",
        "ask effect_send",
        "state waiting_approval",
        "decided approved",
        "state running",
        "effect_send intent",
        "effect_send done",
        "model 2",
        "replied 2 stop",
        "answer sent it",
        "state idle",
        "input 2",
        "state preparing_context",
        "turn 2",
        "state running",
        "understanding 2",
        "transition uncertain keep",
        "model 3",
        "failed 3 Some(400)",
        "state failed",
    ];
    let mut followed: Vec<EventRow> = Vec::new();
    while followed.len() < expected.len() {
        let row = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the follower sees every event")
            .unwrap()
            .unwrap();
        followed.push(row);
    }
    let got: Vec<String> = followed.iter().map(|r| short(&r.event)).collect();
    assert_eq!(got, expected);
    // Numbered 1, 2, … with no gap, in commit order.
    let seqs: Vec<i64> = followed.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=expected.len() as i64).collect::<Vec<_>>());
    assert!(followed.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    // Nothing more arrives.
    assert!(tokio::time::timeout(Duration::from_millis(200), rx.recv()).await.is_err());

    // Reading after a sequence number gives the same rows.
    let tail = h.internals().engine.events_after(&SessionId::from("e"), 20, 100).await.unwrap();
    assert_eq!(tail, followed[20..]);
    assert_eq!(
        h.internals().engine.events_after(&SessionId::from("e"), 0, 3).await.unwrap(),
        followed[..3]
    );
    assert_eq!(
        h.internals().engine.last_event(&SessionId::from("e")).await.unwrap(),
        expected.len() as i64
    );
    // The finished model call carries its tokens; the state its detail.
    match &followed[10].event {
        SessionEvent::ModelCallFinished { usage: Some(u), attempts: 1, .. } => {
            assert_eq!((u.prompt_tokens, u.completion_tokens), (50, 5))
        }
        other => panic!("{other:?}"),
    }
    match &followed[14].event {
        SessionEvent::State { state: RuntimeState::WaitingApproval, detail: Some(d) } => {
            assert!(d.contains(units[0].as_str()), "{d}")
        }
        other => panic!("{other:?}"),
    }
    // An unknown session is an error, not an empty list.
    let e = h
        .internals()
        .engine
        .events_after(&SessionId::from("nope"), 0, 10)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope"), "{e}");
}
