//! Workgroups: a main session delegates to sub-sessions over durable events, against the
//! scripted model server routing replies per session (by each session's first input).

use keel::ids::SessionId;
use keel::meta::SessionMeta;
use keel::preparation::Preparation;
use std::time::Duration;

use keel::api::Caller;
use keel::api::SessionSpec;
use keel::brain::Submitted;
use keel::harness::Harness;
use keel::sandbox::{Access, CancelToken, Grant};
use keel::session::{Decision, RuntimeState};
use keel::workgroup::{Delegation, Kind, Limits};
use keel_tests::mock_model::{MockModel, spawn_task, workgroup_responder};
use keel_tests::{install_effects, log_lines, no_events};

async fn harness(dir: &std::path::Path) -> Harness {
    let home = keel::home::Home::at(dir).unwrap();
    Harness::open(home, keel_tests::test_limits(), None, Default::default(), &|_| {}).await.unwrap()
}

fn main_spec(url: &str, grants: Vec<Grant>, limits: Limits) -> SessionSpec {
    let mut spec = keel_tests::session_spec(url, "main", grants, None);
    spec.main = Some(limits);
    spec.guards.max_steps = 8;
    spec
}

async fn run(h: &Harness, id: &str, task: &str) -> Submitted {
    h.send(&Caller::Operator, id, task, &CancelToken::new(), &no_events()).await.unwrap()
}

fn answer(s: &Submitted) -> String {
    match s {
        Submitted::Ran(keel::agent::TurnOutcome::Answer(a)) => a.clone(),
        other => panic!("expected an answer, got {other:?}"),
    }
}

