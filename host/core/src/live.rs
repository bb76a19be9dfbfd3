//! The text a model is writing, while it is written, for every process that follows the
//! session — `keel session events --follow`, the HTTP event stream, the console — not only the
//! one running the turn. It is transient: the durable message is written when the reply is
//! in, and this is never read back as history.
//!
//! The runner of a turn appends each piece to a file of the session's under `HOME/live/` (one
//! JSON line per piece; no sync: a lost piece is a flicker, never a lost fact) and removes the
//! file when the turn's drive ends. A follower reads what was appended since it last looked,
//! starting over when the file was replaced.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Most bytes a follower reads in one look (a burst past it is read on the next).
const MAX_READ: u64 = 1 << 20;

/// One piece of a reply's text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    /// The model call (step) it belongs to.
    pub step: i64,
    pub text: String,
    /// The text of this step so far is void (its attempt failed and the call is made again);
    /// `text` starts it over.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restart: bool,
}

/// The live-text files of one keel home.
#[derive(Debug, Clone)]
pub struct Live {
    dir: PathBuf,
}

impl Live {
    /// The live text of the keel home at `root`.
    pub fn at(root: &Path) -> Self {
        Self { dir: root.join("live") }
    }

    /// The file of session `id` (named by a digest of the id: any id is a safe name).
    fn path(&self, id: &str) -> PathBuf {
        let digest = crate::digest::sha256_hex(id.as_bytes());
        self.dir.join(format!("{}.jsonl", &digest[..32]))
    }

    /// A writer for the turn of session `id` this process is about to run.
    pub fn writer(&self, id: &str) -> LiveWriter {
        LiveWriter { dir: self.dir.clone(), path: self.path(id), file: Mutex::new(None) }
    }

    /// A follower of session `id`'s live text, from what is there now.
    pub fn reader(&self, id: &str) -> LiveReader {
        LiveReader { path: self.path(id), file: None, offset: 0, partial: Vec::new() }
    }
}

/// Appends the pieces of one drive of a session's turns; removes its file when dropped.
pub struct LiveWriter {
    dir: PathBuf,
    path: PathBuf,
    /// Opened (created, truncated) at the first piece: a drive that streams nothing touches no
    /// file, and never removes another runner's.
    file: Mutex<Option<File>>,
}

impl LiveWriter {
    /// Appends a piece. Failures are ignored: live text is a courtesy, the durable message is
    /// the record.
    pub fn push(&self, step: i64, text: &str) {
        self.append(Delta { step, text: text.to_string(), restart: false });
    }

    /// Says that step `step`'s text so far is void: its call is made again.
    pub fn restart(&self, step: i64) {
        self.append(Delta { step, text: String::new(), restart: true });
    }

    fn append(&self, delta: Delta) {
        let Ok(mut slot) = self.file.lock() else { return };
        if slot.is_none() {
            use std::os::unix::fs::OpenOptionsExt;
            let _ = crate::home::create_private_dir(&self.dir);
            *slot = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(true)
                .mode(0o600)
                .open(&self.path)
                .ok();
        }
        if let Some(f) = slot.as_mut()
            && let Ok(mut line) = serde_json::to_vec(&delta)
        {
            line.push(b'\n');
            let _ = f.write_all(&line);
        }
    }
}

impl Drop for LiveWriter {
    fn drop(&mut self) {
        if let Ok(slot) = self.file.get_mut()
            && slot.take().is_some()
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Follows one session's live text.
pub struct LiveReader {
    path: PathBuf,
    /// The file being read, with its identity: a new file (a new drive) starts over.
    file: Option<(File, (u64, u64))>,
    offset: u64,
    /// The start of a line not complete yet.
    partial: Vec<u8>,
}

fn identity(f: &File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    f.metadata().ok().map(|m| (m.dev(), m.ino()))
}

impl LiveReader {
    /// The pieces appended since the last call (none when no turn is streaming).
    pub fn poll(&mut self) -> Vec<Delta> {
        let current = File::open(&self.path).ok();
        let Some(current) = current else {
            self.file = None;
            return Vec::new();
        };
        let id = identity(&current);
        let same = matches!((&self.file, id), (Some((_, a)), Some(b)) if *a == b);
        if !same {
            self.file = id.map(|id| (current, id));
            self.offset = 0;
            self.partial.clear();
        }
        let Some((f, _)) = self.file.as_mut() else { return Vec::new() };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            // Truncated under us: start over.
            self.offset = 0;
            self.partial.clear();
        }
        if len == self.offset || f.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut bytes = Vec::new();
        let read = f.take(MAX_READ).read_to_end(&mut bytes).unwrap_or(0);
        self.offset += read as u64;
        self.partial.extend_from_slice(&bytes);
        let mut out = Vec::new();
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            if let Ok(d) = serde_json::from_slice::<Delta>(&line) {
                out.push(d);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_reads_what_was_appended_and_starts_over_with_a_new_drive() {
        let home = tempfile::tempdir().unwrap();
        let live = Live::at(home.path());
        let mut reader = live.reader("s/../1");
        assert!(reader.poll().is_empty(), "nothing streams yet");
        let w = live.writer("s/../1");
        w.push(1, "The first ");
        w.push(1, "words");
        assert_eq!(
            reader.poll().iter().map(|d| d.text.as_str()).collect::<String>(),
            "The first words"
        );
        assert!(reader.poll().is_empty(), "nothing new");
        w.push(2, "more");
        assert_eq!(reader.poll(), vec![Delta { step: 2, text: "more".into(), restart: false }]);
        w.restart(2);
        assert_eq!(reader.poll(), vec![Delta { step: 2, text: String::new(), restart: true }]);
        drop(w);
        assert!(reader.poll().is_empty(), "the drive ended: its file is gone");
        let w = live.writer("s/../1");
        w.push(3, "again");
        assert_eq!(reader.poll(), vec![Delta { step: 3, text: "again".into(), restart: false }]);
        // A writer that streamed nothing leaves the running drive's file alone.
        drop(live.writer("s/../1"));
        w.push(3, "!");
        assert_eq!(reader.poll(), vec![Delta { step: 3, text: "!".into(), restart: false }]);
    }
}
