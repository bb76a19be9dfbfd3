//! `with-postgres COMMAND [ARGS…]`: runs COMMAND with a throwaway PostgreSQL server (Debian's
//! binaries, a new cluster in a temporary directory, as an unprivileged user) and
//! `KEEL_TEST_POSTGRES` naming it, so every keel home the command's tests open gets a database
//! of its own there. Stops the server afterwards; exits with COMMAND's status.
#![allow(clippy::print_stderr)]

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let Some((program, rest)) = args.split_first() else {
        eprintln!("usage: with-postgres COMMAND [ARGS…]");
        std::process::exit(2);
    };
    // No fsync: these runs test behaviour, not power loss (the fault tests start their own).
    let cluster = match keel_tests::postgres::Cluster::start(&["fsync=off"]) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("with-postgres: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = cluster.template() {
        eprintln!("with-postgres: cannot make the template database: {e}\n{}", cluster.log());
        std::process::exit(2);
    }
    eprintln!("with-postgres: PostgreSQL on port {} ({})", cluster.port(), cluster.server_url());
    let status = std::process::Command::new(program)
        .args(rest)
        .env("KEEL_TEST_POSTGRES", cluster.server_url())
        .status();
    drop(cluster);
    match status {
        Ok(s) => std::process::exit(s.code().unwrap_or(1)),
        Err(e) => {
            eprintln!("with-postgres: cannot run {}: {e}", program.to_string_lossy());
            std::process::exit(2);
        }
    }
}
