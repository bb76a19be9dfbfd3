//! Content-addressed text (`blobs`): request parts and the exact requests of supporting calls
//! (task understanding, the Orchestrator), stored once by SHA-256.

use crate::sql::{Connection, OptionalExtension, params};

use crate::store::StoreError;

/// Stores `text` under `sha256` (once).
pub fn put_in(c: &Connection, sha256: &str, text: &str) -> Result<(), StoreError> {
    c.prepare_cached("INSERT INTO blobs (hash, body) VALUES (?1, ?2) ON CONFLICT DO NOTHING")?
        .execute(params![sha256, text])?;
    Ok(())
}

/// The text stored under `sha256`.
pub fn get_in(c: &Connection, sha256: &str) -> Result<String, StoreError> {
    Ok(c.prepare_cached("SELECT body FROM blobs WHERE hash=?1")?
        .query_row([sha256], |r| r.get(0))?)
}

/// Stores a supporting call's request body; returns its SHA-256 and size. `what` names the
/// call in the error of a body that is not UTF-8.
pub fn put_request_in(
    c: &Connection,
    body: &[u8],
    what: &str,
) -> Result<(String, i64), StoreError> {
    let sha = crate::digest::sha256_hex(body);
    let text = std::str::from_utf8(body)
        .map_err(|_| StoreError::Corrupt(format!("{what} request is not UTF-8")))?;
    put_in(c, &sha, text)?;
    Ok((sha, body.len() as i64))
}

/// Supporting calls whose exact requests are kept, by the table that records them.
#[derive(Debug, Clone, Copy)]
pub enum CallKind {
    Understanding,
    Orchestration,
}

impl CallKind {
    fn table(self) -> &'static str {
        match self {
            Self::Understanding => "task_transitions",
            Self::Orchestration => "orchestrations",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Understanding => "understanding",
            Self::Orchestration => "orchestration",
        }
    }
}

/// The exact request body of session `id`'s `kind` call of turn `turn` (the last turn that
/// made one if `None`), byte for byte.
pub fn call_evidence_in(
    c: &Connection,
    id: &str,
    kind: CallKind,
    turn: Option<i64>,
) -> Result<(i64, Vec<u8>), StoreError> {
    super::facts::load_counters(c, id)?;
    let sql = format!(
        "SELECT turn, body_sha256 FROM {} WHERE session_id=?1 AND (CAST(?2 AS BIGINT) IS NULL OR turn=?2)
         AND body_sha256 IS NOT NULL ORDER BY turn DESC LIMIT 1",
        kind.table()
    );
    let row: Option<(i64, String)> = c
        .prepare_cached(&sql)?
        .query_row(params![id, turn], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((turn, sha)) = row else {
        let what = kind.name();
        return Err(StoreError::NotFound(match turn {
            Some(t) => format!("turn {t} of session `{id}` made no {what} call"),
            None => format!("session `{id}` has made no {what} call"),
        }));
    };
    Ok((turn, get_in(c, &sha)?.into_bytes()))
}
