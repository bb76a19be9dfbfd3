//! Signing keys, signatures and trust: `keel key`, `keel tool sign|verify`, `keel trust`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use keel::api::Caller;
use keel::protocol::setup::keys;
use keel::protocol::setup::secrets::{Secret, SecretStore};
use keel::protocol::setup::signing::{self, PublicKey};
use serde_json::json;

use super::{EXIT_REFUSED, EXIT_SETUP, fail};

#[derive(Subcommand)]
pub enum KeyCommand {
    /// Make an ed25519 signing key, kept encrypted in the keel home (never printed), and print
    /// its public key — what publishers give admins to `keel trust add`.
    New(KeyNewArgs),
    /// List the signing keys with their public keys.
    List(KeyListArgs),
    /// Remove a signing key (what it signed stays signed).
    Remove(KeyNameArgs),
    /// Write a signing key out sealed — with a passphrase (KEEL_SIGNING_KEY_PASSPHRASE, or asked
    /// at the terminal), or to age recipients (--to) — as ASCII-armored age text: for another
    /// home (`keel key import`) or a CI job (KEEL_SIGNING_KEY). The secret never leaves
    /// unsealed.
    Export(KeyExportArgs),
    /// Read a key `keel key export` wrote into this home, under NAME.
    Import(KeyImportArgs),
}

