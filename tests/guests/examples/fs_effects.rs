//! Filesystem probes for the effect-class and quota tests: each tool tries a list of operations
//! and reports, per operation, `"ok"` or the error the guest saw — so a test can tell what the
//! host refused. The same operations are offered under several effect classes.

use std::io::{Seek, SeekFrom, Write};

use keel_sdk::{Effect, JsonSchema, Tool, ToolError};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

#[derive(Deserialize, JsonSchema)]
struct Dir {
    /// A directory inside a grant.
    dir: String,
}

#[derive(Deserialize, JsonSchema)]
struct Sized {
    path: String,
    /// Bytes (or, for `sparse`, the offset of the single byte written).
    bytes: u64,
    /// `seek` (write one byte past the end) or `set_len`.
    #[serde(default)]
    how: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
struct Many {
    dir: String,
    count: u64,
}

#[derive(Serialize, JsonSchema)]
struct Out(Value);

fn outcome(r: std::io::Result<()>) -> Value {
    match r {
        Ok(()) => json!("ok"),
        Err(e) => json!(e.to_string()),
    }
}

/// Every kind of change to the directory `dir`, which holds `old.txt` and `old/` before the
/// call: create, write, truncate, remove and rename of old and new objects.
fn probe(i: Dir) -> Result<Out, ToolError> {
    let d = &i.dir;
    let mut out = Map::new();
    let mut put = |k: &str, r: std::io::Result<()>| {
        out.insert(k.to_string(), outcome(r));
    };
    put("create_file", std::fs::write(format!("{d}/new.txt"), "new"));
    put("create_dir", std::fs::create_dir(format!("{d}/newdir")));
    put("rewrite_old", std::fs::write(format!("{d}/old.txt"), "rewritten"));
    put("rename_new", std::fs::rename(format!("{d}/new.txt"), format!("{d}/new2.txt")));
    put("remove_new", std::fs::remove_file(format!("{d}/new2.txt")));
    put("remove_new_dir", std::fs::remove_dir(format!("{d}/newdir")));
    put("rename_old", std::fs::rename(format!("{d}/old.txt"), format!("{d}/moved.txt")));
    put("remove_old", std::fs::remove_file(format!("{d}/old.txt")));
    put("remove_old_dir", std::fs::remove_dir(format!("{d}/old")));
    put("replace_old_by_new", {
        std::fs::write(format!("{d}/tmp.txt"), "replacement")
            .and_then(|()| std::fs::rename(format!("{d}/tmp.txt"), format!("{d}/old.txt")))
    });
    put("replace_old_dir", {
        std::fs::create_dir(format!("{d}/tmpdir"))
            .and_then(|()| std::fs::rename(format!("{d}/tmpdir"), format!("{d}/old")))
    });
    Ok(Out(Value::Object(out)))
}

/// Writes `bytes` bytes to `path` in 64 KiB chunks.
fn fill(i: Sized) -> Result<Out, ToolError> {
    let mut f = std::fs::File::create(&i.path).map_err(|e| ToolError::io(&i.path, &e))?;
    let chunk = vec![b'z'; 64 * 1024];
    let mut left = i.bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if let Err(e) = f.write_all(&chunk[..n]) {
            return Ok(Out(json!({"written": i.bytes - left, "error": e.to_string()})));
        }
        left -= n as u64;
    }
    Ok(Out(json!({"written": i.bytes, "error": null})))
}

/// Makes `path` a sparse file of `bytes` logical bytes.
fn sparse(i: Sized) -> Result<Out, ToolError> {
    let mut f = std::fs::File::create(&i.path).map_err(|e| ToolError::io(&i.path, &e))?;
    let r = match i.how.as_deref() {
        Some("set_len") => f.set_len(i.bytes),
        _ => f
            .seek(SeekFrom::Start(i.bytes.saturating_sub(1)))
            .and_then(|_| f.write_all(b"!"))
            .and_then(|()| f.flush()),
    };
    Ok(Out(json!({"result": outcome(r)})))
}

/// Rewrites `path` in place with as many bytes of new content, then puts its modification
/// and access times back as they were.
fn rewrite_keep_mtime(i: Sized) -> Result<Out, ToolError> {
    let io = |e: std::io::Error| ToolError::io(&i.path, &e);
    let meta = std::fs::metadata(&i.path).map_err(io)?;
    let (mtime, atime) = (meta.modified().map_err(io)?, meta.accessed().map_err(io)?);
    let mut f = std::fs::OpenOptions::new().write(true).open(&i.path).map_err(io)?;
    f.write_all(&vec![b'#'; meta.len() as usize]).map_err(io)?;
    f.set_times(std::fs::FileTimes::new().set_modified(mtime).set_accessed(atime)).map_err(io)?;
    let after = std::fs::metadata(&i.path).map_err(io)?;
    Ok(Out(json!({"mtime_restored": after.modified().map_err(io)? == mtime})))
}

/// Creates `count` empty files in `dir`; stops at the first error.
fn many(i: Many) -> Result<Out, ToolError> {
    for n in 0..i.count {
        if let Err(e) = std::fs::write(format!("{}/f{n}", i.dir), "") {
            return Ok(Out(json!({"created": n, "error": e.to_string()})));
        }
    }
    Ok(Out(json!({"created": i.count, "error": null})))
}

fn tools() -> Vec<Tool> {
    use Effect::*;
    vec![
        Tool::new("probe_read_only", "Tries every change (declared read-only).", ReadOnly, probe),
        Tool::new(
            "probe_write",
            "Tries every change (declared workspace-write).",
            WorkspaceWrite,
            probe,
        ),
        Tool::new("probe_external", "Tries every change (declared external).", External, probe),
        Tool::new(
            "probe_destructive",
            "Tries every change (declared destructive).",
            Destructive,
            probe,
        ),
        Tool::new("fill", "Writes `bytes` bytes to a file.", WorkspaceWrite, fill),
        Tool::new("sparse", "Makes a sparse file.", WorkspaceWrite, sparse),
        Tool::new(
            "rewrite_keep_mtime",
            "Rewrites a file, restores its times.",
            WorkspaceWrite,
            rewrite_keep_mtime,
        ),
        Tool::new("many", "Creates `count` files.", WorkspaceWrite, many),
    ]
}

keel_sdk::export_tools!(tools);
