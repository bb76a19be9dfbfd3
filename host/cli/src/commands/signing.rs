//! Signing keys, signatures and trust: `keel key`, `keel tool sign|verify`, `keel trust`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use keel::api::Caller;
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
    let store = SecretStore::signing_keys(home);
    let secret = match store.get(std::slice::from_ref(&a.key)) {
        Ok(mut found) if !found.is_empty() => found.remove(0).1,
        Ok(_) | Err(keel::protocol::setup::secrets::SecretError::Missing { .. }) => {
            return fail(
                a.json,
                "not_found",
                &format!(
                    "no signing key `{}`; see `keel key list`, or make one with `keel key new {}`",
                    a.key, a.key
                ),
                EXIT_REFUSED,
            );
        }
        Err(e) => return fail(a.json, "keys", &e.to_string(), EXIT_SETUP),
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
