//! A long session under a small context window: 1,000 scripted turns against a zero-latency
//! loopback model server, `synchronous=FULL`. Prints, side by side, turns 1–10 against the
//! last ten — time per turn, commits (each one fsync under FULL) per turn, request bytes —
//! the largest request against the window, and the time of one compaction without its model
//! call. Asserts nothing about time.
//!
//! `cargo bench -p keel-tests --bench compaction`. `KEEL_BENCH_TURNS` sets the turns (default
//! 1000), `KEEL_BENCH_WINDOW` the context window in tokens (default 2048).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use keel::assembly::Assembly;
use keel::ids::SessionId;
use keel::views::Views;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use keel::agent::LoopGuards;
use keel::sandbox::{Budget, CancelToken};
use keel::session::{NewSession, Policy, SessionEvent};
use keel_tests::mock_model::{MockModel, Reply};

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

struct Turn {
    ms: f64,
    commits: u64,
    request_bytes: i64,
}

fn row(name: &str, turns: &[Turn]) {
    let n = turns.len().max(1) as f64;
    println!(
        "{name:<16} {:>9.2} ms/turn {:>6.2} commits/turn {:>8.0} request bytes (mean) {:>8} (max)",
        turns.iter().map(|t| t.ms).sum::<f64>() / n,
        turns.iter().map(|t| t.commits as f64).sum::<f64>() / n,
        turns.iter().map(|t| t.request_bytes as f64).sum::<f64>() / n,
        turns.iter().map(|t| t.request_bytes).max().unwrap_or(0),
    );
}

fn main() {
    let turns = env("KEEL_BENCH_TURNS", 1000);
    let window = env("KEEL_BENCH_WINDOW", 2048) as u64;
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let answer = format!("done: {}", "the work went as planned and the result is checked ".repeat(6));
        let model = MockModel::start_fn(Arc::new(move |_: &[u8]| Reply::text(&answer))).await;
        let dir = tempfile::tempdir().unwrap();
        let h = keel_tests::harness_with_session(
            dir.path(),
            &model.url(),
            "unused",
            &[],
            Vec::new(),
            LoopGuards::default(),
        )
        .await;
        let mut config = keel::model::ModelConfig::new(&model.url(), "m");
        config.context_window = Some(window);
        h.internals().engine
            .create(NewSession {
                pins: Default::default(),
                id: Some("long".into()),
                grants: Vec::new(),
                net: Default::default(),
                tools: Vec::new(),
                policy: Policy::default(),
                budget: Budget::default(),
                model: config,
                system_prompt: keel::harness::DEFAULT_SYSTEM_PROMPT.into(),
                guards: None,
                preprocess: None,
                user: None,
                named_tools: false,
                owner: None,
            })
            .await
            .unwrap();
        let stats = h.internals().db.stats();
        let cancel = CancelToken::new();
        let events = keel_tests::no_events();
        let mut per_turn = Vec::with_capacity(turns);
        let mut last_step = 0;
        let started = Instant::now();
        for i in 0..turns {
            let task = format!(
                "step {i}: {}",
                "read the next part of the report, compare it with the last one, and note what changed ".repeat(4)
            );
            let commits0 = stats.commits.load(Ordering::Relaxed);
            let t0 = Instant::now();
            let out = h.internals().brain.submit(&SessionId::from("long"), &task, &cancel, &events).await.unwrap();
            assert!(matches!(out, keel::brain::Submitted::Ran(keel::agent::TurnOutcome::Answer(_))), "{out:?}");
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let commits = stats.commits.load(Ordering::Relaxed) - commits0;
            let calls = Assembly::of(h.internals().engine).model_calls(&SessionId::from("long")).await.unwrap();
            let request_bytes = calls
                .iter()
                .filter(|c| c.step > last_step)
                .filter_map(|c| c.request_bytes)
                .max()
                .unwrap_or(0);
            last_step = calls.last().map_or(last_step, |c| c.step);
            per_turn.push(Turn { ms, commits, request_bytes });
        }
        let total = started.elapsed();
        let t = Views::of(h.internals().engine).timeline(&SessionId::from("long")).await.unwrap();
        let events = h.internals().engine.events_after(&SessionId::from("long"), 0, usize::MAX).await.unwrap();
        let mut without_call: Vec<f64> = Vec::new();
        for e in &events {
            if let SessionEvent::Compacted { checkpoint, ms, .. } = &e.event
                && let Some(cp) = t.checkpoints.iter().find(|c| c.seq == *checkpoint)
            {
                without_call.push(ms - cp.duration_ms);
            }
        }
        without_call.sort_by(f64::total_cmp);
        let compactions = without_call.len();
        let max_request = per_turn.iter().map(|t| t.request_bytes).max().unwrap_or(0);
        let per_token = keel::assembly::BYTES_PER_TOKEN;
        println!(
            "compaction: {turns} turns, context window {window} tokens (~{} bytes at {per_token} bytes/token), \
             compact at {}; {:.1} s in all",
            (window as f64 * per_token) as u64,
            keel::model::DEFAULT_COMPACT_AT,
            total.as_secs_f64()
        );
        let tail = turns.saturating_sub(10);
        row("turns 1–10", &per_turn[..10.min(turns)]);
        row(&format!("turns {}–{}", tail + 1, turns), &per_turn[tail..]);
        println!(
            "largest request: {max_request} bytes = {:.0}% of the window; {} messages kept in the record, context starts after {}",
            max_request as f64 / (window as f64 * per_token) * 100.0,
            t.messages.len(),
            t.context_start
        );
        println!(
            "{compactions} compactions; time of one without its model call: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            percentile(&without_call, 0.5),
            percentile(&without_call, 0.99),
            without_call.last().copied().unwrap_or(0.0)
        );
    });
}
