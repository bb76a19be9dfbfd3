//! A tool component that misbehaves on request: every case of the sandbox's reliability
//! tests (loops, recursion, memory bombs, floods, panics, escapes) is one tool here.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use keel_sdk::{Effect, JsonSchema, LogLevel, Tool, ToolError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Deserialize, JsonSchema)]
struct Text {
    text: String,
}

#[derive(Deserialize, JsonSchema)]
struct Nothing {}

#[derive(Deserialize, JsonSchema)]
struct Size {
    mib: u64,
    #[serde(default)]
    stream: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
struct Millis {
    ms: u64,
}

#[derive(Deserialize, JsonSchema)]
struct PathIn {
    path: String,
}

#[derive(Deserialize, JsonSchema)]
struct WriteIn {
    path: String,
    content: String,
}

#[derive(Deserialize, JsonSchema)]
struct TwoPaths {
    from: String,
    to: String,
}

#[derive(Serialize, JsonSchema)]
struct Out(Value);

fn io(path: &str) -> impl Fn(std::io::Error) -> ToolError + '_ {
    move |e| ToolError::io(path, &e)
}

fn echo(i: Text) -> Result<Out, ToolError> {
    Ok(Out(json!({ "text": i.text })))
}

#[allow(clippy::empty_loop)]
fn spin(_: Nothing) -> Result<Out, ToolError> {
    let mut x: u64 = 0;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

fn spin_host(_: Nothing) -> Result<Out, ToolError> {
    loop {
        keel_sdk::log(LogLevel::Debug, "still here");
    }
}

/// Recursion that lives on the wasm call stack (no frame in linear memory).
#[allow(unconditional_recursion)]
fn deep(n: u64) -> u64 {
    deep(n.wrapping_add(1)).wrapping_mul(3).wrapping_sub(n)
}

/// Recursion with large frames on the shadow stack in linear memory.
#[allow(unconditional_recursion)]
fn deep_frames(n: u64) -> u64 {
    let pad = std::hint::black_box([n; 64]);
    deep_frames(pad[3] + 1) + pad[7]
}

fn recurse(_: Nothing) -> Result<Out, ToolError> {
    Ok(Out(json!(deep(0))))
}

fn recurse_frames(_: Nothing) -> Result<Out, ToolError> {
    Ok(Out(json!(deep_frames(0))))
}

fn grow(i: Size) -> Result<Out, ToolError> {
    let mut chunks = Vec::new();
    for _ in 0..i.mib {
        let mut v = vec![0u8; 1 << 20];
        v[0] = 1;
        chunks.push(v);
    }
    Ok(Out(json!(chunks.len())))
}

fn huge_output(i: Size) -> Result<Out, ToolError> {
    Ok(Out(json!("x".repeat((i.mib as usize) << 20))))
}

fn huge_error(i: Size) -> Result<Out, ToolError> {
    Err(ToolError::Failed("e".repeat((i.mib as usize) << 20)))
}

fn flood(i: Size) -> Result<Out, ToolError> {
    let chunk = vec![b'y'; 64 * 1024];
    let total = (i.mib as usize) << 20;
    let mut written = 0;
    while written < total {
        if i.stream.as_deref() == Some("stderr") {
            let _ = std::io::stderr().write_all(&chunk);
        } else {
            let _ = std::io::stdout().write_all(&chunk);
        }
        written += chunk.len();
    }
    Ok(Out(json!(written)))
}

fn sleep(i: Millis) -> Result<Out, ToolError> {
    std::thread::sleep(std::time::Duration::from_millis(i.ms));
    Ok(Out(json!("slept")))
}

fn boom(_: Nothing) -> Result<Out, ToolError> {
    eprintln!("about to fail");
    panic!("boom: the tool panicked on purpose");
}

static CALLS: AtomicU64 = AtomicU64::new(0);

fn counter(_: Nothing) -> Result<Out, ToolError> {
    Ok(Out(json!(CALLS.fetch_add(1, Ordering::SeqCst) + 1)))
}

/// Grows linear memory by `mib` MiB, counts the 64-bit words of the new pages that are not
/// zero (WebAssembly promises zeros: anything else is a previous call's data), then fills them
/// with a pattern for the next call to find.
fn residue(i: Size) -> Result<Out, ToolError> {
    const PAGE: usize = 64 << 10;
    let pages = usize::try_from(i.mib).unwrap_or(0) * 16;
    #[cfg(target_arch = "wasm32")]
    let old = core::arch::wasm32::memory_grow(0, pages);
    // Built for the host only by workspace-wide lint runs; never run there.
    #[cfg(not(target_arch = "wasm32"))]
    let old = usize::MAX;
    if old == usize::MAX {
        return Err(ToolError::Failed("memory.grow refused".into()));
    }
    let start = old * PAGE;
    let words = pages * PAGE / 8;
    let mut dirty = 0u64;
    for w in 0..words {
        let p = (start + w * 8) as *mut u64;
        // SAFETY: these pages were just added by memory.grow; nothing else in this instance
        // knows of them.
        unsafe {
            if p.read_volatile() != 0 {
                dirty += 1;
            }
            p.write_volatile(0xA5A5_A5A5_A5A5_A5A5);
        }
    }
    Ok(Out(json!({ "dirty_words": dirty, "from": start, "bytes": pages * PAGE })))
}

fn env(_: Nothing) -> Result<Out, ToolError> {
    let vars: Vec<(String, String)> = std::env::vars().collect();
    let args: Vec<String> = std::env::args().collect();
    let cwd = std::env::current_dir().map(|p| p.display().to_string()).ok();
    Ok(Out(json!({ "vars": vars, "args": args, "cwd": cwd })))
}

fn read(i: PathIn) -> Result<Out, ToolError> {
    Ok(Out(json!(std::fs::read_to_string(&i.path).map_err(io(&i.path))?)))
}

fn list(i: PathIn) -> Result<Out, ToolError> {
    let mut names: Vec<String> = std::fs::read_dir(&i.path)
        .map_err(io(&i.path))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(Out(json!(names)))
}

fn write(i: WriteIn) -> Result<Out, ToolError> {
    std::fs::write(&i.path, &i.content).map_err(io(&i.path))?;
    Ok(Out(json!(i.content.len())))
}

fn truncate(i: PathIn) -> Result<Out, ToolError> {
    let f = std::fs::OpenOptions::new().write(true).open(&i.path).map_err(io(&i.path))?;
    f.set_len(0).map_err(io(&i.path))?;
    Ok(Out(json!("truncated")))
}

fn delete(i: PathIn) -> Result<Out, ToolError> {
    std::fs::remove_file(&i.path).map_err(io(&i.path))?;
    Ok(Out(json!("deleted")))
}

fn mkdir(i: PathIn) -> Result<Out, ToolError> {
    std::fs::create_dir(&i.path).map_err(io(&i.path))?;
    Ok(Out(json!("created")))
}

fn rename(i: TwoPaths) -> Result<Out, ToolError> {
    std::fs::rename(&i.from, &i.to).map_err(io(&i.from))?;
    Ok(Out(json!("renamed")))
}

fn hard_link(i: TwoPaths) -> Result<Out, ToolError> {
    std::fs::hard_link(&i.from, &i.to).map_err(io(&i.from))?;
    Ok(Out(json!("linked")))
}

#[derive(Deserialize, JsonSchema)]
struct HoldIn {
    path: String,
    count: u64,
    /// Milliseconds to keep them open once opened.
    #[serde(default)]
    ms: u64,
}

/// Opens `path` `count` times and keeps every file open for `ms` milliseconds: how many
/// opened, and the first error.
fn hold_open(i: HoldIn) -> Result<Out, ToolError> {
    let mut held = Vec::new();
    let mut error = None;
    for _ in 0..i.count {
        match std::fs::File::open(&i.path) {
            Ok(f) => held.push(f),
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(i.ms));
    Ok(Out(json!({ "opened": held.len(), "error": error })))
}

fn tools() -> Vec<Tool> {
    use Effect::*;
    vec![
        Tool::new("echo", "Returns its input text.", ReadOnly, echo).idempotent(),
        Tool::new("spin", "Loops forever.", ReadOnly, spin),
        Tool::new("spin_host", "Loops forever calling the host's log import.", ReadOnly, spin_host),
        Tool::new("recurse", "Recurses without bound.", ReadOnly, recurse),
        Tool::new("recurse_frames", "Recurses with big frames.", ReadOnly, recurse_frames),
        Tool::new("grow", "Allocates `mib` MiB.", ReadOnly, grow),
        Tool::new("huge_output", "Returns a string of `mib` MiB.", ReadOnly, huge_output),
        Tool::new("huge_error", "Fails with a message of `mib` MiB.", ReadOnly, huge_error),
        Tool::new("flood", "Writes `mib` MiB to stdout (or stderr).", ReadOnly, flood),
        Tool::new("sleep", "Sleeps `ms` milliseconds in a blocking host call.", ReadOnly, sleep),
        Tool::new("boom", "Panics.", ReadOnly, boom),
        Tool::new("counter", "Counts calls in a static.", ReadOnly, counter),
        Tool::new("residue", "Checks fresh pages are zero, then dirties them.", ReadOnly, residue),
        Tool::new("env", "Reports environment, arguments and working directory.", ReadOnly, env),
        Tool::new("read", "Reads a file.", ReadOnly, read),
        Tool::new("list", "Lists a directory.", ReadOnly, list),
        Tool::new("write", "Writes a file.", WorkspaceWrite, write),
        Tool::new("truncate", "Truncates a file.", Destructive, truncate),
        Tool::new("delete", "Deletes a file.", Destructive, delete),
        Tool::new("mkdir", "Creates a directory.", WorkspaceWrite, mkdir),
        Tool::new("rename", "Renames a file.", Destructive, rename),
        Tool::new("hard_link", "Hard-links a file.", WorkspaceWrite, hard_link),
        Tool::new("hold_open", "Opens a file many times and holds it.", ReadOnly, hold_open),
    ]
}

keel_sdk::export_tools!(tools);
