//! `keel doctor` — is this home set up to work: the home, its settings file and store, the
//! model server (reachable, serving the model, its template taking tools, its context), the
//! grant roots and presets, the registries' trust and bounds, the telemetry collector; each
//! line ✓ or ✗ with the fix. And `keel config` — the effective settings, and where each came
//! from: a flag, a variable, keel.toml or the default.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use keel::api::Caller;
use keel::protocol::sessions::{ModelClient, ModelConfig};
use keel::protocol::setup::config::{self, Setting};
use keel::protocol::setup::{Harness, Home, ModelFlags, ServerProbe};
use serde_json::json;

use super::{EXIT_SETUP, EXIT_TOOL_ERROR, fail, inert};

/// The model settings `keel doctor` and `keel config` take on the command line, as `keel run`
/// does.
#[derive(Args, Clone, Default)]
pub struct ModelArgs {
    /// The model's base URL to check (else KEEL_MODEL_URL, else `[model] base_url`).
    #[arg(long, value_name = "URL")]
    model_url: Option<String>,
    /// The model name to check (else KEEL_MODEL, else `[model] model`).
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// The context window to check against the server's (else KEEL_CONTEXT_WINDOW, else
    /// `[model] context_window`).
    #[arg(long, value_name = "TOKENS")]
    context_window: Option<u64>,
}

impl ModelArgs {
    fn flags(&self) -> ModelFlags {
        ModelFlags {
            url: self.model_url.clone(),
            model: self.model.clone(),
            context_window: self.context_window,
            ..ModelFlags::default()
        }
    }
}

#[derive(Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print JSON instead of text: `{"ok", "checks": [{"area", "ok", "detail", "fix"}]}`
    /// (`ok` null for a line that only informs).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Print JSON instead of text: `{"ok", "settings": [{"key", "value", "from"}]}`.
    #[arg(long)]
    json: bool,
}

/// One line of the doctor's report.
struct Check {
    area: &'static str,
    /// `Some(true)` ✓, `Some(false)` ✗ (with a fix), `None` a line that only informs.
    ok: Option<bool>,
    detail: String,
    fix: Option<String>,
}

impl Check {
    fn good(area: &'static str, detail: impl Into<String>) -> Self {
        Self { area, ok: Some(true), detail: detail.into(), fix: None }
    }

    fn bad(area: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { area, ok: Some(false), detail: detail.into(), fix: Some(fix.into()) }
    }

    fn info(area: &'static str, detail: impl Into<String>) -> Self {
        Self { area, ok: None, detail: detail.into(), fix: None }
    }
}

/// Where the home came from: `--home`, else the variable the default read.
fn home_from(flag: bool) -> &'static str {
    if flag { "--home" } else { Home::default_root_from().1 }
}

