//! The front-ends as attackers and careless operators use them, over real HTTP (RELIABILITY
//! K1–K4, J6): slow and idle connections without a token, uploads by those who may not
//! upload, a revoked token's open stream, malformed requests, weak operator tokens, and the
//! bounds of `keel mcp serve --http`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keel_tests::mock_model::{MockModel, Reply};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::serve::{Server, client, get, post, token};

/// The host:port of a server's base URL.
fn addr(base: &str) -> String {
    base.trim_start_matches("http://").to_string()
}

/// Reads what the server sends on `s` until it closes the connection or `limit` passes:
/// `(closed, text)`.
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (bool, String) {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (true, String::from_utf8_lossy(&all).into()),
            Ok(Ok(n)) => all.extend_from_slice(&buf[..n]),
            Err(_) => return (false, String::from_utf8_lossy(&all).into()),
        }
    }
}

/// The JSON body of a raw HTTP/1.1 response.
fn body_of(response: &str) -> Value {
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body.trim()).unwrap_or_else(|_| json!({ "raw": response }))
}

/// K1: connections without a token that never finish their headers, and idle ones, cost a
/// bounded amount: past the cap the longest-idle one gives way, the header and idle timeouts
/// close them, and an authenticated user is served throughout. When every open connection
/// is serving a request, a newcomer gets a 503 in the envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k1_slow_and_idle_connections_are_bounded_and_users_are_still_served() {
    let model = MockModel::start(vec![Reply::text("done")]).await;
    let home = tempfile::tempdir().unwrap();
    let s = Server::start_with(
        home.path(),
        &model.url(),
        &[],
        "header_timeout_secs = 2\nidle_timeout_secs = 3\nmax_connections = 48",
    );
    let c = client();
    let at = addr(&s.base);
    // 150 connections: half send half a request line, half send nothing at all.
    let mut slow = Vec::new();
    for i in 0..150 {
        let mut conn = TcpStream::connect(&at).await.unwrap();
        if i % 2 == 0 {
            conn.write_all(b"GET /api/v1/whoami HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        }
        slow.push(conn);
    }
    // An authenticated user is served at once beside them (a fresh connection each time).
    for _ in 0..5 {
        let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
        let (status, v) = get(&fresh, &s.api("/whoami"), &s.admin).await;
        assert_eq!(status, 200, "{v}\n{}", s.stderr.lock().unwrap());
        assert_eq!(v["name"], super::serve_token_name().as_str());
    }
    // Every slow connection is closed: displaced for the cap, or by the header or idle
    // timeout; none is answered with a page.
    let mut closed = 0;
    for conn in &mut slow {
        let (was_closed, text) = read_until_closed(conn, Duration::from_secs(8)).await;
        assert!(!text.contains("200 OK"), "{text}");
        closed += usize::from(was_closed);
    }
    assert_eq!(closed, slow.len(), "every slow connection ends");
    drop(slow);

    // Cap full of requests in progress (event streams): the next connection gets a 503.
    let (status, v) =
        post(&c, &s.api("/sessions"), &s.admin, json!({"input": "hi", "id": "k1"})).await;
    assert_eq!(status, 202, "{v}");
    let mut streams = Vec::new();
    for _ in 0..48 {
        let mut conn = TcpStream::connect(&at).await.unwrap();
        let req = format!(
            "GET /api/v1/sessions/k1/events HTTP/1.1\r\nHost: {at}\r\nAuthorization: Bearer {}\r\n\
             Accept: text/event-stream\r\n\r\n",
            s.admin
        );
        conn.write_all(req.as_bytes()).await.unwrap();
        let mut first = [0u8; 64];
        let n = conn.read(&mut first).await.unwrap();
        assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
        streams.push(conn);
    }
    let mut extra = TcpStream::connect(&at).await.unwrap();
    let (_, text) = read_until_closed(&mut extra, Duration::from_secs(5)).await;
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert_eq!(body_of(&text)["error"]["kind"], "busy", "{text}");
    drop(streams);
    // Once they close, users are served again.
    let start = Instant::now();
    loop {
        let fresh = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
        if let Ok(res) = fresh.get(s.api("/whoami")).bearer_auth(&s.admin).send().await
            && res.status() == 200
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "the server never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// K2: an upload by a user token, or by no token, is refused before its body is read (the
/// client sends headers only and gets its answer); an admin's upload past the size cap is
/// refused while it streams; a body that stops arriving gets a 408 in the envelope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2_uploads_are_authorized_before_their_body_and_bounded_while_streaming() {
    let model = MockModel::start(vec![]).await;
    let home = tempfile::tempdir().unwrap();
    let alice = token(home.path(), "alice", "user");
    let s = Server::start_with(home.path(), &model.url(), &[], "body_timeout_secs = 2");
    let at = addr(&s.base);
    let head = |token: Option<&str>, length: u64| {
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        format!(
            "POST /api/v1/tools?name=big HTTP/1.1\r\nHost: {at}\r\n{auth}\
             Content-Type: application/wasm\r\nContent-Length: {length}\r\n\r\n"
        )
    };
    // 60 MiB declared (under the 64 MiB cap), no byte of it sent.
    for (token, status, kind) in
        [(Some(alice.as_str()), "403", "forbidden"), (None, "401", "unauthorized")]
    {
        let mut conn = TcpStream::connect(&at).await.unwrap();
        conn.write_all(head(token, 60 << 20).as_bytes()).await.unwrap();
        let (_, text) = read_until_closed(&mut conn, Duration::from_secs(5)).await;
        assert!(text.starts_with(&format!("HTTP/1.1 {status}")), "{text}");
        assert_eq!(body_of(&text)["error"]["kind"], kind, "{text}");
    }
    // An admin's chunked upload (no length declared) is refused once it passes the cap,
    // while the client is still sending.
    let conn = TcpStream::connect(&at).await.unwrap();
    let (mut rd, mut wr) = conn.into_split();
    let chunked = format!(
        "POST /api/v1/tools?name=big HTTP/1.1\r\nHost: {at}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/wasm\r\nTransfer-Encoding: chunked\r\n\r\n",
        s.admin
    );
    let writer = tokio::spawn(async move {
        wr.write_all(chunked.as_bytes()).await?;
        let chunk = vec![0u8; 1 << 20];
        let mut sent = 0usize;
        for _ in 0..80 {
            wr.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await?;
            wr.write_all(&chunk).await?;
            wr.write_all(b"\r\n").await?;
            sent += chunk.len();
        }
        wr.write_all(b"0\r\n\r\n").await?;
        Ok::<usize, std::io::Error>(sent)
    });
    let mut text = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), rd.read_to_end(&mut text)).await;
    let text = String::from_utf8_lossy(&text).to_string();
    assert!(text.starts_with("HTTP/1.1 413"), "{}", &text[..text.len().min(300)]);
    assert_eq!(body_of(&text)["error"]["kind"], "too_large", "{text}");
    writer.abort();
    let c = client();
    // A body that stops arriving: 408 after body_timeout_secs.
    let mut conn = TcpStream::connect(&at).await.unwrap();
    conn.write_all(head(Some(&s.admin), 1000).as_bytes()).await.unwrap();
    conn.write_all(&[0u8; 10]).await.unwrap();
    let started = Instant::now();
    let (_, text) = read_until_closed(&mut conn, Duration::from_secs(10)).await;
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert_eq!(body_of(&text)["error"]["kind"], "body_timeout", "{text}");
    assert!(started.elapsed() >= Duration::from_millis(1500));
    // Nothing was installed.
    let (_, v) = get(&c, &s.api("/tools/big"), &s.admin).await;
    assert_eq!(v["error"]["kind"], "not_installed", "{v}");
}

