//! Several `keel serve` hosts on one PostgreSQL (Debian's `postgresql`, a throwaway cluster
//! run as an unprivileged user): a host paused past its lease's TTL loses its session to
//! another host, which finishes the turn, and writes nothing when it wakes; every event of the
//! session is numbered without gaps, with fencing tokens that never go down; a host that dies
//! is replaced by any long-lived front-end, `keel mcp serve --http` among them. Ignored by
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
        Self::start_with_ttl(home, db, id, model, 1500)
    }

    /// [`start`](Self::start) with a lease TTL of `ttl_ms`.
    fn start_with_ttl(home: &Path, db: &str, id: &str, model: &str, ttl_ms: u64) -> Self {
        std::fs::write(home.join("keel.toml"), format!("[store]\nurl = \"{db}\"\n")).unwrap();
        Self::start_in(home, id, model, ttl_ms, None)
    }

    /// `keel serve` on `home` (its keel.toml written), host `id`, with a lease TTL of `ttl_ms`,
    /// killing itself at `crash_at` (`NAME:N`) if given.
    fn start_in(home: &Path, id: &str, model: &str, ttl_ms: u64, crash_at: Option<&str>) -> Self {
        let mut child = Self::spawn(home, id, model, ttl_ms, crash_at);
        let (base, stderr) = super::serve::serving(&mut child);
        Self { child, base, stderr }
    }

    /// `keel serve` started, not yet waited for.
    fn spawn(home: &Path, id: &str, model: &str, ttl_ms: u64, crash_at: Option<&str>) -> Child {
        let mut c = Command::new(env!("CARGO_BIN_EXE_keel"));
        c.arg("--home")
            .arg(home)
            .args(["serve", "--listen", "127.0.0.1:0", "--model-url", model, "--model", "m"])
            .env("KEEL_API_TOKEN", TOKEN)
            .env("KEEL_HOST_ID", id)
            .env("KEEL_LEASE_TTL_MS", ttl_ms.to_string())
            .env("KEEL_LOG", "warn,keel=info")
            .env_remove("KEEL_CRASH_AT");
        if let Some(point) = crash_at {
            c.env("KEEL_CRASH_AT", point);
        }
        c.env_remove("KEEL_MODEL_URL")
            .env_remove("KEEL_MODEL")
            .env_remove("KEEL_TEST_POSTGRES")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
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

/// A new session on host `a` whose turn is in its model call (the model got its request):
/// its id.
async fn in_its_model_call(a: &Host, model: &MockModel, c: &reqwest::Client) -> String {
    let (status, v) = post(c, &a.api("/sessions"), TOKEN, json!({"input": "hi"})).await;
    assert!(status.is_success(), "{v}\n{}", a.log());
    let start = Instant::now();
    while model.requests().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(30), "A never called the model\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    v["session_id"].as_str().unwrap().to_string()
}

/// Waits until host `b` shows session `id` idle (its turn finished there), at most `within`
/// after `since`; how long after `since` that was.
async fn idle_on(
    c: &reqwest::Client,
    b: &Host,
    id: &str,
    since: Instant,
    within: Duration,
) -> Duration {
    loop {
        let (status, v) = get(c, &b.api(&format!("/sessions/{id}")), TOKEN).await;
        assert_eq!(status, 200, "{v}");
        if v["session"]["state"] == "idle" {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < within,
            "B did not take the session over within {within:?}: {v}\n{}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The text of session `id`'s assistant messages, in order.
fn assistant_text(pg: &Cluster, id: &str) -> String {
    let sql = format!(
        "SELECT body FROM messages WHERE session_id='{id}' AND role='assistant' ORDER BY seq"
    );
    rows(pg, &sql).iter().flatten().cloned().collect()
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

    let id = in_its_model_call(&a, &model, &c).await;
    // A is in its model call: pause it there.
    a.signal(rustix::process::Signal::STOP);
    let paused = Instant::now();

    // B takes the session over when A's lease expires, and finishes the turn.
    let takeover = idle_on(&c, &b, &id, paused, Duration::from_secs(30)).await;
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
    let all = assistant_text(&pg, &id);
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

/// `keel mcp serve --http` on `home` (its keel.toml names the shared store) as host `id`: a
/// long-lived front-end that is not the HTTP API. Its stderr, collected.
fn mcp_host(home: &Path, id: &str) -> (Child, Arc<Mutex<String>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home)
        .args(["mcp", "serve", "--http", "127.0.0.1:0"])
        .env("KEEL_HOST_ID", id)
        .env("KEEL_LEASE_TTL_MS", "1500")
        .env("KEEL_LOG", "warn,keel=info")
        .env_remove("KEEL_CRASH_AT")
        .env_remove("KEEL_MCP_TOKEN")
        .env_remove("KEEL_TEST_POSTGRES")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::io::BufReader::new(child.stderr.take().unwrap());
    let lines = log.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in reader.lines().map_while(Result::ok) {
            if line.contains("MCP server listening on") {
                let _ = tx.send(());
            }
            lines.lock().unwrap().push_str(&format!("{line}\n"));
        }
    });
    rx.recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("keel mcp serve did not start: {}", log.lock().unwrap()));
    (child, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_an_mcp_server_takes_over_the_session_of_a_host_that_died() {
    let pg = Cluster::start(&[]).expect("a PostgreSQL server (install Debian's postgresql)");
    pg.create_database("keel").unwrap();
    // Host A dies in its model call; the call made again by the MCP server is answered.
    let model = MockModel::start(vec![
        Reply::drip_text(&["the dead ", "host's ", "answer"], Duration::from_millis(700)),
        Reply::text("the answer of the MCP server that took over"),
    ])
    .await;
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Host::start(home_a.path(), &pg.url("keel"), "host-a", &model.url());
    let c = client();
    let id = in_its_model_call(&a, &model, &c).await;
    a.signal(rustix::process::Signal::KILL);
    let died = Instant::now();

    // B is not an HTTP API host: keel as an MCP server, on the same store.
    std::fs::write(
        home_b.path().join("keel.toml"),
        format!("[store]\nurl = \"{}\"\n", pg.url("keel")),
    )
    .unwrap();
    let (mut b, log) = mcp_host(home_b.path(), "host-b");
    let state = |pg: &Cluster| rows(pg, &format!("SELECT state FROM sessions WHERE id='{id}'"));
    while state(&pg) != [["idle".to_string()]] {
        assert!(
            died.elapsed() < Duration::from_secs(30),
            "the MCP server never took the session over: {:?}\n{}",
            state(&pg),
            log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let takeover = died.elapsed();
    let _ = b.kill();
    let _ = b.wait();
    assert!(
        log.lock().unwrap().contains("taking over a session whose runner is gone"),
        "{}",
        log.lock().unwrap()
    );
    let assistant = rows(
        &pg,
        &format!(
            "SELECT body FROM messages WHERE session_id='{id}' AND role='assistant' ORDER BY seq"
        ),
    );
    let all: String = assistant.iter().flatten().cloned().collect();
    assert!(all.contains("MCP server that took over") && !all.contains("dead host"), "{all}");
    eprintln!("takeover by keel mcp serve after a kill: {:.2} s", takeover.as_secs_f64());
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
        &[
            "run",
            "--new-session",
            "m1",
            "--model-url",
            &model.url(),
            "--model",
            "m",
            "Say something.",
        ],
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

/// Crash points a restarted host may carry: it kills itself the N-th time it passes one.
const POINTS: [&str; 5] =
    ["before_intent", "after_intent", "after_effect", "after_result", "after_recall"];

/// Sends `body` to `url`: whether the input was acknowledged (2xx). A host killed during the
/// request leaves it unacknowledged — it may or may not have been stored.
async fn submit(c: &reqwest::Client, url: &str, body: serde_json::Value) -> bool {
    match c
        .post(url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
    {
        Ok(res) => res.status().is_success(),
        Err(_) => false,
    }
}

/// The tag an input or an answer ends with (`task t17`, `done t17`).
fn tag_of(text: &str) -> String {
    text.split_whitespace().last().unwrap_or_default().to_string()
}

/// Jepsen-style: `hosts` `keel serve` processes on one PostgreSQL serve the same sessions
/// while inputs arrive at random hosts; a host is killed (SIGKILL at a random moment, or at a
/// named crash point it was started with) and restarted, `KEEL_HOSTS_KILLS` times (default
/// 100). Then: every acknowledged input answered exactly once (and every stored one), every
/// non-idempotent effect run at most once (exactly once when its journal says done), each
/// session's events numbered without gaps with fencing tokens that never go down, and no
/// session ever left running without a live lease for longer than a takeover takes. Prints
/// the seed first and what happened last.
#[allow(clippy::print_stderr)]
async fn random_kills(hosts: usize) {
    let kills: usize =
        std::env::var("KEEL_HOSTS_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    let (mut rng, seed) = keel_tests::Rng::from_env();
    eprintln!("{hosts} hosts, {kills} kills, KEEL_CRASH_SEED={seed}");
    let pg = Cluster::start(&[]).expect("a PostgreSQL server (install Debian's postgresql)");
    pg.create_database("keel").unwrap();
    let db = pg.url("keel");
    let plan = ["effect_append", "effect_put", "effect_append"].map(String::from).to_vec();
    let model = MockModel::start_fn(keel_tests::mock_model::plan_responder(plan)).await;
    let work = tempfile::tempdir().unwrap();
    let homes: Vec<tempfile::TempDir> = (0..hosts).map(|_| tempfile::tempdir().unwrap()).collect();
    for h in &homes {
        let toml = format!(
            "[store]\nurl = \"{db}\"\n[serve]\ngrant_roots = [{:?}]\n",
            work.path().display().to_string()
        );
        std::fs::write(h.path().join("keel.toml"), toml).unwrap();
    }
    let install = keel_env(
        homes[0].path(),
        &[],
        &["tool", "install", keel_tests::guests::EFFECTS_COMPONENT, "--name", "effects"],
    );
    assert!(install.status.success(), "{}", String::from_utf8_lossy(&install.stderr));
    const TTL_MS: u64 = 1000;
    let start = |i: usize, crash_at: Option<&str>| {
        tokio::task::block_in_place(|| {
            Host::start_in(homes[i].path(), &format!("h{i}"), &model.url(), TTL_MS, crash_at)
        })
    };
    let mut live: Vec<Host> = (0..hosts).map(|i| start(i, None)).collect();
    let c = client();

    // Four sessions, each created with its first input (acknowledged before any kill).
    const SESSIONS: usize = 4;
    let grant =
        json!([{"host": work.path().display().to_string(), "guest": "/work", "access": "rw"}]);
    let tools = json!(["effect_append", "effect_put", "effect_peek"]);
    let mut acknowledged: Vec<String> = Vec::new();
    for k in 0..SESSIONS {
        let body = json!({"id": format!("j{k}"), "input": format!("task c{k}"),
                          "grants": grant, "tools": tools});
        assert!(submit(&c, &live[k % hosts].api("/sessions"), body).await, "{}", live[0].log());
        acknowledged.push(format!("c{k}"));
    }

    let begun = Instant::now();
    let mut inflight = Vec::new();
    let (mut signalled, mut self_killed) = (0usize, 0usize);
    // Sessions seen running without a live lease, since when.
    let mut orphaned: std::collections::HashMap<String, Instant> = Default::default();
    let mut worst_orphan = Duration::ZERO;
    let mut i = 0;
    while signalled + self_killed < kills {
        // The nemesis picks its victim: half the time a host holding a lease (mid-turn), else
        // any host.
        let holders = rows(&pg, "SELECT owner FROM runner_leases WHERE owner <> ''");
        let holding: Vec<usize> = (0..hosts)
            .filter(|h| holders.iter().any(|o| o[0].starts_with(&format!("h{h}/"))))
            .collect();
        let victim = if !holding.is_empty() && rng.below(2) == 0 {
            holding[rng.below(holding.len() as u64) as usize]
        } else {
            rng.below(hosts as u64) as usize
        };
        // Inputs keep arriving at random hosts; a third of them at the victim just before it
        // dies (acknowledged or not: either way stored at most once, answered if stored).
        let at_victim = rng.below(3) == 0;
        let to = if at_victim { victim } else { rng.below(hosts as u64) as usize };
        let tag = format!("t{i}");
        let url = live[to].api(&format!("/sessions/j{}/input", i % SESSIONS));
        let client = c.clone();
        let body = json!({"text": format!("task {tag}")});
        inflight.push((tag, tokio::spawn(async move { submit(&client, &url, body).await })));
        i += 1;
        let pause = if at_victim { rng.below(6) } else { 20 + rng.below(400) };
        tokio::time::sleep(Duration::from_millis(pause)).await;

        let crash_at = (rng.below(4) == 0).then(|| {
            format!("{}:{}", POINTS[rng.below(POINTS.len() as u64) as usize], 1 + rng.below(3))
        });
        live[victim].signal(rustix::process::Signal::KILL);
        let _ = live[victim].child.wait();
        signalled += 1;
        live[victim] = start(victim, crash_at.as_deref());
        // Hosts that killed themselves at their crash point come back without one.
        for (h, host) in live.iter_mut().enumerate() {
            if host.child.try_wait().unwrap().is_some() {
                self_killed += 1;
                *host = start(h, None);
            }
        }

        // No session stays running without a live lease longer than a takeover takes.
        let now = Instant::now();
        let bare = rows(
            &pg,
            &format!(
                "SELECT s.id FROM sessions s LEFT JOIN runner_leases l ON l.session_id = s.id
                 WHERE s.state IN ('running', 'preparing_context', 'compressing')
                   AND (l.owner IS NULL OR l.owner = ''
                        OR l.heartbeat_ms < (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT - {TTL_MS})"
            ),
        );
        let bare: Vec<String> = bare.into_iter().map(|r| r[0].clone()).collect();
        orphaned.retain(|id, _| bare.contains(id));
        for id in bare {
            let since = *orphaned.entry(id).or_insert(now);
            worst_orphan = worst_orphan.max(now - since);
        }
    }
    let nemesis = begun.elapsed();

    // Every host up without a crash point; every submission answered or failed.
    for (h, host) in live.iter_mut().enumerate() {
        host.signal(rustix::process::Signal::KILL);
        let _ = host.child.wait();
        *host = start(h, None);
    }
    let (mut unacknowledged, mut sent) = (Vec::new(), 0usize);
    for (tag, handle) in inflight {
        sent += 1;
        if handle.await.unwrap() {
            acknowledged.push(tag);
        } else {
            unacknowledged.push(tag);
        }
    }
    let quiet = Instant::now();
    loop {
        let busy = rows(
            &pg,
            "SELECT (SELECT COUNT(*) FROM inbox WHERE consumed_at IS NULL)
                  + (SELECT COUNT(*) FROM sessions WHERE state <> 'idle')",
        );
        if busy[0][0] == "0" {
            break;
        }
        assert!(
            quiet.elapsed() < Duration::from_secs(180),
            "the sessions never settled: {:?}\n{}",
            rows(&pg, "SELECT id, state, state_detail FROM sessions"),
            live.iter().map(Host::log).collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let settle = quiet.elapsed();

    // Inputs: every acknowledged one stored; every stored one answered exactly once.
    let stored: Vec<String> =
        rows(&pg, "SELECT text FROM inbox").iter().map(|r| tag_of(&r[0])).collect();
    for tag in &acknowledged {
        assert!(stored.contains(tag), "acknowledged input {tag} was lost");
    }
    let mut answers: std::collections::HashMap<String, usize> = Default::default();
    for r in
        rows(&pg, "SELECT body FROM messages WHERE role = 'assistant' AND body LIKE '%\"done %'")
    {
        let body: serde_json::Value = serde_json::from_str(&r[0]).unwrap();
        *answers.entry(tag_of(body["content"].as_str().unwrap_or_default())).or_default() += 1;
    }
    for tag in &stored {
        let n = answers.get(tag).copied().unwrap_or(0);
        assert_eq!(
            n,
            1,
            "stored input {tag} answered {n} times: {:?}\n{:?}",
            rows(&pg, "SELECT session_id, seq, role, body FROM messages ORDER BY session_id, seq"),
            rows(&pg, "SELECT session_id, seq, kind FROM session_events ORDER BY session_id, seq")
        );
    }
    assert_eq!(answers.len(), stored.len(), "answers to inputs never stored: {answers:?}");

    // Effects: a non-idempotent call ran at most once, and once when its journal says done.
    let mut ran: std::collections::HashMap<String, usize> = Default::default();
    for l in keel_tests::log_lines(work.path(), "effects.log") {
        *ran.entry(l).or_default() += 1;
    }
    let twice: Vec<_> = ran.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "effects run more than once: {twice:?}");
    let (mut done, mut unknown) = (0usize, 0usize);
    for r in rows(
        &pg,
        "SELECT input::json->>'label', status, COALESCE(error_kind, '') FROM tool_calls
         WHERE tool = 'effect_append'",
    ) {
        let n = ran.get(&r[0]).copied().unwrap_or(0);
        match (r[1].as_str(), r[2].as_str()) {
            ("done", "") => {
                done += 1;
                assert_eq!(n, 1, "{} is done but ran {n} times", r[0]);
            }
            ("unknown", _) => unknown += 1,
            _ => {}
        }
    }

    // Events: numbered 1..n per session, fencing tokens never going down.
    let mut last: std::collections::HashMap<String, (i64, i64)> = Default::default();
    let mut fences = 0;
    for e in rows(
        &pg,
        "SELECT session_id, seq, COALESCE(fence, 0) FROM session_events ORDER BY session_id, seq",
    ) {
        let (seq, fence): (i64, i64) = (e[1].parse().unwrap(), e[2].parse().unwrap());
        let (last_seq, last_fence) = last.get(&e[0]).copied().unwrap_or((0, 0));
        assert_eq!(seq, last_seq + 1, "session {}: event {seq} follows {last_seq}", e[0]);
        assert!(fence >= last_fence, "session {}: the fence went down at event {seq}", e[0]);
        fences = fences.max(fence);
        last.insert(e[0].clone(), (seq, fence));
    }
    assert!(
        worst_orphan < Duration::from_millis(TTL_MS) * 6,
        "a session stayed running without a live lease for {worst_orphan:?}"
    );
    let running = rows(&pg, "SELECT id FROM sessions WHERE state <> 'idle'");
    assert!(running.is_empty(), "{running:?}");
    eprintln!(
        "{hosts} hosts: {} kills ({signalled} SIGKILL, {self_killed} at crash points) in {:.0} s; \
         inputs sent {sent} + {SESSIONS} (acknowledged {}, unacknowledged {}, stored {}), each stored \
         one answered once; effects done {done}, outcome unknown {unknown}, run twice 0; highest \
         fence {fences}; longest running without a live lease {:.2} s; settled in {:.1} s",
        signalled + self_killed,
        nemesis.as_secs_f64(),
        acknowledged.len(),
        unacknowledged.len(),
        stored.len(),
        worst_orphan.as_secs_f64(),
        settle.as_secs_f64(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_random_kills_of_two_hosts_lose_and_repeat_nothing() {
    random_kills(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_random_kills_of_three_hosts_lose_and_repeat_nothing() {
    random_kills(3).await;
}

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_over_tls_when_the_url_requires_it_with_the_certificate_checked() {
    // A certificate authority, and a server certificate for 127.0.0.1 it signed.
    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    let ca_ext = [
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ];
    let mut ca = vec!["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key"];
    ca.extend(["-out", "ca.crt", "-days", "2", "-subj", "/CN=keel test CA"]);
    ca.extend(ca_ext);
    openssl(d, &ca);
    openssl(
        d,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(
        d.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    std::fs::set_permissions(
        d.join("server.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    keel_tests::postgres::give_to_server(d).unwrap();
    let cert = format!("ssl_cert_file={}", d.join("server.crt").display());
    let key = format!("ssl_key_file={}", d.join("server.key").display());
    let pg = Cluster::start(&["ssl=on", &cert, &key, "log_connections=on"])
        .expect("a PostgreSQL server (install Debian's postgresql)");
    pg.create_database("keel").unwrap();
    let url = format!("{}?sslmode=require", pg.url("keel"));
    let ca = d.join("ca.crt").display().to_string();
    let home = tempfile::tempdir().unwrap();

    // Trusting the authority (`SSL_CERT_FILE`): keel's connections are encrypted.
    let trusted = [("KEEL_DATABASE_URL", url.as_str()), ("SSL_CERT_FILE", ca.as_str())];
    let add = keel_env(home.path(), &trusted, &["memory", "add", "kept over TLS", "--json"]);
    assert!(add.status.success(), "{}", String::from_utf8_lossy(&add.stderr));
    let list = keel_env(home.path(), &trusted, &["memory", "list", "--json"]);
    assert!(String::from_utf8_lossy(&list.stdout).contains("kept over TLS"), "{list:?}");
    let log = pg.log();
    let keel_connections: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("connection authorized") && l.contains("application_name=keel"))
        .collect();
    assert!(!keel_connections.is_empty(), "{log}");
    assert!(
        keel_connections.iter().all(|l| l.contains("SSL enabled")),
        "every connection of keel's is encrypted: {keel_connections:#?}"
    );

    // Not trusting it: refused before any password is sent, and said so.
    let mut c = Command::new(env!("CARGO_BIN_EXE_keel"));
    let untrusted = c
        .arg("--home")
        .arg(home.path())
        .args(["memory", "list", "--json"])
        .env("KEEL_DATABASE_URL", &url)
        .env_remove("SSL_CERT_FILE")
        .env_remove("KEEL_TEST_POSTGRES")
        .output()
        .unwrap();
    assert_eq!(untrusted.status.code(), Some(3), "{untrusted:?}");
    let err = super::json_of(&untrusted)["error"]["message"].as_str().unwrap().to_string();
    assert!(err.contains("invalid peer certificate"), "{err}");
    assert!(err.contains("?sslmode=require") && !err.contains("PASSWORD"), "{err}");

    // Without `sslmode=require` keel does not ask for TLS.
    let seen = pg.log().lines().count();
    let plain = keel_env(
        home.path(),
        &[("KEEL_DATABASE_URL", pg.url("keel").as_str())],
        &["memory", "list", "--json"],
    );
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    let log = pg.log();
    let plain: Vec<&str> =
        log.lines().skip(seen).filter(|l| l.contains("connection authorized")).collect();
    assert!(!plain.is_empty() && plain.iter().all(|l| !l.contains("SSL enabled")), "{plain:#?}");
}

/// Replicas start together: three `keel serve` hosts started at the same moment on a fresh
/// database, twenty times over, all serve — the migrations and the first-party installs run
/// one host after another (advisory locks), each seeing what the one before did — and the
/// catalog holds each first-party component once.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_three_hosts_started_at_once_on_a_fresh_database_all_serve() {
    let pg = Cluster::start(&[]).expect("a PostgreSQL server (install Debian's postgresql)");
    let model = MockModel::start(vec![]).await;
    let c = client();
    let started = Instant::now();
    for round in 0..20 {
        let db = format!("fresh{round}");
        pg.create_database(&db).unwrap();
        let url = pg.url(&db);
        let homes: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        for home in &homes {
            std::fs::write(home.path().join("keel.toml"), format!("[store]\nurl = \"{url}\"\n"))
                .unwrap();
        }
        let mut children: Vec<Child> = homes
            .iter()
            .enumerate()
            .map(|(i, home)| Host::spawn(home.path(), &format!("h{i}"), &model.url(), 1500, None))
            .collect();
        let hosts: Vec<Host> = children
            .drain(..)
            .map(|mut child| {
                let (base, stderr) = super::serve::serving(&mut child);
                Host { child, base, stderr }
            })
            .collect();
        for h in &hosts {
            let (status, v) = get(&c, &h.api("/tools"), TOKEN).await;
            assert_eq!(status, 200, "round {round}: {v}\n{}", h.log());
        }
        let components =
            pg.psql(&db, "SELECT name FROM components WHERE builtin <> 0 ORDER BY name").unwrap();
        let names: Vec<&str> =
            components.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        assert_eq!(names, ["control", "csv", "fs", "http"], "round {round}");
        for h in &hosts {
            assert!(!h.log().contains("duplicate key"), "round {round}: {}", h.log());
        }
    }
    eprintln!("20 rounds of 3 hosts started at once: {:.1} s", started.elapsed().as_secs_f64());
}

/// A host stopped with SIGTERM in the middle of a turn gives its leases up as it stops: another
/// host takes the session over at its next look and finishes the turn, well within the lease
/// TTL (20 s here), instead of waiting the TTL out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_a_host_stopped_with_sigterm_hands_its_session_over_before_the_ttl() {
    let pg = Cluster::start(&[]).expect("a PostgreSQL server (install Debian's postgresql)");
    pg.create_database("keel").unwrap();
    let model = MockModel::start(vec![
        Reply::drip_text(&["the stopped ", "host's ", "answer"], Duration::from_millis(2000)),
        Reply::text("the answer of the host that took over"),
    ])
    .await;
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (url, ttl_ms) = (pg.url("keel"), 20_000);
    let mut a = Host::start_with_ttl(home_a.path(), &url, "host-a", &model.url(), ttl_ms);
    let b = Host::start_with_ttl(home_b.path(), &url, "host-b", &model.url(), ttl_ms);
    let c = client();

    let id = in_its_model_call(&a, &model, &c).await;
    a.signal(rustix::process::Signal::TERM);
    let stopped = Instant::now();
    let status = a.child.wait().unwrap();
    assert!(status.success(), "A stops cleanly: {status}\n{}", a.log());
    assert!(a.log().contains("gave up 1 session leases"), "{}", a.log());
    let takeover = idle_on(&c, &b, &id, stopped, Duration::from_millis(ttl_ms)).await;
    let all = assistant_text(&pg, &id);
    assert!(!all.contains("stopped host"), "a write after the stop: {all}");
    assert!(all.contains("took over"), "{all}");
    eprintln!(
        "takeover after SIGTERM: {:.2} s (TTL {:.0} s, a look every {:.1} s)",
        takeover.as_secs_f64(),
        ttl_ms as f64 / 1e3,
        ttl_ms as f64 / 3e3
    );
}

/// `psql` on database `keel` in a transaction of its own, fed from the test: it runs `first`
/// and holds the transaction open until [`Held::commit`].
struct Held {
    child: Child,
}

impl Held {
    fn begin(pg: &Cluster, first: &str) -> Self {
        use std::io::Write;
        let mut child = Command::new(keel_tests::postgres::bin_dir().unwrap().join("psql"))
            .arg(pg.url("keel"))
            .args(["-X", "-q", "-o", "/dev/null", "-v", "ON_ERROR_STOP=1"])
            .env("PGAPPNAME", "held-by-test")
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.as_mut().unwrap();
        writeln!(stdin, "BEGIN; {first};").unwrap();
        stdin.flush().unwrap();
        // Held once the server shows the transaction idle, its statement done.
        let t = Instant::now();
        while rows(
            pg,
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'held-by-test' \
                        AND state = 'idle in transaction'",
        )
        .is_empty()
        {
            assert!(t.elapsed() < Duration::from_secs(10), "psql never held its transaction");
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { child }
    }

    fn commit(mut self) {
        use std::io::Write;
        let mut stdin = self.child.stdin.take().unwrap();
        writeln!(stdin, "COMMIT;").unwrap();
        drop(stdin);
        assert!(self.child.wait().unwrap().success());
    }
}

/// A host paused (SIGSTOP) while its writer is inside a transaction — idle in it, holding the
/// session's lease row and session row, as `pg_stat_activity` shows — has that transaction
/// ended by the server by the time its lease expires: another host takes the session over
/// within the TTL and a heartbeat or so, and that host's writer is never held up for long by
/// the paused one's locks (its own new session runs meanwhile; an input sent to the paused
/// host's session waits at most a lock timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "postgres tier: needs Debian's postgresql"]
async fn postgres_a_host_paused_inside_a_transaction_holds_no_other_host_up() {
    let pg = Cluster::start(&[]).expect("a PostgreSQL server (install Debian's postgresql)");
    pg.create_database("keel").unwrap();
    let model = MockModel::start(vec![
        Reply::drip_text(&["the paused ", "host's answer"], Duration::from_millis(1500)),
        Reply::text("an answer"),
        Reply::text("an answer"),
        Reply::text("an answer"),
        Reply::text("an answer"),
    ])
    .await;
    let (home_a, home_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ttl = Duration::from_millis(1500);
    let a = Host::start(home_a.path(), &pg.url("keel"), "host-a", &model.url());
    let b = Host::start(home_b.path(), &pg.url("keel"), "host-b", &model.url());
    let c = client();

    // A's turn is in its model call; the test holds the session's row, so A's writer, when
    // the answer comes, waits for it inside its transaction.
    let id = in_its_model_call(&a, &model, &c).await;
    let held = Held::begin(&pg, &format!("SELECT 1 FROM sessions WHERE id = '{id}' FOR UPDATE"));
    let t = Instant::now();
    while rows(
        &pg,
        "SELECT 1 FROM pg_stat_activity WHERE application_name = 'keel-writer' \
                     AND wait_event_type = 'Lock'",
    )
    .is_empty()
    {
        assert!(t.elapsed() < Duration::from_secs(30), "A's writer never waited\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Paused there; the test lets go, and A's statement finishes on the server: A's writer is
    // idle in its transaction, its locks held.
    a.signal(rustix::process::Signal::STOP);
    held.commit();
    let idle = "SELECT pid FROM pg_stat_activity WHERE application_name = 'keel-writer' \
                AND state = 'idle in transaction' AND state_change < now() - interval '200 ms'";
    let t = Instant::now();
    while rows(&pg, idle).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(5), "A's writer was not idle in a transaction");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let paused = t;

    // Meanwhile B runs a new session of its own, and is sent an input for A's session (its
    // writer touches the locked rows: it waits at most a lock timeout).
    let sent = Instant::now();
    let (status, v) =
        post(&c, &b.api(&format!("/sessions/{id}/input")), TOKEN, json!({"text": "more"})).await;
    let input_wait = sent.elapsed();
    let (s2, y) = post(&c, &b.api("/sessions"), TOKEN, json!({"input": "hello"})).await;
    assert!(s2.is_success(), "{y}\n{}", b.log());
    let own =
        idle_on(&c, &b, y["session_id"].as_str().unwrap(), sent, Duration::from_secs(10)).await;

    // B takes A's session over, and it goes idle there.
    let takeover = idle_on(&c, &b, &id, paused, Duration::from_secs(20)).await;
    assert!(
        rows(&pg, idle).is_empty(),
        "the paused host's transaction was ended by the server\n{}",
        pg.log()
    );
    assert!(b.log().contains("taking over a session whose runner is gone"), "{}", b.log());
    let all = assistant_text(&pg, &id);
    assert!(!all.contains("paused host"), "a write of the paused host: {all}");
    a.signal(rustix::process::Signal::CONT);
    eprintln!(
        "paused inside a transaction (TTL {:.1} s): taken over after {:.2} s; B's own new \
         session idle after {:.2} s; an input for the paused session answered in {:.2} s \
         ({status}: {v})",
        ttl.as_secs_f64(),
        takeover.as_secs_f64(),
        own.as_secs_f64(),
        input_wait.as_secs_f64()
    );
    assert!(
        status.is_success() || (status == 409 && v["error"]["kind"] == "conflict"),
        "an input B could not store yet is refused as a conflict: {status} {v}"
    );
    assert!(input_wait < ttl * 2, "B's writer waited {input_wait:?} on the paused host");
    assert!(own < ttl * 2, "B's own session waited {own:?}");
    assert!(takeover < ttl * 3, "taken over after {takeover:?}, TTL {ttl:?}");
}
