//! The `keel` command: parses arguments and calls the library. Each command is one file in
//! `commands/` with an `execute()`.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod commands;

#[global_allocator]
static ALLOCATOR: keel::Allocator = keel::Allocator;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// keel: an agent harness whose every tool is a sandboxed WebAssembly component.
#[derive(Parser)]
#[command(name = "keel", version, about, long_about = None, after_help = SETTINGS)]
struct Cli {
    /// keel home directory (database, components, compiled cache).
    /// Default: $KEEL_HOME, else $XDG_DATA_HOME/keel, else ~/.local/share/keel.
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<PathBuf>,

    /// Event-level progress: every step of a turn (inputs, states, model calls, tool
    /// intents), not only the goal, tool calls, approvals and the answer.
    #[arg(short, long, global = true)]
    verbose: bool,

    #[command(subcommand)]
    command: Command,
}

/// Where settings come from, shown under `keel --help`.
const SETTINGS: &str = "\
Settings: HOME/keel.toml, tables [model] (base_url, model, temperature, max_tokens, timeout_ms,
stream, stream_usage, max_retries) and [store] (synchronous = \"full\" | \"normal\" | \"off\",
url = \"postgres://…\"); the environment overrides the file, and flags override both:
  KEEL_HOME          the keel home (as --home)
  KEEL_MODEL_URL     the model's base URL, the part before /chat/completions (as --model-url)
  KEEL_MODEL         the model name (as --model)
  KEEL_TEMPERATURE, KEEL_MAX_TOKENS, KEEL_MODEL_TIMEOUT
                     model call parameters (as --temperature, --max-tokens, --model-timeout)
  KEEL_API_KEY       the model's API key (else OPENAI_API_KEY); never stored or logged
  KEEL_USER          the user new sessions work for, whose long-term memory they recall and
                     write (as --user; default: the operating-system user)
  KEEL_API_TOKEN     an admin token of `keel serve` for this process (else it writes one to
                     HOME/api-token)
  KEEL_SYNCHRONOUS   full: every commit synced before it is reported (default); normal: synced
                     at checkpoints; off: never synced
  KEEL_DATABASE_URL  postgres://USER:PASSWORD@HOST:PORT/DB: the store is that PostgreSQL
                     database, which several `keel serve` hosts may share (as [store] url);
                     ?sslmode=require for TLS, the certificate checked against the system's
                     trust store (SSL_CERT_FILE names another)
  KEEL_HOST_ID       this host's name in runner leases (default: the kernel's host name)
  KEEL_LEASE_TTL_MS  how long a runner's lease lasts unrenewed (default 15000)
  KEEL_SIGNING_KEY   a signing key as `keel key export` wrote it, used by `tool sign --key NAME`
                     (and `skill sign`, `skill publish --key`) when the home has no key NAME
                     and it was exported under that name: for a CI job in a fresh home
  KEEL_SIGNING_KEY_PASSPHRASE
                     its passphrase; also what `keel key export` and `import` use instead of
                     asking at the terminal
  KEEL_LOG           log filter for stderr (info, debug, keel::model=debug, ...); NO_COLOR
  KEEL_LOG_FORMAT    text (default) or json: a JSON object per log line, with the spans it
                     ran in (session, turn, call), for log shippers
  OTEL_EXPORTER_OTLP_ENDPOINT
                     an OTLP/HTTP collector (http://localhost:4318): every turn, model call,
                     tool call, approval and HTTP request is exported as a span (as
                     [telemetry] otlp_endpoint; OTEL_EXPORTER_OTLP_TRACES_ENDPOINT gives the
                     traces URL itself, OTEL_SERVICE_NAME the service, OTEL_SDK_DISABLED=true
                     turns it off). Prompts and outputs are not exported unless [telemetry]
                     capture_content = true";

#[derive(Subcommand)]
enum Command {
    /// Run a task: create (or continue, with --session) a session and run its turn.
    Run(Box<commands::run::RunArgs>),
    /// Chat in a session kept open: streamed answers, approvals asked in place.
    ///
    /// Each line is the session's next input; answers stream as they are written, with the
    /// tool calls between. A call that needs approval is asked about in place: y approves it
    /// once, a approves it and allows the tool for the rest of the session (under the call's
    /// directory; `keel session policy ID --ask TOOL` undoes it), n rejects it with a reason
    /// the model is told, d shows the full diff and input, s
    /// leaves it for `keel approve` or the console. Slash commands: /help. Ctrl-C interrupts
    /// a turn, Ctrl-D leaves; the session stays (`keel chat --session ID` goes on).
    Chat(Box<commands::chat::ChatArgs>),
    /// Inspect and steer sessions.
    #[command(subcommand)]
    Session(commands::session::SessionCommand),
    /// Install, inspect, remove and call tool components.
    #[command(subcommand)]
    Tool(commands::tool::ToolCommand),
    /// Install, list, inspect and remove skills: methods sessions find and load on demand.
    #[command(subcommand)]
    Skill(commands::skill::SkillCommand),
    /// A user's long-term memory: what sessions of that user recall.
    #[command(subcommand)]
    Memory(commands::skill::MemoryCommand),
    /// Workgroups: a main session (`keel run --main`) and the sub-sessions it delegated to.
    #[command(subcommand)]
    Workgroup(commands::workgroup::WorkgroupCommand),
    /// List the calls waiting for a person's approval: what exactly would run, and what it may
    /// touch.
    Approvals(commands::approval::ApprovalsArgs),
    /// Approve a waiting call, then resume its session's turn in the foreground.
    Approve(commands::approval::DecideArgs),
    /// Reject a waiting call (the model is told), then resume its session's turn.
    Reject(commands::approval::DecideArgs),
    /// Recover sessions left by a process that stopped uncleanly, and resume their turns.
    Recover(commands::approval::RecoverArgs),
    /// MCP both ways: serve keel's governed tools to MCP clients, and add external MCP
    /// servers as governed tools.
    #[command(subcommand)]
    Mcp(commands::mcp::McpCommand),
    /// Serve the HTTP API (/api/v1) and the web console (/) on 127.0.0.1:7420.
    Serve(Box<commands::serve::ServeArgs>),
    /// Tokens for the HTTP API and console, each with a role (admin or user).
    #[command(subcommand)]
    Token(commands::serve::TokenCommand),
    /// The secrets broker: credentials keel writes into tools' HTTP requests on the wire
    /// (`--secret NAME@HOST`), which tools, logs, the database and the model never see.
    #[command(subcommand)]
    Secret(commands::secret::SecretCommand),
    /// Grant presets: named directory grants users may give their sessions over the API.
    #[command(subcommand)]
    Grant(commands::serve::GrantCommand),
    /// Signing keys for tool components: make one, list them with their public keys.
    #[command(subcommand)]
    Key(commands::signing::KeyCommand),
    /// The publishers whose signatures installs from a registry accept: their public keys,
    /// each for the packages a glob matches.
    #[command(subcommand)]
    Trust(commands::signing::TrustCommand),
    /// The store: where it is, and copying a home's SQLite store into PostgreSQL for
    /// several hosts.
    #[command(subcommand)]
    Store(commands::store::StoreCommand),
    /// Check this home's setup: the home and its store, the model server (reachable, serving
    /// the model, a chat template that takes tools, its context), grants, registries and
    /// telemetry — each line ✓ or ✗ with the fix. Exit 1 when something is to fix.
    Doctor(commands::doctor::DoctorArgs),
    /// Print the effective settings and where each came from: a flag, an environment
    /// variable, keel.toml or the default (credentials only as set or unset).
    Config(commands::doctor::ConfigArgs),
    /// Print the WIT contract a tool component implements (`keel:tool`), for any toolchain's
    /// bindings generator.
    Wit(commands::author::WitArgs),
}

/// Exit code of a command whose reader went away (a closed pipe: `keel … | head`), as a
/// shell reports a process ended by SIGPIPE.
const EXIT_BROKEN_PIPE: i32 = 141;

/// A reader that closed its end of the pipe ends the command quietly, as it ends any Unix
/// tool: printing to a closed stdout is not a crash of keel.
fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(EXIT_BROKEN_PIPE);
        }
        default(info)
    }));
}

