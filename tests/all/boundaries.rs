//! RELIABILITY J1–J3 and J6: keel's own home is never reachable from a tool, a grant is the
//! directory it was given for (not a path that can be swapped), the artifact cache runs only
//! what keel wrote, and principals of one name are distinct.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use keel::api::ApiError;
use keel::api::Caller;
use keel::home::Home;
use keel::sandbox::{Access, Budget, Grant, LoadSource};
use keel::tools::{ToolService, ToolServiceError};
use keel_tests::{assert_healthy, service_in, test_limits};
use serde_json::json;

async fn harness(home: &Path) -> keel::harness::Harness {
    keel::harness::Harness::open(
        Home::at(home).unwrap(),
        test_limits(),
        None,
        keel::agent::LoopGuards::default(),
        &|_| {},
    )
    .await
    .unwrap()
}

async fn call_with(
    s: &ToolService,
    tool: &str,
    input: serde_json::Value,
    grants: &[Grant],
) -> Result<keel::tools::CallOutcome, ToolServiceError> {
    let none = keel::sandbox::net::NetGrants::none();
    keel_tests::try_call_in(s, tool, &input.to_string(), grants, none, Budget::default()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j1_a_grant_around_or_inside_the_home_is_refused_at_creation_and_at_each_call() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("share").join("keel");
    let h = harness(&home).await;
    keel::secrets::SecretStore::new(&home)
        .set("K", keel::secrets::Secret::new("canary-0123456789".into()))
        .unwrap();
    let root = home.canonicalize().unwrap();
    let around = Grant::new(dir.path(), "/home", Access::Ro).unwrap();
    let inside = Grant::new(root.join("cache"), "/cache", Access::Rw).unwrap();
    for g in [&around, &inside] {
        let spec = keel_tests::session_spec("http://127.0.0.1:9", "s", vec![g.clone()], None);
        let e = h.create_session(&Caller::Operator, spec).await.unwrap_err();
        assert!(matches!(e, ApiError::Grant(_)), "{e}");
        let text = e.to_string();
        assert!(text.contains(&root.display().to_string()) && text.contains("--home"), "{text}");
        // The same grant at a call (`keel tool call`, a stored session's grant): refused
        // before anything runs.
        let e = call_with(
            h.internals().tools,
            "fs_list_dir",
            json!({"path": g.guest}),
            std::slice::from_ref(g),
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), "grant", "{e}");
        let e =
            h.preset_add(&Caller::Operator, "p", vec![g.clone()], false, false).await.unwrap_err();
        assert!(e.to_string().contains("keel's home"), "{e}");
    }
    assert!(h.sessions(&Caller::Operator).await.unwrap().is_empty(), "nothing was created");
    // A directory beside the home is fine.
    let beside = dir.path().join("work");
    std::fs::create_dir(&beside).unwrap();
    let g = Grant::new(&beside, "/work", Access::Ro).unwrap();
    let out = call_with(h.internals().tools, "fs_list_dir", json!({"path": "/work"}), &[g])
        .await
        .unwrap();
    assert!(out.report.result.is_ok(), "{:?}", out.report.result);
}

