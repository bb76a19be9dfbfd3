//! Content-addressed text (`blobs`): request parts and the exact requests of supporting calls
//! (task understanding, the Orchestrator, summaries), stored once by SHA-256.

use crate::sql::{Connection, params};

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
