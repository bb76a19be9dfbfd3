//! Observability of `keel serve`: the Prometheus page (`GET /metrics`) after real turns, and —
//! in the slow tier, against real peers — the traces a real OTLP receiver decodes with the
//! official protobuf definitions, and Debian's `prometheus` scraping keel.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::telemetry_peers::{Prometheus, Receiver};
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::serve::{Server, client, get, post, token, upload_effects, wait_for};

/// The metrics page for `token` (status, body).
async fn metrics(c: &reqwest::Client, url: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = c.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    if status == 200 {
        assert_eq!(res.headers()["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    }
    (status, res.text().await.unwrap())
}

/// The samples of a text-format page by their series (`name{labels}` as written).
fn samples(page: &str) -> HashMap<String, f64> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_string(), value.parse().unwrap())
        })
        .collect()
}

/// The URL `keel serve` prints for its metrics listener, once printed.
fn metrics_address(s: &Server) -> String {
    let start = Instant::now();
    loop {
        let log = s.stderr.lock().unwrap().clone();
        if let Some(rest) = log.split("serving the metrics at ").nth(1) {
            return rest.split_whitespace().next().unwrap().to_string();
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no metrics listener: {log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_turns_calls_tokens_and_approvals_for_an_admin_token_only() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "effect_send", r#"{"label":"hello"}"#)]).with_usage(
            120,
            7,
            Some(100),
        ),
        Reply::text("sent").with_usage(150, 3, None),
        Reply::Delay(Duration::from_secs(2), Box::new(Reply::text("slowly"))),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let bob = token(home.path(), "bob", "user");
    shared_preset(home.path(), roots.path());
    let s = Server::start_with(
        home.path(),
        &model.url(),
        &[roots.path()],
        "metrics_listen = \"127.0.0.1:0\"",
    );
    let c = client();
    upload_effects(&c, &s).await;
    let url = format!("{}/metrics", s.base);

    // An admin token only: none is 401, a user's is 403, and the page says why.
    let (status, body) = metrics(&c, &url, None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = metrics(&c, &url, Some(&bob)).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("needs an admin token"), "{body}");

    let (status, v) = post(
        &c,
        &s.api("/sessions"),
        &s.admin,
        json!({"input": "send hello", "tools": ["effect_send"], "id": "m1", "preset": "shared"}),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    wait_for(&c, &s, "m1", "waiting", |m| m["state"] == "waiting_approval").await;
    let (status, page) = metrics(&c, &url, Some(&s.admin)).await;
    assert_eq!(status, 200, "{page}");
    let m = samples(&page);
    assert_eq!(m["keel_turns_total{outcome=\"waiting_approval\"}"], 1.0, "{page}");
    assert_eq!(m["keel_approvals_pending"], 1.0, "{page}");
    assert_eq!(m["keel_sessions{state=\"waiting_approval\"}"], 1.0, "{page}");
    assert!(m["keel_approval_oldest_pending_age_seconds"] >= 0.0, "{page}");
    // The task-understanding call and the turn's first step.
    assert_eq!(m["keel_model_calls_total{outcome=\"ok\"}"], 2.0, "{page}");
    // The call waits for a decision: it has not been run.
    assert!(!m.contains_key("keel_tool_calls_total{outcome=\"ok\"}"), "{page}");

    let (_, v) = get(&c, &s.api("/approvals?session=m1"), &s.admin).await;
    let unit = v["approvals"][0]["id"].as_str().unwrap().to_string();
    let (status, v) =
        post(&c, &s.api(&format!("/approvals/{unit}/approve")), &s.admin, json!({})).await;
    assert_eq!(status, 200, "{v}");
    wait_for(&c, &s, "m1", "idle", |m| m["state"] == "idle").await;

    let (_, page) = metrics(&c, &url, Some(&s.admin)).await;
    let m = samples(&page);
    assert_eq!(m["keel_turns_total{outcome=\"answer\"}"], 1.0, "{page}");
    assert_eq!(m["keel_turn_duration_seconds_count"], 2.0, "{page}");
    assert_eq!(m["keel_model_calls_total{outcome=\"ok\"}"], 3.0, "{page}");
    assert_eq!(m["keel_model_call_duration_seconds_count"], 3.0, "{page}");
    assert_eq!(m["keel_model_tokens_total{kind=\"input\"}"], 270.0, "{page}");
    assert_eq!(m["keel_model_tokens_total{kind=\"output\"}"], 10.0, "{page}");
    assert_eq!(m["keel_model_tokens_total{kind=\"cached\"}"], 100.0, "{page}");
    assert_eq!(m.get("keel_tool_calls_total{outcome=\"ok\"}"), Some(&1.0), "{page}");
    assert_eq!(m["keel_tool_call_duration_seconds_count"], 1.0, "{page}");
    assert_eq!(m["keel_approvals_decided_total{decision=\"approve\"}"], 1.0, "{page}");
    assert_eq!(m["keel_approvals_pending"], 0.0, "{page}");
    assert_eq!(m["keel_approval_oldest_pending_age_seconds"], 0.0, "{page}");
    assert_eq!(m["keel_sessions{state=\"idle\"}"], 1.0, "{page}");
    assert!(m["keel_store_commits_total"] >= 4.0, "{page}");
    assert!(m["keel_store_fsyncs_total"] >= 1.0, "{page}");
    assert!(m["keel_store_commit_duration_seconds_count"] >= 4.0, "{page}");
    assert!(m["keel_http_requests_total{status=\"2xx\"}"] >= 5.0, "{page}");
    assert!(m["keel_http_requests_total{status=\"4xx\"}"] >= 2.0, "{page}");
    // (the runner lets its lease go just after the session is idle)
    assert!(m["keel_leases_live"] <= 1.0, "{page}");
    // Every histogram's buckets are cumulative and end at its count.
    assert_eq!(
        m["keel_turn_duration_seconds_bucket{le=\"+Inf\"}"],
        m["keel_turn_duration_seconds_count"]
    );
    // Labels carry kinds, never data: no session id, tool input or prompt on the page.
    for data in ["m1", "hello", "send hello"] {
        assert!(!page.contains(data), "{data} on the metrics page:\n{page}");
    }

    // A turn under way: its session is running and its runner's lease is live.
    let (status, v) =
        post(&c, &s.api("/sessions"), &s.admin, json!({"input": "take your time", "id": "m2"}))
            .await;
    assert_eq!(status, 202, "{v}");
    wait_for(&c, &s, "m2", "running", |m| m["state"] == "running").await;
    let (_, during) = metrics(&c, &url, Some(&s.admin)).await;
    let d = samples(&during);
    assert_eq!(d["keel_leases_live"], 1.0, "{during}");
    assert_eq!(d["keel_sessions{state=\"running\"}"], 1.0, "{during}");
    wait_for(&c, &s, "m2", "idle", |m| m["state"] == "idle").await;

    // The operations guide's table lists every metric of the page, and nothing else.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let guide = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let on_page: std::collections::BTreeSet<String> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect();
    let in_guide: std::collections::BTreeSet<String> = guide
        .lines()
        .filter_map(|l| l.strip_prefix("| `keel_"))
        .map(|l| format!("keel_{}", l.split('`').next().unwrap()))
        .collect();
    assert_eq!(on_page, in_guide, "the page's metrics and the guide's table differ");

    // The scraper's own listener: the same page without a token, and nothing else.
    let scrape = metrics_address(&s);
    assert!(scrape.ends_with("/metrics"), "{scrape}");
    let (status, other) = metrics(&c, &scrape, None).await;
    assert_eq!(status, 200, "{other}");
    assert!(other.contains("keel_turns_total{outcome=\"answer\"} 2"), "{other}");
    let base = scrape.trim_end_matches("/metrics");
    let (status, _) = get(&c, &format!("{base}/api/v1/sessions"), &s.admin).await;
    assert_eq!(status, 404);
}

#[test]
fn a_bad_metrics_listen_or_trace_endpoint_stops_serve_with_the_setting_named() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("keel.toml"), "[serve]\nmetrics_listen = \"nowhere\"\n")
        .unwrap();
    let out = super::keel(home.path(), &["serve", "--listen", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[serve] metrics_listen `nowhere`"), "{err}");

    std::fs::write(
        home.path().join("keel.toml"),
        "[telemetry]\notlp_endpoint = \"collector:4318\"\n",
    )
    .unwrap();
    let out = super::keel(home.path(), &["tool", "list"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[telemetry] otlp_endpoint: `collector:4318` is not an http://"), "{err}");

    // A collector that is down costs the command nothing but the spans: it does its work and
    // ends at once.
    std::fs::write(home.path().join("keel.toml"), "").unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let started = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home.path())
        .args(["tool", "list", "--json"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{closed}"))
        .env("KEEL_LOG", "keel=info")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(super::json_of(&out).as_array().is_some_and(|t| !t.is_empty()), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
}

/// The grant preset `shared`: `ROOTS/work` as `/work`, read-write.
fn shared_preset(home: &Path, roots: &Path) {
    let work = roots.join("work");
    std::fs::create_dir(&work).unwrap();
    let preset = format!("{}=/work:rw", work.display());
    let out = super::keel(home, &["grant", "preset", "add", "shared", &preset, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// `keel serve` exporting to `receiver`, with `extra` lines in `[telemetry]`, and the preset
/// `shared` under `roots`.
fn traced_server(
    home: &Path,
    roots: &Path,
    model: &str,
    receiver: &Receiver,
    extra: &str,
) -> Server {
    shared_preset(home, roots);
    Server::start_traced(home, model, roots, &receiver.base, extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "telemetry tier: needs python3 with venv (opentelemetry-proto from PyPI)"]
async fn telemetry_traces_of_a_turn_with_a_tool_call_an_approval_and_a_delegation() {
    let receiver = Receiver::start();
    let prompt = "send the PROMPT-CANARY-7f3a label";
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "effect_send", r#"{"label":"TOOL-INPUT-CANARY"}"#)])
            .with_usage(120, 7, None),
        Reply::text("sent REPLY-CANARY").with_usage(150, 3, None),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let s = traced_server(home.path(), roots.path(), &model.url(), &receiver, "");
    let c = client();
    upload_effects(&c, &s).await;

    // The request carries a W3C trace context: the turn it starts is part of that trace.
    let caller_trace = "0af7651916cd43dd8448eb211c80319c";
    let res = c
        .post(s.api("/sessions"))
        .bearer_auth(&s.admin)
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{caller_trace}-b7ad6b7169203331-01"))
        .body(
            json!({"input": prompt, "tools": ["effect_send"], "id": "t1", "preset": "shared"})
                .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202);
    // A caller that did not sample its trace: nothing of its request is exported.
    let unsampled = "1bf7651916cd43dd8448eb211c80319d";
    let res = c
        .get(s.api("/sessions"))
        .bearer_auth(&s.admin)
        .header("traceparent", format!("00-{unsampled}-b7ad6b7169203331-00"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    // A request that does not prove who it is does not join (nor silence) a caller's trace:
    // its 401 is a trace of its own, exported.
    let stranger = "2cf7651916cd43dd8448eb211c80319e";
    for flags in ["01", "00"] {
        let res = c
            .get(s.api("/sessions"))
            .bearer_auth("keel_not_a_token_at_all_0123456789")
            .header("traceparent", format!("00-{stranger}-c7ad6b7169203332-{flags}"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 401);
    }
    wait_for(&c, &s, "t1", "waiting", |m| m["state"] == "waiting_approval").await;
    let (_, v) = get(&c, &s.api("/approvals?session=t1"), &s.admin).await;
    let unit = v["approvals"][0]["id"].as_str().unwrap().to_string();
    let (status, _) =
        post(&c, &s.api(&format!("/approvals/{unit}/approve")), &s.admin, json!({})).await;
    assert_eq!(status, 200);
    wait_for(&c, &s, "t1", "idle", |m| m["state"] == "idle").await;

    let spans = receiver.wait_for(Duration::from_secs(30), |spans| {
        spans.iter().filter(|s| s["name"] == "turn").count() >= 2
            && spans.iter().any(|s| s["name"] == "approval")
    });
    let by_id: HashMap<&str, &Value> =
        spans.iter().map(|s| (s["span_id"].as_str().unwrap(), s)).collect();
    let named = |name: &str| spans.iter().filter(|s| s["name"] == name).collect::<Vec<_>>();
    let parent = |s: &Value| by_id.get(s["parent_span_id"].as_str().unwrap()).copied();
    for s in &spans {
        assert_eq!(s["resource"]["service.name"], "keel", "{s}");
        assert_eq!(s["scope"], "keel", "{s}");
    }

    // The request that created the session continues the caller's trace; the first turn is
    // its child.
    let request = named("POST /api/v1/sessions");
    assert_eq!(request.len(), 1, "{spans:#?}");
    let request = request[0];
    assert_eq!(request["trace_id"], caller_trace);
    assert_eq!(request["parent_span_id"], "b7ad6b7169203331");
    assert_eq!(request["kind"], 2, "a server span");
    assert_eq!(request["attributes"]["http.route"], "/api/v1/sessions");
    assert_eq!(request["attributes"]["http.response.status_code"], 202);
    let turns = named("turn");
    let first = turns.iter().find(|t| t["attributes"]["keel.outcome"] == "waiting_approval");
    let first = first.unwrap_or_else(|| panic!("no turn waited: {turns:#?}"));
    assert_eq!(first["trace_id"], caller_trace, "{first}");
    assert_eq!(first["attributes"]["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(first["attributes"]["gen_ai.conversation.id"], "t1");
    assert_eq!(first["attributes"]["keel.session_id"], "t1");

    // Its model call: a GenAI `chat` span with the model and the tokens.
    let chats = named("chat m");
    // (turn → model_call → chat)
    let chat = chats.iter().find(|c| {
        let step = parent(c).unwrap();
        step["name"] == "model_call" && parent(step).unwrap()["span_id"] == first["span_id"]
    });
    let chat = chat.unwrap_or_else(|| panic!("no chat under the first turn: {spans:#?}"));
    let a = &chat["attributes"];
    assert_eq!(a["gen_ai.operation.name"], "chat");
    assert_eq!(a["gen_ai.request.model"], "m");
    assert_eq!(a["gen_ai.provider.name"], "openai");
    assert_eq!(a["gen_ai.usage.input_tokens"], 120);
    assert_eq!(a["gen_ai.usage.output_tokens"], 7);
    assert_eq!(a["gen_ai.response.finish_reasons"], "tool_calls");
    // The tool call: an `execute_tool` span, its governed chain below it with what the
    // sandbox measured (the approved call, in the second turn).
    let tools = named("execute_tool effect_send");
    assert!(!tools.is_empty(), "{spans:#?}");
    let chains = named("call_chain");
    let ran = chains
        .iter()
        .find(|c| c["attributes"]["keel.outcome"] == "ok")
        .unwrap_or_else(|| panic!("no call ran: {chains:#?}"));
    let tool = parent(ran).unwrap();
    assert_eq!(tool["name"], "execute_tool effect_send");
    let t = &tool["attributes"];
    assert_eq!(t["gen_ai.operation.name"], "execute_tool");
    assert_eq!(t["gen_ai.tool.name"], "effect_send");
    assert_eq!(t["gen_ai.tool.call.id"], "c1");
    let r = &ran["attributes"];
    assert_eq!(r["keel.effect"], "external");
    assert!(r["keel.sandbox.fuel"].as_i64().unwrap() > 0, "{ran}");
    assert!(r["keel.sandbox.memory_bytes"].as_i64().unwrap() > 0, "{ran}");
    assert!(r["keel.sandbox.ms"].as_f64().unwrap() > 0.0, "{ran}");
    let second = parent(tool).unwrap();
    assert_eq!(second["name"], "turn");
    assert_eq!(second["attributes"]["keel.outcome"], "answer");
    // The wait for the decision: a span from the request for approval to the decision,
    // inside the request that decided it.
    let approval = named("approval")[0];
    let w = &approval["attributes"];
    assert_eq!(w["keel.decision"], "approve");
    assert_eq!(w["gen_ai.tool.name"], "effect_send");
    assert_eq!(w["keel.approval.id"], unit.as_str());
    assert!(approval["start"].as_u64().unwrap() <= first["end"].as_u64().unwrap(), "{approval}");
    let decided = parent(approval).unwrap();
    assert_eq!(decided["name"], "POST /api/v1/approvals/{id}/approve");
    assert!(decided["attributes"]["http.route"].as_str().unwrap().contains("{id}"));

    assert!(spans.iter().all(|s| s["trace_id"] != unsampled), "an unsampled trace was exported");
    assert!(spans.iter().all(|s| s["trace_id"] != stranger), "an unauthenticated caller's trace");
    let refused = spans
        .iter()
        .filter(|s| s["attributes"]["http.response.status_code"] == 401)
        .collect::<Vec<_>>();
    assert_eq!(refused.len(), 2, "both refusals are traced, in traces of their own: {refused:#?}");
    // Nothing of the content by default, and the model's key never.
    let text = serde_json::to_string(&spans).unwrap();
    for canary in ["PROMPT-CANARY", "TOOL-INPUT-CANARY", "REPLY-CANARY", "model-key-canary"] {
        assert!(!text.contains(canary), "{canary} was exported:\n{text}");
    }
    drop(s);

    // A workgroup: a child's turn continues the trace of the call that spawned it, linked to it.
    let script = keel_tests::mock_model::workgroup_responder(Duration::ZERO);
    let model = MockModel::start_fn(script.responder).await;
    let home = tempfile::tempdir().unwrap();
    let receiver = Receiver::start();
    let roots = tempfile::tempdir().unwrap();
    let s = traced_server(home.path(), roots.path(), &model.url(), &receiver, "");
    let task = keel_tests::mock_model::spawn_task("MAIN", &[("a", "CHILD A", &[])]);
    let (status, v) =
        post(&c, &s.api("/sessions"), &s.admin, json!({"input": task, "main": {}})).await;
    assert_eq!(status, 202, "{v}");
    let main = v["session_id"].as_str().unwrap().to_string();
    wait_for(&c, &s, &main, "answered", |m| {
        m["state"] == "idle" && m["turns"].as_i64().unwrap_or(0) >= 2
    })
    .await;
    let spans = receiver.wait_for(Duration::from_secs(30), |spans| {
        spans.iter().any(|s| s["name"] == "delegated")
            && spans.iter().filter(|s| s["name"] == "turn").count() >= 3
    });
    let by_id: HashMap<&str, &Value> =
        spans.iter().map(|s| (s["span_id"].as_str().unwrap(), s)).collect();
    let delegated = spans.iter().find(|s| s["name"] == "delegated").unwrap();
    let spawn = by_id
        .get(delegated["parent_span_id"].as_str().unwrap())
        .unwrap_or_else(|| panic!("the child's runner has no parent span: {spans:#?}"));
    assert!(spawn["name"].as_str().unwrap().starts_with("execute_tool "), "{spawn}");
    assert_eq!(delegated["links"][0]["span_id"], spawn["span_id"]);
    assert_eq!(delegated["trace_id"], spawn["trace_id"]);
    let child = delegated["attributes"]["keel.session_id"].as_str().unwrap();
    let child_turn = spans
        .iter()
        .find(|s| s["name"] == "turn" && s["attributes"]["keel.session_id"] == child)
        .unwrap_or_else(|| panic!("no turn of the child {child}: {spans:#?}"));
    assert_eq!(child_turn["parent_span_id"], delegated["span_id"]);
    assert_eq!(child_turn["trace_id"], spawn["trace_id"]);
    assert_eq!(delegated["attributes"]["keel.parent.session_id"], main.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "telemetry tier: needs python3 with venv (opentelemetry-proto from PyPI)"]
async fn telemetry_content_is_exported_only_when_captured_and_secrets_never() {
    let receiver = Receiver::start();
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "effect_put", r#"{"label":"TOOL-INPUT-CANARY"}"#)]),
        Reply::text("done REPLY-CANARY"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let s = traced_server(
        home.path(),
        roots.path(),
        &model.url(),
        &receiver,
        "capture_content = true\n",
    );
    let c = client();
    upload_effects(&c, &s).await;
    let (status, v) = post(
        &c,
        &s.api("/sessions"),
        &s.admin,
        json!({"input": "put PROMPT-CANARY", "tools": ["effect_put"], "id": "cc", "policy": {"allow": ["effect_put"]}, "preset": "shared"}),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    wait_for(&c, &s, "cc", "idle", |m| m["state"] == "idle" && m["turns"] == 1).await;
    let spans = receiver.wait_for(Duration::from_secs(30), |spans| {
        spans.iter().filter(|s| s["name"] == "chat m").count() >= 2
            && spans.iter().any(|s| s["name"] == "execute_tool effect_put")
            // (the span holding the reply may be exported after the others)
            && serde_json::to_string(spans).is_ok_and(|t| t.contains("REPLY-CANARY"))
    });
    let chat = spans
        .iter()
        .find(|s| s["name"] == "chat m" && s["attributes"]["gen_ai.input.messages"].is_string())
        .unwrap_or_else(|| panic!("no chat with content: {spans:#?}"));
    assert!(
        chat["attributes"]["gen_ai.input.messages"].as_str().unwrap().contains("PROMPT-CANARY")
    );
    let tool = spans.iter().find(|s| s["name"] == "execute_tool effect_put").unwrap();
    assert!(
        tool["attributes"]["gen_ai.tool.call.arguments"]
            .as_str()
            .unwrap()
            .contains("TOOL-INPUT-CANARY"),
        "{tool}"
    );
    assert!(tool["attributes"]["gen_ai.tool.call.result"].is_string(), "{tool}");
    let text = serde_json::to_string(&spans).unwrap();
    assert!(text.contains("REPLY-CANARY"), "the reply was not captured");
    assert!(!text.contains("model-key-canary"), "the model's key was exported:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "telemetry tier: needs Debian's prometheus"]
async fn telemetry_prometheus_scrapes_keel_serve_with_an_admin_token() {
    let model = MockModel::start(vec![Reply::text("one"), Reply::text("two")]).await;
    let home = tempfile::tempdir().unwrap();
    let s = Server::start(home.path(), &model.url(), &[]);
    let c = client();
    for id in ["p1", "p2"] {
        let (status, v) =
            post(&c, &s.api("/sessions"), &s.admin, json!({"input": "hi", "id": id})).await;
        assert_eq!(status, 202, "{v}");
        wait_for(&c, &s, id, "idle", |m| m["state"] == "idle" && m["turns"] == 1).await;
    }
    // The scrape job of the operations guide, as an operator copies it: only the address and
    // the token file are this test's.
    let target = s.base.trim_start_matches("http://").to_string();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let guide = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let job = guide
        .split("```yaml\n")
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.starts_with("scrape_configs:"))
        .expect("the guide's scrape job")
        .replace("/etc/prometheus/keel-token", "TOKEN_FILE")
        .replace("127.0.0.1:7420", &target);
    assert!(job.contains("TOKEN_FILE") && job.contains(&target), "{job}");
    let prom = Prometheus::start(&job, Some(&s.admin));
    let answered =
        prom.value("keel_turns_total{outcome=\"answer\",job=\"keel\"}", Duration::from_secs(60));
    assert_eq!(answered, Some(2.0), "target: {:?}", prom.target());
    assert_eq!(prom.value("keel_sessions{state=\"idle\"}", Duration::from_secs(10)), Some(2.0));
    // Each turn's task understanding and its step.
    assert_eq!(prom.value("sum(keel_model_calls_total)", Duration::from_secs(10)), Some(4.0));
    // The histograms are ones Prometheus can take quantiles of.
    let median = prom.value(
        "histogram_quantile(0.5, keel_turn_duration_seconds_bucket)",
        Duration::from_secs(10),
    );
    assert!(median.is_some_and(|m| m > 0.0 && m < 60.0), "{median:?}");
    // Without the token the scrape is refused, and Prometheus says so.
    let without: String = job
        .lines()
        .filter(|l| !l.contains("authorization") && !l.contains("credentials_file"))
        .map(|l| format!("{l}\n"))
        .collect();
    let refused = Prometheus::start(&without, None);
    let start = Instant::now();
    loop {
        let (health, error) = refused.target();
        if health == "down" {
            assert!(error.contains("401"), "{error}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never scraped: {health} {error}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[test]
#[ignore = "telemetry tier: needs Debian's prometheus (promtool)"]
fn telemetry_the_sample_alerts_of_the_operations_guide_pass_promtool() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let guide = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let after = guide.split("### Sample alerts").nth(1).unwrap();
    let rules = after.split("```yaml\n").nth(1).unwrap().split("```").next().unwrap();
    assert!(rules.contains("keel_approval_oldest_pending_age_seconds"), "{rules}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keel.rules.yml");
    std::fs::write(&file, rules).unwrap();
    let out = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool (Debian's prometheus package) is needed");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every metric the rules use is one the guide's table lists (which the default tier
    // checks against the page keel serves).
    let table = guide.split("### Sample alerts").next().unwrap();
    for m in [
        "keel_approval_oldest_pending_age_seconds",
        "keel_model_calls_total",
        "keel_sandbox_traps_total",
        "keel_turns_total",
    ] {
        assert!(rules.contains(m) && table.contains(&format!("| `{m}` |")), "{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stopped_by_sigterm_exports_its_last_spans() {
    // The batch would wait a minute: only the flush at the end can send the spans.
    let sink = keel_tests::telemetry_peers::Sink::start();
    let home = tempfile::tempdir().unwrap();
    let mut s = Server::start_env(
        home.path(),
        "",
        &[],
        "",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &sink.base), ("OTEL_BSP_SCHEDULE_DELAY", "60000")],
    );
    let c = client();
    let (status, _) = get(&c, &s.api("/whoami"), &s.admin).await;
    assert_eq!(status, 200);
    assert_eq!(sink.requests.load(std::sync::atomic::Ordering::Relaxed), 0, "sent before the end");
    let status = s.terminate();
    assert!(status.success(), "{status:?}: {}", s.stderr.lock().unwrap());
    let start = Instant::now();
    while !s.stderr.lock().unwrap().contains("keel: stopping") {
        assert!(start.elapsed() < Duration::from_secs(5), "{}", s.stderr.lock().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        sink.requests.load(std::sync::atomic::Ordering::Relaxed) >= 1,
        "the last spans were lost"
    );
    assert!(sink.bytes.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

/// One input is one trace: `keel run` with OTLP export on sends its task understanding (the
/// `understand` span and its model call), its turn and the turn's model call under one root,
/// the command's own span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "telemetry tier: needs python3 with venv (opentelemetry-proto from PyPI)"]
async fn telemetry_keel_run_is_one_trace_from_understanding_to_answer() {
    let receiver = Receiver::start();
    let model = MockModel::start(vec![Reply::text("an answer")]).await;
    model.push_understanding(vec![Reply::understanding("establish_task", &[], &[], &[])]);
    let home = tempfile::tempdir().unwrap();
    let (url, home_dir) = (model.url(), home.path().to_path_buf());
    let base = receiver.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("--home")
            .arg(&home_dir)
            .args(["run", "say something", "--new-session", "one", "--model", "m"])
            .args(["--model-url", &url])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &base)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(model.understanding_requests().len(), 1, "the input was understood");
    // The root ends last: once it is in, the process sent everything.
    let spans = receiver
        .wait_for(Duration::from_secs(30), |spans| spans.iter().any(|s| s["name"] == "keel run"));
    let traces: std::collections::BTreeSet<&str> =
        spans.iter().map(|s| s["trace_id"].as_str().unwrap()).collect();
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(traces.len(), 1, "one trace, not {}: {names:?}", traces.len());
    let roots: Vec<&Value> =
        spans.iter().filter(|s| s["parent_span_id"].as_str().is_none_or(str::is_empty)).collect();
    assert_eq!(roots.len(), 1, "one root: {roots:#?}");
    assert_eq!(roots[0]["name"], "keel run", "{roots:#?}");
    for name in ["understand", "turn"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    assert!(names.iter().filter(|n| n.starts_with("chat")).count() >= 2, "{names:?}");
}
