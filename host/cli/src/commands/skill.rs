//! `keel skill …` and `keel memory …`: install, list, inspect and remove skills; list, add and
//! remove a user's long-term memories. Skill and memory text is shown inert on terminals.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use keel::api::Caller;
use keel::protocol::setup::Harness;
use serde_json::json;

use super::{EXIT_SETUP, inert, inert_block};

#[derive(Subcommand)]
pub enum SkillCommand {
    /// Check and install a skill: a directory holding SKILL.md (YAML front matter with `name`
    /// and `description`, then the method), with optional reference files and tool components
    /// (*.wasm, installed as tools). A skill grants nothing: its text is shown to the model,
    /// its tools follow each session's grants and policy. From a registry
    /// (oci://REGISTRY/REPOSITORY:TAG or …@sha256:DIGEST), the bundle needs a signature by a
    /// trusted key covering the repository (`keel skill publish --key`, `keel skill sign`),
    /// checked before any file is fetched, and so does each component it bundles.
    Install(SkillInstallArgs),
    /// Publish a skill directory to a registry (oci://REGISTRY/REPOSITORY:TAG), one layer per
    /// file, signed with --key; prints the digest reference.
    Publish(SkillPublishArgs),
    /// Sign a skill bundle already in a registry (by tag or digest) with a signing key: a
    /// detached signature over its manifest digest, kept beside it in its repository (tag
    /// sha256-HEX.keel-sig).
    Sign(SkillSignArgs),
    /// List the installed skills.
    List(SkillJson),
    /// Show a skill: description, digest, files, bundled tools and its method (--body).
    Inspect(SkillInspectArgs),
    /// Remove an installed skill (sessions that loaded it keep their version; its components
    /// stay installed as tools).
    Remove(SkillNameArgs),
}

