//! `keel serve` under load. Two figures, each beside its baseline measured in the same run:
//!
//! 1. Per-turn latency through the HTTP API — `POST /sessions/{id}/input` until the session's
//!    event stream says it is idle again — beside the CLI's `keel session send` (a process per
//!    turn). Each turn is one read-only tool call (`csv_inspect`) and an answer, against a
//!    scripted OpenAI-compatible server on loopback; task understanding is off on both sides.
//! 2. Requests per second of `GET /sessions/{id}` from 64 concurrent clients, with p50/p99.
//! 3. The same GET from 8 clients, alone and beside 1,000 slow connections without a token
//!    (half a request line each, then nothing), beside login forms whose bodies trickle
//!    (renewed without pause), and beside one user's token opening 1,000 event streams:
//!    requests/s and p99 of each, and each p99's ratio to the baseline's.
//! 4. Turns through the API and the CLI with traces exported over OTLP/HTTP to a collector on
//!    loopback, beside the same turns with export off (p50 of each, and the ratio).
//!
//! `cargo bench -p keel-tests --bench serve`. `KEEL_BENCH_TURNS` (default 20) and
//! `KEEL_BENCH_SECONDS` (default 5) change the shape. Prints figures; asserts nothing about
//! time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, clippy::print_stderr)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use keel_tests::mock_model::{MockModel, Reply};
use serde_json::{Value, json};

const ANSWER: &str = "Lines 4 and 6 are ragged.";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A tool call of `csv_inspect` to a request whose last message is not a tool result, the
/// answer otherwise (streamed, as keel asks by default).
fn responder() -> keel_tests::mock_model::Responder {
    let calls = std::sync::atomic::AtomicU64::new(0);
    Arc::new(move |body: &[u8]| {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let last_is_tool =
            v["messages"].as_array().and_then(|m| m.last()).is_some_and(|m| m["role"] == "tool");
        let id = format!("call-{}", calls.fetch_add(1, Ordering::Relaxed));
        if last_is_tool {
            Reply::text(ANSWER)
        } else {
            Reply::calls(&[(
                &id,
                "csv_inspect",
                r#"{"path":"/data/orders.csv","expected_columns":7}"#,
            )])
        }
    })
}

fn keel_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(root())
        .args(["build", "--release", "-p", "keel-cli", "--bin", "keel"])
        .status()
        .unwrap();
    assert!(status.success(), "cannot build keel");
    root().join("target/release/keel")
}

fn env_or(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn summary(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(|a, b| a.total_cmp(b));
    (percentile(&ms, 0.5), percentile(&ms, 0.9))
}

/// Reads the event stream until the session is idle after its answer; returns the last id.
async fn until_idle(res: &mut reqwest::Response, buf: &mut String) -> i64 {
    let mut answered = false;
    let mut last = 0;
    loop {
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    last = v.parse().unwrap_or(last);
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            let Ok(e) = serde_json::from_str::<Value>(&data) else { continue };
            if e["kind"] == "answer" {
                answered = true;
            }
            if answered && e["kind"] == "state" && e["state"] == "idle" {
                return last;
            }
        }
        let chunk = tokio::time::timeout(Duration::from_secs(60), res.chunk())
            .await
            .expect("no event for 60 s")
            .unwrap()
            .expect("the stream ended");
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// Opens connections to `addr` without pause until the flag it returns is set, sending
/// `request` on each (and keeping the last 1,000 open) or closing each at once: the task
/// answers how many it opened.
fn flood(addr: &str, request: Option<String>) -> (Arc<AtomicBool>, tokio::task::JoinHandle<usize>) {
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, addr) = (stop.clone(), addr.to_string());
    let task = tokio::spawn(async move {
        let mut held = std::collections::VecDeque::new();
        let mut opened = 0usize;
        while !flag.load(Ordering::Relaxed) {
            if let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await {
                opened += 1;
                if let Some(r) = &request {
                    let _ = tokio::io::AsyncWriteExt::write_all(&mut s, r.as_bytes()).await;
                    held.push_back(s);
                    if held.len() > 1000 {
                        held.pop_front();
                    }
                }
            }
            tokio::task::yield_now().await;
        }
        opened
    });
    (stop, task)
}

/// `clients` tasks GET `url` as fast as they can for `seconds`: requests/s, p50, p99 (ms),
/// and how many requests.
async fn load(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    clients: usize,
    seconds: u64,
) -> (f64, f64, f64, usize) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (client, url, token, stop) =
            (client.clone(), url.to_string(), token.to_string(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let res = client.get(&url).bearer_auth(&token).send().await.unwrap();
                assert_eq!(res.status(), 200);
                res.bytes().await.unwrap();
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            lat
        }));
    }
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_by(|a, b| a.total_cmp(b));
    (all.len() as f64 / elapsed, percentile(&all, 0.5), percentile(&all, 0.99), all.len())
}

