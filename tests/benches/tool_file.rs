//! The tool author's loop: the first and the second `keel tool call --wasm` of the same
//! component file. Prints figures; asserts nothing about time.
//!
//! `cargo bench --bench tool_file`. For each component — a Rust test guest (always), and
//! the Python and JavaScript examples when `examples/build.sh` has built them into
//! `target/examples` — in a fresh home: the first call of the file (install's checks, the
//! compile, the artifact written and its digest recorded, the call) and the second call of
//! the same bytes (install's checks with the artifact loaded from the cache, the call), as a
//! ratio. `KEEL_BENCH_ITERS` sets how many second calls the median is of (default 5).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::Path;
use std::time::{Duration, Instant};

use keel::sandbox::{Access, Grant};
use keel::tools::ToolService;
use keel_tests::test_limits;

/// The allocator the `keel` binary uses.
#[global_allocator]
static ALLOCATOR: keel::Allocator = keel::Allocator;

fn call(
    rt: &tokio::runtime::Runtime,
    service: &ToolService,
    bytes: &[u8],
    name: &str,
    tool: &str,
    input: &str,
    grants: &[Grant],
) -> (Duration, Option<f64>) {
    let req = keel_tests::request(tool, input, grants);
    let t = Instant::now();
    let out = rt.block_on(service.call_file(bytes, name, req)).unwrap();
    let elapsed = t.elapsed();
    assert!(out.report.result.is_ok(), "{:?}", out.report.result);
    (elapsed, out.compiled_ms)
}

/// One component measured: its label, its bytes (`None`: not built), the tool called, the
/// name it is checked as, the input.
type Case<'a> = (&'a str, Option<Vec<u8>>, &'a str, &'a str, &'a str);

fn main() {
    let iters = std::env::var("KEEL_BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/examples");
    let summary = std::fs::read(keel_tests::guests::SUMMARY_V1_COMPONENT).unwrap();
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "one two three\n").unwrap();
    let grants = [Grant::new(ws.path(), "/w", Access::Ro).unwrap()];
    let read = r#"{"path":"/w/a.txt"}"#;
    let title = r#"{"text":"The Tool Author's Loop"}"#;
    let cases: Vec<Case<'_>> = vec![
        ("summary_v1.wasm (Rust, keel-sdk)", Some(summary), "note_summary", "summary", read),
        (
            "python_tool.wasm (componentize-py)",
            std::fs::read(examples.join("python_tool.wasm")).ok(),
            "py_word_count",
            "python-tool",
            read,
        ),
        (
            "js_tool.wasm (componentize-js)",
            std::fs::read(examples.join("js_tool.wasm")).ok(),
            "js_slugify",
            "js-tool",
            title,
        ),
    ];
    println!(
        "keel tool file benchmark: first and second call of the same bytes (median of {iters})"
    );
    println!();
    println!("| component | size | first call | of it, compiling | second call | first / second |");
    println!("|---|---|---|---|---|---|");
    for (label, bytes, tool, name, input) in cases {
        let Some(bytes) = bytes else {
            println!("| {label} | not built (examples/build.sh builds it) | | | | |");
            continue;
        };
        let home = tempfile::tempdir().unwrap();
        let service = rt.block_on(keel_tests::service_in(home.path(), test_limits()));
        let (first, compiled) = call(&rt, &service, &bytes, name, tool, input, &grants);
        let mut seconds: Vec<Duration> = (0..iters)
            .map(|_| {
                let (d, compiled) = call(&rt, &service, &bytes, name, tool, input, &grants);
                assert!(compiled.is_none(), "a second call compiles nothing");
                d
            })
            .collect();
        seconds.sort();
        let second = seconds[seconds.len() / 2];
        println!(
            "| {label} | {:.1} MB | {:.0} ms | {:.0} ms | {:.0} ms | {:.0}× |",
            bytes.len() as f64 / 1e6,
            first.as_secs_f64() * 1e3,
            compiled.unwrap_or(0.0),
            second.as_secs_f64() * 1e3,
            first.as_secs_f64() / second.as_secs_f64()
        );
    }
}
