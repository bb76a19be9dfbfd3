//! A tool author's loop: `keel tool dev` (watch a project, rebuild it with its own build
//! command, call the tool again) and `keel tool test` (run a component's cases under the real
//! sandbox). Both find a project's build the way `keel tool new` wrote it: `cargo build
//! --release --target wasm32-wasip2`, `./build.sh` or `npm run build`.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime};

use clap::Args;
use keel::api::Caller;
use keel::protocol::sessions::{CancelToken, Grant};
use keel::protocol::setup::Harness;
use keel::protocol::tools::{CallOutcome, CallRequest};
use serde_json::{Value, json};

use super::outcome::{outcome_json, print_outcome};
use super::{BudgetArgs, EXIT_REFUSED, EXIT_TOOL_ERROR, fail, inert};

/// How a project is built, as `keel tool new` wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Build {
    /// `Cargo.toml`: `cargo build --release --target wasm32-wasip2`.
    Cargo,
    /// `build.sh` (Python): `./build.sh`.
    Script,
    /// `package.json` with a `build` script (JavaScript): `npm run build`.
    Npm,
    /// A component file, watched as it is (someone else builds it).
    File,
}

impl Build {
    fn command(self) -> &'static str {
        match self {
            Self::Cargo => "cargo build --release --target wasm32-wasip2",
            Self::Script => "./build.sh",
            Self::Npm => "npm run build",
            Self::File => "",
        }
    }
}

/// A tool project (or a component file) and how to get its component.
struct Project {
    /// The project's directory (a file's own directory in file mode).
    dir: PathBuf,
    build: Build,
    /// In file mode, the component file.
    file: Option<PathBuf>,
}

impl Project {
    /// The project `path` names: a directory holding `Cargo.toml`, `build.sh` or a
    /// `package.json` with a `build` script, or a `.wasm` file.
    fn at(path: &Path) -> Result<Self, String> {
        if path.is_file() {
            let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            return Ok(Self {
                dir: dir.to_path_buf(),
                build: Build::File,
                file: Some(path.to_path_buf()),
            });
        }
        if !path.is_dir() {
            return Err(format!("{}: no such file or directory", path.display()));
        }
        let build = if path.join("Cargo.toml").is_file() {
            Build::Cargo
        } else if path.join("build.sh").is_file() {
            Build::Script
        } else if npm_build_script(path) {
            Build::Npm
        } else {
            return Err(format!(
                "{} is not a tool project keel knows how to build: it has no Cargo.toml, build.sh or package.json with a `build` script (give the component file instead)",
                path.display()
            ));
        };
        Ok(Self { dir: path.to_path_buf(), build, file: None })
    }

    /// Builds the project with its own command, its output on stderr, and returns the
    /// component it wrote.
    fn build(&self) -> Result<PathBuf, String> {
        match self.build {
            Build::File => Ok(self.file.clone().unwrap_or_default()),
            Build::Cargo => self.build_cargo(),
            Build::Script | Build::Npm => {
                let started = SystemTime::now();
                let mut cmd = match self.build {
                    Build::Script => Command::new("./build.sh"),
                    _ => {
                        let mut c = Command::new("npm");
                        c.args(["run", "build"]);
                        c
                    }
                };
                cmd.current_dir(&self.dir).stdin(Stdio::null()).stdout(std::io::stderr());
                run_build(cmd, self.build.command())?;
                newest_wasm(&self.dir, Some(started)).ok_or_else(|| {
                    format!(
                        "`{}` succeeded but wrote no .wasm file in {}",
                        self.build.command(),
                        self.dir.display()
                    )
                })
            }
        }
    }

