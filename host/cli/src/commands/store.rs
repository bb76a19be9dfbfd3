//! The store: `keel store info` (where it is) and `keel store migrate --to postgres://…`
//! (copy a home's SQLite store into PostgreSQL, checked).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use keel::protocol::setup::Location;
use serde_json::json;

use super::{EXIT_REFUSED, EXIT_SETUP, fail};

#[derive(Subcommand)]
pub enum StoreCommand {
    /// Where this home's store is — its SQLite file, or the PostgreSQL database of
    /// `KEEL_DATABASE_URL` / `[store] url` — and the schema version this keel migrates it to.
    Info(InfoArgs),
    /// Copy this home's SQLite store into an empty PostgreSQL database, in one transaction,
    /// then check every table's row count and a digest of its rows on both sides.
    ///
    /// Sessions with their history, journal, approvals and events, the tool catalog (and the
    /// installed components' files, so that every host can compile them), skills, memories,
    /// tokens, grant presets and trusted keys are copied. Secrets and signing keys stay in
    /// the home (encrypted files): give each host the ones it needs. Stop every keel process
    /// of the home first. The SQLite file is left as it was; afterwards set `[store] url` in
    /// keel.toml (or KEEL_DATABASE_URL) on every host.
    Migrate(MigrateArgs),
}

#[derive(Args)]
pub struct InfoArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct MigrateArgs {
    /// The PostgreSQL database to copy into: postgres://USER:PASSWORD@HOST:PORT/DATABASE. It
    /// must hold no keel data yet (keel creates its tables).
    #[arg(long, value_name = "URL")]
    to: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub async fn execute(root: PathBuf, cmd: StoreCommand) -> ExitCode {
    let home = match keel::protocol::setup::Home::at(&root) {
        Ok(h) => h,
        Err(e) => {
            let json = matches!(&cmd, StoreCommand::Info(a) if a.json)
                || matches!(&cmd, StoreCommand::Migrate(a) if a.json);
            return fail(json, "home", &format!("{}: {e}", root.display()), EXIT_SETUP);
        }
    };
    match cmd {
        StoreCommand::Info(a) => info(&home, a.json),
        StoreCommand::Migrate(a) => migrate(home, a).await,
    }
}

fn info(home: &keel::protocol::setup::Home, json: bool) -> ExitCode {
    let location = match keel::protocol::setup::config::store_location(home) {
        Ok(l) => l,
        Err(e) => return fail(json, "config", &e.to_string(), EXIT_SETUP),
    };
    let (backend, shared) = match &location {
        Location::Sqlite { .. } => ("sqlite", false),
        Location::Postgres { .. } => ("postgres", true),
    };
    let version = keel::protocol::setup::schema_version();
    if json {
        println!(
            "{}",
            json!({"ok": true, "backend": backend, "location": location.display(),
                   "shared": shared, "schema_version": version})
        );
    } else {
        println!("backend         {backend}");
        println!("location        {}", location.display());
        println!(
            "hosts           {}",
            if shared { "several may share it" } else { "this machine only" }
        );
        println!("schema version  {version}");
    }
    ExitCode::SUCCESS
}

async fn migrate(home: keel::protocol::setup::Home, a: MigrateArgs) -> ExitCode {
    let to = Location::Postgres { url: a.to.trim().to_string() };
    if !(a.to.starts_with("postgres://") || a.to.starts_with("postgresql://")) {
        return fail(
            a.json,
            "input",
            &format!(
                "`{}` is not a PostgreSQL URL: use postgres://USER:PASSWORD@HOST:PORT/DATABASE",
                to.display()
            ),
            EXIT_REFUSED,
        );
    }
    let path = home.database();
    if !path.exists() {
        return fail(
            a.json,
            "not_found",
            &format!("this home has no SQLite store to copy ({} does not exist)", path.display()),
            EXIT_REFUSED,
        );
    }
    let sync = match keel::protocol::setup::config::synchronous(&home) {
        Ok(s) => s,
        Err(e) => return fail(a.json, "config", &e.to_string(), EXIT_SETUP),
    };
    let from = Location::Sqlite { path, sync };
    let json = a.json;
    let target = to.clone();
    let copied = tokio::task::spawn_blocking(move || {
        let files = |digest: &str| std::fs::read(home.component_path(digest)).ok();
        let progress = |c: &keel::protocol::setup::copy::Copied| {
            if !json {
                eprintln!("  {:<22} {:>8} row(s)  sha256:{}", c.table, c.rows, &c.digest[..16]);
            }
        };
        keel::protocol::setup::copy::sqlite_to_postgres(&from, &target, &files, &progress)
    })
    .await;
    let report = match copied {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            let code = if e.kind() == "store" { EXIT_SETUP } else { EXIT_REFUSED };
            return fail(a.json, e.kind(), &e.to_string(), code);
        }
        Err(e) => return fail(a.json, "store", &format!("the copy failed: {e}"), EXIT_SETUP),
    };
    let rows: u64 = report.tables.iter().map(|t| t.rows).sum();
    if a.json {
        println!(
            "{}",
            json!({"ok": true, "to": to.display(), "rows": rows, "tables": report.tables,
                   "component_files": report.component_files,
                   "missing_files": report.missing_files})
        );
    } else {
        println!(
            "copied {rows} row(s) of {} tables and {} component file(s) to {}; every table's count and digest match",
            report.tables.len(),
            report.component_files,
            to.display()
        );
        if !report.missing_files.is_empty() {
            println!(
                "note: {} kept tool version(s) have no component file in this home: {}",
                report.missing_files.len(),
                report.missing_files.join(", ")
            );
        }
        println!(
            "next: stop using the SQLite file; on every host set this URL as `[store] url` in keel.toml (or KEEL_DATABASE_URL)"
        );
    }
    ExitCode::SUCCESS
}
