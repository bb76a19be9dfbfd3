//! Durable approvals (RELIABILITY D1, D2, D4, D5, D6), interruption closing open calls, disk
//! full (C3) — through the whole spine, against the scripted model server, with the
//! effect-counting guest making every execution visible.

use keel::ids::SessionId;
use keel::meta::SessionMeta;
use keel::views::Views;
use std::sync::{Arc, Barrier};

use keel::agent::{LoopGuards, TurnOutcome};
use keel::brain::Submitted;
use keel::failure::FailureKind;
use keel::sandbox::{Access, CancelToken, Grant};
use keel::session::{DecideError, Decision, RuntimeState, SessionEngine};
use keel_tests::mock_model::{MockModel, Reply, plan_responder};
use keel_tests::{harness_with_session, install_effects, log_lines, no_events};
use serde_json::{Value, json};

const TOOLS: &[&str] =
    &["effect_append", "effect_send", "effect_put", "effect_wipe", "effect_peek"];

struct Fixture {
    home: tempfile::TempDir,
    work: tempfile::TempDir,
    h: keel::harness::Harness,
    url: String,
}

impl Fixture {
    async fn new(url: &str, id: &str, guards: LoopGuards) -> Self {
        let home = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        let grants = vec![Grant::new(work.path(), "/work", Access::Rw).unwrap()];
        let h = harness_with_session(home.path(), url, id, TOOLS, grants, guards).await;
        install_effects(&h).await;
        Self { home, work, h, url: url.to_string() }
    }

    /// A new harness on the same home: what a restarted process sees.
    async fn restart(&mut self) {
        let h = harness_with_session(
            self.home.path(),
            &self.url,
            "unused",
            TOOLS,
            Vec::new(),
            LoopGuards { max_steps: 1000, ..LoopGuards::default() },
        )
        .await;
        self.h = h;
    }

    /// Creates session `id` with `tools`, `grants` and `policy`, its model calls not retried.
    async fn create(
        &self,
        id: &str,
        tools: Vec<String>,
        grants: Vec<Grant>,
        policy: keel::session::Policy,
    ) {
        let mut model = keel::model::ModelConfig::new(&self.url, "m");
        model.max_retries = 0;
        self.h
            .internals()
            .engine
            .create(keel::session::NewSession {
                pins: Default::default(),
                user: None,
                named_tools: true,
                owner: None,
                id: Some(id.into()),
                grants,
                net: Default::default(),
                tools,
                policy,
                budget: keel::sandbox::Budget::default(),
                model,
                system_prompt: "test".into(),
                guards: None,
                preprocess: None,
            })
            .await
            .unwrap();
    }

    fn lines(&self, name: &str) -> Vec<String> {
        log_lines(self.work.path(), name)
    }
}

async fn submit(h: &keel::harness::Harness, id: &str, text: &str) -> Submitted {
    h.internals()
        .brain
        .submit(&SessionId::from(id), text, &CancelToken::new(), &no_events())
        .await
        .unwrap()
}

async fn drain(h: &keel::harness::Harness, id: &str) -> Option<Submitted> {
    h.internals()
        .brain
        .drain(&SessionId::from(id), &CancelToken::new(), &no_events())
        .await
        .unwrap()
}

fn waiting_units(s: &Submitted) -> Vec<keel::ids::UnitId> {
    match s {
        Submitted::Ran(TurnOutcome::WaitingApproval(u)) => u.clone(),
        other => panic!("expected a wait for approval, got {other:?}"),
    }
}

