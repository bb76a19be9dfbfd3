//! A hostile OCI registry for the trust tests: a small HTTP/1.1 server on loopback — plain, or
//! TLS under a test certificate authority — whose every answer a scenario decides, and which
//! records every request it received, so a test asserts what reached it (a credential, a
//! request to a foreign URL) and not only what keel printed.
//!
//! [`Artifact`] builds what a registry serves for a component or a skill (manifest, config and
//! layers, digests right), and [`Artifact::answer`] serves it the way a registry does; a
//! scenario answers the requests it cares about and hands the rest to it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

/// One request the registry received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// The path and query (`/v2/acme/x/manifests/1`).
    pub target: String,
    /// Header names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
    /// The path, without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

/// How the registry answers one request.
pub enum Reply {
    /// A whole answer.
    Full { status: u16, headers: Vec<(String, String)>, body: Vec<u8> },
    /// A body sent `chunk` by `chunk`, `every` apart, up to `total` bytes (`None`: without
    /// end), under a `Content-Length` of `claimed` (`None`: chunked).
    Stream {
        status: u16,
        headers: Vec<(String, String)>,
        chunk: Vec<u8>,
        every: Duration,
        total: Option<u64>,
        claimed: Option<u64>,
    },
}

impl Reply {
    /// `status` with a body and no other header.
    pub fn status(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self::Full { status, headers: Vec::new(), body: body.into() }
    }
    /// 200 with `body` of `content_type`.
    pub fn ok(content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Self::Full {
            status: 200,
            headers: vec![("Content-Type".into(), content_type.into())],
            body: body.into(),
        }
    }
    /// A redirect to `location`.
    pub fn redirect(status: u16, location: &str) -> Self {
        Self::Full { status, headers: vec![("Location".into(), location.into())], body: Vec::new() }
    }
    /// 401 with the challenge `www_authenticate`.
    pub fn challenge(www_authenticate: &str) -> Self {
        Self::Full {
            status: 401,
            headers: vec![("WWW-Authenticate".into(), www_authenticate.into())],
            body: br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#
                .to_vec(),
        }
    }
}

type Handler = dyn Fn(&Seen) -> Reply + Send + Sync;

/// A running hostile registry; stops accepting when dropped.
pub struct Hostile {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

/// A test certificate authority and a server certificate it signed for `127.0.0.1`, `::1`
/// and `::ffff:127.0.0.1` (a loopback address keel does not take for one, so it speaks HTTPS).
pub struct TestAuthority {
    /// The authority's certificate, PEM (give it to keel with `SSL_CERT_FILE`).
    pub ca_pem: String,
    config: Arc<rustls::ServerConfig>,
}

impl TestAuthority {
    pub fn new() -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "keel test authority");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        for ip in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            params.subject_alt_names.push(rcgen::SanType::IpAddress(ip.parse().unwrap()));
        }
        let cert = params.signed_by(&key, &issuer).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        Self { ca_pem: ca.pem(), config: Arc::new(config) }
    }

    /// Writes the authority's certificate to `dir/ca.pem` and returns its path.
    pub fn write_ca(&self, dir: &std::path::Path) -> String {
        let path = dir.join("ca.pem");
        std::fs::write(&path, &self.ca_pem).unwrap();
        path.display().to_string()
    }
}

impl Default for TestAuthority {
    fn default() -> Self {
        Self::new()
    }
}

