//! The store's durability setting (`[store] synchronous` in `keel.toml`): applied to the
//! writer's connection, refused clearly when it is not one of the known modes.

use keel::agent::LoopGuards;
use keel::harness::Harness;
use keel::home::Home;
use keel_tests::test_limits;

async fn open(dir: &std::path::Path) -> Result<Harness, String> {
    let home = Home::at(dir).unwrap();
    Harness::open(home, test_limits(), None, LoopGuards::default(), &|_| {})
        .await
        .map_err(|e| e.to_string())
}

/// `PRAGMA synchronous` of the writer's connection (0 off, 1 normal, 2 full), read through a
/// write operation so that it is the writer's own connection that answers.
async fn writer_synchronous(h: &Harness) -> i64 {
    h.internals()
        .db
        .run(|c| {
            Ok(c.sqlite()
                .unwrap()
                .pragma_query_value(None, "synchronous", |r| r.get::<_, i64>(0))?)
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_is_full_by_default_and_follows_keel_toml() {
    if keel_tests::on_postgres("synchronous") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let h = open(dir.path()).await.unwrap();
    assert_eq!(writer_synchronous(&h).await, 2, "full by default");
    drop(h);

    // Other tables (a newer keel's) are left alone; the store table is read.
    std::fs::write(
        dir.path().join("keel.toml"),
        "[future]\nanything = 1\n\n[store]\nsynchronous = \"Normal\"\n",
    )
    .unwrap();
    let h = open(dir.path()).await.unwrap();
    assert_eq!(writer_synchronous(&h).await, 1);
    // Commits work and are counted; under `normal` none of them waits for an fsync.
    let before = h.internals().db.stats().commits.load(std::sync::atomic::Ordering::Relaxed);
    h.internals()
        .db
        .run(|c| Ok(c.execute("INSERT INTO blobs (hash, body) VALUES ('h', 'b')", [])?))
        .await
        .unwrap();
    assert_eq!(
        h.internals().db.stats().commits.load(std::sync::atomic::Ordering::Relaxed),
        before + 1
    );
    drop(h);

    std::fs::write(dir.path().join("keel.toml"), "[store]\nsynchronous = \"off\"\n").unwrap();
    let h = open(dir.path()).await.unwrap();
    assert_eq!(writer_synchronous(&h).await, 0);
    // What was committed under the other modes is all there.
    let blobs: i64 = h
        .internals()
        .db
        .read(|c| Ok(c.query_row("SELECT COUNT(*) FROM blobs WHERE hash = 'h'", [], |r| r.get(0))?))
        .await
        .unwrap();
    assert_eq!(blobs, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_synchronous_setting_is_refused_naming_the_file_and_the_modes() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("keel.toml");

    std::fs::write(&toml, "[store]\nsynchronous = \"sometimes\"\n").unwrap();
    let e = open(dir.path()).await.err().expect("refused");
    assert!(e.contains("keel.toml") && e.contains("[store] synchronous"), "{e}");
    assert!(e.contains("`sometimes`") && e.contains("full") && e.contains("normal"), "{e}");

    // A typo of the key is refused too, not silently ignored.
    std::fs::write(&toml, "[store]\nsyncronous = \"full\"\n").unwrap();
    let e = open(dir.path()).await.err().expect("refused");
    assert!(e.contains("keel.toml") && e.contains("syncronous"), "{e}");

    // Nothing was created by the refused opens: the store opens normally once fixed.
    assert!(!dir.path().join("keel.db").exists(), "a refused setting opens no database");
    std::fs::write(&toml, "[store]\nsynchronous = \"full\"\n").unwrap();
    let h = open(dir.path()).await.unwrap();
    if !keel_tests::on_postgres("the writer's synchronous pragma") {
        assert_eq!(writer_synchronous(&h).await, 2);
    }
}

#[test]
fn sqlite_leaves_directory_syncs_to_keel_which_syncs_new_files_once() {
    if keel_tests::on_postgres("directory syncs") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.db");
    let c = keel::store::open(&path).unwrap();
    let options: Vec<String> = c
        .prepare("PRAGMA compile_options")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    // Without it SQLite syncs the directory once per process: a fourth fsync on every CLI turn.
    assert!(options.iter().any(|o| o == "DISABLE_DIRSYNC"), "{options:?}");
    assert!(path.exists() && dir.path().join("keel.db-wal").exists(), "both files exist");
    // A second connection finds both files and opens without syncing anything.
    let again = keel::store::open(&path).unwrap();
    let n: i64 =
        again.query_row("SELECT COUNT(*) FROM schema_migrations", [], |r| r.get(0)).unwrap();
    assert!(n > 0);
}
