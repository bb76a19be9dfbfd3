//! The use-case API on `Harness`: a whole approval flow — create, send, wait, decide, resume —
//! with no CLI code, and the typed refusals a front-end maps to its own codes.

use keel::agent::{LoopGuards, TurnOutcome};
use keel::api::ApiError;
use keel::brain::Submitted;
use keel::sandbox::{Access, CancelToken, Grant};
use keel::session::{Decision, RuntimeState};
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::{harness_with_session, install_effects, log_lines, no_events};

fn spec(url: &str, grants: Vec<Grant>, tools: Option<Vec<String>>) -> keel::api::SessionSpec {
    keel_tests::session_spec(url, "api", grants, tools)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_flow_through_the_api_and_its_typed_refusals() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "effect_send", r#"{"label":"hello"}"#)]),
        Reply::text("sent"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "_", &[], vec![], LoopGuards::default())
            .await;
    install_effects(&h).await;
    let grants = vec![Grant::new(work.path(), "/work", Access::Rw).unwrap()];

    // Refusals, each with its kind, and nothing created.
    let unknown = Some(vec!["no_such_tool".to_string()]);
    let e = h.create_session(spec(&model.url(), grants.clone(), unknown)).await.unwrap_err();
    assert_eq!(e.kind(), "not_installed", "{e}");
    let overlapping = vec![
        Grant::new(work.path(), "/work", Access::Rw).unwrap(),
        Grant::new(work.path(), "/work/sub", Access::Ro).unwrap(),
    ];
    let e = h.create_session(spec(&model.url(), overlapping, None)).await.unwrap_err();
    assert_eq!(e.kind(), "grant", "{e}");
    let e = h.create_session(spec("ftp://nowhere", grants.clone(), None)).await.unwrap_err();
    assert_eq!(e.kind(), "config", "{e}");
    assert!(!h.engine.exists("api").await.unwrap());

    let tools = Some(vec!["effect_send".to_string()]);
    let id = h.create_session(spec(&model.url(), grants, tools)).await.unwrap();
    let meta = h.engine.meta(&id).await.unwrap();
    assert_eq!(meta.guards.map(|g| g.max_steps), Some(5), "the loop guards are stored");
    assert!(meta.tool_pins.contains_key("effect_send"), "the loaded tool is pinned");
    let e = h.create_session(spec(&model.url(), vec![], None)).await.unwrap_err();
    assert_eq!(e.kind(), "conflict", "the id is taken: {e}");

    let cancel = CancelToken::new();
    let e = h.send(&id, "  ", &cancel, &no_events()).await.unwrap_err();
    assert!(matches!(e, ApiError::Input(_)), "{e}");
    let units = match h.send(&id, "send hello", &cancel, &no_events()).await.unwrap() {
        Submitted::Ran(TurnOutcome::WaitingApproval(units)) => units,
        other => panic!("expected a wait for approval, got {other:?}"),
    };
    assert!(log_lines(work.path(), "sent.log").is_empty(), "nothing ran before the decision");
    let decided = h.decide(&units[0], Decision::Approve, None, Some(id.to_string())).await.unwrap();
    assert_eq!(decided.status, keel::session::ApprovalStatus::Approved);
    let e = h.decide(&units[0], Decision::Reject, None, None).await.unwrap_err();
    assert_eq!(e.kind(), "not_pending", "exactly one decision wins: {e}");
    assert_eq!(
        h.resume(&id, &cancel, &no_events()).await.unwrap(),
        Some(Submitted::Ran(TurnOutcome::Answer("sent".into())))
    );
    assert_eq!(log_lines(work.path(), "sent.log"), ["hello"]);
    assert_eq!(h.engine.meta(&id).await.unwrap().state, RuntimeState::Idle);
}