    fn build_cargo(&self) -> Result<PathBuf, String> {
        let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.current_dir(&self.dir)
            .args(["build", "--release", "--target", "wasm32-wasip2"])
            .arg("--message-format=json-render-diagnostics")
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| spawn_error(self.build.command(), &e))?;
        // The artifacts cargo reports (compiler messages are rendered on stderr).
        let mut wasm = None;
        if let Some(out) = child.stdout.take() {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let Ok(msg) = serde_json::from_str::<Value>(&line) else { continue };
                if msg["reason"] != "compiler-artifact" {
                    continue;
                }
                let cdylib = msg["target"]["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "cdylib"));
                let file = msg["filenames"].as_array().and_then(|f| {
                    f.iter().filter_map(Value::as_str).find(|f| f.ends_with(".wasm"))
                });
                if let (true, Some(file)) = (cdylib, file) {
                    wasm = Some(PathBuf::from(file));
                }
            }
        }
        let status = child.wait().map_err(|e| spawn_error(self.build.command(), &e))?;
        if !status.success() {
            return Err(format!("`{}` failed ({status})", self.build.command()));
        }
        wasm.ok_or_else(|| {
            "cargo built no .wasm library: the package needs `crate-type = [\"cdylib\"]` under [lib]"
                .to_string()
        })
    }

    /// The component last built, without building: what `cargo metadata` names for a Rust
    /// project, the newest `.wasm` file in the directory otherwise.
    fn built(&self) -> Result<PathBuf, String> {
        let missing = || {
            format!(
                "no built component in {}: build it (`{}`) or add --build",
                self.dir.display(),
                self.build.command()
            )
        };
        match self.build {
            Build::File => Ok(self.file.clone().unwrap_or_default()),
            Build::Script | Build::Npm => newest_wasm(&self.dir, None).ok_or_else(missing),
            Build::Cargo => {
                let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                    .current_dir(&self.dir)
                    .args(["metadata", "--format-version", "1", "--no-deps"])
                    .stderr(Stdio::inherit())
                    .output()
                    .map_err(|e| spawn_error("cargo metadata", &e))?;
                if !out.status.success() {
                    return Err(format!("`cargo metadata` failed ({})", out.status));
                }
                let meta: Value = serde_json::from_slice(&out.stdout)
                    .map_err(|e| format!("`cargo metadata` printed what is not JSON: {e}"))?;
                let target_dir = meta["target_directory"].as_str().unwrap_or("target");
                let lib = meta["packages"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|p| p["targets"].as_array().into_iter().flatten())
                    .find(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "cdylib")))
                    .and_then(|t| t["name"].as_str())
                    .ok_or("the package has no `cdylib` library: a component needs `crate-type = [\"cdylib\"]` under [lib]")?;
                let file = Path::new(target_dir)
                    .join("wasm32-wasip2/release")
                    .join(format!("{}.wasm", lib.replace('-', "_")));
                if file.is_file() { Ok(file) } else { Err(missing()) }
            }
        }
    }
}

