//! `keel mcp …`: serve keel's governed tools over MCP, and add external MCP servers as tools.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Subcommand};
use keel::api::Caller;
use keel::protocol::sessions::Effect;
use keel::protocol::sessions::Grant;
use keel::protocol::setup::Harness;
use keel::protocol::tools::mcp::{ServerSpec, Transport};
use keel_server::mcp::ServeConfig;
use serde_json::json;

use super::{BudgetArgs, EXIT_REFUSED, EXIT_SETUP, inert, inert_block};

/// The address `--http` binds when given without one.
pub const DEFAULT_HTTP: &str = "127.0.0.1:7430";

#[derive(Subcommand)]
pub enum McpCommand {
    /// Serve keel's tools to an MCP client: on stdin/stdout (default) or over streamable HTTP
    /// (--http). Each connection is a keel session; grants, tools and policy are fixed here.
    Serve(Box<ServeArgs>),
    /// Add an external MCP server: its tools enter the catalog as NAME__TOOL, pinned by a
    /// digest of their descriptions and schemas. Stdio: `keel mcp add NAME -- COMMAND ARGS…`;
    /// HTTP: `keel mcp add NAME --url URL`.
    Add(AddArgs),
    /// List the added MCP servers.
    List(JsonOnly),
    /// Show an MCP server: transport, what it said of itself, its tools with class and digest.
    Inspect(NameJson),
    /// Remove an MCP server and its tools.
    Remove(NameJson),
    /// List a server's tools again: a changed description or schema is shown as a diff and is
    /// taken only with --accept.
    Refresh(RefreshArgs),
}

