//! The host's boundaries, second round, through the binary: keel's home is a directory
//! wherever it is mounted (a bind mount of it, or of a directory above it, is the same
//! directory), a hard link to the secrets key is the key, no grant reaches a pseudo-filesystem,
//! credentials leave the process's environment, a loose secrets key is refused until rotated,
//! secrets are followed into files and through the encodings a server undoes, and names are
//! what they look like.
//!
//! The mount tests make their bind mounts in a mount namespace of their own (`unshare -m`, as
//! root; `unshare -rm` otherwise), so nothing outside the test sees them.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use keel_tests::web_peer::WebPeer;
use serde_json::{Value, json};

use super::net::secret_set;
use super::{json_of, keel};

const CANARY: &str = "reach-canary-5d2e8f-secret";

/// A user's home directory with keel's home at its usual place below it, and a secret set
/// (so `secrets.key` and `secrets.age` exist).
struct UserHome {
    _dir: tempfile::TempDir,
    root: PathBuf,
    user: PathBuf,
    home: PathBuf,
}

fn user_home() -> UserHome {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let user = root.join("user");
    let home = user.join(".local/share/keel");
    std::fs::create_dir_all(&home).unwrap();
    let out = secret_set(&home, "TOKEN", CANARY);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    UserHome { _dir: dir, root, user, home }
}

/// `keel --home HOME ARGS` run after `binds` (source, target) are bind-mounted, in a mount
/// namespace of its own.
fn keel_with_binds(binds: &[(&Path, &Path)], home: &Path, args: &[&str]) -> Output {
    let mut script = String::from("set -e\n");
    for (i, _) in binds.iter().enumerate() {
        script.push_str(&format!("mount --bind \"${}\" \"${}\"\n", 2 * i + 1, 2 * i + 2));
    }
    let n = 2 * binds.len();
    script.push_str(&format!("shift {n}\nexec \"$@\"\n"));
    let flags = if rustix_is_root() { "-m" } else { "-rm" };
    let mut cmd = Command::new("unshare");
    cmd.args([flags, "sh", "-c", &script, "sh"]);
    for (s, t) in binds {
        cmd.arg(s).arg(t);
    }
    cmd.arg(env!("CARGO_BIN_EXE_keel")).arg("--home").arg(home).args(args);
    let out = cmd.output().expect("unshare (util-linux) runs the mount tests");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("mount:"),
        "the bind mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn rustix_is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// `tool call TOOL --grant GRANT --input INPUT --json`.
fn call<'a>(tool: &'a str, grant: &'a str, input: &'a str) -> [&'a str; 8] {
    ["tool", "call", tool, "--grant", grant, "--input", input, "--json"]
}

fn read_input(path: &str) -> String {
    json!({ "path": path }).to_string()
}

/// A refused call's JSON: exit code 2 and the error's kind and message.
fn refused(out: &Output) -> (String, String) {
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stdout));
    let v = json_of(out);
    (
        v["error"]["kind"].as_str().unwrap_or_default().to_string(),
        v["error"]["message"].as_str().unwrap_or_default().to_string(),
    )
}

/// A call that ran and whose tool failed: its JSON, with the guard's refusals.
fn ran_and_failed(out: &Output) -> Value {
    let v = json_of(out);
    assert_ne!(out.status.code(), Some(0), "the call succeeded: {v}");
    assert!(v["fs"]["denied"].is_array(), "the call did not run: {v}");
    v
}

fn key_text(home: &Path) -> String {
    std::fs::read_to_string(home.join("secrets.key")).unwrap()
}

