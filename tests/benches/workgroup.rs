//! Delegation in a workgroup against a zero-latency loopback model server (each session told
//! apart by its first input), `synchronous=FULL`:
//!
//! - one delegation round trip — a main session spawns one child, the child understands its
//!   task and answers, its result wakes the main session, which answers — wall time p50/p99
//!   and commits (each one fsync under FULL), beside a standalone session's one-answer turn
//!   (with its understanding call) measured in the same run;
//! - 64 children spawned in one step of one main session, run concurrently: wall time until
//!   the main session's answer, commits, and per child.
//!
//! `cargo bench -p keel-tests --bench workgroup`. `KEEL_BENCH_ROUNDS` sets the round trips
//! (default 30), `KEEL_BENCH_CHILDREN` the fan-out (default 64). Asserts nothing about time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use keel::api::Caller;
use keel::harness::Harness;
use keel::sandbox::CancelToken;
use keel::workgroup::Limits;
use keel_tests::mock_model::{MockModel, spawn_task, workgroup_responder};
use keel_tests::no_events;

#[global_allocator]
static ALLOCATOR: keel::Allocator = keel::Allocator;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn spec(url: &str, id: &str, main: Option<Limits>) -> keel::api::SessionSpec {
    let mut spec = keel_tests::session_spec(url, id, vec![], None);
    spec.main = main;
    spec.guards.max_steps = 8;
    spec
}

/// Runs `task` in a new session `id` and returns (ms, commits).
async fn timed(h: &Harness, url: &str, id: &str, main: Option<Limits>, task: &str) -> (f64, u64) {
    h.create_session(&Caller::Operator, spec(url, id, main)).await.unwrap();
    let commits = h.internals().db.stats().commits.load(Ordering::Relaxed);
    let started = Instant::now();
    let out = h.send(&Caller::Operator, id, task, &CancelToken::new(), &no_events()).await.unwrap();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    match out {
        keel::brain::Submitted::Ran(keel::agent::TurnOutcome::Answer(a)) => {
            assert!(a.starts_with("coordinator done") || a.starts_with("answer"), "{a}")
        }
        other => panic!("{other:?}"),
    }
    (ms, h.internals().db.stats().commits.load(Ordering::Relaxed) - commits)
}

fn line(name: &str, runs: &mut [(f64, u64)]) {
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let ms: Vec<f64> = runs.iter().map(|r| r.0).collect();
    let commits = runs.iter().map(|r| r.1 as f64).sum::<f64>() / runs.len().max(1) as f64;
    println!(
        "{name:<34} p50 {:>8.2} ms  p99 {:>8.2} ms  {:>6.1} commits (fsyncs)",
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
        commits
    );
}

fn main() {
    let rounds = env("KEEL_BENCH_ROUNDS", 30);
    let fan_out = env("KEEL_BENCH_CHILDREN", 64);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let model = MockModel::start_fn(workgroup_responder(Duration::ZERO).responder).await;
        let url = model.url();
        let dir = tempfile::tempdir().unwrap();
        let home = keel::home::Home::at(dir.path()).unwrap();
        let h = Harness::open(home, keel_tests::test_limits(), None, Default::default(), &|_| {})
            .await
            .unwrap();
        println!("workgroup benchmark: {rounds} round trips, {fan_out} children, synchronous=FULL");
        let mut alone = Vec::new();
        let mut round = Vec::new();
        for i in 0..rounds {
            alone.push(timed(&h, &url, &format!("alone-{i}"), None, "CHILD X").await);
            let task = spawn_task("MAIN", &[("work", "CHILD X", &[])]);
            round.push(timed(&h, &url, &format!("main-{i}"), Some(Limits::default()), &task).await);
        }
        line("standalone turn (baseline)", &mut alone);
        line("delegation round trip", &mut round);
        let (a, r) = (percentile(&alone.iter().map(|x| x.0).collect::<Vec<_>>(), 0.5),
                      percentile(&round.iter().map(|x| x.0).collect::<Vec<_>>(), 0.5));
        println!("round trip / standalone turn (p50): {:.2}x", r / a.max(1e-9));

        let names: Vec<(String, String)> =
            (0..fan_out).map(|i| (format!("child {i}"), format!("CHILD C{i}"))).collect();
        let children: Vec<(&str, &str, &[&str])> =
            names.iter().map(|(p, i)| (p.as_str(), i.as_str(), &[][..])).collect();
        let task = spawn_task("MAIN", &children);
        let limits = Limits { max_live_children: fan_out.max(1) as u32, ..Limits::default() };
        let (ms, commits) = timed(&h, &url, "wide", Some(limits), &task).await;
        let w = h.workgroup(&Caller::Operator, "wide").await.unwrap();
        assert_eq!(w.members.len(), fan_out + 1);
        println!(
            "{fan_out} children in one workgroup: {ms:.1} ms until the main answer, {commits} commits \
             ({:.2} ms and {:.1} commits per child), {} events",
            ms / fan_out.max(1) as f64,
            commits as f64 / fan_out.max(1) as f64,
            w.events
        );
    });
}
