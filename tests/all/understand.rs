//! Task understanding: one stateless call per input, the fixed transition table, the goals in
//! every business request — against the scripted loopback server, asserting on the bytes it
//! got.

use keel::agent::{LoopGuards, TurnOutcome};
use keel::api::Caller;
use keel::brain::Submitted;
use keel::ids::SessionId;
use keel::sandbox::CancelToken;
use keel::understand::{INSTRUCTIONS, TaskRelation, TransitionMode};
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::{answered, harness_with_session, no_events, system_of};
use serde_json::Value;

async fn submit(h: &keel::harness::Harness, id: &str, text: &str) -> Submitted {
    h.internals()
        .brain
        .submit(&SessionId::from(id), text, &CancelToken::new(), &no_events())
        .await
        .unwrap()
}

/// Each transition's relation and mode, in order.
fn relations(t: &keel::views::Timeline) -> Vec<(Option<TaskRelation>, TransitionMode)> {
    t.transitions.iter().map(|t| (t.relation, t.mode)).collect()
}

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap()
}

const ASK: &str = "Write a release checklist for the csv plugin";
const MORE: &str = "Add a line about the changelog";
const SWITCH: &str = "Now turn the checklist into a Word document";
const ASIDE: &str = "What is the weather like?";
const HMM: &str = "ok";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_relation_applies_its_row_of_the_table_and_the_goals_reach_every_request_once() {
    let model =
        MockModel::start((1..=6).map(|i| Reply::text(&format!("answer {i}"))).collect()).await;
    model.push_understanding(vec![
        Reply::understanding("establish_task", &["release checklist"], &["csv"], &[]),
        Reply::understanding("continue_current", &[], &[], &["changelog"]),
        Reply::understanding("change_within_session", &["document conversion"], &["docx"], &[]),
        Reply::understanding("outside_session_scope", &[], &[], &[]),
        Reply::understanding("uncertain", &[], &[], &[]),
        Reply::understanding("establish_task", &[], &[], &[]),
    ]);
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "t", &[], vec![], LoopGuards::default())
            .await;
    for (i, text) in
        [ASK, MORE, SWITCH, ASIDE, HMM, "start over on something else"].iter().enumerate()
    {
        assert_eq!(answered(submit(&h, "t", text).await), format!("answer {}", i + 1));
    }
    let t = h.timeline(&Caller::Operator, "t").await.unwrap();
    use TaskRelation::*;
    use TransitionMode::*;
    assert_eq!(
        relations(&t),
        [
            (Some(EstablishTask), Initialize),
            (Some(ContinueCurrent), Keep),
            (Some(ChangeWithinSession), Reconcile),
            (Some(OutsideSessionScope), Keep),
            (Some(Uncertain), Keep),
            // A phase is open: establishing a task again is not a change of the goals.
            (Some(EstablishTask), Keep),
        ]
    );
    assert_eq!(t.transitions[0].terms.skill, ["release checklist"]);
    assert_eq!(t.transitions[1].terms.memory, ["changelog"]);
    assert_eq!(t.transitions[2].terms.tool, ["docx"]);
    assert_eq!(t.session_goal.as_deref(), Some(ASK), "the session goal is the first task");
    assert_eq!(t.phase_goal.as_deref(), Some(SWITCH), "the change set the phase goal");
    assert_eq!(t.transitions[2].phase_goal.as_deref(), Some(SWITCH));
    assert!(t.transitions.iter().all(|t| t.error.is_none()));

    // Every business request carries the goals of its turn in its system part, each once.
    let requests = model.requests();
    assert_eq!(requests.len(), 6, "understanding calls are not business requests");
    let first = system_of(&requests[0]);
    assert!(
        first.contains(&format!("Session goal (also the current phase goal): {ASK}")),
        "{first}"
    );
    assert_eq!(first.matches(ASK).count(), 1, "{first}");
    for body in &requests[2..] {
        let system = system_of(body);
        assert!(system.contains(&format!("Session goal: {ASK}\nCurrent phase goal: {SWITCH}")));
        assert_eq!(system.matches(ASK).count(), 1, "{system}");
        assert_eq!(system.matches(SWITCH).count(), 1, "{system}");
    }
    // The events report each transition; goals changed twice.
    let events = h.internals().engine.events_after(&SessionId::from("t"), 0, 1000).await.unwrap();
    let applied = events
        .iter()
        .filter(|e| matches!(e.event, keel::session::SessionEvent::EnvironmentApplied { .. }))
        .count();
    assert_eq!(applied, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_sees_only_the_message_its_resources_and_the_two_goals() {
    let model = MockModel::start(vec![Reply::text("first answer"), Reply::text("second")]).await;
    model.push_understanding(vec![Reply::understanding("establish_task", &[], &[], &[])]);
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "t", &[], vec![], LoopGuards::default())
            .await;
    answered(submit(&h, "t", ASK).await);
    answered(submit(&h, "t", MORE).await);
    let calls = model.understanding_requests();
    assert_eq!(calls.len(), 2);
    for (i, body) in calls.iter().enumerate() {
        let v = json(body);
        assert_eq!(v["stream"], false, "not streamed");
        assert_eq!(v["temperature"], 0.0);
        assert_eq!(v["max_tokens"], 512);
        assert_eq!(v["response_format"]["type"], "json_schema");
        let messages = v["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2, "no history");
        assert_eq!(messages[0]["content"], INSTRUCTIONS);
        let input: Value = serde_json::from_str(messages[1]["content"].as_str().unwrap()).unwrap();
        let mut keys: Vec<&str> = input.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["current_task_goal", "message", "resources", "session_goal"]);
        assert_eq!(input["resources"], serde_json::json!([]));
        if i == 0 {
            assert_eq!(input["message"], ASK);
            assert!(input["current_task_goal"].is_null() && input["session_goal"].is_null());
        } else {
            assert_eq!(input["message"], MORE);
            // The current goal is the session goal: named, not sent twice.
            assert_eq!(input["current_task_goal"], keel::understand::SAME_AS_SESSION_GOAL);
            assert_eq!(input["session_goal"], ASK);
        }
        // Nothing of the history: not the earlier answer, not the tools, not the prompt.
        let text = String::from_utf8_lossy(body);
        assert!(!text.contains("first answer") && !text.contains("test agent"), "{text}");
        assert!(v.get("tools").is_none());
        // The request is kept byte for byte.
        let (turn, kept) =
            h.understanding_evidence(&Caller::Operator, "t", Some(i as i64 + 1)).await.unwrap();
        assert_eq!(turn, i as i64 + 1);
        assert_eq!(&kept, body);
    }
    assert_eq!(h.understanding_evidence(&Caller::Operator, "t", None).await.unwrap().1, calls[1]);
    let e = h.understanding_evidence(&Caller::Operator, "t", Some(9)).await.unwrap_err();
    assert_eq!(e.kind(), "not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_failed_call_is_uncertain_and_the_turn_runs_with_its_input_kept() {
    let model =
        MockModel::start((1..=6).map(|i| Reply::text(&format!("answer {i}"))).collect()).await;
    let fail = || Reply::Status { code: 503, retry_after: Some(0), body: "overloaded".into() };
    model.push_understanding(vec![
        // Turn 1: the call fails (and its one retry): the input still sets the task up.
        fail(),
        fail(),
        // Turn 2: not JSON.
        Reply::completion("I think the user wants to continue."),
        // Turn 3: an object where a list of terms must be.
        Reply::completion(
            r#"{"task_relation":"change_within_session","skill_recall_terms":{"a":1},"tool_recall_terms":[],"memory_recall_terms":[]}"#,
        ),
        // Turn 4: an empty body (and again on the retry).
        Reply::Empty,
        Reply::Empty,
        // Turn 5: an unknown relation.
        Reply::completion(
            r#"{"task_relation":"pivot","skill_recall_terms":[],"tool_recall_terms":[],"memory_recall_terms":[]}"#,
        ),
        // Turn 6: JSON, but not an object.
        Reply::completion(r#"["change_within_session"]"#),
    ]);
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "t", &[], vec![], LoopGuards::default())
            .await;
    let inputs = [ASK, "carry on", "change it", "and?", "pivot", "hmm"];
    for (i, text) in inputs.iter().enumerate() {
        assert_eq!(answered(submit(&h, "t", text).await), format!("answer {}", i + 1));
    }
    let t = h.timeline(&Caller::Operator, "t").await.unwrap();
    assert_eq!(t.transitions.len(), 6);
    assert_eq!(t.transitions[0].mode, TransitionMode::Initialize, "no phase yet: initialize");
    for tr in &t.transitions {
        assert_eq!(tr.relation, Some(TaskRelation::Uncertain), "turn {}", tr.turn);
        assert!(
            tr.terms.skill.is_empty() && tr.terms.tool.is_empty() && tr.terms.memory.is_empty()
        );
        assert!(tr.error.is_some(), "turn {} keeps why", tr.turn);
    }
    for tr in &t.transitions[1..] {
        assert_eq!(tr.mode, TransitionMode::Keep, "turn {}", tr.turn);
    }
    assert!(t.transitions[0].error.as_deref().unwrap().contains("503"), "{:?}", t.transitions[0]);
    assert_eq!(t.transitions[0].attempts, Some(2), "one retry");
    assert!(t.transitions[2].error.as_deref().unwrap().contains("is an object"));
    assert!(t.transitions[4].error.as_deref().unwrap().contains("`pivot` is none of"));
    assert!(t.transitions[5].error.as_deref().unwrap().contains("not an object"));
    assert_eq!(t.phase_goal.as_deref(), Some(ASK), "no model rewrote the goal");
    // Every input is in the history, once, whatever the call did.
    let users: Vec<&str> = t
        .messages
        .iter()
        .filter(|m| m.role == "user")
        .map(|m| m.body["content"].as_str().unwrap())
        .collect();
    assert_eq!(users, inputs);
    assert_eq!(model.understanding_requests().len(), 8);
}

/// What real models answer in JSON mode, or when they ignore the schema, is read: the object
/// in a code fence or a sentence, one string for a list of terms, lists left out, the relation
/// written in words, fields of their own (ignored — a model cannot rewrite the goal this way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_in_the_shapes_real_models_answer_are_read() {
    let model =
        MockModel::start((1..=3).map(|i| Reply::text(&format!("answer {i}"))).collect()).await;
    model.push_understanding(vec![
        Reply::completion(
            "```json\n{\"task_relation\": \"establish_task\", \"skill_recall_terms\": \"release checklist\"}\n```",
        ),
        Reply::completion(
            "Sure. {\"task_relation\": \"Continue current\", \"memory_recall_terms\": [\"changelog\"], \"confidence\": 0.9} Done.",
        ),
        Reply::completion(
            r#"{"task_relation":"change-within-session","tool_recall_terms":["docx"],"phase_goal":"something else"}"#,
        ),
    ]);
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "t", &[], vec![], LoopGuards::default())
            .await;
    for (i, text) in [ASK, MORE, SWITCH].iter().enumerate() {
        assert_eq!(answered(submit(&h, "t", text).await), format!("answer {}", i + 1));
    }
    let t = h.timeline(&Caller::Operator, "t").await.unwrap();
    use TaskRelation::*;
    use TransitionMode::*;
    assert_eq!(
        relations(&t),
        [
            (Some(EstablishTask), Initialize),
            (Some(ContinueCurrent), Keep),
            (Some(ChangeWithinSession), Reconcile),
        ]
    );
    assert!(t.transitions.iter().all(|t| t.error.is_none()), "{:?}", t.transitions);
    assert_eq!(t.transitions[0].terms.skill, ["release checklist"]);
    assert!(t.transitions[0].terms.tool.is_empty() && t.transitions[0].terms.memory.is_empty());
    assert_eq!(t.transitions[1].terms.memory, ["changelog"]);
    assert_eq!(t.transitions[2].terms.tool, ["docx"]);
    assert_eq!(t.phase_goal.as_deref(), Some(SWITCH), "the table set the goal, not the model");
    assert_eq!(model.understanding_requests().len(), 3, "none was asked for again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_understanding_no_call_is_made_and_the_first_input_sets_the_goals() {
    let model = MockModel::start(vec![Reply::text("one"), Reply::text("two")]).await;
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "x", &[], vec![], LoopGuards::default())
            .await;
    keel_tests::plain_session(&h, "p", &[], &model.url()).await;
    answered(submit(&h, "p", ASK).await);
    answered(submit(&h, "p", SWITCH).await);
    assert!(model.understanding_requests().is_empty());
    let t = h.timeline(&Caller::Operator, "p").await.unwrap();
    let rows: Vec<_> = t.transitions.iter().map(|t| (t.relation, t.mode)).collect();
    assert_eq!(rows, [(None, TransitionMode::Initialize), (None, TransitionMode::Keep)]);
    assert_eq!((t.session_goal.as_deref(), t.phase_goal.as_deref()), (Some(ASK), Some(ASK)));
    assert!(t.transitions[0].body_sha256.is_none());
    assert_eq!(
        h.understanding_evidence(&Caller::Operator, "p", None).await.unwrap_err().kind(),
        "not_found"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_during_the_call_cancels_it_and_the_turn_stops_with_its_input_kept() {
    let model = MockModel::start(vec![Reply::text("never sent")]).await;
    model.push_understanding(vec![Reply::Delay(
        std::time::Duration::from_secs(5),
        Box::new(Reply::understanding("establish_task", &[], &[], &[])),
    )]);
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "t", &[], vec![], LoopGuards::default())
            .await;
    let h2 = h.clone();
    let stopper = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        h2.interrupt(&Caller::Operator, "t").await.unwrap();
    });
    let started = std::time::Instant::now();
    assert_eq!(submit(&h, "t", ASK).await, Submitted::Ran(TurnOutcome::Interrupted));
    assert!(started.elapsed() < std::time::Duration::from_secs(4), "the call was cancelled");
    stopper.await.unwrap();
    let t = h.timeline(&Caller::Operator, "t").await.unwrap();
    assert_eq!(t.transitions.len(), 1);
    assert_eq!(t.transitions[0].relation, Some(TaskRelation::Uncertain));
    assert!(t.transitions[0].error.as_deref().unwrap().contains("interrupted"));
    assert_eq!(t.messages[0].body["content"], ASK, "the input is kept");
    assert!(model.requests().is_empty(), "no business request after the interrupt");
}

/// The understanding call's own wait is reported with its own setting, not the turn's
/// `--model-timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_understanding_call_past_its_wait_names_its_own_setting() {
    let model = MockModel::start(vec![Reply::text("answered anyway")]).await;
    let slow = || Box::new(Reply::understanding("new_task", &[], &[], &[]));
    model.push_understanding(vec![
        Reply::Delay(std::time::Duration::from_secs(2), slow()),
        Reply::Delay(std::time::Duration::from_secs(2), slow()),
    ]);
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "unused",
        &[],
        vec![],
        LoopGuards::default(),
    )
    .await;
    let mut config = keel::model::ModelConfig::new(&model.url(), "test-model");
    config.timeout_ms = 300;
    keel_tests::session_with_model(&h, "w", &[], config).await;
    assert_eq!(answered(submit(&h, "w", ASK).await), "answered anyway");
    let t = h.timeline(&Caller::Operator, "w").await.unwrap();
    let e = t.transitions[0].error.as_deref().unwrap();
    assert!(e.contains("[model.preprocess] timeout_ms"), "{e}");
    assert!(e.contains("task-understanding call"), "{e}");
    assert!(e.contains("300 ms"), "{e}");
}