#[test]
fn a_bind_mount_of_the_users_home_is_refused_as_a_grant_and_leads_nowhere_inside_one() {
    let u = user_home();
    let key = key_text(&u.home);
    let key_line = key.lines().last().unwrap().to_string();
    // The grant is a second path to the directory above keel's home: refused when given.
    let bind = u.root.join("bind");
    std::fs::create_dir(&bind).unwrap();
    let grant = format!("{}=/b:rw", bind.display());
    let input = read_input("/b/.local/share/keel/secrets.key");
    let out = keel_with_binds(&[(&u.user, &bind)], &u.home, &call("fs_read_file", &grant, &input));
    let (kind, message) = refused(&out);
    assert_eq!(kind, "grant", "{message}");
    assert!(message.contains("keel's home") && message.contains("another path"), "{message}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&key_line));
    // The grant is an ordinary directory with the user's home mounted inside it: the grant is
    // fine, and every object inside keel's home is refused where the tool opens it.
    let ws = u.root.join("ws");
    std::fs::create_dir_all(ws.join("inner")).unwrap();
    std::fs::write(ws.join("notes.txt"), "hello").unwrap();
    let grant = format!("{}=/w:rw", ws.display());
    let inner = ws.join("inner");
    for path in [
        "/w/inner/.local/share/keel/secrets.key",
        "/w/inner/.local/share/keel/secrets.age",
        "/w/inner/.local/share/keel/keel.db",
    ] {
        let out = keel_with_binds(
            &[(&u.user, &inner)],
            &u.home,
            &call("fs_read_file", &grant, &read_input(path)),
        );
        let v = ran_and_failed(&out);
        assert!(v["fs"]["denied"].to_string().contains("keel's home"), "{path}: {v}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains(&key_line), "{path}");
    }
    // Nor can it write keel.toml (a foreign model URL) there.
    let write = json!({"path": "/w/inner/.local/share/keel/keel.toml", "content": "[model]\nurl = \"http://evil.example\"\n"}).to_string();
    let out =
        keel_with_binds(&[(&u.user, &inner)], &u.home, &call("fs_write_file", &grant, &write));
    let v = ran_and_failed(&out);
    assert!(v["fs"]["denied"].to_string().contains("keel's home"), "{v}");
    assert!(!u.home.join("keel.toml").exists(), "keel.toml was written");
    // Through a link inside the grant that leads into the mount: the same.
    std::os::unix::fs::symlink("inner/.local/share/keel", ws.join("h")).unwrap();
    let out = keel_with_binds(
        &[(&u.user, &inner)],
        &u.home,
        &call("fs_read_file", &grant, &read_input("/w/h/secrets.key")),
    );
    ran_and_failed(&out);
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&key_line));
    // The rest of the grant works as before.
    let out = keel_with_binds(
        &[(&u.user, &inner)],
        &u.home,
        &call("fs_read_file", &grant, &read_input("/w/notes.txt")),
    );
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn a_hard_link_to_the_secrets_key_in_a_grant_is_the_key() {
    let u = user_home();
    let key_line = key_text(&u.home).lines().last().unwrap().to_string();
    let ws = u.root.join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::hard_link(u.home.join("secrets.key"), ws.join("innocent.txt")).unwrap();
    std::fs::hard_link(u.home.join("secrets.age"), ws.join("data.bin")).unwrap();
    let grant = format!("{}=/w:ro", ws.display());
    for path in ["/w/innocent.txt", "/w/data.bin"] {
        let out = keel(&u.home, &call("fs_read_file", &grant, &read_input(path)));
        let v = ran_and_failed(&out);
        assert!(v["fs"]["denied"].to_string().contains("hard link"), "{path}: {v}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains(&key_line));
    }
}

#[test]
fn no_grant_reaches_a_process_filesystem_by_its_path_or_by_a_mount_elsewhere() {
    let u = user_home();
    let out = keel(&u.home, &call("fs_read_file", "/proc=/p:ro", &read_input("/p/self/environ")));
    // Refused where the grant is read, before anything runs.
    assert_eq!(out.status.code(), Some(2));
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(message.contains("`proc` filesystem"), "{message}");
    let out = keel(&u.home, &call("fs_list_dir", "/sys/kernel=/s:ro", &read_input("/s")));
    assert_eq!(out.status.code(), Some(2));
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(message.contains("`sysfs` filesystem"), "{message}");
    // /proc mounted inside a granted directory: the grant is fine, /proc inside it is not.
    let ws = u.root.join("ws");
    std::fs::create_dir_all(ws.join("p")).unwrap();
    let grant = format!("{}=/w:ro", ws.display());
    let proc_dir = Path::new("/proc");
    let out = keel_with_binds(
        &[(proc_dir, &ws.join("p"))],
        &u.home,
        &call("fs_read_file", &grant, &read_input("/w/p/self/environ")),
    );
    let v = ran_and_failed(&out);
    assert!(v["fs"]["denied"].to_string().contains("`proc` filesystem"), "{v}");
}

#[test]
fn credentials_leave_the_process_environment_when_keel_starts() {
    let u = user_home();
    let out = keel(
        &u.home,
        &["tool", "install", keel_tests::guests::HOSTILE_COMPONENT, "--name", "hostile"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(&u.home)
        .args(["tool", "call", "sleep", "--input", r#"{"ms": 4000}"#, "--json"])
        .env("OPENAI_API_KEY", "env-canary-openai-3c1d")
        .env("KEEL_API_TOKEN", "env-canary-token-9a7b-long-enough-to-pass")
        .env("KEEL_MCP_TOKEN", "env-canary-mcp-4e2f-long-enough-to-pass")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let environ = std::fs::read(format!("/proc/{}/environ", child.id())).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let environ = String::from_utf8_lossy(&environ);
    for canary in ["env-canary-openai", "env-canary-token", "env-canary-mcp"] {
        assert!(!environ.contains(canary), "{canary} is in /proc/PID/environ");
    }
    // Other variables are still there.
    assert!(environ.contains("PATH="));
}

#[test]
fn a_secrets_key_others_can_read_is_refused_until_it_is_rotated() {
    let u = user_home();
    let key = u.home.join("secrets.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = keel(&u.home, &["secret", "list", "--json"]);
    assert_ne!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("readable by other users") && text.contains("keel secret rotate-key"),
        "{text}"
    );
    // Opening the home did not tighten it behind the admin's back.
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o644);
    // Every tool call refuses too: it cannot redact without the key.
    let old = key_text(&u.home);
    let out = keel(&u.home, &["secret", "rotate-key", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let v = json_of(&out);
    assert_eq!(v["reencrypted"], json!(["secrets.age"]));
    assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    assert_ne!(key_text(&u.home), old, "a new key");
    let out = keel(&u.home, &["secret", "list", "--json"]);
    assert_eq!(json_of(&out), json!({"ok": true, "secrets": ["TOKEN"]}));
}

#[test]
fn names_are_ascii_and_a_component_file_cannot_take_a_first_party_name() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("keel");
    for name in ["\u{430}lice", "\u{ff41}lice", "al ice"] {
        let out = keel(&home, &["token", "add", name, "--role", "user", "--json"]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", String::from_utf8_lossy(&out.stdout));
        assert!(String::from_utf8_lossy(&out.stdout).contains("ASCII letters"), "{name}");
    }
    let out = keel(&home, &["token", "add", "alice", "--role", "user", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    // A component file that names itself like a first-party component is not run under that
    // name (the name a file runs under is the one it carries, as install names it).
    let fs = dir.path().join("anything.wasm");
    let bytes = std::fs::read(keel_tests::guests::HOSTILE_COMPONENT).unwrap();
    std::fs::write(
        &fs,
        keel_tests::oci_registry::with_custom_section(&bytes, "keel:component", b"fs"),
    )
    .unwrap();
    let out = keel(
        &home,
        &[
            "tool",
            "call",
            "echo",
            "--wasm",
            fs.to_str().unwrap(),
            "--input",
            r#"{"text":"x"}"#,
            "--json",
        ],
    );
    let (kind, message) = refused(&out);
    assert_eq!(kind, "reserved_name", "{message}");
    assert!(message.contains("give it another name"), "{message}");
    let other = dir.path().join("hostile.wasm");
    std::fs::copy(keel_tests::guests::HOSTILE_COMPONENT, &other).unwrap();
    let out = keel(
        &home,
        &[
            "tool",
            "call",
            "echo",
            "--wasm",
            other.to_str().unwrap(),
            "--input",
            r#"{"text":"x"}"#,
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_left_in_a_file_is_redacted_and_stopped_in_every_encoding_a_server_undoes() {
    let u = user_home();
    let peer = WebPeer::start().await;
    let p = peer.port;
    let ws = u.root.join("ws");
    std::fs::create_dir(&ws).unwrap();
    // An earlier call wrote the value into a file of its grant.
    std::fs::write(ws.join("echo.txt"), format!("the server said {CANARY}\n")).unwrap();
    let grant = format!("{}=/w:ro", ws.display());
    let home = u.home.clone();
    let run = move |args: Vec<String>| {
        let home = home.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                keel(&home, &args)
            })
            .await
            .unwrap()
        }
    };
    let out = run(vec![
        "tool".into(),
        "call".into(),
        "fs_read_file".into(),
        "--grant".into(),
        grant.clone(),
        "--input".into(),
        read_input("/w/echo.txt"),
        "--json".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[secret:TOKEN]") && !text.contains(CANARY), "{text}");
    // Sent on, in the encodings the server's own parser undoes, by a call with no secret:
    // refused, and the server received nothing.
    let every_byte: String = CANARY.bytes().map(|b| format!("%{b:02X}")).collect();
    let json_escaped: String = CANARY.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
    let net = format!("http://localhost:{p}");
    let lo = format!("localhost:{p}");
    for input in [
        json!({"url": format!("http://localhost:{p}/echo?q={CANARY}")}),
        json!({"url": format!("http://localhost:{p}/echo?q={every_byte}")}),
        json!({"url": format!("http://localhost:{p}/echo"), "method": "POST", "body": format!("a=1&b={every_byte}"), "headers": {"content-type": "application/x-www-form-urlencoded"}}),
        json!({"url": format!("http://localhost:{p}/echo"), "method": "POST", "body": format!("{{\"k\": \"{json_escaped}\"}}"), "headers": {"content-type": "application/json"}}),
    ] {
        let out = run(vec![
            "tool".into(),
            "call".into(),
            "http_fetch".into(),
            "--input".into(),
            input.to_string(),
            "--net".into(),
            net.clone(),
            "--net-allow-loopback".into(),
            lo.clone(),
            "--json".into(),
        ])
        .await;
        let v = json_of(&out);
        let reason = v["net"][0]["reason"].as_str().unwrap_or_default();
        assert_eq!(v["net"][0]["outcome"], "denied", "{input}: {v}");
        assert!(
            reason.contains("secret `TOKEN`") && reason.contains("binds to no destination"),
            "{reason}"
        );
    }
    assert_eq!(peer.connections(), 0, "the server received a request");
    // A value keel itself writes into a query (percent-encoded) does not come back in the
    // output when the server echoes the URL.
    let secret = "TOKEN2";
    let value = "tok/Abc+def=ghijk";
    let h = u.home.clone();
    let out = tokio::task::spawn_blocking(move || secret_set(&h, secret, value)).await.unwrap();
    assert_eq!(out.status.code(), Some(0));
    let input = json!({"url": format!("http://localhost:{p}/echo?key={{{{secret:TOKEN2}}}}")});
    let bind = format!("TOKEN2@http://localhost:{p}:in=query");
    let out = run(vec![
        "tool".into(),
        "call".into(),
        "http_fetch".into(),
        "--input".into(),
        input.to_string(),
        "--net".into(),
        net.clone(),
        "--net-allow-loopback".into(),
        lo.clone(),
        "--secret".into(),
        bind,
        "--json".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        peer.seen().last().unwrap().path.contains("tok%2FAbc%2Bdef%3Dghijk"),
        "{:?}",
        peer.seen()
    );
    assert!(!text.contains("tok%2FAbc") && text.contains("[secret:TOKEN2]"), "{text}");
}