/// Libraries whose own debug and trace records carry what a guest passed them (wasmtime
/// traces a call's string arguments; the HTTP stack, request bytes). Their records are kept
/// at `warn` and above whatever `KEEL_LOG` says, so no log shows a tool's data or a secret.
const GUEST_DATA_TARGETS: &[&str] = &[
    "wasmtime",
    "wasmtime_wasi",
    "wasmtime_wasi_http",
    "wasmtime_environ",
    "cranelift_codegen",
    "cranelift_frontend",
    "hyper",
    "hyper_util",
    "h2",
    "rustls",
];

/// `KEEL_LOG` (default `warn,rmcp=error`), with [`GUEST_DATA_TARGETS`] capped at `warn`.
fn log_filter() -> tracing_subscriber::EnvFilter {
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("KEEL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rmcp=error"));
    for target in GUEST_DATA_TARGETS {
        if let Ok(d) = format!("{target}=warn").parse() {
            filter = filter.add_directive(d);
        }
    }
    filter
}

/// How log lines are written (`KEEL_LOG_FORMAT`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    /// For a person: one line of text each, the spans it ran in first (the default).
    Text,
    /// For log shippers: a JSON object per line, with the event's fields, its span's and the
    /// list of spans it ran in (session, turn, call).
    Json,
}

