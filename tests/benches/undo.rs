//! Undo benchmark: what keeping pre-images costs. Prints figures; asserts nothing about time.
//!
//! `cargo bench -p keel-tests --bench undo`. In one run, through the whole ToolService chain
//! (resolve, schema, lease, walk of the grant before and after, sandbox), with pre-images kept
//! (the default `[undo]`) and, as the baseline, with keeping off (`[undo]` bounds 0): a
//! write-class call that changes nothing, a call that creates a 100 KB file (nothing to keep),
//! and a call that rewrites a 100 KB file (its 100 KB pre-image read and hashed). Then the
//! store's growth per 1,000 rewrites of a 100 KB file journaled in a session (each content
//! new: no pre-image shared), against the same calls with keeping off. `KEEL_BENCH_ITERS`
//! sets the calls per latency figure (default 1000); `KEEL_BENCH_UNDO_CALLS` the journaled
//! calls (default 200, in sessions of 10; the growth is given per 1,000).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use keel::agent::LoopGuards;
use keel::ids::SessionId;
use keel::sandbox::{Access, Budget, CancelToken, Grant};
use keel::tools::{CallRequest, ToolService};
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::test_limits;

/// The allocator the `keel` binary uses.
#[global_allocator]
static ALLOCATOR: keel::Allocator = keel::Allocator;

const OFF: &str = "[undo]\nmax_file = \"0\"\nmax_call = \"0\"\nmax_session = \"0\"\n";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn p50(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

fn calls(
    rt: &tokio::runtime::Runtime,
    service: &ToolService,
    grants: &[Grant],
    iters: usize,
    input: impl Fn(usize) -> String,
    tool: &str,
) -> f64 {
    let budget = Budget::default();
    let mut samples = Vec::with_capacity(iters);
    for i in 0..iters + iters / 10 {
        let input = input(i);
        let req = CallRequest {
            tool,
            input: &input,
            grants,
            net: keel::sandbox::net::NetGrants::none(),
            budget: budget.clone(),
            cancel: None,
            loaded: None,
            policy: None,
            approval: None,
            control: None,
        };
        let t = Instant::now();
        let out = rt.block_on(service.call(req)).unwrap();
        let e = t.elapsed();
        if i >= iters / 10 {
            samples.push(e);
        }
        assert!(out.changes.is_some(), "{tool} is tracked");
    }
    p50(samples)
}

/// A 100 KB text whose content depends on `i`.
fn content(i: usize) -> String {
    let line = format!("line of call {i:>8}: the quick brown fox jumps over the lazy dog\n");
    line.repeat(100 * 1024 / line.len())
}

fn main() {
    let iters = env_usize("KEEL_BENCH_ITERS", 1000);
    let journaled = env_usize("KEEL_BENCH_UNDO_CALLS", 200);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!("keel undo benchmark ({iters} calls per latency figure, p50)");
    println!();
    let mut rows = Vec::new();
    for (label, toml) in [("kept", ""), ("off", OFF)] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("keel.toml"), toml).unwrap();
        let service = rt.block_on(keel_tests::service_in(dir.path(), test_limits()));
        let ws = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join("big.txt"), content(0)).unwrap();
        for i in 0..20 {
            std::fs::write(ws.path().join(format!("other-{i}.txt")), "x\n").unwrap();
        }
        let grants = [Grant::new(ws.path(), "/w", Access::Rw).unwrap()];
        // A write-class call that changes nothing on disk: a delete of a path that is not
        // there (refused by the tool, after the walks).
        let none = calls(
            &rt,
            &service,
            &grants,
            iters,
            |_| r#"{"paths":["/w/missing"]}"#.into(),
            "fs_delete_files",
        );
        let body = content(1);
        let create = calls(
            &rt,
            &service,
            &grants,
            iters,
            |i| serde_json::json!({"path": format!("/w/new/{i}.txt"), "content": body}).to_string(),
            "fs_write_file",
        );
        let rewrite = calls(
            &rt,
            &service,
            &grants,
            iters,
            |i| serde_json::json!({"path": "/w/big.txt", "content": content(i + 2)}).to_string(),
            "fs_write_file",
        );
        rows.push((label, none, create, rewrite));
    }
    let (kept, off) = (&rows[0], &rows[1]);
    let line = |name: &str, a: f64, b: f64| {
        println!("{name:<44} kept {a:>8.1} µs   off {b:>8.1} µs   ratio {:>5.2}", a / b);
    };
    line("write-class call, nothing changed", kept.1, off.1);
    line("creates a 100 KB file (nothing to keep)", kept.2, off.2);
    line("rewrites a 100 KB file (keeps 100 KB)", kept.3, off.3);
    println!();

    // The store's growth per journaled rewrite, through sessions' turns: one turn of
    // `steps` rewrites per session (a call's input holds the 100 KB, so a longer history would
    // measure request assembly, not undo).
    let steps = 10;
    let sessions = journaled.div_ceil(steps);
    let mut grown_by = Vec::new();
    for (label, toml) in [("kept", ""), ("off", OFF)] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("keel.toml"), toml).unwrap();
        let ws = tempfile::tempdir().unwrap();
        let mut replies = Vec::new();
        for t in 0..sessions {
            std::fs::write(ws.path().join(format!("big-{t}.txt")), content(0)).unwrap();
            for s in 0..steps {
                let args = serde_json::json!({
                    "path": format!("/w/big-{t}.txt"),
                    "content": content(t * steps + s + 1)
                });
                replies.push(Reply::calls(&[(
                    &format!("c{t}-{s}"),
                    "fs_write_file",
                    &args.to_string(),
                )]));
            }
            replies.push(Reply::text("done"));
        }
        let model = rt.block_on(MockModel::start(replies));
        let grants = vec![Grant::new(ws.path(), "/w", Access::Rw).unwrap()];
        let guards = LoopGuards { max_steps: steps as u32 + 2, ..LoopGuards::default() };
        let mut harnesses = Vec::new();
        for t in 0..sessions {
            harnesses.push(rt.block_on(keel_tests::harness_with_session(
                dir.path(),
                &model.url(),
                &format!("u{t}"),
                &["fs_write_file"],
                grants.clone(),
                guards.clone(),
            )));
        }
        let size = || -> u64 {
            std::fs::read_dir(dir.path())
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("keel.db"))
                .map(|e| e.metadata().unwrap().len())
                .sum()
        };
        let before = size();
        let t = Instant::now();
        let events: keel::agent::Events = std::sync::Arc::new(|_: &keel::agent::Event| {});
        for (i, h) in harnesses.iter().enumerate() {
            let id = SessionId::from(format!("u{i}"));
            rt.block_on(h.internals().brain.submit(&id, "go", &CancelToken::new(), &events))
                .unwrap();
        }
        let took = t.elapsed();
        let grown = size().saturating_sub(before) as f64;
        let per_1000 = grown * 1000.0 / (sessions * steps) as f64 / (1 << 20) as f64;
        grown_by.push(per_1000);
        println!(
            "{label:<4} {} journaled rewrites of a 100 KB file: store +{:.1} MiB, {per_1000:.1} MiB per 1,000 calls, {:.2} s",
            sessions * steps,
            grown / (1 << 20) as f64,
            took.as_secs_f64()
        );
    }
    println!(
        "pre-images add {:.1} MiB per 1,000 rewrites of a 100 KB file (100 KB each: nothing shared)",
        grown_by[0] - grown_by[1]
    );
}