/// `keel doctor`: every check, printed; exit 1 when one failed.
pub async fn doctor(root: PathBuf, home_flag: bool, a: DoctorArgs) -> ExitCode {
    let mut checks = Vec::new();
    let home = check_home(&root, home_flag, &mut checks);
    if let Some(home) = &home {
        let harness = check_store(&root, &mut checks).await;
        let model = check_model(home, &a.model.flags(), &mut checks);
        if let Some(model) = model {
            check_server(&model, &mut checks).await;
        }
        check_grants(home, harness.as_ref(), &mut checks).await;
        check_registries(home, harness.as_ref(), &mut checks);
        check_telemetry(home, &mut checks).await;
    }
    let ok = checks.iter().all(|c| c.ok != Some(false));
    if a.json {
        let list: Vec<_> = checks
            .iter()
            .map(|c| json!({"area": c.area, "ok": c.ok, "detail": c.detail, "fix": c.fix}))
            .collect();
        println!("{}", json!({"ok": ok, "checks": list}));
    } else {
        for c in &checks {
            let mark = match c.ok {
                Some(true) => "✓",
                Some(false) => "✗",
                None => "·",
            };
            println!("{mark} {:<10} {}", c.area, inert(&c.detail));
            if let Some(fix) = &c.fix {
                println!("  {:<10} fix: {}", "", inert(fix));
            }
        }
        let failed = checks.iter().filter(|c| c.ok == Some(false)).count();
        match failed {
            0 => println!("keel is ready"),
            n => println!("{n} problem(s) to fix"),
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::from(EXIT_TOOL_ERROR) }
}

fn check_home(root: &Path, home_flag: bool, checks: &mut Vec<Check>) -> Option<Home> {
    let from = home_from(home_flag);
    let home = match Home::at(root) {
        Ok(h) => h,
        Err(e) => {
            checks.push(Check::bad(
                "home",
                format!("{} (from {from}): {e}", root.display()),
                "use a directory you own: --home DIR or KEEL_HOME",
            ));
            return None;
        }
    };
    let mode = std::fs::metadata(home.root()).map(|m| {
        use std::os::unix::fs::PermissionsExt;
        m.permissions().mode() & 0o777
    });
    match mode {
        Ok(0o700) => checks
            .push(Check::good("home", format!("{} (from {from}), private (0700)", root.display()))),
        Ok(m) => checks.push(Check::bad(
            "home",
            format!("{} is mode {m:o}: others may read the store and secrets", root.display()),
            format!("chmod 700 {}", root.display()),
        )),
        Err(e) => checks.push(Check::bad(
            "home",
            format!("{}: {e}", root.display()),
            "check the directory",
        )),
    }
    match config::read(&home) {
        Ok(_) if config::path(&home).exists() => {
            checks.push(Check::good("settings", format!("{} reads", config::path(&home).display())))
        }
        Ok(_) => checks.push(Check::info(
            "settings",
            format!(
                "no {}: settings come from flags, the environment and defaults",
                config::path(&home).display()
            ),
        )),
        Err(e) => checks.push(Check::bad(
            "settings",
            e.to_string(),
            "correct the file (the message names the key)",
        )),
    }
    Some(home)
}

async fn check_store(root: &PathBuf, checks: &mut Vec<Check>) -> Option<Harness> {
    match super::turn::open_harness(root).await {
        Ok((home, h)) => {
            let location = config::store_location(&home).map(|l| l.display()).unwrap_or_default();
            checks.push(Check::good(
                "store",
                format!("{location}, schema version {}", keel::protocol::setup::schema_version()),
            ));
            match h.tools(&Caller::Operator) {
                Ok(tools) => {
                    checks.push(Check::good("tools", format!("{} installed", tools.len())))
                }
                Err(e) => {
                    checks.push(Check::bad("tools", e.to_string(), "keel tool list says more"))
                }
            }
            Some(h)
        }
        Err(e) => {
            checks.push(Check::bad(
                "store",
                e,
                "a store of a newer keel needs that keel; a PostgreSQL store needs its server \
                 running and KEEL_DATABASE_URL or [store] url right",
            ));
            None
        }
    }
}

fn check_model(home: &Home, flags: &ModelFlags, checks: &mut Vec<Check>) -> Option<ModelConfig> {
    let (model, settings) = match keel::protocol::setup::model_settings(home, flags) {
        Ok(m) => m,
        Err(e) => {
            checks.push(Check::bad("model", e.to_string(), "correct the setting it names"));
            return None;
        }
    };
    let Some(model) = model else {
        checks.push(Check::bad(
            "model",
            "no model configured",
            "pass --model-url URL --model NAME, set KEEL_MODEL_URL and KEEL_MODEL, or add a \
             [model] table to keel.toml",
        ));
        return None;
    };
    let from = |key: &str| {
        settings.iter().find(|s| s.key == key).map(|s| s.from.clone()).unwrap_or_default()
    };
    checks.push(Check::good(
        "model",
        format!(
            "`{}` (from {}) at {} (from {})",
            model.model,
            from("model.model"),
            model.base_url,
            from("model.base_url")
        ),
    ));
    match api_key_from() {
        Some(var) => checks.push(Check::info("model", format!("API key set ({var})"))),
        None => checks
            .push(Check::info("model", "no API key (KEEL_API_KEY, OPENAI_API_KEY): none is sent")),
    }
    Some(model)
}

/// The variable the model's API key comes from, if one is set.
fn api_key_from() -> Option<&'static str> {
    ["KEEL_API_KEY", "OPENAI_API_KEY"].into_iter().find(|k| config::env(k).is_some())
}