fn log_format() -> Result<LogFormat, String> {
    match std::env::var("KEEL_LOG_FORMAT").ok().as_deref().map(str::trim) {
        None | Some("" | "text") => Ok(LogFormat::Text),
        Some("json") => Ok(LogFormat::Json),
        Some(other) => Err(format!(
            "KEEL_LOG_FORMAT: `{other}` is not a log format: use `text` (the default) or `json`"
        )),
    }
}

fn main() -> ExitCode {
    // Credentials in the environment are read into memory and taken out of it, before any
    // thread starts: no child process inherits them and /proc/PID/environ does not show them.
    keel::protocol::setup::config::take_secret_env();
    quiet_broken_pipe();
    // Colours only for a person at a terminal: stderr piped to a file or a script gets plain
    // text, and `NO_COLOR` turns them off anywhere.
    let colour = commands::style::colour_for_stderr();
    let format = match log_format() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(commands::EXIT_SETUP);
        }
    };
    let cli = Cli::parse();
    // A short-lived process gains nothing from huge pages and pays for them: the allocator
    // asks for them on its arenas, and each thread's first touch of one made the kernel zero
    // 2 MiB — half of a `keel session send`'s CPU time. Only the long-lived host keeps them.
    if !matches!(cli.command, Command::Serve(_)) {
        let _ = rustix::thread::disable_transparent_huge_pages(true);
    }
    commands::style::init(cli.verbose, colour);
    let home_flag = cli.home.is_some();
    let home = cli.home.unwrap_or_else(keel::protocol::setup::Home::default_root);
    // Traces, when a collector is configured: the environment, else `[telemetry]` in the
    // home's keel.toml (a file that does not read is reported by the command that reads it).
    let table = keel::protocol::setup::Home::at(&home)
        .ok()
        .filter(|h| keel::protocol::setup::config::path(h).exists())
        .and_then(|h| keel::protocol::setup::config::read(&h).ok())
        .and_then(|f| f.telemetry);
    let traces = match keel_server::telemetry::settings(|k| std::env::var(k).ok(), table.as_ref())
        .and_then(|s| s.map(|s| keel_server::telemetry::start(&s)).transpose())
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(commands::EXIT_SETUP);
        }
    };
    let (bridge, exporter) = traces.unzip();
    let bridge = bridge.map(|b| {
        use tracing_subscriber::Layer;
        let keel_spans = tracing_subscriber::filter::Targets::new()
            .with_target("keel", tracing::Level::INFO)
            .with_target("keel_server", tracing::Level::INFO);
        b.with_filter(keel_spans)
    });
    {
        use tracing_subscriber::Layer;
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
        let logs = match format {
            LogFormat::Text => logs.with_ansi(colour).with_filter(log_filter()).boxed(),
            LogFormat::Json => logs
                .json()
                .with_current_span(true)
                .with_span_list(true)
                .flatten_event(true)
                .with_filter(log_filter())
                .boxed(),
        };
        tracing_subscriber::registry().with(logs).with(bridge).init();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(commands::EXIT_SETUP);
        }
    };
    // A one-shot command is one trace: its span is the root of everything it does (the task
    // understanding, the turn, its model and tool calls). The long-lived front-ends (`serve`,
    // `mcp serve`, `chat`) start a trace per request or input instead.
    let root = |name: &'static str| tracing::info_span!("command", otel.name = name);
    let code = runtime.block_on(async {
        use tracing::Instrument;
        match cli.command {
            Command::Tool(cmd) => commands::tool::execute(home, cmd).await,
            Command::Mcp(cmd) => commands::mcp::execute(home, cmd).await,
            Command::Serve(args) => commands::serve::serve(home, *args).await,
            Command::Token(cmd) => commands::serve::tokens(home, cmd).await,
            Command::Grant(cmd) => commands::serve::grants(home, cmd).await,
            Command::Secret(cmd) => commands::secret::execute(home, cmd),
            Command::Wit(args) => commands::author::wit(args),
            Command::Doctor(args) => commands::doctor::doctor(home, home_flag, args).await,
            Command::Config(args) => commands::doctor::show_config(home, home_flag, args),
            Command::Store(cmd) => commands::store::execute(home, cmd).await,
            Command::Key(cmd) => commands::signing::keys(&home, cmd),
            Command::Trust(cmd) => commands::signing::trust(&home, cmd).await,
            Command::Skill(cmd) => commands::skill::execute(home, cmd).await,
            Command::Memory(cmd) => commands::skill::memory(home, cmd).await,
            Command::Run(args) => {
                commands::run::execute(home, *args).instrument(root("keel run")).await
            }
            Command::Chat(args) => commands::chat::execute(home, *args).await,
            Command::Session(cmd) => {
                commands::session::execute(home, cmd).instrument(root("keel session")).await
            }
            Command::Workgroup(cmd) => {
                commands::workgroup::execute(home, cmd).instrument(root("keel workgroup")).await
            }
            Command::Approvals(args) => commands::approval::list(home, args).await,
            Command::Approve(args) => {
                commands::approval::decide(home, args, keel::protocol::sessions::Decision::Approve)
                    .instrument(root("keel approve"))
                    .await
            }
            Command::Reject(args) => {
                commands::approval::decide(home, args, keel::protocol::sessions::Decision::Reject)
                    .instrument(root("keel reject"))
                    .await
            }
            Command::Recover(args) => {
                commands::approval::recover(home, args).instrument(root("keel recover")).await
            }
        }
    });
    // The runtime's tasks end first; then the last spans are sent.
    drop(runtime);
    if let Some(e) = exporter {
        e.shutdown();
    }
    code
}

