//! A real PostgreSQL server for tests: Debian's `postgresql` binaries, a new cluster in a
//! temporary directory, on a free loopback port, run as an unprivileged user (`initdb` refuses
//! root; under root the server is started through `setpriv` as `nobody`). Stopped when dropped.
//!
//! [`Cluster::template`] makes the migrated database `keel_template` that per-test databases
//! are copied from (`KEEL_TEST_POSTGRES`, see `keel::store::per_home_test_database`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The unprivileged user the server runs as when the tests run as root.
const UNPRIVILEGED: u32 = 65534;

/// A running PostgreSQL cluster.
pub struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// Extra server settings (`-c NAME=VALUE`), kept for restarts.
    settings: Vec<String>,
}

/// The directory of PostgreSQL's server binaries: `KEEL_TEST_PG_BIN`, else the newest
/// `/usr/lib/postgresql/*/bin`, else `pg_config --bindir`.
pub fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("KEEL_TEST_PG_BIN") {
        return Some(dir.into());
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    let dir = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    dir.join("initdb").exists().then_some(dir)
}

/// Gives `path` (a directory and what is in it) to the user the server runs as, when the
/// tests run as root: files the server reads (a TLS key: the server wants it private).
pub fn give_to_server(path: &Path) -> Result<(), String> {
    if !is_root() {
        return Ok(());
    }
    let uid = Some(rustix::process::Uid::from_raw(UNPRIVILEGED));
    let gid = Some(rustix::process::Gid::from_raw(UNPRIVILEGED));
    let mut all = vec![path.to_path_buf()];
    if path.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|e| e.to_string())?;
        all.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
    }
    for p in all {
        rustix::fs::chown(&p, uid, gid)
            .map_err(|e| format!("cannot chown {}: {e}", p.display()))?;
    }
    Ok(())
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `program args…`, as the unprivileged user when this process is root.
fn command(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            format!("--reuid={UNPRIVILEGED}"),
            format!("--regid={UNPRIVILEGED}"),
            "--clear-groups".into(),
            "--".into(),
        ]);
        c.arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(c: &mut Command) -> Result<Output, String> {
    let out = c.output().map_err(|e| format!("cannot run {c:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{c:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(55432)
}

impl Cluster {
    /// Creates and starts a cluster with durable commits (as in production), plus `settings`
    /// (`name=value`).
    pub fn start(settings: &[&str]) -> Result<Self, String> {
        let bin = bin_dir().ok_or(
            "PostgreSQL's server binaries were not found: install Debian's `postgresql` \
             package (or set KEEL_TEST_PG_BIN)",
        )?;
        let dir = tempfile::Builder::new()
            .prefix("keel-pg-")
            .tempdir()
            .map_err(|e| format!("cannot make a directory for PostgreSQL: {e}"))?;
        if is_root() {
            let uid = Some(rustix::process::Uid::from_raw(UNPRIVILEGED));
            let gid = Some(rustix::process::Gid::from_raw(UNPRIVILEGED));
            rustix::fs::chown(dir.path(), uid, gid).map_err(|e| {
                format!("cannot give {} to uid {UNPRIVILEGED}: {e}", dir.path().display())
            })?;
        }
        let data = dir.path().join("data");
        run(command(&bin.join("initdb")).arg("-D").arg(&data).args([
            "-U",
            "keel",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]))?;
        let mut settings: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        settings.push("max_connections=400".into());
        let cluster = Self { dir, bin, port: free_port(), settings };
        cluster.start_again()?;
        Ok(cluster)
    }

    /// Starts the stopped server again, on the same port.
    pub fn start_again(&self) -> Result<(), String> {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        for s in &self.settings {
            options.push_str(" -c ");
            options.push_str(s);
        }
        run(command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-o", &options, "-w", "-t", "60", "start"]))?;
        Ok(())
    }

    /// Stops the server at once, as a crash would (`pg_ctl stop -m immediate`): what was not
    /// committed is lost, what was is recovered at the next start.
    pub fn stop_immediate(&self) -> Result<(), String> {
        run(command(&self.bin.join("pg_ctl")).arg("-D").arg(self.data()).args([
            "-m",
            "immediate",
            "-w",
            "stop",
        ]))?;
        Ok(())
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's URL, without a database: what `KEEL_TEST_POSTGRES` takes.
    pub fn server_url(&self) -> String {
        format!("postgres://keel@127.0.0.1:{}", self.port)
    }

    /// The URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("{}/{db}", self.server_url())
    }

    /// Runs `sql` with `psql` in database `db`; its output (unaligned, tuples only).
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = run(Command::new(self.bin.join("psql")).arg(self.url(db)).args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ]))?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Creates database `db`, empty.
    pub fn create_database(&self, db: &str) -> Result<(), String> {
        self.psql("postgres", &format!("CREATE DATABASE {db}")).map(|_| ())
    }

    /// Creates `keel_template`, migrated by this build of keel, which per-test databases are
    /// copied from.
    pub fn template(&self) -> Result<(), String> {
        self.create_database("keel_template")?;
        let location = keel::store::Location::Postgres { url: self.url("keel_template") };
        drop(keel::store::connect(&location).map_err(|e| e.to_string())?);
        Ok(())
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop_immediate();
    }
}