/// Every assistant tool call in the history has exactly one result, right after it.
fn assert_paired(h: &keel::harness::Harness, id: &str) {
    let rt = tokio::runtime::Handle::current();
    let t = tokio::task::block_in_place(|| {
        rt.block_on(Views::of(h.internals().engine).timeline(&SessionId::from(id)))
    })
    .unwrap();
    let msgs: Vec<Value> = t.messages.into_iter().map(|m| m.body).collect();
    let mut i = 0;
    while i < msgs.len() {
        let calls = msgs[i]["tool_calls"].as_array().cloned().unwrap_or_default();
        for (k, c) in calls.iter().enumerate() {
            let r = &msgs[i + 1 + k];
            assert_eq!(r["role"], "tool", "a call without its result: {msgs:#?}");
            assert_eq!(r["tool_call_id"], c["id"]);
        }
        i += 1 + calls.len();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_runs_the_stored_call_exactly_once_and_the_turn_continues() {
    let model = MockModel::start_fn(plan_responder(vec!["effect_send".into()])).await;
    let f = Fixture::new(&model.url(), "ap1", LoopGuards::default()).await;
    let out = submit(&f.h, "ap1", "send the report t1").await;
    let units = waiting_units(&out);
    assert_eq!(units.len(), 1);
    let meta = SessionMeta::read(f.h.internals().engine, &SessionId::from("ap1")).await.unwrap();
    assert_eq!(meta.runtime.state, RuntimeState::WaitingApproval);
    assert!(meta.runtime.state_detail.unwrap().contains(units[0].as_str()));
    assert!(f.lines("sent.log").is_empty(), "nothing runs before the decision");
    // The unit shows exactly what would run.
    let pending = f.h.internals().engine.approvals(Some("ap1"), true).await.unwrap();
    assert_eq!(pending.len(), 1);
    let u = &pending[0];
    assert_eq!((u.tool.as_str(), u.effect.as_str()), ("effect_send", "external"));
    assert_eq!(u.input, r#"{"label":"t1-0"}"#);
    assert_eq!(u.input_digest, keel::sandbox::sha256_hex(u.input.as_bytes()));
    assert_eq!(u.component_digest, f.h.internals().tools.resolve("effect_send").unwrap().digest);
    assert_eq!(u.grants.len(), 1);
    assert!(u.result_id.starts_with("res-"));
    // A second runner finds nothing to do while the decision is pending.
    let again = drain(&f.h, "ap1").await.unwrap();
    assert_eq!(waiting_units(&again), units);
    assert!(f.lines("sent.log").is_empty());

    let decided =
        f.h.internals().brain.decide(&units[0], Decision::Approve, Some("ok".into()), None).await;
    assert_eq!(decided.unwrap().unwrap().status, keel::session::ApprovalStatus::Approved);
    let out = drain(&f.h, "ap1").await.unwrap();
    assert_eq!(out, Submitted::Ran(TurnOutcome::Answer("done t1".into())));
    assert_eq!(f.lines("sent.log"), vec!["t1-0"]);
    let unit = f.h.internals().engine.approval(&units[0]).await.unwrap().unwrap();
    assert_eq!(unit.status, keel::session::ApprovalStatus::Consumed);
    let t = Views::of(f.h.internals().engine).timeline(&SessionId::from("ap1")).await.unwrap();
    assert_eq!(t.state, RuntimeState::Idle);
    assert_eq!(t.tool_calls[0].entry.approval_id.as_deref(), Some(units[0].as_str()));
    assert_eq!(t.tool_calls[0].entry.status.as_str(), "done");
    assert_paired(&f.h, "ap1");
    // Used once: deciding it again is refused, and a resume runs nothing more.
    let again =
        f.h.internals().brain.decide(&units[0], Decision::Approve, None, None).await.unwrap();
    assert!(matches!(again, Err(DecideError::NotPending { .. })));
    assert_eq!(drain(&f.h, "ap1").await, Some(Submitted::Ran(TurnOutcome::Answer(String::new()))));
    assert_eq!(f.lines("sent.log"), vec!["t1-0"]);
}

/// The tool chain's approval gate takes only a proof SessionEngine made when it consumed the
/// unit, and that proof binds the tool, the component and the exact input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gate_takes_only_a_consumed_approval_bound_to_the_call() {
    use keel::tools::{CallRequest, ToolServiceError};
    let model = MockModel::start_fn(plan_responder(vec!["effect_send".into()])).await;
    let f = Fixture::new(&model.url(), "gate", LoopGuards::default()).await;
    let units = waiting_units(&submit(&f.h, "gate", "send the report g").await);
    f.h.internals().brain.decide(&units[0], Decision::Approve, None, None).await.unwrap().unwrap();
    drain(&f.h, "gate").await.unwrap();
    let call_id = f.h.internals().engine.approval(&units[0]).await.unwrap().unwrap().call_id;
    // No proof for a unit that this call did not consume, or another call.
    assert_eq!(
        f.h.internals()
            .engine
            .consumed_approval(&SessionId::from("gate"), &units[0], "other-call")
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        f.h.internals()
            .engine
            .consumed_approval(&SessionId::from("gate"), "ap-missing", &call_id)
            .await
            .unwrap(),
        None
    );
    let proof =
        f.h.internals()
            .engine
            .consumed_approval(&SessionId::from("gate"), &units[0], &call_id)
            .await
            .unwrap()
            .unwrap();
    assert_eq!((proof.unit(), proof.call_id()), (units[0].as_str(), call_id.as_str()));

    let meta = SessionMeta::read(f.h.internals().engine, &SessionId::from("gate")).await.unwrap();
    let call = |input: &'static str, approval| CallRequest {
        tool: "effect_send",
        input,
        grants: &meta.config.grants,
        net: keel::sandbox::net::NetGrants::none(),
        budget: meta.config.budget.clone(),
        cancel: None,
        loaded: Some(&meta.capabilities.loaded_tools),
        policy: Some(&meta.config.policy),
        approval,
        control: None,
    };
    let err = f.h.internals().tools.call(call(r#"{"label":"g-0"}"#, None)).await.unwrap_err();
    assert!(matches!(err, ToolServiceError::NeedsApproval { .. }), "{err}");
    let err =
        f.h.internals().tools.call(call(r#"{"label":"other"}"#, Some(&proof))).await.unwrap_err();
    assert!(matches!(err, ToolServiceError::ApprovalNotBound { .. }), "{err}");
    assert_eq!(err.kind(), "approval_not_bound");
    assert_eq!(f.lines("sent.log"), vec!["g-0"], "neither refused call ran");
    // The proof approves exactly what the person saw.
    let ok = f.h.internals().tools.call(call(r#"{"label":"g-0"}"#, Some(&proof))).await.unwrap();
    assert!(ok.report.result.is_ok());
    assert_eq!(f.lines("sent.log"), vec!["g-0", "g-0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_commits_a_result_the_model_sees() {
    let model = MockModel::start_fn(plan_responder(vec!["effect_wipe".into()])).await;
    let f = Fixture::new(&model.url(), "ap2", LoopGuards::default()).await;
    let units = waiting_units(&submit(&f.h, "ap2", "wipe it t2").await);
    let r =
        f.h.internals()
            .brain
            .decide(&units[0], Decision::Reject, Some("not today".into()), None)
            .await;
    assert_eq!(r.unwrap().unwrap().status, keel::session::ApprovalStatus::Rejected);
    let out = drain(&f.h, "ap2").await.unwrap();
    assert_eq!(out, Submitted::Ran(TurnOutcome::Answer("done t2".into())));
    assert!(f.lines("wiped.log").is_empty());
    let t = Views::of(f.h.internals().engine).timeline(&SessionId::from("ap2")).await.unwrap();
    let result: Value =
        serde_json::from_str(t.messages[2].body["content"].as_str().unwrap()).unwrap();
    assert_eq!(result["error"]["kind"], "rejected");
    assert!(result["error"]["message"].as_str().unwrap().contains("not today"));
    assert_paired(&f.h, "ap2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d1_d2_pending_and_approved_survive_a_restart() {
    let model =
        MockModel::start_fn(plan_responder(vec!["effect_send".into(), "effect_send".into()])).await;
    let mut f = Fixture::new(&model.url(), "ap3", LoopGuards::default()).await;
    let units = waiting_units(&submit(&f.h, "ap3", "two messages t3").await);
    // D1: the process goes away while the approval is pending; a new one starts.
    f.restart().await;
    let pending = f.h.internals().engine.approvals(Some("ap3"), true).await.unwrap();
    assert_eq!(pending.iter().map(|u| u.id.clone()).collect::<Vec<_>>(), units, "same id");
    assert_eq!(
        SessionMeta::read(f.h.internals().engine, &SessionId::from("ap3"))
            .await
            .unwrap()
            .runtime
            .state,
        RuntimeState::WaitingApproval
    );
    assert!(f.lines("sent.log").is_empty(), "nothing executed");
    // D2: approved, then the process goes away before the call ran.
    f.h.internals().brain.decide(&units[0], Decision::Approve, None, None).await.unwrap().unwrap();
    f.restart().await;
    assert!(
        f.h.recovered(&keel::api::Caller::Operator)
            .unwrap()
            .iter()
            .any(|r| r.id == "ap3" && r.resumable)
    );
    // Resuming runs it exactly once; the second call asks again.
    let second = waiting_units(&drain(&f.h, "ap3").await.unwrap());
    assert_ne!(second, units);
    assert_eq!(f.lines("sent.log"), vec!["t3-0"]);
    f.restart().await;
    f.h.internals().brain.decide(&second[0], Decision::Approve, None, None).await.unwrap().unwrap();
    let out = drain(&f.h, "ap3").await.unwrap();
    assert_eq!(out, Submitted::Ran(TurnOutcome::Answer("done t3".into())));
    assert_eq!(f.lines("sent.log"), vec!["t3-0", "t3-1"]);
    assert_paired(&f.h, "ap3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d5_new_call_ids_and_upgraded_tools_need_a_new_approval() {
    // The model asks for the very same call twice: the second time under a new id.
    let args = r#"{"label":"same"}"#;
    let model = MockModel::start(vec![
        Reply::calls(&[("first-id", "effect_send", args)]),
        Reply::calls(&[("second-id", "effect_send", args)]),
        Reply::text("sent"),
    ])
    .await;
    let f = Fixture::new(&model.url(), "ap4", LoopGuards::default()).await;
    let first = waiting_units(&submit(&f.h, "ap4", "send it").await);
    // Approved, but the turn is interrupted before it resumes: the approval dies with it.
    f.h.internals().brain.decide(&first[0], Decision::Approve, None, None).await.unwrap().unwrap();
    f.h.internals().brain.interrupt(&SessionId::from("ap4")).await.unwrap();
    assert_eq!(
        f.h.internals().engine.approval(&first[0]).await.unwrap().unwrap().status,
        keel::session::ApprovalStatus::Cancelled
    );
    assert_paired(&f.h, "ap4");
    // "The same" call with a new id is not covered.
    let second = waiting_units(&submit(&f.h, "ap4", "send it again").await);
    assert_ne!(second, first);
    assert!(f.lines("sent.log").is_empty());
    // Approved, then the tool is upgraded (a new component digest) before the call runs.
    f.h.internals().brain.decide(&second[0], Decision::Approve, None, None).await.unwrap().unwrap();
    let mut bytes = std::fs::read(keel_tests::guests::EFFECTS_COMPONENT).unwrap();
    // A custom section changes the digest, not the behaviour.
    bytes.extend_from_slice(&[0, 8, 7]);
    bytes.extend_from_slice(b"upgrade");
    let report =
        f.h.internals()
            .tools
            .install_as(&bytes, "effects", "test", keel::tools::InstallMode::Upgrade)
            .await
            .unwrap();
    assert!(report.replaced.is_some());
    let third = waiting_units(&drain(&f.h, "ap4").await.unwrap());
    assert_ne!(third, second);
    assert_eq!(
        f.h.internals().engine.approval(&second[0]).await.unwrap().unwrap().status,
        keel::session::ApprovalStatus::Invalidated
    );
    let unit = f.h.internals().engine.approval(&third[0]).await.unwrap().unwrap();
    assert_eq!(unit.component_digest, report.component.digest);
    assert!(f.lines("sent.log").is_empty(), "an invalidated approval runs nothing");
    f.h.internals().brain.decide(&third[0], Decision::Approve, None, None).await.unwrap().unwrap();
    assert!(matches!(drain(&f.h, "ap4").await, Some(Submitted::Ran(TurnOutcome::Answer(_)))));
    assert_eq!(f.lines("sent.log"), vec!["same"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d6_decisions_on_missing_or_settled_units_change_nothing() {
    let model = MockModel::start_fn(plan_responder(vec!["effect_send".into()])).await;
    let f = Fixture::new(&model.url(), "ap5", LoopGuards::default()).await;
    let units = waiting_units(&submit(&f.h, "ap5", "go t5").await);
    let before = f.h.internals().engine.approvals(None, false).await.unwrap();
    let missing =
        f.h.internals().brain.decide("ap-nope", Decision::Approve, None, None).await.unwrap();
    assert_eq!(missing, Err(DecideError::NotFound { unit: "ap-nope".into() }));
    let wrong =
        f.h.internals()
            .brain
            .decide(&units[0], Decision::Approve, None, Some("other".into()))
            .await
            .unwrap();
    assert!(matches!(wrong, Err(DecideError::WrongSession { .. })));
    assert!(wrong.unwrap_err().to_string().contains("belongs to session `ap5`"));
    assert_eq!(
        f.h.internals().engine.approvals(None, false).await.unwrap(),
        before,
        "nothing changed"
    );
    f.h.internals().brain.decide(&units[0], Decision::Reject, None, None).await.unwrap().unwrap();
    let late =
        f.h.internals().brain.decide(&units[0], Decision::Approve, None, None).await.unwrap();
    assert_eq!(
        late.unwrap_err().to_string(),
        format!("approval `{}` is not pending: it is rejected", units[0])
    );
    assert_eq!(
        f.h.internals().engine.approval(&units[0]).await.unwrap().unwrap().status,
        keel::session::ApprovalStatus::Rejected
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d4_sixteen_concurrent_deciders_one_wins_every_time() {
    const ROUNDS: usize = 100;
    const DECIDERS: usize = 16;
    let plan = vec!["effect_send".to_string(); ROUNDS];
    let model = MockModel::start_fn(plan_responder(plan)).await;
    let guards = LoopGuards { max_steps: 1000, ..LoopGuards::default() };
    let f = Fixture::new(&model.url(), "race", guards).await;
    let path = f.home.path().join("keel.db");
    // Each decider has its own connection and writer, as separate processes would.
    let deciders: Vec<SessionEngine> = (0..DECIDERS)
        .map(|_| SessionEngine::new(keel_tests::db_of(&path), keel::harness::REACTIONS))
        .collect();
    let mut out = submit(&f.h, "race", "race r").await;
    let mut winners_per_round = Vec::new();
    for round in 0..ROUNDS {
        let unit = waiting_units(&out)[0].clone();
        let barrier = Arc::new(Barrier::new(DECIDERS));
        let rt = tokio::runtime::Handle::current();
        let handles: Vec<_> = deciders
            .iter()
            .enumerate()
            .map(|(k, engine)| {
                let (engine, unit, barrier, rt) =
                    (engine.clone(), unit.clone(), barrier.clone(), rt.clone());
                std::thread::spawn(move || {
                    let decision = if k % 2 == 0 { Decision::Approve } else { Decision::Reject };
                    barrier.wait();
                    rt.block_on(engine.decide(&unit, decision, Some(format!("decider {k}")), None))
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        let winners: Vec<_> = results.iter().filter(|r| r.is_ok()).collect();
        winners_per_round.push(winners.len());
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let stored = f.h.internals().engine.approval(&unit).await.unwrap().unwrap();
        let winner = winners[0].as_ref().unwrap();
        assert_eq!(
            stored.decision_reason, winner.decision_reason,
            "the winner's decision is the one stored"
        );
        out = drain(&f.h, "race").await.unwrap();
    }
    assert_eq!(out, Submitted::Ran(TurnOutcome::Answer("done r".into())));
    assert!(winners_per_round.iter().all(|w| *w == 1));
    let approved = f.h.internals().engine.approvals(Some("race"), false).await.unwrap();
    let consumed =
        approved.iter().filter(|u| u.status == keel::session::ApprovalStatus::Consumed).count();
    assert_eq!(f.lines("sent.log").len(), consumed, "every approved call ran exactly once");
    println!(
        "D4: {ROUNDS} rounds × {DECIDERS} deciders: exactly one winner every round ({consumed} approved, {} rejected)",
        ROUNDS - consumed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupt_while_waiting_closes_every_open_call() {
    // Three calls in one response: a read, an approval-gated send, a write.
    let model = MockModel::start(vec![
        Reply::calls(&[
            ("r1", "effect_peek", r#"{"label":"p"}"#),
            ("s1", "effect_send", r#"{"label":"s"}"#),
            ("w1", "effect_append", r#"{"label":"w"}"#),
        ]),
        Reply::text("continuing cleanly"),
    ])
    .await;
    let f = Fixture::new(&model.url(), "ap6", LoopGuards::default()).await;
    let units = waiting_units(&submit(&f.h, "ap6", "mixed").await);
    assert_eq!(units.len(), 1);
    assert_eq!(
        f.h.internals().brain.interrupt(&SessionId::from("ap6")).await.unwrap(),
        RuntimeState::WaitingApproval
    );
    let t = Views::of(f.h.internals().engine).timeline(&SessionId::from("ap6")).await.unwrap();
    assert_eq!(t.state, RuntimeState::Interrupted);
    assert_paired(&f.h, "ap6");
    let kinds: Vec<_> = t.tool_calls.iter().map(|c| c.entry.error_kind).collect();
    assert_eq!(kinds, vec![None, Some(FailureKind::Interrupted), Some(FailureKind::Interrupted)]);
    assert!(f.lines("sent.log").is_empty() && f.lines("effects.log").is_empty());
    assert_eq!(
        f.h.internals().engine.approval(&units[0]).await.unwrap().unwrap().status,
        keel::session::ApprovalStatus::Cancelled
    );
    // The next input continues from a well-formed history.
    let out = submit(&f.h, "ap6", "go on").await;
    assert_eq!(out, Submitted::Ran(TurnOutcome::Answer("continuing cleanly".into())));
    // (The instructions and the notes as one system message.)
    let last = keel_tests::request_messages(model.requests().last().unwrap());
    let roles: Vec<_> = last.iter().map(|m| m["role"].clone()).collect();
    assert_eq!(
        roles,
        vec![
            json!("system"),
            json!("user"),
            json!("assistant"),
            json!("tool"),
            json!("tool"),
            json!("tool"),
            json!("user")
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_ask_allow_and_deny_per_session() {
    let model = MockModel::start_fn(plan_responder(vec![
        "effect_wipe".into(),
        "effect_append".into(),
        "effect_send".into(),
    ]))
    .await;
    let f = Fixture::new(&model.url(), "unused", LoopGuards::default()).await;
    let mut policy = keel::session::Policy::default();
    // Allow the destructive tool by name, ask before the write, deny external.
    policy.adjust(&["effect_wipe".into()], &["effect_append".into()], &["external".into()]);
    let grants = vec![Grant::new(f.work.path(), "/work", Access::Rw).unwrap()];
    f.create("pol", TOOLS.iter().map(|t| t.to_string()).collect(), grants, policy).await;
    let units = waiting_units(&submit(&f.h, "pol", "policy t7").await);
    assert_eq!(f.lines("wiped.log"), vec!["t7-0"], "allowed by name, no question");
    let u = f.h.internals().engine.approval(&units[0]).await.unwrap().unwrap();
    assert_eq!(u.tool, "effect_append");
    assert!(u.why.contains("asks before every call of `effect_append`"));
    f.h.internals().brain.decide(&units[0], Decision::Approve, None, None).await.unwrap().unwrap();
    let out = drain(&f.h, "pol").await.unwrap();
    assert_eq!(out, Submitted::Ran(TurnOutcome::Answer("done t7".into())));
    assert_eq!(f.lines("effects.log"), vec!["t7-1"]);
    let t = Views::of(f.h.internals().engine).timeline(&SessionId::from("pol")).await.unwrap();
    assert_eq!(t.tool_calls[2].entry.error_kind.map(|k| k.as_str()), Some("policy_denied"));
    assert!(f.lines("sent.log").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c3_disk_full_rolls_back_pauses_and_resumes() {
    if keel_tests::on_postgres("c3 disk full") {
        return;
    }
    let big = "x".repeat(400_000);
    let model = MockModel::start(vec![Reply::text(&big), Reply::text(&big)]).await;
    let f = Fixture::new(&model.url(), "full", LoopGuards::default()).await;
    let pages: i64 =
        f.h.internals()
            .db
            .run(|c| Ok(c.query_row("PRAGMA page_count", [], |r| r.get(0))?))
            .await
            .unwrap();
    // The database may grow by a few pages only: the answer cannot be stored.
    f.h.internals()
        .db
        .run(move |c| {
            c.query_row(&format!("PRAGMA max_page_count = {}", pages + 8), [], |_| Ok(()))?;
            Ok(())
        })
        .await
        .unwrap();
    let err =
        f.h.internals()
            .brain
            .submit(&SessionId::from("full"), "write a lot", &CancelToken::new(), &no_events())
            .await;
    let message = err.unwrap_err().to_string();
    assert!(message.contains("full"), "a typed, clear error: {message}");
    // Rolled back: no half step, the input is kept, the database is sound.
    let t = Views::of(f.h.internals().engine).timeline(&SessionId::from("full")).await.unwrap();
    assert_eq!(t.messages.len(), 1, "only the input: {:?}", t.messages);
    let ok: String =
        f.h.internals()
            .db
            .read(|c| Ok(c.query_row("PRAGMA integrity_check", [], |r| r.get(0))?))
            .await
            .unwrap();
    assert_eq!(ok, "ok");
    // Space again: the session resumes where it stopped.
    f.h.internals()
        .db
        .run(|c| {
            c.query_row("PRAGMA max_page_count = 1073741823", [], |_| Ok(()))?;
            Ok(())
        })
        .await
        .unwrap();
    let out = drain(&f.h, "full").await.unwrap();
    assert_eq!(out, Submitted::Ran(TurnOutcome::Answer(big)));
    assert_eq!(
        SessionMeta::read(f.h.internals().engine, &SessionId::from("full"))
            .await
            .unwrap()
            .runtime
            .state,
        RuntimeState::Idle
    );
}

/// "Always allow" a tool under the directory of a call a person approved: the policy change
/// is an event with who made it; later calls under that directory run without asking, one
/// outside it still asks, and asking again undoes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_allow_under_a_directory_is_a_recorded_policy_change_and_undone_by_ask() {
    use keel::api::Caller;
    use keel::policy::PolicyChange;
    let write = |id: &str, path: &str| {
        (
            id.to_string(),
            "fs_write_file".to_string(),
            json!({"path": path, "content": id}).to_string(),
        )
    };
    let calls = [write("c1", "/out/a.md"), write("c2", "/out/sub/b.md"), write("c3", "/work/c.md")];
    let model = MockModel::start(vec![
        Reply::calls(&[(&calls[0].0, &calls[0].1, &calls[0].2)]),
        Reply::calls(&[(&calls[1].0, &calls[1].1, &calls[1].2)]),
        Reply::calls(&[(&calls[2].0, &calls[2].1, &calls[2].2)]),
        Reply::text("written"),
    ])
    .await;
    let f = Fixture::new(&model.url(), "unused", LoopGuards::default()).await;
    let out = tempfile::tempdir().unwrap();
    std::fs::create_dir(out.path().join("sub")).unwrap();
    let mut policy = keel::session::Policy::default();
    policy.adjust(&[], &["fs_write_file".into()], &[]);
    let grants = vec![
        Grant::new(f.work.path(), "/work", Access::Rw).unwrap(),
        Grant::new(out.path(), "/out", Access::Rw).unwrap(),
    ];
    f.create("always", vec!["fs_write_file".into()], grants, policy).await;
    let units = waiting_units(&submit(&f.h, "always", "write three files").await);
    let u = f.h.internals().engine.approval(&units[0]).await.unwrap().unwrap();
    let dir = keel::policy::call_directory(&u.input).unwrap();
    assert_eq!(dir, "/out");
    let change = PolicyChange::Allow { tool: u.tool.clone(), under: Some(dir) };
    let policy = f.h.change_policy(&Caller::Operator, "always", change).await.unwrap();
    assert!(policy.summary().contains("allow fs_write_file under /out"), "{}", policy.summary());
    f.h.internals().brain.decide(&units[0], Decision::Approve, None, None).await.unwrap().unwrap();
    // The second write, under /out, runs unasked; the third, under /work, asks.
    let units = waiting_units(&drain(&f.h, "always").await.unwrap());
    assert_eq!(std::fs::read_to_string(out.path().join("sub/b.md")).unwrap(), "c2");
    let u = f.h.internals().engine.approval(&units[0]).await.unwrap().unwrap();
    assert_eq!(u.input, calls[2].2);
    f.h.internals().brain.decide(&units[0], Decision::Approve, None, None).await.unwrap().unwrap();
    let done = drain(&f.h, "always").await.unwrap();
    assert_eq!(done, Submitted::Ran(TurnOutcome::Answer("written".into())));
    let t = Views::of(f.h.internals().engine).timeline(&SessionId::from("always")).await.unwrap();
    let approved: Vec<bool> = t.tool_calls.iter().map(|c| c.entry.approval_id.is_some()).collect();
    assert_eq!(approved, [true, false, true], "asked, allowed for good, asked");
    // The change is an event with who made it; asking again undoes it.
    let policy =
        f.h.change_policy(
            &Caller::Operator,
            "always",
            PolicyChange::Ask { tool: "fs_write_file".into() },
        )
        .await
        .unwrap();
    assert!(policy.allow_under.is_empty());
    let events = f.h.events(&Caller::Operator, "always", 0, 1000).await.unwrap();
    let changes: Vec<String> = events
        .into_iter()
        .filter_map(|e| match e.event {
            keel::session::SessionEvent::PolicyChanged { change, by, .. } => {
                Some(format!("{change} by {by}"))
            }
            _ => None,
        })
        .collect();
    let by = keel::session::local_decider();
    assert_eq!(
        changes,
        [
            format!("allow fs_write_file under /out by {by}"),
            format!("ask before fs_write_file by {by}")
        ]
    );
}
