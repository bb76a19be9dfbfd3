//! The telemetry peers of the slow tier: an OTLP/HTTP receiver that decodes what keel sends
//! with the official protobuf definitions (`opentelemetry-proto` from PyPI, pinned, in a
//! virtual environment under `target/otel-peers`), and Debian's `prometheus` server.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const PYTHON_PROTO: &str = "opentelemetry-proto==1.45.2";

/// The virtual environment with the protobuf definitions, made on first use (a staging
/// directory renamed into place).
fn python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
            let root = target.join("otel-peers");
            let python = root.join("venv/bin/python");
            if root.join(".keel-installed").exists() {
                return python;
            }
            let staging = target.join(format!("otel-peers.staging.{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&staging);
            std::fs::create_dir_all(&staging).unwrap();
            crate::mcp_peers::venv(&staging.join("venv"), &[PYTHON_PROTO]);
            std::fs::write(staging.join(".keel-installed"), "").unwrap();
            let _ = std::fs::remove_dir_all(&root);
            std::fs::rename(&staging, &root).unwrap();
            python
        })
        .clone()
}

/// A running OTLP/HTTP receiver, stopped when dropped.
pub struct Receiver {
    child: Child,
    /// `http://127.0.0.1:PORT` (the base URL: spans go to `/v1/traces`).
    pub base: String,
    out: PathBuf,
    _dir: tempfile::TempDir,
}

impl Receiver {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("spans.jsonl");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/otel/receiver.py");
        let mut child = Command::new(python())
            .arg(script)
            .arg(&out)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("listening ").expect("the receiver did not start");
        Self { child, base: format!("http://127.0.0.1:{port}"), out, _dir: dir }
    }

    /// Every span received so far, as the receiver decoded it.
    pub fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Waits until `done` holds for the spans received, or panics after `limit`.
    pub fn wait_for(&self, limit: Duration, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(start.elapsed() < limit, "the spans never arrived; received: {spans:#?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Debian's `prometheus` server scraping one target, stopped when dropped.
pub struct Prometheus {
    child: Child,
    pub base: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts `prometheus` with `scrape_configs` (the `scrape_configs:` section of its YAML,
    /// as a user writes it) scraping every second; `TOKEN_FILE` in it names a file holding
    /// `token`.
    pub fn start(scrape_configs: &str, token: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        if let Some(t) = token {
            std::fs::write(&file, t).unwrap();
        }
        let scrape = scrape_configs.replace("TOKEN_FILE", &file.display().to_string());
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, format!("global:\n  scrape_interval: 1s\n{scrape}")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Debian's prometheus is needed (apt-get install prometheus)");
        Self { child, base: format!("http://127.0.0.1:{port}"), _dir: dir }
    }

    /// The value of an instant query's first sample, once there is one (waits up to `limit`).
    pub fn value(&self, query: &str, limit: Duration) -> Option<f64> {
        let client = reqwest::blocking::Client::new();
        let start = Instant::now();
        loop {
            let v: Option<Value> = client
                .get(format!("{}/api/v1/query?query={}", self.base, encode(query)))
                .send()
                .and_then(|r| r.text())
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok());
            let first = v.as_ref().and_then(|v| v["data"]["result"].get(0).cloned());
            if let Some(s) = first {
                return s["value"][1].as_str().and_then(|t| t.parse().ok());
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The scrape target's health as Prometheus last saw it (`up`, `down`, `unknown`) and its
    /// last error.
    pub fn target(&self) -> (String, String) {
        let v: Value = reqwest::blocking::Client::new()
            .get(format!("{}/api/v1/targets", self.base))
            .send()
            .and_then(|r| r.text())
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let t = &v["data"]["activeTargets"][0];
        (
            t["health"].as_str().unwrap_or_default().to_string(),
            t["lastError"].as_str().unwrap_or_default().to_string(),
        )
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `text` percent-encoded for a query string.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A collector that takes every OTLP/HTTP export and answers 200 at once, counting requests
/// and bytes: the benchmarks' sink (it decodes nothing, so what is measured is keel's side).
pub struct Sink {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub requests: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub bytes: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Sink {
    pub fn start() -> Self {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let bytes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (r, b) = (requests.clone(), bytes.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (r, b) = (r.clone(), b.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(conn.try_clone().unwrap());
                    let mut out = conn;
                    loop {
                        let mut length = 0usize;
                        let mut line = String::new();
                        // The request line and the headers, up to the empty line.
                        loop {
                            line.clear();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            let l = line.trim_end();
                            if l.is_empty() {
                                break;
                            }
                            if let Some((k, v)) = l.split_once(':')
                                && k.eq_ignore_ascii_case("content-length")
                            {
                                length = v.trim().parse().unwrap_or(0);
                            }
                        }
                        let mut body = vec![0; length];
                        if reader.read_exact(&mut body).is_err() {
                            return;
                        }
                        r.fetch_add(1, Ordering::Relaxed);
                        b.fetch_add(length as u64, Ordering::Relaxed);
                        let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                        if out.write_all(reply.as_bytes()).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { base, requests, bytes }
    }
}
