//! The slow tier: the Python (componentize-py) and JavaScript (componentize-js) example tools
//! are built from `examples/` with their pinned toolchains, installed and called for real,
//! and a second service on the same home loads them from the artifact cache.
//!
//! Run with `cargo test --release --test all -- --ignored examples` (CI does).

use std::path::Path;
use std::process::Command;

use keel::sandbox::{Access, Budget, Grant, LoadSource};
use keel_tests::{call, service_in, test_limits};
use serde_json::json;

fn build_examples(out: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = Command::new(root.join("examples").join("build.sh")).arg(out).status().unwrap();
    assert!(status.success(), "examples/build.sh failed: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow tier: builds the Python and JavaScript examples (examples/build.sh)"]
async fn examples_python_and_javascript_tools_install_and_run_and_load_from_cache() {
    let out = tempfile::tempdir().unwrap();
    build_examples(out.path());
    let home = tempfile::tempdir().unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
    let grants = [Grant::new(&data, "/data", Access::Ro).unwrap()];
    let mut digests = Vec::new();
    {
        let s = service_in(home.path(), test_limits()).await;
        for (file, name) in [("python_tool.wasm", "python-tool"), ("js_tool.wasm", "js-tool")] {
            let bytes = std::fs::read(out.path().join(file)).unwrap();
            let r = s.install(&bytes, name, "example", false).await.unwrap();
            digests.push(r.component.digest);
        }
        let got = call(
            &s,
            "py_word_count",
            json!({"path": "/data/orders.csv"}),
            &grants,
            Budget::default(),
        )
        .await;
        assert_eq!(
            got.report.result,
            Ok(json!({"path": "/data/orders.csv", "lines": 6, "words": 7, "bytes": 219}))
        );
        let got =
            call(&s, "py_word_count", json!({"path": "/etc/passwd"}), &grants, Budget::default())
                .await;
        assert_eq!(got.report.result.unwrap_err().kind(), "not_found");
        let got = call(
            &s,
            "js_slugify",
            json!({"text": "Hello, World: keel tools!"}),
            &[],
            Budget::default(),
        )
        .await;
        assert_eq!(got.report.result, Ok(json!({"slug": "hello-world-keel-tools"})));
    }
    // Another process on the same home: no compile, the artifacts come from the cache.
    let s = service_in(home.path(), test_limits()).await;
    for digest in &digests {
        let (_, source) = s.prepared(digest).unwrap();
        assert_eq!(source, Some(LoadSource::Cache));
    }
    let got = call(&s, "js_slugify", json!({"text": "Again"}), &[], Budget::default()).await;
    assert_eq!(got.report.result, Ok(json!({"slug": "again"})));
}
