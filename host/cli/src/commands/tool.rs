//! `keel tool …`: install, list, inspect, remove and call tool components.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use keel::api::Caller;
use keel::protocol::sessions::CancelToken;
use keel::protocol::setup::Harness;
use keel::protocol::tools::{CallRequest, InstallMode};
use serde_json::json;

use super::{EXIT_REFUSED, EXIT_SETUP, EXIT_TOOL_ERROR, inert, inert_block};

#[derive(Subcommand)]
pub enum ToolCommand {
    /// Validate and install a tool component (.wasm), pinned by its sha256: from a file, or
    /// from a registry (oci://REGISTRY/REPOSITORY:TAG or …@sha256:DIGEST), which requires a
    /// signature by a trusted key covering the repository (`keel trust add`).
    Install(InstallArgs),
    /// Publish a component file to a registry as a wasm OCI artifact (the layout other wasm
    /// tools read); prints the digest reference, which always names these bytes.
    Publish(PublishArgs),
    /// Check the components and skills installed from a registry by tag against what each tag
    /// names now (read from the manifest, as an install reads it). A tag that moved is never
    /// followed silently: the upgrade command printed names the digest shown
    /// (`keel tool install --upgrade REF:TAG@DIGEST`), and refuses if the tag moves again.
    Outdated(OutdatedArgs),
    /// List installed tools.
    List(JsonArg),
    /// Show a tool or component: description, effect, schemas, digest. With --wasm FILE: what
    /// install would accept or refuse of a component file, and why, without installing it.
    Inspect(InspectArgs),
    /// Remove an installed component (by its name or one of its tools).
    Remove(NameArgs),
    /// Run one governed call of a tool, in the sandbox, with only the granted directories.
    Call(Box<CallArgs>),
    /// Watch a tool project: rebuild it with its own build command on every change and call
    /// the tool again, printing its logs and output and the time from edit to output.
    Dev(Box<super::devloop::DevArgs>),
    /// Run a component's test cases under the real sandbox: the project's `tests/*.json`
    /// (input, expected output or error kind, grants) and the examples its input schemas
    /// declare.
    Test(super::devloop::TestArgs),
    /// Start a tool: a standalone project (outside any keel checkout) with a working example
    /// tool, its test, the WIT contract and the commands to build, install and call it.
    New(super::author::NewArgs),
    /// Sign a component with a signing key (`keel key new`): the signature is embedded in the
    /// file (wasmsign2's format, so other tools can verify it).
    Sign(super::signing::SignArgs),
    /// Verify a component's signature: by a given public key, or by a trusted key whose scope
    /// covers it (`keel trust`).
    Verify(super::signing::VerifyArgs),
}

