//! Tool authoring benchmark: prints figures, asserts nothing about time.
//!
//! `cargo bench -p keel-tests --bench authoring`. Measures, on the first-party `fs` component
//! (about 300 KiB): embedding a signature, checking one (`keel tool verify --key`), finding
//! which trusted key signed it among 10 (install's signature check), and, as the baseline
//! every install pays anyway, the component's SHA-256 — printed as ratios. Then, when Debian's
//! `docker-registry` can be started (as in the registry test tier), installing the signed
//! component by digest from a registry on loopback: the pull with its digest checks, the
//! signature check and the import check (everything an install does before it compiles),
//! against the whole install with its compile.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The median of `iters` runs of `f`.
fn median(iters: usize, mut f: impl FnMut()) -> Duration {
    let mut samples: Vec<Duration> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let iters = env_usize("KEEL_BENCH_ITERS", 200);
    let (_, fs, _) = keel::builtin::BUILTIN_COMPONENTS
        .iter()
        .find(|(name, _, _)| *name == "fs")
        .expect("the fs component is built in");
    println!(
        "keel authoring benchmark (median of {iters} runs; fs component, {} KiB)",
        fs.len() / 1024
    );
    let (public, secret) = keel::signing::generate();
    let mut signed = Vec::new();
    let sign = median(iters, || signed = keel::signing::sign(fs, &secret).unwrap());
    let verify = median(iters, || keel::signing::verify(&signed, &public).unwrap());
    let keys: Vec<(usize, keel::signing::PublicKey)> = (0..9)
        .map(|i| (i, keel::signing::generate().0))
        .chain(std::iter::once((9, public.clone())))
        .collect();
    let find = median(iters, || assert_eq!(keel::signing::signers(&signed, &keys), vec![&9]));
    let digest = median(iters, || {
        std::hint::black_box(keel::digest::sha256_hex(&signed));
    });
    println!("sign (embed a signature)                        {:>8.3} ms", ms(sign));
    println!("verify with one key (keel tool verify --key)    {:>8.3} ms", ms(verify));
    println!("find the signer among 10 trusted keys           {:>8.3} ms", ms(find));
    println!("baseline: SHA-256 of the component              {:>8.3} ms", ms(digest));
    println!(
        "ratio: verify / SHA-256 = {:.2}x; signer among 10 / SHA-256 = {:.2}x",
        verify.as_secs_f64() / digest.as_secs_f64(),
        find.as_secs_f64() / digest.as_secs_f64()
    );
    registry(iters.min(50), fs, &public, &secret);
}

/// Install by digest from a registry on loopback, with and without the compile.
fn registry(iters: usize, fs: &[u8], public: &keel::signing::PublicKey, secret: &str) {
    let started = std::process::Command::new(
        std::env::var("KEEL_TEST_REGISTRY").unwrap_or_else(|_| "docker-registry".into()),
    )
    .arg("--version")
    .output();
    if !started.is_ok_and(|o| o.status.success()) {
        println!("registry: skipped (install Debian's docker-registry, or set KEEL_TEST_REGISTRY)");
        return;
    }
    let registry = keel_tests::oci_registry::OciRegistry::start();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let op = &keel::api::Caller::Operator;
    rt.block_on(async {
        let home = keel::home::Home::at(dir.path()).unwrap();
        let limits = keel_tests::test_limits();
        let h = keel::harness::Harness::open(home, limits, None, Default::default(), &|_| {})
            .await
            .unwrap();
        let package = format!("{}/bench/*", registry.addr);
        h.trust_add(op, "bench", &public.to_string(), &package).unwrap();
        let tools = h.internals().tools.clone();
        let limit = tools.sandbox().limits().max_component_bytes;
        let effects = std::fs::read(keel_tests::guests::EFFECTS_COMPONENT).unwrap();
        for (name, bytes) in [("fs", fs), ("effects", effects.as_slice())] {
            let signed = keel::signing::sign(bytes, secret).unwrap();
            let tagged = registry.reference(&format!("bench/{name}:1"));
            let pushed = h.publish_tool(op, signed, &tagged, None).await.unwrap();
            let pinned: keel::oci::OciRef = pushed.pinned.parse().unwrap();
            let mut before_compile = Vec::new();
            for _ in 0..iters {
                let t = Instant::now();
                let limits = keel::oci::Limits::default();
                let client = keel::oci::Registry::new(&pinned, None, limits).unwrap();
                let pulled = client.pull(&pinned, keel::oci::ArtifactKind::Component, limit).await;
                let bytes = &pulled.unwrap().files[0].1;
                tools.registry_verdict(bytes, &pinned.package(), false).unwrap();
                tools.sandbox().check_imports(bytes, false).unwrap();
                before_compile.push(t.elapsed());
            }
            before_compile.sort();
            let pull = before_compile[before_compile.len() / 2];
            println!(
                "install by digest from a loopback registry before compiling ({name}, {} KiB: pull, digests, signature, imports) {:>8.3} ms",
                bytes.len() / 1024,
                ms(pull)
            );
            if name == "fs" {
                continue; // the first-party `fs` owns its tool names: no second install
            }
            let mut whole = Vec::new();
            for _ in 0..iters.min(10) {
                let _ = h.remove_tool(op, name);
                let t = Instant::now();
                h.install_tool_from(op, &pushed.pinned, &Default::default()).await.unwrap();
                whole.push(t.elapsed());
            }
            whole.sort();
            let all = whole[whole.len() / 2];
            println!(
                "the whole install ({name}: the same, then compile, describe, record)                        {:>8.3} ms",
                ms(all)
            );
            println!(
                "ratio: before compiling / whole install = {:.3}",
                pull.as_secs_f64() / all.as_secs_f64()
            );
        }
    });
}
