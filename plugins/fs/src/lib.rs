//! `fs`: keel's first-party file tools.
//!
//! Every path is a guest path inside a directory granted to the session (for example
//! `/workspace/notes.md`); the sandbox refuses anything else. Results are bounded so that one
//! call can never flood the model's context.

use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use keel_sdk::{Effect, JsonSchema, Tool, ToolError};
use serde::{Deserialize, Serialize};

/// Lines `fs_read_file` returns when no `limit` is given.
const DEFAULT_READ_LINES: usize = 2000;
/// Bytes of text `fs_read_file` returns at most, whatever `limit` says.
const MAX_READ_BYTES: usize = 256 * 1024;
/// Entries `fs_list_dir` returns at most.
const MAX_LIST_ENTRIES: usize = 1000;
/// Depth `fs_list_dir` descends at most when `recursive` is set.
const MAX_LIST_DEPTH: usize = 16;
/// Matches `fs_search` returns when no `max_results` is given, and the most it accepts.
const DEFAULT_SEARCH_RESULTS: usize = 100;
const MAX_SEARCH_RESULTS: usize = 1000;
/// Files larger than this are skipped by `fs_search`.
const MAX_SEARCH_FILE_BYTES: u64 = 8 * 1024 * 1024;
/// Files `fs_search` opens at most.
const MAX_SEARCH_FILES: usize = 10_000;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadInput {
    /// Path of the text file to read.
    path: String,
    /// First line to return, counting from 0. Default 0.
    #[serde(default)]
    offset: Option<usize>,
    /// Most lines to return. Default 2000.
    #[serde(default)]
    limit: Option<usize>,
}

#[derive(Serialize, JsonSchema)]
struct ReadOutput {
    path: String,
    /// The requested lines, joined with `\n`.
    content: String,
    /// First line returned (0-based).
    offset: usize,
    /// Number of lines returned.
    lines: usize,
    /// Total lines in the file.
    total_lines: usize,
    /// True when more lines follow; read them with a larger `offset`.
    truncated: bool,
}

fn read_file(input: ReadInput) -> Result<ReadOutput, ToolError> {
    let file = fs::File::open(&input.path).map_err(|e| ToolError::io(&input.path, &e))?;
    let offset = input.offset.unwrap_or(0);
    let limit = input.limit.unwrap_or(DEFAULT_READ_LINES);
    let mut content = String::new();
    let mut lines = 0;
    let mut total_lines = 0;
    let mut truncated = false;
    for line in BufReader::new(file).lines() {
        let line = line.map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => ToolError::Failed(format!(
                "{}: not a UTF-8 text file; fs_read_file reads text only",
                input.path
            )),
            _ => ToolError::io(&input.path, &e),
        })?;
        total_lines += 1;
        if total_lines <= offset {
            continue;
        }
        if lines >= limit || content.len() + line.len() + 1 > MAX_READ_BYTES {
            truncated = true;
            continue;
        }
        if lines > 0 {
            content.push('\n');
        }
        content.push_str(&line);
        lines += 1;
    }
    Ok(ReadOutput { path: input.path, content, offset, lines, total_lines, truncated })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteInput {
    /// Path of the file to create or replace.
    path: String,
    /// The complete new content of the file.
    content: String,
}

#[derive(Serialize, JsonSchema)]
struct WriteOutput {
    path: String,
    bytes_written: usize,
    /// True when the file did not exist before.
    created: bool,
}

