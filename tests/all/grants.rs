//! RELIABILITY B1–B7: filesystem capabilities, on real directory trees with planted symlinks
//! and hard links.

use std::os::unix::fs::symlink;
use std::path::Path;

use keel::sandbox::{Access, Budget, CallError, Grant, ToolErrorKind};
use keel_tests::{assert_healthy, call, shared};
use serde_json::{Value, json};

const CANARY: &str = "CANARY-8f1d2c-do-not-leak";

/// A tree: `outside/secret.txt` (never granted), `ws/` (the grant) with a file, a symlink to an
/// absolute outside path, a relative symlink chain leading outside, and a symlink loop.
fn tree() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let p = root.path();
    std::fs::create_dir_all(p.join("outside")).unwrap();
    std::fs::write(p.join("outside/secret.txt"), CANARY).unwrap();
    std::fs::create_dir_all(p.join("ws/sub")).unwrap();
    std::fs::write(p.join("ws/notes.txt"), "hello").unwrap();
    symlink(p.join("outside/secret.txt"), p.join("ws/abs_link")).unwrap();
    symlink("../outside/secret.txt", p.join("ws/rel_link")).unwrap();
    symlink("../rel_link", p.join("ws/sub/chain_link")).unwrap();
    symlink(p.join("outside"), p.join("ws/dir_link")).unwrap();
    symlink(".", p.join("ws/loop")).unwrap();
    root
}

fn grant(dir: &Path, guest: &str, access: Access) -> Grant {
    Grant::new(dir, guest, access).unwrap()
}

