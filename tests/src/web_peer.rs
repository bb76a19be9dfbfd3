//! A plain HTTP/1.1 server on loopback for the network-egress tests: it counts the
//! connections it accepts (a refused request must make none) and keeps every request it read.
//!
//! Routes: `/echo` answers JSON with the method, path, headers and body it received; `/auth`
//! answers the `authorization` header it received, as text;
//! `/big?n=N` answers N bytes; `/slow?ms=N` answers after N ms; `/redirect?to=URL` answers
//! 302 to URL; anything else answers `ok`. Every answer closes its connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A request the server read.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// Lowercase names.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// The server (stops when dropped).
pub struct WebPeer {
    pub port: u16,
    connections: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WebPeer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WebPeer {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (c, s) = (connections.clone(), seen.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, s.clone()));
            }
        });
        Self { port, connections, seen, task }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Requests read so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(mut stream: tokio::net::TcpStream, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let first: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let request = Seen {
        method: first.first().unwrap_or(&"").to_string(),
        path: first.get(1).unwrap_or(&"").to_string(),
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    seen.lock().unwrap().push(request.clone());
    let (route, query) = request.path.split_once('?').unwrap_or((&request.path, ""));
    let param = |name: &str| {
        query.split('&').find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')))
    };
    let (status, extra, content_type, body): (&str, String, &str, Vec<u8>) = match route {
        "/echo" => {
            let json = serde_json::json!({
                "method": request.method,
                "path": request.path,
                "headers": request.headers.iter().map(|(k, v)| serde_json::json!([k, v])).collect::<Vec<_>>(),
                "body": request.body,
            });
            ("200 OK", String::new(), "application/json", json.to_string().into_bytes())
        }
        "/auth" => {
            let auth = request.header("authorization").unwrap_or("").to_string();
            ("200 OK", String::new(), "text/plain", auth.into_bytes())
        }
        "/big" => {
            let n: usize = param("n").and_then(|v| v.parse().ok()).unwrap_or(1 << 20);
            ("200 OK", String::new(), "text/plain", vec![b'x'; n])
        }
        "/slow" => {
            let ms: u64 = param("ms").and_then(|v| v.parse().ok()).unwrap_or(5000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            ("200 OK", String::new(), "text/plain", b"late".to_vec())
        }
        "/redirect" => {
            let to = param("to").unwrap_or("/").replace("%3A", ":").replace("%2F", "/");
            ("302 Found", format!("location: {to}\r\n"), "text/plain", Vec::new())
        }
        _ => ("200 OK", String::new(), "text/plain", b"ok".to_vec()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&body).await;
    let _ = stream.shutdown().await;
}