fn npm_build_script(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("package.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .is_some_and(|p| p["scripts"]["build"].is_string())
}

fn spawn_error(what: &str, e: &std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::NotFound {
        format!(
            "cannot run `{what}`: {} is not installed (or not on PATH)",
            what.split(' ').next().unwrap_or(what)
        )
    } else {
        format!("cannot run `{what}`: {e}")
    }
}

fn run_build(mut cmd: Command, what: &str) -> Result<(), String> {
    let status = cmd.status().map_err(|e| spawn_error(what, &e))?;
    if status.success() { Ok(()) } else { Err(format!("`{what}` failed ({status})")) }
}

/// The most recently written `.wasm` file directly in `dir` (written since `since`, if given).
fn newest_wasm(dir: &Path, since: Option<SystemTime>) -> Option<PathBuf> {
    let since = since.map(|t| t - Duration::from_secs(1));
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "wasm"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .filter(|(m, _)| since.is_none_or(|s| *m >= s))
        .max()
        .map(|(_, p)| p)
}

/// Directories a project's sources never live in: build output, dependencies, tool caches.
const SKIPPED: &[&str] = &["target", "node_modules", ".venv", "venv", "__pycache__", ".git"];

/// The most files a watch looks at; a larger tree is watched in part (and says so).
const MAX_WATCHED: usize = 20_000;

/// What a watch sees of the project's sources: each file's modification time and size.
type Snapshot = BTreeMap<PathBuf, (SystemTime, u64)>;

fn snapshot(project: &Project) -> Snapshot {
    let mut seen = Snapshot::new();
    if let Some(file) = &project.file {
        if let Ok(m) = std::fs::metadata(file) {
            seen.insert(file.clone(), (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        }
        return seen;
    }
    let mut stack = vec![project.dir.clone()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.filter_map(Result::ok) {
            if seen.len() >= MAX_WATCHED {
                return seen;
            }
            let name = e.file_name();
            let name = name.to_string_lossy();
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() {
                if !SKIPPED.contains(&name.as_ref()) && !name.starts_with('.') {
                    stack.push(e.path());
                }
            } else if kind.is_file()
                && !name.ends_with(".wasm")
                && !name.starts_with('.')
                && let Ok(m) = e.metadata()
            {
                let modified = m.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                seen.insert(e.path(), (modified, m.len()));
            }
        }
    }
    seen
}

/// The files that differ between two snapshots (written, added or removed), and when the
/// latest of them was written.
fn changed(before: &Snapshot, after: &Snapshot, dir: &Path) -> (Vec<String>, Option<SystemTime>) {
    let mut paths = Vec::new();
    let mut latest = None;
    for (p, v) in after {
        if before.get(p) != Some(v) {
            paths.push(p.clone());
            latest = latest.max(Some(v.0));
        }
    }
    paths.extend(before.keys().filter(|p| !after.contains_key(*p)).cloned());
    let shown =
        paths.iter().map(|p| p.strip_prefix(dir).unwrap_or(p).display().to_string()).collect();
    (shown, latest)
}

#[derive(Args)]
pub struct DevArgs {
    /// The project directory (with Cargo.toml, build.sh or a package.json `build` script, as
    /// `keel tool new` writes them), or a component file someone else builds.
    #[arg(default_value = ".", value_name = "DIR|FILE")]
    path: PathBuf,
    /// The tool to call (default: the component's only tool).
    #[arg(long, value_name = "NAME")]
    tool: Option<String>,
    /// The input of each call: a JSON object; `@FILE` reads it from a file. While watching, a
    /// line of JSON typed on stdin becomes the input and calls the tool at once.
    #[arg(long, default_value = "{}", value_name = "JSON|@FILE")]
    input: String,
    #[command(flatten)]
    call: super::outcome::CallFlags,
    /// Build and call once, then exit with the call's status (no watching).
    #[arg(long)]
    once: bool,
    /// How often to look for changed files, in milliseconds.
    #[arg(long, default_value = "200", value_name = "MS",
          value_parser = clap::value_parser!(u64).range(20..=10_000))]
    poll_ms: u64,
    /// Print one JSON object per line for each build and call, for scripts.
    #[arg(long)]
    pub json: bool,
}

/// Why a run happened.
enum Trigger {
    Start,
    Change { files: Vec<String>, written: Option<SystemTime> },
    Input,
}

impl Trigger {
    fn name(&self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Change { .. } => "change",
            Self::Input => "input",
        }
    }
}

/// What the loop keeps between runs.
struct Dev<'a> {
    service: &'a Harness,
    project: Project,
    a: DevArgs,
    input: String,
    /// The last component built (an input typed on stdin calls it without a build).
    wasm: Option<PathBuf>,
}

