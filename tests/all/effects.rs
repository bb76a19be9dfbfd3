//! RELIABILITY B8–B10: the declared effect class is enforced in the filesystem layer, and a
//! call's writes are bounded (write quota, creation cap).

use std::path::Path;

use keel::sandbox::{Access, Budget, Grant};
use keel::tools::ToolService;
use keel_tests::{assert_healthy, call, guests, service_in, test_limits};
use serde_json::{Value, json};

async fn service(dir: &Path) -> ToolService {
    let s = service_in(dir, test_limits()).await;
    let bytes = std::fs::read(guests::FS_EFFECTS_COMPONENT).unwrap();
    s.install(&bytes, "fs-effects", "test", false).await.unwrap();
    s
}

/// A read-write workspace holding `old.txt` and the directory `old/`.
fn workspace() -> tempfile::TempDir {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("old.txt"), "old").unwrap();
    std::fs::create_dir(ws.path().join("old")).unwrap();
    ws
}

fn listing(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let content = if e.file_type().unwrap().is_dir() {
                "<dir>".to_string()
            } else {
                std::fs::read_to_string(e.path()).unwrap()
            };
            (name, content)
        })
        .collect();
    v.sort();
    v
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

const NOT_PERMITTED: &str = "Operation not permitted (os error 63)";
/// `insufficient-space`, as a descriptor call (`set-size`, `write`) reports it.
const NO_SPACE: &str = "No space left on device (os error 51)";
/// A refused stream write: the stream's error carries `insufficient-space`, which the C
/// library behind Rust's standard library reports as EIO.
const STREAM_REFUSED: &str = "I/O error (os error 29)";

