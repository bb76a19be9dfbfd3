//! `keel secret`, and the network grants of `keel tool call` and `keel run`, through the real
//! binary against an HTTP server on loopback.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::web_peer::WebPeer;
use serde_json::json;

use super::run::{args, keel_async};

const CANARY: &str = "cli-canary-7f3e9a-secret";

pub(super) fn secret_set(home: &Path, name: &str, value: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home)
        .args(["secret", "set", name, "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(format!("{value}\n").as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn secrets_go_in_through_stdin_and_only_their_names_come_out() {
    let home = tempfile::tempdir().unwrap();
    let out = secret_set(home.path(), "TOKEN", CANARY);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(super::json_of(&out), json!({"ok": true, "secret": "TOKEN", "replaced": false}));
    let out = super::keel(home.path(), &["secret", "list", "--json"]);
    assert_eq!(super::json_of(&out), json!({"ok": true, "secrets": ["TOKEN"]}));
    let out = super::keel(home.path(), &["secret", "list"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "TOKEN\n");
    // The value is never an argument.
    let out = super::keel(home.path(), &["secret", "set", "OTHER", CANARY]);
    assert_eq!(out.status.code(), Some(2));
    // Too short to be redacted safely, or a bad name: refused, with why.
    let out = secret_set(home.path(), "SHORT", "abc");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("8 to 65536 bytes"));
    let out = secret_set(home.path(), "bad name", CANARY);
    assert_eq!(out.status.code(), Some(2));
    // Nothing in the home holds the value in plain text; the key is private.
    for entry in std::fs::read_dir(home.path()).unwrap().flatten() {
        if entry.file_type().unwrap().is_file() {
            let bytes = std::fs::read(entry.path()).unwrap();
            assert!(
                !bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()),
                "{:?}",
                entry.path()
            );
        }
    }
    let out = super::keel(home.path(), &["secret", "rm", "TOKEN", "--json"]);
    assert_eq!(super::json_of(&out), json!({"ok": true, "removed": "TOKEN"}));
    let out = super::keel(home.path(), &["secret", "rm", "TOKEN"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("there is no secret `TOKEN`"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_call_takes_network_grants_and_reports_each_request() {
    let home = tempfile::tempdir().unwrap();
    let peer = WebPeer::start().await;
    let p = peer.port.to_string();
    let h = home.path().to_path_buf();
    let out = tokio::task::spawn_blocking(move || secret_set(&h, "TOKEN", CANARY)).await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    let input = json!({"url": format!("http://localhost:{p}/echo")}).to_string();
    let net = format!("http://localhost:{p}");
    let lo = format!("localhost:{p}");
    let secret = format!("TOKEN@http://localhost:{p}");
    let out = keel_async(
        home.path().to_path_buf(),
        args(&[
            "tool",
            "call",
            "http_fetch",
            "--input",
            &input,
            "--net",
            &net,
            "--net-allow-loopback",
            &lo,
            "--secret",
            &secret,
            "--json",
        ]),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = super::json_of(&out);
    assert_eq!(v["output"]["status"], 200);
    assert_eq!(v["net"][0]["status"], 200);
    assert_eq!(v["net"][0]["path"], "/echo");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[secret:TOKEN]") && !text.contains(CANARY), "{text}");
    assert_eq!(peer.seen()[0].header("authorization"), Some(format!("Bearer {CANARY}").as_str()));

    // Without the grants: refused before connecting, and the call report says why.
    let out = keel_async(
        home.path().to_path_buf(),
        args(&["tool", "call", "http_fetch", "--input", &input]),
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("net denied GET http://localhost"), "{stderr}");
    assert!(stderr.contains("no network is granted to this call"), "{stderr}");
    assert_eq!(peer.connections(), 1);

    // Grants that cannot work are refused with the reason.
    let out = keel_async(
        home.path().to_path_buf(),
        args(&["tool", "call", "http_fetch", "--input", &input, "--net", "ftp://x.org"]),
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only https:// and http://"));
    let out = keel_async(
        home.path().to_path_buf(),
        args(&[
            "tool",
            "call",
            "http_fetch",
            "--input",
            &input,
            "--net",
            "x.org",
            "--secret",
            "NOPE@x.org",
        ]),
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("keel secret set NOPE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_its_network_grants_and_shows_them_and_its_requests() {
    let home = tempfile::tempdir().unwrap();
    let peer = WebPeer::start().await;
    let p = peer.port.to_string();
    let call = json!({"url": format!("http://localhost:{p}/echo")}).to_string();
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "http_fetch", call.as_str())]),
        Reply::text("Fetched."),
    ])
    .await;
    let url = model.url();
    let net = format!("http://localhost:{p}");
    let lo = format!("localhost:{p}");
    let out = keel_async(
        home.path().to_path_buf(),
        args(&[
            "run",
            "Fetch it",
            "--new-session",
            "web",
            "--net",
            &net,
            "--net-allow-loopback",
            &lo,
            "--allow",
            "http_fetch",
            "--no-preprocess",
            "--model-url",
            &url,
            "--model",
            "m",
            "--json",
        ]),
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(super::json_of(&out)["answer"], "Fetched.");
    assert_eq!(peer.connections(), 1);
    let out = keel_async(home.path().to_path_buf(), args(&["session", "show", "web"])).await;
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains(&format!("grant   net http://localhost:{p}")), "{shown}");
    assert!(shown.contains(&format!("net loopback exception localhost:{p} (testing)")), "{shown}");
    assert!(shown.contains(&format!("net GET http://localhost:{p}/echo → 200")), "{shown}");
    let out =
        keel_async(home.path().to_path_buf(), args(&["session", "show", "web", "--json"])).await;
    let v = super::json_of(&out);
    assert_eq!(v["net"][0], format!("net http://localhost:{p}"));
    // The grants are fixed at creation.
    let out = keel_async(
        home.path().to_path_buf(),
        args(&["run", "Again", "--session", "web", "--net", "example.org", "--model-url", &url]),
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fixed at creation"));
}