impl Dev<'_> {
    /// One run: build (unless only the input changed), then call. Returns whether the call
    /// succeeded.
    async fn run(&mut self, trigger: Trigger) -> bool {
        let started = Instant::now();
        if let Trigger::Change { files, .. } = &trigger
            && !self.a.json
        {
            eprintln!("keel: changed: {}", files.join(", "));
        }
        let mut build_ms = None;
        if !matches!(trigger, Trigger::Input) || self.wasm.is_none() {
            if self.project.build != Build::File && !self.a.json {
                eprintln!("keel: building with `{}` …", self.project.build.command());
            }
            match self.project.build() {
                Ok(w) => self.wasm = Some(w),
                Err(why) => {
                    self.report_failure(&trigger, "build_failed", &why);
                    return false;
                }
            }
            build_ms = Some(started.elapsed().as_secs_f64() * 1e3);
        }
        let wasm = self.wasm.clone().unwrap_or_default();
        let bytes = match std::fs::read(&wasm) {
            Ok(b) => b,
            Err(e) => {
                let why = format!("cannot read {}: {e}", wasm.display());
                self.report_failure(&trigger, "io", &why);
                return false;
            }
        };
        if let Some(ms) = build_ms
            && !self.a.json
            && self.project.build != Build::File
        {
            eprintln!(
                "keel: built {} ({:.1} MB) in {:.1} s",
                wasm.display(),
                bytes.len() as f64 / 1e6,
                ms / 1e3
            );
        }
        let name = super::component_name(&bytes, &wasm);
        let checked_at = Instant::now();
        let tool = match &self.a.tool {
            Some(t) => t.clone(),
            None => match self.only_tool(&bytes, &name).await {
                Ok(t) => t,
                Err(why) => {
                    self.report_failure(&trigger, "input", &why);
                    return false;
                }
            },
        };
        let call = call_file(
            self.service,
            &bytes,
            &name,
            &tool,
            &self.input,
            &self.a.call.grants,
            &self.a.call.net,
            &self.a.call.budget,
        )
        .await;
        let outcome = match call {
            Ok(o) => o,
            Err(e) => {
                self.report_failure(&trigger, e.kind(), &e.to_string());
                return false;
            }
        };
        let ok = outcome.report.result.is_ok();
        let call_ms = outcome.report.duration.as_secs_f64() * 1e3;
        let check_ms = checked_at.elapsed().as_secs_f64() * 1e3;
        let edit_to_output_ms = match &trigger {
            Trigger::Change { written: Some(w), .. } => {
                SystemTime::now().duration_since(*w).ok().map(|d| d.as_secs_f64() * 1e3)
            }
            _ => None,
        };
        if self.a.json {
            let files = match &trigger {
                Trigger::Change { files, .. } => files.clone(),
                _ => Vec::new(),
            };
            println!(
                "{}",
                json!({
                    "event": "call", "trigger": trigger.name(), "changed": files,
                    "wasm": wasm, "component": name,
                    "build_ms": build_ms, "check_ms": check_ms - call_ms,
                    "call_ms": call_ms, "edit_to_output_ms": edit_to_output_ms,
                    "call": outcome_json(&outcome),
                })
            );
        } else {
            print_outcome(&outcome);
            let build = build_ms.map(|b| format!("build {:.1} s, ", b / 1e3)).unwrap_or_default();
            let figures =
                format!("{build}check and load {:.0} ms, call {call_ms:.2} ms", check_ms - call_ms);
            match edit_to_output_ms {
                Some(ms) => eprintln!("keel: edit → output {:.1} s ({figures})", ms / 1e3),
                None => eprintln!("keel: {figures}"),
            }
        }
        ok
    }

    /// The component's only tool, or why there is none to choose.
    async fn only_tool(&self, bytes: &[u8], name: &str) -> Result<String, String> {
        let r = self
            .service
            .inspect_tool_file(&Caller::Operator, bytes, name)
            .await
            .map_err(|e| e.to_string())?;
        match r.tools.as_slice() {
            [one] => Ok(one.name.clone()),
            [] => Err(r.refusal.unwrap_or_else(|| "the component describes no tool".into())),
            many => Err(format!(
                "the component has {} tools ({}): choose one with --tool",
                many.len(),
                many.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
            )),
        }
    }

    fn report_failure(&self, trigger: &Trigger, kind: &str, why: &str) {
        if self.a.json {
            println!(
                "{}",
                json!({"event": "failed", "trigger": trigger.name(), "kind": kind, "message": why})
            );
        } else {
            eprintln!("keel: {} ({kind})", inert(why));
        }
    }
}

/// One governed call of `tool` of the component file `bytes`.
#[allow(clippy::too_many_arguments)]
async fn call_file(
    service: &Harness,
    bytes: &[u8],
    name: &str,
    tool: &str,
    input: &str,
    grants: &[Grant],
    net: &super::NetArgs,
    budget: &BudgetArgs,
) -> Result<CallOutcome, keel::api::ApiError> {
    let net = net.grants();
    let req = CallRequest {
        tool,
        input,
        grants,
        net: &net,
        budget: budget.budget(),
        cancel: Some(CancelToken::new()),
        loaded: None,
        policy: None,
        approval: None,
        control: None,
    };
    service.call_tool_file(&Caller::Operator, bytes, name, req).await
}