fn write_file(input: WriteInput) -> Result<WriteOutput, ToolError> {
    let created = !Path::new(&input.path).exists();
    if let Some(parent) = Path::new(&input.path).parent()
        && !parent.as_os_str().is_empty()
        && !parent.exists()
    {
        fs::create_dir_all(parent).map_err(|e| ToolError::io(&input.path, &e))?;
    }
    fs::write(&input.path, input.content.as_bytes()).map_err(|e| ToolError::io(&input.path, &e))?;
    Ok(WriteOutput { path: input.path, bytes_written: input.content.len(), created })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListInput {
    /// Directory to list.
    path: String,
    /// Also list subdirectories (bounded depth and count). Default false.
    #[serde(default)]
    recursive: bool,
}

#[derive(Serialize, JsonSchema)]
struct Entry {
    path: String,
    /// `file`, `dir` or `symlink`.
    kind: &'static str,
    /// Size in bytes (files only).
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
}

#[derive(Serialize, JsonSchema)]
struct ListOutput {
    path: String,
    entries: Vec<Entry>,
    /// True when the listing stopped at its bound (1000 entries or depth 16).
    truncated: bool,
}

fn list_dir(input: ListInput) -> Result<ListOutput, ToolError> {
    let mut entries = Vec::new();
    let mut truncated = false;
    let mut pending = vec![(PathBuf::from(&input.path), 0usize)];
    while let Some((dir, depth)) = pending.pop() {
        let mut children: Vec<_> = fs::read_dir(&dir)
            .map_err(|e| ToolError::io(&dir.to_string_lossy(), &e))?
            .filter_map(Result::ok)
            .collect();
        children.sort_by_key(|e| e.file_name());
        for child in children {
            if entries.len() >= MAX_LIST_ENTRIES {
                truncated = true;
                break;
            }
            let path = child.path();
            let Ok(kind) = child.file_type() else { continue };
            let (kind, size) = if kind.is_symlink() {
                ("symlink", None)
            } else if kind.is_dir() {
                if input.recursive {
                    if depth + 1 < MAX_LIST_DEPTH {
                        pending.push((path.clone(), depth + 1));
                    } else {
                        truncated = true;
                    }
                }
                ("dir", None)
            } else {
                ("file", child.metadata().ok().map(|m| m.len()))
            };
            entries.push(Entry { path: path.to_string_lossy().into_owned(), kind, size });
        }
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(ListOutput { path: input.path, entries, truncated })
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchInput {
    /// File or directory to search (directories are searched recursively).
    path: String,
    /// Text to find (plain text, case-sensitive).
    pattern: String,
    /// Most matches to return (default 100, at most 1000).
    #[serde(default)]
    max_results: Option<usize>,
}

#[derive(Serialize, JsonSchema)]
struct Match {
    path: String,
    /// Line number, counting from 1.
    line: usize,
    text: String,
}

#[derive(Serialize, JsonSchema)]
struct SearchOutput {
    matches: Vec<Match>,
    files_searched: usize,
    /// True when the search stopped at `max_results` or its file bound.
    truncated: bool,
}

fn search(input: SearchInput) -> Result<SearchOutput, ToolError> {
    if input.pattern.is_empty() {
        return Err(ToolError::InvalidInput("`pattern` must not be empty".into()));
    }
    let max = input.max_results.unwrap_or(DEFAULT_SEARCH_RESULTS).clamp(1, MAX_SEARCH_RESULTS);
    let root = PathBuf::from(&input.path);
    let meta = fs::symlink_metadata(&root).map_err(|e| ToolError::io(&input.path, &e))?;
    let mut out = SearchOutput { matches: Vec::new(), files_searched: 0, truncated: false };
    let mut pending = vec![root];
    if !meta.is_dir() {
        search_file(&pending[0], &input.pattern, max, &mut out);
        return Ok(out);
    }
    while let Some(dir) = pending.pop() {
        let Ok(read) = fs::read_dir(&dir) else { continue };
        let mut children: Vec<_> = read.filter_map(Result::ok).collect();
        children.sort_by_key(|e| std::cmp::Reverse(e.file_name()));
        for child in children {
            let Ok(kind) = child.file_type() else { continue };
            if kind.is_dir() {
                pending.push(child.path());
            } else if kind.is_file() {
                if out.matches.len() >= max || out.files_searched >= MAX_SEARCH_FILES {
                    out.truncated = true;
                    break;
                }
                search_file(&child.path(), &input.pattern, max, &mut out);
            }
        }
        if out.truncated {
            break;
        }
    }
    out.matches.sort_by(|a, b| (&a.path, a.line).cmp(&(&b.path, b.line)));
    Ok(out)
}

fn search_file(path: &Path, pattern: &str, max: usize, out: &mut SearchOutput) {
    let Ok(file) = fs::File::open(path) else { return };
    if file.metadata().map(|m| m.len() > MAX_SEARCH_FILE_BYTES).unwrap_or(true) {
        return;
    }
    let mut bytes = Vec::new();
    if file.take(MAX_SEARCH_FILE_BYTES).read_to_end(&mut bytes).is_err() {
        return;
    }
    out.files_searched += 1;
    let Ok(text) = String::from_utf8(bytes) else { return };
    for (i, line) in text.lines().enumerate() {
        if line.contains(pattern) {
            if out.matches.len() >= max {
                out.truncated = true;
                return;
            }
            let text: String = line.chars().take(500).collect();
            out.matches.push(Match {
                path: path.to_string_lossy().into_owned(),
                line: i + 1,
                text,
            });
        }
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct DeleteInput {
    /// Files to delete (not directories).
    paths: Vec<String>,
}

#[derive(Serialize, JsonSchema)]
struct DeleteOutput {
    deleted: Vec<String>,
    /// Paths that did not exist.
    missing: Vec<String>,
}

fn delete_files(input: DeleteInput) -> Result<DeleteOutput, ToolError> {
    if input.paths.is_empty() {
        return Err(ToolError::InvalidInput("`paths` must name at least one file".into()));
    }
    let mut out = DeleteOutput { deleted: Vec::new(), missing: Vec::new() };
    for path in input.paths {
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {
                return Err(ToolError::InvalidInput(format!(
                    "{path} is a directory; fs_delete_files deletes files only"
                )));
            }
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && !e.to_string().contains("pre-opened") =>
            {
                out.missing.push(path);
                continue;
            }
            Err(e) => return Err(ToolError::io(&path, &e)),
        }
        fs::remove_file(&path).map_err(|e| ToolError::io(&path, &e))?;
        out.deleted.push(path);
    }
    Ok(out)
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "fs_read_file",
            "Reads a UTF-8 text file and returns a range of its lines (offset/limit).",
            Effect::ReadOnly,
            read_file,
        )
        .idempotent(),
        Tool::new(
            "fs_write_file",
            "Creates or replaces a text file with the given content; creates missing parent directories.",
            Effect::WorkspaceWrite,
            write_file,
        )
        .idempotent(),
        Tool::new(
            "fs_list_dir",
            "Lists a directory's entries (optionally recursive, at most 1000 entries); symlinks are reported, not followed.",
            Effect::ReadOnly,
            list_dir,
        )
        .idempotent(),
        Tool::new(
            "fs_search",
            "Finds lines containing a text across the files under a path; results are bounded.",
            Effect::ReadOnly,
            search,
        )
        .idempotent(),
        Tool::new(
            "fs_delete_files",
            "Deletes the given files. Cannot be undone.",
            Effect::Destructive,
            delete_files,
        ),
    ]
}

keel_sdk::export_tools!(tools);
