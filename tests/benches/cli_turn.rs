//! A turn through the `keel` binary, side by side with LangGraph. Each keel turn is a
//! `keel session send` — a process per turn — with one read-only tool call (`csv_inspect`) and
//! a final answer, against a scripted OpenAI-compatible server on loopback. The baseline is
//! LangGraph's prebuilt ReAct agent with its SQLite checkpointer (`langgraph` 1.2.24,
//! `langgraph-checkpoint-sqlite` 3.1.2, `langchain-openai` 1.7.4, installed from PyPI into a
//! throwaway venv under `target/bench-venv`), same server, same tool written in Python, all
//! turns in one Python process. keel's turn is also timed in process (one harness, as the HTTP
//! API and `keel chat` run it), in the same run. Prints figures; asserts nothing about time.
//!
//! `cargo bench -p keel-tests --bench cli_turn`. `KEEL_BENCH_TURNS` sets the turns timed on
//! each side (default 20). fsyncs per turn are counted with `strace -f -c` when it is
//! installed (five further turns on each side), and are reported as not measured otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use keel_tests::mock_model::{MockModel, Reply};
use serde_json::{Value, json};

/// keel turns counted under strace.
const FSYNC_TURNS: usize = 10;
const ANSWER: &str = "Lines 4 and 6 are ragged.";
const PYPI: &[&str] =
    &["langgraph==1.2.24", "langgraph-checkpoint-sqlite==3.1.2", "langchain-openai==1.7.4"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Answers a request whose last message is a tool result with the answer, any other with a
/// call of `csv_inspect` — streamed or not, as the request asks.
fn responder() -> keel_tests::mock_model::Responder {
    let calls = std::sync::atomic::AtomicU64::new(0);
    Arc::new(move |body: &[u8]| {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let stream = v["stream"] == json!(true);
        let last_is_tool =
            v["messages"].as_array().and_then(|m| m.last()).is_some_and(|m| m["role"] == "tool");
        let args = r#"{"path":"/data/orders.csv","expected_columns":7}"#;
        let id = format!("call-{}", calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        match (last_is_tool, stream) {
            (true, true) => Reply::text(ANSWER),
            (false, true) => Reply::calls(&[(&id, "csv_inspect", args)]),
            (true, false) => Reply::Json(json!({"id": "x", "object": "chat.completion",
                "created": 0, "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": ANSWER}}]})),
            (false, false) => Reply::Json(json!({"id": "x", "object": "chat.completion",
                "created": 0, "model": "m", "choices": [{"index": 0, "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": null, "tool_calls": [{"id": id,
                "type": "function", "function": {"name": "csv_inspect", "arguments": args}}]}}]})),
        }
    })
}

fn keel_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(root())
        .args(["build", "--release", "-p", "keel-cli", "--bin", "keel", "--quiet"])
        .status()
        .unwrap();
    assert!(status.success(), "building the keel binary failed");
    root().join("target/release/keel")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn strace_available() -> bool {
    Command::new("strace").arg("-V").output().is_ok_and(|o| o.status.success())
}

