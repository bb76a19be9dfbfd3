//! RELIABILITY J7–J9: links and descriptors. A hard link never joins two grants, a file whose
//! other links lie outside its grant is not written through it, and the tools of a process
//! share one budget of file descriptors that leaves the store its room.

use keel::sandbox::{Access, Budget, Grant, SandboxLimits};
use keel_tests::{assert_healthy, call, service_in, shared, test_limits};
use serde_json::json;

fn grant(dir: &std::path::Path, guest: &str) -> Grant {
    Grant::new(dir, guest, Access::Rw).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j7_a_hard_link_from_one_grant_into_another_is_refused() {
    let s = shared().await;
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    std::fs::create_dir_all(a.join(".git/hooks")).unwrap();
    std::fs::create_dir(&b).unwrap();
    std::fs::write(a.join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n").unwrap();
    let g = [grant(&a, "/a"), grant(&b, "/b")];
    let out = call(
        s,
        "hard_link",
        json!({"from": "/a/.git/hooks/pre-commit", "to": "/b/hook"}),
        &g,
        Budget::default(),
    )
    .await;
    assert!(out.report.result.is_err(), "{:?}", out.report.result);
    assert!(
        out.report.fs.denied.iter().any(|d| d.contains("may not join two grants")),
        "{:?}",
        out.report.fs.denied
    );
    assert!(!b.join("hook").exists());
    // Inside one grant, a link is an ordinary operation.
    let out = call(
        s,
        "hard_link",
        json!({"from": "/a/.git/hooks/pre-commit", "to": "/a/copy"}),
        &g,
        Budget::default(),
    )
    .await;
    assert_eq!(out.report.result, Ok(json!("linked")), "{:?}", out.report.fs);
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j8_a_file_with_links_outside_its_grant_is_not_written_through_it() {
    let s = shared().await;
    let t = tempfile::tempdir().unwrap();
    let (outside, ws) = (t.path().join("outside"), t.path().join("ws"));
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::write(outside.join("hook"), "original").unwrap();
    // Placed in the grant by someone else (an earlier call granted both, a careless admin).
    std::fs::hard_link(outside.join("hook"), ws.join("hook")).unwrap();
    let g = [grant(&ws, "/w")];
    for (tool, input) in [
        ("write", json!({"path": "/w/hook", "content": "rewritten"})),
        ("truncate", json!({"path": "/w/hook"})),
    ] {
        let out = call(s, tool, input, &g, Budget::default()).await;
        assert!(out.report.result.is_err(), "{tool}: {:?}", out.report.result);
        let denied = out.report.fs.denied.join("\n");
        assert!(denied.contains("2 hard links and only 1 are inside this grant"), "{denied}");
        assert!(denied.contains("cp f f.tmp && mv f.tmp f"), "{denied}");
    }
    assert_eq!(std::fs::read_to_string(outside.join("hook")).unwrap(), "original");
    // Reading it is fine; so is writing a file whose links are all inside the grant.
    let out = call(s, "read", json!({"path": "/w/hook"}), &g, Budget::default()).await;
    assert_eq!(out.report.result, Ok(json!("original")));
    std::fs::write(ws.join("mine"), "a").unwrap();
    std::fs::hard_link(ws.join("mine"), ws.join("sub/mine-too")).unwrap();
    let out =
        call(s, "write", json!({"path": "/w/mine", "content": "b"}), &g, Budget::default()).await;
    assert!(out.report.result.is_ok(), "{:?} {:?}", out.report.result, out.report.fs);
    assert_eq!(std::fs::read_to_string(ws.join("sub/mine-too")).unwrap(), "b");
    assert_healthy(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j9_tools_share_one_budget_of_descriptors_and_the_store_keeps_its_room() {
    let dir = tempfile::tempdir().unwrap();
    let limits = SandboxLimits { tool_descriptors: Some(40), ..test_limits() };
    let s = service_in(dir.path(), limits).await;
    let t = tempfile::tempdir().unwrap();
    std::fs::write(t.path().join("f"), "x").unwrap();
    let g = [Grant::new(t.path(), "/w", Access::Ro).unwrap()];
    // Three calls at once, each trying to hold 30 files: together they get no more than the
    // share (less each call's grant), and the rest are refused with the reason.
    let input = json!({"path": "/w/f", "count": 30, "ms": 300});
    let hold = || call(&s, "hold_open", input.clone(), &g, Budget::default());
    let (a, b, c) = tokio::join!(hold(), hold(), hold());
    let outs = [a, b, c];
    let mut opened = 0;
    let mut refused = 0;
    for out in &outs {
        let v = out.report.result.as_ref().unwrap_or_else(|e| panic!("{e:?}"));
        opened += v["opened"].as_u64().unwrap();
        if !v["error"].is_null() {
            refused += 1;
            assert!(
                out.report
                    .fs
                    .denied
                    .iter()
                    .any(|d| d.contains("share of file descriptors for tools (40")),
                "{:?}",
                out.report.fs.denied
            );
        }
    }
    assert!(opened <= 40, "{opened} files held at once with a share of 40");
    assert!(refused >= 1, "no call was refused: {opened} opened");
    // Everything is given back when the calls end, and the store answers.
    let out =
        call(&s, "hold_open", json!({"path": "/w/f", "count": 30}), &g, Budget::default()).await;
    assert_eq!(out.report.result.as_ref().map(|v| v["opened"].clone()), Ok(json!(30)));
    assert_healthy(&s).await;
}
