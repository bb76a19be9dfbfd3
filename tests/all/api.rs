//! The use-case API on `Harness`: a whole approval flow — create, send, wait, decide, resume —
//! with no CLI code, and the typed refusals a front-end maps to its own codes.

use keel::agent::{LoopGuards, TurnOutcome};
use keel::api::{ApiError, Caller};
use keel::brain::Submitted;
use keel::ids::SessionId;
use keel::meta::SessionMeta;
use keel::preparation::Preparation;
use keel::sandbox::{Access, CancelToken, Grant};
use keel::session::{Decision, RuntimeState};
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::{harness_with_session, install_effects, log_lines, no_events};

fn spec(url: &str, grants: Vec<Grant>, tools: Option<Vec<String>>) -> keel::api::SessionSpec {
    keel_tests::session_spec(url, "api", grants, tools)
}

/// A harness on a fresh home with the effects component installed, a model answering
/// `replies`, and a read-write grant of a fresh directory at `/work`.
struct Fixture {
    model: MockModel,
    _home: tempfile::TempDir,
    work: tempfile::TempDir,
    h: keel::harness::Harness,
    grants: Vec<Grant>,
}

async fn fixture(replies: Vec<Reply>) -> Fixture {
    let model = MockModel::start(replies).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "_", &[], vec![], LoopGuards::default())
            .await;
    install_effects(&h).await;
    let grants = vec![Grant::new(work.path(), "/work", Access::Rw).unwrap()];
    Fixture { model, _home: home, work, h, grants }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_flow_through_the_api_and_its_typed_refusals() {
    let Fixture { model, _home, work, h, grants } = fixture(vec![
        Reply::calls(&[("c1", "effect_send", r#"{"label":"hello"}"#)]),
        Reply::text("sent"),
    ])
    .await;

    // Refusals, each with its kind, and nothing created.
    let unknown = Some(vec!["no_such_tool".to_string()]);
    let e = h
        .create_session(&Caller::Operator, spec(&model.url(), grants.clone(), unknown))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "not_installed", "{e}");
    let overlapping = vec![
        Grant::new(work.path(), "/work", Access::Rw).unwrap(),
        Grant::new(work.path(), "/work/sub", Access::Ro).unwrap(),
    ];
    let e = h
        .create_session(&Caller::Operator, spec(&model.url(), overlapping, None))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "grant", "{e}");
    let e = h
        .create_session(&Caller::Operator, spec("ftp://nowhere", grants.clone(), None))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "config", "{e}");
    assert!(!h.internals().engine.exists(&SessionId::from("api")).await.unwrap());

    let tools = Some(vec!["effect_send".to_string()]);
    let id = h.create_session(&Caller::Operator, spec(&model.url(), grants, tools)).await.unwrap();
    let meta = SessionMeta::read(h.internals().engine, &id).await.unwrap();
    assert_eq!(meta.config.guards.map(|g| g.max_steps), Some(5), "the loop guards are stored");
    assert!(meta.capabilities.tool_pins.contains_key("effect_send"), "the loaded tool is pinned");
    let e =
        h.create_session(&Caller::Operator, spec(&model.url(), vec![], None)).await.unwrap_err();
    assert_eq!(e.kind(), "conflict", "the id is taken: {e}");

    let cancel = CancelToken::new();
    let e = h.send(&Caller::Operator, &id, "  ", &cancel, &no_events()).await.unwrap_err();
    assert!(matches!(e, ApiError::Input(_)), "{e}");
    let units =
        match h.send(&Caller::Operator, &id, "send hello", &cancel, &no_events()).await.unwrap() {
            Submitted::Ran(TurnOutcome::WaitingApproval(units)) => units,
            other => panic!("expected a wait for approval, got {other:?}"),
        };
    assert!(log_lines(work.path(), "sent.log").is_empty(), "nothing ran before the decision");
    let decided = h
        .decide(&Caller::Operator, &units[0], Decision::Approve, None, Some(id.to_string()))
        .await
        .unwrap();
    assert_eq!(decided.status, keel::session::ApprovalStatus::Approved);
    let e = h.decide(&Caller::Operator, &units[0], Decision::Reject, None, None).await.unwrap_err();
    assert_eq!(e.kind(), "not_pending", "exactly one decision wins: {e}");
    assert_eq!(
        h.resume(&Caller::Operator, &id, &cancel, &no_events()).await.unwrap(),
        Some(Submitted::Ran(TurnOutcome::Answer("sent".into())))
    );
    assert_eq!(log_lines(work.path(), "sent.log"), ["hello"]);
    assert_eq!(
        SessionMeta::read(h.internals().engine, &id).await.unwrap().runtime.state,
        RuntimeState::Idle
    );
}