#[derive(Args)]
pub struct JsonArg {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct InstallArgs {
    /// The component file, or a registry reference: oci://REGISTRY/REPOSITORY:TAG or
    /// oci://REGISTRY/REPOSITORY@sha256:DIGEST.
    #[arg(value_name = "FILE|oci://REF")]
    file: String,
    /// Component name (default: the name the component carries, else the file name without
    /// `.wasm` and a version suffix such as `-1.1.0`; from a registry, the repository's last
    /// part). The names of first-party components (`fs`, `csv`) are reserved.
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    registry: FromRegistry,
    /// Replace the installed component of that name. Prints the old and new digest and the
    /// tools whose description, schema or effect changed; calls of changed tools need fresh
    /// approvals.
    #[arg(long)]
    upgrade: bool,
    /// With --upgrade: accept a version that widens what the component can do — a tool's
    /// effect class rising, a new import of wasi:http, wasi:sockets, wasi:filesystem or
    /// keel:control, a new tool. Without it such an upgrade is refused, listing old → new.
    #[arg(long, requires = "upgrade")]
    accept_wider: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct PublishArgs {
    /// The component file (signed with `keel tool sign` for others to install it).
    file: PathBuf,
    #[command(flatten)]
    to: PublishTo,
}

/// Where and how to publish (a component or a skill).
#[derive(Args)]
pub struct PublishTo {
    /// Where to publish: oci://REGISTRY/REPOSITORY:TAG. Plain HTTP is used only for a
    /// registry on a loopback address.
    #[arg(value_name = "oci://REF")]
    pub reference: String,
    /// The secret (`keel secret set NAME`) holding the registry's credentials, as
    /// USER:PASSWORD or USER:TOKEN.
    #[arg(long, value_name = "SECRET")]
    pub auth: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// How to install from a registry (a component or a skill).
#[derive(Args)]
pub struct FromRegistry {
    /// From a registry: install even without a signature by a trusted key covering the
    /// repository. The install records it, and `keel tool list` shows it.
    #[arg(long)]
    pub allow_unsigned: bool,
    /// From a registry: the secret (`keel secret set NAME`) holding its credentials, as
    /// USER:PASSWORD or USER:TOKEN. Without it, the registry is asked anonymously.
    #[arg(long, value_name = "SECRET")]
    pub auth: Option<String>,
    /// From a registry, with --upgrade: install a version older than the installed one (a
    /// tag moved back, by its version annotation or build time). Refused without it.
    #[arg(long)]
    pub allow_downgrade: bool,
}

#[derive(Args)]
pub struct OutdatedArgs {
    /// A registry's credentials: REGISTRY=SECRET, the secret (`keel secret set NAME`)
    /// holding USER:PASSWORD. Repeat it for each registry; a credential goes only to the
    /// registry it names, and the others are asked anonymously.
    #[arg(long, value_name = "REGISTRY=SECRET", value_parser = parse_registry_auth)]
    auth: Vec<keel::api::RegistryAuth>,
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
pub struct InspectArgs {
    /// Tool or component name (not with --wasm).
    #[arg(required_unless_present = "wasm", conflicts_with = "wasm")]
    name: Option<String>,
    /// A component file to check as install would, without installing it.
    #[arg(long, value_name = "FILE")]
    wasm: Option<PathBuf>,
    /// With --wasm: the component name to check it as (default: as install names it — the
    /// name the component carries, else the file name without `.wasm` and a version suffix).
    #[arg(long = "as", value_name = "NAME", requires = "wasm")]
    as_name: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct CallArgs {
    /// Tool name (see `keel tool list`; with --wasm, a tool of that component).
    name: String,
    /// Call a tool of this component file, not installed: the checks install makes, then the
    /// sandbox, budgets and grants an installed tool gets. Nothing is installed (a tool
    /// author's loop: build, call, change, build again).
    #[arg(long, value_name = "FILE")]
    wasm: Option<PathBuf>,
    /// Input: a JSON object matching the tool's input schema; `@FILE` reads it from a file,
    /// `-` from stdin.
    #[arg(long, default_value = "{}", value_name = "JSON|@FILE|-")]
    input: String,
    #[command(flatten)]
    call: super::outcome::CallFlags,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn execute(home: PathBuf, cmd: ToolCommand) -> ExitCode {
    // Starting a project touches no keel home.
    let cmd = match cmd {
        ToolCommand::New(a) => return super::author::new(a),
        ToolCommand::Sign(a) => return super::signing::sign(&home, a),
        ToolCommand::Verify(a) => return super::signing::verify(&home, a).await,
        cmd => cmd,
    };
    let json = match &cmd {
        ToolCommand::Install(a) => a.json,
        ToolCommand::Publish(a) => a.to.json,
        ToolCommand::Outdated(a) => a.json,
        ToolCommand::List(a) => a.json,
        ToolCommand::Inspect(a) => a.json,
        ToolCommand::Remove(a) => a.json,
        ToolCommand::Call(a) => a.json,
        ToolCommand::Dev(a) => a.json,
        ToolCommand::Test(a) => a.json,
        ToolCommand::New(_) | ToolCommand::Sign(_) | ToolCommand::Verify(_) => false,
    };
    let service = match super::turn::open_harness(&home).await {
        Ok((_, h)) => h,
        Err(e) => return super::fail(json, "setup", &e, EXIT_SETUP),
    };
    match cmd {
        ToolCommand::Install(a) => install(&service, a).await,
        ToolCommand::Publish(a) => publish(&service, a).await,
        ToolCommand::Outdated(a) => outdated(&service, a).await,
        ToolCommand::List(a) => list(&service, a.json),
        ToolCommand::Inspect(a) => inspect(&service, a).await,
        ToolCommand::Remove(a) => remove(&service, a),
        ToolCommand::Call(a) => call(&service, *a).await,
        ToolCommand::Dev(a) => super::devloop::dev(&service, *a).await,
        ToolCommand::Test(a) => super::devloop::test(&service, a).await,
        ToolCommand::New(a) => super::author::new(a),
        ToolCommand::Sign(a) => super::signing::sign(&home, a),
        ToolCommand::Verify(a) => super::signing::verify(&home, a).await,
    }
}

async fn install(service: &Harness, a: InstallArgs) -> ExitCode {
    let mode = InstallMode::of(a.upgrade, a.accept_wider);
    let result = if a.file.starts_with("oci://") {
        eprintln!("keel: pulling {} …", inert(&a.file));
        let opts = keel::api::RegistryInstall {
            name: a.name.as_deref(),
            upgrade: a.upgrade,
            accept_wider: a.accept_wider,
            allow_downgrade: a.registry.allow_downgrade,
            allow_unsigned: a.registry.allow_unsigned,
            auth: a.registry.auth.as_deref(),
        };
        service.install_tool_from(&Caller::Operator, &a.file, &opts).await
    } else {
        if a.registry.allow_unsigned || a.registry.auth.is_some() || a.registry.allow_downgrade {
            let msg = "--allow-unsigned, --allow-downgrade and --auth are for oci:// references; \
                       a local file is installed as it is (signed or not)";
            return super::fail(a.json, "input", msg, EXIT_REFUSED);
        }
        let file = PathBuf::from(&a.file);
        let bytes = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) => {
                let msg = format!("cannot read {}: {e}", file.display());
                return super::fail(a.json, "io", &msg, EXIT_REFUSED);
            }
        };
        let name = a.name.clone().unwrap_or_else(|| super::component_name(&bytes, &file));
        eprintln!("keel: validating and compiling {} ({} bytes)…", file.display(), bytes.len());
        service
            .install_tool(&Caller::Operator, &bytes, &name, &file.display().to_string(), mode)
            .await
    };
    match result {
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
                if let Some(m) = &r.component.manifest_digest {
                    println!("  from     {} ({m})", inert(&r.component.source));
                    match &r.component.signer {
                        Some(s) => println!("  signer   {s}"),
                        None => println!("  signer   none: installed unsigned (--allow-unsigned)"),
                    }
                }
                for t in &r.tools {
                    println!(
                        "  {:<20} {:<16} {}",
                        t.name,
                        keel::api::shown_class(t),
                        inert(&t.description)
                    );
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
    let listed = service
        .tools(&Caller::Operator)
        .and_then(|t| Ok((t, service.components(&Caller::Operator)?)));
    let (tools, components) = match listed {
        Ok(x) => x,
        Err(e) => return super::api_fail(json_out, &e),
    };
    // Who vouches for a tool: the trusted key that signed its component, or that it was
    // installed unsigned from a registry on purpose.
    let signed = |component: &str| {
        let c = components.iter().find(|c| c.name == component);
        match c {
            Some(c) if c.unsigned_allowed => "unsigned!".to_string(),
            Some(c) if c.signer_trusted == Some(false) => "untrusted!".to_string(),
            Some(c) => c.signer.clone().unwrap_or_else(|| "-".into()),
            None => "-".into(),
        }
    };
    if json_out {
        let rows: Vec<_> = tools
            .iter()
            .map(|t| {
                let c = components.iter().find(|c| c.name == t.component);
                json!({"name": t.name, "component": t.component, "effect": t.effect,
                       "version": c.and_then(|c| c.version.clone()),
                       "control": keel::api::is_control_tool(t),
                       "idempotent": t.idempotent, "description": t.description,
                       "signer": c.and_then(|c| c.signer.clone()),
                       "signer_trusted": c.and_then(|c| c.signer_trusted),
                       "unsigned_allowed": c.is_some_and(|c| c.unsigned_allowed)})
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!(
            "{:<20} {:<10} {:<9} {:<16} {:<10} DESCRIPTION",
            "TOOL", "COMPONENT", "VERSION", "EFFECT", "SIGNER"
        );
        for t in &tools {
            let version = components
                .iter()
                .find(|c| c.name == t.component)
                .and_then(|c| c.version.as_deref())
                .unwrap_or("-");
            println!(
                "{:<20} {:<10} {:<9} {:<16} {:<10} {}",
                t.name,
                t.component,
                inert(version),
                keel::api::shown_class(t),
                inert(&signed(&t.component)),
                inert(&t.description)
            );
        }
        if components.iter().any(|c| c.unsigned_allowed) {
            println!(
                "(unsigned!: installed from a registry without a trusted signature, by --allow-unsigned)"
            );
        }
        if components.iter().any(|c| c.signer_trusted == Some(false)) {
            println!(
                "(untrusted!: its signer's trust was removed or changed since it was installed; see `keel tool inspect`)"
            );
        }
    }
    ExitCode::SUCCESS
}

async fn publish(service: &Harness, a: PublishArgs) -> ExitCode {
    let (bytes, _) = match super::read_component(&a.file, a.to.json) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if !keel::protocol::setup::signing::is_signed(&bytes) {
        eprintln!(
            "keel: note: {} is not signed; installing it from the registry will need \
             --allow-unsigned (sign it with `keel tool sign FILE --key NAME`)",
            a.file.display()
        );
    }
    eprintln!(
        "keel: publishing {} ({} bytes, file sha256:{}) to {} …",
        a.file.display(),
        bytes.len(),
        keel::protocol::text::sha256_hex(&bytes),
        inert(&a.to.reference)
    );
    let carried = keel::protocol::tools::carried(&bytes);
    let tag = a.to.reference.rsplit_once(':').map(|(_, t)| t).filter(|t| !t.contains('/'));
    match (&carried.version, tag) {
        (Some(v), Some(t)) if t != v && t.strip_prefix('v') != Some(v) && looks_like_version(t) => {
            eprintln!(
                "keel: note: the tag `{}` is not the version the component carries ({}); the manifest's version annotation says {}",
                inert(t),
                inert(v),
                inert(v)
            )
        }
        (None, _) => eprintln!(
            "keel: note: {} carries no version (a `version` section); the manifest takes the tag as its version and the time as its build time",
            a.file.display()
        ),
        _ => {}
    }
    let to = &a.to;
    let auth = to.auth.as_deref();
    published(to.json, service.publish_tool(&Caller::Operator, bytes, &to.reference, auth).await)
}

/// Whether a tag reads as a version (`1.2.0`, `v2`), not a name such as `latest`.
fn looks_like_version(tag: &str) -> bool {
    tag.strip_prefix('v').unwrap_or(tag).starts_with(|c: char| c.is_ascii_digit())
}

/// Prints what a publish did (the digest reference last, alone on its line).
pub(super) fn published(
    json_out: bool,
    result: Result<keel::protocol::tools::Pushed, keel::api::ApiError>,
) -> ExitCode {
    match result {
        Ok(p) => {
            if json_out {
                println!("{}", json!({"ok": true, "publish": p}));
            } else {
                match p.unchanged {
                    true => println!(
                        "{} already holds these bytes: nothing was pushed, the tag did not move",
                        inert(&p.reference)
                    ),
                    false => println!("published {} ({} bytes)", inert(&p.reference), p.size),
                }
                println!("manifest {}", inert(&p.digest));
                println!("{}", inert(&p.pinned));
            }
            ExitCode::SUCCESS
        }
        Err(e) => super::api_fail(json_out, &e),
    }
}

fn parse_registry_auth(s: &str) -> Result<keel::api::RegistryAuth, String> {
    s.parse()
}

async fn outdated(service: &Harness, a: OutdatedArgs) -> ExitCode {
    let rows = match service.tools_outdated(&Caller::Operator, &a.auth).await {
        Ok(r) => r,
        Err(e) => return super::api_fail(a.json, &e),
    };
    if a.json {
        println!("{}", json!({"ok": true, "components": rows}));
        return ExitCode::SUCCESS;
    }
    if rows.is_empty() {
        println!("no component or skill is installed from a registry by tag");
        return ExitCode::SUCCESS;
    }
    let short =
        |d: &str| d.strip_prefix("sha256:").unwrap_or(d).chars().take(12).collect::<String>();
    println!(
        "{:<16} {:<15} {:<9} {:<13} {:<13} REFERENCE",
        "NAME", "KIND", "VERSION", "INSTALLED", "TAG NOW"
    );
    for r in &rows {
        let now = match (&r.current, &r.error) {
            (Some(c), _) if r.outdated => format!("{} (moved)", short(c)),
            (Some(_), _) => "same".to_string(),
            (None, Some(_)) => "unknown".to_string(),
            (None, None) => "pinned".to_string(),
        };
        let kind = match r.kind {
            keel::api::OutdatedKind::Component => "component",
            keel::api::OutdatedKind::Skill => "skill",
            keel::api::OutdatedKind::SkillComponent => "skill component",
        };
        println!(
            "{:<16} {:<15} {:<9} {:<13} {:<13} {}",
            inert(&r.name),
            kind,
            inert(r.version.as_deref().unwrap_or("-")),
            short(&r.installed),
            now,
            inert(&r.reference)
        );
        if let Some(e) = &r.error {
            println!("  {}", inert(e));
        }
        if let Some(latest) = r.newer.last() {
            let shown: Vec<String> = r.newer.iter().map(|t| inert(t)).collect();
            let repo = r.reference.rsplit_once(':').map_or(r.reference.as_str(), |(p, _)| p);
            println!(
                "  newer versions: {} (keel tool install --upgrade {}:{})",
                shown.join(", "),
                inert(repo),
                inert(latest)
            );
        }
    }
    // The upgrade names the digest shown: it installs what was seen, or refuses if the tag
    // moves again first. A skill's components follow their skill.
    let mut shown = std::collections::BTreeSet::new();
    for r in &rows {
        let Some(m) = r.upgrade.as_deref() else { continue };
        let what = match r.kind {
            keel::api::OutdatedKind::Component => "tool",
            keel::api::OutdatedKind::Skill | keel::api::OutdatedKind::SkillComponent => "skill",
        };
        if shown.insert((what, m)) {
            println!("upgrade with: keel {what} install --upgrade {}", inert(m));
        }
    }
    ExitCode::SUCCESS
}

async fn inspect_file(
    service: &Harness,
    file: &Path,
    name: Option<String>,
    json: bool,
) -> ExitCode {
    let (bytes, carried_or_stem) = match super::read_component(file, json) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let name = name.unwrap_or(carried_or_stem);
    let r = match service.inspect_tool_file(&Caller::Operator, &bytes, &name).await {
        Ok(r) => r,
        Err(e) => return super::api_fail(json, &e),
    };
    if json {
        println!("{}", json!(r));
    } else {
        println!("file       {}", file.display());
        let from = if r.carried.name.as_deref() == Some(r.name.as_str()) {
            " (the name it carries)"
        } else {
            ""
        };
        println!("name       {}{from}", r.name);
        match &r.carried.version {
            Some(v) => println!("version    {}", inert(v)),
            None => println!(
                "version    none carried (a `version` section, as `keel tool new` projects write)"
            ),
        }
        println!("sha256     {}", r.digest);
        println!("size       {} bytes", r.size);
        match (&r.signer, r.signed) {
            (Some(t), _) => println!("signer     {} ({})", t.name, t.public_key),
            (None, true) => println!("signer     signed, by no trusted key covering `{}`", r.name),
            (None, false) => println!("signer     unsigned"),
        }
        match (&r.refusal, &r.refusal_kind) {
            (None, _) => println!("install    would accept it as `{}`", r.name),
            (Some(why), kind) => println!(
                "install    would refuse it ({}): {}",
                kind.as_deref().unwrap_or("refused"),
                inert(why)
            ),
        }
        if let Some(ms) = r.compile_ms {
            println!("compile    {ms:.0} ms");
        }
        println!(
            "imports    {}",
            if r.imports.is_empty() { "(none)".into() } else { r.imports.join(", ") }
        );
        if r.networked {
            println!(
                "network    imports wasi:http: its calls reach only the hosts a session grants"
            );
        }
        for t in &r.tools {
            print_tool(t);
        }
    }
    if r.accepted { ExitCode::SUCCESS } else { ExitCode::from(EXIT_REFUSED) }
}

fn print_tool(t: &keel::protocol::tools::ToolRecord) {
    println!();
    println!("tool        {}", t.name);
    let class = if keel::api::is_control_tool(t) {
        "control (steers the session: runs without a policy question)".to_string()
    } else {
        t.effect.to_string()
    };
    println!("effect      {class}{}", if t.idempotent { ", idempotent" } else { "" });
    println!("description {}", inert(&t.description));
    println!(
        "input       {}",
        inert_block(&serde_json::to_string_pretty(&t.input_schema).unwrap_or_default())
    );
    if let Some(out) = &t.output_schema {
        println!(
            "output      {}",
            inert_block(&serde_json::to_string_pretty(out).unwrap_or_default())
        );
    }
}

async fn inspect(service: &Harness, a: InspectArgs) -> ExitCode {
    if let Some(file) = &a.wasm {
        return inspect_file(service, file, a.as_name, a.json).await;
    }
    let name = a.name.unwrap_or_default();
    let (component, tools) = match service.tool(&Caller::Operator, &name) {
        Ok(x) => x,
        Err(e) => return super::api_fail(a.json, &e),
    };
    let shown: Vec<_> = tools.iter().filter(|t| t.name == name || component.name == name).collect();
    if a.json {
        println!("{}", json!({"component": component, "tools": shown}));
        return ExitCode::SUCCESS;
    }
    println!(
        "component  {}{}",
        component.name,
        if component.builtin { " (first-party)" } else { "" }
    );
    if let Some(v) = &component.version {
        println!("version    {}", inert(v));
    }
    println!("sha256     {}", component.digest);
    println!("size       {} bytes", component.size);
    println!("source     {}", inert(&component.source));
    if let Some(m) = &component.manifest_digest {
        println!("manifest   {m}");
    }
    println!("installed  {}", super::shown_time(&component.installed_at));
    match (&component.signer, &component.signer_key) {
        (Some(name), Some(key)) if component.signer_trusted == Some(false) => println!(
            "signer     {name} ({key}): NO LONGER TRUSTED (its trust was removed, given to another key, or no longer covers this package)"
        ),
        (Some(name), Some(key)) => println!("signer     {name} ({key})"),
        _ if component.unsigned_allowed => {
            println!("signer     none: installed unsigned (--allow-unsigned)")
        }
        _ => println!("signer     none"),
    }
    for t in shown {
        print_tool(t);
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
    let input = match super::outcome::read_input(&a.input) {
        Ok(text) => text,
        Err(why) => return super::fail(a.json, "invalid_input", &why, EXIT_REFUSED),
    };
    let budget = a.call.budget.budget();
    let cancel = CancelToken::new();
    let on_interrupt = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_interrupt.cancel();
        }
    });
    let net = a.call.net.grants();
    let req = CallRequest {
        tool: &a.name,
        input: &input,
        grants: &a.call.grants,
        net: &net,
        budget,
        cancel: Some(cancel),
        loaded: None,
        policy: None,
        approval: None,
        control: None,
    };
    let called = match &a.wasm {
        None => service.call_tool(&Caller::Operator, req).await,
        Some(file) => {
            let (bytes, name) = match super::read_component(file, a.json) {
                Ok(x) => x,
                Err(code) => return code,
            };
            if !a.json && !service.tool_file_compiled(&Caller::Operator, &bytes).unwrap_or(true) {
                eprintln!(
                    "keel: compiling {} ({:.1} MB) for its first call; later calls of the same bytes start from the cache",
                    file.display(),
                    bytes.len() as f64 / 1e6
                );
            }
            service.call_tool_file(&Caller::Operator, &bytes, &name, req).await
        }
    };
    let outcome = match called {
        Ok(o) => o,
        Err(e) => return super::api_fail(a.json, &e),
    };
    if a.json {
        println!("{}", super::outcome::outcome_json(&outcome));
    } else {
        super::outcome::print_outcome(&outcome);
    }
    if outcome.report.result.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_TOOL_ERROR) }
}