#[derive(Args)]
pub struct JsonOnly {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct NameJson {
    /// The server's name.
    name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RefreshArgs {
    /// The server's name.
    name: String,
    /// Take the server's changed tools into the catalog.
    #[arg(long)]
    accept: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct AddArgs {
    /// The server's name: lowercase letters, digits and `_` (its tools are NAME__TOOL).
    name: String,
    /// The effect class of every tool of the server (read-only, workspace-write, external,
    /// destructive). Default: external, unless --trust-annotations.
    #[arg(long, value_name = "EFFECT")]
    effect: Option<Effect>,
    /// Let the tools' annotations (readOnlyHint, destructiveHint, idempotentHint) set their
    /// effect class. They are the server's claims; without this every tool is `external`.
    #[arg(long)]
    trust_annotations: bool,
    /// When its tools join a session: `on-demand` (the default: found through tools_find /
    /// tools_select, or named with --tools) or `always` (loaded into every new session that
    /// does not name its tools).
    #[arg(long, value_name = "on-demand|always", default_value = "on-demand")]
    load: keel::protocol::tools::mcp::McpLoad,
    /// An environment variable for a stdio server, KEY=VALUE. Repeatable. The server gets
    /// these plus PATH and HOME, nothing else.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// The server's streamable HTTP endpoint (instead of a command).
    #[arg(long, conflicts_with = "command")]
    url: Option<String>,
    /// A header sent to an HTTP server, "NAME: VALUE". Repeatable.
    #[arg(long = "header", value_name = "NAME: VALUE", requires = "url")]
    headers: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// The command that runs a stdio server, and its arguments (after `--`).
    #[arg(last = true, value_name = "COMMAND ARGS")]
    command: Vec<String>,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Grant a host directory to every connection's session: HOST_DIR[=GUEST][:ro|:rw].
    /// Repeatable.
    #[arg(long = "grant", value_name = "HOST_DIR[=GUEST][:ro|:rw]")]
    grants: Vec<Grant>,
    #[command(flatten)]
    net: super::NetArgs,
    /// The tools offered, comma-separated (default: every installed tool but keel's control
    /// tools).
    #[arg(long, value_delimiter = ',')]
    tools: Vec<String>,
    /// Run a tool or effect class without asking. Repeatable.
    #[arg(long = "allow", value_name = "TOOL|EFFECT")]
    allow: Vec<String>,
    /// Ask before every call of a tool or effect class (default: destructive and external).
    /// Asking uses MCP elicitation; a client without it is refused. Repeatable.
    #[arg(long = "ask", value_name = "TOOL|EFFECT")]
    ask: Vec<String>,
    /// Deny a tool or an effect class. Repeatable.
    #[arg(long = "deny", value_name = "TOOL|EFFECT")]
    deny: Vec<String>,
    /// Redact matches of this regular expression in results. Repeatable.
    #[arg(long = "redact", value_name = "REGEX")]
    redact: Vec<String>,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (default address
    /// 127.0.0.1:7430). Any address other than loopback needs a bearer token (KEEL_MCP_TOKEN
    /// or `[mcp] token` in keel.toml, at least 16 characters); with a token set, every request
    /// must carry it. At most `[mcp] max_sessions` (64) MCP sessions are open, and
    /// `[mcp] max_sessions_per_client` (16) of one client address; one with no request in
    /// progress for `[mcp] session_idle_secs` (300) is closed (a call waiting for its
    /// elicitation answer is in progress); a foreign `Origin` is refused.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = DEFAULT_HTTP)]
    http: Option<SocketAddr>,
    /// The user the sessions work for (default: the operating-system user).
    #[arg(long)]
    user: Option<String>,
    #[command(flatten)]
    budget: BudgetArgs,
}

pub async fn execute(home: PathBuf, cmd: McpCommand) -> ExitCode {
    let json = match &cmd {
        McpCommand::Serve(_) => false,
        McpCommand::Add(a) => a.json,
        McpCommand::List(a) => a.json,
        McpCommand::Inspect(a) | McpCommand::Remove(a) => a.json,
        McpCommand::Refresh(a) => a.json,
    };
    let (home, harness) = match super::turn::open_harness(&home).await {
        Ok(x) => x,
        Err(e) => return super::fail(json, "setup", &e, EXIT_SETUP),
    };
    match cmd {
        McpCommand::Serve(a) => serve(&home, harness, *a).await,
        McpCommand::Add(a) => add(&harness, a).await,
        McpCommand::List(a) => list(&harness, a.json),
        McpCommand::Inspect(a) => inspect(&harness, a),
        McpCommand::Remove(a) => remove(&harness, a),
        McpCommand::Refresh(a) => refresh(&harness, a).await,
    }
}

fn pairs(items: &[String], sep: char, what: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in items {
        let Some((k, v)) = item.split_once(sep) else {
            return Err(format!("{what} `{item}` is not of the form NAME{sep}VALUE"));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(format!("{what} `{item}` has an empty name"));
        }
        out.insert(k.to_string(), v.trim_start().to_string());
    }
    Ok(out)
}

async fn add(harness: &Harness, a: AddArgs) -> ExitCode {
    let transport = match (&a.url, a.command.split_first()) {
        (Some(url), _) => {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                let msg = format!("--url `{url}` must start with http:// or https://");
                return super::fail(a.json, "input", &msg, EXIT_REFUSED);
            }
            match pairs(&a.headers, ':', "--header") {
                Ok(headers) => Transport::Http { url: url.clone(), headers },
                Err(e) => return super::fail(a.json, "input", &e, EXIT_REFUSED),
            }
        }
        (None, Some((command, args))) => match pairs(&a.env, '=', "--env") {
            Ok(env) => Transport::Stdio { command: command.clone(), args: args.to_vec(), env },
            Err(e) => return super::fail(a.json, "input", &e, EXIT_REFUSED),
        },
        (None, None) => {
            let msg = "say how to reach the server: `keel mcp add NAME -- COMMAND ARGS…` (stdio) \
                       or `keel mcp add NAME --url URL` (streamable HTTP)";
            return super::fail(a.json, "input", msg, EXIT_REFUSED);
        }
    };
    if !a.env.is_empty() && a.url.is_some() {
        let msg = "--env is for a stdio server (a command); an HTTP server gets --header";
        return super::fail(a.json, "input", msg, EXIT_REFUSED);
    }
    let spec = ServerSpec {
        name: a.name.clone(),
        transport,
        effect: a.effect,
        trust_annotations: a.trust_annotations,
        load: a.load,
    };
    eprintln!("keel: starting MCP server `{}` to list its tools…", inert(&a.name));
    match harness.mcp_add(&Caller::Operator, spec).await {
        Ok(offer) => {
            if a.json {
                let tools: Vec<_> = offer
                    .tools
                    .iter()
                    .map(|t| {
                        json!({"name": t.record.name, "remote": t.pinned.remote,
                        "effect": t.record.effect, "idempotent": t.record.idempotent,
                        "digest": t.pinned.digest})
                    })
                    .collect();
                println!(
                    "{}",
                    json!({"ok": true, "server": a.name, "info": offer.info, "tools": tools,
                           "skipped": offer.skipped})
                );
            } else {
                println!(
                    "added MCP server `{}` ({} {}, protocol {}) with {} tools",
                    a.name,
                    inert(&offer.info.name),
                    inert(&offer.info.version),
                    inert(&offer.info.protocol),
                    offer.tools.len()
                );
                for t in &offer.tools {
                    println!(
                        "  {:<36} {:<16} {}",
                        t.record.name,
                        t.record.effect,
                        inert(&first_line(&t.record.description))
                    );
                }
                for (name, why) in &offer.skipped {
                    println!("  skipped {}: {}", inert(name), inert(why));
                }
                println!(
                    "note: an MCP server runs with its own authority, outside keel's sandbox; \
                     keel decides whether each call is made"
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => super::api_fail(a.json, &e),
    }
}

fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(80) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_string(),
    }
}

fn list(harness: &Harness, json_out: bool) -> ExitCode {
    let servers = match harness.mcp_servers(&Caller::Operator) {
        Ok(s) => s,
        Err(e) => return super::api_fail(json_out, &e),
    };
    if json_out {
        let rows: Vec<_> = servers
            .iter()
            .map(|s| {
                json!({"name": s.spec.name, "transport": s.spec.transport.shown(),
                       "effect": s.spec.effect, "trust_annotations": s.spec.trust_annotations,
                       "load": s.spec.load, "info": s.info, "tools": s.tools.len(),
                       "added_at": s.added_at, "refreshed_at": s.refreshed_at})
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return ExitCode::SUCCESS;
    }
    if servers.is_empty() {
        println!("no MCP servers; add one with `keel mcp add NAME -- COMMAND ARGS…`");
        return ExitCode::SUCCESS;
    }
    println!("{:<16} {:<6} {:<6} {:<18} {:<10} WHERE", "SERVER", "TOOLS", "VIA", "CLASS", "LOAD");
    for s in &servers {
        let (via, at) = match &s.spec.transport {
            Transport::Stdio { command, args, .. } => {
                ("stdio", format!("{command} {}", args.join(" ")))
            }
            Transport::Http { url, .. } => ("http", url.clone()),
        };
        let class = match (s.spec.effect, s.spec.trust_annotations) {
            (Some(e), _) => e.to_string(),
            (None, true) => "annotations".to_string(),
            (None, false) => "external".to_string(),
        };
        println!(
            "{:<16} {:<6} {:<6} {:<18} {:<10} {}",
            s.spec.name,
            s.tools.len(),
            via,
            class,
            s.spec.load,
            inert(&at)
        );
    }
    ExitCode::SUCCESS
}

fn inspect(harness: &Harness, a: NameJson) -> ExitCode {
    let (server, tools) = match harness.mcp_server(&Caller::Operator, &a.name) {
        Ok(x) => x,
        Err(e) => return super::api_fail(a.json, &e),
    };
    if a.json {
        let rows: Vec<_> = tools
            .iter()
            .map(|t| {
                let pin = server.tools.iter().find(|p| p.name == t.name);
                json!({"name": t.name, "remote": pin.map(|p| &p.remote), "effect": t.effect,
                       "idempotent": t.idempotent, "description": t.description,
                       "input_schema": t.input_schema, "output_schema": t.output_schema,
                       "annotations": pin.and_then(|p| p.annotations.clone()),
                       "digest": pin.map(|p| &p.digest)})
            })
            .collect();
        println!(
            "{}",
            json!({"name": server.spec.name, "transport": server.spec.transport.shown(),
                   "effect": server.spec.effect, "trust_annotations": server.spec.trust_annotations,
                   "info": server.info, "tools": rows})
        );
        return ExitCode::SUCCESS;
    }
    println!("server     {}", server.spec.name);
    println!("transport  {}", inert(&server.spec.transport.shown().to_string()));
    println!(
        "reports    {} {} (protocol {})",
        inert(&server.info.name),
        inert(&server.info.version),
        inert(&server.info.protocol)
    );
    println!(
        "class      {}",
        match (server.spec.effect, server.spec.trust_annotations) {
            (Some(e), _) => format!("{e} (set with --effect)"),
            (None, true) => "from the tools' annotations (--trust-annotations)".into(),
            (None, false) => "external (annotations not trusted)".into(),
        }
    );
    for t in &tools {
        let pin = server.tools.iter().find(|p| p.name == t.name);
        println!();
        println!(
            "tool        {} (on the server: {})",
            t.name,
            inert(pin.map_or("?", |p| &p.remote))
        );
        println!("effect      {}{}", t.effect, if t.idempotent { ", idempotent" } else { "" });
        println!("sha256      {}", pin.map_or("?", |p| &p.digest));
        println!("description {}", inert(&t.description));
        if let Some(ann) = pin.and_then(|p| p.annotations.as_ref()) {
            println!("claims      {}", inert(&ann.to_string()));
        }
        println!(
            "input       {}",
            inert_block(&serde_json::to_string_pretty(&t.input_schema).unwrap_or_default())
        );
    }
    ExitCode::SUCCESS
}

fn remove(harness: &Harness, a: NameJson) -> ExitCode {
    match harness.mcp_remove(&Caller::Operator, &a.name) {
        Ok(tools) => {
            if a.json {
                println!("{}", json!({"ok": true, "removed": a.name, "tools": tools}));
            } else {
                println!("removed MCP server `{}` ({} tools)", a.name, tools.len());
            }
            ExitCode::SUCCESS
        }
        Err(e) => super::api_fail(a.json, &e),
    }
}

async fn refresh(harness: &Harness, a: RefreshArgs) -> ExitCode {
    let r = match harness.mcp_refresh(&Caller::Operator, &a.name, a.accept).await {
        Ok(r) => r,
        Err(e) => return super::api_fail(a.json, &e),
    };
    if a.json {
        println!("{}", json!({"ok": r.accepted, "refresh": r}));
    } else {
        if r.diff.is_empty() {
            println!("MCP server `{}`: its tools are as accepted", r.server);
        }
        for name in &r.diff.added {
            println!("+ {name} (new tool)");
        }
        for name in &r.diff.removed {
            println!("- {name} (no longer offered)");
        }
        for c in &r.diff.changed {
            println!("~ {}", c.name);
            for (field, old, new) in &c.fields {
                println!("  {field}:");
                for line in old.lines() {
                    println!("    - {}", inert(line));
                }
                for line in new.lines() {
                    println!("    + {}", inert(line));
                }
            }
        }
        for (name, why) in &r.skipped {
            println!("  skipped {}: {}", inert(name), inert(why));
        }
        match (r.diff.is_empty(), r.accepted) {
            (true, _) => {}
            (false, true) => println!("accepted: the catalog now holds the server's current tools"),
            (false, false) => eprintln!(
                "keel: nothing changed in the catalog; `keel mcp refresh {} --accept` takes these changes",
                r.server
            ),
        }
    }
    if r.accepted { ExitCode::SUCCESS } else { ExitCode::from(EXIT_REFUSED) }
}

async fn serve(home: &keel::protocol::setup::Home, harness: Harness, a: ServeArgs) -> ExitCode {
    let model = keel::protocol::setup::model_config(home, &Default::default())
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            keel::protocol::sessions::ModelConfig::new(
                keel::protocol::sessions::DEFAULT_BASE_URL,
                "default",
            )
        });
    let config = Arc::new(ServeConfig {
        id: None,
        grants: a.grants,
        net: a.net.grants(),
        tools: (!a.tools.is_empty()).then_some(a.tools),
        allow: a.allow,
        ask: a.ask,
        deny: a.deny,
        redact: a.redact,
        budget: a.budget.budget(),
        model,
        system_prompt: String::new(),
        // Its sessions run the clients' calls, not a model's: no instructions are read.
        project_instructions: false,
        guards: keel::protocol::sessions::LoopGuards::default(),
        preprocess: None,
        user: a.user,
        owner: None,
        main: None,
    });
    if let Err(e) = keel_server::mcp::KeelServer::check(&harness, &config) {
        return super::api_fail(false, &e);
    }
    let Some(addr) = a.http else {
        return match keel_server::mcp::serve_stdio(harness, config).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => super::fail(false, "mcp", &e, EXIT_SETUP),
        };
    };
    let file = match keel::protocol::setup::config::read(home) {
        Ok(f) => f,
        Err(e) => return super::fail(false, "config", &e.to_string(), EXIT_REFUSED),
    };
    let bounds = match file.serve.as_ref().map(|s| s.bounds()).unwrap_or(Ok(Default::default())) {
        Ok(b) => b,
        Err(e) => return super::fail(false, "config", &e, EXIT_REFUSED),
    };
    let limits = match file.mcp.as_ref().map(|m| m.http_limits()).unwrap_or(Ok(Default::default()))
    {
        Ok(l) => l,
        Err(e) => return super::fail(false, "config", &e, EXIT_REFUSED),
    };
    let token = match keel::protocol::setup::config::env("KEEL_MCP_TOKEN") {
        Some(t) => Some(("KEEL_MCP_TOKEN", t)),
        None => file.mcp.as_ref().and_then(|m| m.token.clone()).map(|t| ("[mcp] token", t)),
    };
    let token = match token {
        Some((source, t)) => match keel::protocol::access::check_supplied_token(source, &t) {
            Ok(()) => Some(t.trim().to_string()),
            Err(e) => return super::fail(false, "config", &e.to_string(), EXIT_REFUSED),
        },
        None => None,
    };
    if let Err(msg) = keel_server::mcp::check_exposure(addr, token.as_deref()) {
        return super::fail(false, "input", &msg, EXIT_REFUSED);
    }
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            return super::fail(false, "io", &format!("cannot listen on {addr}: {e}"), EXIT_SETUP);
        }
    };
    let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| addr.to_string());
    eprintln!(
        "keel: MCP server listening on http://{bound}/mcp{}",
        if token.is_some() { " (bearer token required)" } else { "" }
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match keel_server::mcp::serve_http(harness, config, listener, token, bounds, limits, shutdown)
        .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => super::fail(false, "mcp", &e, EXIT_SETUP),
    }
}