/// Who may see and do what is decided by the core's use cases, for any front-end: a user
/// token's rules hold without the HTTP server in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_rights_are_decided_by_the_core() {
    use keel::access::{AccessError, GrantRoots, Principal, Role};
    use keel::api::{BudgetRequest, Caller, GrantRequest, PolicyRequest, SessionRequest};
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        "http://127.0.0.1:9/v1",
        "none",
        &[],
        vec![],
        LoopGuards::default(),
    )
    .await;
    let template = spec("http://127.0.0.1:9/v1", vec![], Some(vec![]));
    let roots = GrantRoots::new(&[ws.path().to_path_buf()]).unwrap();
    let grant = Grant::new(ws.path(), "/w", Access::Ro).unwrap();
    h.preset_add(&Caller::Operator, "team", vec![grant], false, false).await.unwrap();
    let alice = Caller::Api(Principal::token("alice", Role::User));
    let bob = Caller::Api(Principal::token("bob", Role::User));
    let admin = Caller::Api(Principal::token("root", Role::Admin));
    let forbidden = |r: Result<keel::api::SessionSpec, ApiError>| match r {
        Err(ApiError::Access(AccessError::Forbidden(m))) => m,
        other => panic!("expected a refusal, got {other:?}"),
    };

    // A user grants no host directory, lets nothing run unasked, lowers only.
    let dir = GrantRequest { host: ws.path().display().to_string(), guest: None, access: None };
    let req = SessionRequest { grants: vec![dir.clone()], ..Default::default() };
    let m = forbidden(h.session_spec_for(&alice, &template, &roots, req).await);
    assert!(m.contains("only admins grant host directories"), "{m}");
    let req = SessionRequest {
        policy: Some(PolicyRequest { allow: vec!["write".into()], ..Default::default() }),
        ..Default::default()
    };
    forbidden(h.session_spec_for(&alice, &template, &roots, req).await);
    let more = template.budget.fuel + 1;
    let req = SessionRequest {
        budget: Some(BudgetRequest { fuel: Some(more), ..Default::default() }),
        ..Default::default()
    };
    let m = forbidden(h.session_spec_for(&alice, &template, &roots, req).await);
    assert!(m.contains("a user may only lower the budget"), "{m}");
    let req = SessionRequest { user: Some("bob".into()), ..Default::default() };
    forbidden(h.session_spec_for(&alice, &template, &roots, req).await);
    // An admin may, under the grant roots.
    let req = SessionRequest { grants: vec![dir], ..Default::default() };
    let s = h.session_spec_for(&admin, &template, &roots, req).await.unwrap();
    assert_eq!(s.grants.len(), 1);

    // A user's session, made with a preset that does not let her decide.
    let req = SessionRequest { preset: Some("team".into()), ..Default::default() };
    let s = h.session_spec_for(&alice, &template, &roots, req).await.unwrap();
    assert_eq!(s.user.as_deref(), Some("alice"));
    let owner = s.owner.clone().unwrap();
    assert_eq!((owner.principal.as_str(), owner.preset.as_deref()), ("token:alice", Some("team")));
    let id = h.create_session(&Caller::Operator, s).await.unwrap();
    assert!(h.session(&alice, &id).await.is_ok());
    assert!(h.session(&admin, &id).await.is_ok());
    assert!(h.session(&Caller::Operator, &id).await.is_ok());
    match h.session(&bob, &id).await {
        Err(e) => assert_eq!(e.kind(), "not_found", "{e}"),
        Ok(_) => panic!("bob sees alice's session"),
    }
    let ids = |v: Vec<keel::views::SessionSummary>| -> Vec<String> {
        v.into_iter().map(|s| s.id.to_string()).collect()
    };
    assert_eq!(ids(h.sessions(&alice).await.unwrap()), [id.to_string()]);
    assert!(ids(h.sessions(&bob).await.unwrap()).is_empty());
    assert!(ids(h.sessions(&Caller::Operator).await.unwrap()).contains(&id.to_string()));

    // Every use case takes its caller and decides for itself: bob reads and steers nothing of
    // alice's session (it does not exist for him), alice reads hers.
    let cancel = CancelToken::new();
    let not_found = |r: Result<(), keel::api::ApiError>, what: &str| match r {
        Err(e) => assert_eq!(e.kind(), "not_found", "{what}: {e}"),
        Ok(()) => panic!("bob reached alice's session: {what}"),
    };
    not_found(h.timeline(&bob, &id).await.map(|_| ()), "timeline");
    not_found(h.events(&bob, &id, 0, 10).await.map(|_| ()), "events");
    not_found(h.model_calls(&bob, &id).await.map(|_| ()), "model calls");
    not_found(h.evidence(&bob, &id, None).await.map(|_| ()), "evidence");
    not_found(h.capabilities(&bob, &id).await.map(|_| ()), "capabilities");
    not_found(h.queue(&bob, &id, "do it").await.map(|_| ()), "queue");
    not_found(h.send(&bob, &id, "do it", &cancel, &no_events()).await.map(|_| ()), "send");
    not_found(h.interrupt(&bob, &id).await.map(|_| ()), "interrupt");
    not_found(h.approvals(&bob, Some(&id), false).await.map(|_| ()), "approvals");
    assert!(!h.session_exists(&bob, &id).await.unwrap());
    assert!(h.session_exists(&alice, &id).await.unwrap());
    assert!(h.timeline(&alice, &id).await.is_ok());

    // A session's model: its user may change the model and window, not the server (the
    // host's model credentials go wherever the URL points); an admin may.
    use keel::session::ModelChange;
    let named = |m: &str| ModelChange { model: Some(m.into()), ..Default::default() };
    let moved = |u: &str| ModelChange { base_url: Some(u.into()), ..Default::default() };
    not_found(h.set_session_model(&bob, &id, named("x")).await.map(|_| ()), "model");
    match h.set_session_model(&alice, &id, moved("http://127.0.0.1:10/v1")).await {
        Err(e) => assert_eq!(e.kind(), "forbidden", "{e}"),
        Ok(_) => panic!("a user moved her session to another model server"),
    }
    let (from, to) = h.set_session_model(&alice, &id, named("smaller")).await.unwrap();
    assert_ne!(from.model, "smaller");
    assert_eq!((to.model.as_str(), to.base_url.as_str()), ("smaller", from.base_url.as_str()));
    let (_, to) = h.set_session_model(&admin, &id, moved("http://127.0.0.1:10/v1/")).await.unwrap();
    assert_eq!(to.base_url, "http://127.0.0.1:10/v1");
    assert_eq!(h.session(&alice, &id).await.unwrap().config.model.model, "smaller");
    let changes: Vec<(String, String)> = h
        .events(&alice, &id, 0, 1000)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| match e.event {
            keel::session::SessionEvent::ModelChanged { to, by, .. } => Some((to.model, by)),
            _ => None,
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("smaller".to_string(), "api token alice".to_string()),
            ("smaller".into(), "api token root".into())
        ]
    );
    match h.set_session_model(&alice, &id, ModelChange::default()).await {
        Err(e) => {
            assert!(e.kind() == "input" && e.to_string().contains("nothing to change"), "{e}")
        }
        Ok(_) => panic!("an empty change was taken"),
    }
    match h.set_session_model(&admin, &id, moved("ftp://example.org/v1")).await {
        Err(e) => assert_eq!(e.kind(), "input", "{e}"),
        Ok(_) => panic!("an ftp URL was taken"),
    }
    // A session's policy: widened by an admin only, tightened by whoever may decide the
    // session's approvals — not alice here (her preset does not let her decide), nor bob.
    use keel::policy::PolicyChange;
    let allow = || PolicyChange::Allow { tool: "fs_write_file".into(), under: Some("/w".into()) };
    let ask = || PolicyChange::Ask { tool: "fs_write_file".into() };
    not_found(h.change_policy(&bob, &id, ask()).await.map(|_| ()), "policy");
    for change in [allow(), ask()] {
        match h.change_policy(&alice, &id, change).await {
            Err(e) => assert_eq!(e.kind(), "forbidden", "{e}"),
            Ok(_) => panic!("a user who may not decide changed the policy"),
        }
    }
    let p = h.change_policy(&admin, &id, allow()).await.unwrap();
    assert!(p.summary().contains("allow fs_write_file under /w"), "{}", p.summary());
    match h
        .change_policy(
            &admin,
            &id,
            PolicyChange::Allow { tool: "x".into(), under: Some("w/..".into()) },
        )
        .await
    {
        Err(e) => assert_eq!(e.kind(), "input", "{e}"),
        Ok(_) => panic!("a relative prefix was taken"),
    }
    // A user who may decide (her preset says so) may tighten, not widen.
    let grant = Grant::new(ws.path(), "/w", Access::Ro).unwrap();
    h.preset_add(&Caller::Operator, "decides", vec![grant], true, false).await.unwrap();
    let req = SessionRequest { preset: Some("decides".into()), ..Default::default() };
    let hers = h.create_session_for(&alice, &template, &roots, req).await.unwrap();
    let p = h.change_policy(&alice, &hers, ask()).await.unwrap();
    assert!(p.ask_tools.contains(&"fs_write_file".to_string()));
    match h.change_policy(&alice, &hers, allow()).await {
        Err(e) => {
            assert!(e.kind() == "forbidden" && e.to_string().contains("needs an admin"), "{e}")
        }
        Ok(_) => panic!("a user widened a policy"),
    }
    // Admin-only use cases refuse a user whatever the front-end.
    let admin_only = |r: Result<(), keel::api::ApiError>, what: &str| match r {
        Err(e) => assert_eq!(e.kind(), "forbidden", "{what}: {e}"),
        Ok(()) => panic!("a user token did what needs an admin: {what}"),
    };
    admin_only(h.create_session(&alice, template.clone()).await.map(|_| ()), "full spec");
    admin_only(h.remove_tool(&alice, "effect_send").map(|_| ()), "remove tool");
    admin_only(h.token_add(&alice, "eve", keel::access::Role::Admin).await.map(|_| ()), "token");
    admin_only(h.memories(&alice, None).await.map(|_| ()), "memories");
    admin_only(h.upgrade_session_tools(&alice, &id).await.map(|_| ()), "upgrade tools");
    // A user creates a session through the checked request, and owns it.
    let req = SessionRequest { preset: Some("team".into()), ..Default::default() };
    let mine = h.create_session_for(&alice, &template, &roots, req).await.unwrap();
    assert!(h.session(&alice, &mine).await.is_ok());
    not_found(h.session(&bob, &mine).await.map(|_| ()), "bob sees alice's new session");
}

