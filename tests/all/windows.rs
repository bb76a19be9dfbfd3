//! What keel adds to every request, against small windows: the notes after the stable prefix
//! (and one system message for a template that refuses two), compact schemas and tools loaded
//! on demand past keel's share of the window, where the room goes, and long turns and long
//! sessions in a 2,000-token window — against the loopback server refusing past its context
//! as llama.cpp does.

use keel::agent::LoopGuards;
use keel::assembly::Assembly;
use keel::brain::Submitted;
use keel::caller::Caller;
use keel::ids::SessionId;
use keel::meta::SessionMeta;
use keel::sandbox::{Access, CancelToken, Grant};
use keel::session::{Decision, Policy};
use keel::views::Views;
use keel_tests::mock_model::{MockModel, Reply, Responder};
use keel_tests::{answered, harness_with_session, install_effects, no_events, system_of};
use serde_json::Value;
use std::sync::Arc;

async fn harness(dir: &std::path::Path, url: &str) -> keel::harness::Harness {
    harness_with_session(dir, url, "unused", &[], Vec::new(), LoopGuards::default()).await
}

/// Session `id`: the model at `url` with `window`, `tools`, a work directory granted
/// read-write, `policy`, task understanding off.
async fn session(
    h: &keel::harness::Harness,
    id: &str,
    url: &str,
    window: Option<u64>,
    tools: &[&str],
    work: &std::path::Path,
    policy: Policy,
) {
    let grants = vec![Grant::new(work, "/work", Access::Rw).unwrap()];
    keel_tests::windowed_session(h, id, url, window, tools, grants, policy).await;
}

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap()
}

