//! Tool host benchmark: prints figures, asserts nothing about time.
//!
//! `cargo bench -p keel-tests --bench tool_host` (or `cargo bench` at the root). Measures, in one
//! run: compile time of a component; cached load time; latency p50/p99 of one call (fresh
//! store + instantiate + invoke + drop) for a trivial tool and a small file read, at the sandbox
//! and through the whole ToolService chain; throughput on 2 threads; and two baselines printed
//! as ratios: the same component called with plain wasmtime-wasi (no keel), and spawning a
//! native process (`/bin/cat`) per call.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use keel::home::Home;
use keel::sandbox::{Access, Budget, FsPolicy, Grant, Invocation, Opened, Sandbox};
use keel::tools::CallRequest;
use keel_tests::test_limits;

/// The allocator the `keel` binary uses.
#[global_allocator]
static ALLOCATOR: keel::Allocator = keel::Allocator;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Stats {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    Stats { p50: at(0.5), p99: at(0.99), mean }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn row(name: &str, s: &Stats) {
    println!(
        "{name:<52} p50 {:>9.1} µs   p99 {:>9.1} µs   mean {:>9.1} µs",
        us(s.p50),
        us(s.p99),
        us(s.mean)
    );
}

fn main() {
    let iters = env_usize("KEEL_BENCH_ITERS", 5000);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = Home::at(dir.path()).unwrap();
    let service = rt.block_on(keel_tests::service_in(dir.path(), test_limits()));
    let sandbox: &Arc<Sandbox> = service.sandbox();
    println!("keel tool host benchmark ({iters} calls per latency figure)");
    println!();

    // Compile time of the first-party components.
    for (name, bytes, _) in keel::builtin::BUILTIN_COMPONENTS {
        let samples: Vec<Duration> = (0..5)
            .map(|_| {
                let t = Instant::now();
                sandbox.compile(bytes).unwrap();
                t.elapsed()
            })
            .collect();
        let s = stats(samples);
        println!(
            "compile `{name}` ({} KiB)                          median {:>8.1} ms",
            bytes.len() / 1024,
            us(s.p50) / 1e3
        );
    }

    // Cached load: verify the artifact's digest + deserialize (+ link).
    let fs_digest = service.component_for("fs").unwrap().0.digest;
    let wasm = home.component_path(&fs_digest);
    // The artifact digest keel records in its database when it writes an artifact.
    let recorded = sandbox.load(&fs_digest, None, &wasm).unwrap().2.unwrap();
    let samples: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            let (_c, source, _) = sandbox.load(&fs_digest, Some(&recorded), &wasm).unwrap();
            assert_eq!(source, keel::sandbox::LoadSource::Cache);
            t.elapsed()
        })
        .collect();
    let load = stats(samples);
    row("cached load of `fs` (verify digest + deserialize)", &load);
    let samples: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            let (c, _, _) = sandbox.load(&fs_digest, Some(&recorded), &wasm).unwrap();
            sandbox.prepare(&c, false).unwrap();
            t.elapsed()
        })
        .collect();
    row("cached load + link (InstancePre) of `fs`", &stats(samples));
    println!();

    // Fresh-store calls, at the sandbox.
    let ws = tempfile::tempdir().unwrap();
    let small = "x".repeat(1023) + "\n";
    std::fs::write(ws.path().join("small.txt"), &small).unwrap();
    let grants = [Grant::new(ws.path(), "/w", Access::Ro).unwrap()];
    let opened = [grants[0].opened().unwrap()];
    let budget = Budget::default();
    let hostile = service.component_for("hostile").unwrap().0.digest;
    let (echo_pre, _) = service.prepared(&hostile).unwrap();
    let (fs_pre, _) = service.prepared(&fs_digest).unwrap();
    let measure_as = |pre: &keel::sandbox::Prepared,
                      tool: &str,
                      input: &str,
                      grants: &[Opened],
                      fs: FsPolicy| {
        let mut samples = Vec::with_capacity(iters);
        for i in 0..iters + iters / 10 {
            let t = Instant::now();
            let r =
                rt.block_on(sandbox.invoke(
                    pre,
                    Invocation { grants, fs, ..Invocation::new(tool, input, &budget) },
                ));
            let e = t.elapsed();
            assert!(r.result.is_ok(), "{tool}: {:?}", r.result);
            if i >= iters / 10 {
                samples.push(e);
            }
        }
        stats(samples)
    };
    let measure = |pre: &keel::sandbox::Prepared, tool: &str, input: &str, grants: &[Opened]| {
        measure_as(pre, tool, input, grants, FsPolicy::read_only())
    };
    let trivial = measure(&echo_pre, "echo", r#"{"text":"hi"}"#, &[]);
    row("sandbox call: trivial tool (echo)", &trivial);
    let list = measure(&fs_pre, "fs_list_dir", r#"{"path":"/w"}"#, &opened);
    row("sandbox call: fs_list_dir (1 entry)", &list);
    let read = measure(&fs_pre, "fs_read_file", r#"{"path":"/w/small.txt"}"#, &opened);
    row("sandbox call: fs_read_file (1 KiB file)", &read);

    // The whole governed chain: resolve (SQLite) → schema → lease → sandbox.
    let governed_call = |tool: &str, input: &str, grants: &[Grant]| {
        let mut samples = Vec::with_capacity(iters);
        for i in 0..iters + iters / 10 {
            let t = Instant::now();
            let req = CallRequest {
                tool,
                input,
                grants,
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
            assert!(out.report.result.is_ok(), "{tool}: {:?}", out.report.result);
            if i >= iters / 10 {
                samples.push(e);
            }
        }
        stats(samples)
    };
    let input = r#"{"path":"/w/small.txt"}"#;
    let governed = governed_call("fs_read_file", input, &grants);
    row("ToolService call: fs_read_file (governed chain)", &governed);
    // Baseline: the same `fs` component instantiated and called with plain wasmtime and
    // wasmtime-wasi — the directory preopened, a fresh store per call, no keel.
    let (_, fs_bytes, _) =
        keel::builtin::BUILTIN_COMPONENTS.iter().find(|(n, _, _)| *n == "fs").unwrap();
    let plain = bare_calls(&rt, fs_bytes, ws.path(), "fs_read_file", input, iters, false);
    row("bare wasmtime-wasi call: fs_read_file, default engine", &plain);
    let bare = bare_calls(&rt, fs_bytes, ws.path(), "fs_read_file", input, iters, true);
    row("bare wasmtime-wasi call: fs_read_file, pooling engine", &bare);
    println!(
        "ratio: governed p50 / bare (pooling) p50 = {:.2}x (target <= 2x); sandbox p50 / bare p50 = {:.2}x; governed p50 / sandbox p50 = {:.2}x",
        governed.p50.as_secs_f64() / bare.p50.as_secs_f64(),
        read.p50.as_secs_f64() / bare.p50.as_secs_f64(),
        governed.p50.as_secs_f64() / read.p50.as_secs_f64()
    );
    // What the host's trust boundaries add to each call: opening the grant by its identity
    // (a walk of its path without following links, then device and inode compared), and
    // redacting the output of a call with a granted secret (whole values and cut-off starts).
    let samples: Vec<Duration> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            let o = grants[0].opened().unwrap();
            let e = t.elapsed();
            drop(o);
            e
        })
        .collect();
    let identity = stats(samples);
    row("grant identity check (open without links + compare)", &identity);
    // The home's identities, read for each call with a grant (its directories, every file,
    // the directories above it), and every secret of the home, read for each call's redactor
    // (five secrets here; a home without secrets reads nothing).
    let timed = |f: &dyn Fn()| {
        let samples: Vec<Duration> = (0..iters)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect();
        stats(samples)
    };
    let boundary = timed(&|| drop(home.boundary().unwrap()));
    row("home identities for one call (Home::boundary)", &boundary);
    let store = keel::secrets::SecretStore::new(home.root());
    for i in 0..5 {
        store
            .set(&format!("S{i}"), keel::secrets::Secret::new(format!("bench-secret-value-{i:04}")))
            .unwrap();
    }
    let all = timed(&|| drop(store.all().unwrap()));
    row("every secret of the home for one call (5 secrets)", &all);
    let governed_secrets = governed_call("fs_read_file", r#"{"path":"/w/small.txt"}"#, &grants);
    row("ToolService call: fs_read_file, home with 5 secrets", &governed_secrets);
    // The guest's preopen is made from the checked handle (its /proc/self/fd entry) instead
    // of the path: what opening each costs.
    let open_by = |path: &std::path::Path| {
        let samples: Vec<Duration> = (0..iters)
            .map(|_| {
                let t = Instant::now();
                let d = cap_std::fs::Dir::open_ambient_dir(path, cap_std::ambient_authority());
                let e = t.elapsed();
                assert!(d.is_ok());
                e
            })
            .collect();
        stats(samples)
    };
    let by_path = open_by(&grants[0].host);
    let by_handle = {
        use std::os::fd::AsRawFd;
        open_by(std::path::Path::new(&format!("/proc/self/fd/{}", opened[0].dir.as_raw_fd())))
    };
    row("preopen by path (before)", &by_path);
    row("preopen by the checked handle (/proc/self/fd/N)", &by_handle);
    let redactor = keel::secrets::Redactor::new(&[(
        "TOKEN".to_string(),
        keel::secrets::Secret::new("canary-3f9c0a1b2c4d5e6f7a8b9c0d".into()),
    )]);
    let none = keel::sandbox::net::NetGrants::none();
    let call =
        keel_tests::try_call_in(&service, "fs_read_file", input, &grants, none, budget.clone());
    let output = rt.block_on(call).unwrap().report.result.unwrap();
    let samples: Vec<Duration> = (0..iters)
        .map(|_| {
            let mut v = output.clone();
            let t = Instant::now();
            redactor.redact_json(&mut v);
            t.elapsed()
        })
        .collect();
    let redaction = stats(samples);
    row("redaction of an fs_read_file output (1 secret)", &redaction);
    let preopen = by_handle.p50.saturating_sub(by_path.p50);
    let pct = |d: Duration| 100.0 * d.as_secs_f64() / governed.p50.as_secs_f64();
    println!(
        "trust-boundary cost per governed fs_read_file: identity {:.2} % + preopen by handle {:.2} % + redaction {:.2} % = {:.2} % of p50",
        pct(identity.p50),
        pct(preopen),
        pct(redaction.p50),
        pct(identity.p50 + preopen + redaction.p50)
    );
    // A write through the chain: lease, change snapshot before and after, the guarded
    // filesystem on the write path, the change set with its hash; and through the sandbox
    // alone.
    let rw = tempfile::tempdir().unwrap();
    let rw_grants = [Grant::new(rw.path(), "/rw", Access::Rw).unwrap()];
    let write_input = serde_json::json!({"path": "/rw/out.txt", "content": small}).to_string();
    let write = governed_call("fs_write_file", &write_input, &rw_grants);
    row("ToolService call: fs_write_file 1 KiB (governed chain)", &write);
    let writer = FsPolicy {
        read_only: false,
        remove_existing: false,
        write_quota: budget.write_quota,
        max_created: budget.max_files_created,
        undo: None,
    };
    let rw_opened = [rw_grants[0].opened().unwrap()];
    let write = measure_as(&fs_pre, "fs_write_file", &write_input, &rw_opened, writer);
    row("sandbox call: fs_write_file 1 KiB", &write);
    println!();

    // Baseline: one native process per call.
    let path = ws.path().join("small.txt");
    let spawns = (iters / 10).max(100);
    let samples: Vec<Duration> = (0..spawns)
        .map(|_| {
            let t = Instant::now();
            let out = std::process::Command::new("/bin/cat").arg(&path).output().unwrap();
            assert_eq!(out.stdout.len(), small.len());
            t.elapsed()
        })
        .collect();
    let spawn = stats(samples);
    row("baseline: spawn `/bin/cat` of the same file", &spawn);
    println!(
        "ratio: process spawn p50 / sandbox fs_read_file p50 = {:.1}x; / trivial p50 = {:.1}x",
        spawn.p50.as_secs_f64() / read.p50.as_secs_f64(),
        spawn.p50.as_secs_f64() / trivial.p50.as_secs_f64()
    );
    println!();

    // Throughput: 2 worker threads, fresh store per call.
    let mt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let total = iters * 4;
    let per_task = total / 8;
    for (label, tool, input, pre, g) in [
        (
            "throughput, 2 threads: trivial tool (echo)",
            "echo",
            r#"{"text":"hi"}"#,
            echo_pre.clone(),
            vec![],
        ),
        (
            "throughput, 2 threads: fs_read_file (1 KiB)",
            "fs_read_file",
            input,
            fs_pre.clone(),
            opened.to_vec(),
        ),
    ] {
        let started = Instant::now();
        mt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..8 {
                let sandbox = sandbox.clone();
                let pre = pre.clone();
                let g = g.clone();
                let budget = budget.clone();
                tasks.push(tokio::spawn(async move {
                    for _ in 0..per_task {
                        let r = sandbox
                            .invoke(
                                &pre,
                                Invocation { grants: &g, ..Invocation::new(tool, input, &budget) },
                            )
                            .await;
                        assert!(r.result.is_ok());
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        });
        let secs = started.elapsed().as_secs_f64();
        println!("{label:<52} {:>9.0} calls/s", (per_task * 8) as f64 / secs);
    }
}

/// `tool` of the component `bytes` called `iters` times with plain wasmtime and wasmtime-wasi:
/// `dir` preopened read-only as `/w`, a fresh store and instance per call, called async on
/// `rt` as keel calls (wasmtime-wasi's sync bindings would enter a runtime on every WASI
/// call), on the default engine or (`pooling`) one with the pooling instance allocator, as
/// keel's engine has.
/// Nothing of keel runs: no fuel, no deadline, no limits, no grant, no journal.
fn bare_calls(
    rt: &tokio::runtime::Runtime,
    bytes: &[u8],
    dir: &std::path::Path,
    tool: &str,
    input: &str,
    iters: usize,
    pooling: bool,
) -> Stats {
    use wasmtime::component::{Component, Linker, ResourceTable, Val};
    use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
    struct Bare {
        ctx: WasiCtx,
        table: ResourceTable,
    }
    impl WasiView for Bare {
        fn ctx(&mut self) -> WasiCtxView<'_> {
            WasiCtxView { ctx: &mut self.ctx, table: &mut self.table }
        }
    }
    let mut config = wasmtime::Config::new();
    if pooling {
        let mut pool = wasmtime::PoolingAllocationConfig::default();
        pool.total_component_instances(16)
            .total_core_instances(64)
            .total_memories(32)
            .total_tables(64)
            .max_memory_size(256 << 20);
        config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    }
    let engine = wasmtime::Engine::new(&config).unwrap();
    let component = Component::new(&engine, bytes).unwrap();
    let mut linker = Linker::<Bare>::new(&engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
    let pre = linker.instantiate_pre(&component).unwrap();
    let tools = component.get_export_index(None, keel::sandbox::TOOLS_INTERFACE).unwrap();
    let invoke = component.get_export_index(Some(&tools), "invoke").unwrap();
    let mut samples = Vec::with_capacity(iters);
    for i in 0..iters + iters / 10 {
        let t = Instant::now();
        let mut wasi = WasiCtxBuilder::new();
        wasi.preopened_dir(dir, "/w", FsPerms::ReadOnly).unwrap();
        let state = Bare { ctx: wasi.build(), table: ResourceTable::new() };
        let mut store = wasmtime::Store::new(&engine, state);
        let mut out = [Val::Bool(false)];
        rt.block_on(async {
            let instance = pre.instantiate_async(&mut store).await.unwrap();
            let f = instance.get_func(&mut store, invoke).unwrap();
            let args = [Val::String(tool.into()), Val::String(input.into())];
            f.call_async(&mut store, &args, &mut out).await.unwrap();
        });
        let ok = matches!(&out[0], Val::Result(Ok(_)));
        drop(store);
        let e = t.elapsed();
        assert!(ok, "{tool}: {:?}", out[0]);
        if i >= iters / 10 {
            samples.push(e);
        }
    }
    stats(samples)
}
