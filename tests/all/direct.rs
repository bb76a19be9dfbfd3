//! Direct calls — a front-end's tool call in a session without a model (an MCP client's
//! `tools/call`): journaled as a step of its own, asked about through the caller, never run
//! unapproved, and settled by recovery after a crash like a step's calls.

use keel::agent::LoopGuards;
use keel::failure::FailureKind;
use keel::ids::CallId;
use keel::ids::SessionId;
use keel::meta::SessionMeta;
use keel::sandbox::{Access, CancelToken, Grant};
use keel::session::{Decision, JournalEntry, JournalStatus, RuntimeState};
use keel::views::Views;
use keel_tests::{harness_with_session, install_effects, log_lines};
use serde_json::json;

const TOOLS: &[&str] = &["effect_send", "effect_peek"];

async fn fixture(home: &std::path::Path, work: &std::path::Path) -> keel::harness::Harness {
    let grants = vec![Grant::new(work, "/work", Access::Rw).unwrap()];
    let h = harness_with_session(
        home,
        "http://127.0.0.1:9/v1",
        "d",
        TOOLS,
        grants,
        LoopGuards::default(),
    )
    .await;
    install_effects(&h).await;
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_calls_are_journaled_asked_about_and_never_run_unapproved() {
    let (home, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let h = fixture(home.path(), work.path()).await;
    let cancel = CancelToken::new();
    let input = json!({"label": "m1"}).to_string();

    // Read-only: runs without asking.
    let peek = h
        .internals()
        .brain
        .call_direct(&SessionId::from("d"), "effect_peek", r#"{"label":"x"}"#, &cancel, |_| async {
            panic!("a read-only call is not asked about")
        })
        .await
        .unwrap();
    assert!(peek.ran && peek.result.is_ok() && peek.output.is_some(), "{peek:?}");

    // External, nobody to ask: refused, nothing sent.
    let refused = h
        .internals()
        .brain
        .call_direct(&SessionId::from("d"), "effect_send", &input, &cancel, |_| async { None })
        .await
        .unwrap();
    assert!(!refused.ran, "{refused:?}");
    assert_eq!(refused.result.error, Some(FailureKind::NeedsApproval));
    assert!(refused.ask_reason.is_some());
    assert!(log_lines(work.path(), "sent.log").is_empty());

    // Rejected by the person: not run, the reason kept.
    let rejected = h
        .internals()
        .brain
        .call_direct(&SessionId::from("d"), "effect_send", &input, &cancel, |unit| async move {
            assert_eq!(unit.tool, "effect_send");
            assert_eq!(unit.input, json!({"label": "m1"}).to_string());
            Some((Decision::Reject, Some("not now".into())))
        })
        .await
        .unwrap();
    assert!(!rejected.ran, "{rejected:?}");
    assert_eq!(rejected.result.error, Some(FailureKind::Rejected));
    assert!(rejected.result.content.contains("not now"), "{rejected:?}");
    assert!(log_lines(work.path(), "sent.log").is_empty());

    // Approved: runs exactly once, consuming the approval.
    let approved = h
        .internals()
        .brain
        .call_direct(&SessionId::from("d"), "effect_send", &input, &cancel, |_| async {
            Some((Decision::Approve, Some("ok".into())))
        })
        .await
        .unwrap();
    assert!(approved.ran && approved.result.is_ok(), "{approved:?}");
    assert_eq!(log_lines(work.path(), "sent.log"), vec!["m1"]);
    let units = h.internals().engine.approvals(Some("d"), false).await.unwrap();
    let statuses: Vec<&str> = units.iter().map(|u| u.status.as_str()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == "consumed").count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == "rejected").count(), 2, "{statuses:?}");

    // Each call is a step with one journal row, all done; the session is idle again.
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("d")).await.unwrap();
    let rows: Vec<(i64, &str, Option<&str>)> = t
        .tool_calls
        .iter()
        .map(|c| (c.step, c.entry.tool.as_str(), c.entry.error_kind.map(|k| k.as_str())))
        .collect();
    assert_eq!(
        rows,
        vec![
            (1, "effect_peek", None),
            (2, "effect_send", Some("needs_approval")),
            (3, "effect_send", Some("rejected")),
            (4, "effect_send", None),
        ]
    );
    assert!(t.tool_calls.iter().all(|c| c.entry.status == JournalStatus::Done));
    assert_eq!(
        SessionMeta::read(h.internals().engine, &SessionId::from("d")).await.unwrap().runtime.state,
        RuntimeState::Idle
    );

    // A tool the session did not load is refused (and journaled) like any call.
    let unloaded = h
        .internals()
        .brain
        .call_direct(&SessionId::from("d"), "effect_wipe", "{}", &cancel, |_| async { None })
        .await
        .unwrap();
    assert!(!unloaded.ran, "{unloaded:?}");
    assert_eq!(unloaded.result.error, Some(FailureKind::UnknownTool));
}

fn intent(id: &str, tool: &str, effect: &str, idempotent: bool) -> JournalEntry {
    JournalEntry {
        call_id: CallId::new(id),
        position: 0,
        tool: tool.into(),
        input: r#"{"label":"c"}"#.into(),
        component_digest: Some("d".repeat(64)),
        effect: Some(effect.parse().unwrap()),
        status: JournalStatus::Intent,
        result: None,
        error_kind: None,
        changes: None,
        duration_ms: None,
        idempotent,
        approval_id: None,
        net: None,
        logs: None,
        control_requests: Vec::new(),
        kept: Default::default(),
    }
}

/// A process that stopped during direct calls: the external call's outcome is unknown (it
/// may have had its effect and is never run again), the read-only one is closed as
/// interrupted, and the session is idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_a_direct_call_leaves_an_unknown_outcome() {
    let (home, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let h = fixture(home.path(), work.path()).await;
    h.internals()
        .engine
        .begin_direct(&SessionId::from("d"), intent("direct-a", "effect_peek", "read-only", true))
        .await
        .unwrap();
    h.internals()
        .engine
        .begin_direct(&SessionId::from("d"), intent("direct-b", "effect_send", "external", false))
        .await
        .unwrap();
    drop(h);
    // The next process recovers the session (no runner holds it).
    let h = fixture(home.path(), work.path()).await;
    let r = h
        .recovered(&keel::api::Caller::Operator)
        .unwrap()
        .iter()
        .find(|r| r.id.as_str() == "d")
        .expect("the session is recovered");
    assert_eq!(r.outcome_unknown, vec![CallId::new("direct-b")]);
    assert_eq!(r.state_after, RuntimeState::Idle);
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("d")).await.unwrap();
    let rows: Vec<(&str, &str, Option<&str>)> = t
        .tool_calls
        .iter()
        .map(|c| {
            (
                c.entry.call_id.as_str(),
                c.entry.status.as_str(),
                c.entry.error_kind.map(|k| k.as_str()),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            ("direct-a", "done", Some("interrupted")),
            ("direct-b", "unknown", Some("outcome_unknown")),
        ]
    );
    assert!(log_lines(work.path(), "sent.log").is_empty(), "nothing is run again");
}
