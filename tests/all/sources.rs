//! Tool sources: a tool implemented in the host process goes through the same chain as a
//! component's — loaded, input schema, policy, the approval gate bound to its implementation
//! digest, the journal — and its own deadline and output cap.

use keel::meta::SessionMeta;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel::agent::{LoopGuards, TurnOutcome};
use keel::api::Caller;
use keel::brain::Submitted;
use keel::policy::Effect;
use keel::sandbox::{Budget, CallError, CancelToken};
use keel::session::{Decision, JournalStatus};
use keel::tools::{CallRequest, HostCall, HostFuture, HostTool, SourceKind, ToolRecord};
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::{harness_with_session, install_effects, no_events, session_spec};

/// A control tool that records notes in memory; `sleep_ms` in its input makes it slow, and
/// `big` makes its output large.
struct Notes {
    record: ToolRecord,
    digest: String,
    notes: Mutex<Vec<String>>,
}

impl Notes {
    fn new(name: &str, effect: Effect) -> Arc<Self> {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "text": {"type": "string"},
                "sleep_ms": {"type": "integer"},
                "big": {"type": "boolean"}
            },
            "required": ["text"],
            "additionalProperties": false
        });
        Arc::new(Self {
            record: ToolRecord {
                name: name.into(),
                component: "keel:control".into(),
                description: "Keeps a note for later.".into(),
                input_schema: schema,
                output_schema: None,
                effect,
                idempotent: false,
                spec_digest: keel::digest::sha256_hex(name.as_bytes()),
            },
            digest: keel::digest::sha256_hex(format!("control:{name}:1").as_bytes()),
            notes: Mutex::new(Vec::new()),
        })
    }

    fn notes(&self) -> Vec<String> {
        self.notes.lock().unwrap().clone()
    }
}

