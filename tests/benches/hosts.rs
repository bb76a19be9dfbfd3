//! Several hosts on one PostgreSQL beside one host on SQLite: the same workload on the same
//! machine.
//!
//! 1. Turns per second and p50/p99 per turn with 1, 2 and 3 hosts on PostgreSQL, and with one
//!    host on SQLite (the baseline, measured in the same run). A host is a harness with a home
//!    of its own; the PostgreSQL hosts share one database (a throwaway cluster of Debian's
//!    `postgresql`, durable commits as by default). Here the hosts share this process and its
//!    2 cores, as hosts on one machine would. Each host drives `KEEL_BENCH_SESSIONS` sessions
//!    (default 4) at once, `KEEL_BENCH_TURNS` turns each (default 25); a turn is an input and
//!    a streamed answer from a scripted model server on loopback (task understanding off).
//!    Per turn it also prints the store's writes and reads, the round trips to PostgreSQL with
//!    the mean wait of one, and the writers' busy time with the commits' share of it: where a
//!    turn's time goes.
//! 2. Claim latency: the transaction a host runs to take a free session's lease (p50/p99).
//! 3. Wake-up latency: from a commit on one host to the event reaching a follower on another
//!    (`LISTEN/NOTIFY`; the follower's fallback poll is an hour, so only the notification
//!    counts) (p50/p99).
//!
//! Takeover after a host stops is measured by the two-host test of the PostgreSQL tier, which
//! prints it. `cargo bench -p keel-tests --bench hosts`. Prints figures; asserts nothing about
//! time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, clippy::print_stderr)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel::api::Caller;
use keel::cancel::CancelToken;
use keel::harness::Harness;
use keel::ids::SessionId;
use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::postgres::Cluster;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