/// SessionMeta is its four sub-owners, each read alone equal to its part of the whole, and
/// its JSON is one flat object as before the split.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_facts_are_four_sub_owners_read_alone_and_shown_flat() {
    let Fixture { model, _home, work: _work, h, grants } =
        fixture(vec![Reply::calls(&[("c1", "effect_send", r#"{"label":"x"}"#)])]).await;
    let tools = Some(vec!["effect_send".to_string()]);
    let id = h.create_session(&Caller::Operator, spec(&model.url(), grants, tools)).await.unwrap();
    let cancel = CancelToken::new();
    let sent = h.send(&Caller::Operator, &id, "send x", &cancel, &no_events()).await.unwrap();
    assert!(matches!(sent, Submitted::Ran(TurnOutcome::WaitingApproval(_))), "{sent:?}");

    let engine = &h.internals().engine;
    let meta = SessionMeta::read(engine, &id).await.unwrap();
    let preparation = Preparation::of(engine);
    assert_eq!(engine.config(&id).await.unwrap(), meta.config);
    assert_eq!(preparation.task(&id).await.unwrap(), meta.task);
    assert_eq!(preparation.loaded(&id).await.unwrap(), meta.capabilities);
    assert_eq!(engine.runtime(&id).await.unwrap(), meta.runtime);
    assert_eq!(meta.runtime.state, RuntimeState::WaitingApproval);
    assert_eq!(meta.runtime.active_turn, Some(1));
    assert_eq!(meta.config.grants[0].guest, "/work");
    assert!(meta.capabilities.loaded_tools.contains(&"effect_send".to_string()));
    assert_eq!(meta.task.session_goal.as_deref(), Some("send x"));

    let shown = serde_json::to_value(&meta).unwrap();
    for key in ["id", "grants", "policy", "model", "session_goal", "plan", "loaded_tools"] {
        assert!(shown.get(key).is_some(), "`{key}` is a top-level field: {shown}");
    }
    for key in ["tool_pins", "state", "active_turn", "meta_version", "context_start"] {
        assert!(shown.get(key).is_some(), "`{key}` is a top-level field: {shown}");
    }
    for part in ["config", "task", "capabilities", "runtime"] {
        assert!(shown.get(part).is_none(), "`{part}` is not nested in the JSON");
    }
    let e = engine.runtime(&SessionId::from("no-such")).await.unwrap_err();
    assert!(e.to_string().contains("no session `no-such`"), "{e}");
    let e = engine.config(&SessionId::from("no-such")).await.unwrap_err();
    assert!(e.to_string().contains("no session `no-such`"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_rule_naming_no_tool_and_no_effect_class_is_refused_with_a_suggestion() {
    let Fixture { model, _home, work: _work, h, grants } = fixture(vec![]).await;
    let mut bad = spec(&model.url(), grants.clone(), None);
    bad.deny = vec!["fs_wrte_file".into()];
    bad.ask = vec!["workspace_write".into()];
    let e = h.create_session(&Caller::Operator, bad).await.unwrap_err();
    assert_eq!(e.kind(), "input", "{e}");
    let e = e.to_string();
    assert!(e.contains(r#"--deny "fs_wrte_file" names neither an installed tool"#), "{e}");
    assert!(e.contains("(did you mean `fs_write_file`?)"), "{e}");
    assert!(e.contains(r#"--ask "workspace_write""#), "{e}");
    assert!(e.contains("(did you mean `workspace-write`?)"), "{e}");
    assert!(h.sessions(&Caller::Operator).await.unwrap().iter().all(|s| s.id != "api"));
    // Tools and effect classes are accepted, MCP and control tools included.
    let mut good = spec(&model.url(), grants, None);
    good.deny = vec!["fs_write_file".into(), "destructive".into()];
    good.ask = vec!["plan_create".into()];
    good.allow = vec!["external".into()];
    h.create_session(&Caller::Operator, good).await.unwrap();
}

/// A file a person names in a message is read through the session's grants: inside one, it
/// is its text; outside every grant, with `..`, through a link out of the grant, a directory,
/// past the bound or not UTF-8, a clear refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_file_is_read_through_the_sessions_grants_only() {
    let Fixture { model, _home, work, h, grants } = fixture(vec![]).await;
    std::fs::write(work.path().join("notes.md"), "remember the milk\n").unwrap();
    std::fs::create_dir(work.path().join("sub")).unwrap();
    std::fs::write(work.path().join("sub/big.txt"), "x".repeat(keel::api::MAX_ATTACHED_BYTES + 1))
        .unwrap();
    std::fs::write(work.path().join("bin.dat"), [0xff, 0xfe, 0x00]).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "the secret").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), work.path().join("link")).unwrap();
    let id = h.create_session(&Caller::Operator, spec(&model.url(), grants, None)).await.unwrap();
    let f = h.read_granted(&Caller::Operator, &id, "/work/notes.md").await.unwrap();
    assert_eq!((f.text.as_str(), f.bytes), ("remember the milk\n", 18));
    let refused = |path: &'static str, kind: &'static str, says: &'static str| {
        let h = &h;
        let id = id.clone();
        async move {
            match h.read_granted(&Caller::Operator, &id, path).await {
                Err(e) => {
                    assert_eq!(e.kind(), kind, "{path}: {e}");
                    assert!(e.to_string().contains(says), "{path}: {e}");
                }
                Ok(f) => panic!("{path} was read: {f:?}"),
            }
        }
    };
    refused("/etc/passwd", "grant", "outside every directory granted").await;
    refused("/workshop/x", "grant", "outside every directory granted").await;
    refused("/work/../etc/passwd", "input", "does not name a file inside").await;
    refused("/work/link", "input", "cannot read").await;
    refused("/work/sub", "input", "is a directory").await;
    refused("/work/sub/big.txt", "input", "larger than 64 KiB").await;
    refused("/work/bin.dat", "input", "not UTF-8").await;
    // Another user's session does not exist for her.
    let alice = Caller::Api(keel::access::Principal::token("alice", keel::access::Role::User));
    let e = h.read_granted(&alice, &id, "/work/notes.md").await.unwrap_err();
    assert_eq!(e.kind(), "not_found", "{e}");
}
