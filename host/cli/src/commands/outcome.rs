//! One governed call as the author's commands show it (`keel tool call`, `tool dev`): its
//! input read from the command line, a file or stdin, and its outcome as JSON or as text.

use clap::Args;
use keel::protocol::sessions::Grant;
use serde_json::json;

use super::{BudgetArgs, NetArgs, inert, inert_block, prefixed};

/// The flags of one governed call that `keel tool call` and `keel tool dev` share: the
/// directories granted, the network and the budget.
#[derive(Args)]
pub struct CallFlags {
    /// Grant a host directory: HOST_DIR[=GUEST_PATH][:ro|:rw]. Repeatable. The guest path
    /// defaults to /NAME (the directory's name); access defaults to read-only.
    #[arg(long = "grant", value_name = "HOST_DIR[=GUEST][:ro|:rw]")]
    pub grants: Vec<Grant>,
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub budget: BudgetArgs,
}

/// Inputs read from a file or stdin larger than this are refused (a tool's input is a JSON
/// object a model could write; the sandbox refuses far less).
const MAX_INPUT_BYTES: u64 = 16 << 20;

/// The input `--input` names: the text itself, `@FILE`'s contents, or stdin's (`-`).
pub fn read_input(arg: &str) -> Result<String, String> {
    use std::io::Read;
    let (what, reader): (String, Box<dyn Read>) = if arg == "-" {
        ("stdin".into(), Box::new(std::io::stdin()))
    } else if let Some(path) = arg.strip_prefix('@') {
        let file = std::fs::File::open(path)
            .map_err(|e| format!("--input @{path}: cannot open the file: {e}"))?;
        (path.to_string(), Box::new(file))
    } else {
        return Ok(arg.to_string());
    };
    let mut text = String::new();
    let read = reader
        .take(MAX_INPUT_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("--input: cannot read {what} as UTF-8 text: {e}"))?;
    if read as u64 > MAX_INPUT_BYTES {
        return Err(format!(
            "--input: {what} holds more than {} MiB; a tool's input is a JSON object, not a file to upload",
            MAX_INPUT_BYTES >> 20
        ));
    }
    Ok(text)
}

/// One call's outcome as the JSON object `tool call --json` prints.
pub fn outcome_json(outcome: &keel::protocol::tools::CallOutcome) -> serde_json::Value {
    let r = &outcome.report;
    let (ok, output, error) = match &r.result {
        Ok(v) => (true, v.clone(), serde_json::Value::Null),
        Err(e) => {
            (false, serde_json::Value::Null, json!({"kind": e.kind(), "message": e.to_string()}))
        }
    };
    json!({
        "ok": ok, "tool": outcome.tool.name, "effect": outcome.tool.effect,
        "output": output, "error": error, "changes": outcome.changes,
        "stdout": r.stdout, "stderr": r.stderr, "logs": r.logs,
        "dropped_logs": r.dropped_logs, "progress": r.progress, "fs": r.fs,
        "net": r.net.records, "net_dropped": r.net.dropped,
        "fuel_used": r.fuel_used, "memory_peak": r.memory_peak,
        "duration_ms": r.duration.as_secs_f64() * 1e3,
        "compiled_ms": outcome.compiled_ms,
    })
}

/// One call's outcome as text: the tool's streams and logs, what the sandbox counted or
/// refused, then the output (stdout) or the error, the changes and the figures (stderr).
pub fn print_outcome(outcome: &keel::protocol::tools::CallOutcome) {
    let r = &outcome.report;
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
            eprintln!("(change set incomplete: a workspace walk hit its bound or was cancelled)");
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
    if let Some(ms) = outcome.compiled_ms {
        eprintln!(
            "keel: compiling the file took {:.1} s; its compiled form is cached, so the next call of the same bytes starts at once",
            ms / 1e3
        );
    }
}