/// fsync and fdatasync calls made by `cmd` and its children, counted by `strace -f -c`.
fn fsyncs_of(cmd: &mut Command) -> u64 {
    let out = tempfile::NamedTempFile::new().unwrap();
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    let status = Command::new("strace")
        .args(["-f", "-c", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(out.path())
        .arg(program)
        .args(args)
        .envs(cmd.get_envs().filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{cmd:?} under strace failed");
    std::fs::read_to_string(out.path())
        .unwrap()
        .lines()
        .filter(|l| l.ends_with(" fsync") || l.ends_with(" fdatasync"))
        .filter_map(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
        .sum()
}

/// The venv's python with the pinned packages, or why there is none.
fn langgraph_python() -> Result<PathBuf, String> {
    let venv = root().join("target/bench-venv");
    let python = venv.join("bin/python");
    let marker = venv.join(PYPI.join(" ").replace(['=', ' '], "_"));
    if !marker.exists() {
        let made = Command::new("python3").arg("-m").arg("venv").arg(&venv).status();
        if !made.is_ok_and(|s| s.success()) {
            return Err("python3 -m venv failed".into());
        }
        eprintln!("installing {} into {}", PYPI.join(" "), venv.display());
        let pip =
            Command::new(venv.join("bin/pip")).args(["install", "--quiet"]).args(PYPI).status();
        if !pip.is_ok_and(|s| s.success()) {
            return Err(format!("pip install {} failed", PYPI.join(" ")));
        }
        std::fs::write(&marker, "").unwrap();
    }
    Ok(python)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let turns: usize =
        std::env::var("KEEL_BENCH_TURNS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let server = MockModel::start_fn(responder()).await;
    let url = server.url();
    let keel = keel_binary();
    let data = root().join("tests/data");
    let home = tempfile::tempdir().unwrap();
    let keel_cmd = |args: &[&str]| {
        let mut c = Command::new(&keel);
        c.arg("--home").arg(home.path()).args(args);
        c
    };
    // The sessions, and the first-party tools installed and compiled: not timed. Session `b`
    // runs the loop alone, as LangGraph's agent does (`--no-preprocess`); session `u` adds the
    // task-understanding call of each input (keel's default), to show what it costs.
    let grant = format!("{}=/data:ro", data.display());
    for (session, extra) in [("b", Some("--no-preprocess")), ("u", None)] {
        let mut args = vec![
            "run",
            "inspect orders.csv",
            "--new-session",
            session,
            "--tools",
            "csv_inspect",
            "--grant",
            &grant,
            "--model-url",
            &url,
            "--model",
            "m",
        ];
        args.extend(extra);
        let out = tokio::task::block_in_place(|| keel_cmd(&args).output().unwrap());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let strace = strace_available();
    let measure = |session: &str| -> (Vec<f64>, Option<Vec<u64>>) {
        let mut ms = Vec::new();
        for i in 0..turns {
            let text = format!("inspect orders.csv, turn {i}");
            let started = Instant::now();
            let out = tokio::task::block_in_place(|| {
                keel_cmd(&["session", "send", session, &text]).output()
            })
            .unwrap();
            ms.push(started.elapsed().as_secs_f64() * 1e3);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            assert!(String::from_utf8_lossy(&out.stdout).contains(ANSWER));
        }
        // Each turn's count is kept: a turn that also checkpoints the WAL (SQLite does when
        // it passes 1000 pages) syncs the WAL and the database once more.
        let fsyncs = strace.then(|| {
            (0..FSYNC_TURNS)
                .map(|i| {
                    let text = format!("inspect orders.csv, counted turn {i}");
                    tokio::task::block_in_place(|| {
                        fsyncs_of(&mut keel_cmd(&["session", "send", session, &text]))
                    })
                })
                .collect()
        });
        (ms, fsyncs)
    };
    let (keel_ms, keel_fsyncs) = measure("b");
    let (understood_ms, understood_fsyncs) = measure("u");
    let start_ms = median(
        (0..10)
            .map(|_| {
                let started = Instant::now();
                tokio::task::block_in_place(|| keel_cmd(&["session", "list"]).output()).unwrap();
                started.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    );
    let describe = |ms: &[f64], fsyncs: Option<Vec<u64>>| {
        format!(
            "{turns} turns, median {:.1} ms per turn (min {:.1}, max {:.1}); {}",
            median(ms.to_vec()),
            ms.iter().copied().fold(f64::INFINITY, f64::min),
            ms.iter().copied().fold(0.0, f64::max),
            fsyncs
                .map(|f| format!(
                    "{:.1} fsyncs per turn (strace, {FSYNC_TURNS} turns: median {}, each {f:?})",
                    f.iter().sum::<u64>() as f64 / f.len() as f64,
                    median(f.iter().map(|&n| n as f64).collect()),
                ))
                .unwrap_or_else(|| "fsyncs not measured (no strace)".into())
        )
    };
    let keel_median = median(keel_ms.clone());
    let understood_median = median(understood_ms.clone());
    println!(
        "keel (a process per turn, `keel session send`, --no-preprocess): {}",
        describe(&keel_ms, keel_fsyncs)
    );
    println!(
        "keel with task understanding (one more model call and one more commit a turn): {}; +{:.1} ms per turn",
        describe(&understood_ms, understood_fsyncs),
        understood_median - keel_median
    );
    println!("keel start-up (`keel session list`, idle home): median {start_ms:.1} ms");

    // The same turns in process, as the HTTP API and `keel chat` run them: one harness on the
    // same home, session `b`. The first turn warms it up (not timed), as LangGraph's is not.
    let harness = keel::harness::Harness::open(
        keel::home::Home::at(home.path()).unwrap(),
        keel::sandbox::SandboxLimits::default(),
        None,
        keel::agent::LoopGuards::default(),
        &|_| {},
    )
    .await
    .unwrap();
    let mut in_process_ms = Vec::new();
    for i in 0..=turns {
        let text = format!("inspect orders.csv, in process {i}");
        let started = Instant::now();
        let ran = harness
            .send(
                &keel::api::Caller::Operator,
                "b",
                &text,
                &keel::cancel::CancelToken::new(),
                &keel_tests::no_events(),
            )
            .await
            .unwrap();
        let took = started.elapsed().as_secs_f64() * 1e3;
        assert!(format!("{ran:?}").contains(ANSWER), "{ran:?}");
        if i > 0 {
            in_process_ms.push(took);
        }
    }
    drop(harness);
    let in_process_median = median(in_process_ms.clone());
    println!(
        "keel in process (`Harness::send`, as the HTTP API and `keel chat` run a turn): {turns} turns, median {in_process_median:.2} ms per turn (min {:.2}, max {:.2})",
        in_process_ms.iter().copied().fold(f64::INFINITY, f64::min),
        in_process_ms.iter().copied().fold(0.0, f64::max),
    );

    let python = match langgraph_python() {
        Ok(p) => p,
        Err(why) => {
            println!("LangGraph baseline not measured: {why}");
            return;
        }
    };
    let script = root().join("tests/benches/langgraph_turns.py");
    let lg_dir = tempfile::tempdir().unwrap();
    let lg = |n: usize, db: &str| {
        let mut c = Command::new(&python);
        c.arg(&script).arg(&url).arg(n.to_string()).arg(lg_dir.path().join(db)).arg(&data);
        c
    };
    let out = tokio::task::block_in_place(|| lg(turns + 1, "timed.sqlite").output()).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    // The first turn warms the process up (imports, graph compile, connection): not timed, as
    // keel's first turn is not.
    let lg_ms: Vec<f64> =
        v["turn_ms"].as_array().unwrap().iter().skip(1).map(|t| t.as_f64().unwrap()).collect();
    let lg_median = median(lg_ms.clone());
    let lg_fsyncs = strace.then(|| {
        let six = tokio::task::block_in_place(|| fsyncs_of(&mut lg(6, "counted.sqlite")));
        let one = tokio::task::block_in_place(|| fsyncs_of(&mut lg(1, "once.sqlite")));
        (six.saturating_sub(one)) as f64 / 5.0
    });
    println!(
        "LangGraph (create_react_agent + SqliteSaver, one process): {turns} turns, median {lg_median:.1} ms per turn (min {:.1}, max {:.1}); {}",
        lg_ms.iter().copied().fold(f64::INFINITY, f64::min),
        lg_ms.iter().copied().fold(0.0, f64::max),
        lg_fsyncs
            .map(|f| format!("{f:.1} fsyncs per turn (strace, turns 2-6)"))
            .unwrap_or_else(|| "fsyncs not measured (no strace)".into())
    );
    println!(
        "ratio: LangGraph / keel time per turn = {:.2}x (target >= 3x); with keel's task understanding {:.2}x; in process {:.2}x (target >= 10x)",
        lg_median / keel_median,
        lg_median / understood_median,
        lg_median / in_process_median
    );
}
