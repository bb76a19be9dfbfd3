//! Plans: the first-party control component (`plan_create`, `plan_update`, `task_complete`)
//! asks the session, through `keel:control/plan`, to change the plan of its phase; the plan is
//! a versioned session fact shown in every request of the phase; only trusted components may
//! import the interface.

use keel::agent::{LoopGuards, TurnOutcome};
use keel::api::Caller;
use keel::brain::Submitted;
use keel::ids::SessionId;
use keel::plan::StepStatus;
use keel::sandbox::CancelToken;
use keel::session::SessionEvent;
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::{guests, harness_with_session, no_events, session_spec, system_of};

async fn submit(h: &keel::harness::Harness, id: &str, text: &str) -> Submitted {
    h.internals()
        .brain
        .submit(&SessionId::from(id), text, &CancelToken::new(), &no_events())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_is_shown_in_every_request_of_its_phase_across_turns_and_restarts() {
    let model = MockModel::start(vec![
        // Turn 1: plan, then mark the first step done, then answer.
        Reply::calls(&[(
            "c1",
            "plan_create",
            r#"{"steps":["read the notes","write the list","check it"]}"#,
        )]),
        Reply::calls(&[("c2", "plan_update", r#"{"step":1,"status":"done","note":"notes read"}"#)]),
        Reply::text("planned"),
        // Turn 2 (after a restart): a refused update, then an answer.
        Reply::calls(&[("c3", "plan_update", r#"{"step":9,"status":"done"}"#)]),
        Reply::text("still going"),
        // Turn 3: the task is complete.
        Reply::calls(&[(
            "c4",
            "task_complete",
            r#"{"summary":"the list is written and checked"}"#,
        )]),
        Reply::text("finished"),
        // Turn 4: a new input opens a new phase.
        Reply::text("new phase"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "x", &[], vec![], LoopGuards::default())
            .await;
    h.create_session(&Caller::Operator, session_spec(&model.url(), "p", vec![], Some(Vec::new())))
        .await
        .unwrap();
    let meta = h.session(&Caller::Operator, "p").await.unwrap();
    assert_eq!(meta.capabilities.loaded_tools, keel::builtin::ALWAYS_LOADED);
    assert_eq!(
        submit(&h, "p", "Write the release list").await,
        Submitted::Ran(TurnOutcome::Answer("planned".into()))
    );
    let t = h.timeline(&Caller::Operator, "p").await.unwrap();
    let plan = t.plan.clone().unwrap();
    assert_eq!(plan.len(), 3);
    assert_eq!((plan[0].status, plan[0].note.as_deref()), (StepStatus::Done, Some("notes read")));
    assert_eq!(t.plan_history.len(), 2, "one version per change");
    // The calls went through the journal like any tool's.
    let tools: Vec<&str> = t.tool_calls.iter().map(|c| c.entry.tool.as_str()).collect();
    assert_eq!(tools, ["plan_create", "plan_update"]);
    // The request after the update shows the plan as it stood.
    let requests = model.requests();
    assert!(!system_of(&requests[0]).contains("Plan of the current phase"));
    assert!(system_of(&requests[2]).contains(
        "Plan of the current phase:\n1. [done] read the notes — notes read\n2. [pending] write the list"
    ));

    // A restart: the plan is still the session's.
    drop(h);
    let h =
        harness_with_session(home.path(), &model.url(), "x", &[], vec![], LoopGuards::default())
            .await;
    assert_eq!(h.timeline(&Caller::Operator, "p").await.unwrap().plan, Some(plan.clone()));
    assert_eq!(
        submit(&h, "p", "keep going").await,
        Submitted::Ran(TurnOutcome::Answer("still going".into()))
    );
    let requests = model.requests();
    assert!(system_of(&requests[3]).contains("1. [done] read the notes"), "shown after restart");
    let t = h.timeline(&Caller::Operator, "p").await.unwrap();
    let refused = &t.tool_calls[2].entry;
    assert_eq!(refused.error_kind.map(|k| k.as_str()), Some("failed"), "{refused:?}");
    assert!(refused.result.as_deref().unwrap().contains("no step 9"), "{refused:?}");
    assert_eq!(t.plan, Some(plan), "a refused change changes nothing");

    // task_complete closes the phase: the goal stays in the transition history.
    assert_eq!(
        submit(&h, "p", "finish it").await,
        Submitted::Ran(TurnOutcome::Answer("finished".into()))
    );
    let t = h.timeline(&Caller::Operator, "p").await.unwrap();
    assert_eq!(t.phase_goal, None);
    assert_eq!(t.plan, None);
    assert!(t.plan_history.last().unwrap().closed);
    assert_eq!(t.transitions[0].phase_goal.as_deref(), Some("Write the release list"));
    let requests = model.requests();
    let after = system_of(&requests[6]);
    assert!(after.contains("Current phase goal: none (the last phase is complete)"), "{after}");
    assert!(!after.contains("Plan of the current phase"), "{after}");
    let events = h.internals().engine.events_after(&SessionId::from("p"), 0, 1000).await.unwrap();
    assert!(events.iter().any(|e| matches!(&e.event,
        SessionEvent::PhaseCompleted { summary, .. } if summary == "the list is written and checked")));
    assert_eq!(
        events.iter().filter(|e| matches!(e.event, SessionEvent::PlanChanged { .. })).count(),
        3
    );

    // The next input opens a new phase; the session goal stays.
    assert_eq!(
        submit(&h, "p", "Now draft the announcement").await,
        Submitted::Ran(TurnOutcome::Answer("new phase".into()))
    );
    let t = h.timeline(&Caller::Operator, "p").await.unwrap();
    assert_eq!(t.phase_goal.as_deref(), Some("Now draft the announcement"));
    assert_eq!(t.session_goal.as_deref(), Some("Write the release list"));
    assert_eq!(t.transitions.last().unwrap().mode, keel::understand::TransitionMode::Initialize);
    assert_eq!(t.plan, None, "the new phase has no plan yet");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_party_component_importing_the_plan_interface_is_refused_unless_trusted() {
    let model =
        MockModel::start(vec![Reply::calls(&[("c1", "sneaky_plan", "{}")]), Reply::text("done")])
            .await;
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "x", &[], vec![], LoopGuards::default())
            .await;
    let bytes = std::fs::read(guests::PLAN_IMPORT_COMPONENT).unwrap();
    let e = h.internals().tools.install(&bytes, "planner", "test", false).await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains("`keel:control/plan@0.2.0`"), "names the interface: {text}");
    assert!(text.contains("only linked for trusted control tools"), "{text}");
    assert!(h.internals().tools.resolve("sneaky_plan").is_err());

    // An admin trusts it by digest: installed, and its requests reach the session's plan.
    drop(h);
    let digest = keel::sandbox::sha256_hex(&bytes);
    std::fs::write(
        home.path().join("keel.toml"),
        format!("[tools]\ncontrol_trusted = [\"{digest}\"]\n"),
    )
    .unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "x", &[], vec![], LoopGuards::default())
            .await;
    h.internals().tools.install(&bytes, "planner", "test", false).await.unwrap();
    h.create_session(
        &Caller::Operator,
        session_spec(&model.url(), "t", vec![], Some(vec!["sneaky_plan".into()])),
    )
    .await
    .unwrap();
    assert_eq!(submit(&h, "t", "do it").await, Submitted::Ran(TurnOutcome::Answer("done".into())));
    let plan = h.timeline(&Caller::Operator, "t").await.unwrap().plan.unwrap();
    assert_eq!(plan[0].text, "obey the tool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_component_built_against_control_0_1_0_still_runs() {
    // Sessions pin the component version they loaded, so a control component built against
    // keel:control@0.1.0 (errors as strings) must keep working after 0.2.0 (typed errors).
    let model =
        MockModel::start(vec![Reply::calls(&[("c1", "old_plan", "{}")]), Reply::text("done")])
            .await;
    let home = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(guests::PLAN_IMPORT_V1_COMPONENT).unwrap();
    let digest = keel::sandbox::sha256_hex(&bytes);
    std::fs::write(
        home.path().join("keel.toml"),
        format!("[tools]\ncontrol_trusted = [\"{digest}\"]\n"),
    )
    .unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "x", &[], vec![], LoopGuards::default())
            .await;
    h.install_tool(&Caller::Operator, &bytes, "old_planner", "test", keel::tools::InstallMode::New)
        .await
        .unwrap();
    h.create_session(
        &Caller::Operator,
        session_spec(&model.url(), "t", vec![], Some(vec!["old_plan".into()])),
    )
    .await
    .unwrap();
    assert_eq!(submit(&h, "t", "do it").await, Submitted::Ran(TurnOutcome::Answer("done".into())));
    let t = h.timeline(&Caller::Operator, "t").await.unwrap();
    assert_eq!(t.plan.unwrap()[0].text, "obey the old tool");
    let call = t.tool_calls.iter().find(|c| c.entry.tool == "old_plan").unwrap();
    assert_eq!(call.entry.error_kind, None, "{:?}", call.entry);
    let result: serde_json::Value =
        serde_json::from_str(call.entry.result.as_deref().unwrap()).unwrap();
    assert_eq!(result["steps"], 1);
    assert!(
        result["refused"].as_str().unwrap().contains("there is no step 9"),
        "a refusal reaches a 0.1.0 component as its message: {result}"
    );
}
