//! Shared fixtures of keel's integration tests: paths of the test guest components (built by
//! `build.rs`), and helpers to open a ToolService on a temporary home.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel::ids::SessionId;
use std::path::Path;
use std::sync::OnceLock;

use keel::home::Home;
use keel::sandbox::{Budget, Grant, SandboxLimits};
use keel::tools::{CallOutcome, CallRequest, ToolService};

pub mod hostile_registry;
pub mod mcp_peers;
pub mod mock_model;
pub mod oci_registry;
pub mod postgres;
pub mod telemetry_peers;
pub mod web_peer;

/// Paths of the test guest components.
pub mod guests {
    include!(concat!(env!("OUT_DIR"), "/guests.rs"));
}

/// Whether the suite runs on PostgreSQL (`KEEL_TEST_POSTGRES`, set by `with-postgres`): a
/// test of what only the SQLite store has — its file, its pragmas, its disk-full behaviour —
/// returns early there (it says so on stderr).
pub fn on_postgres(test: &str) -> bool {
    let on = std::env::var_os("KEEL_TEST_POSTGRES").is_some_and(|v| !v.is_empty());
    if on {
        #[allow(clippy::print_stderr)]
        {
            eprintln!("{test}: SQLite only, skipped on PostgreSQL");
        }
    }
    on
}

/// The store of the home whose SQLite file would be `db` (`HOME/keel.db`): that file, or the
/// home's PostgreSQL database when the suite runs on PostgreSQL — a connection for a test that
/// reads or alters what keel stored.
pub fn store_of(db: &Path) -> keel::sql::Connection {
    keel::store::connect(&location_of(db)).unwrap()
}

/// Like [`store_of`], a database writer and read pool ([`keel::store::Db`]).
pub fn db_of(db: &Path) -> keel::store::Db {
    keel::store::Db::open_at(&location_of(db)).unwrap()
}

fn location_of(db: &Path) -> keel::store::Location {
    let home = Home::at(db.parent().unwrap()).unwrap();
    keel::config::store_location(&home).unwrap()
}

/// Limits for test sandboxes: a small pool, so many sandboxes fit in one test process.
pub fn test_limits() -> SandboxLimits {
    SandboxLimits { max_concurrent_calls: 16, ..SandboxLimits::default() }
}

/// A ToolService on a fresh home in `dir`, with the `hostile` guest installed.
pub async fn service_in(dir: &Path, limits: SandboxLimits) -> ToolService {
    let home = Home::at(dir).unwrap();
    let service = ToolService::open(home, limits, &|_| {}).await.unwrap();
    let bytes = std::fs::read(guests::HOSTILE_COMPONENT).unwrap();
    service.install(&bytes, "hostile", "test", false).await.unwrap();
    service
}

/// One ToolService shared by the tests of this process (its home lives as long as it does).
pub async fn shared() -> &'static ToolService {
    static HOME: OnceLock<tempfile::TempDir> = OnceLock::new();
    static SERVICE: tokio::sync::OnceCell<ToolService> = tokio::sync::OnceCell::const_new();
    let dir = HOME.get_or_init(|| tempfile::tempdir().unwrap());
    SERVICE.get_or_init(|| service_in(dir.path(), test_limits())).await
}

/// Calls `tool` with `input` under `budget` and `grants`; panics if the call is refused
/// before it runs.
/// A request for one call of `tool` with `input`, outside any session: `grants`, no network,
/// the default budget.
pub fn request<'a>(tool: &'a str, input: &'a str, grants: &'a [Grant]) -> CallRequest<'a> {
    CallRequest {
        tool,
        input,
        grants,
        net: keel::sandbox::net::NetGrants::none(),
        budget: Budget::default(),
        cancel: None,
        loaded: None,
        policy: None,
        approval: None,
        control: None,
    }
}

pub async fn call(
    service: &ToolService,
    tool: &str,
    input: serde_json::Value,
    grants: &[Grant],
    budget: Budget,
) -> CallOutcome {
    let input = input.to_string();
    let req = CallRequest { budget, ..request(tool, &input, grants) };
    service.call(req).await.unwrap()
}

/// Calls `tool` with the raw `input` text, no grants, default budget; returns the service's
/// answer as it is (refusals included).
pub async fn try_call(
    service: &ToolService,
    tool: &str,
    input: &str,
) -> Result<CallOutcome, keel::tools::ToolServiceError> {
    try_call_net(service, tool, input, keel::sandbox::net::NetGrants::none(), Budget::default())
        .await
}