/// K4: `keel token revoke` (another process) ends the token's open event stream at once, with
/// a `failure` event saying why, and ends its console logins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k4_a_revoked_token_loses_its_open_stream_and_its_logins_at_once() {
    let model = MockModel::start(vec![Reply::text("done")]).await;
    let home = tempfile::tempdir().unwrap();
    let bob = token(home.path(), "bob", "user");
    let s = Server::start(home.path(), &model.url(), &[]);
    // No overall timeout: the stream is read for as long as it stays open.
    keel::tls::init();
    let c = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let (status, v) = post(&c, &s.api("/sessions"), &bob, json!({"input": "hi", "id": "k4"})).await;
    assert_eq!(status, 202, "{v}");
    // A console login with bob's token.
    let login = c
        .post(format!("{}/login", s.base))
        .header("origin", &s.base)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={bob}"))
        .send()
        .await
        .unwrap();
    let cookie =
        login.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let page = c.get(format!("{}/", s.base)).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let mut stream = c
        .get(s.api("/sessions/k4/events"))
        .bearer_auth(&bob)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    // The stream is live: its first event arrives.
    let first = tokio::time::timeout(Duration::from_secs(30), stream.chunk()).await;
    assert!(first.unwrap().unwrap().is_some());
    let revoked = super::keel(home.path(), &["token", "revoke", "bob"]);
    assert!(revoked.status.success(), "{revoked:?}");
    let at = Instant::now();
    let mut rest = String::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.chunk()).await {
            Ok(Ok(Some(b))) => rest.push_str(&String::from_utf8_lossy(&b)),
            Ok(Ok(None)) | Ok(Err(_)) => break,
            Err(_) => panic!("the stream stayed open 10 s after the revocation: {rest}"),
        }
    }
    let ended = at.elapsed();
    assert!(rest.contains("event: failure") && rest.contains("unauthorized"), "{rest}");
    eprintln!("the stream ended {ended:?} after the revocation");
    // The login is gone: the console sends bob to the login page; the API refuses him.
    let page = c.get(format!("{}/", s.base)).header("cookie", &cookie).send().await.unwrap();
    assert_ne!(page.status(), 200);
    let (status, v) = get(&c, &s.api("/sessions/k4"), &bob).await;
    assert_eq!((status.as_u16(), v["error"]["kind"].as_str()), (401, Some("unauthorized")));
}