impl Hostile {
    /// A plain-HTTP registry on loopback answering with `handler`.
    pub fn start(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Self {
        Self::launch(Arc::new(handler), None)
    }

    /// A registry speaking TLS under `authority`'s certificate.
    pub fn start_tls(
        authority: &TestAuthority,
        handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
    ) -> Self {
        Self::launch(Arc::new(handler), Some(authority.config.clone()))
    }

    fn launch(handler: Arc<Handler>, tls: Option<Arc<rustls::ServerConfig>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (handler, seen, tls) = (handler.clone(), seen2.clone(), tls.clone());
                std::thread::spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
                    match tls {
                        None => serve(conn, &*handler, &seen),
                        Some(config) => {
                            let Ok(session) = rustls::ServerConnection::new(config) else {
                                return;
                            };
                            serve(rustls::StreamOwned::new(session, conn), &*handler, &seen);
                        }
                    }
                });
            }
        });
        Self { addr, seen, stop }
    }

    /// `oci://127.0.0.1:PORT/REPOSITORY_AND_TAG` (plain HTTP: a loopback registry).
    pub fn reference(&self, repository_and_tag: &str) -> String {
        format!("oci://{}/{repository_and_tag}", self.addr)
    }

    /// The registry as keel speaks HTTPS to it: `[::ffff:127.0.0.1]:PORT`.
    pub fn tls_registry(&self) -> String {
        let port = self.addr.rsplit(':').next().unwrap();
        format!("[::ffff:127.0.0.1]:{port}")
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Whether any request carried an `Authorization` header.
    pub fn saw_credentials(&self) -> bool {
        self.seen().iter().any(|s| s.header("authorization").is_some())
    }
}

fn serve(mut conn: impl Read + Write, handler: &Handler, seen: &Mutex<Vec<Seen>>) {
    let Some(request) = read_request(&mut conn) else { return };
    seen.lock().unwrap().push(request.clone());
    let reply = handler(&request);
    let head_only = request.method == "HEAD";
    let _ = write_reply(&mut conn, reply, head_only);
    let _ = conn.flush();
}

fn read_request(conn: &mut impl Read) -> Option<Seen> {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).ok()? == 0 {
            return None;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':')?;
        headers.push((n.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len.min(256 << 20)];
    reader.read_exact(&mut body).ok()?;
    Some(Seen { method, target, headers, body })
}

fn write_reply(conn: &mut impl Write, reply: Reply, head_only: bool) -> std::io::Result<()> {
    let reason = |s: u16| match s {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        301 | 302 | 303 | 307 | 308 => "Redirect",
        401 => "Unauthorized",
        404 => "Not Found",
        _ => "Status",
    };
    match reply {
        Reply::Full { status, headers, body } => {
            let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
            for (n, v) in &headers {
                head.push_str(&format!("{n}: {v}\r\n"));
            }
            head.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n", body.len()));
            conn.write_all(head.as_bytes())?;
            if !head_only {
                conn.write_all(&body)?;
            }
        }
        Reply::Stream { status, headers, chunk, every, total, claimed } => {
            let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
            for (n, v) in &headers {
                head.push_str(&format!("{n}: {v}\r\n"));
            }
            match claimed {
                Some(n) => head.push_str(&format!("Content-Length: {n}\r\n")),
                None => head.push_str("Transfer-Encoding: chunked\r\n"),
            }
            head.push_str("Connection: close\r\n\r\n");
            conn.write_all(head.as_bytes())?;
            conn.flush()?;
            let mut sent = 0u64;
            while total.is_none_or(|t| sent < t) {
                let n = total.map_or(chunk.len() as u64, |t| (t - sent).min(chunk.len() as u64));
                let piece = &chunk[..n as usize];
                if claimed.is_some() {
                    conn.write_all(piece)?;
                } else {
                    conn.write_all(format!("{n:x}\r\n").as_bytes())?;
                    conn.write_all(piece)?;
                    conn.write_all(b"\r\n")?;
                }
                conn.flush()?;
                sent += n;
                std::thread::sleep(every);
            }
            if claimed.is_none() {
                conn.write_all(b"0\r\n\r\n")?;
            }
        }
    }
    Ok(())
}

/// `sha256:` and the hex of `bytes`' hash.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", keel::sandbox::sha256_hex(bytes))
}

/// What a registry serves for one artifact: its manifest and blobs, digests right.
#[derive(Debug, Clone)]
pub struct Artifact {
    pub manifest: Vec<u8>,
    pub digest: String,
    pub blobs: BTreeMap<String, Vec<u8>>,
}

impl Artifact {
    /// A wasm component artifact of `bytes`, as `keel tool publish` writes one.
    pub fn component(bytes: &[u8]) -> Self {
        Self::build(
            "application/vnd.wasm.config.v0+json",
            vec![("application/wasm".into(), None, bytes.to_vec())],
            |_| {},
        )
    }

