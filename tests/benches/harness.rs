//! Harness overhead per step against a zero-latency scripted model server on loopback, one
//! governed tool call per step, `synchronous=FULL` (`KEEL_SYNCHRONOUS` changes it). Prints
//! figures; asserts nothing about time. The model server runs in a child process (this binary
//! again), so keel's CPU time is its process's alone; the server's is measured and shown apart.
//!
//! `cargo bench -p keel-tests --bench harness`. `KEEL_BENCH_STEPS` sets the steps of each
//! session's turn (default 25), `KEEL_BENCH_SESSIONS` the concurrent sessions (default 64),
//! `KEEL_BENCH_SERIAL` the sessions run one after another for the one-session rows (default 8),
//! `KEEL_BENCH_SLOW_SYNC_US` the latency added to every commit in the last two runs, which
//! emulate a disk slower than this machine's (default 2000; 0 skips them), `KEEL_BENCH_ROUNDS`
//! how many times each ratio is measured — one session, then all sessions, in turn — before
//! its median is printed (default 3: single runs vary with the machine's load), and
//! `KEEL_BENCH_PERF_CTL` a `perf record` control FIFO (see [`profiler`]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use keel::ids::SessionId;
use keel::meta::SessionMeta;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use keel::agent::LoopGuards;
use keel::sandbox::{Access, CancelToken, Grant};
use keel_tests::harness_with_session;
use keel_tests::mock_model::{MockModel, Reply};

/// The allocator the `keel` binary uses.
#[global_allocator]
static ALLOCATOR: keel::Allocator = keel::Allocator;

