//! `keel doctor` and `keel config` through the binary, against a model server on loopback
//! that speaks llama.cpp's `GET /v1/models` and `GET /props`.

use std::path::Path;
use std::process::{Command, Output};

use keel_tests::mock_model::MockModel;
use serde_json::{Value, json};

/// The variables that would change what the commands report, cleared for every run.
const CLEARED: &[&str] = &[
    "KEEL_MODEL_URL",
    "KEEL_MODEL",
    "KEEL_CONTEXT_WINDOW",
    "KEEL_API_KEY",
    "OPENAI_API_KEY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "KEEL_SYNCHRONOUS",
];

async fn keel_env(home: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_keel"));
    c.arg("--home").arg(home).args(args);
    for k in CLEARED {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    tokio::task::spawn_blocking(move || c.output().unwrap()).await.unwrap()
}

fn checks(out: &Output) -> Vec<Value> {
    super::json_of(out)["checks"].as_array().cloned().unwrap_or_default()
}

/// The failed checks' details, joined.
fn failed(checks: &[Value]) -> Vec<String> {
    checks
        .iter()
        .filter(|c| c["ok"] == false)
        .map(|c| format!("{}: {} (fix: {})", c["area"], c["detail"], c["fix"]))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_finds_a_template_without_tools_a_window_too_large_and_a_model_not_served() {
    let model = MockModel::start(Vec::new()).await;
    // llama.cpp started without --jinja: its template takes no tools; a 4,096-token slot.
    model.serve_info(
        Some(json!({"object": "list", "data": [{"id": "qwen.gguf", "meta": {"n_ctx_train": 32768}}]})),
        Some(json!({"default_generation_settings": {"n_ctx": 4096},
            "chat_template_caps": {"supports_tools": false, "supports_tool_calls": false}})),
    );
    let home = tempfile::tempdir().unwrap();
    let url = model.url();
    let env = [("KEEL_MODEL_URL", url.as_str()), ("KEEL_MODEL", "local")];
    let out = keel_env(home.path(), &env, &["doctor", "--context-window", "8192", "--json"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let list = checks(&out);
    let bad = failed(&list);
    assert_eq!(bad.len(), 2, "{bad:#?}");
    assert!(bad[0].contains("does not take tools") && bad[0].contains("--jinja"), "{bad:#?}");
    assert!(bad[1].contains("8192") && bad[1].contains("--context-window 4096"), "{bad:#?}");
    let good: Vec<String> =
        list.iter().filter(|c| c["ok"] == true).map(|c| c["detail"].to_string()).collect();
    assert!(good.iter().any(|d| d.contains("schema version")), "{good:#?}");
    assert!(good.iter().any(|d| d.contains("(from KEEL_MODEL)")), "{good:#?}");
    // llama.cpp answers any name with its one model: said, not failed.
    assert!(
        list.iter()
            .any(|c| c["detail"].as_str().unwrap().contains("llama.cpp answers any model name"))
    );
    assert_eq!(model.gets(), ["/v1/models", "/props"], "what the server was asked");
    assert!(model.requests().is_empty(), "no completion is asked of the server");

    // The text form: one line per check, the fix under a failed one, a closing count.
    let out = keel_env(home.path(), &env, &["doctor", "--context-window", "8192"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("✗ server") && l.contains("does not take tools")),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.trim_start().starts_with("fix: start llama-server with --jinja")),
        "{text}"
    );
    assert!(text.ends_with("2 problem(s) to fix\n"), "{text}");

    // Fixed: a template with tools, no window larger than the server's — ready.
    model.serve_info(
        Some(json!({"data": [{"id": "local"}]})),
        Some(json!({"default_generation_settings": {"n_ctx": 4096},
            "chat_template_caps": {"supports_tools": true, "supports_tool_calls": true}})),
    );
    let out = keel_env(home.path(), &env, &["doctor", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{:#?}", failed(&checks(&out)));
    assert_eq!(super::json_of(&out)["ok"], true);
    let details: Vec<String> = checks(&out).iter().map(|c| c["detail"].to_string()).collect();
    assert!(details.iter().any(|d| d.contains("serves `local`")), "{details:#?}");
    assert!(
        details.iter().any(|d| d.contains("the server's context is 4096 tokens")),
        "{details:#?}"
    );

    // A server that is not llama.cpp and does not serve the model asked for.
    model.serve_info(Some(json!({"data": [{"id": "gpt-a"}, {"id": "gpt-b"}]})), None);
    let out = keel_env(home.path(), &env, &["doctor", "--json"]).await;
    let bad = failed(&checks(&out));
    assert_eq!(bad.len(), 1, "{bad:#?}");
    assert!(bad[0].contains("does not serve `local`; it serves: gpt-a, gpt-b"), "{bad:#?}");
    assert!(bad[0].contains("--model gpt-a"), "{bad:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_says_where_the_server_is_not_and_what_a_bare_url_lacks() {
    let model = MockModel::start(Vec::new()).await;
    model.serve_info(Some(json!({"data": [{"id": "m"}]})), None);
    let home = tempfile::tempdir().unwrap();
    // The base URL without /v1: nothing is served at /models.
    let bare = model.url().trim_end_matches("/v1").to_string();
    let out =
        keel_env(home.path(), &[], &["doctor", "--model-url", &bare, "--model", "m", "--json"])
            .await;
    let bad = failed(&checks(&out));
    assert!(bad.iter().any(|b| b.contains(&format!("try --model-url {bare}/v1"))), "{bad:#?}");
    // Nothing listening: the fix says to start it.
    let out = keel_env(
        home.path(),
        &[],
        &["doctor", "--model-url", "http://127.0.0.1:9/v1", "--model", "m", "--json"],
    )
    .await;
    let bad = failed(&checks(&out));
    assert!(
        bad.iter().any(|b| b.contains("cannot connect") && b.contains("start the model server")),
        "{bad:#?}"
    );
    // No model at all.
    let out = keel_env(home.path(), &[], &["doctor", "--json"]).await;
    let bad = failed(&checks(&out));
    assert!(bad.iter().any(|b| b.contains("no model configured")), "{bad:#?}");
    // A telemetry collector that is not there.
    let out = keel_env(
        home.path(),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")],
        &["doctor", "--json"],
    )
    .await;
    let bad = failed(&checks(&out));
    assert!(
        bad.iter().any(|b| b.contains("telemetry")
            && b.contains("(from OTEL_EXPORTER_OTLP_ENDPOINT): cannot connect")),
        "{bad:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_prints_each_setting_with_where_it_came_from() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("keel.toml"),
        "[model]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"from-file\"\ncontext_window = 2048\n",
    )
    .unwrap();
    let env = [("KEEL_MODEL", "from-env"), ("KEEL_API_KEY", "sk-secret-value")];
    let out = keel_env(home.path(), &env, &["config", "--context-window", "1024", "--json"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = super::json_of(&out);
    let of = |key: &str| {
        v["settings"].as_array().unwrap().iter().find(|s| s["key"] == key).cloned().unwrap()
    };
    assert_eq!(of("home")["from"], "--home");
    assert_eq!(
        of("model.base_url"),
        json!({"key": "model.base_url", "value": "http://127.0.0.1:9/v1", "from": "keel.toml [model] base_url"})
    );
    assert_eq!(of("model.model")["from"], "KEEL_MODEL");
    assert_eq!(of("model.model")["value"], "from-env");
    assert_eq!(of("model.context_window")["from"], "--context-window");
    assert_eq!(of("model.context_window")["value"], "1024");
    assert_eq!(
        of("model.timeout_ms"),
        json!({"key": "model.timeout_ms", "value": "120000", "from": "default"})
    );
    assert_eq!(
        of("model.api_key"),
        json!({"key": "model.api_key", "value": "set", "from": "KEEL_API_KEY"})
    );
    assert_eq!(of("store.synchronous")["from"], "default");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("sk-secret-value"),
        "no credential's value"
    );
    // Text: key, value, source on a line.
    let out = keel_env(home.path(), &env, &["config"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("model.model ")).unwrap();
    assert!(line.contains("from-env") && line.trim_end().ends_with("KEEL_MODEL"), "{line}");
    // A setting that does not read is an error naming it.
    let out = keel_env(home.path(), &[("KEEL_CONTEXT_WINDOW", "lots")], &["config"]).await;
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("KEEL_CONTEXT_WINDOW"));
}