async fn probe(s: &ToolService, tool: &str, ws: &Path) -> (Value, keel::sandbox::FsReport) {
    let grants = [Grant::new(ws, "/w", Access::Rw).unwrap()];
    let out = call(s, tool, json!({"dir": "/w"}), &grants, Budget::default()).await;
    (out.report.result.unwrap(), out.report.fs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b8_a_read_only_tool_sees_every_grant_read_only() {
    let home = tempfile::tempdir().unwrap();
    let s = service(home.path()).await;
    let ws = workspace();
    let (got, fs) = probe(&s, "probe_read_only", ws.path()).await;
    for (op, outcome) in got.as_object().unwrap() {
        assert_ne!(outcome, "ok", "a read-only tool could `{op}`");
    }
    assert_eq!(listing(ws.path()), owned(&[("old", "<dir>"), ("old.txt", "old")]));
    assert!(!fs.denied.is_empty(), "{fs:?}");
    assert_eq!((fs.bytes_written, fs.files_created), (0, 0));
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b9_a_non_destructive_tool_cannot_remove_or_rename_away_what_existed() {
    let home = tempfile::tempdir().unwrap();
    let s = service(home.path()).await;
    for tool in ["probe_write", "probe_external"] {
        let ws = workspace();
        let (got, fs) = probe(&s, tool, ws.path()).await;
        let expected = json!({
            "create_file": "ok",
            "create_dir": "ok",
            "rewrite_old": "ok",
            "rename_new": "ok",
            "remove_new": "ok",
            "remove_new_dir": "ok",
            "rename_old": NOT_PERMITTED,
            "remove_old": NOT_PERMITTED,
            "remove_old_dir": NOT_PERMITTED,
            // Replacing a file by a new one is a rewrite; replacing a directory removes it.
            "replace_old_by_new": "ok",
            "replace_old_dir": NOT_PERMITTED,
        });
        assert_eq!(got, expected, "{tool}");
        assert_eq!(
            listing(ws.path()),
            owned(&[("old", "<dir>"), ("old.txt", "replacement"), ("tmpdir", "<dir>")]),
            "{tool}"
        );
        assert_eq!(fs.denied.len(), 4, "{tool}: {fs:#?}");
        assert!(fs.denied[0].starts_with("rename \"old.txt\": it existed before the call"));
        assert!(fs.denied[1].starts_with("unlink \"old.txt\""), "{:?}", fs.denied);
        assert!(fs.denied[2].starts_with("remove-directory \"old\""), "{:?}", fs.denied);
        assert!(fs.denied[3].starts_with("rename onto \"old\""), "{:?}", fs.denied);
    }
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b9_a_destructive_tool_may_remove_and_rename_what_existed() {
    let home = tempfile::tempdir().unwrap();
    let s = service(home.path()).await;
    let ws = workspace();
    let (got, fs) = probe(&s, "probe_destructive", ws.path()).await;
    assert_eq!(got["rename_old"], "ok");
    assert_eq!(got["remove_old_dir"], "ok");
    // `old.txt` was renamed away before `remove_old` ran.
    assert_ne!(got["remove_old"], "ok");
    assert_eq!(got["replace_old_dir"], "ok");
    assert!(fs.denied.is_empty(), "{fs:?}");
    assert_eq!(
        listing(ws.path()),
        owned(&[("moved.txt", "rewritten"), ("old", "<dir>"), ("old.txt", "replacement")])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b10_writes_past_the_quota_fail_with_insufficient_space() {
    let home = tempfile::tempdir().unwrap();
    let s = service(home.path()).await;
    let ws = tempfile::tempdir().unwrap();
    let grants = [Grant::new(ws.path(), "/w", Access::Rw).unwrap()];
    let budget = Budget { write_quota: 1 << 20, ..Budget::default() };
    let out =
        call(&s, "fill", json!({"path": "/w/big", "bytes": 3 << 20}), &grants, budget.clone())
            .await;
    let got = out.report.result.unwrap();
    assert_eq!(got["error"], STREAM_REFUSED, "{got}");
    assert!(got["written"].as_u64().unwrap() <= 1 << 20, "{got}");
    assert!(out.report.fs.write_quota_exceeded);
    assert!(out.report.fs.bytes_written <= 1 << 20);
    assert!(std::fs::metadata(ws.path().join("big")).unwrap().len() <= 1 << 20);
    // Under the quota, the same tool succeeds.
    let out =
        call(&s, "fill", json!({"path": "/w/small", "bytes": 100_000}), &grants, budget).await;
    assert_eq!(out.report.result.unwrap()["error"], Value::Null);
    assert!(!out.report.fs.write_quota_exceeded);
    assert_eq!(out.report.fs.bytes_written, 100_000);
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b10_a_sparse_file_counts_its_logical_size() {
    let home = tempfile::tempdir().unwrap();
    let s = service(home.path()).await;
    let ws = tempfile::tempdir().unwrap();
    let grants = [Grant::new(ws.path(), "/w", Access::Rw).unwrap()];
    for (how, error) in [("set_len", NO_SPACE), ("seek", STREAM_REFUSED)] {
        let input = json!({"path": format!("/w/sparse-{how}"), "bytes": 20u64 << 30, "how": how});
        let out = call(&s, "sparse", input, &grants, Budget::default()).await;
        let got = out.report.result.unwrap();
        assert_eq!(got["result"], error, "{how}: {got}");
        assert!(out.report.fs.write_quota_exceeded, "{how}");
        let len = std::fs::metadata(ws.path().join(format!("sparse-{how}"))).unwrap().len();
        assert_eq!(len, 0, "{how}");
    }
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b10_creating_past_the_cap_fails_with_quota() {
    let home = tempfile::tempdir().unwrap();
    let s = service(home.path()).await;
    let ws = tempfile::tempdir().unwrap();
    let grants = [Grant::new(ws.path(), "/w", Access::Rw).unwrap()];
    let budget = Budget { max_files_created: 50, ..Budget::default() };
    let out = call(&s, "many", json!({"dir": "/w", "count": 100}), &grants, budget).await;
    let got = out.report.result.unwrap();
    assert_eq!(got, json!({"created": 50, "error": "Quota exceeded (os error 19)"}));
    assert!(out.report.fs.create_limit_exceeded);
    assert_eq!(out.report.fs.files_created, 50);
    assert_eq!(std::fs::read_dir(ws.path()).unwrap().count(), 50);
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b10_a_huge_sparse_file_is_listed_unhashed_not_read() {
    let home = tempfile::tempdir().unwrap();
    let s = service(home.path()).await;
    let ws = tempfile::tempdir().unwrap();
    let grants = [Grant::new(ws.path(), "/w", Access::Rw).unwrap()];
    let budget = Budget { write_quota: 64 << 30, ..Budget::default() };
    let input = json!({"path": "/w/huge", "bytes": 20u64 << 30, "how": "set_len"});
    let out = call(&s, "sparse", input, &grants, budget).await;
    assert_eq!(out.report.result.unwrap()["result"], "ok");
    let set = out.changes.unwrap();
    assert!(set.complete);
    let meta = std::fs::metadata(ws.path().join("huge")).unwrap();
    use std::os::unix::fs::MetadataExt;
    let created = &set.created[0];
    assert_eq!(set.created.len(), 1);
    assert_eq!(
        (created.path.as_str(), created.size, &created.sha256, created.hashed, created.inode),
        ("/w/huge", 20u64 << 30, &None, false, Some(meta.ino()))
    );
    assert_eq!(created.ctime_ns, Some(meta.ctime() * 1_000_000_000 + meta.ctime_nsec()));
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b10_a_rewrite_that_restores_the_mtime_is_still_a_modification() {
    let home = tempfile::tempdir().unwrap();
    let s = service(home.path()).await;
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("f.txt"), "abcdef").unwrap();
    let mtime = std::fs::metadata(ws.path().join("f.txt")).unwrap().modified().unwrap();
    let grants = [Grant::new(ws.path(), "/w", Access::Rw).unwrap()];
    let input = json!({"path": "/w/f.txt", "bytes": 0});
    let out = call(&s, "rewrite_keep_mtime", input, &grants, Budget::default()).await;
    assert_eq!(out.report.result.unwrap(), json!({"mtime_restored": true}));
    assert_eq!(std::fs::metadata(ws.path().join("f.txt")).unwrap().modified().unwrap(), mtime);
    let set = out.changes.unwrap();
    assert!(set.complete);
    assert_eq!(set.modified.len(), 1, "{set:?}");
    assert_eq!(
        set.modified[0].sha256.as_deref(),
        Some(keel::sandbox::sha256_hex(b"######").as_str())
    );
}