/// The command lines of the README and the guides, checked against the real argument parser:
/// a renamed command or flag fails here before a reader finds it.
#[cfg(test)]
mod doc_check {
    use super::Cli;
    use clap::Parser;

    /// Words of a shell line, quotes removed (enough for the docs' command lines).
    fn words(line: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut word = String::new();
        let mut quote: Option<char> = None;
        let mut any = false;
        for c in line.chars() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), c) => word.push(c),
                (None, '\'' | '"') => {
                    quote = Some(c);
                    any = true;
                }
                (None, c) if c.is_whitespace() => {
                    if any || !word.is_empty() {
                        out.push(std::mem::take(&mut word));
                    }
                    any = false;
                }
                (None, c) => word.push(c),
            }
        }
        if any || !word.is_empty() {
            out.push(word);
        }
        out
    }

    /// The `keel …` commands of the `sh` blocks of a Markdown text: continuation lines joined,
    /// comments, pipes and redirections cut off.
    fn commands(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut in_sh = false;
        let mut pending = String::new();
        for line in text.lines() {
            let t = line.trim();
            if t.starts_with("```") {
                in_sh = !in_sh && (t == "```sh" || t == "```bash" || t == "```shell");
                pending.clear();
                continue;
            }
            if !in_sh {
                continue;
            }
            if let Some(head) = t.strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            let full = format!("{pending}{t}");
            pending.clear();
            let cmd = full
                .strip_prefix("cargo run --release -- ")
                .map(|rest| format!("keel {rest}"))
                .unwrap_or(full);
            if let Some(dir) = cmd.strip_prefix("mkdir -p ") {
                // A directory the next commands grant.
                let _ = std::fs::create_dir_all(dir.trim());
                continue;
            }
            if !cmd.starts_with("keel ") {
                continue;
            }
            // Up to a comment, a pipe, a redirection or the next command.
            let mut cut = cmd.len();
            let mut quote: Option<char> = None;
            for (i, c) in cmd.char_indices() {
                match (quote, c) {
                    (Some(q), c) if c == q => quote = None,
                    (Some(_), _) => {}
                    (None, '\'' | '"') => quote = Some(c),
                    (None, '#' | '|' | '>' | ';' | '&') => {
                        cut = i;
                        break;
                    }
                    _ => {}
                }
            }
            let cmd = cmd[..cut].trim();
            // A synopsis (`keel mcp list [--json]`) is not a command to copy.
            if !words(cmd).iter().any(|w| w.starts_with('[')) {
                out.push(cmd.to_string());
            }
        }
        out
    }

    #[test]
    fn every_keel_command_in_the_docs_parses() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        // Relative paths in the docs (`--grant tests/data=/data:ro`) are the repository's.
        std::env::set_current_dir(&root).unwrap();
        let mut files = vec![root.join("README.md")];
        for entry in std::fs::read_dir(root.join("docs")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
        let mut checked = 0;
        let mut failures = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            for cmd in commands(&text) {
                checked += 1;
                let parsed = Cli::try_parse_from(words(&cmd));
                if let Err(e) = parsed.as_ref().map(|_| ())
                    && !matches!(
                        e.kind(),
                        clap::error::ErrorKind::DisplayHelp
                            | clap::error::ErrorKind::DisplayVersion
                    )
                {
                    let first = e.to_string().lines().next().unwrap_or_default().to_string();
                    failures.push(format!("{}: `{cmd}`: {first}", file.display()));
                }
            }
        }
        assert!(checked >= 40, "only {checked} commands found: the extraction is broken");
        assert!(failures.is_empty(), "{} of {checked}:\n{}", failures.len(), failures.join("\n"));
    }

    #[test]
    fn the_extraction_reads_continuations_comments_and_quotes() {
        let md = "```sh\nkeel run 'a # b' \\\n  --grant x=/y:ro   # note\necho keel run\ncargo run --release -- tool list | head\nkeel mcp list [--json]\n```\nkeel run outside\n";
        let cmds = commands(md);
        assert_eq!(cmds, ["keel run 'a # b'  --grant x=/y:ro", "keel tool list"]);
        assert_eq!(words(&cmds[0]), ["keel", "run", "a # b", "--grant", "x=/y:ro"]);
    }
}