async fn check_server(model: &ModelConfig, checks: &mut Vec<Check>) {
    let client = match ModelClient::new(ModelClient::key_from_env()) {
        Ok(c) => c,
        Err(e) => {
            checks.push(Check::bad("server", e.to_string(), "check the TLS setup of this machine"));
            return;
        }
    };
    let ServerProbe { models, props } = client.probe(model).await;
    let base = model.base_url.trim_end_matches('/');
    let served = match models {
        Ok(list) => {
            checks.push(Check::good(
                "server",
                format!("{base}/models answers: {} model(s)", list.len()),
            ));
            list
        }
        Err(e) => {
            let fix = if !base.ends_with("/v1") {
                format!(
                    "an OpenAI-compatible server serves its API under /v1: try --model-url {base}/v1"
                )
            } else if e.contains("cannot connect") {
                format!(
                    "start the model server, or point --model-url (KEEL_MODEL_URL) at it; nothing answers at {base}"
                )
            } else {
                "check the base URL and the API key".to_string()
            };
            checks.push(Check::bad("server", e, fix));
            return;
        }
    };
    let names: Vec<&str> = served.iter().map(|m| m.id.as_str()).collect();
    match (names.contains(&model.model.as_str()), props.is_some(), names.is_empty()) {
        (true, _, _) => checks.push(Check::good("server", format!("serves `{}`", model.model))),
        // llama.cpp answers with its one model, whatever the name asked.
        (false, true, _) => checks.push(Check::info(
            "server",
            format!("serves {} (llama.cpp answers any model name with it)", names.join(", ")),
        )),
        (false, false, true) => checks.push(Check::info("server", "lists no models")),
        (false, false, false) => checks.push(Check::bad(
            "server",
            format!("does not serve `{}`; it serves: {}", model.model, names.join(", ")),
            format!("--model {} (KEEL_MODEL, [model] model)", names[0]),
        )),
    }
    match props.as_ref().and_then(|p| p.tools) {
        Some(true) => checks.push(Check::good("server", "its chat template takes tools")),
        Some(false) => checks.push(Check::bad(
            "server",
            "its chat template does not take tools: the tools keel sends are dropped, and the model never calls one",
            "start llama-server with --jinja, and, for a model whose template has no tools, \
             --chat-template-file with one that has",
        )),
        None if props.is_some() => {
            checks.push(Check::info("server", "does not say whether its chat template takes tools"))
        }
        None => checks.push(Check::info(
            "server",
            "not llama.cpp (no /props): whether its template takes tools is not checked",
        )),
    }
    let server_context = props
        .as_ref()
        .and_then(|p| p.context)
        .or_else(|| served.iter().find(|m| m.id == model.model).and_then(|m| m.context));
    match (server_context, model.context_window) {
        (Some(server), Some(mine)) if mine > server => checks.push(Check::bad(
            "context",
            format!("the session window is {mine} tokens, the server's context {server}: requests past {server} are refused"),
            format!("--context-window {server} (KEEL_CONTEXT_WINDOW, [model] context_window)"),
        )),
        (Some(server), Some(mine)) => checks.push(Check::good(
            "context",
            format!("window {mine} tokens, within the server's {server}"),
        )),
        (Some(server), None) => checks.push(Check::good(
            "context",
            format!("the server's context is {server} tokens (sessions learn it from a refusal, or set [model] context_window = {server})"),
        )),
        (None, Some(mine)) => {
            checks.push(Check::info("context", format!("window {mine} tokens; the server does not say its own")))
        }
        (None, None) => checks.push(Check::info(
            "context",
            "no window set and the server does not say one: a session learns it from the first refusal",
        )),
    }
}

async fn check_grants(home: &Home, h: Option<&Harness>, checks: &mut Vec<Check>) {
    let serve = config::read(home).ok().and_then(|f| f.serve).unwrap_or_default();
    if serve.grant_roots.is_empty() {
        checks.push(Check::info(
            "grants",
            "no grant roots: admins of `keel serve` grant no directories over the API \
             ([serve] grant_roots)",
        ));
    }
    for r in &serve.grant_roots {
        match std::fs::metadata(r) {
            Ok(m) if m.is_dir() => {
                checks.push(Check::good("grants", format!("grant root {}", r.display())))
            }
            Ok(_) => checks.push(Check::bad(
                "grants",
                format!("grant root {} is not a directory", r.display()),
                "list directories in [serve] grant_roots",
            )),
            Err(e) => checks.push(Check::bad(
                "grants",
                format!("grant root {}: {e}", r.display()),
                "create it, or take it out of [serve] grant_roots",
            )),
        }
    }
    let Some(h) = h else { return };
    let Ok(presets) = h.presets(&Caller::Operator).await else { return };
    for p in presets {
        let missing: Vec<String> = p
            .grants
            .iter()
            .filter_map(|g| g.opened().err().map(|e| format!("{}: {e}", g.host.display())))
            .collect();
        if missing.is_empty() {
            checks.push(Check::good(
                "grants",
                format!("preset `{}`: {} director(ies)", p.name, p.grants.len()),
            ));
        } else {
            checks.push(Check::bad(
                "grants",
                format!("preset `{}` grants what cannot be opened: {}", p.name, missing.join(", ")),
                format!("create it, or `keel grant remove {}` and add it again", p.name),
            ));
        }
    }
}