/// `keel tool dev`.
pub async fn dev(service: &Harness, a: DevArgs) -> ExitCode {
    let project = match Project::at(&a.path) {
        Ok(p) => p,
        Err(why) => return fail(a.json, "input", &why, EXIT_REFUSED),
    };
    let input = match super::outcome::read_input(&a.input) {
        Ok(i) if a.input != "-" => i,
        Ok(_) => {
            let why = "--input - is not for `tool dev`: type inputs on stdin while it watches";
            return fail(a.json, "input", why, EXIT_REFUSED);
        }
        Err(why) => return fail(a.json, "invalid_input", &why, EXIT_REFUSED),
    };
    let once = a.once;
    let json_out = a.json;
    let poll = Duration::from_millis(a.poll_ms);
    let mut dev = Dev { service, project, a, input, wasm: None };
    let ok = dev.run(Trigger::Start).await;
    // What the first build wrote (a lock file, generated code) is not a change.
    let mut seen = snapshot(&dev.project);
    if once {
        return if ok { ExitCode::SUCCESS } else { ExitCode::from(EXIT_TOOL_ERROR) };
    }
    // Inputs typed on stdin, a line each.
    let (tx, mut inputs) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if !line.trim().is_empty() && tx.send(line).is_err() {
                break;
            }
        }
    });
    let watching = |dev: &Dev<'_>| {
        if !json_out {
            eprintln!(
                "keel: watching {} for changes (Ctrl-C stops; a line of JSON on stdin calls it with that input)",
                std::fs::canonicalize(dev.project.file.as_ref().unwrap_or(&dev.project.dir))
                    .unwrap_or_default()
                    .display()
            );
        }
    };
    watching(&dev);
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(line) = inputs.recv() => {
                dev.input = line;
                dev.run(Trigger::Input).await;
                watching(&dev);
            }
            () = tokio::time::sleep(poll) => {
                let now = snapshot(&dev.project);
                if now == seen {
                    continue;
                }
                // Let a save that writes several files finish before building.
                let mut settled = now;
                for _ in 0..10 {
                    tokio::time::sleep(poll.min(Duration::from_millis(100))).await;
                    let again = snapshot(&dev.project);
                    if again == settled {
                        break;
                    }
                    settled = again;
                }
                let (files, written) = changed(&seen, &settled, &dev.project.dir);
                dev.run(Trigger::Change { files, written }).await;
                // What the build itself wrote (a lock file, generated code) is not a change.
                seen = snapshot(&dev.project);
                watching(&dev);
            }
        }
    }
    if !json_out {
        eprintln!("keel: stopped");
    }
    ExitCode::SUCCESS
}

#[derive(Args)]
pub struct TestArgs {
    /// The project directory (its built component and its `tests/*.json`), or a component
    /// file (its cases then come from ./tests, or --cases).
    #[arg(default_value = ".", value_name = "DIR|FILE")]
    path: PathBuf,
    /// The directory of the cases (`*.json`; default: the project's `tests/`).
    #[arg(long, value_name = "DIR")]
    cases: Option<PathBuf>,
    /// Build the project with its own build command first.
    #[arg(long)]
    build: bool,
    #[command(flatten)]
    budget: BudgetArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One case of a `tests/*.json` file: a call and what it must give.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    /// The tool (default: the component's only tool).
    tool: Option<String>,
    /// What the case checks, for the report.
    description: Option<String>,
    input: Value,
    /// The output expected: objects match on the fields given, the rest exactly.
    output: Option<Value>,
    /// The error expected: its kind (`invalid_input`, `not_found` …), or `{kind, message}`
    /// where `message` is a part of the error's message.
    error: Option<Value>,
    /// Grants: HOST_DIR[=GUEST][:ro|:rw], HOST_DIR relative to the cases' directory.
    #[serde(default)]
    grants: Vec<String>,
}

/// A case ready to run.
#[derive(Debug)]
struct Case {
    name: String,
    description: Option<String>,
    tool: Option<String>,
    input: String,
    expect: Expect,
    grants: Vec<Grant>,
}

#[derive(Debug)]
enum Expect {
    /// Success, the output matching the tool's output schema (if it declares one) and, if
    /// given, this value.
    Output(Option<Value>),
    Error {
        kind: String,
        message: Option<String>,
    },
}

/// The cases of `dir`'s `*.json` files, in name order. A file holds a case or an array of
/// cases.
fn read_cases(dir: &Path) -> Result<Vec<Case>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read the cases in {}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        let stem = file.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not JSON: {e}", file.display()))?;
        let many = value.is_array();
        let list = match value {
            Value::Array(l) => l,
            v => vec![v],
        };
        for (i, v) in list.into_iter().enumerate() {
            let name = if many { format!("{stem}#{}", i + 1) } else { stem.clone() };
            let c: CaseFile = serde_json::from_value(v).map_err(|e| {
                format!(
                    "{} ({name}): {e}; a case is {{\"input\": {{…}}, \"output\": {{…}} or \"error\": \"KIND\", \"tool\"?, \"grants\"?, \"description\"?}}",
                    file.display()
                )
            })?;
            cases.push(case_of(c, name, dir).map_err(|why| format!("{}: {why}", file.display()))?);
        }
    }
    Ok(cases)
}