/// The goals, plan and summary go in a second system message after the stable instructions,
/// so the first message and the tool schemas — what a chat template renders first — are the
/// same bytes from request to request while the goals change; the evidence rebuilds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notes_follow_the_stable_prefix_and_the_evidence_rebuilds() {
    let model = MockModel::start(vec![
        Reply::calls(&[("p1", "plan_create", r#"{"steps":["append","check"]}"#)]),
        Reply::text("first"),
        Reply::text("second"),
    ])
    .await;
    let (dir, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let h = harness(dir.path(), &model.url()).await;
    install_effects(&h).await;
    let tools = ["plan_create", "effect_append"];
    session(&h, "n", &model.url(), None, &tools, work.path(), Policy::default()).await;
    let id = SessionId::from("n");
    let cancel = CancelToken::new();
    for text in ["append one line", "now something else entirely"] {
        answered(h.internals().brain.submit(&id, text, &cancel, &no_events()).await.unwrap());
    }
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    let first = json(&requests[0]);
    for (k, body) in requests.iter().enumerate() {
        let v = json(body);
        let msgs = v["messages"].as_array().unwrap();
        assert_eq!(
            msgs[0], first["messages"][0],
            "request {k}: the instructions are the same bytes"
        );
        assert_eq!(v["tools"], first["tools"], "request {k}: so are the tool schemas");
        let instructions = msgs[0]["content"].as_str().unwrap();
        assert!(instructions.starts_with("You are a test agent."), "{instructions}");
        assert!(instructions.contains("- /work (read-write)"), "{instructions}");
        assert!(!instructions.contains("Session goal"), "{instructions}");
        assert_eq!(msgs[1]["role"], "system", "request {k}: the notes come second");
        assert!(msgs[1]["content"].as_str().unwrap().contains("Session goal"), "{k}");
        assert_eq!(msgs[2]["role"], "user");
        let (_, evidence) =
            Assembly::of(h.internals().engine).evidence(&id, Some(k as i64 + 1)).await.unwrap();
        assert_eq!(&evidence, body, "the evidence of request {k}");
    }
    // The plan came between the first two requests: only the notes changed.
    let notes =
        |k: usize| json(&requests[k])["messages"][1]["content"].as_str().unwrap().to_string();
    assert!(!notes(0).contains("append") || !notes(0).contains("check"), "{}", notes(0));
    assert!(notes(1).contains("check"), "the plan is in the notes: {}", notes(1));
}

/// A server whose chat template accepts one system message only refuses the first request;
/// the session sends one from then on, and the turn is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_that_refuses_a_second_system_message_gets_one() {
    let refusal = serde_json::json!({"error": {"code": 400, "type": "invalid_request_error",
        "message": "Conversation roles must alternate user/assistant/user/assistant/..."}});
    let model = MockModel::start(vec![
        Reply::Status { code: 400, retry_after: None, body: refusal.to_string() },
        Reply::text("answered with one system message"),
        Reply::text("and again"),
    ])
    .await;
    let (dir, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let h = harness(dir.path(), &model.url()).await;
    session(&h, "one", &model.url(), None, &[], work.path(), Policy::default()).await;
    let id = SessionId::from("one");
    let cancel = CancelToken::new();
    let out = h.internals().brain.submit(&id, "hello", &cancel, &no_events()).await.unwrap();
    assert_eq!(answered(out), "answered with one system message");
    let out = h.internals().brain.submit(&id, "hello again", &cancel, &no_events()).await.unwrap();
    assert_eq!(answered(out), "and again");
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    let systems = |body: &[u8]| {
        json(body)["messages"].as_array().unwrap().iter().filter(|m| m["role"] == "system").count()
    };
    assert_eq!(systems(&requests[0]), 2);
    assert_eq!((systems(&requests[1]), systems(&requests[2])), (1, 1));
    // The one system message: the stable instructions first, then the notes.
    let system = system_of(&requests[1]);
    assert!(system.starts_with("You are a test agent."), "{system}");
    assert!(system.contains("Session goal (also the current phase goal): hello"), "{system}");
    assert!(!h.internals().engine.config(&id).await.unwrap().model.notes_message);
    for step in [1, 2] {
        let (_, evidence) =
            Assembly::of(h.internals().engine).evidence(&id, Some(step)).await.unwrap();
        assert_eq!(evidence, requests[step as usize]);
    }
    // A refusal that does not speak of roles is not taken for one: the turn fails as before.
    let model = MockModel::start(vec![Reply::Status {
        code: 400,
        retry_after: None,
        body: "bad request".into(),
    }])
    .await;
    session(&h, "other", &model.url(), None, &[], work.path(), Policy::default()).await;
    let other = SessionId::from("other");
    let out = h.internals().brain.submit(&other, "hi", &cancel, &no_events()).await.unwrap();
    assert!(matches!(out, Submitted::Ran(keel::agent::TurnOutcome::Failed(_))), "{out:?}");
    assert_eq!(model.requests().len(), 1);
    assert!(h.internals().engine.config(&other).await.unwrap().model.notes_message);
}

/// Past keel's share of the window, the schemas go compact (descriptions cut to a sentence,
/// examples dropped), then minimal (parameter descriptions and bounds dropped too; names,
/// types, enums and required lists kept); a new session in a small window
/// loads the discovery tools only, and finds the rest when a task needs them; `room` says
/// where the next request's bytes go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_windows_get_compact_schemas_and_tools_on_demand() {
    let model = MockModel::start(vec![Reply::text("small"), Reply::text("large")]).await;
    let (dir, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let h = harness(dir.path(), &model.url()).await;
    let fs =
        ["fs_read_file", "fs_write_file", "fs_list_dir", "fs_search", "http_fetch", "csv_inspect"];
    let cancel = CancelToken::new();
    for (id, window) in [("small", Some(2048)), ("large", None)] {
        session(&h, id, &model.url(), window, &fs, work.path(), Policy::default()).await;
        let sid = SessionId::from(id);
        answered(h.internals().brain.submit(&sid, "hi", &cancel, &no_events()).await.unwrap());
        let room = h.room(&Caller::Operator, id).await.unwrap();
        // 2,048 tokens: compact schemas would still pass keel's share, so they go minimal.
        let form = if window.is_some() {
            keel::tools::SchemaForm::Minimal
        } else {
            keel::tools::SchemaForm::Full
        };
        assert_eq!(room.parts.schemas, form, "{id}: {room:?}");
        if window.is_some() {
            let share = p_share(&room);
            assert!(share <= keel::assembly::FIXED_SHARE, "keel's part {share:.2} of the window");
        }
        let p = room.parts;
        println!("{id}: {}", room.describe());
        assert!(p.fixed >= p.tool_schemas && p.tool_schemas > 0, "{p:?}");
        assert_eq!(p.summary, 0);
        assert!(p.step > 0, "{p:?}");
        assert!(room.describe().contains("tool schemas"), "{}", room.describe());
    }
    let requests = model.requests();
    let (small, large) = (json(&requests[0]), json(&requests[1]));
    let (small, large) = (small["tools"].as_array().unwrap(), large["tools"].as_array().unwrap());
    assert_eq!(small.len(), large.len());
    let size = |t: &[Value]| serde_json::to_string(t).unwrap().len();
    if std::env::var("KEEL_SHOW_SCHEMAS").is_ok() {
        println!("{}", serde_json::to_string_pretty(small).unwrap());
    }
    println!(
        "tool schemas of {} tools: {} bytes full, {} minimal",
        fs.len(),
        size(large),
        size(small)
    );
    assert!(size(small) * 2 < size(large), "minimal is less than half");
    for (s, l) in small.iter().zip(large) {
        let (s, l) = (&s["function"], &l["function"]);
        assert_eq!(s["name"], l["name"]);
        let d = s["description"].as_str().unwrap();
        assert!(d.chars().count() <= keel::tools::MINIMAL_DESCRIPTION, "{d}");
        assert!(l["description"].as_str().unwrap().starts_with(d.trim_end_matches('…')), "{d}");
        assert_eq!(s["parameters"]["required"], l["parameters"]["required"]);
        let props = |v: &Value| {
            let mut k: Vec<String> = v["parameters"]["properties"]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            k.sort();
            k
        };
        assert_eq!(props(s), props(l), "every parameter stays");
        assert!(!s.to_string().contains("\"examples\""));
    }
    // Over the API, a new session in a small window loads the discovery tools only; in a
    // large one (or with no window known) every installed tool.
    let tiny = {
        let mut spec = keel_tests::session_spec(&model.url(), "tiny", Vec::new(), None);
        spec.model.context_window = Some(2048);
        spec
    };
    h.create_session(&Caller::Operator, tiny).await.unwrap();
    let wide = keel_tests::session_spec(&model.url(), "wide", Vec::new(), None);
    h.create_session(&Caller::Operator, wide).await.unwrap();
    let loaded = |id: &str| {
        let h = &h;
        let id = SessionId::from(id);
        async move {
            SessionMeta::read(h.internals().engine, &id).await.unwrap().capabilities.loaded_tools
        }
    };
    let mut tiny = loaded("tiny").await;
    tiny.sort();
    let mut always: Vec<String> = keel::api::CONTROL_TOOLS.iter().map(|t| t.to_string()).collect();
    always.sort();
    assert_eq!(tiny, always);
    let wide = loaded("wide").await;
    assert!(wide.len() > always.len() + 5 && fs.iter().all(|t| wide.iter().any(|w| w == t)));
}

/// keel's fixed part of `room`'s request as a share of its window.
fn p_share(room: &keel::assembly::RoomView) -> f64 {
    room.parts.fixed as f64 / keel::assembly::BYTES_PER_TOKEN / room.window.unwrap() as f64
}

/// A model that acts only on what its window shows it: in a turn of `calls` non-idempotent
/// calls, it appends `item-NN` for the first NN its request does not show as run, and answers
/// once every one shows. A call that falls out of every request would run twice.
fn forgetful(calls: usize) -> Responder {
    Arc::new(move |body: &[u8]| {
        let text = String::from_utf8_lossy(body);
        let padding = "p".repeat(420);
        match (1..=calls).find(|i| !text.contains(&format!("item-{i:02}"))) {
            Some(i) => Reply::calls(&[(
                &format!("c{i}"),
                "effect_append",
                &format!(r#"{{"label":"item-{i:02} {padding}"}}"#),
            )]),
            None => Reply::text("all appended"),
        }
    })
}

/// A turn of 14 non-idempotent calls in a 2,000-token window: the turn compacts while it runs,
/// and every call stays visible — in the history or in the summary's list of calls already run
/// — so each runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_turn_in_a_small_window_runs_each_call_once() {
    let window = 2000u64;
    let model = MockModel::start_fn_with_context(forgetful(14), window as usize * 4).await;
    let (dir, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let h = harness(dir.path(), &model.url()).await;
    install_effects(&h).await;
    session(
        &h,
        "long",
        &model.url(),
        Some(window),
        &["effect_append"],
        work.path(),
        Policy::default(),
    )
    .await;
    let id = SessionId::from("long");
    let out = h
        .internals()
        .brain
        .submit(&id, "append the fourteen lines", &CancelToken::new(), &no_events())
        .await
        .unwrap();
    assert_eq!(answered(out), "all appended");
    let lines = keel_tests::log_lines(work.path(), "effects.log");
    assert_eq!(lines.len(), 14, "each call once: {lines:#?}");
    for i in 1..=14 {
        assert_eq!(lines.iter().filter(|l| l.contains(&format!("item-{i:02}"))).count(), 1);
    }
    let t = Views::of(h.internals().engine).timeline(&id).await.unwrap();
    assert!(t.refused_requests.is_empty(), "{:?}", t.refused_requests);
    let compactions = t.checkpoints.len();
    assert!(compactions >= 1, "the turn compacted while it ran");
    println!(
        "14 calls in a {window}-token window: {compactions} compactions, {} requests",
        model.requests().len()
    );
}

/// An approvals session of 150 turns in a 2,000-token window: each turn's call waits for a
/// decision, half are rejected; the summary's journal lists stay bounded, and no turn fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approvals_session_of_150_turns_in_a_small_window_never_fails() {
    let turns: usize = 150;
    let window = 2000u64;
    // A call on a user message, an answer on a tool result.
    let responder: Responder = Arc::new(|body: &[u8]| {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let msgs = v["messages"].as_array().cloned().unwrap_or_default();
        let last = msgs.last().cloned().unwrap_or(Value::Null);
        let user = msgs.iter().rev().find(|m| m["role"] == "user").cloned().unwrap_or(Value::Null);
        let tag = user["content"]
            .as_str()
            .unwrap_or("")
            .split_whitespace()
            .last()
            .unwrap_or("x")
            .to_string();
        if last["role"] == "tool" {
            Reply::text(&format!("done {tag}"))
        } else {
            Reply::calls(&[(
                &format!("s-{tag}"),
                "effect_send",
                &format!(r#"{{"label":"{tag}"}}"#),
            )])
        }
    });
    let model = MockModel::start_fn_with_context(responder, window as usize * 4).await;
    let (dir, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let h = harness(dir.path(), &model.url()).await;
    install_effects(&h).await;
    session(&h, "ap", &model.url(), Some(window), &["effect_send"], work.path(), Policy::default())
        .await;
    let id = SessionId::from("ap");
    let cancel = CancelToken::new();
    let mut largest_system = 0;
    for turn in 0..turns {
        let out = h
            .internals()
            .brain
            .submit(&id, &format!("send the label t{turn}"), &cancel, &no_events())
            .await
            .unwrap();
        let Submitted::Ran(keel::agent::TurnOutcome::WaitingApproval(units)) = out else {
            panic!("turn {turn}: {out:?}")
        };
        let decision = if turn.is_multiple_of(2) { Decision::Approve } else { Decision::Reject };
        h.internals().brain.decide(&units[0], decision, None, None).await.unwrap().unwrap();
        let out = h.internals().brain.drain(&id, &cancel, &no_events()).await.unwrap().unwrap();
        assert_eq!(answered(out), format!("done t{turn}"), "turn {turn}");
        if let Some(last) = model.requests().last() {
            largest_system = largest_system.max(system_of(last).len());
        }
    }
    let t = Views::of(h.internals().engine).timeline(&id).await.unwrap();
    assert!(t.refused_requests.is_empty(), "{:?}", t.refused_requests);
    assert_eq!(keel_tests::log_lines(work.path(), "sent.log").len(), turns / 2);
    println!(
        "{turns} approval turns in a {window}-token window: {} compactions, largest system text {largest_system} bytes",
        t.checkpoints.len()
    );
    assert!(largest_system < window as usize * 4 / 2, "the system text stays bounded");
}
