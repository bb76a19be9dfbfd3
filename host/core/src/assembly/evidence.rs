//! Request evidence: the parts of each request stored by content hash, the evidence of a
//! step and of a refused request, rebuilt byte for byte; model-call records and token
//! estimates.

use super::*;

fn put_blob(c: &Connection, part: &Part) -> Result<(), StoreError> {
    crate::store::blobs::put_in(c, &part.sha256, &part.text)
}

fn blob(c: &Connection, hash: &str) -> Result<String, StoreError> {
    crate::store::blobs::get_in(c, hash)
}

/// Stores the parts of `a` (head, system message, tool schemas) that `stored` does not know
/// to be in the database already.
fn put_parts(c: &Connection, a: &Assembled, stored: &StoredParts) -> Result<(), StoreError> {
    for part in a.parts() {
        if !stored.contains(&part.sha256) {
            put_blob(c, part)?;
        }
    }
    Ok(())
}

/// Records the evidence of request `a`: its row, and the parts (head, system message, tool
/// schemas) that `stored` does not know to be in the database already. The caller records the
/// step number with the session's state, in the same transaction.
pub fn record_evidence(
    c: &Connection,
    id: &str,
    a: &Assembled,
    stored: &StoredParts,
) -> Result<(), StoreError> {
    put_parts(c, a, stored)?;
    let usage = a.call.usage;
    c.prepare_cached(
        "INSERT INTO evidence (session_id, step, created_at, head, system_hash, tools_hash, history_from,
                               history_to, body_sha256, meta_version, turn, body_bytes, finish_reason,
                               prompt_tokens, completion_tokens, cached_tokens, duration_ms, attempts,
                               anchor, result_cap, notes_hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19,
                 ?20, ?21)",
    )?
    .execute_pipelined(params![
        id,
        a.step,
        now_ms(),
        &*a.head.sha256,
        &*a.system.sha256,
        a.tools.as_ref().map(|t| &*t.sha256),
        a.history_from,
        a.history_to,
        a.body_sha256,
        a.meta_version,
        a.call.turn,
        a.body.len() as i64,
        a.call.finish_reason,
        usage.map(|u| u.prompt_tokens as i64),
        usage.map(|u| u.completion_tokens as i64),
        usage.and_then(|u| u.cached_tokens).map(|t| t as i64),
        a.call.duration_ms,
        a.call.attempts,
        a.anchor,
        a.result_cap.map(|c| c as i64),
        a.notes.as_ref().map(|n| &*n.sha256),
    ])?;
    crate::session::events::append(
        c,
        id,
        &crate::session::events::SessionEvent::ModelCallFinished {
            step: a.step,
            finish_reason: a.call.finish_reason.clone(),
            usage: a.call.usage,
            ms: a.call.duration_ms,
            attempts: a.call.attempts,
            empty: a.call.empty,
        },
    )?;
    Ok(())
}

/// Records request `a`, which did not come back as a reply (`error`, with the HTTP status the
/// server gave if it gave one), under the session's next refused-request number; returns it.
pub fn record_refused(
    c: &Connection,
    id: &str,
    a: &Assembled,
    http_status: Option<u16>,
    error: &str,
    stored: &StoredParts,
) -> Result<i64, StoreError> {
    put_parts(c, a, stored)?;
    crate::session::lock_in(c, id)?;
    let seq: i64 = c
        .prepare_cached(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM refused_requests WHERE session_id=?1",
        )?
        .query_row([id], |r| r.get(0))?;
    c.prepare_cached(
        "INSERT INTO refused_requests (session_id, seq, turn, step, created_at, http_status, error,
             attempts, duration_ms, head, system_hash, tools_hash, history_from, history_to,
             body_sha256, body_bytes, meta_version, anchor, result_cap, notes_hash)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
                 ?19, ?20)",
    )?
    .execute(params![
        id,
        seq,
        a.call.turn,
        a.step,
        now_ms(),
        http_status,
        error,
        a.call.attempts,
        a.call.duration_ms,
        &*a.head.sha256,
        &*a.system.sha256,
        a.tools.as_ref().map(|t| &*t.sha256),
        a.history_from,
        a.history_to,
        a.body_sha256,
        a.body.len() as i64,
        a.meta_version,
        a.anchor,
        a.result_cap.map(|c| c as i64),
        a.notes.as_ref().map(|n| &*n.sha256),
    ])?;
    crate::session::events::append(
        c,
        id,
        &crate::session::events::SessionEvent::ModelCallFailed {
            step: a.step,
            refused: seq,
            http_status,
            error: error.to_string(),
            attempts: a.call.attempts,
        },
    )?;
    Ok(seq)
}