/// Every error of the API is the JSON envelope: a malformed query string, a path parameter
/// that does not parse, a method the route does not take, an unknown endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_error_is_the_json_envelope() {
    let model = MockModel::start(vec![Reply::text("done")]).await;
    let home = tempfile::tempdir().unwrap();
    let s = Server::start(home.path(), &model.url(), &[]);
    let c = client();
    let (status, v) =
        post(&c, &s.api("/sessions"), &s.admin, json!({"input": "hi", "id": "e"})).await;
    assert_eq!(status, 202, "{v}");
    let cases: &[(reqwest::Method, &str, u16, &str)] = &[
        (reqwest::Method::GET, "/sessions/e/events?after=abc", 400, "input"),
        (reqwest::Method::GET, "/sessions/e/events?limit=-", 400, "input"),
        (reqwest::Method::GET, "/sessions/e/evidence/not-a-step", 400, "input"),
        (reqwest::Method::GET, "/approvals?all=perhaps", 400, "input"),
        (reqwest::Method::PUT, "/sessions", 405, "method_not_allowed"),
        // A prune with no age: the missing query parameter is an input error, in the envelope.
        (reqwest::Method::DELETE, "/sessions", 400, "input"),
        (reqwest::Method::GET, "/no/such/thing", 404, "not_found"),
    ];
    for (method, path, status, kind) in cases {
        let res =
            c.request(method.clone(), s.api(path)).bearer_auth(&s.admin).send().await.unwrap();
        assert_eq!(res.status().as_u16(), *status, "{path}");
        assert!(
            res.headers()["content-type"].to_str().unwrap().starts_with("application/json"),
            "{path}"
        );
        let v: Value = res.json().await.unwrap();
        assert_eq!(v["ok"], false, "{path}: {v}");
        assert_eq!(v["error"]["kind"], *kind, "{path}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty(), "{path}: {v}");
    }
}

