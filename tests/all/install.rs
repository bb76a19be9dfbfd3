//! RELIABILITY A9–A12 and G4: what `install` refuses, and the integrity of stored components
//! and compiled artifacts.

use std::time::Duration;

use keel::sandbox::{Budget, LoadError, LoadSource, SandboxLimits};
use keel::tools::{ToolService, ToolServiceError};
use keel_tests::{assert_healthy, call, guests, service_in, test_limits};
use serde_json::json;

async fn install_err(s: &ToolService, bytes: &[u8], name: &str) -> ToolServiceError {
    s.install(bytes, name, "test", false).await.expect_err("install should be refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a9_garbage_core_modules_and_wrong_worlds_are_refused_with_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let e = install_err(&s, b"#!/bin/sh\necho hi\n", "garbage").await;
    assert!(matches!(e, ToolServiceError::Load(LoadError::NotWasm { .. })), "{e}");
    assert!(e.to_string().contains("\\0asm"), "{e}");
    let e = install_err(&s, b"\0asm\x01\0\0\0", "core").await;
    assert!(matches!(e, ToolServiceError::Load(LoadError::CoreModule)), "{e}");
    assert!(e.to_string().contains("wasm32-wasip2"), "{e}");
    let e = install_err(&s, b"\0asm\x0d\0\x01\0garbage", "broken").await;
    assert!(matches!(e, ToolServiceError::Load(LoadError::Compile { .. })), "{e}");
    let wrong = std::fs::read(guests::WRONG_WORLD_COMPONENT).unwrap();
    let e = install_err(&s, &wrong, "wrong").await;
    assert!(matches!(e, ToolServiceError::Load(LoadError::WrongWorld { .. })), "{e}");
    assert!(
        e.to_string().contains("does not export `keel:tool/tools@0.1.0`; it exports [run]"),
        "{e}"
    );
    let bad = std::fs::read(guests::BAD_SPECS_COMPONENT).unwrap();
    match install_err(&s, &bad, "bad").await {
        ToolServiceError::InvalidSpecs { problems } => {
            assert_eq!(problems.len(), 4, "{problems:#?}");
            assert!(problems[0].contains("`dup` is described twice"));
            assert!(problems[1].contains("\"Not A Name\" is not well-formed"));
            assert!(problems[2].contains("`not_json`: input schema is not JSON"));
            assert!(problems[3].contains("`not_object`: input schema must describe an object"));
        }
        other => panic!("expected invalid specs, got {other}"),
    }
    let hostile = std::fs::read(guests::HOSTILE_COMPONENT).unwrap();
    let e = install_err(&s, &hostile, "Bad Name").await;
    assert!(matches!(e, ToolServiceError::InvalidComponentName { .. }), "{e}");
    let e = install_err(&s, &hostile, "other-name").await;
    match e {
        ToolServiceError::NameClash { clashes } => {
            assert!(clashes.contains(&("echo".into(), "hostile".into())))
        }
        other => panic!("expected a name clash, got {other}"),
    }
    // Nothing refused was recorded.
    let names: Vec<String> = s.components().unwrap().into_iter().map(|c| c.name).collect();
    assert_eq!(names, ["control", "csv", "fs", "hostile", "http"]);
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a10_ungranted_imports_are_refused_before_compiling_listing_them() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let http = std::fs::read(guests::HTTP_IMPORT_COMPONENT).unwrap();
    match install_err(&s, &http, "http-server").await {
        ToolServiceError::Load(LoadError::UngrantedImports { imports }) => assert_eq!(
            imports,
            [(
                "wasi:http/incoming-handler@9.9.9".to_string(),
                "a tool sends HTTP requests (wasi:http/outgoing-handler); it does not serve them"
            )]
        ),
        other => panic!("expected ungranted imports, got {other}"),
    }
    let vault = std::fs::read(guests::VAULT_IMPORT_COMPONENT).unwrap();
    let e = install_err(&s, &vault, "vault").await;
    assert!(e.to_string().contains("`keel:vault/secrets@0.1.0` (this host interface is only linked for trusted control tools)"), "{e}");
    // Refused from the bytes, before a compile: the artifact cache holds nothing for them.
    for bytes in [&http, &vault] {
        let digest = keel::sandbox::sha256_hex(bytes);
        let cached = walk_names(&dir.path().join("cache"));
        assert!(!cached.iter().any(|n| n.contains(&digest)), "{cached:?}");
    }
    assert_healthy(&s).await;
}

fn walk_names(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(e.file_name().to_string_lossy().into_owned());
        if e.file_type().unwrap().is_dir() {
            out.extend(walk_names(&e.path()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a10_a_link_refusal_names_every_missing_function() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let bytes = std::fs::read(guests::MISSING_FUNCS_COMPONENT).unwrap();
    match install_err(&s, &bytes, "missing").await {
        ToolServiceError::Load(LoadError::Link { missing, .. }) => assert_eq!(
            missing,
            [
                "`wasi:cli/environment@0.9.0`: `get-arguments` (function implementation is missing)",
                "`wasi:cli/environment@0.9.0`: `get-secret-key` (function implementation is missing)",
                "`wasi:cli/environment@0.9.0`: `get-host-name` (function implementation is missing)",
            ]
        ),
        other => panic!("expected a link refusal, got {other}"),
    }
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a10_sockets_are_linked_but_every_socket_operation_fails() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let sockets = std::fs::read(guests::SOCKETS_COMPONENT).unwrap();
    s.install(&sockets, "sockets", "test", false).await.unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let input = json!({"addr": addr, "name": "localhost"});
    let out = call(&s, "connect", input, &[], Budget::default()).await;
    let got = out.report.result.unwrap();
    for op in ["tcp_connect", "tcp_listen", "udp_bind", "lookup"] {
        assert_ne!(got[op], "ok", "{op}: {got}");
    }
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "a connection reached the host");
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a11_tampered_artifact_is_detected_and_recompiled_never_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let digest = {
        let s = service_in(dir.path(), test_limits()).await;
        s.component_for("hostile").unwrap().0.digest
    };
    let cache =
        std::fs::read_dir(dir.path().join("cache")).unwrap().next().unwrap().unwrap().path();
    let artifact = cache.join(format!("{digest}.cwasm"));
    // Flip bytes in the middle of the artifact: same size, different content.
    let mut bytes = std::fs::read(&artifact).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0xff;
    }
    std::fs::write(&artifact, &bytes).unwrap();
    let s = ToolService::open(keel::home::Home::at(dir.path()).unwrap(), test_limits(), &|_| {})
        .await
        .unwrap();
    match s.prepared(&digest).unwrap().1 {
        Some(LoadSource::Recompiled { reason, .. }) => {
            assert!(reason.contains("does not match its recorded digest"), "{reason}")
        }
        other => panic!("expected a recompile, got {other:?}"),
    }
    assert_healthy(&s).await;
    // The artifact of another component swapped in is caught the same way.
    let csv = s.component_for("csv").unwrap().0.digest;
    std::fs::copy(cache.join(format!("{csv}.cwasm")), &artifact).unwrap();
    let s = ToolService::open(keel::home::Home::at(dir.path()).unwrap(), test_limits(), &|_| {})
        .await
        .unwrap();
    assert!(matches!(s.prepared(&digest).unwrap().1, Some(LoadSource::Recompiled { .. })));
    // And a clean artifact is used as it is.
    let s = ToolService::open(keel::home::Home::at(dir.path()).unwrap(), test_limits(), &|_| {})
        .await
        .unwrap();
    assert_eq!(s.prepared(&digest).unwrap().1, Some(LoadSource::Cache));
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g4_a_modified_component_file_is_refused_before_compile() {
    let dir = tempfile::tempdir().unwrap();
    let digest =
        service_in(dir.path(), test_limits()).await.component_for("hostile").unwrap().0.digest;
    let wasm = dir.path().join("components").join(format!("{digest}.wasm"));
    let mut bytes = std::fs::read(&wasm).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&wasm, &bytes).unwrap();
    for entry in std::fs::read_dir(dir.path().join("cache")).unwrap() {
        std::fs::remove_dir_all(entry.unwrap().path()).unwrap();
    }
    let s = ToolService::open(keel::home::Home::at(dir.path()).unwrap(), test_limits(), &|_| {})
        .await
        .unwrap();
    let input = json!({"text": "x"}).to_string();
    match keel_tests::try_call(&s, "echo", &input).await {
        Err(ToolServiceError::Load(LoadError::DigestMismatch { expected, .. })) => {
            assert_eq!(expected, digest)
        }
        other => panic!("expected a digest mismatch, got {:?}", other.map(|o| o.report.result)),
    }
    // Other tools are unaffected.
    let out = call(&s, "fs_list_dir", json!({"path": "/"}), &[], Budget::default()).await;
    assert!(out.report.result.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a12_oversized_and_slow_compiles_are_bounded() {
    let hostile = std::fs::read(guests::HOSTILE_COMPONENT).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let small = SandboxLimits { max_component_bytes: 100_000, ..test_limits() };
    let s = ToolService::open(keel::home::Home::at(dir.path()).unwrap(), small, &|_| {}).await;
    // The first-party components are larger than 100 kB, so even opening is refused, typed.
    match s {
        Err(ToolServiceError::Load(LoadError::TooLarge { limit, .. })) => {
            assert_eq!(limit, 100_000)
        }
        other => panic!("expected too large, got {:?}", other.err()),
    }
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let sandbox = keel::sandbox::Sandbox::new(
        &dir.path().join("cache2"),
        SandboxLimits { compile_timeout: Duration::from_millis(1), ..test_limits() },
    )
    .unwrap();
    match sandbox.compile(&hostile) {
        Err(LoadError::CompileTimeout { limit }) => assert_eq!(limit, Duration::from_millis(1)),
        other => panic!("expected a compile timeout, got {:?}", other.err()),
    }
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reinstall_replaces_and_remove_forgets() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let hostile = std::fs::read(guests::HOSTILE_COMPONENT).unwrap();
    let again = s.install(&hostile, "hostile", "test", false).await.unwrap();
    assert_eq!(again.replaced, None);
    assert!(matches!(s.remove("fs"), Err(ToolServiceError::Builtin { .. })));
    let (component, tools) = s.remove("echo").unwrap();
    assert_eq!(component.name, "hostile");
    assert!(tools.contains(&"spin".to_string()));
    assert!(!dir.path().join("components").join(format!("{}.wasm", component.digest)).exists());
    let input = json!({"text": "x"}).to_string();
    match keel_tests::try_call(&s, "echo", &input).await {
        Err(ToolServiceError::NotInstalled { name, available }) => {
            assert_eq!(name, "echo");
            assert!(available.contains("fs_read_file"));
        }
        other => panic!("expected not installed, got {:?}", other.map(|o| o.report.result)),
    }
}

/// The in-memory catalog survives other connections' commits that leave the catalog alone
/// (a session's commits), and sees a component installed or removed by another process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_cache_follows_the_catalog_not_every_commit() {
    let dir = tempfile::tempdir().unwrap();
    let a = service_in(dir.path(), test_limits()).await;
    a.resolve("echo").unwrap();
    let loads = a.catalog_loads();
    let loaded = vec!["echo".to_string(), "fs_read_file".to_string()];
    let tools = a.tools_json(&loaded).unwrap();
    // Another connection commits facts that are not the catalog.
    let db = keel_tests::db_of(&dir.path().join("keel.db"));
    let engine = keel::session::SessionEngine::new(db, keel::harness::REACTIONS);
    for i in 0..5 {
        engine
            .create(keel::session::NewSession {
                pins: Default::default(),
                user: None,
                named_tools: true,
                owner: None,
                id: Some(format!("s{i}")),
                grants: Vec::new(),
                net: Default::default(),
                tools: loaded.clone(),
                policy: keel::session::Policy::default(),
                budget: Budget::default(),
                model: keel::model::ModelConfig::new("http://127.0.0.1:9/v1", "m"),
                system_prompt: "p".into(),
                guards: None,
                preprocess: None,
            })
            .await
            .unwrap();
        a.resolve("echo").unwrap();
    }
    assert_eq!(a.catalog_loads(), loads, "session commits do not reload the catalog");
    assert!(std::sync::Arc::ptr_eq(&tools, &a.tools_json(&loaded).unwrap()), "schemas reused");
    // Another process installs a component: the first service sees its tools at once.
    let b = ToolService::open(keel::home::Home::at(dir.path()).unwrap(), test_limits(), &|_| {})
        .await
        .unwrap();
    let effects = std::fs::read(guests::EFFECTS_COMPONENT).unwrap();
    b.install(&effects, "effects", "test", false).await.unwrap();
    assert_eq!(a.resolve("effect_peek").unwrap().record.component, "effects");
    assert_eq!(a.catalog_loads(), loads + 1);
    let with_peek = vec!["effect_peek".to_string()];
    assert!(a.tools_json(&with_peek).unwrap().contains("effect_peek"));
    // …and removes it: gone for the first service too.
    b.remove("effects").unwrap();
    assert!(matches!(a.resolve("effect_peek"), Err(ToolServiceError::NotInstalled { .. })));
    assert_eq!(a.tools_json(&with_peek), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h5_first_party_names_are_reserved_and_replacing_needs_an_upgrade() {
    use keel::tools::InstallMode;
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let fs_digest = s.component_for("fs").unwrap().0.digest;
    let effects = std::fs::read(guests::EFFECTS_COMPONENT).unwrap();
    for mode in [InstallMode::New, InstallMode::Upgrade] {
        let e = s.install_as(&effects, "fs", "download", mode).await.unwrap_err();
        assert!(matches!(e, ToolServiceError::Reserved { .. }), "{e}");
    }
    assert_eq!(s.component_for("fs").unwrap().0.digest, fs_digest);
    // Another file under an installed name: refused without --upgrade, nothing changes.
    let hostile_digest = s.component_for("hostile").unwrap().0.digest;
    let e = s.install_as(&effects, "hostile", "download", InstallMode::New).await.unwrap_err();
    assert!(matches!(e, ToolServiceError::AlreadyInstalled { .. }), "{e}");
    assert!(e.to_string().contains("--upgrade"), "{e}");
    assert_eq!(s.component_for("echo").unwrap().0.digest, hostile_digest);
    // The same file again is not a replacement.
    let hostile = std::fs::read(guests::HOSTILE_COMPONENT).unwrap();
    let again = s.install_as(&hostile, "hostile", "test", InstallMode::New).await.unwrap();
    assert_eq!((again.replaced, again.upgrade), (None, None));
    // With --upgrade alone: refused, since the new version offers tools the old did not.
    let e = s.install_as(&effects, "hostile", "download", InstallMode::Upgrade).await.unwrap_err();
    assert!(
        matches!(&e, ToolServiceError::Wider { changes, .. } if changes.contains(&"new tool `effect_peek`".to_string())),
        "{e}"
    );
    assert_eq!(s.component_for("echo").unwrap().0.digest, hostile_digest);
    // With --upgrade --accept-wider: the old and new digests and what changed, tool by tool.
    let r = s.install_as(&effects, "hostile", "download", InstallMode::UpgradeWider).await.unwrap();
    let u = r.upgrade.unwrap();
    assert!(u.widened.tools.contains(&"effect_peek".to_string()), "{u:?}");
    assert_eq!(
        (u.old_digest.as_str(), u.new_digest.as_str()),
        (hostile_digest.as_str(), r.component.digest.as_str())
    );
    assert!(u.changed.is_empty());
    assert!(u.added.contains(&"effect_append".to_string()), "{u:?}");
    assert!(u.removed.contains(&"echo".to_string()), "{u:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_written_with_plain_wit_bindgen_installs_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(dir.path(), test_limits()).await;
    let bytes = std::fs::read(guests::PLAIN_BINDGEN_COMPONENT).unwrap();
    s.install(&bytes, "plain", "test", false).await.unwrap();
    let out = call(&s, "upper", json!({"text": "keel"}), &[], Budget::default()).await;
    assert_eq!(out.report.result, Ok(json!({"text": "KEEL"})));
    assert_eq!(out.report.logs.len(), 1);
}

/// The tool author's loop: a component file is compiled once. Its second call, an inspect and
/// an install of the same bytes load its artifact from the cache; a tampered artifact is
/// compiled again, never loaded; and of the files that are not installed, only the last
/// `FILE_ARTIFACTS_KEPT` keep their artifacts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_file_is_compiled_once_then_loaded_from_its_checked_artifact() {
    use keel::tools::FILE_ARTIFACTS_KEPT;
    let dir = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("n.md"), "a\nb\n").unwrap();
    let grants = [keel::sandbox::Grant::new(ws.path(), "/w", keel::sandbox::Access::Ro).unwrap()];
    let s = service_in(dir.path(), test_limits()).await;
    let bytes = std::fs::read(guests::SUMMARY_V1_COMPONENT).unwrap();
    let call_file = |bytes: Vec<u8>| {
        let (s, grants) = (&s, &grants);
        async move {
            let req = keel_tests::request("note_summary", r#"{"path":"/w/n.md"}"#, grants);
            let out = s.call_file(&bytes, "summary", req).await.unwrap();
            assert_eq!(out.report.result.as_ref().unwrap()["lines"], 2, "{:?}", out.report.result);
            out.compiled_ms
        }
    };
    let compiles = || s.sandbox().compiles();
    let before = compiles();
    assert!(call_file(bytes.clone()).await.is_some(), "the first call compiles");
    assert_eq!(compiles(), before + 1);
    assert!(s.file_compiled(&bytes).unwrap());
    assert_eq!(call_file(bytes.clone()).await, None, "the second loads the artifact");
    assert!(s.inspect_file(&bytes, "summary").await.accepted);
    assert_eq!(compiles(), before + 1, "nor does an inspect compile");
    // A tampered artifact is not loaded: compiled again.
    let digest = keel::digest::sha256_hex(&bytes);
    let cache =
        std::fs::read_dir(dir.path().join("cache")).unwrap().next().unwrap().unwrap().path();
    let artifact = cache.join(format!("{digest}.cwasm"));
    let mut tampered = std::fs::read(&artifact).unwrap();
    let mid = tampered.len() / 2;
    tampered[mid] ^= 0xff;
    std::fs::write(&artifact, &tampered).unwrap();
    assert!(call_file(bytes.clone()).await.is_some(), "a tampered artifact is compiled again");
    assert_eq!(compiles(), before + 2);
    // Installing the same bytes compiles nothing either.
    s.install(&bytes, "summary", "summary.wasm", false).await.unwrap();
    assert_eq!(compiles(), before + 2);
    // Other files (the same component, signed by other keys: other bytes) each compile; only
    // the last ones keep an artifact, and an installed component always keeps its own.
    let cached = || {
        std::fs::read_dir(&cache)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "cwasm"))
            .count()
    };
    let installed = cached();
    for _ in 0..FILE_ARTIFACTS_KEPT + 2 {
        let (_, secret) = keel::signing::generate();
        let signed = keel::signing::sign(&bytes, &secret).unwrap();
        assert!(call_file(signed).await.is_some());
    }
    assert_eq!(cached(), installed + FILE_ARTIFACTS_KEPT);
    assert!(artifact.exists(), "the installed component's artifact stays");
    assert_healthy(&s).await;
}

/// A component compiled for a call (its artifact gone) is compiled with the calling worker's
/// other tasks handed to another thread first: with a single async worker, a task that ticks
/// every 10 ms — as a runner's lease heartbeat does, every third of the TTL — keeps ticking
/// through the compile instead of waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_compile_for_a_call_holds_up_no_other_task() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    drop(service_in(dir.path(), test_limits()).await);
    std::fs::remove_dir_all(dir.path().join("cache")).unwrap();
    let s = ToolService::open(keel::home::Home::at(dir.path()).unwrap(), test_limits(), &|_| {})
        .await
        .unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("n.md"), "a\nb\n").unwrap();
    let grants = [keel::sandbox::Grant::new(ws.path(), "/w", keel::sandbox::Access::Ro).unwrap()];
    let worst = Arc::new(AtomicU64::new(0));
    let ticker = tokio::spawn({
        let worst = worst.clone();
        async move {
            loop {
                let t = std::time::Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                worst.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = s.sandbox().compiles();
    // The call runs as a task on the one worker, as a session's turn does.
    let s = Arc::new(s);
    let call = tokio::spawn({
        let s = s.clone();
        async move {
            let started = std::time::Instant::now();
            let req = keel_tests::request("fs_read_file", r#"{"path":"/w/n.md"}"#, &grants);
            let out = s.call(req).await.unwrap();
            (out, started.elapsed())
        }
    });
    let (out, took) = call.await.unwrap();
    ticker.abort();
    assert!(out.report.result.is_ok(), "{:?}", out.report.result);
    assert_eq!(s.sandbox().compiles(), before + 1, "the call compiled its component");
    let worst = Duration::from_micros(worst.load(Ordering::Relaxed));
    eprintln!("a call that compiled took {took:?}; the longest tick meanwhile {worst:?} (10 ms)");
    assert!(worst < took / 2, "a tick waited {worst:?} for a call of {took:?}");
}