/// The model calls of session `id`, by step.
pub fn model_calls(c: &Connection, id: &str) -> Result<Vec<ModelCallRecord>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT step, turn, body_bytes, finish_reason, prompt_tokens, completion_tokens,
                cached_tokens, duration_ms, attempts
         FROM evidence WHERE session_id=?1 ORDER BY step",
    )?;
    let rows = stmt.query_map([id], |r| {
        let prompt: Option<i64> = r.get(4)?;
        let completion: Option<i64> = r.get(5)?;
        let cached: Option<i64> = r.get(6)?;
        Ok(ModelCallRecord {
            step: r.get(0)?,
            turn: r.get(1)?,
            request_bytes: r.get(2)?,
            call: CallFacts {
                turn: r.get::<_, Option<i64>>(1)?.unwrap_or(0),
                finish_reason: r.get(3)?,
                usage: prompt.map(|p| Usage {
                    prompt_tokens: p.max(0) as u64,
                    completion_tokens: completion.unwrap_or(0).max(0) as u64,
                    cached_tokens: cached.map(|t| t.max(0) as u64),
                }),
                duration_ms: r.get::<_, Option<f64>>(7)?.unwrap_or(0.0),
                attempts: r.get::<_, Option<u32>>(8)?.unwrap_or(0),
                empty: false,
            },
        })
    })?;
    rows.collect::<Result<_, _>>().map_err(StoreError::from)
}

/// The requests of session `id` that did not come back as replies, oldest first.
pub fn refused_requests(c: &Connection, id: &str) -> Result<Vec<RefusedRequest>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT seq, turn, step, created_at, http_status, error, attempts, duration_ms, body_bytes
         FROM refused_requests WHERE session_id=?1 ORDER BY seq",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok(RefusedRequest {
            seq: r.get(0)?,
            turn: r.get(1)?,
            step: r.get(2)?,
            created_at: r.get(3)?,
            http_status: r.get(4)?,
            error: r.get(5)?,
            attempts: r.get(6)?,
            duration_ms: r.get(7)?,
            request_bytes: r.get(8)?,
        })
    })?;
    rows.collect::<Result<_, _>>().map_err(StoreError::from)
}

/// Bytes of request per token when no reply has reported usage yet: about right for English
/// text and JSON with the common tokenizers.
pub const BYTES_PER_TOKEN: f64 = 4.0;

/// An estimate of the tokens of the session's next request, before it is sent.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenEstimate {
    /// The request's size: the last request's, plus the messages since.
    pub bytes: i64,
    pub tokens: i64,
    /// Bytes per token used: from the last request whose usage the server reported, else
    /// [`BYTES_PER_TOKEN`].
    pub bytes_per_token: f64,
    /// Whether `bytes_per_token` comes from a reported usage.
    pub calibrated: bool,
}

/// Estimates the tokens of `bytes` of request, calibrated by the last request whose usage is
/// known (`(bytes, prompt tokens)`).
pub fn estimate_tokens(bytes: i64, calibration: Option<(i64, i64)>) -> TokenEstimate {
    let (bytes_per_token, calibrated) = match calibration {
        Some((b, t)) if b > 0 && t > 0 => (b as f64 / t as f64, true),
        _ => (BYTES_PER_TOKEN, false),
    };
    TokenEstimate {
        bytes,
        tokens: (bytes as f64 / bytes_per_token).ceil() as i64,
        bytes_per_token,
        calibrated,
    }
}

