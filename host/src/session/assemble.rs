//! Request assembly and request evidence ("model-visible means logged").
//!
//! Every request body is built the same way from parts: a head (model and parameters), the
//! system message (prompt, goals, workspace), the history from the context start, and the tool
//! schemas. The evidence of a step stores the head, the system message and tool schemas by
//! content hash (identical ones are stored once), and the history range; rebuilding from those
//! parts reproduces the body byte for byte, checked against the recorded sha256.

use rusqlite::{Connection, OptionalExtension, params};

use crate::sandbox::{Access, sha256_hex};
use crate::store::{StoreError, now_ms};

use super::facts::{SessionMeta, load_meta};

/// One assembled request and the facts it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Assembled {
    pub step: i64,
    pub head: String,
    pub system: String,
    pub tools: Option<String>,
    pub history_from: i64,
    pub history_to: i64,
    pub meta_version: i64,
    /// The exact request bytes (shared, not copied, by the model client and its retries).
    pub body: bytes::Bytes,
    pub body_sha256: String,
}

/// Builds the body from its parts. The only place a request body is built.
pub fn reconstruct_body(
    head: &str,
    system: &str,
    history: &[String],
    tools: Option<&str>,
) -> Vec<u8> {
    let mut body = String::with_capacity(
        head.len() + system.len() + history.iter().map(String::len).sum::<usize>() + 64,
    );
    body.push_str(head.trim_end_matches('}'));
    body.push_str(",\"messages\":[");
    body.push_str(system);
    for m in history {
        body.push(',');
        body.push_str(m);
    }
    body.push(']');
    if let Some(t) = tools {
        body.push_str(",\"tools\":");
        body.push_str(t);
    }
    body.push('}');
    body.into_bytes()
}

fn system_message(meta: &SessionMeta) -> String {
    let mut text = meta.system_prompt.clone();
    if let Some(goal) = &meta.session_goal {
        text.push_str("\n\nSession goal: ");
        text.push_str(goal);
    }
    if let Some(phase) = &meta.phase_goal {
        text.push_str("\nCurrent phase goal: ");
        text.push_str(phase);
    }
    if meta.grants.is_empty() {
        text.push_str("\n\nNo directories are granted to this session.");
    } else {
        text.push_str("\n\nDirectories your tools can reach (nothing else exists for them):");
        for g in &meta.grants {
            let access = if g.access == Access::Rw { "read-write" } else { "read-only" };
            text.push_str(&format!("\n- {} ({access})", g.guest));
        }
    }
    serde_json::json!({"role": "system", "content": text}).to_string()
}

fn head(meta: &SessionMeta) -> String {
    let mut head = serde_json::Map::new();
    head.insert("model".into(), meta.model.model.clone().into());
    if meta.model.stream {
        head.insert("stream".into(), true.into());
    }
    if let Some(t) = meta.model.temperature {
        head.insert("temperature".into(), t.into());
    }
    if let Some(m) = meta.model.max_tokens {
        head.insert("max_tokens".into(), m.into());
    }
    serde_json::Value::Object(head).to_string()
}

