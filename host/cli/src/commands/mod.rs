//! One module per command.

pub mod approval;
pub mod author;
pub mod chat;
pub mod devloop;
pub mod doctor;
pub mod events;
pub mod mcp;
pub mod outcome;
pub mod run;
pub mod sdk;
pub mod secret;
pub mod serve;
pub mod session;
pub mod signing;
pub mod skill;
pub mod store;
pub mod style;
pub mod tool;
pub mod turn;
pub mod workgroup;

use std::time::Duration;

use clap::Args;
use keel::protocol::sessions::Budget;

/// The tool ran and returned an error (or was stopped by its budget).
pub const EXIT_TOOL_ERROR: u8 = 1;
/// The request was refused before anything ran (bad input, unknown tool, bad grant …).
pub const EXIT_REFUSED: u8 = 2;
/// keel itself could not start (home, database, engine).
pub const EXIT_SETUP: u8 = 3;

/// The one error envelope of every command: `{"ok": false, "error": {"kind", "message"}}` on
/// stdout with `--json`, else `error: MESSAGE` on stderr (made inert); returns exit `code`.
pub fn fail(json: bool, kind: &str, message: &str, code: u8) -> std::process::ExitCode {
    if json {
        println!(
            "{}",
            serde_json::json!({"ok": false, "error": {"kind": kind, "message": message}})
        );
    } else {
        eprintln!("{} {}", style::paint(style::Tone::Bad, "error:"), inert_block(message));
    }
    std::process::ExitCode::from(code)
}

/// The exit code of a refused or failed use case: a turn that could not run is
/// [`EXIT_TOOL_ERROR`]; anything refused before it ran is [`EXIT_REFUSED`].
pub fn exit_code(e: &keel::api::ApiError) -> u8 {
    match e {
        keel::api::ApiError::Run(_) => EXIT_TOOL_ERROR,
        _ => EXIT_REFUSED,
    }
}

/// Prints a refused or failed use case in the envelope and returns its exit code.
pub fn api_fail(json: bool, e: &keel::api::ApiError) -> std::process::ExitCode {
    fail(json, e.kind(), &e.to_string(), exit_code(e))
}

/// True for characters that change how a terminal shows text without being text: controls
/// (escape sequences, carriage return, backspace …), bidirectional overrides and isolates,
/// zero-width and other invisible format characters.
fn deceptive(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}'
            | '\u{17B5}' | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}' | '\u{FFF9}'..='\u{FFFB}'
            | '\u{1D173}'..='\u{1D17A}' | '\u{E0000}'..='\u{E0FFF}')
}