/// Estimates the tokens of session `id`'s next request: the last request's size plus the
/// messages committed after it (the system message and tool schemas counted as in the last
/// request), calibrated by the last reported usage. Without any request yet, the history and
/// the session's system prompt.
pub fn token_estimate(c: &Connection, id: &str) -> Result<TokenEstimate, StoreError> {
    let config = crate::session::config_in(c, id)?;
    let runtime = crate::session::runtime_in(c, id)?;
    let checkpoint = crate::compaction::current_in(c, id)?;
    let last: Option<(Option<i64>, i64, i64)> = c
        .prepare_cached(
            "SELECT body_bytes, history_from, history_to FROM evidence WHERE session_id=?1
             ORDER BY step DESC LIMIT 1",
        )?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let summary = checkpoint.as_ref().map_or(0, |cp| {
        (cp.summary.render(cp.to).len() + cp.anchor.as_ref().map_or(0, |a| a.1.len())) as i64
    });
    let (base, after) = match last {
        // A compaction since the last request: its messages up to the context start are no
        // longer sent; the summary (and anchor) are.
        Some((Some(bytes), from, to)) if from <= runtime.context_start => {
            let (gone,): (i64,) = c
                .prepare_cached(
                    "SELECT COALESCE(SUM(octet_length(body)), 0) FROM messages
                     WHERE session_id=?1 AND seq>=?2 AND seq<=?3",
                )?
                .query_row(params![id, from, runtime.context_start.min(to)], |r| {
                    Ok((r.get(0)?,))
                })?;
            ((bytes - gone + summary).max(0), to.max(runtime.context_start))
        }
        Some((Some(bytes), _, to)) => (bytes, to.max(runtime.context_start)),
        _ => (config.system_prompt.len() as i64 + 64 + summary, runtime.context_start),
    };
    let (since, count): (i64, i64) = c
        .prepare_cached(
            "SELECT COALESCE(SUM(octet_length(body)), 0), COUNT(*) FROM messages
             WHERE session_id=?1 AND seq>?2",
        )?
        .query_row(params![id, after], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let calibration: Option<(i64, i64)> = c
        .prepare_cached(
            "SELECT body_bytes, prompt_tokens FROM evidence WHERE session_id=?1
             AND body_bytes IS NOT NULL AND prompt_tokens > 0 ORDER BY step DESC LIMIT 1",
        )?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(estimate_tokens(base + since + count, calibration))
}

/// The content hashes of parts that a committed transaction of this engine stored in `blobs`.
///
/// Blobs are content-addressed and only ever inserted, so a part once committed is there for
/// good: the evidence of a step whose head, system message and tool schemas are unchanged
/// writes only its own row instead of re-inserting (and re-checking) all three.
#[derive(Default)]
pub struct StoredParts {
    hashes: std::sync::Mutex<std::collections::HashSet<Arc<str>>>,
}

/// Hashes kept; past that, the set starts again (parts are then inserted, and ignored as
/// present, once more).
const STORED_PARTS: usize = 4096;

impl StoredParts {
    fn contains(&self, hash: &str) -> bool {
        self.hashes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(hash)
    }

    /// Notes the parts of `a` as stored; call only once the transaction that recorded its
    /// evidence has committed.
    pub fn committed(&self, a: &Assembled) {
        let mut hashes = self.hashes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if hashes.len() + 4 > STORED_PARTS {
            hashes.clear();
        }
        for part in a.parts() {
            if !hashes.contains(&*part.sha256) {
                hashes.insert(part.sha256.clone());
            }
        }
    }
}

impl Assembled {
    /// The parts stored by content hash: head, system message, notes, tool schemas.
    fn parts(&self) -> impl Iterator<Item = &Part> {
        [Some(&self.head), Some(&self.system), self.notes.as_ref(), self.tools.as_ref()]
            .into_iter()
            .flatten()
    }
}

/// Which request's evidence to rebuild.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvidenceOf {
    /// A step's (the last step's if `None`).
    Step(Option<i64>),
    /// A refused request's, by its number (the last one's if `None`).
    Refused(Option<i64>),
}