fn assert_refused(result: &Result<Value, CallError>, what: &str) {
    match result {
        Err(CallError::Tool { kind, message }) => {
            assert!(
                matches!(kind, ToolErrorKind::Denied | ToolErrorKind::NotFound),
                "{what}: {kind:?} {message}"
            );
            assert!(!message.contains(CANARY), "{what}: canary leaked in the error");
        }
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b1_b2_absolute_and_dot_dot_paths_are_denied() {
    let s = shared().await;
    let t = tree();
    let g = [grant(&t.path().join("ws"), "/w", Access::Ro)];
    let outside = t.path().join("outside/secret.txt").display().to_string();
    for path in [
        "/etc/passwd",
        outside.as_str(),
        "/w/../outside/secret.txt",
        "/w/../../etc/passwd",
        "/w/sub/../../outside/secret.txt",
        "../outside/secret.txt",
        "w/../../x",
    ] {
        let out = call(s, "read", json!({"path": path}), &g, Budget::default()).await;
        assert_refused(&out.report.result, path);
    }
    let out = call(s, "read", json!({"path": "/etc/passwd"}), &g, Budget::default()).await;
    match out.report.result {
        Err(CallError::Tool { kind, .. }) => assert_eq!(kind, ToolErrorKind::Denied),
        other => panic!("{other:?}"),
    }
    // The grant itself works.
    let out = call(s, "read", json!({"path": "/w/notes.txt"}), &g, Budget::default()).await;
    assert_eq!(out.report.result, Ok(json!("hello")));
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b3_symlinks_pointing_outside_are_not_followed() {
    let s = shared().await;
    let t = tree();
    let g = [grant(&t.path().join("ws"), "/w", Access::Rw)];
    for path in ["/w/abs_link", "/w/rel_link", "/w/sub/chain_link", "/w/dir_link/secret.txt"] {
        let out = call(s, "read", json!({"path": path}), &g, Budget::default()).await;
        assert!(out.report.result.is_err(), "{path}: {:?}", out.report.result);
        assert!(!format!("{:?}", out.report).contains(CANARY), "{path}: canary leaked");
        // Writing through the link must not reach the target either.
        let out =
            call(s, "write", json!({"path": path, "content": "pwned"}), &g, Budget::default())
                .await;
        assert!(out.report.result.is_err(), "{path}: write went through: {:?}", out.report.result);
    }
    assert_eq!(std::fs::read_to_string(t.path().join("outside/secret.txt")).unwrap(), CANARY);
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b4_read_only_grants_refuse_every_mutation() {
    let s = shared().await;
    let t = tree();
    let ws = t.path().join("ws");
    let g = [grant(&ws, "/w", Access::Ro)];
    let listing = |p: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = listing(&ws);
    let cases = [
        ("write", json!({"path": "/w/notes.txt", "content": "changed"})),
        ("write", json!({"path": "/w/new.txt", "content": "new"})),
        ("truncate", json!({"path": "/w/notes.txt"})),
        ("delete", json!({"path": "/w/notes.txt"})),
        ("mkdir", json!({"path": "/w/newdir"})),
        ("rename", json!({"from": "/w/notes.txt", "to": "/w/renamed.txt"})),
        ("hard_link", json!({"from": "/w/notes.txt", "to": "/w/linked.txt"})),
    ];
    for (tool, input) in cases {
        let out = call(s, tool, input.clone(), &g, Budget::default()).await;
        match &out.report.result {
            Err(CallError::Tool { kind: ToolErrorKind::Denied, .. }) => {}
            other => panic!("{tool} {input}: expected denied, got {other:?}"),
        }
    }
    assert_eq!(std::fs::read_to_string(ws.join("notes.txt")).unwrap(), "hello");
    assert_eq!(listing(&ws), before);
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b5_no_hard_link_or_rename_from_a_read_only_grant_into_a_writable_one() {
    let s = shared().await;
    let t = tree();
    let ro = t.path().join("ws");
    let rw = t.path().join("rw");
    std::fs::create_dir(&rw).unwrap();
    let g = [grant(&ro, "/ro", Access::Ro), grant(&rw, "/rw", Access::Rw)];
    for tool in ["hard_link", "rename"] {
        let out = call(
            s,
            tool,
            json!({"from": "/ro/notes.txt", "to": "/rw/notes.txt"}),
            &g,
            Budget::default(),
        )
        .await;
        assert!(out.report.result.is_err(), "{tool}: {:?}", out.report.result);
    }
    assert_eq!(std::fs::read_to_string(ro.join("notes.txt")).unwrap(), "hello");
    assert!(!rw.join("notes.txt").exists());
    // Copying through read + write is allowed: it is what the grants say.
    let out = call(
        s,
        "write",
        json!({"path": "/rw/copy.txt", "content": "hello"}),
        &g,
        Budget::default(),
    )
    .await;
    assert_eq!(out.report.result, Ok(json!(5)));
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b6_one_session_cannot_reach_another_sessions_workspace() {
    let s = shared().await;
    let root = tempfile::tempdir().unwrap();
    let a = root.path().join("session-a");
    let b = root.path().join("session-b");
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(b.join("private.txt"), CANARY).unwrap();
    let g = [grant(&a, "/workspace", Access::Rw)];
    let b_abs = b.join("private.txt").display().to_string();
    for path in [
        b_abs.as_str(),
        "/workspace/../session-b/private.txt",
        "/session-b/private.txt",
        "/b/private.txt",
    ] {
        let out = call(s, "read", json!({"path": path}), &g, Budget::default()).await;
        assert_refused(&out.report.result, path);
    }
    let out = call(s, "list", json!({"path": "/workspace/.."}), &g, Budget::default()).await;
    assert!(!format!("{:?}", out.report.result).contains("session-b"), "{:?}", out.report.result);
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b7_change_reconciliation_never_follows_planted_symlinks() {
    let s = shared().await;
    let t = tree();
    let ws = t.path().join("ws");
    let g = [grant(&ws, "/w", Access::Rw)];
    let out = call(
        s,
        "write",
        json!({"path": "/w/sub/out.txt", "content": "result"}),
        &g,
        Budget::default(),
    )
    .await;
    assert_eq!(out.report.result, Ok(json!(6)));
    let changes = out.changes.expect("a write call reports its change set");
    assert!(changes.complete);
    assert_eq!(changes.created.len(), 1, "{changes:?}");
    let c = &changes.created[0];
    assert_eq!((c.path.as_str(), c.kind, c.size), ("/w/sub/out.txt", "file", 6));
    assert_eq!(c.sha256.as_deref(), Some(keel::sandbox::sha256_hex(b"result").as_str()));
    assert!(changes.modified.is_empty() && changes.deleted.is_empty());
    // The walk saw the links as links and never descended through them.
    let snapshot = keel::tools::changes::snapshot(&[g[0].opened().unwrap()], None);
    let paths = format!("{snapshot:?}");
    assert!(!paths.contains("/w/dir_link/secret.txt") && !paths.contains("/w/loop/"), "{paths}");
    // A symlink swapped in for a file the tool changed is reported without being hashed through.
    let out = call(
        s,
        "write",
        json!({"path": "/w/notes.txt", "content": "changed"}),
        &g,
        Budget::default(),
    )
    .await;
    let modified = &out.changes.unwrap().modified;
    assert_eq!(modified.len(), 1);
    assert_eq!(modified[0].sha256.as_deref(), Some(keel::sandbox::sha256_hex(b"changed").as_str()));
    assert_healthy(s).await;
}

#[test]
fn grants_are_validated_when_made() {
    let t = tree();
    let ws = t.path().join("ws");
    assert!(Grant::new(&ws, "relative", Access::Ro).is_err());
    assert!(Grant::new(&ws, "/a/../b", Access::Ro).is_err());
    assert!(Grant::new(t.path().join("missing"), "/m", Access::Ro).is_err());
    assert!(Grant::new(ws.join("notes.txt"), "/f", Access::Ro).is_err());
    let parsed: Grant = format!("{}=/data:rw", ws.display()).parse().unwrap();
    assert_eq!(parsed, Grant::new(&ws, "/data", Access::Rw).unwrap());
    let default: Grant = ws.display().to_string().parse().unwrap();
    assert_eq!((default.guest.as_str(), default.access), ("/ws", Access::Ro));
    let overlapping = [
        Grant::new(&ws, "/d", Access::Ro).unwrap(),
        Grant::new(&ws, "/d/sub", Access::Rw).unwrap(),
    ];
    assert!(Grant::check_disjoint(&overlapping).is_err());
    let e = "x=y=z:rw".parse::<Grant>().unwrap_err().to_string();
    assert!(e.contains("x"), "{e}");
    // An access other than `:ro`/`:rw` is refused, not taken into the guest path.
    for spec in [format!("{}=/data:rx", ws.display()), format!("{}:RW", ws.display())] {
        let e = spec.parse::<Grant>().unwrap_err().to_string();
        assert!(e.contains("is not an access: use `:ro`"), "{spec}: {e}");
    }
}