fn check_registries(home: &Home, h: Option<&Harness>, checks: &mut Vec<Check>) {
    match config::registry_limits(home) {
        Ok(_) => {}
        Err(e) => {
            checks.push(Check::bad("registry", e.to_string(), "correct [registry] in keel.toml"))
        }
    }
    let Some(h) = h else { return };
    match h.trusted_keys(&Caller::Operator) {
        Ok(keys) if keys.is_empty() => checks.push(Check::info(
            "registry",
            "no trusted publishers: installs from a registry accept no signed component \
             (keel trust add NAME KEY --packages GLOB)",
        )),
        Ok(keys) => checks.push(Check::good(
            "registry",
            format!(
                "{} trusted publisher(s): {}",
                keys.len(),
                keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )),
        Err(e) => checks.push(Check::bad("registry", e.to_string(), "keel trust list says more")),
    }
}

async fn check_telemetry(home: &Home, checks: &mut Vec<Check>) {
    let table = config::read(home).ok().and_then(|f| f.telemetry);
    let settings = match keel_server::telemetry::settings(|k| std::env::var(k).ok(), table.as_ref())
    {
        Ok(s) => s,
        Err(e) => {
            checks.push(Check::bad("telemetry", e, "correct the endpoint it names"));
            return;
        }
    };
    let Some(s) = settings else {
        checks.push(Check::info(
            "telemetry",
            "off (no OTEL_EXPORTER_OTLP_ENDPOINT, no [telemetry] otlp_endpoint)",
        ));
        return;
    };
    let Some(addr) = host_port(&s.endpoint) else {
        checks.push(Check::bad(
            "telemetry",
            format!("{}: no host", s.endpoint),
            "give an http:// URL",
        ));
        return;
    };
    let connect =
        tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(&addr));
    match connect.await {
        Ok(Ok(_)) => checks.push(Check::good(
            "telemetry",
            format!("spans go to {} (from {}), which accepts connections", s.endpoint, s.from),
        )),
        Ok(Err(e)) => checks.push(Check::bad(
            "telemetry",
            format!("{} (from {}): cannot connect: {e}", s.endpoint, s.from),
            "start the OTLP/HTTP collector, or unset the endpoint",
        )),
        Err(_) => checks.push(Check::bad(
            "telemetry",
            format!("{} (from {}): no answer in 3 s", s.endpoint, s.from),
            "start the OTLP/HTTP collector, or unset the endpoint",
        )),
    }
}

