//! `keel secret`: the secrets broker's store (values in, names out).

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use keel::protocol::setup::secrets::{Secret, SecretStore};
use serde_json::json;

use super::{EXIT_REFUSED, EXIT_SETUP, fail};

#[derive(Subcommand)]
pub enum SecretCommand {
    /// Store a secret. The value is read from stdin (piped) or asked for at the terminal
    /// without echo — never from the command line, where it would land in shell history and
    /// the process list. Give it to a session with --secret NAME@HOST.
    Set(SetArgs),
    /// List the stored secrets' names (never their values).
    List(ListArgs),
    /// Remove a stored secret.
    Rm(RmArgs),
    /// Replace the secrets key (secrets.key) with a new one and re-encrypt the secrets and
    /// signing keys to it. Run it when the key may have been read (keel refuses a key other
    /// users can read); then change each secret's value at its service and `keel secret set`
    /// it again, since the old key decrypts any copy of the old store.
    RotateKey(ListArgs),
}

#[derive(Args)]
pub struct SetArgs {
    /// Name: letters, digits, `_` or `-` (the placeholder a tool writes is {{secret:NAME}}).
    name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct ListArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RmArgs {
    name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn execute(home: PathBuf, cmd: SecretCommand) -> ExitCode {
    let store = SecretStore::new(&home);
    match cmd {
        SecretCommand::Set(a) => set(&store, a),
        SecretCommand::List(a) => match store.names() {
            Ok(names) => {
                if a.json {
                    println!("{}", json!({"ok": true, "secrets": names}));
                } else if names.is_empty() {
                    eprintln!("no secrets stored (add one with `keel secret set NAME`)");
                } else {
                    for n in names {
                        println!("{n}");
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(a.json, "secrets", &e.to_string(), EXIT_SETUP),
        },
        SecretCommand::Rm(a) => match store.remove(&a.name) {
            Ok(()) => {
                if a.json {
                    println!("{}", json!({"ok": true, "removed": a.name}));
                } else {
                    println!("removed secret `{}`", a.name);
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(a.json, "secrets", &e.to_string(), EXIT_REFUSED),
        },
        SecretCommand::RotateKey(a) => match keel::protocol::setup::secrets::rotate_key(&home) {
            Ok(r) => {
                if a.json {
                    println!(
                        "{}",
                        json!({"ok": true, "reencrypted": r.stores, "secrets": r.secrets})
                    );
                } else {
                    println!(
                        "new secrets key written (mode 0600); re-encrypted: {}",
                        if r.stores.is_empty() {
                            "nothing yet".into()
                        } else {
                            r.stores.join(", ")
                        }
                    );
                    if r.secrets > 0 {
                        println!(
                            "if the old key may have been read, change the {} secret value(s) at their services and store them again with `keel secret set NAME`",
                            r.secrets
                        );
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(a.json, "secrets", &e.to_string(), EXIT_SETUP),
        },
    }
}

fn set(store: &SecretStore, a: SetArgs) -> ExitCode {
    if !keel::protocol::setup::secrets::valid_secret_name(&a.name) {
        let e = keel::protocol::setup::secrets::SecretError::BadName { name: a.name.clone() };
        return fail(a.json, "secrets", &e.to_string(), EXIT_REFUSED);
    }
    let value = if std::io::stdin().is_terminal() {
        match prompt(&format!("value of secret `{}` (not shown): ", a.name)) {
            Ok(v) => v,
            Err(e) => {
                return fail(a.json, "io", &format!("cannot read the value: {e}"), EXIT_REFUSED);
            }
        }
    } else {
        let mut text = String::new();
        if let Err(e) = std::io::stdin()
            .take(keel::protocol::setup::secrets::MAX_SECRET_BYTES as u64 + 2)
            .read_to_string(&mut text)
        {
            return fail(
                a.json,
                "io",
                &format!("cannot read the value from stdin: {e}"),
                EXIT_REFUSED,
            );
        }
        // One trailing line break (from `echo` or a file) is not part of the value.
        if text.ends_with('\n') {
            text.pop();
            if text.ends_with('\r') {
                text.pop();
            }
        }
        text
    };
    match store.set(&a.name, Secret::new(value)) {
        Ok(replaced) => {
            if a.json {
                println!("{}", json!({"ok": true, "secret": a.name, "replaced": replaced}));
            } else {
                println!(
                    "{} secret `{}` (encrypted in secrets.age; give it to a session with --secret {}@HOST)",
                    if replaced { "replaced" } else { "stored" },
                    a.name,
                    a.name
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(a.json, "secrets", &e.to_string(), EXIT_REFUSED),
    }
}

/// Reads one line from the terminal with echo off.
pub(super) fn prompt(label: &str) -> std::io::Result<String> {
    use rustix::termios::{LocalModes, OptionalActions, tcgetattr, tcsetattr};
    use std::io::Write;
    let tty = std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty")?;
    let saved = tcgetattr(&tty)?;
    let mut quiet = saved.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    quiet.local_modes.insert(LocalModes::ECHONL);
    (&tty).write_all(label.as_bytes())?;
    tcsetattr(&tty, OptionalActions::Flush, &quiet)?;
    let mut line = String::new();
    let read = std::io::BufRead::read_line(&mut std::io::BufReader::new(&tty), &mut line);
    tcsetattr(&tty, OptionalActions::Flush, &saved)?;
    read?;
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}