async fn harness(dir: &Path, url: Option<&str>) -> Harness {
    if let Some(url) = url {
        std::fs::write(dir.join("keel.toml"), format!("[store]\nurl = \"{url}\"\n")).unwrap();
    }
    let home = keel::home::Home::at(dir).unwrap();
    Harness::open(home, keel_tests::test_limits(), None, Default::default(), &|_| {}).await.unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

/// What a run of turns measured.
struct Figures {
    turns_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    writes: f64,
    reads: f64,
    /// Round trips to PostgreSQL per turn, and the mean wait of one in µs.
    round_trips: f64,
    round_trip_us: f64,
    /// The writers' busy time per turn (operations and commits), ms.
    writer_ms: f64,
    /// Of it, commits, ms.
    commit_ms: f64,
    /// CPU time per turn, ms: this process (hosts and model server), and the database server.
    cpu_ms: f64,
    db_cpu_ms: f64,
}

/// CPU time (user and system) of this process so far.
fn own_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// CPU time of every `postgres` process of this machine so far (their `schedstat`; the bench's
/// cluster is the only one it starts, and a backend that ended is not counted).
fn db_cpu() -> Duration {
    let mut ns = 0u64;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim() != "postgres" {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("schedstat")).unwrap_or_default();
        ns += stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    Duration::from_nanos(ns)
}

/// Runs the turns of `hosts` (each with its sessions) at once.
async fn run(hosts: &[Arc<Harness>], model: &str, sessions: usize, turns: usize) -> Figures {
    let mut ids = Vec::new();
    for (n, h) in hosts.iter().enumerate() {
        for s in 0..sessions {
            let id = format!("h{n}s{s}-{}", keel::store::now_ms());
            keel_tests::plain_session(h, &id, &[], model).await;
            ids.push((h.clone(), id));
        }
    }
    let ops = || -> [u64; 4] {
        let stats = hosts.iter().map(|h| h.internals().db.stats());
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        stats.fold([0; 4], |[w, r, o, c], s| {
            [
                w + load(&s.operations),
                r + load(&s.reads),
                o + load(&s.ops_ns),
                c + load(&s.commit_ns),
            ]
        })
    };
    let ops_before = ops();
    let trips_before = keel::sql::postgres_round_trips();
    let (cpu_before, db_before) = (own_cpu(), db_cpu());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (h, id) in ids {
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::with_capacity(turns);
            for _ in 0..turns {
                let t = Instant::now();
                h.send(
                    &Caller::Operator,
                    &id,
                    "Go on.",
                    &CancelToken::new(),
                    &keel_tests::no_events(),
                )
                .await
                .unwrap();
                took.push(t.elapsed());
            }
            took
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let wall = started.elapsed().as_secs_f64();
    let (cpu, db) = (own_cpu() - cpu_before, db_cpu().saturating_sub(db_before));
    all.sort();
    let after = ops();
    let trips = keel::sql::postgres_round_trips();
    let n = all.len() as f64;
    let per_turn = |i: usize| (after[i] - ops_before[i]) as f64 / n;
    let round_trips = (trips.0 - trips_before.0) as f64;
    Figures {
        turns_per_s: n / wall,
        p50_ms: percentile(&all, 0.5),
        p99_ms: percentile(&all, 0.99),
        writes: per_turn(0),
        reads: per_turn(1),
        round_trips: round_trips / n,
        round_trip_us: if round_trips > 0.0 {
            (trips.1 - trips_before.1).as_secs_f64() * 1e6 / round_trips
        } else {
            0.0
        },
        writer_ms: (per_turn(2) + per_turn(3)) / 1e6,
        commit_ms: per_turn(3) / 1e6,
        cpu_ms: cpu.as_secs_f64() * 1000.0 / n,
        db_cpu_ms: db.as_secs_f64() * 1000.0 / n,
    }
}

fn print_row(store: &str, hosts: usize, turns: usize, f: &Figures, baseline: Option<f64>) {
    println!(
        "{store:<9} {hosts:>5} {turns:>6} {:>8.1} {:>7.2} {:>7.2} {:>7.1} {:>6.1} {:>6.1} {:>7.0} {:>7.2} {:>7.2} {:>7.2} {:>7.2}{}",
        f.turns_per_s,
        f.p50_ms,
        f.p99_ms,
        f.writes,
        f.reads,
        f.round_trips,
        f.round_trip_us,
        f.writer_ms,
        f.commit_ms,
        f.cpu_ms,
        f.db_cpu_ms,
        baseline.map(|b| format!("   ({:.2} × SQLite)", f.turns_per_s / b)).unwrap_or_default()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sessions = env_or("KEEL_BENCH_SESSIONS", 4);
    let turns = env_or("KEEL_BENCH_TURNS", 25);
    let model = MockModel::start_fn(Arc::new(|_: &[u8]| Reply::text("Done."))).await;
    let pg = Cluster::start(&[]).expect("a PostgreSQL server (install Debian's postgresql)");
    println!(
        "turns: {sessions} session(s) per host, {turns} turn(s) each; 2 CPUs; PostgreSQL {} with fsync",
        pg.psql("postgres", "SHOW server_version").unwrap()
    );
    println!(
        "per turn: writes and reads (store operations), round trips to PostgreSQL and the mean \
         wait of one, the writers' busy time and the commits' share of it, CPU time of the \
         hosts' process and of the database server"
    );
    println!(
        "{:<9} {:>5} {:>6} {:>8} {:>7} {:>7} {:>7} {:>6} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7}",
        "store",
        "hosts",
        "turns",
        "turns/s",
        "p50 ms",
        "p99 ms",
        "writes",
        "reads",
        "trips",
        "µs/trip",
        "wr ms",
        "cmt ms",
        "cpu ms",
        "db cpu"
    );

    let sqlite_home = tempfile::tempdir().unwrap();
    let sqlite = Arc::new(harness(sqlite_home.path(), None).await);
    let f = run(std::slice::from_ref(&sqlite), &model.url(), sessions, turns).await;
    print_row("sqlite", 1, sessions * turns, &f, None);
    drop(sqlite);
    let baseline = f.turns_per_s;

    let mut homes = Vec::new();
    for n in 1..=3 {
        let db = format!("bench{n}");
        pg.create_database(&db).unwrap();
        let mut hosts = Vec::new();
        for _ in 0..n {
            let home = tempfile::tempdir().unwrap();
            hosts.push(Arc::new(harness(home.path(), Some(&pg.url(&db))).await));
            homes.push(home);
        }
        let f = run(&hosts, &model.url(), sessions, turns).await;
        print_row("postgres", n, n * sessions * turns, &f, Some(baseline));
    }

    // Claims: a free session's lease taken by a host, one at a time.
    pg.create_database("claims").unwrap();
    let (a_home, b_home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = harness(a_home.path(), Some(&pg.url("claims"))).await;
    let b = harness(b_home.path(), Some(&pg.url("claims"))).await;
    let mut claims = Vec::new();
    for i in 0..200 {
        let id = format!("claim{i}");
        keel_tests::plain_session(&a, &id, &[], &model.url()).await;
        let t = Instant::now();
        assert!(a.internals().brain.try_acquire(&SessionId::from(id.as_str())).await.unwrap());
        claims.push(t.elapsed());
    }
    claims.sort();
    println!(
        "claim a free session's lease: p50 {:.2} ms, p99 {:.2} ms (200 claims)",
        percentile(&claims, 0.5),
        percentile(&claims, 0.99)
    );

    // Wake-ups: a commit on host B reaching a follower on host A.
    let id = SessionId::from("woken");
    keel_tests::plain_session(&a, "woken", &[], &model.url()).await;
    let last = a.internals().engine.last_event(&id).await.unwrap();
    let mut rx = a.internals().engine.follow(&id, last, Duration::from_secs(3600));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (mut wakes, mut commits) = (Vec::new(), Vec::new());
    for i in 0..200 {
        let t = Instant::now();
        b.internals().engine.submit(&id, &format!("input {i}")).await.unwrap();
        commits.push(t.elapsed());
        tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap().unwrap();
        wakes.push(t.elapsed());
    }
    wakes.sort();
    commits.sort();
    println!(
        "wake-up: from another host's input until its event reached the follower: p50 {:.2} ms, \
         p99 {:.2} ms; the input's own commit (acknowledged): p50 {:.2} ms, p99 {:.2} ms (200 events)",
        percentile(&wakes, 0.5),
        percentile(&wakes, 0.99),
        percentile(&commits, 0.5),
        percentile(&commits, 0.99)
    );
}