/// Calls `tool` with the raw `input` text, no directory grants, network grants `net` and
/// `budget`; returns the service's answer as it is (refusals included).
pub async fn try_call_net(
    service: &ToolService,
    tool: &str,
    input: &str,
    net: &keel::sandbox::net::NetGrants,
    budget: Budget,
) -> Result<CallOutcome, keel::tools::ToolServiceError> {
    try_call_in(service, tool, input, &[], net, budget).await
}

/// Calls `tool` with the raw `input` text under `grants`, `net` and `budget`; returns the
/// service's answer as it is (refusals included).
pub async fn try_call_in(
    service: &ToolService,
    tool: &str,
    input: &str,
    grants: &[Grant],
    net: &keel::sandbox::net::NetGrants,
    budget: Budget,
) -> Result<CallOutcome, keel::tools::ToolServiceError> {
    let req = CallRequest {
        tool,
        input,
        grants,
        net,
        budget,
        cancel: None,
        loaded: None,
        policy: None,
        approval: None,
        control: None,
    };
    service.call(req).await
}

/// Asserts that the service still serves a normal call: the host is alive and healthy.
pub async fn assert_healthy(service: &ToolService) {
    let out =
        call(service, "echo", serde_json::json!({"text": "still alive"}), &[], Budget::default())
            .await;
    assert_eq!(out.report.result, Ok(serde_json::json!({"text": "still alive"})));
}

/// A harness (the whole owner spine) on a fresh home in `dir`, with the `hostile` guest
/// installed, and a session `id` whose model is `url`, loading `tools`, granting `grants`.
pub async fn harness_with_session(
    dir: &Path,
    url: &str,
    id: &str,
    tools: &[&str],
    grants: Vec<Grant>,
    guards: keel::agent::LoopGuards,
) -> keel::harness::Harness {
    let home = Home::at(dir).unwrap();
    let h = keel::harness::Harness::open(home, test_limits(), None, guards, &|_| {}).await.unwrap();
    if h.internals().tools.resolve("echo").is_err() {
        let bytes = std::fs::read(guests::HOSTILE_COMPONENT).unwrap();
        h.internals().tools.install(&bytes, "hostile", "test", false).await.unwrap();
    }
    if !h.internals().engine.exists(&SessionId::from(id)).await.unwrap() {
        let mut model = keel::model::ModelConfig::new(url, "test-model");
        model.max_retries = 2;
        model.timeout_ms = 10_000;
        create_session(&h, id, tools, grants, model).await;
    }
    h
}

/// Creates session `id` on `h` with `tools` loaded and the model settings `model` (no
/// grants, the default policy, a 20 s deadline per call).
pub async fn session_with_model(
    h: &keel::harness::Harness,
    id: &str,
    tools: &[&str],
    model: keel::model::ModelConfig,
) {
    create_session(h, id, tools, Vec::new(), model).await;
}

/// Creates session `id` on `h` with `tools` loaded, the model at `url`, and task
/// understanding off.
pub async fn plain_session(h: &keel::harness::Harness, id: &str, tools: &[&str], url: &str) {
    create_with(h, id, tools, Vec::new(), keel::model::ModelConfig::new(url, "test-model"), false)
        .await;
}

async fn create_session(
    h: &keel::harness::Harness,
    id: &str,
    tools: &[&str],
    grants: Vec<Grant>,
    model: keel::model::ModelConfig,
) {
    create_with(h, id, tools, grants, model, true).await;
}

async fn create_with(
    h: &keel::harness::Harness,
    id: &str,
    tools: &[&str],
    grants: Vec<Grant>,
    model: keel::model::ModelConfig,
    understand: bool,
) {
    h.internals()
        .engine
        .create(keel::session::NewSession {
            pins: Default::default(),
            user: None,
            named_tools: true,
            owner: None,
            id: Some(id.to_string()),
            grants,
            net: Default::default(),
            tools: tools.iter().map(|t| t.to_string()).collect(),
            policy: keel::session::Policy::default(),
            budget: Budget { timeout: std::time::Duration::from_secs(20), ..Budget::default() },
            preprocess: understand
                .then(|| keel::understand::PreprocessConfig::from_business(&model)),
            model,
            system_prompt: "You are a test agent.".into(),
            guards: None,
        })
        .await
        .unwrap();
}

/// An event sink that drops events.
pub fn no_events() -> keel::agent::Events {
    std::sync::Arc::new(|_: &keel::agent::Event| {})
}