#[derive(Args)]
pub struct SkillJson {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct SkillInstallArgs {
    /// The skill directory, its SKILL.md alone, or a registry reference (oci://…).
    #[arg(value_name = "DIR|oci://REF")]
    path: String,
    #[command(flatten)]
    registry: super::tool::FromRegistry,
    /// Replace an installed skill of the same name (and upgrade the components it bundles).
    #[arg(long)]
    upgrade: bool,
    /// With --upgrade: accept bundled components that widen what they can do (see `keel tool
    /// install --help`).
    #[arg(long, requires = "upgrade")]
    accept_wider: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct SkillPublishArgs {
    /// The skill directory (checked as install checks it).
    dir: PathBuf,
    #[command(flatten)]
    to: super::tool::PublishTo,
    /// Sign the published bundle with this signing key (`keel key new`); admins who trust
    /// its public key for the repository can then install it without --allow-unsigned.
    #[arg(long, value_name = "NAME")]
    key: Option<String>,
}

#[derive(Args)]
pub struct SkillSignArgs {
    /// The bundle: oci://REGISTRY/REPOSITORY:TAG or …@sha256:DIGEST.
    #[arg(value_name = "oci://REF")]
    reference: String,
    /// The signing key (`keel key list`).
    #[arg(long, value_name = "NAME")]
    key: String,
    /// The secret holding the registry's credentials (USER:PASSWORD), sent only to it.
    #[arg(long, value_name = "SECRET")]
    auth: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct SkillInspectArgs {
    /// Skill name.
    name: String,
    /// Print the whole method (the body of SKILL.md) too.
    #[arg(long)]
    body: bool,
    /// Print JSON instead of text (the body included).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct SkillNameArgs {
    /// Skill name.
    name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
pub enum MemoryCommand {
    /// List a user's memories (every user's with --all-users).
    List(MemoryListArgs),
    /// Remember a fact for a user; sessions of that user recall it when a task's terms match.
    Add(MemoryAddArgs),
    /// Remove one of a user's memories by its id.
    Remove(MemoryRemoveArgs),
}

#[derive(Args)]
pub struct UserArg {
    /// The user (env KEEL_USER; default: the operating-system user): a local user, or an API
    /// token's memories as token:NAME.
    #[arg(long, value_name = "NAME", env = "KEEL_USER")]
    user: Option<String>,
}

impl UserArg {
    /// The principal: `local:NAME` (a name typed `token:NAME` names an API token's).
    fn user(&self) -> String {
        let name = self.user.clone().unwrap_or_else(keel::protocol::setup::default_user);
        keel::protocol::setup::typed_user(&name, keel::protocol::setup::UserKind::Local)
    }
}

#[derive(Args)]
pub struct MemoryListArgs {
    #[command(flatten)]
    user: UserArg,
    /// Every user's memories.
    #[arg(long, conflicts_with = "user")]
    all_users: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct MemoryAddArgs {
    /// The fact, in one or two self-contained sentences (at most 2,000 characters).
    text: String,
    /// A tag (repeatable, at most 8).
    #[arg(long = "tag", value_name = "TAG")]
    tags: Vec<String>,
    #[command(flatten)]
    user: UserArg,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct MemoryRemoveArgs {
    /// The memory's id (see `keel memory list`).
    id: i64,
    #[command(flatten)]
    user: UserArg,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn execute(home: PathBuf, cmd: SkillCommand) -> ExitCode {
    let json = match &cmd {
        SkillCommand::Install(a) => a.json,
        SkillCommand::Publish(a) => a.to.json,
        SkillCommand::Sign(a) => a.json,
        SkillCommand::List(a) => a.json,
        SkillCommand::Inspect(a) => a.json,
        SkillCommand::Remove(a) => a.json,
    };
    let h = match super::turn::open_harness(&home).await {
        Ok((_, h)) => h,
        Err(e) => return super::fail(json, "setup", &e, EXIT_SETUP),
    };
    match cmd {
        SkillCommand::Install(a) => install(&h, a).await,
        SkillCommand::Publish(a) => publish(&h, a).await,
        SkillCommand::Sign(a) => sign(&h, a).await,
        SkillCommand::List(a) => list(&h, a.json).await,
        SkillCommand::Inspect(a) => inspect(&h, a).await,
        SkillCommand::Remove(a) => remove(&h, a).await,
    }
}

/// The component files (`*.wasm`) under `dir` (at most [`BUNDLE_DEPTH`] directories down).
fn bundled_components(dir: &std::path::Path, depth: usize, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let path = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() && depth < BUNDLE_DEPTH => {
                bundled_components(&path, depth + 1, out)
            }
            Ok(t) if t.is_file() && path.extension().is_some_and(|x| x == "wasm") => out.push(path),
            _ => {}
        }
    }
}

/// How deep `skill publish` looks for bundled components to warn about.
const BUNDLE_DEPTH: usize = 8;

async fn publish(h: &Harness, a: SkillPublishArgs) -> ExitCode {
    let to = &a.to;
    let mut bundled = Vec::new();
    bundled_components(&a.dir, 0, &mut bundled);
    bundled.sort();
    for file in bundled {
        let signed =
            std::fs::read(&file).is_ok_and(|b| keel::protocol::setup::signing::is_signed(&b));
        if !signed {
            eprintln!(
                "keel: note: the bundled component {} is not signed; installing the skill will \
                 need --allow-unsigned for it (sign it with `keel tool sign FILE --key NAME`)",
                file.display()
            );
        }
    }
    eprintln!("keel: publishing the skill at {} to {} …", a.dir.display(), inert(&to.reference));
    let (auth, key) = (to.auth.as_deref(), a.key.as_deref());
    let result = h.publish_skill(&Caller::Operator, &a.dir, &to.reference, auth, key).await;
    match result {
        Ok(p) if to.json => {
            println!("{}", json!({"ok": true, "publish": p.publish, "signature": p.signature}));
            ExitCode::SUCCESS
        }
        Ok(p) => {
            match p.publish.unchanged {
                true => println!(
                    "{} already holds this skill: nothing was pushed, the tag did not move",
                    inert(&p.publish.reference)
                ),
                false => {
                    println!("published {} ({} bytes)", inert(&p.publish.reference), p.publish.size)
                }
            }
            println!("manifest {}", inert(&p.publish.digest));
            match &p.signature {
                Some(s) => println!(
                    "signed with `{}` ({}); the signature is kept at {}",
                    inert(&s.key),
                    s.public_key,
                    inert(&s.signature)
                ),
                None => println!(
                    "not signed: installs will need --allow-unsigned (sign it with --key, or \
                     `keel skill sign`)"
                ),
            }
            // The digest reference last, alone on its line, for scripts.
            println!("{}", inert(&p.publish.pinned));
            ExitCode::SUCCESS
        }
        Err(e) => super::api_fail(to.json, &e),
    }
}

async fn sign(h: &Harness, a: SkillSignArgs) -> ExitCode {
    let result = h.sign_skill(&Caller::Operator, &a.reference, &a.key, a.auth.as_deref()).await;
    match result {
        Ok(s) if a.json => {
            println!("{}", json!({"ok": true, "signed": s}));
            ExitCode::SUCCESS
        }
        Ok(s) => {
            println!(
                "signed {} with `{}` ({}); the signature is kept at {}",
                inert(&s.signs),
                inert(&s.key),
                s.public_key,
                inert(&s.signature)
            );
            ExitCode::SUCCESS
        }
        Err(e) => super::api_fail(a.json, &e),
    }
}

async fn install(h: &Harness, a: SkillInstallArgs) -> ExitCode {
    let installed = if a.path.starts_with("oci://") {
        eprintln!("keel: pulling {} …", inert(&a.path));
        let opts = keel::api::RegistryInstall {
            name: None,
            upgrade: a.upgrade,
            accept_wider: a.accept_wider,
            allow_downgrade: a.registry.allow_downgrade,
            allow_unsigned: a.registry.allow_unsigned,
            auth: a.registry.auth.as_deref(),
        };
        h.install_skill_from(&Caller::Operator, &a.path, &opts).await
    } else if a.registry.allow_unsigned || a.registry.auth.is_some() || a.registry.allow_downgrade {
        let msg = "--allow-unsigned, --allow-downgrade and --auth are for oci:// references";
        return super::fail(a.json, "input", msg, super::EXIT_REFUSED);
    } else {
        let path = PathBuf::from(&a.path);
        eprintln!("keel: checking the skill at {}…", path.display());
        let mode = keel::protocol::tools::InstallMode::of(a.upgrade, a.accept_wider);
        h.install_skill(&Caller::Operator, &path, mode).await
    };
    let r = match installed {
        Ok(r) => r,
        Err(e) => return super::api_fail(a.json, &e),
    };
    if a.json {
        println!("{}", json!({"ok": true, "install": r}));
        return ExitCode::SUCCESS;
    }
    let s = &r.installed.skill;
    let what = if r.installed.unchanged {
        "already installed"
    } else if r.installed.replaced.is_some() {
        "upgraded"
    } else {
        "installed"
    };
    println!("{what} skill {} (sha256 {})", inert(&s.name), &s.digest[..12]);
    println!("  {}", inert(&s.description));
    if let Some(m) = &s.manifest_digest {
        println!("  from {} ({m})", inert(&s.source));
        match &s.signer {
            Some(signer) => println!("  signed by {}", inert(signer)),
            None if s.unsigned_allowed => println!("  unsigned! (installed with --allow-unsigned)"),
            None => {}
        }
    }
    if let Some(old) = &r.installed.replaced {
        println!("  replaced sha256 {}", &old[..12.min(old.len())]);
    }
    if !s.files.is_empty() {
        println!("  {} reference file(s)", s.files.len());
    }
    for c in &r.components {
        let tools: Vec<String> = c.tools.iter().map(|t| t.name.clone()).collect();
        println!(
            "  component {} installed: {}",
            inert(&c.component.name),
            inert(&tools.join(", "))
        );
    }
    if r.installed.ignored_keys.iter().any(|k| k == "allowed-tools") {
        println!(
            "  note: `allowed-tools` is not acted on: a skill grants nothing (tools load by \
             --tools, the Orchestrator or tools_select, and follow the session's policy)"
        );
    }
    ExitCode::SUCCESS
}

async fn list(h: &Harness, json: bool) -> ExitCode {
    let skills = match h.skills(&Caller::Operator).await {
        Ok(s) => s,
        Err(e) => return super::api_fail(json, &e),
    };
    if json {
        println!("{}", json!(skills));
        return ExitCode::SUCCESS;
    }
    if skills.is_empty() {
        println!("no skills installed; add one with `keel skill install DIR`");
    }
    for s in &skills {
        let mark = if s.unsigned_allowed { " unsigned!" } else { "" };
        println!("{:<24} {}{mark}", inert(&s.name), inert(&one_line(&s.description, 100)));
    }
    if skills.iter().any(|s| s.unsigned_allowed) {
        println!(
            "(unsigned!: installed from a registry without a trusted signature, by --allow-unsigned)"
        );
    }
    ExitCode::SUCCESS
}

fn one_line(text: &str, max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= max {
        return line;
    }
    format!("{}…", line.chars().take(max).collect::<String>())
}

async fn inspect(h: &Harness, a: SkillInspectArgs) -> ExitCode {
    let (record, version) = match h.skill(&Caller::Operator, &a.name).await {
        Ok(s) => s,
        Err(e) => return super::api_fail(a.json, &e),
    };
    if a.json {
        println!("{}", json!({"skill": record, "body": version.body}));
        return ExitCode::SUCCESS;
    }
    println!("skill        {}", inert(&record.name));
    println!("description  {}", inert_block(&record.description));
    println!("sha256       {}", record.digest);
    println!("source       {}", inert(&record.source));
    if let Some(m) = &record.manifest_digest {
        println!("manifest     {m}");
        match (&record.signer, &record.signer_key) {
            (Some(name), Some(key)) => println!("signer       {} ({key})", inert(name)),
            _ if record.unsigned_allowed => {
                println!("signer       none: installed unsigned (--allow-unsigned)")
            }
            _ => println!("signer       none"),
        }
    }
    println!("method       {} bytes", record.body_bytes);
    for f in &record.files {
        println!("file         {} ({} bytes)", inert(&f.path), f.bytes);
    }
    for t in &record.tools {
        println!("component    {}", inert(t));
    }
    if a.body {
        println!();
        println!("{}", inert_block(&version.body));
    }
    ExitCode::SUCCESS
}

async fn remove(h: &Harness, a: SkillNameArgs) -> ExitCode {
    match h.remove_skill(&Caller::Operator, &a.name).await {
        Ok(r) => {
            if a.json {
                println!("{}", json!({"ok": true, "removed": r}));
            } else {
                println!("removed skill {}", inert(&r.name));
                if !r.tools.is_empty() {
                    println!(
                        "  its component(s) {} stay installed; remove them with `keel tool remove`",
                        inert(&r.tools.join(", "))
                    );
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => super::api_fail(a.json, &e),
    }
}

pub async fn memory(home: PathBuf, cmd: MemoryCommand) -> ExitCode {
    let json = match &cmd {
        MemoryCommand::List(a) => a.json,
        MemoryCommand::Add(a) => a.json,
        MemoryCommand::Remove(a) => a.json,
    };
    let h = match super::turn::open_harness(&home).await {
        Ok((_, h)) => h,
        Err(e) => return super::fail(json, "setup", &e, EXIT_SETUP),
    };
    match cmd {
        MemoryCommand::List(a) => {
            let user = (!a.all_users).then(|| a.user.user());
            match h.memories(&Caller::Operator, user.as_deref()).await {
                Ok(list) if a.json => {
                    println!("{}", json!(list));
                    ExitCode::SUCCESS
                }
                Ok(list) => {
                    if list.is_empty() {
                        println!("no memories");
                    }
                    for m in list {
                        let tags = if m.tags.is_empty() {
                            String::new()
                        } else {
                            format!(" [{}]", inert(&m.tags.join(", ")))
                        };
                        let who = if a.all_users {
                            format!("{} ", inert(&m.user))
                        } else {
                            String::new()
                        };
                        println!("{:>5} {who}{}{tags}", m.id, inert(&one_line(&m.text, 160)));
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => super::api_fail(a.json, &e),
            }
        }
        MemoryCommand::Add(a) => {
            let user = a.user.user();
            match h.add_memory(&Caller::Operator, &user, &a.text, &a.tags).await {
                Ok(id) if a.json => {
                    println!("{}", json!({"ok": true, "id": id, "user": user}));
                    ExitCode::SUCCESS
                }
                Ok(id) => {
                    println!("remembered #{id} for {}", inert(&user));
                    ExitCode::SUCCESS
                }
                Err(e) => super::api_fail(a.json, &e),
            }
        }
        MemoryCommand::Remove(a) => {
            let user = a.user.user();
            match h.remove_memory(&Caller::Operator, &user, a.id).await {
                Ok(m) if a.json => {
                    println!("{}", json!({"ok": true, "removed": m}));
                    ExitCode::SUCCESS
                }
                Ok(m) => {
                    println!("removed #{} of {}", m.id, inert(&m.user));
                    ExitCode::SUCCESS
                }
                Err(e) => super::api_fail(a.json, &e),
            }
        }
    }
}