fn case_of(c: CaseFile, name: String, dir: &Path) -> Result<Case, String> {
    let expect = match (c.output, c.error) {
        (Some(_), Some(_)) => return Err(format!("{name}: give `output` or `error`, not both")),
        (out, None) => Expect::Output(out),
        (None, Some(Value::String(kind))) => Expect::Error { kind, message: None },
        (None, Some(Value::Object(o))) => Expect::Error {
            kind: o.get("kind").and_then(Value::as_str).unwrap_or_default().to_string(),
            message: o.get("message").and_then(Value::as_str).map(str::to_string),
        },
        (None, Some(_)) => {
            return Err(format!(
                "{name}: `error` is a kind (\"invalid_input\") or {{\"kind\", \"message\"}}"
            ));
        }
    };
    if !c.input.is_object() {
        return Err(format!("{name}: `input` must be a JSON object"));
    }
    let grants = c
        .grants
        .iter()
        .map(|g| {
            let spec =
                if g.starts_with('/') { g.clone() } else { format!("{}/{g}", dir.display()) };
            spec.parse::<Grant>().map_err(|e| format!("{name}: grant `{g}`: {e}"))
        })
        .collect::<Result<_, _>>()?;
    Ok(Case {
        name,
        description: c.description,
        tool: c.tool,
        input: c.input.to_string(),
        expect,
        grants,
    })
}

/// Whether `got` matches `want`: objects on the fields `want` gives, arrays element by
/// element, numbers by value, the rest exactly.
fn matches(want: &Value, got: &Value) -> bool {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            w.iter().all(|(k, v)| g.get(k).is_some_and(|gv| matches(v, gv)))
        }
        (Value::Array(w), Value::Array(g)) => {
            w.len() == g.len() && w.iter().zip(g).all(|(w, g)| matches(w, g))
        }
        (Value::Number(w), Value::Number(g)) => w.as_f64() == g.as_f64(),
        _ => want == got,
    }
}

/// What one case gave.
struct Ran {
    name: String,
    description: Option<String>,
    tool: String,
    problem: Option<String>,
    result: Value,
    logs: Vec<String>,
    ms: f64,
}