/// Installs the effect-counting guest (`effect_append`, `effect_send`, `effect_put`,
/// `effect_wipe`, `effect_peek`) into the harness's home if it is not there yet.
pub async fn install_effects(h: &keel::harness::Harness) {
    if h.internals().tools.resolve("effect_append").is_err() {
        let bytes = std::fs::read(guests::EFFECTS_COMPONENT).unwrap();
        h.internals().tools.install(&bytes, "effects", "test", false).await.unwrap();
    }
}

/// The lines of `name` in `dir` (an effect log), empty if it does not exist.
/// Xorshift: the random choices of the kill tests, replayable from their printed seed.
pub struct Rng(u64);

impl Rng {
    /// Seeded from `KEEL_CRASH_SEED`, or from the clock; the seed is returned to be printed.
    pub fn from_env() -> (Self, u64) {
        let seed = std::env::var("KEEL_CRASH_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
                    | 1
            });
        (Self(seed), seed)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

pub fn log_lines(dir: &Path, name: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join(name))
        .map(|t| t.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Creates session `id` on `h` directly on the engine: the model at `url` with context window
/// `window` and no retries, `tools` (named), `grants`, `policy`, a 20 s deadline per call, 40
/// steps a turn, task understanding off.
pub async fn windowed_session(
    h: &keel::harness::Harness,
    id: &str,
    url: &str,
    window: Option<u64>,
    tools: &[&str],
    grants: Vec<Grant>,
    policy: keel::session::Policy,
) {
    let mut model = keel::model::ModelConfig::new(url, "test-model");
    model.context_window = window;
    model.max_retries = 0;
    h.internals()
        .engine
        .create(keel::session::NewSession {
            pins: Default::default(),
            id: Some(id.into()),
            grants,
            net: Default::default(),
            tools: tools.iter().map(|t| t.to_string()).collect(),
            policy,
            budget: keel::sandbox::Budget {
                timeout: std::time::Duration::from_secs(20),
                ..keel::sandbox::Budget::default()
            },
            model,
            system_prompt: "You are a test agent.".into(),
            guards: Some(keel::agent::LoopGuards { max_steps: 40, ..Default::default() }),
            preprocess: None,
            user: None,
            named_tools: true,
            owner: None,
        })
        .await
        .unwrap();
}

/// A session's settings for the use-case API: id `id`, these grants and tools, the default
/// policy and budget, the model at `url`, at most five steps a turn.
pub fn session_spec(
    url: &str,
    id: &str,
    grants: Vec<keel::sandbox::Grant>,
    tools: Option<Vec<String>>,
) -> keel::api::SessionSpec {
    keel::api::SessionSpec {
        id: Some(id.into()),
        grants,
        net: Default::default(),
        tools,
        allow: Vec::new(),
        ask: Vec::new(),
        deny: Vec::new(),
        redact: Vec::new(),
        budget: keel::sandbox::Budget::default(),
        model: keel::model::ModelConfig::new(url, "m"),
        system_prompt: "You are a test agent.".into(),
        project_instructions: true,
        guards: keel::agent::LoopGuards { max_steps: 5, ..keel::agent::LoopGuards::default() },
        preprocess: Some(keel::understand::PreprocessConfig::from_business(
            &keel::model::ModelConfig::new(url, "m"),
        )),
        user: None,
        owner: None,
        main: None,
    }
}

/// The system text of a request body the scripted server received: its system message and
/// the notes message after it (goals, plan, summary, memories), if any, joined.
pub fn system_of(body: &[u8]) -> String {
    request_messages(body)[0]["content"].as_str().unwrap().to_string()
}

/// The messages of a request body with its leading system messages (the instructions, then
/// the notes) joined into one, as a server that accepts one system message gets them.
pub fn request_messages(body: &[u8]) -> Vec<serde_json::Value> {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    let mut msgs = v["messages"].as_array().unwrap().clone();
    let leading = msgs.iter().take_while(|m| m["role"] == "system").count();
    if leading > 1 {
        let text: Vec<&str> =
            msgs[..leading].iter().map(|m| m["content"].as_str().unwrap()).collect();
        let joined = text.join("\n\n");
        msgs.splice(..leading, [serde_json::json!({"role": "system", "content": joined})]);
    }
    msgs
}

/// The answer a turn ended with (panics on any other outcome).
pub fn answered(s: keel::brain::Submitted) -> String {
    match s {
        keel::brain::Submitted::Ran(keel::agent::TurnOutcome::Answer(a)) => a,
        other => panic!("expected an answer, got {other:?}"),
    }
}
