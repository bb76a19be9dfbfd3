//! The first-party tools (`fs`, `csv`) end to end, through the ToolService and the sandbox.

use keel::sandbox::{Access, Budget, CallError, Grant, ToolErrorKind};
use keel::tools::ToolServiceError;
use keel_tests::{call, shared};
use serde_json::json;

fn workspace() -> (tempfile::TempDir, Vec<Grant>) {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("src/deep")).unwrap();
    std::fs::write(t.path().join("a.txt"), "one\ntwo\nthree\nfour\n").unwrap();
    std::fs::write(t.path().join("src/main.rs"), "fn main() {\n    // TODO: greet\n}\n").unwrap();
    std::fs::write(t.path().join("src/deep/lib.rs"), "// TODO: test\n").unwrap();
    let g = vec![Grant::new(t.path(), "/w", Access::Rw).unwrap()];
    (t, g)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_tools_read_write_list_search_delete() {
    let s = shared().await;
    let (t, g) = workspace();
    let b = Budget::default;
    let out =
        call(s, "fs_read_file", json!({"path": "/w/a.txt", "offset": 1, "limit": 2}), &g, b())
            .await;
    assert_eq!(
        out.report.result,
        Ok(
            json!({"path": "/w/a.txt", "content": "two\nthree", "offset": 1, "lines": 2, "total_lines": 4, "truncated": true})
        )
    );
    assert!(out.changes.is_none(), "read-only calls do not walk the workspace");

    let out =
        call(s, "fs_write_file", json!({"path": "/w/new/b.txt", "content": "bee"}), &g, b()).await;
    assert_eq!(
        out.report.result,
        Ok(json!({"path": "/w/new/b.txt", "bytes_written": 3, "created": true}))
    );
    let changes = out.changes.unwrap();
    let created: Vec<&str> = changes.created.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(created, ["/w/new", "/w/new/b.txt"]);
    assert_eq!(std::fs::read_to_string(t.path().join("new/b.txt")).unwrap(), "bee");

    let out = call(s, "fs_list_dir", json!({"path": "/w", "recursive": true}), &g, b()).await;
    let entries = out.report.result.unwrap()["entries"].clone();
    let paths: Vec<&str> =
        entries.as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "/w/a.txt",
            "/w/new",
            "/w/new/b.txt",
            "/w/src",
            "/w/src/deep",
            "/w/src/deep/lib.rs",
            "/w/src/main.rs"
        ]
    );

    let out = call(s, "fs_search", json!({"path": "/w", "pattern": "TODO"}), &g, b()).await;
    assert_eq!(
        out.report.result.unwrap()["matches"],
        json!([
            {"path": "/w/src/deep/lib.rs", "line": 1, "text": "// TODO: test"},
            {"path": "/w/src/main.rs", "line": 2, "text": "    // TODO: greet"}
        ])
    );
    let out =
        call(s, "fs_search", json!({"path": "/w", "pattern": "TODO", "max_results": 1}), &g, b())
            .await;
    let r = out.report.result.unwrap();
    assert_eq!((r["matches"].as_array().unwrap().len(), r["truncated"].clone()), (1, json!(true)));

    let out =
        call(s, "fs_delete_files", json!({"paths": ["/w/a.txt", "/w/missing.txt"]}), &g, b()).await;
    assert_eq!(
        out.report.result,
        Ok(json!({"deleted": ["/w/a.txt"], "missing": ["/w/missing.txt"]}))
    );
    let deleted: Vec<&str> =
        out.changes.as_ref().unwrap().deleted.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(deleted, ["/w/a.txt"]);
    assert!(!t.path().join("a.txt").exists());

    let out = call(s, "fs_read_file", json!({"path": "/w/nope.txt"}), &g, b()).await;
    assert_eq!(
        out.report.result,
        Err(CallError::Tool {
            kind: ToolErrorKind::NotFound,
            message: "/w/nope.txt: no such file or directory".into()
        })
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csv_inspect_finds_the_eighth_column() {
    let s = shared().await;
    let t = tempfile::tempdir().unwrap();
    std::fs::write(
        t.path().join("orders.csv"),
        "id,name,email,qty,price,date,status\n1,Ann,a@x.org,2,9.99,2026-01-02,paid\n\
         2,Bob,\"b@x.org, ops\",1,5.00,2026-01-03,open\n3,Cy,c@x.org,4,1.50,2026-01-04,paid,EXTRA\n\
         4,Di,,1,2.00,2026-01-05,paid\n",
    )
    .unwrap();
    let g = [Grant::new(t.path(), "/data", Access::Ro).unwrap()];
    let out = call(
        s,
        "csv_inspect",
        json!({"path": "/data/orders.csv", "expected_columns": 7}),
        &g,
        Budget::default(),
    )
    .await;
    assert_eq!(
        out.report.result,
        Ok(json!({
            "path": "/data/orders.csv",
            "header": ["id", "name", "email", "qty", "price", "date", "status"],
            "rows": 4, "expected_columns": 7,
            "column_counts": {"7": 3, "8": 1},
            "ragged_rows": [{"line": 4, "columns": 8}], "ragged_count": 1,
            "empty_required": [{"line": 5, "column": "email"}], "empty_required_count": 1,
            "ok": false
        }))
    );
    let out = call(
        s,
        "csv_inspect",
        json!({"path": "/data/orders.csv", "delimiter": "ab"}),
        &g,
        Budget::default(),
    )
    .await;
    assert!(matches!(
        out.report.result,
        Err(CallError::Tool { kind: ToolErrorKind::InvalidInput, .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_input_failing_the_schema_is_rejected_before_the_sandbox_naming_the_field() {
    let s = shared().await;
    let cases = [
        (json!({"path": 5}), "field `/path`: 5 is not of type \"string\""),
        (json!({}), "input: \"path\" is a required property"),
        (json!({"path": "/x", "limit": -1}), "field `/limit`"),
    ];
    for (input, expected) in cases {
        let input = input.to_string();
        match keel_tests::try_call(s, "fs_read_file", &input).await {
            Err(ToolServiceError::InvalidInput { tool, problems }) => {
                assert_eq!(tool, "fs_read_file");
                assert!(
                    problems.iter().any(|p| p.contains(expected)),
                    "{problems:?} lacks {expected}"
                );
            }
            other => panic!("expected invalid input, got {:?}", other.map(|o| o.report.result)),
        }
    }
    assert!(matches!(
        keel_tests::try_call(s, "fs_read_file", "{not json").await,
        Err(ToolServiceError::InvalidInput { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_on_one_workspace_are_exclusive_readers_share() {
    let s = shared().await;
    let (t, _) = workspace();
    let rw = vec![Grant::new(t.path(), "/w", Access::Rw).unwrap()];
    let b = Budget { timeout: std::time::Duration::from_secs(5), ..Budget::default() };
    // Two writers at once: each sees the other's completed work or none of it, never a mix,
    // and both complete (the second waits for the lease).
    let (x, y) = tokio::join!(
        call(s, "write", json!({"path": "/w/x.txt", "content": "x"}), &rw, b.clone()),
        call(s, "write", json!({"path": "/w/y.txt", "content": "y"}), &rw, b.clone()),
    );
    assert_eq!((x.report.result, y.report.result), (Ok(json!(1)), Ok(json!(1))));
    let mut created: Vec<String> = x
        .changes
        .unwrap()
        .created
        .into_iter()
        .chain(y.changes.unwrap().created)
        .map(|c| c.path)
        .collect();
    created.sort();
    assert_eq!(
        created,
        ["/w/x.txt", "/w/y.txt"],
        "each writer's change set holds only its own file"
    );
}