pub fn evidence(c: &Connection, id: &str, of: EvidenceOf) -> Result<(i64, Vec<u8>), StoreError> {
    load_counters(c, id)?;
    let (table, key, what) = match of {
        EvidenceOf::Step(_) => ("evidence", "step", "model request at step"),
        EvidenceOf::Refused(_) => ("refused_requests", "seq", "refused request"),
    };
    let step = match of {
        EvidenceOf::Step(Some(s)) | EvidenceOf::Refused(Some(s)) => s,
        EvidenceOf::Step(None) | EvidenceOf::Refused(None) => c
            .prepare_cached(&format!(
                "SELECT COALESCE(MAX({key}), 0) FROM {table} WHERE session_id=?1"
            ))?
            .query_row([id], |r| r.get(0))?,
    };
    let row = c
        .prepare_cached(&format!(
            "SELECT head, system_hash, tools_hash, history_from, history_to, body_sha256, anchor,
                    result_cap, notes_hash
             FROM {table} WHERE session_id=?1 AND {key}=?2"
        ))?
        .query_row(params![id, step], |r| {
            Ok((
                (r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, Option<String>>(2)?),
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
                r.get::<_, String>(5)?,
                r.get::<_, Option<i64>>(6)?,
                r.get::<_, Option<i64>>(7)?,
                r.get::<_, Option<String>>(8)?,
            ))
        })
        .optional()?;
    let Some(((head_hash, system_hash, tools_hash), from, to, sha, anchor, cap, notes_hash)) = row
    else {
        return Err(StoreError::NotFound(match (of, step) {
            (EvidenceOf::Refused(None), 0) => format!("session `{id}` has no refused request"),
            (EvidenceOf::Step(None), 0) => format!("session `{id}` has made no model request yet"),
            _ => format!("session `{id}` has no {what} {step}"),
        }));
    };
    let head = blob(c, &head_hash)?;
    let system = blob(c, &system_hash)?;
    let tools = tools_hash.map(|h| blob(c, &h)).transpose()?;
    let notes = notes_hash.map(|h| blob(c, &h)).transpose()?;
    let anchor = match anchor {
        Some(a) => history(c, id, a, a)?.pop(),
        None => None,
    };
    let body = reconstruct_body(
        &head,
        &system,
        notes.as_deref(),
        anchor.as_deref(),
        &cut_history(&history(c, id, from, to)?, cap.map(|c| c as usize)),
        tools.as_deref(),
    );
    if sha256_hex(&body) != sha {
        return Err(StoreError::Corrupt(format!(
            "the evidence of {what} {step} does not rebuild to its recorded digest; the history was altered"
        )));
    }
    Ok((step, body))
}

/// Where session `id`'s history stood after step `step` (see [`HistoryCut`]): its request's
/// turn and context start, and the last message its results left — the last message the next
/// request held when it was of the same turn, else the step's reply and the tool results
/// that follow it.
///
/// [`HistoryCut`]: crate::session::HistoryCut
pub(crate) fn cut_in(
    c: &Connection,
    id: &str,
    step: i64,
) -> Result<crate::session::HistoryCut, StoreError> {
    let steps = crate::session::runtime_in(c, id)?.steps;
    if step < 0 || step > steps {
        return Err(StoreError::Input(format!(
            "session `{id}` has {steps} step(s): step {step} is not one of them (0 is before the first)"
        )));
    }
    if step == 0 {
        return Ok(crate::session::HistoryCut::default());
    }
    let request = |s: i64| -> Result<Option<(Option<i64>, i64, i64)>, StoreError> {
        Ok(c.prepare_cached(
            "SELECT turn, history_from, history_to FROM evidence WHERE session_id=?1 AND step=?2",
        )?
        .query_row(params![id, s], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?)
    };
    let Some((Some(turn), from, to)) = request(step)? else {
        return Err(StoreError::NotFound(format!(
            "session `{id}` has no record of the request of step {step} (its turn is unknown)"
        )));
    };
    let seq = match request(step + 1)? {
        Some((Some(next), _, next_to)) if next == turn => next_to,
        _ => {
            let mut stmt = c.prepare_cached(
                "SELECT seq, role FROM messages WHERE session_id=?1 AND seq>?2 ORDER BY seq",
            )?;
            let mut rows =
                stmt.query_map(params![id, to], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)))?;
            match rows.next().transpose()? {
                Some((mut last, role)) if role == "assistant" => {
                    for row in rows {
                        match row? {
                            (seq, role) if role == "tool" => last = seq,
                            _ => break,
                        }
                    }
                    last
                }
                _ => to,
            }
        }
    };
    Ok(crate::session::HistoryCut { step, turn, seq, context_start: from - 1 })
}
