//! A real OCI registry for the publishing and installing tests: Debian's `docker-registry`
//! (the CNCF distribution registry, package `docker-registry`) started on a free loopback
//! port, its storage in a temporary directory, optionally behind HTTP basic auth. The binary
//! is `docker-registry` on the PATH, or `KEEL_TEST_REGISTRY` names it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The one user of a registry started with auth, and their password.
pub const USER: &str = "ci-user";
pub const PASSWORD: &str = "pw-secret-1";
/// bcrypt of [`PASSWORD`] (cost 12), as the registry's htpasswd file holds it.
const PASSWORD_BCRYPT: &str = "$2b$12$HDFR3V05JmbmlSCtxiSpQuPrp/V1ObPF9M0fdRhiwFERlr6UsMag6";

/// A running registry; killed when dropped.
pub struct OciRegistry {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Drop for OciRegistry {
    fn drop(&mut self) {
        self.stop();
    }
}

fn binary() -> String {
    std::env::var("KEEL_TEST_REGISTRY").unwrap_or_else(|_| "docker-registry".into())
}

impl OciRegistry {
    /// A registry anyone may push to and pull from.
    pub fn start() -> Self {
        Self::launch(false)
    }

    /// A registry that asks for [`USER`] and [`PASSWORD`].
    pub fn start_with_auth() -> Self {
        Self::launch(true)
    }

    fn launch(auth: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let data = dir.path().join("data");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  \
             filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: \
             {addr}\n  secret: keel-test-secret\n",
            data.display()
        );
        if auth {
            let htpasswd = dir.path().join("htpasswd");
            std::fs::write(&htpasswd, format!("{USER}:{PASSWORD_BCRYPT}\n")).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: keel-test\n    path: {}\n",
                htpasswd.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        // Its log (404s are logged as errors) goes to a file, shown if it does not start.
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(binary())
            .arg("serve")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start the OCI registry `{}` ({e}): install Debian's docker-registry \
                     package (or set KEEL_TEST_REGISTRY)",
                    binary()
                )
            });
        let registry = Self { addr, dir, child: Some(child) };
        registry.wait_ready();
        registry
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(mut s) = TcpStream::connect(&self.addr) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let req = format!(
                    "GET /v2/ HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                    self.addr
                );
                if s.write_all(req.as_bytes()).is_ok() {
                    let mut head = [0u8; 12];
                    if s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.1") {
                        return;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
        panic!("the OCI registry on {} did not answer within 20 s; its log:\n{log}", self.addr);
    }

    /// `oci://127.0.0.1:PORT/REPOSITORY:TAG`.
    pub fn reference(&self, repository_and_tag: &str) -> String {
        format!("oci://{}/{repository_and_tag}", self.addr)
    }

    /// The file a blob's bytes are stored in.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Flips one byte in the middle of a stored blob: the registry serves it as it is.
    pub fn tamper(&self, digest: &str) {
        let file = self.blob_file(digest);
        let mut bytes = std::fs::read(&file).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x01;
        std::fs::write(&file, bytes).unwrap();
    }

    /// Stops the registry (its port then refuses connections).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `bytes` (a component) with a custom section `name` appended: other bytes, the same tools —
/// a new version of a component for a tag to move to.
pub fn with_custom_section(bytes: &[u8], name: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out.extend(keel::protocol::tools::custom_section(name, payload));
    out
}
