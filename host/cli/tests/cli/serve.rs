//! `keel serve` over real HTTP: the binary on a loopback port, a scripted model server, and a
//! reqwest client. The browser tests (headless Chromium) are in `console.rs`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_tests::mock_model::{MockModel, Reply};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A `keel serve` process on a free loopback port, stopped when dropped.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    /// The admin token `keel serve` wrote to the home.
    pub admin: String,
    pub stderr: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `keel serve` on `home` with its model at `model_url`; `grant_roots` go to
    /// keel.toml.
    pub fn start(home: &Path, model_url: &str, grant_roots: &[&Path]) -> Self {
        Self::start_with(home, model_url, grant_roots, "")
    }

    /// [`Server::start`] with more `[serve]` settings (lines of TOML).
    pub fn start_with(home: &Path, model_url: &str, grant_roots: &[&Path], serve: &str) -> Self {
        Self::start_env(home, model_url, grant_roots, serve, &[])
    }

    /// [`Server::start`] exporting traces to the OTLP/HTTP collector at `collector` (batches
    /// sent every 100 ms), `telemetry` lines in `[telemetry]`, and a canary as the model's
    /// API key.
    pub fn start_traced(
        home: &Path,
        model_url: &str,
        root: &Path,
        collector: &str,
        telemetry: &str,
    ) -> Self {
        Self::start_env(
            home,
            model_url,
            &[root],
            &format!("\n[telemetry]\n{telemetry}"),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", collector),
                ("OTEL_BSP_SCHEDULE_DELAY", "100"),
                ("KEEL_API_KEY", "model-key-canary"),
            ],
        )
    }

    pub fn start_env(
        home: &Path,
        model_url: &str,
        grant_roots: &[&Path],
        serve: &str,
        envs: &[(&str, &str)],
    ) -> Self {
        let roots: Vec<String> =
            grant_roots.iter().map(|r| format!("{:?}", r.display().to_string())).collect();
        std::fs::write(
            home.join("keel.toml"),
            format!("[serve]\ngrant_roots = [{}]\n{serve}\n", roots.join(", ")),
        )
        .unwrap();
        // An empty `model_url`: no model at all.
        let model: &[&str] =
            if model_url.is_empty() { &[] } else { &["--model-url", model_url, "--model", "m"] };
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("--home")
            .arg(home)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(model)
            .env_remove("KEEL_API_TOKEN")
            .env_remove("KEEL_MODEL_URL")
            .env_remove("KEEL_MODEL")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (base, stderr) = serving(&mut child);
        let admin = std::fs::read_to_string(home.join("api-token")).unwrap().trim().to_string();
        Self { child, base, admin, stderr }
    }

    pub fn api(&self, path: &str) -> String {
        format!("{}/api/v1{path}", self.base)
    }

    /// Sends SIGTERM and waits for the process to end (at most 30 s): its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "keel serve did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The base URL a starting `keel serve` prints (`http://127.0.0.1:PORT`), once it serves, and
