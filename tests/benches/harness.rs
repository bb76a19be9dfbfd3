//! Harness overhead per step against a zero-latency scripted model server on loopback, one
//! governed tool call per step, `synchronous=FULL`. Prints figures; asserts nothing about time.
//!
//! `cargo bench -p keel-tests --bench harness`. `KEEL_BENCH_STEPS` sets the steps of each
//! session's turn (default 25), `KEEL_BENCH_SESSIONS` the concurrent sessions (default 64).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use keel::agent::LoopGuards;
use keel::sandbox::{Access, CancelToken, Grant};
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::{harness_with_session, no_events};

fn cpu_time() -> Duration {
    // utime + stime of this process, in clock ticks (100 Hz on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<u64> = after.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // Fields after the command: state(0, not numeric) ... utime is field 14 overall → index 11 here.
    let ticks = f.get(10).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Answers a request with a tool call until the request holds `steps` tool results, then with
/// a final answer.
fn responder(
    tool: &'static str,
    args: &'static str,
    steps: usize,
) -> keel_tests::mock_model::Responder {
    Arc::new(move |body: &[u8]| {
        // Count the tool results in the request (each is `{"role":"tool",…}`).
        let needle = b"\"role\":\"tool\"";
        let results = body.windows(needle.len()).filter(|w| w == needle).count();
        if results >= steps {
            Reply::text("done")
        } else {
            Reply::calls(&[(&format!("call_{results}"), tool, args)])
        }
    })
}

struct Figures {
    steps: usize,
    wall: Duration,
    cpu: Duration,
    commits: u64,
}

async fn run(
    sessions: usize,
    concurrent: bool,
    steps: usize,
    tool: &'static str,
    args: &'static str,
    ws: &std::path::Path,
) -> Figures {
    let model = MockModel::start_fn(responder(tool, args, steps)).await;
    let home = tempfile::tempdir().unwrap();
    let grants = vec![Grant::new(ws, "/w", Access::Rw).unwrap()];
    let guards =
        LoopGuards { max_steps: steps as u32 + 2, max_repeats: 1000, ..LoopGuards::default() };
    let mut harnesses = Vec::new();
    for i in 0..sessions {
        let h = harness_with_session(
            home.path(),
            &model.url(),
            &format!("b{i}"),
            &[tool],
            grants.clone(),
            guards.clone(),
        )
        .await;
        harnesses.push(h);
    }
    // One harness (one writer) serves every session, as one host process would.
    let h = harnesses.swap_remove(0);
    drop(harnesses);
    let commits0 = h.db.stats().commits.load(Ordering::Relaxed);
    let cpu0 = cpu_time();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..sessions {
        let h = h.clone();
        let task = tokio::spawn(async move {
            let r = h.brain.submit(&format!("b{i}"), "go", &CancelToken::new(), &no_events()).await;
            let r = r.unwrap();
            assert!(
                matches!(r, keel::brain::Submitted::Ran(keel::agent::TurnOutcome::Answer(_))),
                "{r:?}"
            );
        });
        if concurrent {
            tasks.push(task);
        } else {
            task.await.unwrap();
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let wall = started.elapsed();
    Figures {
        steps: sessions * steps,
        wall,
        cpu: cpu_time() - cpu0,
        commits: h.db.stats().commits.load(Ordering::Relaxed) - commits0,
    }
}

/// Commits every turn makes besides its steps: input with the runner lease, turn start, lease
/// release.
const PER_TURN_COMMITS: f64 = 3.0;

fn print(label: &str, f: &Figures, sessions: usize) {
    let steps = f.steps as f64;
    println!(
        "{label:<44} {:>5} steps {:>7.0} steps/s {:>7.1} µs CPU/step {:>5.2} fsyncs/step ({:.2} with per-turn commits)",
        f.steps,
        steps / f.wall.as_secs_f64(),
        f.cpu.as_secs_f64() * 1e6 / steps,
        (f.commits as f64 - PER_TURN_COMMITS * sessions as f64).max(0.0) / steps,
        f.commits as f64 / steps,
    );
}

fn main() {
    // Every run uses the same turn shape: one turn of `steps` steps per session.
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let steps = env("KEEL_BENCH_STEPS", 25);
    let sessions = env("KEEL_BENCH_SESSIONS", 64);
    let serial = 8;
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha").unwrap();
    println!(
        "keel harness benchmark: one turn of {steps} steps per session, one governed tool call per step, synchronous=FULL"
    );
    println!("(CPU includes the in-process model server)");
    let echo = r#"{"text":"hi"}"#;
    let write = r#"{"path":"/w/out.txt","content":"x"}"#;
    let one_ro = rt.block_on(run(serial, false, steps, "echo", echo, ws.path()));
    print(&format!("1 session at a time ({serial} in turn), read-only"), &one_ro, serial);
    let one_rw = rt.block_on(run(serial, false, steps, "write", write, ws.path()));
    print(&format!("1 session at a time ({serial} in turn), side-effecting"), &one_rw, serial);
    let many = rt.block_on(run(sessions, true, steps, "echo", echo, ws.path()));
    print(&format!("{sessions} sessions at once, read-only"), &many, sessions);
    let one_rate = one_ro.steps as f64 / one_ro.wall.as_secs_f64();
    let many_rate = many.steps as f64 / many.wall.as_secs_f64();
    println!("ratio: {sessions} sessions / 1 session steps/s = {:.1}x", many_rate / one_rate);
}