fn cpu_time() -> Duration {
    // User + system time of every thread of this process, nanosecond resolution.
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The scripted model server, in a child process (this benchmark's binary, started with
/// [`SERVER_ENV`] set): its CPU time is then not keel's, and is measured on its own.
struct ModelServer {
    child: std::process::Child,
    url: String,
}

/// Set (to `TOOL\tARGS\tSTEPS`) in the child process that serves the model.
const SERVER_ENV: &str = "KEEL_BENCH_MODEL_SERVER";

impl ModelServer {
    fn start(tool: &str, args: &str, steps: usize) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .env(SERVER_ENV, format!("{tool}\t{args}\t{steps}"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        Self { child, url: line.trim().to_string() }
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    /// CPU time of the server's threads so far (their `schedstat`, nanoseconds; 0 elsewhere).
    fn cpu(&self) -> Duration {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.child.id())) else {
            return Duration::ZERO;
        };
        let ns: u64 = tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum();
        Duration::from_nanos(ns)
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        // Closing its stdin ends the server.
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// The child process's work: serves the model on loopback (one thread), prints its base URL,
/// and exits when its stdin closes.
fn serve_model(spec: &str) {
    let mut parts = spec.split('\t');
    let leak =
        |s: Option<&str>| -> &'static str { Box::leak(s.unwrap().to_string().into_boxed_str()) };
    let (tool, args) = (leak(parts.next()), leak(parts.next()));
    let steps: usize = parts.next().unwrap().parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let model = MockModel::start_fn(responder(tool, args, steps)).await;
        println!("{}", model.url());
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        tokio::task::spawn_blocking(|| {
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new())
        })
        .await
        .unwrap()
        .unwrap();
    });
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
        let text = std::str::from_utf8(body).unwrap_or_default();
        let results = text.matches("\"role\":\"tool\"").count();
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
    /// CPU time of this process (keel; the model server runs in another).
    cpu: Duration,
    /// Of it, the writer's CPU time in COMMIT: the WAL write, its fsync, any checkpoint.
    commit_cpu: Duration,
    /// CPU time of the model server's process.
    server_cpu: Duration,
    commits: u64,
    /// Writer: batches, time running operations, time committing.
    batches: u64,
    ops_count: u64,
    ops: Duration,
    commit: Duration,
    /// Where a step's time goes, and the machine's CPU.
    detail: String,
}

async fn run(
    sessions: usize,
    concurrent: bool,
    steps: usize,
    tool: &'static str,
    args: &'static str,
    ws: &std::path::Path,
    added_sync: Duration,
) -> Figures {
    let model = ModelServer::start(tool, args, steps);
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
    h.internals().db.emulate_sync_latency(added_sync);
    let stats = h.internals().db.stats();
    let commits0 = stats.commits.load(Ordering::Relaxed);
    let operations0 = stats.operations.load(Ordering::Relaxed);
    let wcpu0 = stats.cpu_ns.load(Ordering::Relaxed);
    let sys0 = std::fs::read_to_string("/proc/stat").unwrap();
    let (batches0, ops0, commit0) = (
        stats.batches.load(Ordering::Relaxed),
        stats.ops_ns.load(Ordering::Relaxed),
        stats.commit_ns.load(Ordering::Relaxed),
    );
    let waited0 = writer_cpu_wait(stats);
    let faults0 = page_faults();
    let written0 = bytes_written();
    let switches0 = context_switches();
    if concurrent {
        profiler("enable");
    }
    let cpu0 = cpu_time();
    let server0 = model.cpu();
    let commit_cpu0 = stats.commit_cpu_ns.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut tasks = Vec::new();
    let phases = Arc::new(std::sync::Mutex::new([Duration::ZERO; 3]));
    for i in 0..sessions {
        let h = h.clone();
        let phases = phases.clone();
        let task = tokio::spawn(async move {
            // Time between events: model call → tool start (model exchange), tool start →
            // finish (governed call), tool finish → next model call (commit + assembly).
            let last = std::sync::Mutex::new((Instant::now(), 0usize));
            let events: keel::agent::Events = Arc::new(move |e: &keel::agent::Event| {
                let phase = match e {
                    keel::agent::Event::ModelCall { .. } => 2,
                    keel::agent::Event::ToolStarted { .. } => 0,
                    keel::agent::Event::ToolFinished { .. } => 1,
                    _ => return,
                };
                let mut l = last.lock().unwrap();
                let now = Instant::now();
                if (l.1 + 1) % 3 == phase % 3 || phase == 2 {
                    phases.lock().unwrap()[phase] += now - l.0;
                }
                *l = (now, phase);
            });
            let r = h
                .internals()
                .brain
                .submit(&SessionId::from(format!("b{i}")), "go", &CancelToken::new(), &events)
                .await;
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
    if concurrent {
        profiler("disable");
    }
    let faults = page_faults().saturating_sub(faults0);
    let written = bytes_written().saturating_sub(written0);
    let switches = context_switches().saturating_sub(switches0);
    let sys1 = std::fs::read_to_string("/proc/stat").unwrap();
    let ticks = |t: &str| -> Vec<u64> {
        let line = t.lines().next().unwrap_or_default();
        line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect()
    };
    let (a, b) = (ticks(&sys0), ticks(&sys1));
    let d: Vec<f64> = (0..8)
        .map(|i| b.get(i).unwrap_or(&0).saturating_sub(*a.get(i).unwrap_or(&0)) as f64)
        .collect();
    let all: f64 = d.iter().sum::<f64>().max(1.0);
    let p = *phases.lock().unwrap();
    let n = (sessions * steps) as f64;
    let detail = format!(
        "step latency: model exchange {:.2} ms, governed call {:.2} ms, commit + assembly {:.2} ms; \
         {:.2} page faults, {:.1} context switches and {:.1} KiB written to storage per step; writer CPU {:.0} ms of {:.0} ms, waiting for a free CPU {:.0} ms; whole machine: {:.0}% busy (user+sys), {:.0}% stolen, {:.0}% idle",
        p[0].as_secs_f64() * 1e3 / n,
        p[1].as_secs_f64() * 1e3 / n,
        p[2].as_secs_f64() * 1e3 / n,
        faults as f64 / n,
        switches as f64 / n,
        written as f64 / 1024.0 / n,
        (stats.cpu_ns.load(Ordering::Relaxed) - wcpu0) as f64 / 1e6,
        wall.as_secs_f64() * 1e3,
        writer_cpu_wait(stats).saturating_sub(waited0) as f64 / 1e6,
        (d[0] + d[1] + d[2] + d[5] + d[6]) * 100.0 / all,
        d[7] * 100.0 / all,
        (d[3] + d[4]) * 100.0 / all,
    );
    Figures {
        steps: sessions * steps,
        wall,
        cpu: cpu_time() - cpu0,
        commit_cpu: Duration::from_nanos(stats.commit_cpu_ns.load(Ordering::Relaxed) - commit_cpu0),
        server_cpu: model.cpu().saturating_sub(server0),
        commits: stats.commits.load(Ordering::Relaxed) - commits0,
        batches: stats.batches.load(Ordering::Relaxed) - batches0,
        ops_count: stats.operations.load(Ordering::Relaxed) - operations0,
        ops: Duration::from_nanos(stats.ops_ns.load(Ordering::Relaxed) - ops0),
        commit: Duration::from_nanos(stats.commit_ns.load(Ordering::Relaxed) - commit0),
        detail,
    }
}

/// With `KEEL_BENCH_PERF_CTL` set to the control FIFO of `perf record --control=fifo:PATH -D -1`,
/// switches the profiler on and off so that it samples only the concurrent runs' measured
/// windows, not the setup (which compiles components).
fn profiler(command: &str) {
    if let Some(path) = std::env::var_os("KEEL_BENCH_PERF_CTL") {
        let _ = std::fs::write(path, format!("{command}\n"));
    }
}

/// Page faults of this process so far (minor and major; `/proc/self/stat`, 0 elsewhere).
fn page_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which may hold spaces) start with the state;
    // `minflt` is the 8th of them and `majflt` the 10th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    field(7) + field(9)
}

/// Bytes this process has caused to be written to storage so far (`write_bytes` of
/// `/proc/self/io`: the WAL, the database and anything else; 0 elsewhere).
fn bytes_written() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Context switches (voluntary and involuntary) of this process's live threads so far, summed
/// from `/proc/self/task/*/status` (0 elsewhere).
fn context_switches() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// Nanoseconds the writer thread has spent runnable but waiting for a CPU (the second field of
/// the kernel's per-thread `schedstat`; 0 where it is not available).
fn writer_cpu_wait(stats: &keel::store::DbStats) -> u64 {
    let tid = stats.thread_id.load(Ordering::Relaxed);
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|w| w.parse().ok()))
        .unwrap_or(0)
}

