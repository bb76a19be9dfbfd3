//! Several `keel serve` hosts on one PostgreSQL (Debian's `postgresql`, a throwaway cluster
//! run as an unprivileged user): a host paused past its lease's TTL loses its session to
//! another host, which finishes the turn, and writes nothing when it wakes; every event of the
//! session is numbered without gaps, with fencing tokens that never go down. Ignored by
//! default: `cargo test --release --test cli -- --ignored postgres`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_tests::mock_model::{MockModel, Reply};
use keel_tests::postgres::Cluster;
use serde_json::json;

use super::serve::{client, get, post};

/// One admin token for every host (a shared store holds one token table).
const TOKEN: &str = "kT9-multi-host-admin-token-4f2a81c07d";

/// A `keel serve` host with its own home, on the shared database.
struct Host {
    child: Child,
    base: String,
    stderr: Arc<Mutex<String>>,
}

impl Host {
    fn start(home: &Path, db: &str, id: &str, model: &str) -> Self {
        std::fs::write(home.join("keel.toml"), format!("[store]\nurl = \"{db}\"\n")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("--home")
            .arg(home)
            .args(["serve", "--listen", "127.0.0.1:0", "--model-url", model, "--model", "m"])
            .env("KEEL_API_TOKEN", TOKEN)
            .env("KEEL_HOST_ID", id)
            .env("KEEL_LEASE_TTL_MS", "1500")
            .env("KEEL_LOG", "warn,keel=info")
            .env_remove("KEEL_MODEL_URL")
            .env_remove("KEEL_MODEL")
            .env_remove("KEEL_TEST_POSTGRES")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (base, stderr) = super::serve::serving(&mut child);
        Self { child, base, stderr }
    }

    fn api(&self, path: &str) -> String {
        format!("{}/api/v1{path}", self.base)
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, sig).unwrap();
    }

    fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Rows of `sql` on database `keel`, each line split on `|`.
fn rows(pg: &Cluster, sql: &str) -> Vec<Vec<String>> {
    pg.psql("keel", sql)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.split('|').map(str::to_string).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_a_paused_host_loses_its_session_to_another_and_writes_nothing_when_it_wakes() {
    let pg = Cluster::start(&[]).expect("a PostgreSQL server (install Debian's postgresql)");
    pg.create_database("keel").unwrap();
    // Host A's model call streams slowly (A is paused in the middle of it); the call made
    // again by the host that takes over is answered at once.
    let model = MockModel::start(vec![
        Reply::drip_text(&["the paused ", "host's ", "answer"], Duration::from_millis(700)),
        Reply::text("the answer of the host that took over"),
    ])
    .await;
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Host::start(home_a.path(), &pg.url("keel"), "host-a", &model.url());
    let b = Host::start(home_b.path(), &pg.url("keel"), "host-b", &model.url());
    let c = client();

    let (status, v) = post(&c, &a.api("/sessions"), TOKEN, json!({"input": "hi"})).await;
    assert!(status.is_success(), "{v}\n{}", a.log());
    let id = v["session_id"].as_str().unwrap().to_string();
    // A is in its model call: pause it there.
    let start = Instant::now();
    while model.requests().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(30), "A never called the model\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.signal(rustix::process::Signal::STOP);
    let paused = Instant::now();

    // B takes the session over when A's lease expires, and finishes the turn.
    loop {
        let (status, v) = get(&c, &b.api(&format!("/sessions/{id}")), TOKEN).await;
        assert_eq!(status, 200, "{v}");
        if v["session"]["state"] == "idle" {
            break;
        }
        assert!(
            paused.elapsed() < Duration::from_secs(30),
            "B never took the session over: {v}\n{}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let takeover = paused.elapsed();
    assert!(b.log().contains("taking over a session whose runner is gone"), "{}", b.log());

    // A wakes: its stream ends, and every write it tries is refused.
    a.signal(rustix::process::Signal::CONT);
    let woke = Instant::now();
    while !a.log().contains("taken over") {
        assert!(woke.elapsed() < Duration::from_secs(20), "A never noticed\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Nothing of A's answer was written; one final answer, B's.
    let assistant = rows(
        &pg,
        &format!(
            "SELECT body FROM messages WHERE session_id='{id}' AND role='assistant' ORDER BY seq"
        ),
    );
    let all: String = assistant.iter().flatten().cloned().collect();
    assert!(!all.contains("paused host"), "a stale write: {all}");
    assert!(all.contains("took over"), "{all}");
    // Events: numbered 1..n without gaps, fencing tokens never going down.
    let events = rows(
        &pg,
        &format!(
            "SELECT seq, COALESCE(fence, 0), kind FROM session_events WHERE session_id='{id}' ORDER BY seq"
        ),
    );
    let mut last_fence = 0;
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e[0], (i + 1).to_string(), "contiguous: {events:?}");
        let fence: i64 = e[1].parse().unwrap();
        assert!(fence >= last_fence, "the fence went down at {}: {events:?}", e[0]);
        last_fence = fence;
    }
    assert!(last_fence >= 2, "a takeover moved the token on: {events:?}");
    // No session left running without a live lease.
    let running = rows(&pg, "SELECT id FROM sessions WHERE state = 'running'");
    assert!(running.is_empty(), "{running:?}");
    eprintln!(
        "takeover after a pause: {:.2} s (TTL 1.5 s, heartbeat 0.5 s)",
        takeover.as_secs_f64()
    );
}

/// `keel` on `home` with `env`, never on the suite's own PostgreSQL.
fn keel_env(home: &Path, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_keel"));
    c.arg("--home").arg(home).args(args).env_remove("KEEL_TEST_POSTGRES");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_keel_store_migrate_copies_a_home_checks_it_and_another_host_runs_its_tools() {
    let pg = Cluster::start(&[]).expect("a PostgreSQL server (install Debian's postgresql)");
    pg.create_database("keel").unwrap();
    let url = pg.url("keel");
    let model = MockModel::start(vec![Reply::text("an answer to migrate")]).await;
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    // What a home holds: a session with a turn, a memory, a token, an installed component.
    let run = keel_env(
        h,
        &[],
        &["run", "--session", "m1", "--model-url", &model.url(), "--model", "m", "Say something."],
    );
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let hostile = keel_tests::guests::HOSTILE_COMPONENT;
    for args in [
        &["memory", "add", "the build uses cargo", "--json"][..],
        &["token", "add", "alice", "--role", "user", "--json"],
        &["tool", "install", hostile, "--name", "hostile", "--json"],
    ] {
        let out = keel_env(h, &[], args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    let out = keel_env(h, &[], &["store", "migrate", "--to", &url, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = super::json_of(&out);
    assert_eq!(v["ok"], true);
    assert!(!v["to"].as_str().unwrap().contains("PASSWORD"));
    let table = |name: &str| {
        v["tables"].as_array().unwrap().iter().find(|t| t["table"] == name).cloned().unwrap()
    };
    assert_eq!(table("sessions")["rows"], 1);
    assert!(table("messages")["rows"].as_u64().unwrap() >= 2);
    assert_eq!(table("memories")["rows"], 1);
    assert_eq!(table("skill_files")["rows"], 0);
    assert!(
        v["tables"].as_array().unwrap().iter().all(|t| t["digest"].as_str().unwrap().len() == 64)
    );
    assert!(v["component_files"].as_u64().unwrap() >= 5, "the first-party tools and hostile: {v}");

    // Into a database that holds keel data: refused, nothing changed.
    let again = keel_env(h, &[], &["store", "migrate", "--to", &url, "--json"]);
    assert_eq!(again.status.code(), Some(2));
    let e = super::json_of(&again);
    assert_eq!(e["error"]["kind"], "conflict");
    assert!(e["error"]["message"].as_str().unwrap().contains("already holds keel data"), "{e}");

    // The home on PostgreSQL: the same session, memory and store.
    let on_pg = [("KEEL_DATABASE_URL", url.as_str())];
    let info = super::json_of(&keel_env(h, &on_pg, &["store", "info", "--json"]));
    assert_eq!(info["backend"], "postgres");
    let list = keel_env(h, &on_pg, &["session", "list", "--json"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("\"m1\""), "{list:?}");
    let mem = keel_env(h, &on_pg, &["memory", "list", "--json"]);
    assert!(String::from_utf8_lossy(&mem.stdout).contains("the build uses cargo"), "{mem:?}");

    // Another host, with a home of its own: it compiles `hostile` from the bytes the store
    // keeps (digest-checked) and runs it.
    let other = tempfile::tempdir().unwrap();
    let call = keel_env(
        other.path(),
        &on_pg,
        &["tool", "call", "echo", "--input", r#"{"text": "from the other host"}"#, "--json"],
    );
    assert!(call.status.success(), "{}", String::from_utf8_lossy(&call.stderr));
    assert!(String::from_utf8_lossy(&call.stdout).contains("from the other host"));
    let digest = pg.psql("keel", "SELECT digest FROM components WHERE name = 'hostile'").unwrap();
    assert!(other.path().join("components").join(format!("{digest}.wasm")).exists());
}