/// Every event of the workgroup was delivered once and taken from its inbox once: one inbox
/// row per event, consumed, and one history message per event in its receiver.
fn assert_delivered_once(home: &std::path::Path, main: &str) {
    let c = keel_tests::store_of(&home.join("keel.db"));
    let rows: Vec<(String, String, i64, Option<i64>)> = c
        .prepare(
            "SELECT e.id, e.to_session, COUNT(i.seq), MIN(i.consumed_at) FROM workgroup_events e
             LEFT JOIN inbox i ON i.event_id = e.id WHERE e.main_id=?1 GROUP BY e.id",
        )
        .unwrap()
        .query_map([main], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(!rows.is_empty());
    for (id, to, n, consumed) in rows {
        assert_eq!(n, 1, "event {id} is in {n} inbox rows");
        let state: String =
            c.query_row("SELECT state FROM sessions WHERE id=?1", [&to], |r| r.get(0)).unwrap();
        if state != "interrupted" {
            assert!(consumed.is_some(), "event {id} to {to} was never taken");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_children_run_concurrently_and_their_results_wake_the_parent() {
    let script = workgroup_responder(Duration::from_millis(400));
    let model = MockModel::start_fn(script.responder.clone()).await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path()).await;
    let id = h
        .create_session(&Caller::Operator, main_spec(&model.url(), vec![], Limits::default()))
        .await
        .unwrap();
    let id = id.to_string();
    let meta = h.session(&Caller::Operator, &id).await.unwrap();
    assert!(meta.config.preprocess.is_none(), "a main session routes: no task understanding");
    assert!(meta.capabilities.loaded_tools.iter().any(|t| t == "session_spawn"));

    let task = spawn_task("MAIN", &[("count A", "CHILD A", &[]), ("count B", "CHILD B", &[])]);
    let out = run(&h, &id, &task).await;
    let text = answer(&out);
    assert!(text.starts_with("coordinator done: "), "{text}");
    assert!(text.contains("answer A") && text.contains("answer B"), "{text}");

    // The two children ran at once: the second's first request came before the first's
    // (delayed) answer could have been sent.
    let arrivals = script.arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 2, "{arrivals:?}");
    let gap = arrivals[1].1.duration_since(arrivals[0].1);
    assert!(gap < Duration::from_millis(400), "children ran one after the other ({gap:?})");

    let w = h.workgroup(&Caller::Operator, &id).await.unwrap();
    assert_eq!(w.members.len(), 3);
    for child in &w.members[1..] {
        assert_eq!(child.parent.as_deref(), Some(id.as_str()));
        assert_eq!(child.depth, 1);
        assert_eq!(child.delegation, Some(Delegation::Done));
        assert_eq!(child.terminal, Some(Kind::Result));
        assert_eq!(child.state, RuntimeState::Idle);
        // Each child understood its own task: the understanding call saw its request only.
        let t = Preparation::of(h.internals().engine)
            .transitions(&SessionId::from(&child.session_id))
            .await
            .unwrap();
        assert_eq!(t.len(), 1);
        // A child of depth 1 with depth limit 2 may delegate further.
        let m = h.session(&Caller::Operator, &child.session_id).await.unwrap();
        assert!(m.capabilities.loaded_tools.iter().any(|t| t == "session_spawn"));
        assert!(m.config.preprocess.is_some());
    }
    // Task understanding ran for each child on its own request, never for the main session.
    let understood: Vec<String> = model
        .understanding_requests()
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    assert_eq!(understood.len(), 2, "{understood:?}");
    assert!(understood.iter().any(|u| u.contains("CHILD A")));
    assert!(understood.iter().any(|u| u.contains("CHILD B")));
    assert!(!understood.iter().any(|u| u.contains("MAIN")));
    let events = h.workgroup_events(&Caller::Operator, &id).await.unwrap();
    let kinds: Vec<Kind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds.iter().filter(|k| **k == Kind::Request).count(), 2);
    assert_eq!(kinds.iter().filter(|k| **k == Kind::Result).count(), 2);
    assert_delivered_once(home.path(), &id);
    // Session events shadow each delivery in the sender's and the receiver's logs.
    let main_events = h.events(&Caller::Operator, &id, 0, 10_000).await.unwrap();
    let shadows = main_events
        .iter()
        .filter(|e| matches!(e.event, keel::session::SessionEvent::Workgroup { .. }))
        .count();
    assert_eq!(shadows, 4);

    // A session of a workgroup is not deleted: its results are in another session's history.
    for member in [id.as_str(), w.members[1].session_id.as_str()] {
        match h.delete_session(&Caller::Operator, member).await {
            Err(e) => {
                assert_eq!(e.kind(), "conflict", "{e}");
                assert!(e.to_string().contains(&format!("part of the workgroup of `{id}`")), "{e}");
            }
            Ok(()) => panic!("{member}, a session of a workgroup, was deleted"),
        }
        assert!(h.session(&Caller::Operator, member).await.is_ok());
    }
    assert_delivered_once(home.path(), &id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_asking_for_a_wider_grant_is_refused_and_nothing_is_created() {
    let script = workgroup_responder(Duration::ZERO);
    let model = MockModel::start_fn(script.responder).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("sub")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), work.path().join("escape")).unwrap();
    let h = harness(home.path()).await;
    let grants = vec![Grant::new(work.path(), "/work", Access::Ro).unwrap()];
    let id = h
        .create_session(&Caller::Operator, main_spec(&model.url(), grants, Limits::default()))
        .await
        .unwrap();
    let id = id.to_string();
    let task = spawn_task(
        "MAIN",
        &[
            ("write", "CHILD A", &["/work:rw"]),
            ("elsewhere", "CHILD B", &["/etc:ro"]),
            ("link", "CHILD C", &["/work/escape:ro"]),
            ("narrow", "CHILD D", &["/work/sub:ro"]),
        ],
    );
    let out = run(&h, &id, &task).await;
    // Only the narrowing spawn made a child; the coordinator waits for four, gets one.
    assert_eq!(answer(&out), "waiting");
    let w = h.workgroup(&Caller::Operator, &id).await.unwrap();
    assert_eq!(w.members.len(), 2, "{:?}", w.members);
    let child = &w.members[1];
    let m = h.session(&Caller::Operator, &child.session_id).await.unwrap();
    assert_eq!(m.config.grants.len(), 1);
    assert_eq!(m.config.grants[0].guest, "/work/sub");
    assert_eq!(m.config.grants[0].access, Access::Ro);
    assert_eq!(m.config.grants[0].host, work.path().join("sub").canonicalize().unwrap());
    let timeline = h.timeline(&Caller::Operator, &id).await.unwrap();
    let errors: Vec<String> = timeline
        .tool_calls
        .iter()
        .filter(|c| c.entry.error_kind.is_some())
        .map(|c| c.entry.result.clone().unwrap_or_default())
        .collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(errors[0].contains("read-only here"), "{}", errors[0]);
    assert!(errors[1].contains("inside none of them"), "{}", errors[1]);
    assert!(errors[2].contains("through a link"), "{}", errors[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_and_depth_limits_refuse_with_a_typed_error() {
    let script = workgroup_responder(Duration::ZERO);
    let model = MockModel::start_fn(script.responder).await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path()).await;
    // Fan-out: three spawns in one step (run in parallel) against a limit of two.
    let limits = Limits { max_live_children: 2, ..Limits::default() };
    let id = h
        .create_session(&Caller::Operator, main_spec(&model.url(), vec![], limits))
        .await
        .unwrap()
        .to_string();
    let task =
        spawn_task("MAIN", &[("a", "CHILD A", &[]), ("b", "CHILD B", &[]), ("c", "CHILD C", &[])]);
    run(&h, &id, &task).await;
    let w = h.workgroup(&Caller::Operator, &id).await.unwrap();
    assert_eq!(w.members.len(), 3, "two children, not three");
    let refused: Vec<String> = h
        .timeline(&Caller::Operator, &id)
        .await
        .unwrap()
        .tool_calls
        .iter()
        .filter(|c| c.entry.error_kind.is_some())
        .map(|c| c.entry.result.clone().unwrap_or_default())
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].contains("limit: 2 sub-sessions"), "{}", refused[0]);

    // Depth: main → coordinator child → worker grandchild; the grandchild (depth 2 = the
    // limit) has no delegation tools, and every result climbs back up.
    let id2 = {
        let mut spec = main_spec(&model.url(), vec![], Limits::default());
        spec.id = Some("main2".into());
        h.create_session(&Caller::Operator, spec).await.unwrap().to_string()
    };
    let inner = spawn_task("INNER", &[("leaf", "CHILD LEAF", &[])]);
    let task = spawn_task("MAIN", &[("inner", &inner, &[])]);
    let out = run(&h, &id2, &task).await;
    let text = answer(&out);
    assert!(text.contains("coordinator done: coordinator done: answer LEAF"), "{text}");
    let w = h.workgroup(&Caller::Operator, &id2).await.unwrap();
    assert_eq!(w.members.len(), 3);
    let leaf = w.members.iter().find(|m| m.depth == 2).unwrap();
    let m = h.session(&Caller::Operator, &leaf.session_id).await.unwrap();
    assert!(
        !m.capabilities.loaded_tools.iter().any(|t| t.starts_with("session_")),
        "{:?}",
        m.capabilities.loaded_tools
    );
    assert_delivered_once(home.path(), &id2);

    // A standalone session cannot be given the delegation tools.
    let mut spec = keel_tests::session_spec(&model.url(), "alone", vec![], None);
    spec.tools = Some(vec!["session_spawn".into()]);
    let e = h.create_session(&Caller::Operator, spec).await.unwrap_err();
    assert_eq!(e.kind(), "input");
    let alone = h
        .create_session(
            &Caller::Operator,
            keel_tests::session_spec(&model.url(), "alone", vec![], None),
        )
        .await
        .unwrap();
    let m = h.session(&Caller::Operator, alone.as_str()).await.unwrap();
    assert!(!m.capabilities.loaded_tools.iter().any(|t| t.starts_with("session_")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_waiting_for_approval_shows_in_the_workgroup_and_resumes_after_approve() {
    let script = workgroup_responder(Duration::ZERO);
    let model = MockModel::start_fn(script.responder).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let h = harness(home.path()).await;
    install_effects(&h).await;
    let grants = vec![Grant::new(work.path(), "/work", Access::Rw).unwrap()];
    let id = h
        .create_session(&Caller::Operator, main_spec(&model.url(), grants, Limits::default()))
        .await
        .unwrap();
    let id = id.to_string();
    let task = spawn_task("MAIN", &[("send", "CHILD S effect:effect_send", &[])]);
    let out = run(&h, &id, &task).await;
    // The child waits; its parent was told and ended its turn waiting.
    assert_eq!(answer(&out), "waiting");
    let w = h.workgroup(&Caller::Operator, &id).await.unwrap();
    let child = w.members[1].clone();
    assert_eq!(child.state, RuntimeState::WaitingApproval);
    assert_eq!(child.delegation, Some(Delegation::Live));
    assert_eq!(child.approvals.len(), 1);
    let units = h.approvals_below(&Caller::Operator, &id, true).await.unwrap();
    assert_eq!(units.len(), 1);
    assert_eq!(units[0].session_id, child.session_id);
    assert!(h.approvals(&Caller::Operator, Some(&id), true).await.unwrap().is_empty());
    let kinds: Vec<Kind> =
        h.workgroup_events(&Caller::Operator, &id).await.unwrap().iter().map(|e| e.kind).collect();
    assert_eq!(kinds, vec![Kind::Request, Kind::ApprovalNeeded]);
    assert!(log_lines(work.path(), "sent.log").is_empty());

    h.decide(&Caller::Operator, &units[0].id, Decision::Approve, None, None).await.unwrap();
    let resumed = h
        .resume(&Caller::Operator, &child.session_id, &CancelToken::new(), &no_events())
        .await
        .unwrap();
    assert!(resumed.is_some());
    assert_eq!(log_lines(work.path(), "sent.log"), vec!["S"]);
    let w = h.workgroup(&Caller::Operator, &id).await.unwrap();
    assert_eq!(w.members[1].terminal, Some(Kind::Result));
    assert_eq!(w.members[0].state, RuntimeState::Idle);
    let last = h.events(&Caller::Operator, &id, 0, 10_000).await.unwrap();
    let answers: Vec<String> = last
        .iter()
        .filter_map(|e| match &e.event {
            keel::session::SessionEvent::Answer { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(answers.last().unwrap(), "coordinator done: answer S");
    assert_delivered_once(home.path(), &id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupting_the_main_session_stops_every_live_child_with_its_closer() {
    let script = workgroup_responder(Duration::from_secs(30));
    let model = MockModel::start_fn(script.responder).await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path()).await;
    let id = h
        .create_session(&Caller::Operator, main_spec(&model.url(), vec![], Limits::default()))
        .await
        .unwrap();
    let id = id.to_string();
    let task = spawn_task("MAIN", &[("slow a", "CHILD A", &[]), ("slow b", "CHILD B", &[])]);
    let cancel = CancelToken::new();
    let run = {
        let (h, id, cancel) = (h.clone(), id.clone(), cancel.clone());
        tokio::spawn(
            async move { h.send(&Caller::Operator, &id, &task, &cancel, &no_events()).await },
        )
    };
    // Both children are mid-call (their model replies take 30 s).
    let waited = std::time::Instant::now();
    while script.arrivals.lock().unwrap().len() < 2 {
        assert!(waited.elapsed() < Duration::from_secs(20), "the children never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = std::time::Instant::now();
    h.interrupt(&Caller::Operator, &id).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(20), run).await.unwrap().unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10), "children were not stopped");
    let _ = out;
    let w = h.workgroup(&Caller::Operator, &id).await.unwrap();
    for child in &w.members[1..] {
        assert_eq!(child.terminal, Some(Kind::Interrupted), "{child:?}");
        assert_eq!(child.state, RuntimeState::Interrupted);
    }
    // The main session is interrupted; the children's events wait in its inbox for the user.
    assert_eq!(w.members[0].state, RuntimeState::Interrupted);
    let kinds: Vec<Kind> =
        h.workgroup_events(&Caller::Operator, &id).await.unwrap().iter().map(|e| e.kind).collect();
    assert_eq!(kinds.iter().filter(|k| **k == Kind::Interrupted).count(), 2, "{kinds:?}");
    assert_delivered_once(home.path(), &id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_past_its_deadline_ends_budget_exhausted_and_the_parent_answers() {
    let script = workgroup_responder(Duration::from_secs(30));
    let model = MockModel::start_fn(script.responder).await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path()).await;
    let limits = Limits { child_deadline_secs: 3, wait_notice_secs: 1, ..Limits::default() };
    let id = h
        .create_session(&Caller::Operator, main_spec(&model.url(), vec![], limits))
        .await
        .unwrap()
        .to_string();
    let task = spawn_task("MAIN", &[("slow", "CHILD SLOW", &[])]);
    let out = tokio::time::timeout(Duration::from_secs(20), run(&h, &id, &task)).await.unwrap();
    let text = answer(&out);
    assert!(text.starts_with("coordinator done: "), "{text}");
    let w = h.workgroup(&Caller::Operator, &id).await.unwrap();
    assert_eq!(w.members[1].terminal, Some(Kind::BudgetExhausted));
    assert!(w.members[1].text.as_deref().unwrap().contains("deadline of 3 s"));
    // Before the deadline the parent was told, each second, that the child still worked: a
    // wait that times out is not terminal.
    let kinds: Vec<Kind> =
        h.workgroup_events(&Caller::Operator, &id).await.unwrap().iter().map(|e| e.kind).collect();
    let notices = kinds.iter().filter(|k| **k == Kind::WaitTimeout).count();
    assert!((1..=3).contains(&notices), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| k.terminal()).count(), 1, "{kinds:?}");
    assert_delivered_once(home.path(), &id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_question_reaches_its_parent_and_the_answer_comes_back_as_its_next_input() {
    let script = workgroup_responder(Duration::ZERO);
    let model = MockModel::start_fn(script.responder).await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path()).await;
    let id = h
        .create_session(&Caller::Operator, main_spec(&model.url(), vec![], Limits::default()))
        .await
        .unwrap();
    let id = id.to_string();
    let task = spawn_task("MAIN", &[("asker", "CHILD Q ask", &[])]);
    let text = answer(&run(&h, &id, &task).await);
    assert_eq!(text, "coordinator done: answer Q: ANSWER 42");
    let kinds: Vec<Kind> =
        h.workgroup_events(&Caller::Operator, &id).await.unwrap().iter().map(|e| e.kind).collect();
    // The question left the request live (its turn ended "asked", which is not an answer).
    assert_eq!(kinds, vec![Kind::Request, Kind::Question, Kind::Request, Kind::Result]);
    let w = h.workgroup(&Caller::Operator, &id).await.unwrap();
    assert_eq!(w.members[1].question, None);
    assert_delivered_once(home.path(), &id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_workgroup_step_budget_stops_live_children_and_refuses_new_ones() {
    let script = workgroup_responder(Duration::from_secs(30));
    let model = MockModel::start_fn(script.responder).await;
    let home = tempfile::tempdir().unwrap();
    let h = harness(home.path()).await;
    // The main session's spawn step and its "waiting" answer spend the two steps.
    let limits = Limits { max_steps: Some(2), ..Limits::default() };
    let id = h
        .create_session(&Caller::Operator, main_spec(&model.url(), vec![], limits))
        .await
        .unwrap()
        .to_string();
    let task = spawn_task("MAIN", &[("slow", "CHILD SLOW", &[])]);
    let out = match tokio::time::timeout(Duration::from_secs(20), run(&h, &id, &task)).await {
        Ok(o) => o,
        Err(_) => {
            let w = h.workgroup(&Caller::Operator, &id).await.unwrap();
            let ev = h.workgroup_events(&Caller::Operator, &id).await.unwrap();
            let mut states = Vec::new();
            for m in &w.members {
                let meta = SessionMeta::read(h.internals().engine, &SessionId::from(&m.session_id))
                    .await
                    .unwrap();
                states.push((
                    m.session_id.clone(),
                    meta.runtime.state,
                    meta.runtime.state_detail.clone(),
                    meta.runtime.active_turn,
                    meta.runtime.steps,
                ));
            }
            panic!("DIAG members {:#?}\nevents {:#?}\nstates {:#?}", w.members, ev, states);
        }
    };
    assert!(answer(&out).starts_with("coordinator done: "));
    let w = h.workgroup(&Caller::Operator, &id).await.unwrap();
    assert_eq!(w.members[1].terminal, Some(Kind::BudgetExhausted));
    assert!(w.members[1].text.as_deref().unwrap().contains("model steps"), "{:?}", w.members[1]);

    // Spent: a further spawn is refused with the reason, as the model would read it.
    use keel::control::Delegation as _;
    let checks =
        keel::workgroup::SessionDelegation::new(h.internals().db.clone(), id.clone(), vec![]);
    let e = checks.check_spawn("more", "CHILD MORE", &[], &[]).unwrap_err();
    assert!(matches!(e, keel::control::ControlError::Denied(_)), "{e:?}");
    assert!(e.to_string().starts_with("budget: the workgroup used its 2 model steps"), "{e}");
}
