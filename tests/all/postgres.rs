//! The store on a real PostgreSQL server (Debian's `postgresql`, a throwaway cluster per test,
//! run as an unprivileged user): fencing of a runner whose lease was taken over, recovery
//! racing a host that takes a session's first lease, wake-ups of
//! event followers by `LISTEN/NOTIFY` that survive a killed listener and a restarted server.
//! Ignored by default (`--ignored postgres`): the PostgreSQL tier of `.ci/run`.

use std::time::Duration;

use keel::ids::SessionId;
use keel::session::RuntimeState;
use keel::store::StoreError;
use keel_tests::postgres::Cluster;

/// A home whose store is database `db` of `pg`.
fn home_on(pg: &Cluster, db: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keel.toml"), format!("[store]\nurl = \"{}\"\n", pg.url(db)))
        .unwrap();
    dir
}

async fn harness(dir: &std::path::Path) -> keel::harness::Harness {
    let home = keel::home::Home::at(dir).unwrap();
    keel::harness::Harness::open(
        home,
        keel_tests::test_limits(),
        None,
        keel::agent::LoopGuards::default(),
        &|_| {},
    )
    .await
    .unwrap()
}

async fn session(h: &keel::harness::Harness, id: &str) -> SessionId {
    keel_tests::plain_session(h, id, &[], "http://127.0.0.1:9/v1").await;
    SessionId::from(id)
}