/// J6: the environment's admin and stored tokens are typed principals: a session created with
/// `KEEL_API_TOKEN` is owned by `env:KEEL_API_TOKEN`, a user token sees none of it, and a token
/// can take no reserved name. Operator tokens shorter than 16 characters, or with too few
/// different characters, stop `keel serve` and `keel mcp serve` with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j6_principals_are_typed_and_weak_operator_tokens_are_refused() {
    let model = MockModel::start(vec![Reply::text("done"), Reply::text("done")]).await;
    let home = tempfile::tempdir().unwrap();
    for reserved in ["KEEL_API_TOKEN", "keel-serve"] {
        let out = super::keel(home.path(), &["token", "add", reserved, "--json"]);
        assert_ne!(out.status.code(), Some(0), "{reserved}");
    }
    // Weak tokens from the environment.
    for weak in ["a", "0123456789abcde", "aaaaaaaaaaaaaaaaaaaaaaaa"] {
        let out = Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("--home")
            .arg(home.path())
            .args(["serve", "--listen", "127.0.0.1:0", "--model-url", &model.url(), "--model", "m"])
            .env("KEEL_API_TOKEN", weak)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{weak}: {err}");
        assert!(err.contains("KEEL_API_TOKEN") && err.contains("a random one"), "{err}");
        let out = Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("--home")
            .arg(home.path())
            .args(["mcp", "serve", "--http", "127.0.0.1:0"])
            .env("KEEL_MCP_TOKEN", weak)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{weak}: {err}");
        assert!(err.contains("KEEL_MCP_TOKEN"), "{err}");
    }
    // The environment's admin owns what it creates, as `env:KEEL_API_TOKEN`.
    let alice = token(home.path(), "alice", "user");
    let env_token = "keel-env-admin-token-0123456789";
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--model-url", &model.url(), "--model", "m"])
        .env("KEEL_API_TOKEN", env_token)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let base = base_of(&mut child);
    let guard = Kill(child);
    let c = client();
    let api = |p: &str| format!("{base}/api/v1{p}");
    let (status, v) =
        post(&c, &api("/sessions"), env_token, json!({"input": "hi", "id": "e1"})).await;
    assert_eq!(status, 202, "{v}");
    let (_, v) = get(&c, &api("/sessions/e1"), env_token).await;
    assert_eq!(v["session"]["owner"]["principal"], "env:KEEL_API_TOKEN", "{v}");
    let (_, v) = get(&c, &api("/whoami"), env_token).await;
    assert_eq!(v["name"], "KEEL_API_TOKEN");
    let (status, _) = get(&c, &api("/sessions/e1"), &alice).await;
    assert_eq!(status, 404);
    let (_, v) = get(&c, &api("/sessions"), &alice).await;
    assert_eq!(v["sessions"], json!([]), "{v}");
    let (status, v) = post(&c, &api("/sessions"), &alice, json!({"input": "hi", "id": "a1"})).await;
    assert_eq!(status, 202, "{v}");
    let (_, v) = get(&c, &api("/sessions/a1"), &alice).await;
    assert_eq!(v["session"]["owner"]["principal"], "token:alice", "{v}");
    assert_eq!(v["session"]["user"], "token:alice", "{v}");
    drop(guard);
}

/// The base URL `keel serve` printed on stderr.
fn base_of(child: &mut Child) -> String {
    use std::io::BufRead;
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufReader::new(stderr).lines();
    let base = loop {
        let line = lines.next().expect("keel serve stopped").unwrap();
        if let Some(rest) = line.split("serving the API at ").nth(1) {
            break rest.split("/api/v1").next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    base
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `keel mcp serve --http` on `home` with `[mcp]` settings; its base URL.
fn mcp_http(home: &Path, mcp: &str) -> (Kill, String) {
    mcp_http_with(home, mcp, &[])
}

/// [`mcp_http`] with more arguments to `keel mcp serve`.
fn mcp_http_with(home: &Path, mcp: &str, args: &[&str]) -> (Kill, String) {
    std::fs::write(home.join("keel.toml"), format!("[mcp]\n{mcp}\n")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home)
        .args(["mcp", "serve", "--http", "127.0.0.1:0"])
        .args(args)
        .env_remove("KEEL_MCP_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("keel mcp serve stopped").unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (Kill(child), url)
}

/// An `initialize` over streamable HTTP: the status and the session id it was given.
async fn initialize(
    c: &reqwest::Client,
    url: &str,
    origin: Option<&str>,
) -> (u16, Option<String>, String) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "abuse", "version": "1"}}});
    let mut req = c
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string());
    if let Some(o) = origin {
        req = req.header("origin", o);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let id = res.headers().get("mcp-session-id").map(|v| v.to_str().unwrap().to_string());
    (status, id, res.text().await.unwrap_or_default())
}

