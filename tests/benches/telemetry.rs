//! What telemetry costs a governed tool call (`fs_read_file` through the ToolService: resolve,
//! schema, lease, sandbox, with its counters and spans), in one process, three ways in the
//! same run:
//!
//! 1. no `tracing` subscriber at all (the library embedded without logs);
//! 2. the `keel` binary's default — logs at `warn`, no trace export: the spans are disabled at
//!    their call sites, so what is left is the metrics' counters;
//! 3. the same with traces exported over OTLP/HTTP to a collector on loopback (a sink that
//!    answers 200 at once), as `OTEL_EXPORTER_OTLP_ENDPOINT` turns on in the binary.
//!
//! The turn through the binary (CLI and API, export off and on) is in the `serve` benchmark.
//! `cargo bench -p keel-tests --bench telemetry`; `KEEL_BENCH_ITERS` (default 3000) calls per
//! figure. Prints figures; asserts nothing about time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, clippy::print_stderr)]

use std::time::{Duration, Instant};

use keel::sandbox::{Access, Budget, Grant};
use keel::tools::CallRequest;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;

fn iters() -> usize {
    std::env::var("KEEL_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000)
}

/// p50 and mean of `samples`, in µs.
fn stats(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mean = samples.iter().map(|d| us(*d)).sum::<f64>() / samples.len() as f64;
    (us(samples[samples.len() / 2]), mean)
}

fn main() {
    let n = iters();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let service = rt.block_on(keel_tests::service_in(dir.path(), keel_tests::test_limits()));
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("small.txt"), "x".repeat(1023) + "\n").unwrap();
    let grants = [Grant::new(ws.path(), "/w", Access::Ro).unwrap()];
    let budget = Budget::default();
    let calls = |n: usize| {
        let mut samples = Vec::with_capacity(n);
        for i in 0..n + n / 10 {
            let t = Instant::now();
            let req = CallRequest {
                tool: "fs_read_file",
                input: r#"{"path":"/w/small.txt"}"#,
                grants: &grants,
                net: keel::sandbox::net::NetGrants::none(),
                budget: budget.clone(),
                cancel: None,
                loaded: None,
                policy: None,
                approval: None,
                control: None,
            };
            let out = rt.block_on(service.call(req)).unwrap();
            let e = t.elapsed();
            assert!(out.report.result.is_ok(), "{:?}", out.report.result);
            if i >= n / 10 {
                samples.push(e);
            }
        }
        stats(samples)
    };
    println!("telemetry's cost on a governed call: fs_read_file, {n} calls per figure");
    println!();
    // Round-robin over the three ways, five rounds, so that drift hits each alike.
    let sink = keel_tests::telemetry_peers::Sink::start();
    let settings = keel_server::telemetry::Settings {
        endpoint: format!("{}/v1/traces", sink.base),
        service: "keel-bench".into(),
        capture_content: false,
        from: "OTEL_EXPORTER_OTLP_ENDPOINT",
    };
    let (bridge, exporter) = keel_server::telemetry::start(&settings).unwrap();
    let exporting = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::sink)
                .with_filter(tracing_subscriber::EnvFilter::new("warn")),
        )
        .with(bridge.with_filter(
            tracing_subscriber::filter::Targets::new().with_target("keel", tracing::Level::INFO),
        ));
    let exporting = tracing::Dispatch::new(exporting);
    let logs_only = tracing::Dispatch::new(
        tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::sink)
                .with_filter(tracing_subscriber::EnvFilter::new("warn")),
        ),
    );
    let none = tracing::Dispatch::none();
    let mut rows: Vec<(&str, Vec<(f64, f64)>)> = vec![
        ("no subscriber", vec![]),
        ("the binary's default (logs at warn, no export)", vec![]),
        ("traces exported over OTLP/HTTP", vec![]),
    ];
    for _ in 0..5 {
        for (i, d) in [&none, &logs_only, &exporting].into_iter().enumerate() {
            let figure = tracing::dispatcher::with_default(d, || calls(n / 5));
            rows[i].1.push(figure);
        }
    }
    exporter.shutdown();
    let median = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
        let mut x: Vec<f64> = v.iter().map(f).collect();
        x.sort_by(f64::total_cmp);
        x[x.len() / 2]
    };
    let base = median(&rows[0].1, |r| r.0);
    println!("| configuration | p50 | mean | p50 / no subscriber |");
    println!("|---|---|---|---|");
    for (name, figures) in &rows {
        let (p50, mean) = (median(figures, |r| r.0), median(figures, |r| r.1));
        println!("| {name} | {p50:.1} µs | {mean:.1} µs | {:.3} |", p50 / base);
    }
    let sent = sink.requests.load(std::sync::atomic::Ordering::Relaxed);
    let bytes = sink.bytes.load(std::sync::atomic::Ordering::Relaxed);
    println!();
    println!(
        "exported: {sent} requests, {bytes} bytes ({:.0} bytes per call's spans)",
        bytes as f64 / n as f64
    );
}