/// `HOST:PORT` of an http(s) URL (the scheme's port when it names none).
fn host_port(url: &str) -> Option<String> {
    let (rest, port) = match url.strip_prefix("https://") {
        Some(r) => (r, 443),
        None => (url.strip_prefix("http://")?, 80),
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit('@').next()?;
    if authority.is_empty() {
        return None;
    }
    let has_port = authority.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !authority.ends_with(']');
    Some(if has_port { authority.to_string() } else { format!("{authority}:{port}") })
}

/// `keel config`: every effective setting, its value and where it came from.
pub fn show_config(root: PathBuf, home_flag: bool, a: ConfigArgs) -> ExitCode {
    let home = match Home::at(&root) {
        Ok(h) => h,
        Err(e) => return fail(a.json, "home", &format!("{}: {e}", root.display()), EXIT_SETUP),
    };
    let mut settings = vec![Setting {
        key: "home".into(),
        value: Some(root.display().to_string()),
        from: home_from(home_flag).into(),
    }];
    let mut add = |r: Result<Vec<Setting>, String>| match r {
        Ok(s) => {
            settings.extend(s);
            Ok(())
        }
        Err(e) => Err(e),
    };
    let read = config::read(&home).map_err(|e| e.to_string());
    let result = add(config::store_settings(&home).map_err(|e| e.to_string()))
        .and_then(|()| {
            add(keel::protocol::setup::model_settings(&home, &a.model.flags())
                .map(|(_, s)| s)
                .map_err(|e| e.to_string()))
        })
        .and_then(|()| {
            add(Ok(vec![credential("model.api_key", &["KEEL_API_KEY", "OPENAI_API_KEY"])]))
        })
        .and_then(|()| {
            let file = read.as_ref().map_err(Clone::clone)?;
            let user = config::env("KEEL_USER");
            let serve = file.serve.as_ref();
            let mcp = file.mcp.as_ref();
            let mut s = vec![Setting {
                key: "user".into(),
                from: if user.is_some() { "KEEL_USER" } else { "default" }.into(),
                value: Some(user.unwrap_or_else(keel::protocol::setup::default_user)),
            }];
            s.push(file_or_default(
                "serve.listen",
                "keel.toml [serve] listen",
                serve.and_then(|t| t.listen.clone()),
                keel_server::http::DEFAULT_LISTEN,
            ));
            s.push(Setting {
                key: "serve.grant_roots".into(),
                value: serve.filter(|t| !t.grant_roots.is_empty()).map(|t| {
                    t.grant_roots
                        .iter()
                        .map(|r| r.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }),
                from: if serve.is_some_and(|t| !t.grant_roots.is_empty()) {
                    "keel.toml [serve] grant_roots"
                } else {
                    "unset"
                }
                .into(),
            });
            s.push(Setting {
                key: "serve.metrics_listen".into(),
                value: serve.and_then(|t| t.metrics_listen.clone()),
                from: if serve.and_then(|t| t.metrics_listen.as_ref()).is_some() {
                    "keel.toml [serve] metrics_listen"
                } else {
                    "unset"
                }
                .into(),
            });
            let mut token = credential("mcp.token", &["KEEL_MCP_TOKEN"]);
            if token.value.is_none() && mcp.and_then(|m| m.token.as_ref()).is_some() {
                token = Setting {
                    key: token.key,
                    value: Some("set".into()),
                    from: "keel.toml [mcp] token".into(),
                };
            }
            s.push(token);
            s.push(credential("api.token", &["KEEL_API_TOKEN"]));
            let telemetry = keel_server::telemetry::settings(
                |k| std::env::var(k).ok(),
                file.telemetry.as_ref(),
            )?;
            s.push(match &telemetry {
                Some(t) => Setting {
                    key: "telemetry.endpoint".into(),
                    value: Some(t.endpoint.clone()),
                    from: t.from.into(),
                },
                None => {
                    Setting { key: "telemetry.endpoint".into(), value: None, from: "unset".into() }
                }
            });
            add(Ok(s))
        });
    if let Err(e) = result {
        return fail(a.json, "config", &e, EXIT_SETUP);
    }
    if a.json {
        println!("{}", json!({"ok": true, "settings": settings}));
    } else {
        let width = settings.iter().map(|s| s.key.len()).max().unwrap_or(0);
        for s in &settings {
            let value = s.value.as_deref().unwrap_or("-");
            println!("{:<width$}  {:<40}  {}", s.key, inert(value), s.from);
        }
    }
    ExitCode::SUCCESS
}

/// A credential's setting: `set` and the variable it comes from, never its value.
fn credential(key: &str, vars: &[&'static str]) -> Setting {
    match vars.iter().find(|v| config::env(v).is_some()) {
        Some(v) => Setting { key: key.into(), value: Some("set".into()), from: (*v).into() },
        None => Setting { key: key.into(), value: None, from: "unset".into() },
    }
}

fn file_or_default(key: &str, file_key: &str, value: Option<String>, default: &str) -> Setting {
    match value {
        Some(v) => Setting { key: key.into(), value: Some(v), from: file_key.into() },
        None => Setting { key: key.into(), value: Some(default.into()), from: "default".into() },
    }
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn a_collector_url_gives_its_host_and_port() {
        assert_eq!(host_port("http://c:4318/v1/traces").as_deref(), Some("c:4318"));
        assert_eq!(host_port("https://c/v1/traces").as_deref(), Some("c:443"));
        assert_eq!(host_port("http://[::1]/x").as_deref(), Some("[::1]:80"));
        assert_eq!(host_port("ftp://c"), None);
    }
}