fn escape_into(out: &mut String, text: &str, keep_newlines: bool) {
    for c in text.chars() {
        match c {
            '\n' if keep_newlines => out.push(c),
            c if deceptive(c) => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
}

/// Renders text that keel did not write (a tool's name, description, log, error; a model's
/// call) inert for a terminal, on **one line**: every control character (newlines and ANSI
/// escapes included), bidirectional override and invisible format character is shown as an
/// escape such as `\u{1b}`.
pub fn inert(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    escape_into(&mut out, text, false);
    out
}

/// Like [`inert`] for text that is meant to span lines (an answer, a pretty-printed JSON
/// value, an error listing problems): newlines are kept, everything else is escaped.
pub fn inert_block(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    escape_into(&mut out, text, true);
    out
}

/// A session's model in a few words: `NAME at URL (window N tokens)`.
pub fn describe_model(m: &keel::protocol::sessions::ModelShown) -> String {
    let window = m.context_window.map(|w| format!(" (window {w} tokens)")).unwrap_or_default();
    format!("{} at {}{window}", inert(&m.model), inert(&m.base_url))
}

/// Milliseconds since the Unix epoch now, as the store records times.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How long ago something `ms` milliseconds old was, for a person: `just now`, `42 s ago`,
/// `5 min ago`, `3 h ago`, `12 d ago`.
pub fn ago(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..=9 => "just now".to_string(),
        10..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=86_399 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// A time the store keeps as seconds since the Unix epoch (as text), for a person:
/// `2026-12-07T06:43:12.000Z (3 h ago)`; anything else as it is.
pub fn shown_time(secs: &str) -> String {
    let Ok(t) = secs.trim().parse::<i64>() else { return inert(secs) };
    let ms = t.saturating_mul(1000);
    format!("{} ({})", keel::protocol::text::format_time(ms), ago(now_ms() - ms))
}

/// Renders what a tool wrote (its stdout, stderr or logs) inert, each line behind `prefix`,
/// so that no line of it can pass for one of keel's own.
pub fn prefixed(prefix: &str, text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(prefix);
        escape_into(&mut out, line, false);
    }
    out
}

/// The network grants shared by `keel run` and `keel tool call`.
#[derive(Args, Clone, Default)]
pub struct NetArgs {
    /// Let tools send HTTP requests to [http://]HOST[:PORT]. Repeatable. An exact host or
    /// *.DOMAIN (names below it); https only unless it says http://; the scheme's default port
    /// unless it names one. Without any, every request is refused (HTTP-request-denied).
    /// Addresses that are loopback, private, link-local or otherwise not public are refused
    /// whatever the name.
    #[arg(long = "net", value_name = "[http://]HOST[:PORT]")]
    pub net: Vec<keel::protocol::net::NetRule>,
    /// For testing against a local server only: let requests to HOST:PORT (granted with
    /// --net) reach a loopback address. Keyed on the name and the port: other names that
    /// resolve to loopback stay refused. Repeatable.
    #[arg(long = "net-allow-loopback", value_name = "HOST:PORT")]
    pub loopback: Vec<keel::protocol::net::LoopbackException>,
    /// Bind a stored secret (`keel secret set NAME`) to one destination granted with --net.
    /// keel writes it into requests to exactly that scheme, host and port — as header
    /// `authorization: Bearer VALUE` unless :header= and :format= say otherwise — and fills in
    /// the placeholder {{secret:NAME}} there only, and only in headers unless :in= names the
    /// parts it may go in (header, query — the URL — and body). The tool never holds the
    /// value; a request carrying it (plain, base64, hex or URL-encoded) to any other
    /// destination is refused, and every occurrence of it (or of a cut-off start of it) in
    /// what a call returns is replaced by [secret:NAME]. Repeatable.
    #[arg(
        long = "secret",
        value_name = "NAME@HOST[:PORT][:header=H][:in=header,query,body][:format=F]"
    )]
    pub secrets: Vec<keel::protocol::net::SecretBinding>,
    /// Bytes one call may send (request lines, headers and bodies) and receive (response
    /// bodies) over the network in all. Default: 16777216 (16 MiB).
    #[arg(long = "net-max-bytes", value_name = "BYTES")]
    pub max_bytes: Option<u64>,
    /// Requests one call may start in all; more are refused. At most 16 are in flight at
    /// once. Default: 256.
    #[arg(long = "net-max-requests", value_name = "N")]
    pub max_requests: Option<u64>,
}

impl NetArgs {
    /// Whether any network flag was given.
    pub fn given(&self) -> bool {
        !self.net.is_empty()
            || !self.loopback.is_empty()
            || !self.secrets.is_empty()
            || self.max_bytes.is_some()
            || self.max_requests.is_some()
    }

    /// The grants the flags describe (checked where they are used).
    pub fn grants(&self) -> keel::protocol::net::NetGrants {
        keel::protocol::net::NetGrants {
            allow: self.net.clone(),
            loopback: self.loopback.clone(),
            secrets: self.secrets.clone(),
            max_bytes: self.max_bytes.unwrap_or(keel::protocol::net::DEFAULT_NET_MAX_BYTES),
            max_requests: self
                .max_requests
                .unwrap_or(keel::protocol::net::DEFAULT_NET_MAX_REQUESTS),
        }
    }
}

/// One request of a call, on one line: `GET https://host:443/path → 200, 1234 bytes in 12 ms`
/// or `denied GET … : why`.
pub fn net_line(n: &keel::protocol::net::NetRecord) -> String {
    let target = format!("{} {}://{}:{}{}", n.method, n.scheme, n.host, n.port, n.path);
    match (n.outcome.as_str(), n.status) {
        ("ok", Some(status)) => format!(
            "net {target} → {status}, sent {} bytes, received {} bytes, {:.0} ms",
            n.sent, n.received, n.ms
        ),
        (outcome, _) => format!(
            "net {outcome} {target}: {}",
            n.reason.as_deref().unwrap_or("no reason recorded")
        ),
    }
}