/// The store's mode for this run (from `KEEL_SYNCHRONOUS`).
static SYNC: std::sync::OnceLock<keel::store::Synchronous> = std::sync::OnceLock::new();

/// Commits every turn makes besides its steps: input with the runner lease, turn start, lease
/// release.
const PER_TURN_COMMITS: f64 = 3.0;

/// Prints one run. `serial_sessions`: for sessions run one after another, the fsyncs per step
/// are also shown without the per-turn commits (which concurrent sessions share).
fn print(label: &str, f: &Figures, serial_sessions: Option<usize>) {
    let steps = f.steps as f64;
    let excluding = match serial_sessions {
        Some(n) => format!(
            " ({:.2} without the {PER_TURN_COMMITS} per-turn commits)",
            (f.commits as f64 - PER_TURN_COMMITS * n as f64).max(0.0) / steps
        ),
        None => String::new(),
    };
    println!(
        "{label:<44} {:>5} steps {:>7.0} steps/s {:>7.1} µs CPU/step {:>5.2} {}/step{excluding}",
        f.steps,
        steps / f.wall.as_secs_f64(),
        f.cpu.as_secs_f64() * 1e6 / steps,
        f.commits as f64 / steps,
        // Each commit is one fsync only under synchronous=FULL.
        if SYNC.get().copied().unwrap_or_default() == keel::store::Synchronous::Full {
            "fsyncs"
        } else {
            "commits (not synced)"
        },
    );
    println!(
        "{:<44} writer: {} batches of {:.1} operations on average, {:.0} µs running them + {:.0} µs committing per batch, busy {:.0}% of the time",
        "",
        f.batches,
        if f.batches == 0 { 0.0 } else { f.ops_count as f64 / f.batches as f64 },
        f.ops.as_secs_f64() * 1e6 / f.batches.max(1) as f64,
        f.commit.as_secs_f64() * 1e6 / f.batches.max(1) as f64,
        (f.ops + f.commit).as_secs_f64() * 100.0 / f.wall.as_secs_f64(),
    );
    println!(
        "{:<44} CPU per step excluding commits {:.1} µs (commits {:.1} µs); model server {:.1} µs",
        "",
        f.cpu.saturating_sub(f.commit_cpu).as_secs_f64() * 1e6 / steps,
        f.commit_cpu.as_secs_f64() * 1e6 / steps,
        f.server_cpu.as_secs_f64() * 1e6 / steps,
    );
    println!("{:<44} {}", "", f.detail);
}