impl HostTool for Notes {
    fn kind(&self) -> SourceKind {
        SourceKind::Control
    }
    fn record(&self) -> &ToolRecord {
        &self.record
    }
    fn digest(&self) -> &str {
        &self.digest
    }
    fn call<'a>(&'a self, input: serde_json::Value, _ctx: HostCall<'a>) -> HostFuture<'a> {
        Box::pin(async move {
            if let Some(ms) = input["sleep_ms"].as_u64() {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let text = input["text"].as_str().unwrap_or_default().to_string();
            let mut notes = self.notes.lock().unwrap();
            notes.push(text);
            let count = notes.len();
            match input["big"].as_bool() {
                Some(true) => Ok(serde_json::json!({"count": count, "pad": "x".repeat(1 << 20)})),
                _ => Ok(serde_json::json!({"count": count})),
            }
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_tool_is_asked_approved_run_and_journaled_like_a_component() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "note_add", r#"{"text":"buy milk"}"#)]),
        Reply::text("noted"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "_", &[], vec![], LoopGuards::default())
            .await;
    install_effects(&h).await;
    let notes = Notes::new("note_add", Effect::External);
    h.register_host_tool(&Caller::Operator, notes.clone()).unwrap();
    assert!(
        h.tools(&Caller::Operator).unwrap().iter().any(|t| t.name == "note_add"),
        "listed with the tools"
    );

    // Names stay unique across sources, and keel's own tools cannot be removed.
    let e = h
        .register_host_tool(&Caller::Operator, Notes::new("note_add", Effect::ReadOnly))
        .unwrap_err();
    assert_eq!(e.kind(), "name_clash", "{e}");
    let e = h
        .register_host_tool(&Caller::Operator, Notes::new("effect_send", Effect::ReadOnly))
        .unwrap_err();
    assert_eq!(e.kind(), "name_clash", "a component's tool has the name: {e}");
    let e = h
        .register_host_tool(&Caller::Operator, Notes::new("Bad Name", Effect::ReadOnly))
        .unwrap_err();
    assert_eq!(e.kind(), "invalid_specs", "{e}");
    let e = h.remove_tool(&Caller::Operator, "note_add").unwrap_err();
    assert_eq!(e.kind(), "host_tool", "{e}");

    let id = h
        .create_session(
            &Caller::Operator,
            session_spec(&model.url(), "control", vec![], Some(vec!["note_add".into()])),
        )
        .await
        .unwrap();
    let meta = SessionMeta::read(h.internals().engine, &id).await.unwrap();
    assert_eq!(
        meta.capabilities.tool_pins.get("note_add"),
        Some(&notes.digest),
        "pinned to its digest"
    );

    // An external effect is asked about by default: nothing runs before the decision.
    let cancel = CancelToken::new();
    let units =
        match h.send(&Caller::Operator, &id, "remember milk", &cancel, &no_events()).await.unwrap()
        {
            Submitted::Ran(TurnOutcome::WaitingApproval(units)) => units,
            other => panic!("expected a wait for approval, got {other:?}"),
        };
    assert!(notes.notes().is_empty(), "nothing ran before the decision");
    let unit = h.approvals(&Caller::Operator, Some(&id), true).await.unwrap().remove(0).unit;
    assert_eq!(unit.component_digest, notes.digest, "the approval binds the implementation");
    assert_eq!(unit.effect, Effect::External);

    h.decide(&Caller::Operator, &units[0], Decision::Approve, None, Some(id.to_string()))
        .await
        .unwrap();
    assert_eq!(
        h.resume(&Caller::Operator, &id, &cancel, &no_events()).await.unwrap(),
        Some(Submitted::Ran(TurnOutcome::Answer("noted".into())))
    );
    assert_eq!(notes.notes(), ["buy milk"], "it ran exactly once");
    let timeline = h.timeline(&Caller::Operator, &id).await.unwrap();
    let call = &timeline.tool_calls[0].entry;
    assert_eq!(call.status, JournalStatus::Done);
    assert_eq!(call.component_digest.as_deref(), Some(notes.digest.as_str()));
    assert_eq!(call.approval_id.as_deref(), Some(units[0].as_str()));
    let result: serde_json::Value = serde_json::from_str(call.result.as_deref().unwrap()).unwrap();
    assert_eq!(result["count"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_tool_gets_the_same_checks_deadline_and_output_cap() {
    let model = MockModel::start(vec![]).await;
    let home = tempfile::tempdir().unwrap();
    let h =
        harness_with_session(home.path(), &model.url(), "_", &[], vec![], LoopGuards::default())
            .await;
    let notes = Notes::new("note_add", Effect::ReadOnly);
    h.register_host_tool(&Caller::Operator, notes.clone()).unwrap();
    let call = |input: &'static str, budget: Budget| CallRequest {
        tool: "note_add",
        input,
        grants: &[],
        net: keel::sandbox::net::NetGrants::none(),
        budget,
        cancel: None,
        loaded: None,
        policy: None,
        approval: None,
        control: None,
    };

    let ok =
        h.call_tool(&Caller::Operator, call(r#"{"text":"a"}"#, Budget::default())).await.unwrap();
    assert_eq!(ok.report.result.unwrap()["count"], 1);
    assert_eq!(ok.tool.component, "keel:control");

    // The input schema is checked before the tool runs.
    let e = h
        .call_tool(&Caller::Operator, call(r#"{"txt":"a"}"#, Budget::default()))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "invalid_input", "{e}");

    // Past its deadline the call is stopped with the component's error.
    let short = Budget { timeout: Duration::from_millis(50), ..Budget::default() };
    let slow = h
        .call_tool(&Caller::Operator, call(r#"{"text":"b","sleep_ms":5000}"#, short))
        .await
        .unwrap();
    assert!(matches!(slow.report.result, Err(CallError::Timeout { .. })), "{:?}", slow.report);

    // Output over the call's cap is discarded, as a component's is.
    let capped = Budget { max_output: 64 * 1024, ..Budget::default() };
    let big =
        h.call_tool(&Caller::Operator, call(r#"{"text":"c","big":true}"#, capped)).await.unwrap();
    assert!(
        matches!(big.report.result, Err(CallError::OutputTooLarge { .. })),
        "{:?}",
        big.report.result
    );

    assert_eq!(notes.notes(), ["a", "c"], "the slow call was stopped before it wrote");
}
