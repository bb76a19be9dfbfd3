//! The pre-images a session's calls replaced, kept with their journal entries: content-
//! addressed bytes (`file_blobs`, one row per content, whichever sessions share it) and, per
//! session, which of them it holds and their size (`session_preimages`), within the session's
//! bound (`[undo] max_session`). A pre-image over that bound is not kept, and the change that
//! refers to it says so.

use crate::sql::{Connection, OptionalExtension, params};
use crate::store::StoreError;
use crate::tools::Kept;

/// Keeps `kept` for session `id` in the transaction of the journal entry whose change set is
/// `changes` (JSON). Returns the change set to store: `changes` itself, or, when a pre-image
/// passed the session's bound, `changes` with those files marked not restorable.
pub(super) fn keep_in(
    c: &Connection,
    id: &str,
    changes: Option<&str>,
    kept: &Kept,
) -> Result<Option<String>, StoreError> {
    if kept.blobs.is_empty() {
        return Ok(changes.map(str::to_string));
    }
    let mut used: i64 = c
        .prepare_cached(
            "SELECT COALESCE(SUM(size), 0) FROM session_preimages WHERE session_id=?1",
        )?
        .query_row([id], |r| r.get(0))?;
    let bound = i64::try_from(kept.session_bound).unwrap_or(i64::MAX);
    let mut over = Vec::new();
    for blob in &kept.blobs {
        let held: Option<i64> = c
            .prepare_cached("SELECT size FROM session_preimages WHERE session_id=?1 AND sha256=?2")?
            .query_row(params![id, blob.sha256], |r| r.get(0))
            .optional()?;
        if held.is_some() {
            continue;
        }
        let size = blob.bytes.len() as i64;
        if used.saturating_add(size) > bound {
            over.push(blob.sha256.as_str());
            continue;
        }
        c.prepare_cached(
            "INSERT INTO file_blobs (sha256, bytes) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
        )?
        .execute(params![blob.sha256, blob.bytes.as_slice()])?;
        c.prepare_cached(
            "INSERT INTO session_preimages (session_id, sha256, size) VALUES (?1, ?2, ?3)",
        )?
        .execute(params![id, blob.sha256, size])?;
        used += size;
    }
    let Some(text) = changes else { return Ok(None) };
    if over.is_empty() {
        return Ok(Some(text.to_string()));
    }
    let mut set: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("a change set does not read: {e}")))?;
    let reason = format!(
        "the session had kept {} of pre-images already, and its bound is {} ([undo] max_session)",
        crate::units::format_size(u64::try_from(used).unwrap_or(0)),
        crate::units::format_size(kept.session_bound)
    );
    for list in ["modified", "deleted"] {
        for change in set[list].as_array_mut().into_iter().flatten() {
            let Some(sha) = change["before_sha256"].as_str() else { continue };
            if over.contains(&sha)
                && let Some(o) = change.as_object_mut()
            {
                o.remove("before_sha256");
                o.remove("before_mode");
                o.insert("not_restorable".into(), reason.clone().into());
            }
        }
    }
    Ok(Some(set.to_string()))
}

/// The bytes of the pre-image `sha256` that session `id` holds.
pub(crate) fn bytes_in(
    c: &Connection,
    id: &str,
    sha256: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT b.bytes FROM file_blobs b JOIN session_preimages p ON p.sha256 = b.sha256
         WHERE p.session_id=?1 AND b.sha256=?2",
    )?
    .query_row(params![id, sha256], |r| r.get(0))
    .optional()?)
}

/// Forgets session `id`'s pre-images, and the bytes no other session holds.
pub(super) fn delete_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    let held: Vec<String> = c
        .prepare_cached("SELECT sha256 FROM session_preimages WHERE session_id=?1")?
        .query_map([id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    c.prepare_cached("DELETE FROM session_preimages WHERE session_id=?1")?.execute([id])?;
    for sha in held {
        c.prepare_cached(
            "DELETE FROM file_blobs WHERE sha256=?1
             AND NOT EXISTS (SELECT 1 FROM session_preimages WHERE sha256=?1)",
        )?
        .execute([sha])?;
    }
    Ok(())
}