/// its stderr, kept as it is written.
pub fn serving(child: &mut Child) -> (String, Arc<Mutex<String>>) {
    let stderr = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = BufReader::new(child.stderr.take().unwrap());
    let log = stderr.clone();
    std::thread::spawn(move || {
        for line in reader.lines().map_while(Result::ok) {
            if let Some(rest) = line.split("serving the API at ").nth(1) {
                let _ = tx.send(rest.split("/api/v1").next().unwrap_or_default().to_string());
            }
            log.lock().unwrap().push_str(&format!("{line}\n"));
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("keel serve did not start: {}", stderr.lock().unwrap()));
    (base, stderr)
}

pub fn client() -> reqwest::Client {
    keel::tls::init();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Sends `req` with `token`; returns the status and the JSON body.
pub async fn call(req: reqwest::RequestBuilder, token: &str) -> (StatusCode, Value) {
    let res = req.bearer_auth(token).send().await.unwrap();
    let status = res.status();
    let text = res.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|_| json!({ "text": text }));
    (status, v)
}

pub async fn post(c: &reqwest::Client, url: &str, token: &str, body: Value) -> (StatusCode, Value) {
    call(c.post(url).header("content-type", "application/json").body(body.to_string()), token).await
}

pub async fn get(c: &reqwest::Client, url: &str, token: &str) -> (StatusCode, Value) {
    call(c.get(url), token).await
}

/// `keel token add NAME --role ROLE`: the secret.
pub fn token(home: &Path, name: &str, role: &str) -> String {
    let out = super::keel(home, &["token", "add", name, "--role", role, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    super::json_of(&out)["token"].as_str().unwrap().to_string()
}

/// Polls session `id` until `done` holds for its JSON (`GET /sessions/{id}`), or panics.
pub async fn wait_for(
    c: &reqwest::Client,
    s: &Server,
    id: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let start = Instant::now();
    loop {
        let (status, v) = get(c, &s.api(&format!("/sessions/{id}")), &s.admin).await;
        assert_eq!(status, 200, "{v}");
        if done(&v["session"]) {
            return v["session"].clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "session {id} never became {what}: {v}\n{}",
            s.stderr.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn effects_wasm() -> Vec<u8> {
    std::fs::read(keel_tests::guests::EFFECTS_COMPONENT).unwrap()
}

/// Uploads the effect-counting test guest as `effects` (admin).
pub async fn upload_effects(c: &reqwest::Client, s: &Server) {
    let (status, v) = call(
        c.post(s.api("/tools?name=effects"))
            .header("content-type", "application/wasm")
            .body(effects_wasm()),
        &s.admin,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_starts_without_a_model_and_creating_a_session_says_what_to_configure() {
    let home = tempfile::tempdir().unwrap();
    let s = Server::start(home.path(), "", &[]);
    assert!(s.stderr.lock().unwrap().contains("no model is configured"));
    let c = client();
    let (status, v) = get(&c, &s.api("/sessions"), &s.admin).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, _) = get(&c, &s.api("/approvals"), &s.admin).await;
    assert_eq!(status, StatusCode::OK);
    let (status, v) = post(&c, &s.api("/sessions"), &s.admin, json!({"input": "hi"})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["error"]["kind"], "no_model");
    assert!(v["error"]["message"].as_str().unwrap().contains("--model-url URL --model NAME"));
    let page = c.get(format!("{}/", s.base)).send().await.unwrap();
    assert!(page.status().is_success() || page.status().is_redirection(), "{}", page.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_checks_tokens_roles_grant_roots_and_sizes() {
    let model = MockModel::start(vec![Reply::text("done")]).await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let inside = roots.path().join("project");
    std::fs::create_dir(&inside).unwrap();
    std::fs::write(inside.join("notes.txt"), "hello").unwrap();
    let outside = tempfile::tempdir().unwrap();
    // The token must exist before the server reads it: tokens are checked on every request.
    let alice = token(home.path(), "alice", "user");
    let s = Server::start(home.path(), &model.url(), &[roots.path()]);
    let c = client();
    let mode = std::fs::metadata(home.path().join("api-token")).unwrap().permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o600);

    // No token, a wrong token: 401 with the envelope.
    let res = c.get(s.api("/sessions")).send().await.unwrap();
    assert_eq!(res.status(), 401);
    let v: Value = serde_json::from_str(&res.text().await.unwrap()).unwrap();
    assert_eq!(v["error"]["kind"], "unauthorized");
    let (status, _) = get(&c, &s.api("/sessions"), "keel_0000").await;
    assert_eq!(status, 401);
    let (status, v) = get(&c, &s.api("/whoami"), &s.admin).await;
    assert_eq!(
        (status, v),
        (StatusCode::OK, json!({"name": super::serve_token_name(), "role": "admin"}))
    );
    let (_, v) = get(&c, &s.api("/whoami"), &alice).await;
    assert_eq!(v["role"], "user");

    // A user on admin routes: 403, nothing installed or removed.
    let (status, v) = call(
        c.post(s.api("/tools?name=effects"))
            .header("content-type", "application/wasm")
            .body(effects_wasm()),
        &alice,
    )
    .await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["kind"], "forbidden");
    let (status, _) = call(c.delete(s.api("/tools/fs")), &alice).await;
    assert_eq!(status, 403);
    let (status, _) = get(&c, &s.api("/tools/effects"), &alice).await;
    assert_eq!(status, 404, "not installed by the refused upload");
    // A user may not grant host directories, nor let tools run without asking.
    let grant = json!([{"host": inside.display().to_string(), "guest": "/p", "access": "rw"}]);
    let (status, v) =
        post(&c, &s.api("/sessions"), &alice, json!({"input": "hi", "grants": grant})).await;
    assert_eq!(status, 403, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("preset"), "{v}");
    let (status, _) = post(
        &c,
        &s.api("/sessions"),
        &alice,
        json!({"input": "hi", "policy": {"allow": ["destructive"]}}),
    )
    .await;
    assert_eq!(status, 403);
    // An admin's grant outside the roots is refused, naming them.
    let out = json!([{"host": outside.path().display().to_string(), "access": "ro"}]);
    let (status, v) =
        post(&c, &s.api("/sessions"), &s.admin, json!({"input": "hi", "grants": out})).await;
    assert_eq!(status, 403, "{v}");
    let root = roots.path().canonicalize().unwrap().display().to_string();
    assert!(v["error"]["message"].as_str().unwrap().contains(&root), "{v}");
    let (_, v) = get(&c, &s.api("/sessions"), &s.admin).await;
    assert_eq!(v["sessions"], json!([]), "nothing was created by a refused request");
    // Bad input: an empty task, an unknown field, no JSON content type.
    let (status, v) = post(&c, &s.api("/sessions"), &s.admin, json!({"input": " "})).await;
    assert_eq!((status, v["error"]["kind"].as_str()), (StatusCode::BAD_REQUEST, Some("input")));
    let (status, _) =
        post(&c, &s.api("/sessions"), &s.admin, json!({"input": "x", "nope": 1})).await;
    assert_eq!(status, 400);
    let (status, v) = call(c.post(s.api("/sessions")).body("{}"), &s.admin).await;
    assert_eq!(status, 415, "{v}");
    // Oversized bodies: 413 with the envelope, refused from their Content-Length before the
    // body is read (raw requests: the bodies are never sent), and nothing stored.
    for (path, kind, size) in [
        ("/api/v1/sessions", "application/json", 2 * 1024 * 1024),
        ("/api/v1/tools?name=huge", "application/wasm", 64 * 1024 * 1024 + 10),
    ] {
        let head = raw_request(
            &s,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
                 Content-Type: {kind}\r\nContent-Length: {size}\r\n\r\n",
                s.admin
            ),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 413"), "{path}: {head}");
        assert!(head.contains("too_large"), "{path}: {head}");
    }

    // The admin grants inside the roots; the session's files are listed inside its grant only.
    let (status, v) = post(
        &c,
        &s.api("/sessions"),
        &s.admin,
        json!({"input": "look", "grants": grant, "id": "adm"}),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    assert_eq!(v["session_id"], "adm");
    wait_for(&c, &s, "adm", "idle", |m| m["state"] == "idle").await;
    let (status, v) = get(&c, &s.api("/sessions/adm/files?grant=/p"), &s.admin).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["entries"], json!([{"name": "notes.txt", "kind": "file", "size": 5}]));
    let (status, _) = get(&c, &s.api("/sessions/adm/files?grant=/p&path=.."), &s.admin).await;
    assert_eq!(status, 400);
    let (_, v) = get(&c, &s.api("/sessions/adm/timeline"), &s.admin).await;
    assert_eq!(v["timeline"]["messages"][1]["body"]["content"], "done");

    // A user sees only their own sessions; another's is "not found".
    let (status, v) = post(&c, &s.api("/sessions"), &alice, json!({"input": "mine"})).await;
    assert_eq!(status, 202, "{v}");
    let mine = v["session_id"].as_str().unwrap().to_string();
    let (_, v) = get(&c, &s.api("/sessions"), &alice).await;
    let ids: Vec<&str> =
        v["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [mine.as_str()]);
    let (status, _) = get(&c, &s.api("/sessions/adm"), &alice).await;
    assert_eq!(status, 404);
    let (status, _) = post(&c, &s.api("/sessions/adm/input"), &alice, json!({"text": "x"})).await;
    assert_eq!(status, 404);
    let (_, v) = get(&c, &s.api(&format!("/sessions/{mine}")), &alice).await;
    assert_eq!(v["session"]["user"], "token:alice", "a user's sessions work for that token");
    assert_eq!(v["session"]["owner"]["principal"], "token:alice");
    // The admin sees both.
    let (_, v) = get(&c, &s.api("/sessions"), &s.admin).await;
    assert_eq!(v["sessions"].as_array().unwrap().len(), 2);

    // Uploads: an admin installs a component; it is pinned by its digest.
    upload_effects(&c, &s).await;
    let (status, v) = get(&c, &s.api("/tools/effects"), &alice).await;
    assert_eq!(status, 200);
    let digest = keel::digest::sha256_hex(&effects_wasm());
    assert_eq!(v["component"]["digest"], digest.as_str());
    let (status, v) =
        call(c.post(s.api("/tools?name=junk")).body(b"\0asm\x01\0\0\0".to_vec()), &s.admin).await;
    assert_eq!((status, v["error"]["kind"].as_str()), (StatusCode::BAD_REQUEST, Some("load")));

    // The OpenAPI document describes the routes and the bearer scheme.
    let doc: Value = serde_json::from_str(
        &c.get(s.api("/openapi.json")).send().await.unwrap().text().await.unwrap(),
    )
    .unwrap();
    for path in ["/sessions", "/sessions/{id}/events", "/approvals/{id}/approve", "/tools"] {
        assert!(doc["paths"].get(path).is_some(), "{path} is not in the OpenAPI document");
    }
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");

    // A revoked token stops at once.
    let out = super::keel(home.path(), &["token", "revoke", "alice"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let (status, _) = get(&c, &s.api("/sessions"), &alice).await;
    assert_eq!(status, 401);
    let out = super::keel(home.path(), &["token", "list", "--json"]);
    let names: Vec<String> = super::json_of(&out)["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, [super::serve_token_name()]);
    // (On PostgreSQL the home holds no database file.)
    let db = std::fs::read(home.path().join("keel.db")).unwrap_or_default();
    assert!(db.is_empty() == super::on_postgres());
    assert!(
        !db.windows(s.admin.len()).any(|w| w == s.admin.as_bytes()),
        "the token is not stored in plain text"
    );
}

/// Sends `request` (head only) over a new connection; returns what the server answered.
async fn raw_request(s: &Server, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = s.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
        .await
        .expect("the server waited for the body instead of refusing it")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Reads server-sent events from `res` until `until` holds for one; returns them all.
async fn read_events(
    res: &mut reqwest::Response,
    until: impl Fn(&Value) -> bool,
) -> Vec<(i64, Value)> {
    let mut buf = String::new();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut id = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.parse().ok();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if let (Some(id), Ok(v)) = (id, serde_json::from_str::<Value>(&data)) {
                let stop = until(&v);
                out.push((id, v));
                if stop {
                    return out;
                }
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, res.chunk()).await {
            Ok(Ok(Some(bytes))) => buf.push_str(&String::from_utf8_lossy(&bytes)),
            other => panic!("the event stream ended early: {other:?}; read {out:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_over_http_resume_the_turn_and_events_resume_after_a_drop() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "effect_send", r#"{"label":"hello"}"#)]),
        Reply::text("sent"),
        Reply::calls(&[("c2", "effect_send", r#"{"label":"again"}"#)]),
        Reply::text("sent again"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let work = roots.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let bob = token(home.path(), "bob", "user");
    let carol = token(home.path(), "carol", "admin");
    let preset = format!("{}=/work:rw", work.display());
    let out = super::keel(home.path(), &["grant", "preset", "add", "shared", &preset, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let s = Server::start(home.path(), &model.url(), &[roots.path()]);
    let c = client();
    upload_effects(&c, &s).await;

    // Bob creates a session with the preset; its call needs an approval.
    let (status, v) = post(
        &c,
        &s.api("/sessions"),
        &bob,
        json!({"input": "send hello", "preset": "shared", "tools": ["effect_send"], "id": "flow"}),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    // Follow the events; drop the connection after the first few.
    let mut res = c
        .get(s.api("/sessions/flow/events"))
        .bearer_auth(&bob)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let first = read_events(&mut res, |e| e["kind"] == "turn_started").await;
    drop(res);
    let last = first.last().unwrap().0;
    assert_eq!(first.iter().map(|e| e.0).collect::<Vec<_>>(), (1..=last).collect::<Vec<_>>());
    wait_for(&c, &s, "flow", "waiting", |m| m["state"] == "waiting_approval").await;
    assert!(keel_tests::log_lines(&work, "sent.log").is_empty(), "nothing ran yet");

    // The queue shows exactly what would run; bob may not decide (the preset does not say so).
    let (_, v) = get(&c, &s.api("/approvals?session=flow"), &bob).await;
    let unit = v["approvals"][0].clone();
    assert_eq!(unit["tool"], "effect_send");
    assert_eq!(unit["input"], r#"{"label":"hello"}"#);
    assert_eq!(unit["may_decide"], false);
    assert_eq!(unit["grants"][0]["guest"], "/work");
    // A user sees names, not host details: the grant's guest path, not where it is.
    let host = work.canonicalize().unwrap().display().to_string();
    assert!(!v.to_string().contains(&host), "{v}");
    let (_, mine) = get(&c, &s.api("/sessions/flow"), &bob).await;
    assert_eq!(mine["session"]["grants"][0]["guest"], "/work");
    assert!(!mine.to_string().contains(&host), "{mine}");
    let (_, t) = get(&c, &s.api("/sessions/flow/timeline"), &bob).await;
    assert!(!t.to_string().contains(&host), "{t}");
    let (_, admin_view) = get(&c, &s.api("/approvals?session=flow"), &s.admin).await;
    assert!(admin_view.to_string().contains(&host), "{admin_view}");
    let id = unit["id"].as_str().unwrap().to_string();
    let (status, v) = post(&c, &s.api(&format!("/approvals/{id}/approve")), &bob, json!({})).await;
    assert_eq!(status, 403, "{v}");

    // Resume the stream where it stopped: the next event is the one after the last seen.
    let mut res = c
        .get(s.api("/sessions/flow/events"))
        .bearer_auth(&s.admin)
        .header("accept", "text/event-stream")
        .header("last-event-id", last.to_string())
        .send()
        .await
        .unwrap();
    let waiting = read_events(&mut res, |e| e["kind"] == "approval_asked").await;
    assert_eq!(waiting[0].0, last + 1, "resumed right after {last}: {waiting:?}");

    // Two admins decide at once: exactly one wins, the other gets 409.
    let approve = s.api(&format!("/approvals/{id}/approve"));
    let reject = s.api(&format!("/approvals/{id}/reject"));
    let (a, b) = tokio::join!(
        post(&c, &approve, &s.admin, json!({"reason": "looks right"})),
        post(&c, &reject, &carol, json!({"reason": "no"})),
    );
    let mut statuses = [a.0.as_u16(), b.0.as_u16()];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409], "{a:?} {b:?}");
    let loser = if a.0 == 409 { &a.1 } else { &b.1 };
    assert_eq!(loser["error"]["kind"], "not_pending");
    let approved = a.0 == 200;
    // The turn resumes in the server; the stream shows it finish.
    let rest =
        read_events(&mut res, |e| e["kind"] == "turn_finished" || e["kind"] == "answer").await;
    drop(res);
    let decided = rest.iter().find(|e| e.1["kind"] == "approval_decided").unwrap();
    let by = if approved {
        format!("api token {}", super::serve_token_name())
    } else {
        "api token carol".to_string()
    };
    assert_eq!(decided.1["by"], by, "{decided:?}");
    let meta = wait_for(&c, &s, "flow", "idle", |m| m["state"] == "idle").await;
    assert_eq!(meta["owner"]["preset"], "shared");
    let (_, v) = get(&c, &s.api("/approvals?session=flow&all=true"), &bob).await;
    assert_eq!(v["approvals"][0]["decided_by"], by);
    assert_eq!(
        keel_tests::log_lines(&work, "sent.log"),
        if approved { vec!["hello".to_string()] } else { vec![] }
    );

    // The JSON form of the events: everything after N, in order.
    let (_, v) = get(&c, &s.api("/sessions/flow/events?after=2&limit=3"), &bob).await;
    let seqs: Vec<i64> =
        v["events"].as_array().unwrap().iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, [3, 4, 5]);
    // Evidence of a step is the exact request the model received.
    let (status, body) = {
        let res = c.get(s.api("/sessions/flow/evidence/1")).bearer_auth(&bob).send().await.unwrap();
        (res.status(), res.bytes().await.unwrap())
    };
    assert_eq!(status, 200);
    assert_eq!(body.as_ref(), model.requests()[0].as_slice());

    // Input to the session runs another turn; interrupting a waiting one closes it.
    let (status, v) =
        post(&c, &s.api("/sessions/flow/input"), &bob, json!({"text": "again"})).await;
    assert_eq!(status, 202, "{v}");
    wait_for(&c, &s, "flow", "waiting", |m| m["state"] == "waiting_approval").await;
    let (status, v) = call(c.post(s.api("/sessions/flow/interrupt")), &bob).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state_before"], "waiting_approval");
    let m = wait_for(&c, &s, "flow", "closed", |m| m["state"] != "waiting_approval").await;
    assert_ne!(m["state"], "running");
    let (_, v) = get(&c, &s.api("/approvals?session=flow"), &bob).await;
    assert_eq!(v["approvals"], json!([]), "the interrupted turn's approval is no longer pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_forms_need_the_origin_and_the_csrf_token() {
    let model = MockModel::start(vec![Reply::text("ok")]).await;
    let home = tempfile::tempdir().unwrap();
    let s = Server::start(home.path(), &model.url(), &[]);
    let c = client();
    let origin = s.base.clone();
    // Login from another origin is refused; from the console's own, it sets the cookie.
    let res = c
        .post(format!("{}/login", s.base))
        .header("origin", "http://evil.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", s.admin.as_str())]))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    assert!(res.headers().get("set-cookie").is_none());
    let res = c
        .post(format!("{}/login", s.base))
        .header("origin", &origin)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("token", s.admin.as_str())]))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    let set = res.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"), "{set}");
    let cookie = set.split(';').next().unwrap().to_string();
    // The page carries the CSRF token in its forms; the headers carry a strict policy.
    let res = c.get(format!("{}/", s.base)).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let csp = res.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"), "{csp}");
    let html = res.text().await.unwrap();
    let csrf = html
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .to_string();
    let new = |origin: &str, csrf: &str| {
        c.post(format!("{}/sessions/new", s.base))
            .header("cookie", &cookie)
            .header("origin", origin)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form(&[("csrf", csrf), ("input", "hello"), ("preset", "")]))
    };
    // A forged form: wrong token, or from another origin. Nothing is created.
    let res = new(&origin, "keel_forged").send().await.unwrap();
    assert_eq!(res.status(), 403);
    assert!(res.text().await.unwrap().contains("CSRF"));
    let res = new("http://evil.example", &csrf).send().await.unwrap();
    assert_eq!(res.status(), 403);
    // The cookie does not open the API's state-changing routes (those need a bearer token).
    let res = c
        .post(s.api("/sessions"))
        .header("cookie", &cookie)
        .header("origin", &origin)
        .header("content-type", "application/json")
        .body(r#"{"input":"x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    let (_, v) = get(&c, &s.api("/sessions"), &s.admin).await;
    assert_eq!(v["sessions"], json!([]));
    // The real form works, and so does reading the API with the cookie.
    let res = new(&origin, &csrf).send().await.unwrap();
    assert_eq!(res.status(), 303);
    let to = res.headers()["location"].to_str().unwrap().to_string();
    assert!(to.starts_with("/sessions/s-"), "{to}");
    let res = c.get(s.api("/sessions")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(res.status(), 200);
    // The session's page says what it runs under: model, policy, budget.
    let res = c.get(format!("{}{to}", s.base)).header("cookie", &cookie).send().await.unwrap();
    let page = res.text().await.unwrap();
    // (minijinja escapes `/` as `&#x2f;` in text; the browser shows the URL.)
    let port = model.url().split(':').nth(2).unwrap().split('/').next().unwrap().to_string();
    assert!(page.contains("Model: m at http:") && page.contains(&port), "{page}");
    assert!(page.contains("Policy: ask destructive, external"), "{page}");
    assert!(page.contains("Budget per call: fuel "), "{page}");
    // An event stream the login opened.
    let sid = to.trim_start_matches("/sessions/");
    let mut stream = c
        .get(s.api(&format!("/sessions/{sid}/events")))
        .header("cookie", &cookie)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    // Logging out ends the login, and the stream it opened.
    let res = c
        .post(format!("{}/logout", s.base))
        .header("cookie", &cookie)
        .header("origin", &origin)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form(&[("csrf", csrf.as_str())]))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 303);
    let mut seen = String::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.chunk()).await {
            Ok(Ok(Some(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(_) => break,
            Err(_) => panic!("the stream outlived its login: {seen}"),
        }
    }
    assert!(seen.contains("unauthorized"), "{seen}");
    let res = c.get(format!("{}/", s.base)).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(res.status(), 303, "back to the login page");
    assert_eq!(res.headers()["location"], "/login");
}

/// `pairs` as an `application/x-www-form-urlencoded` body.
fn form(pairs: &[(&str, &str)]) -> String {
    let enc = |t: &str| {
        t.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    pairs.iter().map(|(k, v)| format!("{}={}", enc(k), enc(v))).collect::<Vec<_>>().join("&")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_main_session_over_the_api_runs_its_workgroup_in_the_server() {
    let script = keel_tests::mock_model::workgroup_responder(Duration::ZERO);
    let model = MockModel::start_fn(script.responder).await;
    let home = tempfile::tempdir().unwrap();
    let alice = token(home.path(), "alice", "user");
    let s = Server::start(home.path(), &model.url(), &[]);
    let c = client();
    let task =
        keel_tests::mock_model::spawn_task("MAIN", &[("a", "CHILD A", &[]), ("b", "CHILD B", &[])]);
    // A user may not raise the limits; bad limits are refused; nothing is created.
    let (status, v) =
        post(&c, &s.api("/sessions"), &alice, json!({"input": task, "main": {"max_children": 50}}))
            .await;
    assert_eq!(status, 403, "{v}");
    let (status, v) =
        post(&c, &s.api("/sessions"), &alice, json!({"input": task, "main": {"max_depth": 0}}))
            .await;
    assert_eq!(status, 400, "{v}");
    let (_, v) = get(&c, &s.api("/sessions"), &alice).await;
    assert_eq!(v["sessions"], json!([]), "{v}");

    let (status, v) =
        post(&c, &s.api("/sessions"), &alice, json!({"input": task, "main": {"max_children": 2}}))
            .await;
    assert_eq!(status, 202, "{v}");
    let id = v["session_id"].as_str().unwrap().to_string();
    let main = wait_for(&c, &s, &id, "the main session's answer", |m| {
        m["state"] == "idle" && m["turns"].as_i64().unwrap_or(0) >= 2
    })
    .await;
    assert_eq!(main["active_turn"], Value::Null);
    // The children's results reach the main session in one turn or in two (in whichever order
    // they finish): its coordinator answers once it has both.
    let deadline = Instant::now() + Duration::from_secs(60);
    let t = loop {
        let (_, t) = get(&c, &s.api(&format!("/sessions/{id}/timeline")), &alice).await;
        if t.to_string().contains("coordinator done: ") {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "the main session never answered with both results: {t}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, v) = get(&c, &s.api(&format!("/sessions/{id}/workgroup")), &alice).await;
    assert_eq!(status, 200, "{v}");
    let w = &v["workgroup"];
    assert_eq!(w["limits"]["max_live_children"], json!(2));
    let members = w["members"].as_array().unwrap();
    assert_eq!(members.len(), 3, "{w}");
    for m in &members[1..] {
        assert_eq!(m["terminal"], json!("result"), "{m}");
    }
    // The children are the user's too: visible to her, their workgroup reachable from them.
    let child = members[1]["session_id"].as_str().unwrap();
    let (status, _) = get(&c, &s.api(&format!("/sessions/{child}/workgroup")), &alice).await;
    assert_eq!(status, 200);
    assert_eq!(v["events"].as_array().unwrap().len(), 4);
    assert!(t.to_string().contains("coordinator done: "), "{t}");
    // Another user sees none of it; a standalone session has no workgroup.
    let bob = token(home.path(), "bob", "user");
    let (status, _) = get(&c, &s.api(&format!("/sessions/{id}/workgroup")), &bob).await;
    assert_eq!(status, 404);
    let (status, v) = post(&c, &s.api("/sessions"), &alice, json!({"input": "CHILD SOLO"})).await;
    assert_eq!(status, 202, "{v}");
    let solo = v["session_id"].as_str().unwrap();
    let (status, v) = get(&c, &s.api(&format!("/sessions/{solo}/workgroup")), &alice).await;
    assert_eq!(status, 400, "{v}");
}

/// The text a model is writing reaches the event stream as it arrives: transient `text_delta`
/// events (no id) before the durable answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_carries_the_text_while_it_is_written() {
    let words = ["The first ", "words come ", "slowly."];
    let model = MockModel::start(vec![Reply::drip_text(&words, Duration::from_millis(700))]).await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let s = Server::start(home.path(), &model.url(), &[roots.path()]);
    let c = client();
    let (status, v) =
        post(&c, &s.api("/sessions"), &s.admin, json!({"input": "Say something", "id": "talk"}))
            .await;
    assert_eq!(status, 202, "{v}");
    let mut res = c
        .get(s.api("/sessions/talk/events"))
        .bearer_auth(&s.admin)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    let mut buf = String::new();
    let mut text = String::new();
    let mut first_seen_before_answer = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    'read: loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let data: String =
                block.lines().filter_map(|l| l.strip_prefix("data: ")).collect::<String>();
            let Ok(v) = serde_json::from_str::<Value>(&data) else { continue };
            if block.lines().any(|l| l == "event: text_delta") {
                assert!(!block.contains("\nid: ") && !block.starts_with("id: "), "{block}");
                text.push_str(v["text"].as_str().unwrap());
                if first_seen_before_answer.is_none() {
                    first_seen_before_answer = Some(!text.contains("slowly."));
                }
            } else if v["kind"] == "answer" {
                assert_eq!(v["text"], "The first words come slowly.");
                break 'read;
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, res.chunk()).await {
            Ok(Ok(Some(bytes))) => buf.push_str(&String::from_utf8_lossy(&bytes)),
            other => panic!("the event stream ended early: {other:?}; text {text:?}"),
        }
    }
    assert_eq!(first_seen_before_answer, Some(true), "text arrived before the reply ended");
    assert!(text.starts_with("The first "), "{text}");
    // Transient: nothing of it is in the durable log but the answer and its message.
    let (_, page) = get(&c, &s.api("/sessions/talk/events"), &s.admin).await;
    assert!(!page.to_string().contains("text_delta"), "{page}");
}

/// SIGTERM ends `keel serve` at once, open event streams included: each gets a last event
/// saying the server stops, the process exits well inside the drain's 5 s, and the port is
/// free for the next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_closes_open_event_streams_at_once() {
    let model = MockModel::start(vec![Reply::text("hello")]).await;
    let home = tempfile::tempdir().unwrap();
    let mut s = Server::start(home.path(), &model.url(), &[]);
    let c = client();
    let (status, v) = post(&c, &s.api("/sessions"), &s.admin, json!({"input": "hi"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["session_id"].as_str().unwrap().to_string();
    let mut streams = Vec::new();
    for _ in 0..2 {
        let stream = c
            .get(s.api(&format!("/sessions/{id}/events")))
            .bearer_auth(&s.admin)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(stream.status(), 200);
        streams.push(stream);
    }
    let port = s.base.rsplit(':').next().unwrap().to_string();
    let started = Instant::now();
    let status = tokio::task::block_in_place(|| s.terminate());
    let took = started.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(3), "stopping took {took:?}");
    for mut stream in streams {
        let mut seen = String::new();
        while let Ok(Ok(Some(chunk))) =
            tokio::time::timeout(Duration::from_secs(5), stream.chunk()).await
        {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        assert!(seen.contains("the server is stopping"), "{seen}");
    }
    // The port is free again.
    std::net::TcpListener::bind(format!("127.0.0.1:{port}")).unwrap();
    println!("keel serve stopped in {took:?} with 2 event streams open");
}

/// A session's policy and model change over the API: an admin allows a tool under a prefix
/// and moves the session to another model or window; a user token that may not decide the
/// session's approvals changes nothing; a rule keel does not know is an input error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_and_model_change_over_the_api() {
    let model = MockModel::start(vec![Reply::text("hello")]).await;
    let home = tempfile::tempdir().unwrap();
    let s = Server::start(home.path(), &model.url(), &[]);
    let c = client();
    let (status, v) = post(&c, &s.api("/sessions"), &s.admin, json!({"input": "hi"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["session_id"].as_str().unwrap().to_string();
    wait_for(&c, &s, &id, "the turn to end", |v| v["session"]["state"] != "running").await;
    let policy = s.api(&format!("/sessions/{id}/policy"));
    let allow = json!({"rule": "allow", "tool": "fs_write_file", "under": "/w"});
    let (status, v) = post(&c, &policy, &s.admin, allow.clone()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(v["policy"].as_str().unwrap().contains("allow fs_write_file under /w"), "{v}");
    let (status, v) = post(&c, &policy, &s.admin, json!({"rule": "maybe", "tool": "x"})).await;
    assert_eq!((status, v["error"]["kind"].as_str()), (StatusCode::BAD_REQUEST, Some("input")));
    let bob = token(home.path(), "bob", "user");
    let (status, _) =
        post(&c, &policy, &bob, json!({"rule": "ask", "tool": "fs_write_file"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "not his session");
    let to = s.api(&format!("/sessions/{id}/model"));
    let (status, v) = post(&c, &to, &s.admin, json!({"context_window": 4096})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["to"]["context_window"], 4096, "{v}");
    let (_, v) = get(&c, &s.api(&format!("/sessions/{id}/events?limit=1000")), &s.admin).await;
    let kinds: Vec<&str> =
        v["events"].as_array().unwrap().iter().filter_map(|e| e["kind"].as_str()).collect();
    assert!(kinds.contains(&"policy_changed") && kinds.contains(&"model_changed"), "{kinds:?}");
}

/// DELETE with `token`; returns the status and the JSON body.
async fn delete(c: &reqwest::Client, url: &str, token: &str) -> (StatusCode, Value) {
    call(c.delete(url), token).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_found_titled_deleted_and_pruned_and_tokens_managed_over_the_api() {
    let model =
        MockModel::start(vec![Reply::text("the invoices are summed"), Reply::text("the ferry")])
            .await;
    let home = tempfile::tempdir().unwrap();
    let s = Server::start(home.path(), &model.url(), &[]);
    let c = client();
    let mut ids = Vec::new();
    for input in ["sum the invoices of march", "find a ferry to the island"] {
        let (status, v) = post(&c, &s.api("/sessions"), &s.admin, json!({"input": input})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{v}");
        let id = v["session_id"].as_str().unwrap().to_string();
        wait_for(&c, &s, &id, "idle", |v| v["state"] == "idle").await;
        ids.push(id);
    }
    let listed = |v: &Value| -> Vec<String> {
        v["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().into()).collect()
    };
    // Search goes through goals and messages; state and since filter; limit cuts.
    let (status, v) = get(&c, &s.api("/sessions?search=ferry"), &s.admin).await;
    assert_eq!((status, listed(&v)), (StatusCode::OK, vec![ids[1].clone()]), "{v}");
    let (_, v) =
        get(&c, &s.api("/sessions?search=INVOICES&state=idle,failed&since=1h"), &s.admin).await;
    assert_eq!(listed(&v), vec![ids[0].clone()], "{v}");
    let (_, v) = get(&c, &s.api("/sessions?state=failed"), &s.admin).await;
    assert_eq!(listed(&v), Vec::<String>::new(), "{v}");
    let (_, v) = get(&c, &s.api("/sessions?limit=1"), &s.admin).await;
    assert_eq!(listed(&v), vec![ids[1].clone()], "the most recently active first: {v}");
    let (status, v) = get(&c, &s.api("/sessions?state=sleepy"), &s.admin).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("`sleepy` is not a session state"));
    let (status, v) = get(&c, &s.api("/sessions?since=7"), &s.admin).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("since: "), "{v}");
    // A title shows in the list and is searched.
    let title = s.api(&format!("/sessions/{}/title", ids[0]));
    let (status, v) = post(&c, &title, &s.admin, json!({"title": "Quarterly books"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_, v) = get(&c, &s.api("/sessions?search=quarterly"), &s.admin).await;
    assert_eq!(v["sessions"][0]["title"], "Quarterly books", "{v}");
    let (status, _) = post(&c, &title, &s.admin, json!({"title": "two\nlines"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Tokens: made (the secret once), listed without secrets, revoked.
    let (status, v) = post(&c, &s.api("/tokens"), &s.admin, json!({"name": "carol"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["role"], "user");
    let carol = v["token"].as_str().unwrap().to_string();
    let (status, v) =
        post(&c, &s.api("/tokens"), &s.admin, json!({"name": "x", "role": "root"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, _) = get(&c, &s.api("/tokens"), &carol).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a user does not list tokens");
    let (_, v) = get(&c, &s.api("/tokens"), &s.admin).await;
    assert!(v["tokens"].as_array().unwrap().iter().any(|t| t["name"] == "carol"), "{v}");
    assert!(!v.to_string().contains(&carol), "no secret is listed");
    // A user sees only their sessions, and deletes none.
    let (_, v) = get(&c, &s.api("/sessions"), &carol).await;
    assert_eq!(listed(&v), Vec::<String>::new());
    let (status, _) = delete(&c, &s.api(&format!("/sessions/{}", ids[0])), &carol).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = delete(&c, &s.api("/sessions?older_than=0s"), &carol).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, v) = delete(&c, &s.api("/tokens/carol"), &s.admin).await;
    assert_eq!((status, v["revoked"]["name"].as_str()), (StatusCode::OK, Some("carol")), "{v}");
    let (status, _) = get(&c, &s.api("/sessions"), &carol).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a revoked token is refused at once");
    let (status, _) = delete(&c, &s.api("/tokens/carol"), &s.admin).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Delete one by id: gone from the list, its page, its events.
    let (status, v) = delete(&c, &s.api(&format!("/sessions/{}", ids[0])), &s.admin).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, _) = get(&c, &s.api(&format!("/sessions/{}", ids[0])), &s.admin).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get(&c, &s.api(&format!("/sessions/{}/events", ids[0])), &s.admin).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Prune: a dry run deletes nothing; then the idle session older than 0s goes.
    let (status, v) = delete(&c, &s.api("/sessions?older_than=0s&dry_run=true"), &s.admin).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["pruned"]["dry_run"], true);
    assert_eq!(v["pruned"]["deleted"][0]["id"], ids[1].as_str(), "{v}");
    let (_, v) = get(&c, &s.api("/sessions"), &s.admin).await;
    assert_eq!(listed(&v), vec![ids[1].clone()], "the dry run kept it");
    let (status, v) = delete(&c, &s.api("/sessions?older_than=1d"), &s.admin).await;
    assert_eq!(
        (status, v["pruned"]["deleted"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(0))
    );
    let (status, v) = delete(&c, &s.api("/sessions?older_than=0s&state=idle"), &s.admin).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["pruned"]["deleted"][0]["id"], ids[1].as_str(), "{v}");
    let (_, v) = get(&c, &s.api("/sessions"), &s.admin).await;
    assert_eq!(v["sessions"], json!([]));
    let (status, v) = delete(&c, &s.api("/sessions"), &s.admin).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "older_than is required: {v}");
    // The OpenAPI document names every new route.
    let (_, doc) = get(&c, &s.api("/openapi.json"), &s.admin).await;
    for path in ["/sessions/{id}/title", "/tokens", "/tokens/{name}"] {
        assert!(doc["paths"][path].is_object(), "{path} is not documented");
    }
    assert!(doc["paths"]["/sessions"]["delete"].is_object());
    assert!(doc["paths"]["/sessions/{id}"]["delete"].is_object());
}