/// Runs `statements` in one transaction in `psql` on database `keel`, held open for 2 s after
/// them; returns once the server is in that wait (the transaction holds its locks), with the
/// thread that ends when it committed.
fn hold(pg: &Cluster, statements: &str) -> std::thread::JoinHandle<std::process::ExitStatus> {
    let url = pg.url("keel");
    let sql = format!("BEGIN; {statements}; SELECT pg_sleep(2); COMMIT;");
    let held = std::thread::spawn(move || {
        std::process::Command::new(keel_tests::postgres::bin_dir().unwrap().join("psql"))
            .arg(url)
            .args(["-X", "-q", "-o", "/dev/null", "-v", "ON_ERROR_STOP=1", "-c", &sql])
            .status()
            .unwrap()
    });
    for _ in 0..200 {
        let n = pg
            .psql("keel", "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(2)%' AND state='active' AND pid <> pg_backend_pid()")
            .unwrap();
        if n == "1" {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    held
}

fn started() -> Cluster {
    Cluster::start(&[]).expect("a PostgreSQL server (install Debian's postgresql)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_a_runner_whose_lease_was_taken_over_writes_nothing() {
    let pg = started();
    pg.create_database("keel").unwrap();
    let dir = home_on(&pg, "keel");
    let h = harness(dir.path()).await;
    let id = session(&h, "fenced").await;
    let i = h.internals();
    assert!(i.brain.try_acquire(&id).await.unwrap());
    i.engine.set_state(&id, RuntimeState::Running, None).await.unwrap();
    let fence = |pg: &Cluster| {
        pg.psql("keel", "SELECT fence FROM runner_leases WHERE session_id='fenced'").unwrap()
    };
    assert_eq!(fence(&pg), "1");
    let events = |pg: &Cluster| {
        pg.psql("keel", "SELECT count(*) FROM session_events WHERE session_id='fenced'").unwrap()
    };
    let before = events(&pg);

    // Another host takes the session over (its lease expired): a new holder, the next token.
    pg.psql(
        "keel",
        "UPDATE runner_leases SET owner='elsewhere/1/1/x', fence=fence+1 WHERE session_id='fenced'",
    )
    .unwrap();
    let e = i.engine.set_state(&id, RuntimeState::Idle, None).await.unwrap_err();
    assert!(matches!(e, StoreError::Fenced(_)), "{e}");
    assert_eq!(e.kind(), "fenced");
    assert!(e.to_string().contains("taken over by elsewhere/1/1/x (token 2)"), "{e}");
    assert_eq!(
        i.engine.runtime(&id).await.unwrap().state,
        RuntimeState::Running,
        "nothing written"
    );
    assert_eq!(events(&pg), before, "no event either");
    // The taken-over runner cannot renew either, and its next acquisition waits for the new
    // holder's lease to expire.
    assert!(!i.brain.try_acquire(&id).await.unwrap());
}

/// A fenced write that comes while another host's acquisition is under way waits for it (the
/// lease row is read `FOR SHARE`, which conflicts with the acquisition's update of the token),
/// then finds its token stale and writes nothing. With `FOR KEY SHARE` it would not wait, and
/// would commit after the takeover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_a_write_racing_a_takeover_waits_for_it_and_is_refused() {
    let pg = started();
    pg.create_database("keel").unwrap();
    let dir = home_on(&pg, "keel");
    let h = harness(dir.path()).await;
    let id = session(&h, "raced").await;
    let i = h.internals();
    assert!(i.brain.try_acquire(&id).await.unwrap());
    // The takeover: its update of the lease row is made, and held uncommitted for 2 s.
    let takeover = hold(
        &pg,
        "UPDATE runner_leases SET owner='elsewhere/1/1/y', fence=fence+1 WHERE session_id='raced'",
    );
    let started = std::time::Instant::now();
    let e = i.engine.set_state(&id, RuntimeState::Running, None).await.unwrap_err();
    let waited = started.elapsed();
    assert!(takeover.join().unwrap().success());
    assert!(matches!(e, StoreError::Fenced(_)), "{e}");
    assert!(waited >= Duration::from_millis(500), "the write waited for the takeover: {waited:?}");
    assert_ne!(i.engine.runtime(&id).await.unwrap().state, RuntimeState::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_recovery_waits_for_a_host_taking_a_first_lease_and_leaves_its_turn_alone() {
    let pg = started();
    pg.create_database("keel").unwrap();
    let dir = home_on(&pg, "keel");
    let h = harness(dir.path()).await;
    let id = session(&h, "first").await;
    let i = h.internals();
    // An input waits: recovery would resume the session if no runner held it.
    i.engine.submit(&id, "do the thing").await.unwrap();
    // Another host takes the session's first lease and begins its turn, in one transaction
    // held open for 2 s (the session never had a lease row).
    let taker = hold(
        &pg,
        "INSERT INTO runner_leases (session_id, owner, heartbeat_ms, fence) \
         VALUES ('first', 'elsewhere/1/1/z', \
                 (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT, 1); \
         UPDATE sessions SET state='running', active_turn=1 WHERE id='first'",
    );
    // This host's recovery, meanwhile: it waits for the taker and leaves the session to it.
    let started = std::time::Instant::now();
    let recovered = i.brain.recover().await.unwrap();
    let waited = started.elapsed();
    assert!(taker.join().unwrap().success());
    assert!(
        recovered.iter().all(|r| r.id.as_str() != "first"),
        "recovery took a session another host had just begun: {recovered:?}"
    );
    assert!(waited >= Duration::from_millis(500), "recovery waited for the taker: {waited:?}");
    assert_eq!(
        pg.psql("keel", "SELECT owner, fence FROM runner_leases WHERE session_id='first'").unwrap(),
        "elsewhere/1/1/z|1",
        "the taker's lease stands"
    );
    assert_eq!(i.engine.runtime(&id).await.unwrap().state, RuntimeState::Running);
}

/// Receives the next event of `rx` within `within`.
async fn next_event(
    rx: &mut tokio::sync::mpsc::Receiver<Result<keel::session::EventRow, StoreError>>,
    within: Duration,
) -> Option<keel::session::EventRow> {
    tokio::time::timeout(within, rx.recv()).await.ok().flatten().map(|r| r.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_followers_wake_on_notify_across_hosts_and_catch_up_after_losses() {
    let pg = started();
    pg.create_database("keel").unwrap();
    let (a_dir, b_dir) = (home_on(&pg, "keel"), home_on(&pg, "keel"));
    let (a, b) = (harness(a_dir.path()).await, harness(b_dir.path()).await);
    let id = session(&a, "followed").await;
    let last = a.internals().engine.last_event(&id).await.unwrap();
    // The fallback poll is an hour: only a notification can wake the follower.
    let mut rx = a.internals().engine.follow(&id, last, Duration::from_secs(3600));
    // Let the listener connect.
    for _ in 0..200 {
        if a.internals().db.stats().listens.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Host B commits; host A's follower is woken by the notification.
    b.internals().engine.submit(&id, "first").await.unwrap();
    let e = next_event(&mut rx, Duration::from_secs(10)).await.expect("woken by NOTIFY");
    assert_eq!(e.event.kind(), "input_accepted");

    // The listener's backend is killed: A listens again and catches up.
    let killed = pg
        .psql(
            "keel",
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = 'keel-listener') t",
        )
        .unwrap();
    assert_ne!(killed, "0", "listeners were connected");
    let listens = || a.internals().db.stats().listens.load(std::sync::atomic::Ordering::Relaxed);
    let t = std::time::Instant::now();
    while listens() < 2 && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(listens() >= 2, "the listener listens again after its backend was killed");
    b.internals().engine.submit(&id, "second").await.unwrap();
    let e = next_event(&mut rx, Duration::from_secs(10)).await.expect("caught up after the kill");
    assert_eq!(e.seq, last + 2);

    // The server restarts (as after a crash): both hosts connect again; nothing is missed.
    // A second follower polls every 100 ms, so it reads while the server is down: it waits
    // the outage out instead of ending.
    let mut polling = a.internals().engine.follow(&id, last + 2, Duration::from_millis(100));
    pg.stop_immediate().unwrap();
    let refused = b.internals().engine.submit(&id, "while down").await;
    assert!(refused.is_err(), "the database is down");
    tokio::time::sleep(Duration::from_millis(500)).await;
    pg.start_again().unwrap();
    // Reads on connections pooled before the restart are made again on new ones, not failed.
    for _ in 0..6 {
        a.internals().engine.events_after(&id, 0, 10).await.expect("a read after the restart");
    }
    let mut third = Err(StoreError::WriterGone);
    for _ in 0..100 {
        third = b.internals().engine.submit(&id, "third").await;
        if third.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    third.expect("the writer connects again");
    let e =
        next_event(&mut rx, Duration::from_secs(15)).await.expect("caught up after the restart");
    assert_eq!(e.seq, last + 3, "sequence numbers stay contiguous");
    let e = next_event(&mut polling, Duration::from_secs(15))
        .await
        .expect("a follower that read while the server was down catches up after it");
    assert_eq!(e.seq, last + 3);
    let t = std::time::Instant::now();
    while listens() < 3 && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(listens() >= 3, "listened again after the kill and after the restart: {}", listens());
    // The tool catalog's own connection was dropped by the restart too: it connects again.
    a.internals().tools.resolve("fs_list_dir").expect("the catalog reads after a restart");
}

/// The figure the issue set for a turn on PostgreSQL: an input, its turn and its answer.
const TRIPS_PER_TURN: u64 = 30;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_a_turn_waits_for_at_most_30_round_trips_and_loses_nothing() {
    use keel::api::Caller;
    use keel::cancel::CancelToken;
    use keel_tests::mock_model::{MockModel, Reply};
    let pg = started();
    pg.create_database("keel").unwrap();
    let home = home_on(&pg, "keel");
    let h = harness(home.path()).await;
    let model = MockModel::start_fn(std::sync::Arc::new(|body: &[u8]| {
        // Each answer names the number of messages it was sent: a turn whose writes were lost
        // or read stale would answer with the wrong count.
        let v: serde_json::Value = serde_json::from_slice(body).unwrap();
        Reply::text(&format!("seen {}", v["messages"].as_array().unwrap().len()))
    }))
    .await;
    keel_tests::plain_session(&h, "s", &[], &model.url()).await;
    let mut trips = Vec::new();
    for turn in 1..=4 {
        let before =
            h.internals().db.stats().round_trips.load(std::sync::atomic::Ordering::Relaxed);
        let ran = h
            .send(
                &Caller::Operator,
                "s",
                &format!("input {turn}"),
                &CancelToken::new(),
                &keel_tests::no_events(),
            )
            .await
            .unwrap();
        let after = h.internals().db.stats().round_trips.load(std::sync::atomic::Ordering::Relaxed);
        trips.push(after - before);
        // keel's two leading messages, a user and an assistant message per earlier turn, and
        // this turn's input.
        let want = format!("seen {}", 2 + 2 * (turn - 1) + 1);
        assert!(
            matches!(&ran, keel::brain::Submitted::Ran(keel::agent::TurnOutcome::Answer(a)) if *a == want),
            "turn {turn}: {ran:?}, expected the answer {want:?}"
        );
    }
    println!("round trips of turns 1-4: {trips:?}");
    // The first turn prepares the statements of each connection; the later ones are the
    // steady state.
    for (i, t) in trips.iter().enumerate().skip(1) {
        assert!(
            *t <= TRIPS_PER_TURN,
            "turn {} waited for {t} round trips (at most {TRIPS_PER_TURN})",
            i + 1
        );
    }
    let rows = pg
        .psql("keel", "SELECT string_agg(role || ':' || turn, ',' ORDER BY seq) FROM messages WHERE session_id='s'")
        .unwrap();
    assert_eq!(rows, "user:1,assistant:1,user:2,assistant:2,user:3,assistant:3,user:4,assistant:4");
    let idle = pg.psql("keel", "SELECT state || ',' || turns || ',' || COALESCE(active_turn::text, '-') FROM sessions WHERE id='s'").unwrap();
    assert_eq!(idle, "idle,4,-");
    let leases = pg.psql("keel", "SELECT owner FROM runner_leases WHERE session_id='s'").unwrap();
    assert_eq!(leases, "", "the last turn released the lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_statements_sent_ahead_or_without_waiting_keep_their_order_and_errors() {
    let pg = started();
    pg.create_database("keel").unwrap();
    let url = pg.url("keel");
    let mut c = keel::store::connect(&keel::store::Location::Postgres { url }).unwrap();
    c.execute_batch("CREATE TABLE t (k TEXT PRIMARY KEY, v BIGINT NOT NULL)").unwrap();

    // A statement sent without waiting that fails fails the next one that waits, with its
    // own error (not "the transaction is aborted"), and the transaction writes nothing.
    {
        let tx = c.transaction().unwrap();
        let mut insert = tx.prepare_cached("INSERT INTO t (k, v) VALUES (?1, ?2)").unwrap();
        insert.execute_pipelined([&"a" as &dyn keel::sql::ToSql, &1i64]).unwrap();
        insert.execute_pipelined([&"a" as &dyn keel::sql::ToSql, &2i64]).unwrap();
        let err = tx.query_row("SELECT count(*) FROM t", [], |r| r.get::<_, i64>(0)).unwrap_err();
        assert!(err.to_string().contains("23505"), "{err}");
    }
    assert_eq!(pg.psql("keel", "SELECT count(*) FROM t").unwrap(), "0");

    // Statements sent without waiting are seen by the reads after them, and their replies
    // share one round trip with the read.
    let tx = c.transaction().unwrap();
    let before = tx.round_trips();
    let mut insert = tx.prepare_cached("INSERT INTO t (k, v) VALUES (?1, ?2)").unwrap();
    for (k, v) in [("a", 1), ("b", 2), ("c", 3)] {
        insert.execute_pipelined([&k as &dyn keel::sql::ToSql, &(v as i64)]).unwrap();
    }
    drop(insert);
    let sum: i64 = tx.query_row("SELECT sum(v) FROM t", [], |r| r.get(0)).unwrap();
    assert_eq!(sum, 6);
    // Prepared already: the BEGIN, three inserts and the read in one round trip (the read's
    // statement was prepared in one of its own).
    assert!(tx.round_trips() - before <= 2, "{} round trips", tx.round_trips() - before);

    // Reads sent ahead are read in one round trip between them …
    const ONE: &str = "SELECT v FROM t WHERE k=?1";
    tx.query_row(ONE, ["a"], |r| r.get::<_, i64>(0)).unwrap();
    let before = tx.round_trips();
    tx.prefetch(ONE, ["b"]).unwrap();
    tx.prefetch(ONE, ["c"]).unwrap();
    let b: i64 = tx.prepare_cached(ONE).unwrap().query_row(["b"], |r| r.get(0)).unwrap();
    let c3: i64 = tx.prepare_cached(ONE).unwrap().query_row(["c"], |r| r.get(0)).unwrap();
    assert_eq!((b, c3), (2, 3));
    assert_eq!(tx.round_trips() - before, 1);
    // … and a write after them drops them: the read sees the write.
    tx.prefetch(ONE, ["b"]).unwrap();
    tx.prepare_cached("UPDATE t SET v=20 WHERE k=?1").unwrap().execute(["b"]).unwrap();
    let b: i64 = tx.prepare_cached(ONE).unwrap().query_row(["b"], |r| r.get(0)).unwrap();
    assert_eq!(b, 20);
    // A read with other parameters than the one sent ahead asks the server.
    tx.prefetch(ONE, ["a"]).unwrap();
    let c3: i64 = tx.prepare_cached(ONE).unwrap().query_row(["c"], |r| r.get(0)).unwrap();
    assert_eq!(c3, 3);
    tx.commit().unwrap();
    assert_eq!(
        pg.psql("keel", "SELECT string_agg(k || v, ',' ORDER BY k) FROM t").unwrap(),
        "a1,b20,c3"
    );
}