/// Every directory and file under `root`, with its permission bits.
fn modes(root: &Path) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        out.push((d.display().to_string(), std::fs::metadata(&d).unwrap().permissions().mode()));
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            } else {
                out.push((e.path().display().to_string(), m.permissions().mode()));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j1_the_home_is_private_and_an_older_home_is_tightened() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("keel");
    {
        let h = harness(&home).await;
        keel::secrets::SecretStore::new(&home)
            .set("K", keel::secrets::Secret::new("canary-0123456789".into()))
            .unwrap();
        let work = tempfile::tempdir().unwrap();
        let g = Grant::new(work.path(), "/w", Access::Ro).unwrap();
        call_with(h.internals().tools, "fs_list_dir", json!({"path": "/w"}), &[g]).await.unwrap();
        let files = modes(&home);
        if !keel_tests::on_postgres("the database's files in the home") {
            assert!(files.iter().any(|(p, _)| p.ends_with("keel.db-wal")), "{files:?}");
        }
        assert!(files.iter().any(|(p, _)| p.ends_with(".cwasm")), "{files:?}");
        for (path, mode) in &files {
            assert_eq!(mode & 0o077, 0, "{path} is {:o}", mode & 0o777);
        }
    }
    // A home an older keel left readable by others is made private when it is opened.
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    // (On PostgreSQL the home holds no database file.)
    if home.join("keel.db").exists() {
        std::fs::set_permissions(home.join("keel.db"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
    }
    let cache = home.join("cache");
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _h = harness(&home).await;
    for (path, mode) in modes(&home) {
        assert_eq!(mode & 0o077, 0, "{path} is {:o}", mode & 0o777);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j3_an_artifact_keel_did_not_write_never_runs_even_with_a_matching_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let (digest, csv) = {
        let s = service_in(dir.path(), test_limits()).await;
        (s.component_for("hostile").unwrap().0.digest, s.component_for("csv").unwrap().0.digest)
    };
    let cache =
        std::fs::read_dir(dir.path().join("cache")).unwrap().next().unwrap().unwrap().path();
    let artifact = cache.join(format!("{digest}.cwasm"));
    // Foreign native code in the artifact's place, with the digest file an older keel trusted
    // written beside it: a process outside keel can write both.
    let foreign = std::fs::read(cache.join(format!("{csv}.cwasm"))).unwrap();
    std::fs::write(&artifact, &foreign).unwrap();
    std::fs::write(
        cache.join(format!("{digest}.cwasm.sha256")),
        format!("blake3:{}", blake3::hash(&foreign).to_hex()),
    )
    .unwrap();
    let s = ToolService::open(Home::at(dir.path()).unwrap(), test_limits(), &|_| {}).await.unwrap();
    match s.prepared(&digest).unwrap().1 {
        Some(LoadSource::Recompiled { reason, .. }) => {
            assert!(reason.contains("does not match its recorded digest"), "{reason}")
        }
        other => panic!("expected a recompile, got {other:?}"),
    }
    assert_healthy(&s).await;
    // An artifact with no digest recorded in the database is never loaded either.
    let db = keel_tests::store_of(&dir.path().join("keel.db"));
    db.execute("DELETE FROM artifacts WHERE component = ?1", [&digest]).unwrap();
    let s = ToolService::open(Home::at(dir.path()).unwrap(), test_limits(), &|_| {}).await.unwrap();
    match s.prepared(&digest).unwrap().1 {
        Some(LoadSource::Recompiled { reason, .. }) => {
            assert!(reason.contains("no digest recorded"), "{reason}")
        }
        other => panic!("expected a recompile, got {other:?}"),
    }
    // What keel wrote itself is used as it is.
    let s = ToolService::open(Home::at(dir.path()).unwrap(), test_limits(), &|_| {}).await.unwrap();
    assert_eq!(s.prepared(&digest).unwrap().1, Some(LoadSource::Cache));
}

const CANARY: &str = "CANARY-outside-the-grant";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j2_a_granted_directory_replaced_by_a_link_or_moved_is_refused_for_the_session_and_its_children()
 {
    let dir = tempfile::tempdir().unwrap();
    let s = service_in(&dir.path().join("home"), test_limits()).await;
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    std::fs::write(data.join("sub").join("mine.txt"), "mine").unwrap();
    std::fs::create_dir(root.path().join("outside")).unwrap();
    std::fs::write(root.path().join("outside").join("secret.txt"), CANARY).unwrap();
    let parent = Grant::new(&data, "/data", Access::Rw).unwrap();
    let child = Grant::narrow(std::slice::from_ref(&parent), "/data/sub:ro").unwrap();
    let direct = Grant::new(data.join("sub"), "/sub", Access::Ro).unwrap();
    for (g, path) in [(&child, "/data/sub"), (&direct, "/sub")] {
        let out = call_with(&s, "fs_list_dir", json!({"path": path}), std::slice::from_ref(g))
            .await
            .unwrap();
        assert!(out.report.result.unwrap().to_string().contains("mine.txt"));
    }
    // A tool the parent allowed replaces `sub` by a relative link to a directory outside.
    std::fs::rename(data.join("sub"), data.join("sub.old")).unwrap();
    symlink("../outside", data.join("sub")).unwrap();
    for (g, path) in [(&child, "/data/sub"), (&direct, "/sub")] {
        let e = call_with(&s, "fs_list_dir", json!({"path": path}), std::slice::from_ref(g))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), "grant_moved", "{e}");
        assert!(e.to_string().contains(&g.guest), "{e}");
        let e = call_with(
            &s,
            "fs_read_file",
            json!({"path": format!("{path}/secret.txt")}),
            std::slice::from_ref(g),
        )
        .await
        .unwrap_err();
        assert!(!e.to_string().contains(CANARY));
    }
    // A new child grant through the link is refused: it is opened from the parent's
    // directory, one component at a time, following no link.
    let e = Grant::narrow(std::slice::from_ref(&parent), "/data/sub").unwrap_err();
    assert!(e.contains("would widen"), "{e}");
    // The parent's own grant still opens, and the link is a link inside it, which the guest's
    // path resolution never follows out.
    let out = call_with(
        &s,
        "fs_read_file",
        json!({"path": "/data/sub/secret.txt"}),
        std::slice::from_ref(&parent),
    )
    .await
    .unwrap();
    assert!(out.report.result.is_err());
    // The directory moved (no link): refused as well.
    std::fs::remove_file(data.join("sub")).unwrap();
    std::fs::rename(&data, root.path().join("data-moved")).unwrap();
    std::fs::create_dir(&data).unwrap();
    let e = call_with(&s, "fs_list_dir", json!({"path": "/data"}), std::slice::from_ref(&parent))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), "grant_moved", "{e}");
    assert_healthy(&s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j6_a_token_and_a_local_user_of_one_name_share_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let h = harness(dir.path()).await;
    h.add_memory(&Caller::Operator, "alice", "alice's local secret plan", &[]).await.unwrap();
    // A session an API token named `alice` creates works for `token:alice`.
    let mut spec = keel_tests::session_spec("http://127.0.0.1:9", "t", vec![], None);
    spec.user = Some("alice".into());
    spec.owner = Some(keel::access::Owner {
        principal: "token:alice".into(),
        preset: None,
        user_decides: false,
    });
    h.create_session(&Caller::Operator, spec).await.unwrap();
    assert_eq!(
        h.session(&Caller::Operator, "t").await.unwrap().config.user.as_deref(),
        Some("token:alice")
    );
    let mut spec = keel_tests::session_spec("http://127.0.0.1:9", "l", vec![], None);
    spec.user = Some("alice".into());
    h.create_session(&Caller::Operator, spec).await.unwrap();
    assert_eq!(
        h.session(&Caller::Operator, "l").await.unwrap().config.user.as_deref(),
        Some("local:alice")
    );
    let local = h.memories(&Caller::Operator, Some("alice")).await.unwrap();
    assert_eq!(local.len(), 1);
    assert_eq!(local[0].user, "local:alice");
    assert!(h.memories(&Caller::Operator, Some("token:alice")).await.unwrap().is_empty());
    // A name that owns data (the sessions of an earlier token) is not given to a new token,
    // nor are keel's own admin names.
    let e = h.token_add(&Caller::Operator, "alice", keel::access::Role::User).await.unwrap_err();
    assert!(e.to_string().contains("already owns"), "{e}");
    for reserved in ["keel-serve", "KEEL_API_TOKEN"] {
        let e =
            h.token_add(&Caller::Operator, reserved, keel::access::Role::User).await.unwrap_err();
        assert!(e.to_string().contains("keel's own"), "{e}");
    }
    h.token_add(&Caller::Operator, "bob", keel::access::Role::User).await.unwrap();
}