    /// A skill bundle of `files` (path, bytes).
    pub fn skill(files: &[(&str, &[u8])]) -> Self {
        let layers = files
            .iter()
            .map(|(p, b)| {
                ("application/vnd.keel.skill.file.v1".to_string(), Some(p.to_string()), b.to_vec())
            })
            .collect();
        Self::build("application/vnd.keel.skill.config.v1+json", layers, |_| {})
    }

    /// An artifact whose manifest JSON `edit` changed before it was encoded.
    pub fn build(
        config_type: &str,
        layers: Vec<(String, Option<String>, Vec<u8>)>,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> Self {
        let config = serde_json::to_vec(&json!({"architecture": "wasm", "os": "wasip2"})).unwrap();
        let mut blobs = BTreeMap::new();
        let descriptor = |t: &str, b: &[u8], title: Option<&String>| {
            let mut d = json!({"mediaType": t, "digest": digest(b), "size": b.len()});
            if let Some(title) = title {
                d["annotations"] = json!({"org.opencontainers.image.title": title});
            }
            d
        };
        let mut manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor(config_type, &config, None),
            "layers": layers.iter().map(|(t, title, b)| descriptor(t, b, title.as_ref())).collect::<Vec<_>>(),
        });
        edit(&mut manifest);
        blobs.insert(digest(&config), config);
        for (_, _, b) in layers {
            blobs.insert(digest(&b), b);
        }
        let manifest = serde_json::to_vec(&manifest).unwrap();
        Self { digest: digest(&manifest), manifest, blobs }
    }

    /// The answer a registry gives `seen` for this artifact (any repository, any tag): the
    /// `/v2/` check, the manifest by tag or by its digest, its blobs; 404 for the rest.
    pub fn answer(&self, seen: &Seen) -> Reply {
        let path = seen.path();
        if path == "/v2/" {
            return Reply::ok("application/json", "{}");
        }
        if let Some((_, name)) = path.split_once("/manifests/") {
            if name.starts_with("sha256:") && name != self.digest {
                return Reply::status(
                    404,
                    r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"no"}]}"#,
                );
            }
            return Reply::Full {
                status: 200,
                headers: vec![
                    ("Content-Type".into(), "application/vnd.oci.image.manifest.v1+json".into()),
                    ("Docker-Content-Digest".into(), self.digest.clone()),
                ],
                body: self.manifest.clone(),
            };
        }
        if let Some((_, d)) = path.split_once("/blobs/")
            && let Some(b) = self.blobs.get(d)
        {
            return Reply::ok("application/octet-stream", b.clone());
        }
        Reply::status(404, r#"{"errors":[{"code":"BLOB_UNKNOWN","message":"no"}]}"#)
    }
}

/// How a registry holding several versions of one artifact answers `seen`: every version's
/// manifest by its digest and every blob of any, while the tag (any other manifest request)
/// names `versions[tag]`.
pub fn answer_versions(versions: &[Artifact], tag: usize, seen: &Seen) -> Reply {
    let path = seen.path();
    if let Some((_, name)) = path.split_once("/manifests/")
        && let Some(a) = versions.iter().find(|a| a.digest == name)
    {
        return a.answer(seen);
    }
    if let Some((_, d)) = path.split_once("/blobs/")
        && let Some(b) = versions.iter().find_map(|a| a.blobs.get(d))
    {
        return Reply::ok("application/octet-stream", b.clone());
    }
    versions[tag].answer(seen)
}

/// Runs `cmd` to its end and returns its output and its peak resident set, in KiB (the kernel's
/// `ru_maxrss` of that process alone, which only `wait4` gives: hence the one unsafe call).
#[allow(unsafe_code, clippy::zombie_processes)] // reaped by the wait4 below
pub fn output_and_peak_rss(cmd: &mut std::process::Command) -> (std::process::Output, u64) {
    use std::process::Stdio;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let e = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: `rusage` is plain data the call fills; `pid` is our own child, not yet reaped.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the pointers are to live locals.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    let code = std::os::unix::process::ExitStatusExt::from_raw(status);
    let output =
        std::process::Output { status: code, stdout: o.join().unwrap(), stderr: e.join().unwrap() };
    (output, usage.ru_maxrss as u64)
}