/// `keel mcp serve --http` without a token: sessions are capped (an `initialize` past the cap
/// gets a 503 JSON-RPC error), an idle one expires and makes room, a connection that never
/// calls a tool leaves no keel session, and a foreign `Origin` is refused with 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_http_sessions_are_capped_expire_and_check_their_origin() {
    let home = tempfile::tempdir().unwrap();
    let (_server, url) = mcp_http(home.path(), "max_sessions = 3\nsession_idle_secs = 2");
    let c = client();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (status, id, text) = initialize(&c, &url, None).await;
        assert_eq!(status, 200, "{text}");
        ids.push(id.expect("a session id"));
    }
    let (status, _, text) = initialize(&c, &url, None).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("max_sessions"), "{text}");
    // Foreign origins are refused; a loopback origin is not.
    let (status, _, text) = initialize(&c, &url, Some("http://evil.example")).await;
    assert_eq!(status, 403, "{text}");
    // Nothing called a tool: no keel session exists.
    let out = super::keel(home.path(), &["session", "list", "--json"]);
    assert_eq!(super::json_of(&out), json!([]), "{out:?}");
    // The idle sessions expire and make room.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (status, _, text) = initialize(&c, &url, Some("http://localhost:9999")).await;
    assert_eq!(status, 200, "{text}");
}

