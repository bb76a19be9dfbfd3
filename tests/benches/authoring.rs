//! Tool authoring benchmark: prints figures, asserts nothing about time.
//!
//! `cargo bench -p keel-tests --bench authoring`. Measures, on the first-party `fs` component
//! (about 300 KiB): embedding a signature, checking one (`keel tool verify --key`), finding
//! which trusted key signed it among 10 (install's signature check), and, as the baseline
//! every install pays anyway, the component's SHA-256 — printed as ratios.
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
    let (_, fs) = keel::builtin::BUILTIN_COMPONENTS
        .iter()
        .find(|(name, _)| *name == "fs")
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
}
