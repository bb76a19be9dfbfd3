//! `keel tool …`: install, list, inspect, remove and call tool components.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use keel::api::Caller;
use keel::harness::Harness;
use keel::sandbox::{CancelToken, Grant};
use keel::tools::{CallRequest, InstallMode};
use serde_json::json;

use super::{BudgetArgs, EXIT_REFUSED, EXIT_SETUP, EXIT_TOOL_ERROR, inert, inert_block, prefixed};

#[derive(Subcommand)]
pub enum ToolCommand {
    /// Validate and install a tool component (.wasm), pinned by its sha256.
    Install(InstallArgs),
    /// List installed tools.
    List(JsonArg),
    /// Show a tool or component: description, effect, schemas, digest.
    Inspect(NameArgs),
    /// Remove an installed component (by its name or one of its tools).
    Remove(NameArgs),
    /// Run one governed call of a tool, in the sandbox, with only the granted directories.
    Call(Box<CallArgs>),
}

#[derive(Args)]
pub struct JsonArg {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct InstallArgs {
    /// The component file.
    file: PathBuf,
    /// Component name (default: the file name without `.wasm`). The names of first-party
    /// components (`fs`, `csv`) are reserved.
    #[arg(long)]
    name: Option<String>,
    /// Replace the installed component of that name. Prints the old and new digest and the
    /// tools whose description, schema or effect changed; calls of changed tools need fresh
    /// approvals.
    #[arg(long)]
    upgrade: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct NameArgs {
    /// Tool or component name.
    name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct CallArgs {
    /// Tool name (see `keel tool list`).
    name: String,
    /// Input: a JSON object matching the tool's input schema.
    #[arg(long, default_value = "{}")]
    input: String,
    /// Grant a host directory: HOST_DIR[=GUEST_PATH][:ro|:rw]. Repeatable. The guest path
    /// defaults to /NAME (the directory's name); access defaults to read-only.
    #[arg(long = "grant", value_name = "HOST_DIR[=GUEST][:ro|:rw]")]
    grants: Vec<Grant>,
    #[command(flatten)]
    net: super::NetArgs,
    #[command(flatten)]
    budget: BudgetArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn execute(home: PathBuf, cmd: ToolCommand) -> ExitCode {
    let json = match &cmd {
        ToolCommand::Install(a) => a.json,
        ToolCommand::List(a) => a.json,
        ToolCommand::Inspect(a) | ToolCommand::Remove(a) => a.json,
        ToolCommand::Call(a) => a.json,
    };
    let service = match super::run::open_harness(&home).await {
        Ok((_, h)) => h,
        Err(e) => return super::fail(json, "setup", &e, EXIT_SETUP),
    };
    match cmd {
        ToolCommand::Install(a) => install(&service, a).await,
        ToolCommand::List(a) => list(&service, a.json),
        ToolCommand::Inspect(a) => inspect(&service, a),
        ToolCommand::Remove(a) => remove(&service, a),
        ToolCommand::Call(a) => call(&service, *a).await,
    }
}

async fn install(service: &Harness, a: InstallArgs) -> ExitCode {
    let bytes = match std::fs::read(&a.file) {
        Ok(b) => b,
        Err(e) => {
            let msg = format!("cannot read {}: {e}", a.file.display());
            return super::fail(a.json, "io", &msg, EXIT_REFUSED);
        }
    };
    let name = a.name.clone().unwrap_or_else(|| {
        a.file
            .file_stem()
            .map(|s| s.to_string_lossy().replace('_', "-").to_lowercase())
            .unwrap_or_default()
    });
    eprintln!("keel: validating and compiling {} ({} bytes)…", a.file.display(), bytes.len());
    let mode = if a.upgrade { InstallMode::Upgrade } else { InstallMode::New };
    match service
        .install_tool(&Caller::Operator, &bytes, &name, &a.file.display().to_string(), mode)
        .await
    {
        Ok(r) => {
            if a.json {
                println!("{}", json!({"ok": true, "install": r}));
            } else {
                println!(
                    "installed component `{}` sha256:{} ({} bytes, compiled in {:.0} ms){}",
                    r.component.name,
                    r.component.digest,
                    r.component.size,
                    r.compile_ms,
                    r.replaced
                        .as_ref()
                        .map(|d| format!(", replacing sha256:{d}"))
                        .unwrap_or_default()
                );
                for t in &r.tools {
                    println!("  {:<20} {:<16} {}", t.name, t.effect, inert(&t.description));
                }
                if let Some(u) = &r.upgrade {
                    println!("upgraded sha256:{} -> sha256:{}", u.old_digest, u.new_digest);
                    for (what, list) in
                        [("changed", &u.changed), ("added", &u.added), ("removed", &u.removed)]
                    {
                        if !list.is_empty() {
                            println!("  {what:<8} {}", list.join(", "));
                        }
                    }
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => super::api_fail(a.json, &e),
    }
}

fn list(service: &Harness, json_out: bool) -> ExitCode {
    let tools = match service.tools(&Caller::Operator) {
        Ok(t) => t,
        Err(e) => return super::api_fail(json_out, &e),
    };
    if json_out {
        let rows: Vec<_> = tools
            .iter()
            .map(|t| {
                json!({"name": t.name, "component": t.component, "effect": t.effect,
                       "idempotent": t.idempotent, "description": t.description})
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!("{:<20} {:<10} {:<16} DESCRIPTION", "TOOL", "COMPONENT", "EFFECT");
        for t in &tools {
            println!(
                "{:<20} {:<10} {:<16} {}",
                t.name,
                t.component,
                t.effect,
                inert(&t.description)
            );
        }
    }
    ExitCode::SUCCESS
}

fn inspect(service: &Harness, a: NameArgs) -> ExitCode {
    let (component, tools) = match service.tool(&Caller::Operator, &a.name) {
        Ok(x) => x,
        Err(e) => return super::api_fail(a.json, &e),
    };
    let shown: Vec<_> =
        tools.iter().filter(|t| t.name == a.name || component.name == a.name).collect();
    if a.json {
        println!("{}", json!({"component": component, "tools": shown}));
        return ExitCode::SUCCESS;
    }
    println!(
        "component  {}{}",
        component.name,
        if component.builtin { " (first-party)" } else { "" }
    );
    println!("sha256     {}", component.digest);
    println!("size       {} bytes", component.size);
    println!("source     {}", inert(&component.source));
    for t in shown {
        println!();
        println!("tool        {}", t.name);
        println!("effect      {}{}", t.effect, if t.idempotent { ", idempotent" } else { "" });
        println!("description {}", inert(&t.description));
        println!(
            "input       {}",
            inert_block(&serde_json::to_string_pretty(&t.input_schema).unwrap_or_default())
        );
    }
    ExitCode::SUCCESS
}

fn remove(service: &Harness, a: NameArgs) -> ExitCode {
    match service.remove_tool(&Caller::Operator, &a.name) {
        Ok((component, tools)) => {
            if a.json {
                println!("{}", json!({"ok": true, "removed": component.name, "tools": tools}));
            } else {
                println!("removed component `{}` (tools: {})", component.name, tools.join(", "));
            }
            ExitCode::SUCCESS
        }
        Err(e) => super::api_fail(a.json, &e),
    }
}

async fn call(service: &Harness, a: CallArgs) -> ExitCode {
    let budget = a.budget.budget();
    let cancel = CancelToken::new();
    let on_interrupt = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_interrupt.cancel();
        }
    });
    let net = a.net.grants();
    let req = CallRequest {
        tool: &a.name,
        input: &a.input,
        grants: &a.grants,
        net: &net,
        budget,
        cancel: Some(cancel),
        loaded: None,
        policy: None,
        approval: None,
        control: None,
    };
    let outcome = match service.call_tool(&Caller::Operator, req).await {
        Ok(o) => o,
        Err(e) => return super::api_fail(a.json, &e),
    };
    let r = &outcome.report;
    if a.json {
        let (ok, output, error) = match &r.result {
            Ok(v) => (true, v.clone(), serde_json::Value::Null),
            Err(e) => (
                false,
                serde_json::Value::Null,
                json!({"kind": e.kind(), "message": e.to_string()}),
            ),
        };
        println!(
            "{}",
            json!({
                "ok": ok, "tool": outcome.tool.name, "effect": outcome.tool.effect,
                "output": output, "error": error, "changes": outcome.changes,
                "stdout": r.stdout, "stderr": r.stderr, "logs": r.logs,
                "dropped_logs": r.dropped_logs, "progress": r.progress, "fs": r.fs,
                "net": r.net.records, "net_dropped": r.net.dropped,
                "fuel_used": r.fuel_used, "memory_peak": r.memory_peak,
                "duration_ms": r.duration.as_secs_f64() * 1e3,
            })
        );
    } else {
        for (name, c) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
            if !c.text.is_empty() || c.dropped_bytes > 0 {
                eprintln!("{}", prefixed(&format!("tool {name} │ "), c.display().trim_end()));
            }
        }
        for l in &r.logs {
            eprintln!("{}", prefixed(&format!("tool log [{}] │ ", l.level), &l.message));
        }
        if r.dropped_logs > 0 {
            eprintln!("keel: {} more log records of the tool were dropped", r.dropped_logs);
        }
        if let Some(p) = &r.progress {
            let total = p.total.map(|t| format!("/{t}")).unwrap_or_default();
            eprintln!("keel: last progress {}{total}: {}", p.done, inert(&p.message));
        }
        for d in &r.fs.denied {
            eprintln!("keel: denied {}", inert(d));
        }
        for n in &r.net.records {
            eprintln!("keel: {}", inert(&super::net_line(n)));
        }
        if r.net.dropped > 0 {
            eprintln!("keel: {} more requests were not recorded", r.net.dropped);
        }
        if r.fs.denied_dropped > 0 {
            eprintln!("keel: {} more operations denied", r.fs.denied_dropped);
        }
        if r.fs.write_quota_exceeded {
            eprintln!("keel: the call's write quota was used up (write_quota_exceeded)");
        }
        if r.fs.create_limit_exceeded {
            eprintln!("keel: the call created as many files as it may (create_limit_exceeded)");
        }
        match &r.result {
            Ok(v) => {
                println!("{}", inert_block(&serde_json::to_string_pretty(v).unwrap_or_default()))
            }
            Err(e) => eprintln!("error ({}): {}", e.kind(), inert(&e.to_string())),
        }
        if let Some(ch) = &outcome.changes {
            for (what, list) in
                [("created", &ch.created), ("modified", &ch.modified), ("deleted", &ch.deleted)]
            {
                for c in list {
                    let hash = match (&c.sha256, c.hashed) {
                        (Some(h), _) => format!(" sha256:{}", &h[..16]),
                        (None, false) => " (not hashed)".to_string(),
                        (None, true) => String::new(),
                    };
                    eprintln!("{what:<8} {} ({} bytes){hash}", inert(&c.path), c.size);
                }
            }
            if !ch.complete {
                eprintln!(
                    "(change set incomplete: a workspace walk hit its bound or was cancelled)"
                );
            }
        }
        eprintln!(
            "keel: {} {} in {:.1} ms, fuel {}, memory {} KiB",
            outcome.tool.name,
            if r.result.is_ok() { "ok" } else { "failed" },
            r.duration.as_secs_f64() * 1e3,
            r.fuel_used,
            r.memory_peak / 1024
        );
    }
    if r.result.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_TOOL_ERROR) }
}