/// The address after `marker` in a server's stderr, once it is there.
async fn printed(stderr: &std::sync::Mutex<String>, marker: &str) -> String {
    let start = Instant::now();
    loop {
        if let Some(rest) = stderr.lock().unwrap().split(marker).nth(1) {
            return rest.split('/').next().unwrap().to_string();
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never printed {marker:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An admin request on a fresh connection: its status.
async fn admin_whoami(s: &Server) -> u16 {
    keel::tls::init();
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    match fresh.get(s.api("/whoami")).bearer_auth(&s.admin).send().await {
        Ok(res) => res.status().as_u16(),
        Err(e) => panic!("the admin's request failed: {e}"),
    }
}

/// K5: nothing is held before a token. Login forms whose bodies trickle, renewed as fast as
/// they give way, hold at most the share of requests without a credential and lose their
/// connection at the short body deadline; one user's event streams stop at the user's share
/// (429); the token-less metrics listener draws on the same budget, answers only a loopback
/// `Host` over loopback, and warns when it listens on every address. The admin is served
/// throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k5_nothing_is_held_before_a_token_and_no_user_holds_the_whole_cap() {
    let model = MockModel::start(vec![Reply::text("done")]).await;
    let home = tempfile::tempdir().unwrap();
    let alice = token(home.path(), "alice", "user");
    let s = Server::start_with(
        home.path(),
        &model.url(),
        &[],
        "header_timeout_secs = 2\nbody_timeout_secs = 60\nmax_connections = 64\n\
         metrics_listen = \"0.0.0.0:0\"",
    );
    let at = addr(&s.base);
    let metrics = printed(&s.stderr, "serving the metrics at http://").await;
    let metrics = format!("127.0.0.1:{}", metrics.rsplit(':').next().unwrap());
    // (the warning may be printed after the address: waited for, as the address is)
    printed(&s.stderr, "is not a loopback address: anyone who can reach it reads the metrics")
        .await;

    // One trickling login form: its body deadline is the header timeout (2 s), not 60 s.
    let started = Instant::now();
    let mut one = TcpStream::connect(&at).await.unwrap();
    let login = format!(
        "POST /login HTTP/1.1\r\nHost: {at}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: 1000\r\n\r\ntoken="
    );
    one.write_all(login.as_bytes()).await.unwrap();
    let (closed, text) = read_until_closed(&mut one, Duration::from_secs(10)).await;
    assert!(closed && !text.contains("200 OK"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(6), "held {:?}", started.elapsed());

    // An attacker renews trickling login forms (and idle metrics connections) as fast as they
    // give way, for 4 s; the admin is served on fresh connections meanwhile.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker = {
        let (stop, at, metrics, login) = (stop.clone(), at.clone(), metrics.clone(), login.clone());
        tokio::spawn(async move {
            let mut held = Vec::new();
            let mut opened = 0usize;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(mut c) = TcpStream::connect(&at).await {
                    let _ = c.write_all(login.as_bytes()).await;
                    held.push(c);
                    opened += 1;
                }
                if let Ok(c) = TcpStream::connect(&metrics).await {
                    held.push(c);
                }
                if held.len() > 400 {
                    held.drain(..100);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            opened
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut served = 0;
    let deadline = Instant::now() + Duration::from_secs(4);
    while Instant::now() < deadline {
        assert_eq!(admin_whoami(&s).await, 200, "{}", s.stderr.lock().unwrap());
        served += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened = attacker.await.unwrap();
    assert!(opened > 200 && served >= 20, "{opened} attacker connections, {served} served");

    // The metrics listener: a foreign Host over loopback is refused, a loopback one served.
    let c = client();
    let res = c
        .get(format!("http://{metrics}/metrics"))
        .header("host", "evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    let res = c.get(format!("http://{metrics}/metrics")).send().await.unwrap();
    assert_eq!(res.status(), 200);

    // One user's event streams: 16 (a quarter of 64) at once; the 17th is refused with 429,
    // and the admin is still served.
    let (status, v) =
        post(&c, &s.api("/sessions"), &alice, json!({"input": "hi", "id": "k5"})).await;
    assert_eq!(status, 202, "{v}");
    let mut streams = Vec::new();
    for i in 0..17 {
        let mut conn = TcpStream::connect(&at).await.unwrap();
        let req = format!(
            "GET /api/v1/sessions/k5/events HTTP/1.1\r\nHost: {at}\r\nAuthorization: Bearer \
             {alice}\r\nAccept: text/event-stream\r\n\r\n"
        );
        conn.write_all(req.as_bytes()).await.unwrap();
        let mut first = [0u8; 512];
        let n = conn.read(&mut first).await.unwrap();
        let head = String::from_utf8_lossy(&first[..n]).to_string();
        if i < 16 {
            assert!(head.starts_with("HTTP/1.1 200"), "stream {i}: {head}");
            streams.push(conn);
        } else {
            assert!(head.starts_with("HTTP/1.1 429"), "stream {i}: {head}");
            let (_, rest) = read_until_closed(&mut conn, Duration::from_millis(500)).await;
            let all = format!("{head}{rest}");
            assert!(all.contains("too_many_requests") && all.contains("max_connections_per_user"));
        }
    }
    for _ in 0..5 {
        assert_eq!(admin_whoami(&s).await, 200);
    }
    // A stream closed gives its place back.
    streams.pop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = get(&c, &s.api("/sessions/k5"), &alice).await;
    assert_eq!(status, 200);
}

/// A POST of JSON-RPC `body` to an MCP endpoint, in session `session` when given.
fn mcp_post(
    c: &reqwest::Client,
    url: &str,
    session: Option<&str>,
    body: Value,
) -> reqwest::RequestBuilder {
    let mut req = c
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string());
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    req
}

/// `keel mcp serve --http`: one client address keeps at most `max_sessions_per_client`
/// sessions (429 past it), and a session whose `tools/call` waits for its elicitation answer
/// longer than `session_idle_secs` is not expired under it — the answer arrives, the call
/// runs. A session idle with nothing in flight still expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_http_sessions_are_bounded_per_client_and_a_call_in_flight_keeps_its_session() {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let grant = format!("{}=/work:rw", work.path().display());
    let (_server, url) = mcp_http_with(
        home.path(),
        "max_sessions = 8\nmax_sessions_per_client = 2\nsession_idle_secs = 2",
        &["--grant", &grant, "--tools", "fs_write_file", "--ask", "fs_write_file"],
    );
    let c = client();
    let open = |elicit: bool| {
        let caps = if elicit { json!({"elicitation": {}}) } else { json!({}) };
        mcp_post(
            &c,
            &url,
            None,
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": caps,
                "clientInfo": {"name": "abuse", "version": "1"}}}),
        )
        .send()
    };
    let first = open(true).await.unwrap();
    assert_eq!(first.status(), 200);
    let sid = first.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let _ = first.text().await;
    let second = open(false).await.unwrap();
    assert_eq!(second.status(), 200);
    let idle = second.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let third = open(false).await.unwrap();
    assert_eq!(third.status(), 429);
    assert!(third.text().await.unwrap().contains("max_sessions_per_client"));
    mcp_post(
        &c,
        &url,
        Some(&sid),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .send()
    .await
    .unwrap();

    // A write the policy asks about: the server asks through elicitation on the call's stream.
    let call = mcp_post(
        &c,
        &url,
        Some(&sid),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "fs_write_file", "arguments": {"path": "/work/kept.txt", "content": "kept"}}}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(call.status(), 200);
    let mut stream = call;
    let mut seen = String::new();
    let ask_id = loop {
        let chunk = tokio::time::timeout(Duration::from_secs(20), stream.chunk())
            .await
            .expect("no elicitation came")
            .unwrap()
            .unwrap_or_else(|| panic!("the call's stream ended: {seen}"));
        seen.push_str(&String::from_utf8_lossy(&chunk));
        let ask = seen
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v["method"] == "elicitation/create");
        if let Some(ask) = ask {
            break ask["id"].clone();
        }
    };
    // The person takes three idle timeouts to answer; the session is still there.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let answer = mcp_post(
        &c,
        &url,
        Some(&sid),
        json!({"jsonrpc": "2.0", "id": ask_id, "result": {
            "action": "accept", "content": {"approve": true}}}),
    )
    .send()
    .await
    .unwrap();
    assert!(answer.status().is_success(), "{}", answer.text().await.unwrap());
    let result = loop {
        let chunk = tokio::time::timeout(Duration::from_secs(20), stream.chunk())
            .await
            .expect("no result came")
            .unwrap()
            .expect("the call's stream ended");
        seen.push_str(&String::from_utf8_lossy(&chunk));
        let done = seen
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v["id"] == json!(2));
        if let Some(done) = done {
            break done;
        }
    };
    assert_eq!(result["result"]["isError"], json!(false), "{result}");
    assert_eq!(std::fs::read_to_string(work.path().join("kept.txt")).unwrap(), "kept");
    // The other session, idle all along with nothing in flight, expired: its id is unknown.
    let gone =
        mcp_post(&c, &url, Some(&idle), json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}))
            .send()
            .await
            .unwrap();
    assert_eq!(gone.status(), 404, "{}", gone.text().await.unwrap());
}