/// `keel tool test`.
pub async fn test(service: &Harness, a: TestArgs) -> ExitCode {
    let project = match Project::at(&a.path) {
        Ok(p) => p,
        Err(why) => return fail(a.json, "input", &why, EXIT_REFUSED),
    };
    let wasm = match if a.build { project.build() } else { project.built() } {
        Ok(w) => w,
        Err(why) => return fail(a.json, "input", &why, EXIT_REFUSED),
    };
    let bytes = match std::fs::read(&wasm) {
        Ok(b) => b,
        Err(e) => {
            let why = format!("cannot read {}: {e}", wasm.display());
            return fail(a.json, "io", &why, EXIT_REFUSED);
        }
    };
    // A source written after the component: the cases would test what is not the code.
    if !a.build && project.build != Build::File {
        let built = std::fs::metadata(&wasm).and_then(|m| m.modified()).ok();
        let newer = snapshot(&project)
            .into_iter()
            .filter(|(_, (m, _))| built.is_some_and(|b| *m > b))
            .map(|(p, _)| p.strip_prefix(&project.dir).unwrap_or(&p).display().to_string())
            .next();
        if let Some(p) = newer {
            eprintln!(
                "keel: note: {p} changed after {} was built; --build builds it first",
                wasm.display()
            );
        }
    }
    let name = super::component_name(&bytes, &wasm);
    let inspected = match service.inspect_tool_file(&Caller::Operator, &bytes, &name).await {
        Ok(r) => r,
        Err(e) => return super::api_fail(a.json, &e),
    };
    if inspected.tools.is_empty() {
        let why = inspected.refusal.unwrap_or_else(|| "the component describes no tool".into());
        return fail(
            a.json,
            inspected.refusal_kind.as_deref().unwrap_or("input"),
            &why,
            EXIT_REFUSED,
        );
    }
    let cases_dir = a.cases.clone().unwrap_or_else(|| match project.build {
        Build::File => PathBuf::from("tests"),
        _ => project.dir.join("tests"),
    });
    // The examples the tools' input schemas declare, then the files' cases.
    let mut cases = Vec::new();
    for t in &inspected.tools {
        let examples = t.input_schema.get("examples").and_then(Value::as_array);
        for (i, e) in examples.into_iter().flatten().enumerate() {
            cases.push(Case {
                name: format!("{} example {}", t.name, i + 1),
                description: Some("an example its input schema declares".into()),
                tool: Some(t.name.clone()),
                input: e.to_string(),
                expect: Expect::Output(None),
                grants: Vec::new(),
            });
        }
    }
    let examples = cases.len();
    if cases_dir.is_dir() || a.cases.is_some() {
        match read_cases(&cases_dir) {
            Ok(c) => cases.extend(c),
            Err(why) => return fail(a.json, "input", &why, EXIT_REFUSED),
        }
    }
    if cases.is_empty() {
        let why = format!(
            "no cases: {} holds no *.json case and no tool's input schema has `examples`; a case is a file such as {{\"input\": {{\"text\": \"two words\"}}, \"output\": {{\"words\": 2}}}}",
            cases_dir.display()
        );
        return fail(a.json, "input", &why, EXIT_REFUSED);
    }
    let only = match inspected.tools.as_slice() {
        [one] => Some(one.name.clone()),
        _ => None,
    };
    let mut ran = Vec::new();
    for case in cases {
        let Some(tool) = case.tool.clone().or_else(|| only.clone()) else {
            let why = format!(
                "{}: the component has several tools; the case must name its `tool`",
                case.name
            );
            return fail(a.json, "input", &why, EXIT_REFUSED);
        };
        let record = inspected.tools.iter().find(|t| t.name == tool);
        let call = call_file(
            service,
            &bytes,
            &name,
            &tool,
            &case.input,
            &case.grants,
            &super::NetArgs::default(),
            &a.budget,
        )
        .await;
        let (got, logs, ms): (Result<Value, (String, String)>, Vec<String>, f64) = match call {
            Ok(o) => {
                let logs =
                    o.report.logs.iter().map(|l| format!("[{}] {}", l.level, l.message)).collect();
                let ms = o.report.duration.as_secs_f64() * 1e3;
                let got = o.report.result.map_err(|e| (e.kind().to_string(), e.to_string()));
                (got, logs, ms)
            }
            Err(e) => (Err((e.kind().to_string(), e.to_string())), Vec::new(), 0.0),
        };
        let problem = match (&case.expect, &got) {
            (Expect::Output(want), Ok(v)) => {
                let schema = record.and_then(|t| t.output_schema.as_ref());
                let invalid = schema.and_then(|s| schema_problem(s, v));
                match (invalid, want) {
                    (Some(p), _) => {
                        Some(format!("the output does not match the tool's output schema: {p}"))
                    }
                    (None, Some(w)) if !matches(w, v) => {
                        Some(format!("expected output {w}, got {v}"))
                    }
                    _ => None,
                }
            }
            (Expect::Output(_), Err((kind, msg))) => {
                Some(format!("expected an output, got error {kind}: {msg}"))
            }
            (Expect::Error { kind, .. }, Ok(v)) => {
                Some(format!("expected error {kind}, got output {v}"))
            }
            (Expect::Error { kind, message }, Err((k, m))) => {
                if !kind.is_empty() && kind != k {
                    Some(format!("expected error {kind}, got error {k}: {m}"))
                } else {
                    message.as_ref().filter(|p| !m.contains(p.as_str())).map(|part| {
                        format!("expected an error message containing {part:?}, got {k}: {m}")
                    })
                }
            }
        };
        let result = match got {
            Ok(v) => json!({"output": v}),
            Err((kind, message)) => json!({"error": {"kind": kind, "message": message}}),
        };
        let description = case.description;
        ran.push(Ran { name: case.name, description, tool, problem, result, logs, ms });
    }
    let failed = ran.iter().filter(|r| r.problem.is_some()).count();
    let digest = keel::protocol::text::sha256_hex(&bytes);
    if a.json {
        let rows: Vec<Value> = ran
            .iter()
            .map(|r| {
                json!({"name": r.name, "description": r.description, "tool": r.tool,
                       "ok": r.problem.is_none(),
                       "problem": r.problem, "result": r.result, "logs": r.logs,
                       "duration_ms": r.ms})
            })
            .collect();
        println!(
            "{}",
            json!({"ok": failed == 0, "file": wasm, "sha256": digest, "cases": rows,
                   "passed": ran.len() - failed, "failed": failed, "examples": examples})
        );
    } else {
        for r in &ran {
            let about =
                r.description.as_deref().map(|d| format!("  {}", inert(d))).unwrap_or_default();
            match &r.problem {
                None => {
                    println!("ok    {:<28} {:<16} {:>8.2} ms{about}", inert(&r.name), r.tool, r.ms)
                }
                Some(p) => {
                    println!("FAIL  {:<28} {:<16} {:>8.2} ms{about}", inert(&r.name), r.tool, r.ms);
                    println!("      {}", inert(p));
                    for l in &r.logs {
                        println!("      tool log │ {}", inert(l));
                    }
                }
            }
        }
        println!(
            "{} cases of {} (sha256:{}): {} passed, {failed} failed",
            ran.len(),
            wasm.display(),
            &digest[..12],
            ran.len() - failed
        );
    }
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(EXIT_TOOL_ERROR) }
}