/// Startup recovery of `n` sessions left mid-turn by a process that died: a third with an
/// intent but no result (side-effecting, not idempotent), a third with a model call in flight,
/// a third waiting for an approval. Times `Brain::recover` on a fresh Brain.
async fn recovery(n: usize) {
    let model = MockModel::start(Vec::new()).await;
    let home = tempfile::tempdir().unwrap();
    let h = harness_with_session(
        home.path(),
        &model.url(),
        "r0",
        &["write"],
        Vec::new(),
        LoopGuards::default(),
    )
    .await;
    let meta = SessionMeta::read(h.internals().engine, &SessionId::from("r0")).await.unwrap();
    let mut creates = Vec::new();
    for i in 1..n {
        let engine = h.internals().engine.clone();
        let model = meta.config.model.clone();
        creates.push(tokio::spawn(async move {
            engine
                .create(keel::session::NewSession {
                    pins: Default::default(),
                    user: None,
                    named_tools: true,
                    owner: None,
                    id: Some(format!("r{i}")),
                    grants: Vec::new(),
                    net: Default::default(),
                    tools: vec!["write".into()],
                    policy: keel::session::Policy::default(),
                    budget: keel::sandbox::Budget::default(),
                    model,
                    system_prompt: "p".into(),
                    guards: None,
                    preprocess: None,
                })
                .await
                .unwrap()
        }));
    }
    for c in creates {
        c.await.unwrap();
    }
    h.internals().db
        .run(move |c| {
            for i in 0..n {
                let id = format!("r{i}");
                let kind = i % 3;
                let state = if kind == 2 { "waiting_approval" } else { "running" };
                c.execute(
                    "UPDATE sessions SET state=?2, active_turn=1, turns=1 WHERE id=?1",
                    rusqlite_params(&id, state),
                )?;
                c.execute(
                    "INSERT INTO messages (session_id, seq, turn, role, body, created_at) VALUES (?1, 1, 1, 'user', '{\"role\":\"user\",\"content\":\"go\"}', 0)",
                    [&id],
                )?;
                c.execute(
                    "INSERT INTO runner_leases (session_id, owner, heartbeat_ms) VALUES (?1, 'elsewhere/1/1/dead', 0)",
                    [&id],
                )?;
                if kind == 1 {
                    continue;
                }
                c.execute(
                    "INSERT INTO open_steps (session_id, step, turn, assistant, created_at) VALUES (?1, 1, 1, '{}', 0)",
                    [&id],
                )?;
                let status = if kind == 0 { "intent" } else { "waiting" };
                c.execute(
                    "INSERT INTO tool_calls (session_id, step, call_id, position, tool, input, input_digest, component_digest,
                         effect, status, created_at, idempotent) VALUES (?1, 1, 'c1', 0, 'write', '{}', 'd', 'x', 'workspace-write', ?2, 0, 0)",
                    rusqlite_params(&id, status),
                )?;
                if kind == 2 {
                    c.execute(
                        "INSERT INTO approvals (id, session_id, step, call_id, result_id, tool, effect, component_digest, input,
                             input_digest, grants, why, status, created_at) VALUES ('ap-'||?1, ?1, 1, 'c1', 'res', 'write',
                             'workspace-write', 'x', '{}', 'd', '[]', 'asked', 'pending', 0)",
                        [&id],
                    )?;
                }
            }
            Ok(())
        })
        .await
        .unwrap();
    let db = keel::store::Db::open(&home.path().join("keel.db")).unwrap();
    let agent = keel::agent::AgentService::new(
        keel::session::SessionEngine::new(db.clone(), keel::harness::REACTIONS),
        h.internals().tools.clone(),
        keel::model::ModelClient::new(None).unwrap(),
        LoopGuards::default(),
    );
    let brain = keel::brain::Brain::new(db, agent);
    let started = Instant::now();
    let recovered = brain.recover().await.unwrap();
    let first = started.elapsed();
    let unknown: usize = recovered.iter().map(|r| r.outcome_unknown.len()).sum();
    let started = Instant::now();
    let again = brain.recover().await.unwrap();
    let second = started.elapsed();
    let changed = again
        .iter()
        .filter(|r| r.state_before != r.state_after || !r.outcome_unknown.is_empty())
        .count();
    // Sessions waiting for a decision stay as they are (nothing to report or resume).
    let waiting = (0..n).filter(|i| i % 3 == 2).count();
    assert_eq!(recovered.len(), n - waiting);
    assert_eq!(changed, 0, "recovering twice changes nothing");
    println!(
        "startup recovery of {n} sessions left mid-turn by a dead process: {:.1} ms ({} outcomes unknown, {} waiting kept); again: {:.1} ms, nothing changed",
        first.as_secs_f64() * 1e3,
        unknown,
        waiting,
        second.as_secs_f64() * 1e3
    );
}

fn rusqlite_params<'a>(a: &'a str, b: &'a str) -> [&'a str; 2] {
    [a, b]
}

