//! The cost of an MCP call through keel against a direct call from the official Python SDK,
//! measured in the same run on the same machine. Prints per-call median and p90 for:
//!
//! 1. baseline — the Python SDK client calling the Python SDK server's `echo` directly;
//! 2. keel as the client — a governed `py__echo` call (ToolService chain, pinned digest
//!    check, output cap) to the same server, kept running by keel's pool;
//! 3. keel as the client, in a session — the same call as a session's direct call (runner
//!    lease, journal rows and events committed before and after);
//! 4. keel as the server — the Python SDK client calling `keel mcp serve`'s `fs_read_file` on
//!    a small file (a sandboxed component), when the `keel` binary is built
//!    (`target/release/keel`).
//!
//! Ratios are against the baseline. Asserts nothing about time. Installs the MCP peers on
//! first use (see `keel_tests::mcp_peers`).
//!
//! `cargo bench -p keel-tests --bench mcp`; `KEEL_BENCH_CALLS` sets the calls (default 300).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use keel::ids::SessionId;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use keel::api::Caller;
use keel::sandbox::CancelToken;
use keel::tools::mcp::{ServerSpec, Transport};
use keel_tests::mcp_peers::{Peers, fixture};

#[global_allocator]
static ALLOCATOR: keel::Allocator = keel::Allocator;

fn stats(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| ms[((ms.len() - 1) as f64 * p).round() as usize];
    (at(0.5), at(0.9))
}

fn python_client(n: usize, tool: &str, args: &str, command: &[&str]) -> Vec<f64> {
    let out = Command::new(Peers::get().python())
        .arg(fixture("bench_client.py"))
        .arg(n.to_string())
        .arg(tool)
        .arg(args)
        .args(command)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["ms"].as_array().unwrap().iter().map(|m| m.as_f64().unwrap()).collect()
}

fn row(name: &str, ms: Vec<f64>, base: Option<f64>) -> f64 {
    let (median, p90) = stats(ms);
    let ratio = base.map(|b| format!("{:.2}×", median / b)).unwrap_or_else(|| "1.00×".into());
    println!("{name:<58} {median:>8.3} {p90:>8.3} {ratio:>8}");
    median
}

fn main() {
    let n = std::env::var("KEEL_BENCH_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let peers = Peers::get();
    let python = peers.python().display().to_string();
    let server = fixture("server.py");
    println!("{n} calls each, after one warm-up call; milliseconds per call");
    println!("{:<58} {:>8} {:>8} {:>8}", "", "median", "p90", "ratio");

    let base = row(
        "1 Python SDK client -> Python SDK server (echo)",
        python_client(n, "echo", r#"{"text":"x"}"#, &[&python, &server]),
        None,
    );

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (via_keel, in_session) = rt.block_on(async {
        let h = keel::harness::Harness::open(
            keel::home::Home::at(home.path()).unwrap(),
            keel_tests::test_limits(),
            None,
            keel::agent::LoopGuards::default(),
            &|_| {},
        )
        .await
        .unwrap();
        let spec = ServerSpec {
            name: "py".into(),
            transport: Transport::Stdio {
                command: python.clone(),
                args: vec![server.clone()],
                env: Default::default(),
            },
            effect: Some(keel::policy::Effect::ReadOnly),
            trust_annotations: false,
            load: keel::tools::mcp::McpLoad::Always,
        };
        h.mcp_add(&Caller::Operator, spec).await.unwrap();
        let call = || {
            h.call_tool(&Caller::Operator, keel_tests::request("py__echo", r#"{"text":"x"}"#, &[]))
        };
        call().await.unwrap().report.result.unwrap();
        let mut direct = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            call().await.unwrap().report.result.unwrap();
            direct.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let mut spec = keel_tests::session_spec("http://127.0.0.1:9/v1", "b", vec![], None);
        spec.tools = Some(vec!["py__echo".into()]);
        spec.preprocess = None;
        h.create_session(&Caller::Operator, spec).await.unwrap();
        let cancel = CancelToken::new();
        let mut session = Vec::with_capacity(n);
        for i in 0..=n {
            let t = Instant::now();
            let c = h
                .internals()
                .brain
                .call_direct(
                    &SessionId::from("b"),
                    "py__echo",
                    r#"{"text":"x"}"#,
                    &cancel,
                    |_| async { None },
                )
                .await
                .unwrap();
            assert!(c.ran && c.result.is_ok(), "{c:?}");
            if i > 0 {
                session.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        (direct, session)
    });
    row("2 keel (ToolService, pinned) -> Python SDK server (echo)", via_keel, Some(base));
    row("3 keel session direct call (lease, journal) -> same server", in_session, Some(base));

    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/keel");
    if bin.exists() {
        let work = tempfile::tempdir().unwrap();
        std::fs::write(work.path().join("notes.txt"), "hello").unwrap();
        let grant = format!("{}=/work:ro", work.path().display());
        let serve_home = home.path().display().to_string();
        let bin = bin.display().to_string();
        row(
            "4 Python SDK client -> keel mcp serve (fs_read_file)",
            python_client(
                n,
                "fs_read_file",
                r#"{"path":"/work/notes.txt"}"#,
                &[&bin, "--home", &serve_home, "mcp", "serve", "--grant", &grant],
            ),
            Some(base),
        );
    } else {
        println!("4 (skipped: build the keel binary with `cargo build --release` first)");
    }
}
