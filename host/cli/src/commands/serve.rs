//! `keel serve` (the HTTP API and web console), `keel token` (who may use it) and `keel grant
//! preset` (the grants users may name).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Subcommand};
use keel::api::Caller;
use keel::protocol::access::Role;
use keel::protocol::sessions::Grant;
use serde_json::json;

use super::turn::open_harness;
use super::{BudgetArgs, EXIT_REFUSED, EXIT_SETUP, fail, inert};

#[derive(Args)]
pub struct ServeArgs {
    /// The address to listen on (default: `[serve] listen` in keel.toml, else 127.0.0.1:7420;
    /// port 0 picks a free port). An address other than loopback serves plain HTTP to the
    /// network: put a TLS proxy in front of it. Connections are bounded by `[serve]`
    /// header_timeout_secs (10), body_timeout_secs (60), idle_timeout_secs (60) and
    /// max_connections (1024).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// A second address serving only GET /metrics (Prometheus), without a token, for a
    /// scraper that should not hold an admin token (default: `[serve] metrics_listen`; none:
    /// /metrics is served on --listen, to an admin token only).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Model server base URL of new sessions (env KEEL_MODEL_URL; default: keel.toml).
    #[arg(long)]
    model_url: Option<String>,
    /// Model name of new sessions (env KEEL_MODEL; default: keel.toml).
    #[arg(long)]
    model: Option<String>,
    /// Model calls per turn at most of new sessions (default 24).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_steps: Option<u32>,
    /// Do not make the task-understanding call for new sessions.
    #[arg(long)]
    no_preprocess: bool,
    #[command(flatten)]
    budget: BudgetArgs,
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Make a token for the HTTP API; its secret is printed once (only its hash is kept).
    Add(TokenAddArgs),
    /// List the tokens (names and roles; never secrets).
    List(JsonArg),
    /// Revoke a token: requests and console logins that use it are refused from now on.
    Revoke(NameArgs),
}