fn main() {
    if let Ok(spec) = std::env::var(SERVER_ENV) {
        return serve_model(&spec);
    }
    // Every run uses the same turn shape: one turn of `steps` steps per session.
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let steps = env("KEEL_BENCH_STEPS", 25);
    let sessions = env("KEEL_BENCH_SESSIONS", 64);
    let serial = env("KEEL_BENCH_SERIAL", 8);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha").unwrap();
    // The harness reads the store's mode from the environment (the homes here have no
    // keel.toml), so `KEEL_SYNCHRONOUS=normal` measures the same steps without fsyncs.
    let sync: keel::store::Synchronous = std::env::var("KEEL_SYNCHRONOUS")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| v.parse().unwrap())
        .unwrap_or_default();
    let _ = SYNC.set(sync);
    // The CPUs this process may run on (its affinity, so `taskset` shows here): 64 sessions are
    // bound by them, one session is not, so the ratio follows this figure.
    let cpus = match std::thread::available_parallelism().map_or(0, |n| n.get()) {
        1 => "1 CPU".to_string(),
        n => format!("{n} CPUs"),
    };
    println!(
        "keel harness benchmark: one turn of {steps} steps per session, one governed tool call per step, synchronous={}, on {cpus}",
        sync.pragma()
    );
    println!(
        "(CPU: keel's process; the model server runs in another, its CPU shown apart; \"excluding commits\": less the writer's CPU in COMMIT — WAL write, fsync, checkpoint)"
    );
    let echo = r#"{"text":"hi"}"#;
    let write = r#"{"path":"/w/out.txt","content":"x"}"#;
    let one_rw = rt.block_on(run(serial, false, steps, "write", write, ws.path(), Duration::ZERO));
    print(
        &format!("1 session at a time ({serial} in turn), side-effecting"),
        &one_rw,
        Some(serial),
    );
    // Read-only steps, one session at a time and all sessions at once, with `added` latency on
    // every durable commit; returns the one-session run and the ratio of the two rates.
    let ratio = |added: Duration, label: &str| {
        let one = rt.block_on(run(serial, false, steps, "echo", echo, ws.path(), added));
        print(
            &format!("1 session at a time ({serial} in turn), read-only{label}"),
            &one,
            Some(serial),
        );
        let many = rt.block_on(run(sessions, true, steps, "echo", echo, ws.path(), added));
        print(&format!("{sessions} sessions at once, read-only{label}"), &many, None);
        let rate = |f: &Figures| f.steps as f64 / f.wall.as_secs_f64();
        (rate(&many) / rate(&one), one)
    };
    let rounds = env("KEEL_BENCH_ROUNDS", 3).max(1);
    // Measures a ratio `rounds` times; returns the ratios in ascending order.
    let measure = |added: Duration, label: &str| -> Vec<f64> {
        let mut ratios = Vec::new();
        for round in 1..=rounds {
            let (r, one) = ratio(added, label);
            println!(
                "round {round}/{rounds}: {sessions} sessions / 1 session steps/s = {r:.1}x (a commit took {:.2} ms for one session)",
                one.commit.as_secs_f64() * 1e3 / one.batches.max(1) as f64,
            );
            ratios.push(r);
        }
        ratios.sort_by(f64::total_cmp);
        ratios
    };
    let summary = |r: &[f64]| {
        let mid = r.len() / 2;
        let median = if r.len().is_multiple_of(2) { (r[mid - 1] + r[mid]) / 2.0 } else { r[mid] };
        format!(
            "median {median:.1}x over {} rounds (min {:.1}x, max {:.1}x)",
            r.len(),
            r[0],
            r[r.len() - 1]
        )
    };
    let real = measure(Duration::ZERO, "");
    println!("ratio: {sessions} sessions / 1 session steps/s: {}", summary(&real));
    // The same two runs on emulated slower storage: every durable commit takes this much
    // longer, as when fsync reaches a disk that is slower than this machine's.
    let slow_us = env("KEEL_BENCH_SLOW_SYNC_US", 2000);
    if slow_us > 0 {
        let slow = Duration::from_micros(slow_us as u64);
        let ms = slow.as_secs_f64() * 1e3;
        let slower = measure(slow, &format!(", sync +{ms:.1} ms"));
        println!(
            "ratio with every commit {ms:.1} ms slower: {sessions} sessions / 1 session steps/s: {}",
            summary(&slower)
        );
    }
    rt.block_on(recovery(env("KEEL_BENCH_RECOVER", 1000)));
}
