//! Named crash points for the crash-test harness.
//!
//! With the `crash-points` feature (enabled for this package's tests only, by its
//! dev-dependency on itself), `KEEL_CRASH_AT=NAME` kills this process
//! with SIGKILL the first time it passes the point `NAME`; `KEEL_CRASH_AT=NAME:N` at the N-th
//! time. Without the feature every point compiles to nothing.
//!
//! With `KEEL_CRASH_HOLD=PATH` as well, the process holds at the point before it dies: it
//! creates `PATH.reached`, waits until `PATH` exists (a minute at most), then is killed — so a
//! test can change the store while the process is alive at the point (another process's
//! commit racing it) and then have it die there.
//!
//! Points: `before_intent`, `after_intent`, `after_effect`, `after_result`, `after_decision`,
//! `after_understanding_call`, `after_recall`, `after_orchestration_call`, `after_summary_call`,
//! `after_checkpoint`, `after_promotion`, `mid_migration`; in a workgroup, `after_spawn`,
//! `after_child_answer`, `before_parent_consumes`; `mid_rewind` (after each path a rewind
//! puts back).

/// Passes the crash point `name`.
#[cfg(feature = "crash-points")]
pub fn point(name: &str) {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};
    static TARGET: OnceLock<Option<(String, u32)>> = OnceLock::new();
    static HITS: AtomicU32 = AtomicU32::new(0);
    let target = TARGET.get_or_init(|| {
        let v = std::env::var("KEEL_CRASH_AT").ok()?;
        let (n, k) = match v.split_once(':') {
            Some((n, k)) => (n.to_string(), k.parse().unwrap_or(1)),
            None => (v, 1),
        };
        Some((n, k))
    });
    if let Some((n, k)) = target
        && n == name
        && HITS.fetch_add(1, Ordering::SeqCst) + 1 == *k
    {
        if let Ok(hold) = std::env::var("KEEL_CRASH_HOLD") {
            let _ = std::fs::write(format!("{hold}.reached"), name);
            let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while !std::path::Path::new(&hold).exists() && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        tracing::warn!(point = name, "crash point reached: killing the process");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        // SIGKILL cannot be caught; should it somehow not arrive, stop anyway without cleanup.
        std::process::abort();
    }
}

/// Passes the crash point `name` (a no-op in this build).
#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn point(_name: &str) {}