#[derive(Args)]
pub struct KeyExportArgs {
    /// The key to export (see `keel key list`).
    name: String,
    /// Write the export to FILE (made readable by its owner only) instead of stdout.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Seal it to this age recipient (`age1…`) instead of a passphrase; its identity file
    /// opens it (`keel key import --identity`, or `age --decrypt`). Repeatable.
    #[arg(long = "to", value_name = "AGE_RECIPIENT")]
    to: Vec<String>,
    /// Print JSON instead of text (the export in `export` when not written to a file).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct KeyImportArgs {
    /// The name to keep it under in this home (default: the name it was exported under).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// The export: a file, or `-` for stdin.
    #[arg(value_name = "FILE|-")]
    file: PathBuf,
    /// For an export sealed to age recipients: the age identity file that opens it.
    #[arg(long, value_name = "FILE")]
    identity: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// The passphrase of an export: KEEL_SIGNING_KEY_PASSPHRASE, else asked at the terminal
/// (twice when it seals a new export).
fn passphrase(sealing: bool) -> Result<zeroize::Zeroizing<String>, String> {
    if let Ok(p) = std::env::var(keys::PASSPHRASE_VAR) {
        return Ok(zeroize::Zeroizing::new(p));
    }
    let asked = super::secret::prompt("passphrase (not shown): ").map_err(|e| {
        format!("no passphrase: set {} or run at a terminal ({e})", keys::PASSPHRASE_VAR)
    })?;
    if sealing {
        let again =
            super::secret::prompt("the same passphrase again: ").map_err(|e| e.to_string())?;
        if again != asked {
            return Err("the passphrases differ; nothing was written".into());
        }
    }
    Ok(zeroize::Zeroizing::new(asked))
}

fn key_export(home: &Path, a: KeyExportArgs) -> ExitCode {
    let seal = if a.to.is_empty() {
        match passphrase(true) {
            Ok(p) => keys::Seal::Passphrase(p),
            Err(why) => return fail(a.json, "needs_secret", &why, EXIT_REFUSED),
        }
    } else {
        keys::Seal::Recipients(a.to.clone())
    };
    let text = match keys::export(home, &a.name, &seal) {
        Ok(t) => t,
        Err(e) => return fail(a.json, e.kind(), &e.to_string(), EXIT_REFUSED),
    };
    let how = if a.to.is_empty() { "a passphrase" } else { "age recipients" };
    if let Some(out) = &a.out {
        if let Err(e) = keel::protocol::setup::write_private(out, text.as_bytes()) {
            let msg = format!("cannot write {}: {e}", out.display());
            return fail(a.json, "io", &msg, EXIT_SETUP);
        }
        if a.json {
            println!("{}", json!({"ok": true, "key": a.name, "file": out, "sealed_with": how}));
        } else {
            println!("exported signing key `{}` to {} (sealed with {how})", a.name, out.display());
        }
    } else if a.json {
        println!("{}", json!({"ok": true, "key": a.name, "export": text, "sealed_with": how}));
    } else {
        print!("{text}");
        eprintln!("keel: exported signing key `{}`, sealed with {how}", a.name);
    }
    ExitCode::SUCCESS
}

fn key_import(home: &Path, a: KeyImportArgs) -> ExitCode {
    use std::io::Read;
    let mut text = String::new();
    let limit = keys::MAX_EXPORT_BYTES as u64 + 1;
    let read = if a.file.as_os_str() == "-" {
        std::io::stdin().take(limit).read_to_string(&mut text)
    } else {
        std::fs::File::open(&a.file).and_then(|f| f.take(limit).read_to_string(&mut text))
    };
    if let Err(e) = read {
        let msg = format!("cannot read {}: {e}", a.file.display());
        return fail(a.json, "io", &msg, EXIT_REFUSED);
    }
    let mut unseal = keys::Unseal::default();
    match keys::needs_passphrase(&text) {
        Ok(true) => match passphrase(false) {
            Ok(p) => unseal.passphrase = Some(p),
            Err(why) => return fail(a.json, "needs_secret", &why, EXIT_REFUSED),
        },
        Ok(false) => {
            if let Some(id) = &a.identity {
                match std::fs::read_to_string(id) {
                    Ok(t) => unseal.identities = Some(zeroize::Zeroizing::new(t)),
                    Err(e) => {
                        let msg = format!("cannot read {}: {e}", id.display());
                        return fail(a.json, "io", &msg, EXIT_REFUSED);
                    }
                }
            }
        }
        Err(e) => return fail(a.json, e.kind(), &e.to_string(), EXIT_REFUSED),
    }
    let (exported_as, secret) = match keys::open(&text, &unseal) {
        Ok(k) => k,
        Err(e) => return fail(a.json, e.kind(), &e.to_string(), EXIT_REFUSED),
    };
    let name = a.name.clone().unwrap_or(exported_as);
    let store = SecretStore::signing_keys(home);
    match store.names() {
        Ok(names) if names.contains(&name) => {
            let msg = format!(
                "a signing key `{name}` exists; remove it first (`keel key remove {name}`) or import under another name (--name)"
            );
            return fail(a.json, "conflict", &msg, EXIT_REFUSED);
        }
        Ok(_) => {}
        Err(e) => return fail(a.json, "keys", &e.to_string(), EXIT_SETUP),
    }
    let public = signing::public_of(secret.expose()).map(|p| p.to_string()).unwrap_or_default();
    if let Err(e) = store.set(&name, secret) {
        return fail(a.json, "keys", &e.to_string(), EXIT_REFUSED);
    }
    if a.json {
        println!("{}", json!({"ok": true, "key": name, "public_key": public}));
    } else {
        println!("{public}");
        eprintln!("imported signing key `{name}`; sign with `keel tool sign FILE --key {name}`");
    }
    ExitCode::SUCCESS
}

#[derive(Args)]
pub struct KeyNewArgs {
    /// The key's name: letters, digits, `_` or `-`.
    name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct KeyListArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct KeyNameArgs {
    name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn keys(home: &Path, cmd: KeyCommand) -> ExitCode {
    let store = SecretStore::signing_keys(home);
    match cmd {
        KeyCommand::New(a) => {
            if !keel::protocol::setup::secrets::valid_secret_name(&a.name) {
                let e =
                    keel::protocol::setup::secrets::SecretError::BadName { name: a.name.clone() };
                return fail(a.json, "invalid_input", &e.to_string(), EXIT_REFUSED);
            }
            match store.names() {
                Ok(names) if names.contains(&a.name) => {
                    return fail(
                        a.json,
                        "conflict",
                        &format!(
                            "a signing key `{}` exists; remove it first (`keel key remove {}`) or choose another name",
                            a.name, a.name
                        ),
                        EXIT_REFUSED,
                    );
                }
                Ok(_) => {}
                Err(e) => return fail(a.json, "keys", &e.to_string(), EXIT_SETUP),
            }
            let (public, secret) = signing::generate();
            if let Err(e) = store.set(&a.name, Secret::new(secret.to_string())) {
                return fail(a.json, "keys", &e.to_string(), EXIT_SETUP);
            }
            if a.json {
                println!(
                    "{}",
                    json!({"ok": true, "key": a.name, "public_key": public.to_string()})
                );
            } else {
                println!("{public}");
                eprintln!(
                    "made signing key `{}` (kept encrypted in the keel home); sign with `keel tool sign FILE --key {}`, and give admins the public key above for `keel trust add`",
                    a.name, a.name
                );
            }
            ExitCode::SUCCESS
        }
        KeyCommand::List(a) => {
            let listed = store.names().and_then(|names| store.get(&names));
            let keys = match listed {
                Ok(k) => k,
                Err(e) => return fail(a.json, "keys", &e.to_string(), EXIT_SETUP),
            };
            let rows: Vec<(String, String)> = keys
                .iter()
                .map(|(name, secret)| {
                    let public = signing::public_of(secret.expose())
                        .map_or_else(|e| format!("(unreadable: {e})"), |p| p.to_string());
                    (name.clone(), public)
                })
                .collect();
            if a.json {
                let list: Vec<_> =
                    rows.iter().map(|(n, p)| json!({"name": n, "public_key": p})).collect();
                println!("{}", json!({"ok": true, "keys": list}));
            } else if rows.is_empty() {
                eprintln!("no signing keys (make one with `keel key new NAME`)");
            } else {
                for (n, p) in rows {
                    println!("{n:<20} {p}");
                }
            }
            ExitCode::SUCCESS
        }
        KeyCommand::Export(a) => key_export(home, a),
        KeyCommand::Import(a) => key_import(home, a),
        KeyCommand::Remove(a) => match store.remove(&a.name) {
            Ok(()) => {
                if a.json {
                    println!("{}", json!({"ok": true, "removed": a.name}));
                } else {
                    println!("removed signing key `{}`", a.name);
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(a.json, "keys", &e.to_string(), EXIT_REFUSED),
        },
    }
}

#[derive(Args)]
pub struct SignArgs {
    /// The component file to sign.
    file: PathBuf,
    /// The signing key (see `keel key list`).
    #[arg(long, value_name = "NAME")]
    key: String,
    /// Write the signed component here instead of replacing FILE.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `keel tool sign`: the signature embedded in the component (wasmsign2's format).
pub fn sign(home: &Path, a: SignArgs) -> ExitCode {
    // The home's key, else the one KEEL_SIGNING_KEY holds under that name (a CI job's).
    let secret = match keys::find(home, &a.key) {
        Ok(s) => s,
        Err(e) => {
            let code = if e.kind() == "keys" { EXIT_SETUP } else { EXIT_REFUSED };
            return fail(a.json, e.kind(), &e.to_string(), code);
        }
    };
    let bytes = match super::read_component(&a.file, a.json) {
        Ok((bytes, _)) => bytes,
        Err(code) => return code,
    };
    if let Err(e) = keel::protocol::net::check_header(&bytes) {
        return fail(a.json, "load", &format!("{}: {e}", a.file.display()), EXIT_REFUSED);
    }
    let (signed, public) = match signing::sign(&bytes, secret.expose())
        .and_then(|s| Ok((s, signing::public_of(secret.expose())?)))
    {
        Ok(x) => x,
        Err(e) => return fail(a.json, "signature", &e.to_string(), EXIT_REFUSED),
    };
    let out = a.out.clone().unwrap_or_else(|| a.file.clone());
    if let Err(e) = write_replacing(&out, &signed) {
        return fail(a.json, "io", &format!("cannot write {}: {e}", out.display()), EXIT_SETUP);
    }
    let digest = keel::protocol::text::sha256_hex(&signed);
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "file": out, "sha256": digest, "key": a.key, "public_key": public.to_string()})
        );
    } else {
        println!("signed {} with `{}` ({public}); sha256 {digest}", out.display(), a.key);
    }
    ExitCode::SUCCESS
}

/// Writes `bytes` to `path` through a new file beside it, renamed over it: a reader sees the
/// old file or the new one, never half of one. The temporary file is created new (`O_EXCL`,
/// which also refuses a symlink planted at its name), so nothing someone else placed there is
/// written through; a name already taken is refused, not reused.
fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.signing"));
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "cannot create {} (a file or link of that name is in the way): {e}",
                    tmp.display()
                ),
            )
        })?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    drop(file);
    written.and_then(|()| std::fs::rename(&tmp, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[derive(Args)]
pub struct VerifyArgs {
    /// The component file to verify.
    file: PathBuf,
    /// Verify with this public key (`ed25519:…`) instead of the trusted keys.
    #[arg(long, value_name = "PUBLIC_KEY")]
    key: Option<String>,
    /// The package name the trusted keys' scopes are matched against (default: the file name
    /// without `.wasm`).
    #[arg(long = "as", value_name = "PACKAGE", conflicts_with = "key")]
    package: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `keel tool verify`: exit 0 when the component is signed by the key given, or by a trusted
/// key whose scope covers it; 2 otherwise, naming what failed.
pub async fn verify(home: &PathBuf, a: VerifyArgs) -> ExitCode {
    let bytes = match super::read_component(&a.file, a.json) {
        Ok((bytes, _)) => bytes,
        Err(code) => return code,
    };
    let file = a.file.display().to_string();
    if let Some(text) = &a.key {
        let key: PublicKey = match text.parse() {
            Ok(k) => k,
            Err(e) => return fail(a.json, "invalid_input", &e.to_string(), EXIT_REFUSED),
        };
        return match signing::verify(&bytes, &key) {
            Ok(()) => {
                if a.json {
                    println!(
                        "{}",
                        json!({"ok": true, "file": file, "signed": true, "public_key": key.to_string()})
                    );
                } else {
                    println!("{file}: signed by {key}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(a.json, "signature", &format!("{file}: {e}"), EXIT_REFUSED),
        };
    }
    let package = a.package.clone().unwrap_or_else(|| {
        a.file.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string()
    });
    let harness = match super::turn::open_harness(home).await {
        Ok((_, h)) => h,
        Err(e) => return fail(a.json, "setup", &e, EXIT_SETUP),
    };
    let (signed, signer) = match harness.signer_of(&Caller::Operator, &bytes, &package) {
        Ok(x) => x,
        Err(e) => return super::api_fail(a.json, &e),
    };
    match signer {
        Some(t) => {
            if a.json {
                println!(
                    "{}",
                    json!({"ok": true, "file": file, "signed": true, "package": package, "signer": t})
                );
            } else {
                println!(
                    "{file}: signed by trusted key `{}` ({}) for `{package}`",
                    t.name, t.public_key
                );
            }
            ExitCode::SUCCESS
        }
        None => {
            let why = if signed {
                format!(
                    "{file} is signed, but by no trusted key whose scope covers `{package}` (see `keel trust list`)"
                )
            } else {
                format!("{file} is not signed (sign it with `keel tool sign {file} --key NAME`)")
            };
            fail(a.json, "signature", &why, EXIT_REFUSED)
        }
    }
}

#[derive(Subcommand)]
pub enum TrustCommand {
    /// Trust a publisher's public key for the packages a glob matches: installs from a
    /// registry then accept components it signed.
    Add(TrustAddArgs),
    /// List the trusted publisher keys.
    List(KeyListArgs),
    /// Stop trusting a publisher key (components it signed stay installed).
    Remove(KeyNameArgs),
}

#[derive(Args)]
pub struct TrustAddArgs {
    /// A name for the publisher: lowercase letters, digits, `_` and `-`.
    name: String,
    /// Its public key, as `keel key new` prints it (`ed25519:` and 64 hex digits).
    public_key: String,
    /// The packages it may sign for (required): component names or registry packages
    /// (REGISTRY/REPOSITORY), matched a `/`-separated segment at a time: `*` matches any run
    /// of characters within one segment, and a last segment `*` matches everything below
    /// (`ghcr.io/acme/*` covers ghcr.io/acme/x and ghcr.io/acme/x/y, not ghcr.io/acme-evil/x).
    /// Say `--packages '*'` to trust the key for every package.
    #[arg(long, value_name = "GLOB")]
    packages: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn trust(home: &PathBuf, cmd: TrustCommand) -> ExitCode {
    let json = match &cmd {
        TrustCommand::Add(a) => a.json,
        TrustCommand::List(a) => a.json,
        TrustCommand::Remove(a) => a.json,
    };
    let harness = match super::turn::open_harness(home).await {
        Ok((_, h)) => h,
        Err(e) => return fail(json, "setup", &e, EXIT_SETUP),
    };
    match cmd {
        TrustCommand::Add(a) => {
            let Some(packages) = a.packages.as_deref() else {
                let msg = "name the packages this key may sign for with --packages GLOB \
                           (e.g. --packages 'ghcr.io/acme/*'); say --packages '*' to trust it \
                           for every package";
                return fail(json, "input", msg, EXIT_REFUSED);
            };
            match harness.trust_add(&Caller::Operator, &a.name, &a.public_key, packages) {
                Ok(t) => {
                    if a.json {
                        println!("{}", json!({"ok": true, "trusted": t}));
                    } else {
                        println!(
                            "trusted `{}` ({}) for packages `{}`",
                            t.name, t.public_key, t.packages
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => super::api_fail(a.json, &e),
            }
        }
        TrustCommand::List(a) => match harness.trusted_keys(&Caller::Operator) {
            Ok(keys) => {
                if a.json {
                    println!("{}", json!({"ok": true, "trusted": keys}));
                } else if keys.is_empty() {
                    eprintln!(
                        "no trusted keys (add one with `keel trust add NAME PUBLIC_KEY --packages GLOB`)"
                    );
                } else {
                    println!("{:<16} {:<72} PACKAGES", "NAME", "PUBLIC KEY");
                    for t in keys {
                        println!("{:<16} {:<72} {}", t.name, t.public_key, t.packages);
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => super::api_fail(a.json, &e),
        },
        TrustCommand::Remove(a) => match harness.trust_remove(&Caller::Operator, &a.name) {
            Ok(t) => {
                if a.json {
                    println!("{}", json!({"ok": true, "removed": t}));
                } else {
                    println!("no longer trusting `{}` ({})", t.name, t.public_key);
                }
                ExitCode::SUCCESS
            }
            Err(e) => super::api_fail(a.json, &e),
        },
    }
}