#[derive(Args)]
pub struct TokenAddArgs {
    /// The token's name: who it is (ASCII letters, digits, `-`, `_`, `.`).
    name: String,
    /// admin: everything; user: own sessions, with no grants or a preset.
    #[arg(long, default_value = "user")]
    role: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct JsonArg {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct NameArgs {
    name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum GrantCommand {
    /// Grant presets: named sets of directories users may give their sessions over the API.
    #[command(subcommand)]
    Preset(PresetCommand),
}

#[derive(Subcommand)]
pub enum PresetCommand {
    /// Define a preset: `keel grant preset add docs /srv/docs=/docs:ro /srv/out=/out:rw`.
    Add(PresetAddArgs),
    /// List the presets.
    List(JsonArg),
    /// Remove a preset (sessions created with it keep their grants).
    Remove(NameArgs),
}

#[derive(Args)]
pub struct PresetAddArgs {
    /// The preset's name.
    name: String,
    /// Directories: HOST_DIR[=GUEST][:ro|:rw], as `keel run --grant`.
    #[arg(required = true, value_name = "DIR[=GUEST][:ro|:rw]")]
    grants: Vec<Grant>,
    /// Let the user who creates a session with this preset decide its approvals.
    #[arg(long)]
    user_decides: bool,
    /// Replace a preset of that name.
    #[arg(long)]
    replace: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn tokens(home: PathBuf, cmd: TokenCommand) -> ExitCode {
    let json = match &cmd {
        TokenCommand::Add(a) => a.json,
        TokenCommand::List(a) => a.json,
        TokenCommand::Revoke(a) => a.json,
    };
    let (_, h) = match open_harness(&home).await {
        Ok(x) => x,
        Err(e) => return fail(json, "setup", &e, EXIT_SETUP),
    };
    match cmd {
        TokenCommand::Add(a) => {
            let role: Role = match a.role.parse() {
                Ok(r) => r,
                Err(e) => return fail(a.json, "input", &format!("--role: {e}"), EXIT_REFUSED),
            };
            match h.token_add(&Caller::Operator, &a.name, role).await {
                Ok(secret) if a.json => {
                    println!(
                        "{}",
                        json!({"ok": true, "name": a.name, "role": role, "token": secret})
                    );
                    ExitCode::SUCCESS
                }
                Ok(secret) => {
                    println!("{secret}");
                    eprintln!(
                        "keel: token `{}` ({role}) made; this is the only time it is shown",
                        a.name
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => super::api_fail(a.json, &e),
            }
        }
        TokenCommand::List(a) => match h.tokens(&Caller::Operator).await {
            Ok(tokens) if a.json => {
                println!("{}", json!({"ok": true, "tokens": tokens}));
                ExitCode::SUCCESS
            }
            Ok(tokens) => {
                if tokens.is_empty() {
                    println!("no tokens: `keel token add NAME --role admin|user` makes one");
                }
                for t in tokens {
                    println!(
                        "{:<24} {:<6} made {}",
                        t.name,
                        t.role,
                        keel_server::http::console::when(t.created_at)
                    );
                }
                ExitCode::SUCCESS
            }
            Err(e) => super::api_fail(a.json, &e),
        },
        TokenCommand::Revoke(a) => match h.token_revoke(&Caller::Operator, &a.name).await {
            Ok(t) if a.json => {
                println!("{}", json!({"ok": true, "revoked": t}));
                ExitCode::SUCCESS
            }
            Ok(t) => {
                println!("revoked token `{}` ({})", t.name, t.role);
                ExitCode::SUCCESS
            }
            Err(e) => super::api_fail(a.json, &e),
        },
    }
}

pub async fn grants(home: PathBuf, cmd: GrantCommand) -> ExitCode {
    let GrantCommand::Preset(cmd) = cmd;
    let json = match &cmd {
        PresetCommand::Add(a) => a.json,
        PresetCommand::List(a) => a.json,
        PresetCommand::Remove(a) => a.json,
    };
    let (_, h) = match open_harness(&home).await {
        Ok(x) => x,
        Err(e) => return fail(json, "setup", &e, EXIT_SETUP),
    };
    let print = |p: &keel::protocol::access::Preset| {
        println!(
            "{}{}",
            p.name,
            if p.user_decides { " (its users decide their approvals)" } else { "" }
        );
        for g in &p.grants {
            println!("  {} = {} ({})", inert(&g.host.display().to_string()), g.guest, g.access);
        }
    };
    match cmd {
        PresetCommand::Add(a) => {
            match h
                .preset_add(&Caller::Operator, &a.name, a.grants, a.user_decides, a.replace)
                .await
            {
                Ok(p) if a.json => {
                    println!("{}", json!({"ok": true, "preset": p}));
                    ExitCode::SUCCESS
                }
                Ok(p) => {
                    print(&p);
                    ExitCode::SUCCESS
                }
                Err(e) => super::api_fail(a.json, &e),
            }
        }
        PresetCommand::List(a) => match h.presets(&Caller::Operator).await {
            Ok(ps) if a.json => {
                println!("{}", json!({"ok": true, "presets": ps}));
                ExitCode::SUCCESS
            }
            Ok(ps) => {
                if ps.is_empty() {
                    println!("no presets: `keel grant preset add NAME DIR[=GUEST][:ro|:rw]…`");
                }
                ps.iter().for_each(print);
                ExitCode::SUCCESS
            }
            Err(e) => super::api_fail(a.json, &e),
        },
        PresetCommand::Remove(a) => match h.preset_remove(&Caller::Operator, &a.name).await {
            Ok(p) if a.json => {
                println!("{}", json!({"ok": true, "removed": p}));
                ExitCode::SUCCESS
            }
            Ok(p) => {
                println!("removed preset `{}`", p.name);
                ExitCode::SUCCESS
            }
            Err(e) => super::api_fail(a.json, &e),
        },
    }
}

/// The admin token of this server: `KEEL_API_TOKEN` (held in memory only), else the one in
/// `HOME/api-token` (written 0600 the first time, stored hashed as `keel-serve`; on a store
/// several hosts share, as `keel-serve@HOST`, so that hosts do not replace each other's).
async fn admin_token(
    home: &keel::protocol::setup::Home,
    h: &keel::protocol::setup::Harness,
) -> Result<(Option<String>, String), String> {
    if let Some(t) = keel::protocol::setup::config::env("KEEL_API_TOKEN") {
        return Ok((Some(keel::protocol::access::token_hash(&t)), "KEEL_API_TOKEN".into()));
    }
    let path = home.root().join("api-token");
    if let Ok(text) = std::fs::read_to_string(&path)
        && h.authenticate(text.trim()).await.is_ok_and(|p| p.is_admin())
    {
        return Ok((None, path.display().to_string()));
    }
    let token = keel::protocol::access::new_token().map_err(|e| e.to_string())?;
    write_private(&path, &token).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let name = if h.shared_store() {
        format!("{}@{}", keel_server::http::HOME_TOKEN_NAME, keel::protocol::setup::host_id())
    } else {
        keel_server::http::HOME_TOKEN_NAME.to_string()
    };
    h.token_put_hashed(
        &Caller::Operator,
        &name,
        Role::Admin,
        keel::protocol::access::token_hash(&token),
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok((None, path.display().to_string()))
}

/// Writes `text` (and a line break) to a new file readable by its owner only.
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    keel::protocol::setup::write_private(path, format!("{text}\n").as_bytes())
}

pub async fn serve(home: PathBuf, a: ServeArgs) -> ExitCode {
    let (home, h) = match open_harness(&home).await {
        Ok(x) => x,
        Err(e) => return fail(false, "setup", &e, EXIT_SETUP),
    };
    let file = match keel::protocol::setup::config::read(&home) {
        Ok(f) => f,
        Err(e) => return fail(false, "config", &e.to_string(), EXIT_REFUSED),
    };
    let table = file.serve.unwrap_or_default();
    let listen = match a.listen {
        Some(l) => l,
        None => {
            let text = table.listen.as_deref().unwrap_or(keel_server::http::DEFAULT_LISTEN);
            match text.parse() {
                Ok(l) => l,
                Err(e) => {
                    let msg = format!("[serve] listen `{}`: {e}", inert(text));
                    return fail(false, "config", &msg, EXIT_REFUSED);
                }
            }
        }
    };
    let metrics_listen = match (a.metrics_listen, table.metrics_listen.as_deref()) {
        (Some(l), _) => Some(l),
        (None, None) => None,
        (None, Some(text)) => match text.parse() {
            Ok(l) => Some(l),
            Err(e) => {
                let msg = format!("[serve] metrics_listen `{}`: {e}", inert(text));
                return fail(false, "config", &msg, EXIT_REFUSED);
            }
        },
    };
    let bounds = match table.bounds() {
        Ok(b) => b,
        Err(e) => return fail(false, "config", &e, EXIT_REFUSED),
    };
    let roots = match keel::protocol::access::GrantRoots::new(&table.grant_roots) {
        Ok(r) => r,
        Err(e) => return fail(false, "config", &e.to_string(), EXIT_REFUSED),
    };
    let flags = keel::protocol::setup::ModelFlags {
        url: a.model_url.clone(),
        model: a.model.clone(),
        ..Default::default()
    };
    let (model, no_model) = match keel::protocol::setup::model_config(&home, &flags) {
        Ok(Some(m)) => (m, None),
        // Without a model the server still serves the console, approvals, sessions and
        // tools; creating a session says what to configure.
        Ok(None) => {
            let why = "no model is configured for new sessions: restart keel serve with \
                       --model-url URL --model NAME, KEEL_MODEL_URL and KEEL_MODEL, or a [model] \
                       table in keel.toml";
            eprintln!("keel: {why}; serving the console, approvals, sessions and tools meanwhile");
            let placeholder = keel::protocol::sessions::ModelConfig::new(
                keel::protocol::sessions::DEFAULT_BASE_URL,
                "-",
            );
            (placeholder, Some(why.to_string()))
        }
        Err(e) => return fail(false, e.kind(), &e.to_string(), EXIT_REFUSED),
    };
    let preprocess =
        match keel::protocol::setup::preprocess_config(&home, &model, None, a.no_preprocess) {
            Ok(p) => p,
            Err(e) => return fail(false, e.kind(), &e.to_string(), EXIT_REFUSED),
        };
    if let Some(t) = keel::protocol::setup::config::env("KEEL_API_TOKEN")
        && let Err(e) = keel::protocol::access::check_supplied_token("KEEL_API_TOKEN", &t)
    {
        return fail(false, "config", &e.to_string(), EXIT_REFUSED);
    }
    let (env_admin, token_at) = match admin_token(&home, &h).await {
        Ok(x) => x,
        Err(e) => return fail(false, "setup", &e, EXIT_SETUP),
    };
    let template = keel::api::SessionSpec {
        id: None,
        grants: Vec::new(),
        net: Default::default(),
        tools: None,
        allow: Vec::new(),
        ask: Vec::new(),
        deny: Vec::new(),
        redact: Vec::new(),
        budget: a.budget.budget(),
        model,
        system_prompt: keel::protocol::setup::DEFAULT_SYSTEM_PROMPT.to_string(),
        project_instructions: true,
        guards: keel::protocol::sessions::LoopGuards {
            max_steps: a
                .max_steps
                .unwrap_or(keel::protocol::sessions::LoopGuards::default().max_steps),
            ..Default::default()
        },
        preprocess,
        user: None,
        owner: None,
        main: None,
    };
    let options = keel_server::http::ServeOptions {
        template,
        roots,
        env_admin,
        max_upload: usize::try_from(
            keel::protocol::sessions::SandboxLimits::default().max_component_bytes,
        )
        .unwrap_or(usize::MAX),
        bounds,
        no_model,
    };
    let app = match keel_server::http::App::new(Arc::new(h), options) {
        Ok(app) => app,
        Err(e) => return fail(false, "setup", &e, EXIT_SETUP),
    };
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            return fail(false, "io", &format!("cannot listen on {listen}: {e}"), EXIT_SETUP);
        }
    };
    let bound = listener.local_addr().unwrap_or(listen);
    eprintln!("keel: serving the API at http://{bound}/api/v1 and the console at http://{bound}/");
    eprintln!("keel: admin token: {token_at}");
    if !bound.ip().is_loopback() {
        eprintln!(
            "keel: warning: {bound} is not a loopback address and this is plain HTTP: tokens and \
             cookies cross the network in clear unless a TLS proxy is in front"
        );
    }
    if let Some(at) = metrics_listen {
        let listener = match tokio::net::TcpListener::bind(at).await {
            Ok(l) => l,
            Err(e) => {
                return fail(false, "io", &format!("cannot listen on {at}: {e}"), EXIT_SETUP);
            }
        };
        let bound = listener.local_addr().unwrap_or(at);
        eprintln!("keel: serving the metrics at http://{bound}/metrics (no token)");
        if !bound.ip().is_loopback() {
            eprintln!(
                "keel: warning: {bound} is not a loopback address: anyone who can reach it reads \
                 the metrics without a token (session counts, tool and model call rates)"
            );
        }
        let router = keel_server::http::metrics_router(Arc::clone(&app));
        // One budget for both listeners: the metrics' connections count against the API's cap.
        let budget = app.budget();
        tokio::spawn(keel_server::listen::serve(listener, router, budget, std::future::pending()));
    }
    // Ctrl-C, or SIGTERM (what a service manager or a container runtime sends): the server
    // stops, and the process's last spans are exported as it exits.
    let shutdown = async {
        let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
        match term {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        eprintln!("keel: stopping");
    };
    match keel_server::http::serve(app, listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(false, "io", &e, EXIT_SETUP),
    }
}
