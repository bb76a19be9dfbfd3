//! The host's own trust boundaries through the binary: `keel tool call` refuses a grant that
//! reaches the home, a guest never sees a host backtrace whatever `RUST_BACKTRACE` says, and
//! `keel skill install` sizes a skill's files before it reads any.

use std::process::Command;

use keel_tests::web_peer::WebPeer;
use serde_json::json;

use super::{json_of, keel};

#[test]
fn tool_call_refuses_a_grant_that_contains_or_lies_in_the_home() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("keel");
    let input = r#"{"path":"/h"}"#;
    for grant in
        [format!("{}=/h:ro", dir.path().display()), format!("{}/cache=/h:rw", home.display())]
    {
        // The home exists once the first call made it.
        let _ = keel(&home, &["tool", "list"]);
        let out = keel(
            &home,
            &["tool", "call", "fs_list_dir", "--grant", &grant, "--input", input, "--json"],
        );
        assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stdout));
        let v = json_of(&out);
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("keel's home") && message.contains("--home"), "{v}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("secrets.key"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_never_sees_a_host_backtrace_even_with_rust_backtrace_set() {
    let home = tempfile::tempdir().unwrap();
    let peer = WebPeer::start().await;
    let p = peer.port;
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home.path())
        .args(["tool", "install", keel_tests::guests::NET_PROBE_COMPONENT, "--name", "net-probe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    // The body passes the call's byte cap: the guest's stream read fails with the host's error.
    let input = json!({"url": format!("http://localhost:{p}/big?n=100000")}).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .arg("--home")
        .arg(home.path())
        .args(["tool", "call", "net_read_error", "--input", &input, "--json"])
        .args(["--net", &format!("http://localhost:{p}"), "--net-allow-loopback"])
        .arg(format!("localhost:{p}"))
        .args(["--net-max-bytes", "4096"])
        .output()
        .unwrap();
    let v = json_of(&out);
    let text = v["output"].as_str().unwrap_or_else(|| panic!("{v}"));
    assert!(!text.starts_with("no error"), "{text}");
    assert!(
        !text.contains("backtrace") && !text.contains(".rs:") && !text.contains("/src/"),
        "{text}"
    );
    assert!(text.len() < 4096, "{} bytes: {text}", text.len());
}

/// The largest resident set `child` reached, sampled until it exits.
fn peak_rss_kib(mut child: std::process::Child) -> (std::process::ExitStatus, u64) {
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        if let Ok(text) = std::fs::read_to_string(&status) {
            for line in text.lines().filter(|l| l.starts_with("VmHWM:")) {
                let kib: u64 =
                    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
                peak = peak.max(kib);
            }
        }
        if let Some(s) = child.try_wait().unwrap() {
            return (s, peak);
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn a_skill_of_many_large_files_is_refused_from_their_sizes_before_any_is_read() {
    let home = tempfile::tempdir().unwrap();
    let _ = keel(home.path(), &["tool", "list"]);
    let skill = tempfile::tempdir().unwrap();
    std::fs::write(skill.path().join("SKILL.md"), "---\nname: big\ndescription: d\n---\nbody\n")
        .unwrap();
    // Twenty sparse 64 MiB components: 1.25 GiB if they were read.
    for i in 0..20 {
        let f = std::fs::File::create(skill.path().join(format!("c{i}.wasm"))).unwrap();
        f.set_len(64 << 20).unwrap();
    }
    let child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home.path())
        .args(["skill", "install", skill.path().to_str().unwrap(), "--json"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (status, peak) = peak_rss_kib(child);
    assert_ne!(status.code(), Some(0));
    assert!(peak < 200 * 1024, "keel reached {peak} KiB refusing the skill");
    let out = keel(home.path(), &["skill", "install", skill.path().to_str().unwrap(), "--json"]);
    let v = json_of(&out);
    let text = v.to_string();
    assert!(text.contains("20 components, over 16"), "{text}");
    assert!(text.contains("the components hold 1342177280 bytes"), "{text}");
}