/// An approval view is bounded: a pending write of 100,000 changed lines is shown as "diff
/// too large: N lines changed" (computed once, off the async workers), and a pending write
/// whose path is a FIFO is not opened for reading — `GET /approvals` and `keel approvals`
/// answer, saying it is not a regular file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_an_approval_view_is_bounded_and_never_opens_a_fifo() {
    let before: String = (0..100_000).map(|i| format!("a{i}\n")).collect();
    let after: String = (0..100_000).map(|i| format!("b{i}\n")).collect();
    let model = MockModel::start(vec![
        Reply::calls(&[(
            "c1",
            "fs_write_file",
            &json!({"path": "/work/big.txt", "content": after}).to_string(),
        )]),
        Reply::calls(&[(
            "c2",
            "fs_write_file",
            &json!({"path": "/work/pipe", "content": "x"}).to_string(),
        )]),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let project = roots.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("big.txt"), &before).unwrap();
    let made = Command::new("mkfifo").arg(project.join("pipe")).status().unwrap();
    assert!(made.success());
    let s = Server::start(home.path(), &model.url(), &[roots.path()]);
    let c = client();
    let grant = json!([{"host": project.display().to_string(), "guest": "/work", "access": "rw"}]);
    for id in ["big", "fifo"] {
        let (status, v) = post(
            &c,
            &s.api("/sessions"),
            &s.admin,
            json!({"input": "write", "grants": grant, "id": id,
                   "tools": ["fs_write_file"], "policy": {"ask": ["fs_write_file"]}}),
        )
        .await;
        assert_eq!(status, 202, "{v}");
        super::serve::wait_for(&c, &s, id, "waiting", |m| m["state"] == "waiting_approval").await;
    }
    for _ in 0..2 {
        let (status, v) = get(&c, &s.api("/approvals"), &s.admin).await;
        assert_eq!(status, 200, "{v}");
        let units = v["approvals"].as_array().unwrap();
        let of = |session: &str| {
            units.iter().find(|u| u["session_id"] == session).unwrap()["change"].clone()
        };
        let big = of("big");
        assert_eq!(big["diff"], "", "{}", big["summary"]);
        assert_eq!(big["diff_too_large"], 200_000, "{}", big["summary"]);
        assert!(
            big["summary"].as_str().unwrap().contains("diff too large: 200000 lines changed"),
            "{}",
            big["summary"]
        );
        let fifo = of("fifo");
        assert!(fifo["note"].as_str().unwrap().contains("not a regular file"), "{fifo}");
    }
    // The CLI's view of the same queue answers too.
    let mut cli = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home.path())
        .args(["approvals", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = cli.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
        out
    });
    let start = Instant::now();
    while cli.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = cli.kill();
            panic!("keel approvals hung");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = reader.join().unwrap();
    assert!(out.contains("not a regular file") && out.contains("\"diff_too_large\":200000"));
}