/// Why `value` does not match the JSON Schema `schema` (the first problem), if it does not.
fn schema_problem(schema: &Value, value: &Value) -> Option<String> {
    match jsonschema::validator_for(schema) {
        Ok(v) => v.iter_errors(value).next().map(|e| {
            let at = e.instance_path().to_string();
            if at.is_empty() { e.to_string() } else { format!("field `{at}`: {e}") }
        }),
        Err(e) => Some(format!("the output schema cannot be compiled: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_match_on_the_fields_given_and_the_rest_exactly() {
        let got = json!({"words": 2, "characters": 9, "list": [1, 2.0]});
        assert!(matches(&json!({"words": 2}), &got));
        assert!(matches(&json!({"list": [1.0, 2]}), &got));
        assert!(!matches(&json!({"words": 3}), &got));
        assert!(!matches(&json!({"list": [1]}), &got));
        assert!(!matches(&json!({"missing": null}), &got));
        assert!(!matches(&json!("2"), &json!(2)));
    }

    #[test]
    fn a_case_file_states_one_expectation_and_its_grants_relative_to_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        std::fs::write(
            dir.path().join("a.json"),
            r#"[{"input": {}, "error": "invalid_input"}, {"input": {"x": 1}, "grants": ["data=/d:ro"]}]"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("b.json"),
            r#"{"input": {}, "error": {"kind": "failed", "message": "no"}}"#,
        )
        .unwrap();
        let cases = read_cases(dir.path()).unwrap();
        let names: Vec<_> = cases.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a#1", "a#2", "b"]);
        assert_eq!(cases[1].grants[0].guest, "/d");
        assert!(
            matches!(&cases[2].expect, Expect::Error { kind, message: Some(m) } if kind == "failed" && m == "no")
        );

        std::fs::write(dir.path().join("c.json"), r#"{"input": {}, "output": {}, "error": "x"}"#)
            .unwrap();
        assert!(read_cases(dir.path()).unwrap_err().contains("not both"));
        std::fs::write(dir.path().join("c.json"), r#"{"input": {}, "outptu": {}}"#).unwrap();
        assert!(read_cases(dir.path()).unwrap_err().contains("unknown field `outptu`"));
        std::fs::write(dir.path().join("c.json"), r#"{"input": 3}"#).unwrap();
        assert!(read_cases(dir.path()).unwrap_err().contains("must be a JSON object"));
    }

    #[test]
    fn a_change_names_the_files_written_added_and_removed() {
        let t = SystemTime::UNIX_EPOCH;
        let later = t + Duration::from_secs(5);
        let before: Snapshot =
            [(PathBuf::from("/p/a.rs"), (t, 1)), (PathBuf::from("/p/gone.rs"), (t, 1))].into();
        let after: Snapshot =
            [(PathBuf::from("/p/a.rs"), (later, 2)), (PathBuf::from("/p/new.rs"), (t, 1))].into();
        let (files, latest) = changed(&before, &after, Path::new("/p"));
        assert_eq!(files, ["a.rs", "new.rs", "gone.rs"]);
        assert_eq!(latest, Some(later));
    }
}