/// A `keel serve` on a home of its own (its model at `url`, `data` grantable), with `envs`
/// set, and `turns` timed API turns through it (after a warm-up): the turns' ms, the server's
/// base URL and admin token, and the process.
async fn api_turns(
    keel: &Path,
    url: &str,
    data: &Path,
    turns: usize,
    envs: &[(&str, &str)],
) -> (Vec<f64>, String, String, std::process::Child, tempfile::TempDir) {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("keel.toml"),
        format!("[serve]\ngrant_roots = [{:?}]\n", data.display().to_string()),
    )
    .unwrap();
    let mut server = Command::new(keel)
        .arg("--home")
        .arg(home.path())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--model-url",
            url,
            "--model",
            "m",
            "--no-preprocess",
        ])
        .env_remove("KEEL_API_TOKEN")
        .envs(envs.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let base = loop {
        let line = lines.next().expect("keel serve stopped").unwrap();
        if let Some(rest) = line.split("serving the API at ").nth(1) {
            break rest.split("/api/v1").next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let token = std::fs::read_to_string(home.path().join("api-token")).unwrap().trim().to_string();
    let c = reqwest::Client::new();
    let api = |p: &str| format!("{base}/api/v1{p}");
    let res = c
        .post(api("/sessions"))
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body(
            json!({"input": "warm up", "id": "b", "tools": ["csv_inspect"],
                   "grants": [{"host": data.display().to_string(), "guest": "/data"}]})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 202, "{}", res.text().await.unwrap());
    let mut last = 0;
    let mut http = Vec::new();
    for i in 0..=turns {
        let mut events = c
            .get(api("/sessions/b/events"))
            .bearer_auth(&token)
            .header("accept", "text/event-stream")
            .header("last-event-id", last.to_string())
            .send()
            .await
            .unwrap();
        let mut buf = String::new();
        if i == 0 {
            // The warm-up turn started with the session.
            last = until_idle(&mut events, &mut buf).await;
            continue;
        }
        let t = Instant::now();
        let res = c
            .post(api("/sessions/b/input"))
            .bearer_auth(&token)
            .header("content-type", "application/json")
            .body(json!({"text": "Check orders.csv"}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 202);
        last = until_idle(&mut events, &mut buf).await;
        http.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    (http, base, token, server, home)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    keel::tls::init();
    let turns = env_or("KEEL_BENCH_TURNS", 20);
    let seconds = env_or("KEEL_BENCH_SECONDS", 5) as u64;
    let keel = keel_binary();
    let model = MockModel::start_fn(responder()).await;
    let data = root().join("tests/data");
    let grant = format!("{}=/data:ro", data.display());
    println!("keel serve: {turns} turns each side, one csv_inspect call and an answer per turn");

    // The CLI: a process per turn.
    let cli_home = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out =
            Command::new(&keel).arg("--home").arg(cli_home.path()).args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let url = model.url();
    run(&[
        "run",
        "warm up",
        "--new-session",
        "b",
        "--grant",
        &grant,
        "--tools",
        "csv_inspect",
        "--model-url",
        &url,
        "--model",
        "m",
        "--no-preprocess",
    ]);
    let mut cli = Vec::new();
    for _ in 0..turns {
        let t = Instant::now();
        run(&["session", "send", "b", "Check orders.csv"]);
        cli.push(t.elapsed().as_secs_f64() * 1000.0);
    }

    // The API: one server, the turn runs in it.
    let (http, base, token, mut server, api_home) = api_turns(&keel, &url, &data, turns, &[]).await;
    let api = |p: &str| format!("{base}/api/v1{p}");
    let (cli50, cli90) = summary(cli);
    let (api50, api90) = summary(http);
    println!("| path | p50 | p90 |");
    println!("|---|---|---|");
    println!(
        "| `keel session send` (a process per turn; baseline) | {cli50:.2} ms | {cli90:.2} ms |"
    );
    println!(
        "| `POST /sessions/{{id}}/input` → idle on the event stream | {api50:.2} ms | {api90:.2} ms |"
    );
    println!("API / CLI (p50): {:.2}", api50 / cli50);

    // 64 clients reading one session as fast as they can.
    let client = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let url = api("/sessions/b");
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let (rps, p50, p99, n) = load(&client, &url, &token, 64, seconds).await;
    println!(
        "GET /sessions/{{id}}, 64 concurrent clients, {seconds} s: {rps:.0} requests/s, p50 {p50:.2} ms, p99 {p99:.2} ms ({n} requests; {cpus} CPUs)"
    );

    // The same GET (8 clients) with and without 1,000 slow connections that carry no token and
    // never finish their headers (each sends half a request line, then nothing).
    let (base_rps, _, base_p99, _) = load(&client, &url, &token, 8, seconds).await;
    let addr = base.trim_start_matches("http://").to_string();
    let mut slow = Vec::new();
    for _ in 0..1000 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut s, b"GET /api/v1/whoami HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    let (slow_rps, _, slow_p99, _) = load(&client, &url, &token, 8, seconds).await;
    println!("| GET /sessions/{{id}}, 8 clients | requests/s | p99 |");
    println!("|---|---|---|");
    println!("| alone (baseline) | {base_rps:.0} | {base_p99:.2} ms |");
    println!(
        "| beside 1,000 slow connections without a token | {slow_rps:.0} | {slow_p99:.2} ms |"
    );
    println!("p99 with slow connections / alone: {:.2}", slow_p99 / base_p99);
    drop(slow);

    // Login forms whose bodies trickle (headers whole, then a byte of 1,000), renewed without
    // pause for the whole measurement: at most an eighth of the connections hold them, and
    // each loses its connection at the short body deadline.
    let form = format!(
        "POST /login HTTP/1.1\r\nHost: {addr}\r\nContent-Type: \
         application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\nt"
    );
    let (stop, trickler) = flood(&addr, Some(form));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (login_rps, _, login_p99, _) = load(&client, &url, &token, 8, seconds).await;
    stop.store(true, Ordering::Relaxed);
    let trickled = trickler.await.unwrap();
    println!(
        "| beside login forms trickling, renewed ({trickled} opened) | {login_rps:.0} | {login_p99:.2} ms |"
    );
    println!("p99 with trickling logins / alone: {:.2}", login_p99 / base_p99);

    // The same flood of connections with no request at all (connect, then close): what the
    // connection rate alone costs on these CPUs, beside which the row above is read.
    let (stop, flooder) = flood(&addr, None);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (bare_rps, _, bare_p99, _) = load(&client, &url, &token, 8, seconds).await;
    stop.store(true, Ordering::Relaxed);
    let bare = flooder.await.unwrap();
    println!(
        "| beside bare connections opened and closed without pause ({bare} opened) | {bare_rps:.0} | {bare_p99:.2} ms |"
    );
    println!("p99 with bare connections / alone: {:.2}", bare_p99 / base_p99);

    // One user's token opening 1,000 event streams: a quarter of the connections are theirs
    // (the rest answered 429), and the admin's requests are measured beside them.
    let user = {
        let out = Command::new(&keel)
            .arg("--home")
            .arg(api_home.path())
            .args(["token", "add", "bench-user", "--role", "user", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["token"].as_str().unwrap().to_string()
    };
    let session = {
        let res = client
            .post(api("/sessions"))
            .bearer_auth(&user)
            .header("content-type", "application/json")
            .body(json!({"input": "hello", "id": "u1"}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 202, "{}", res.text().await.unwrap());
        "u1"
    };
    let mut streams = Vec::new();
    let (mut open, mut refused) = (0, 0);
    for _ in 0..1000 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let req = format!(
            "GET /api/v1/sessions/{session}/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: \
             Bearer {user}\r\nAccept: text/event-stream\r\n\r\n"
        );
        tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes()).await.unwrap();
        let mut head = [0u8; 16];
        let n = tokio::io::AsyncReadExt::read(&mut s, &mut head).await.unwrap_or(0);
        match String::from_utf8_lossy(&head[..n]).contains(" 200") {
            true => open += 1,
            false => refused += 1,
        }
        streams.push(s);
    }
    let (streams_rps, _, streams_p99, _) = load(&client, &url, &token, 8, seconds).await;
    println!(
        "| beside one user's 1,000 event streams ({open} open, {refused} refused) | {streams_rps:.0} | {streams_p99:.2} ms |"
    );
    println!("p99 beside one user's streams / alone: {:.2}", streams_p99 / base_p99);
    drop(streams);
    let _ = server.kill();
    let _ = server.wait();

    // Traces exported over OTLP/HTTP to a collector on loopback (a sink answering 200), beside
    // the same turns with export off: the API's turns (the server exports in batches from a
    // thread of its own) and the CLI's (a process per turn, which sends its spans before it
    // exits). Off and on alternate in rounds, so drift hits both alike.
    let sink = keel_tests::telemetry_peers::Sink::start();
    let on: &[(&str, &str)] = &[("OTEL_EXPORTER_OTLP_ENDPOINT", &sink.base)];
    let (mut api_off, mut api_on, mut cli_off, mut cli_on) = (vec![], vec![], vec![], vec![]);
    for _ in 0..2 {
        for (envs, out) in [(&[][..], &mut api_off), (on, &mut api_on)] {
            let model_url = model.url();
            let (ms, _, _, mut s, _home) =
                api_turns(&keel, &model_url, &data, turns / 2, envs).await;
            out.extend(ms);
            let _ = s.kill();
            let _ = s.wait();
        }
        for (envs, out) in [(&[][..], &mut cli_off), (on, &mut cli_on)] {
            for _ in 0..turns / 2 {
                let t = Instant::now();
                let out2 = Command::new(&keel)
                    .arg("--home")
                    .arg(cli_home.path())
                    .args(["session", "send", "b", "Check orders.csv"])
                    .envs(envs.iter().copied())
                    .output()
                    .unwrap();
                assert!(out2.status.success(), "{}", String::from_utf8_lossy(&out2.stderr));
                out.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
    }
    let exported = sink.requests.load(Ordering::Relaxed);
    let bytes = sink.bytes.load(Ordering::Relaxed);
    println!();
    println!("| turn | export off p50 | export on p50 | on / off |");
    println!("|---|---|---|---|");
    for (name, off, on) in [
        ("`POST /sessions/{id}/input` → idle", api_off, api_on),
        ("`keel session send` (a process per turn)", cli_off, cli_on),
    ] {
        let ((off50, _), (on50, _)) = (summary(off), summary(on));
        println!("| {name} | {off50:.2} ms | {on50:.2} ms | {:.3} |", on50 / off50);
    }
    println!("the collector received {exported} export requests, {bytes} bytes");
}