/// The per-call budget flags shared by `keel tool call` and `keel run`.
#[derive(Args)]
pub struct BudgetArgs {
    /// Fuel per tool call (≈ WebAssembly instructions). Default 20000000000.
    #[arg(long)]
    fuel: Option<u64>,
    /// Wall-clock deadline per tool call, e.g. 500ms, 30s, 2m. Default 30s.
    #[arg(long, value_parser = keel::protocol::text::parse_duration)]
    timeout: Option<Duration>,
    /// Memory per tool call, e.g. 64MiB, 1G. Default 256MiB.
    #[arg(long, value_parser = keel::protocol::text::parse_size)]
    memory: Option<u64>,
    /// Bytes one tool call may write to its grants, growth of files included (a sparse file
    /// counts its logical size), e.g. 100MiB. Past it writes fail with `insufficient-space`.
    /// Default 1GiB.
    #[arg(long, value_parser = keel::protocol::text::parse_size)]
    write_quota: Option<u64>,
    /// Files, directories and links one tool call may create. Past it creation fails with
    /// `quota`. Default 10000.
    #[arg(long, value_name = "N")]
    max_files_created: Option<u64>,
}

impl BudgetArgs {
    /// The budget: the defaults with the given flags applied.
    pub fn budget(&self) -> Budget {
        let d = Budget::default();
        Budget {
            fuel: self.fuel.unwrap_or(d.fuel),
            timeout: self.timeout.unwrap_or(d.timeout),
            memory: self.memory.unwrap_or(d.memory),
            write_quota: self.write_quota.unwrap_or(d.write_quota),
            max_files_created: self.max_files_created.unwrap_or(d.max_files_created),
            ..d
        }
    }
}

/// The bytes of a component file and the name it is installed, inspected and called as when
/// none is given ([`component_name`]), or the error to print (exit code [`EXIT_REFUSED`]).
pub(crate) fn read_component(
    file: &std::path::Path,
    json: bool,
) -> Result<(Vec<u8>, String), std::process::ExitCode> {
    let bytes = std::fs::read(file).map_err(|e| {
        fail(json, "io", &format!("cannot read {}: {e}", file.display()), EXIT_REFUSED)
    })?;
    let name = component_name(&bytes, file);
    Ok((bytes, name))
}

/// The one rule for the name of a component file (`tool install FILE`, `tool inspect --wasm`,
/// `tool call --wasm`, `tool dev`, `tool test`): the name the component carries, else the
/// file name without a version suffix.
pub(crate) fn component_name(bytes: &[u8], file: &std::path::Path) -> String {
    let stem = file.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
    let carried = keel::protocol::tools::carried(bytes);
    keel::protocol::text::component_name_for(carried.name.as_deref(), &stem)
}

#[cfg(test)]
mod front_end {
    /// The commands reach the owner spine only through the use cases of `keel::api`: none
    /// touches SessionEngine, Brain or ToolService directly.
    #[test]
    fn commands_use_only_the_use_case_api() {
        let sources = [
            ("approval.rs", include_str!("approval.rs")),
            ("events.rs", include_str!("events.rs")),
            ("run.rs", include_str!("run.rs")),
            ("session/mod.rs", include_str!("session/mod.rs")),
            ("session/show.rs", include_str!("session/show.rs")),
            ("tool.rs", include_str!("tool.rs")),
            ("devloop.rs", include_str!("devloop.rs")),
            ("outcome.rs", include_str!("outcome.rs")),
            ("doctor.rs", include_str!("doctor.rs")),
            ("chat.rs", include_str!("chat.rs")),
            ("session/set.rs", include_str!("session/set.rs")),
            ("session/undo.rs", include_str!("session/undo.rs")),
            ("serve.rs", include_str!("serve.rs")),
            ("mod.rs", include_str!("mod.rs").split("#[cfg(test)]").next().unwrap()),
            ("main.rs", include_str!("../main.rs")),
        ];
        for (file, text) in sources {
            for owner in [
                ".engine.",
                ".brain.",
                "h.tools.",
                "harness.tools.",
                "ToolService",
                "SessionEngine",
            ] {
                assert!(!text.contains(owner), "commands/{file} reaches `{owner}` directly");
            }
        }
    }
}

#[cfg(test)]
mod times {
    #[test]
    fn epoch_seconds_read_as_dates() {
        let shown = super::shown_time("1796627920");
        assert!(shown.starts_with("2026-12-07T07:18:40.000Z ("), "{shown}");
        assert!(shown.ends_with(" ago)"), "{shown}");
        assert_eq!(super::shown_time("never"), "never");
    }
}