pub fn history(c: &Connection, id: &str, from: i64, to: i64) -> Result<Vec<String>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT body FROM messages WHERE session_id=?1 AND seq>=?2 AND seq<=?3 ORDER BY seq",
    )?;
    let rows = stmt.query_map(params![id, from, to], |r| r.get::<_, String>(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Histories already read, by session. History rows are append-only (a committed message is
/// never updated or deleted, and sequence numbers only grow), so a session's history, once read
/// up to some sequence number, needs only the rows after it — whichever process committed
/// them. This turns assembling a step's request from a read of the whole history into a read
/// of the messages since the last step. Only [`assemble`] uses it; the evidence of a step is
/// always rebuilt from the rows themselves.
#[derive(Default)]
pub struct HistoryCache {
    sessions: std::sync::Mutex<std::collections::HashMap<String, CachedHistory>>,
}

/// Sessions whose history is kept; past that, an arbitrary one is dropped (and re-read in full
/// on its next step).
const CACHED_SESSIONS: usize = 256;

struct CachedHistory {
    /// First and last sequence numbers read.
    from: i64,
    to: i64,
    bodies: Vec<String>,
}

impl HistoryCache {
    fn take(&self, id: &str) -> Option<CachedHistory> {
        self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(id)
    }

    fn put(&self, id: &str, history: CachedHistory) {
        let mut map = self.sessions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= CACHED_SESSIONS
            && let Some(victim) = map.keys().next().cloned()
        {
            map.remove(&victim);
        }
        map.insert(id.to_string(), history);
    }

    /// The history of `id` over `from..=to`: the cached part, plus the rows after it.
    fn read(
        &self,
        c: &Connection,
        id: &str,
        from: i64,
        to: i64,
    ) -> Result<CachedHistory, StoreError> {
        let mut h = self
            .take(id)
            // A different context start (compaction) or a snapshot older than the cached one:
            // read it all.
            .filter(|h| h.from == from && h.to <= to)
            .unwrap_or(CachedHistory { from, to: from - 1, bodies: Vec::new() });
        if h.to < to {
            h.bodies.extend(history(c, id, h.to + 1, to)?);
            h.to = to;
        }
        Ok(h)
    }
}

/// Assembles the next request of session `id`; `tools` gives the serialized tool schemas of
/// the session's loaded tools.
pub fn assemble(
    c: &Connection,
    id: &str,
    cache: &HistoryCache,
    tools: impl FnOnce(&SessionMeta) -> Option<std::sync::Arc<str>>,
) -> Result<(SessionMeta, Assembled), StoreError> {
    let meta = load_meta(c, id)?;
    let history_from = meta.context_start + 1;
    let history_to: i64 = c
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM messages WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))?;
    let messages = cache.read(c, id, history_from, history_to)?;
    let tools_json: Option<String> = tools(&meta).map(|t| t.to_string());
    let head = head(&meta);
    let system = system_message(&meta);
    let body = reconstruct_body(&head, &system, &messages.bodies, tools_json.as_deref());
    cache.put(id, messages);
    let body_sha256 = sha256_hex(&body);
    let assembled = Assembled {
        step: meta.steps + 1,
        head,
        system,
        tools: tools_json,
        history_from,
        history_to,
        meta_version: meta.meta_version,
        body: body.into(),
        body_sha256,
    };
    Ok((meta, assembled))
}

fn put_blob(c: &Connection, text: &str) -> Result<String, StoreError> {
    let hash = sha256_hex(text.as_bytes());
    c.prepare_cached("INSERT OR IGNORE INTO blobs (hash, body) VALUES (?1, ?2)")?
        .execute(params![hash, text])?;
    Ok(hash)
}

fn blob(c: &Connection, hash: &str) -> Result<String, StoreError> {
    Ok(c.prepare_cached("SELECT body FROM blobs WHERE hash=?1")?.query_row([hash], |r| r.get(0))?)
}

pub fn record_evidence(c: &Connection, id: &str, a: &Assembled) -> Result<(), StoreError> {
    let system_hash = put_blob(c, &a.system)?;
    let tools_hash = a.tools.as_deref().map(|t| put_blob(c, t)).transpose()?;
    let head_hash = put_blob(c, &a.head)?;
    c.prepare_cached(
        "INSERT INTO evidence (session_id, step, created_at, head, system_hash, tools_hash, history_from,
                               history_to, body_sha256, meta_version)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        id,
        a.step,
        now_ms(),
        head_hash,
        system_hash,
        tools_hash,
        a.history_from,
        a.history_to,
        a.body_sha256,
        a.meta_version
    ])?;
    c.prepare_cached("UPDATE sessions SET steps=?2 WHERE id=?1")?.execute(params![id, a.step])?;
    Ok(())
}

pub fn evidence(c: &Connection, id: &str, step: Option<i64>) -> Result<(i64, Vec<u8>), StoreError> {
    load_meta(c, id)?;
    let step = match step {
        Some(s) => s,
        None => c
            .prepare_cached("SELECT COALESCE(MAX(step), 0) FROM evidence WHERE session_id=?1")?
            .query_row([id], |r| r.get(0))?,
    };
    let row = c
        .prepare_cached(
            "SELECT head, system_hash, tools_hash, history_from, history_to, body_sha256
             FROM evidence WHERE session_id=?1 AND step=?2",
        )?
        .query_row(params![id, step], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, String>(5)?,
            ))
        })
        .optional()?;
    let Some((head_hash, system_hash, tools_hash, from, to, sha)) = row else {
        return Err(StoreError::Invalid(format!(
            "session `{id}` has no model request at step {step}"
        )));
    };
    let head = blob(c, &head_hash)?;
    let system = blob(c, &system_hash)?;
    let tools = tools_hash.map(|h| blob(c, &h)).transpose()?;
    let body = reconstruct_body(&head, &system, &history(c, id, from, to)?, tools.as_deref());
    if sha256_hex(&body) != sha {
        return Err(StoreError::Invalid(format!(
            "the evidence of step {step} does not rebuild to its recorded digest; the history was altered"
        )));
    }
    Ok((step, body))
}