/// A user is not shown host details in error texts: an unreachable model's address is not in
/// their session's state detail, timeline or events (an admin's view keeps it), and a moved
/// preset's host directory is not in `GET /files`' refusal (its guest path is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_users_see_no_host_details_in_error_texts() {
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let work = roots.path().join("secret-project-dir");
    std::fs::create_dir_all(&work).unwrap();
    let preset = format!("{}=/work:rw", work.display());
    let out = super::keel(home.path(), &["grant", "preset", "add", "shared", &preset, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let alice = token(home.path(), "alice", "user");
    // A model server nobody listens on.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://127.0.0.1:{}/v1", dead.local_addr().unwrap().port());
    drop(dead);
    let s = Server::start(home.path(), &dead_url, &[roots.path()]);
    let c = client();
    let (status, v) = post(
        &c,
        &s.api("/sessions"),
        &alice,
        json!({"input": "hi", "preset": "shared", "id": "k7", "tools": ["fs_read_file"]}),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    let port = dead_url.rsplit(':').next().unwrap().trim_end_matches("/v1").to_string();
    let admin_view = super::serve::wait_for(&c, &s, "k7", "failed", |m| {
        m["state_detail"].as_str().is_some_and(|d| !d.is_empty())
    })
    .await;
    assert!(admin_view.to_string().contains(&port), "the admin sees the address: {admin_view}");
    let host = work.display().to_string();
    for path in ["/sessions/k7", "/sessions/k7/timeline", "/sessions/k7/events"] {
        let (status, v) = get(&c, &s.api(path), &alice).await;
        assert_eq!(status, 200, "{path}: {v}");
        let text = v.to_string();
        assert!(!text.contains(&format!("127.0.0.1:{port}")), "{path}: {text}");
        assert!(!text.contains(&host), "{path}: {text}");
    }
    let (_, v) = get(&c, &s.api("/sessions/k7"), &alice).await;
    assert!(v["session"]["state_detail"].as_str().unwrap().contains("[model server]"), "{v}");
    // The preset's directory moves: the file listing's refusal names the guest path only.
    std::fs::rename(&work, roots.path().join("moved")).unwrap();
    let (status, v) = get(&c, &s.api("/sessions/k7/files?grant=/work"), &alice).await;
    assert_ne!(status, 200, "{v}");
    let text = v.to_string();
    assert!(!text.contains(&host) && !text.contains("secret-project-dir"), "{text}");
    let (_, admin) = get(&c, &s.api("/sessions/k7/files?grant=/work"), &s.admin).await;
    assert!(admin.to_string().contains("secret-project-dir"), "the admin sees where: {admin}");
}
