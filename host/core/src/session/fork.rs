//! Forking a session: a new session whose history is another's up to a step, in one
//! transaction — the kernel's rows here (the session's row with its counters at the step, its
//! configuration, its grants, the messages and journal up to the step, the pre-images that
//! journal names), each feature's through the `on_fork` reaction (which may refuse, as a
//! workgroup's does). The original is only read.

use crate::sql::{Connection, OptionalExtension, params};
use crate::store::{StoreError, now_ms};

use super::config::{ModelChange, set_model_in};
use super::events::{SessionEvent, append};
use super::row::no_session;

/// Where a session's history stood after a step: the step, its turn, the last message the
/// step's results left, and the context start of the step's request (messages after it were
/// sent). Step 0 is before the first request: all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct HistoryCut {
    pub step: i64,
    pub turn: i64,
    pub seq: i64,
    pub context_start: i64,
}

/// What a fork changes of the original's settings.
#[derive(Debug, Clone, Default)]
pub struct ForkSettings {
    /// The fork's id.
    pub id: String,
    /// Its model (each part given replaces the original's).
    pub model: ModelChange,
    /// Every grant read-only.
    pub read_only: bool,
    /// Grants not given to the fork, by guest path.
    pub drop_grants: Vec<String>,
    /// Who forked it.
    pub by: String,
}

/// The columns of `session_config` a fork copies (all but the id and the title).
const CONFIG_COLUMNS: &str = "session_goal, phase_goal, loaded_tools, policy, budget, model, \
     system_prompt, tool_pins, guards, preprocess, phase_turn, \"user\", owner, role, net";

/// The columns of `tool_calls` a fork copies as they are (the approval is the original's, not
/// the fork's: not copied).
const CALL_COLUMNS: &str = "step, call_id, position, tool, input, input_digest, \
     component_digest, effect, status, result, error_kind, changes, duration_ms, created_at, \
     finished_at, idempotent, net, logs";

/// Creates session `s.id` as the fork of session `from` at `cut`: its row (idle, its counters
/// at the step), configuration and grants (narrowed as `s` asks), the messages up to the cut,
/// the journal up to the step with the pre-images it names, a `forked` event, and each
/// feature's rows through the reaction. Refused for a step not yet finished.
pub(crate) fn fork_in(
    c: &Connection,
    from: &str,
    cut: &HistoryCut,
    s: &ForkSettings,
) -> Result<(), StoreError> {
    let steps: i64 = c
        .prepare_cached("SELECT steps FROM sessions WHERE id=?1")?
        .query_row([from], |r| r.get(0))
        .optional()?
        .ok_or_else(|| no_session(from))?;
    if cut.step > steps {
        return Err(StoreError::Input(format!(
            "session `{}` has {steps} step(s): step {} is past its last",
            from.escape_debug(),
            cut.step
        )));
    }
    let open: Option<i64> = c
        .prepare_cached("SELECT step FROM open_steps WHERE session_id=?1")?
        .query_row([from], |r| r.get(0))
        .optional()?;
    if let Some(open) = open
        && open <= cut.step
    {
        return Err(StoreError::Conflict(format!(
            "step {open} of session `{}` has not finished (its calls wait for a decision); fork \
             from an earlier step, or once it is done",
            from.escape_debug()
        )));
    }
    super::create::valid_id(&s.id)?;
    let exists: bool =
        c.query_row("SELECT EXISTS(SELECT 1 FROM sessions WHERE id=?1)", [&s.id], |r| r.get(0))?;
    if exists {
        return Err(StoreError::Conflict(format!("session `{}` already exists", s.id)));
    }
    let grants: Vec<String> = c
        .prepare_cached("SELECT guest FROM session_grants WHERE session_id=?1")?
        .query_map([from], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    if let Some(unknown) = s.drop_grants.iter().find(|g| !grants.contains(g)) {
        return Err(StoreError::Input(format!(
            "session `{}` has no grant at `{}` to drop (its grants: {})",
            from.escape_debug(),
            unknown.escape_debug(),
            if grants.is_empty() { "none".to_string() } else { grants.join(", ") }
        )));
    }
    let to = s.id.as_str();
    c.execute(
        "INSERT INTO sessions (id, created_at, state, meta_version, steps, turns)
         VALUES (?1, ?2, 'idle', 1, ?3, ?4)",
        params![to, now_ms(), cut.step, cut.turn],
    )?;
    c.execute(
        &format!(
            "INSERT INTO session_config (session_id, {CONFIG_COLUMNS})
             SELECT ?2, {CONFIG_COLUMNS} FROM session_config WHERE session_id=?1"
        ),
        params![from, to],
    )?;
    let access = if s.read_only { "'ro'" } else { "access" };
    for guest in grants.iter().filter(|g| !s.drop_grants.contains(g)) {
        c.execute(
            &format!(
                "INSERT INTO session_grants (session_id, host, guest, access, dev, ino, within)
                 SELECT ?2, host, guest, {access}, dev, ino, within
                 FROM session_grants WHERE session_id=?1 AND guest=?3"
            ),
            params![from, to, guest],
        )?;
    }
    c.execute(
        "INSERT INTO messages (session_id, seq, turn, role, body, created_at)
         SELECT ?2, seq, turn, role, body, created_at FROM messages
         WHERE session_id=?1 AND seq<=?3",
        params![from, to, cut.seq],
    )?;
    c.execute(
        &format!(
            "INSERT INTO tool_calls (session_id, {CALL_COLUMNS})
             SELECT ?2, {CALL_COLUMNS} FROM tool_calls WHERE session_id=?1 AND step<=?3"
        ),
        params![from, to, cut.step],
    )?;
    c.execute(
        "INSERT INTO session_preimages (session_id, sha256, size)
         SELECT ?2, p.sha256, p.size FROM session_preimages p
         WHERE p.session_id=?1 AND EXISTS (
             SELECT 1 FROM tool_calls t WHERE t.session_id=?2 AND t.changes LIKE '%' || p.sha256 || '%')",
        params![from, to],
    )?;
    append(
        c,
        to,
        &SessionEvent::Forked {
            from: from.to_string(),
            at: cut.step,
            messages: cut.seq,
            by: s.by.clone(),
        },
    )?;
    (super::reactions::get().on_fork)(c, from, to, cut)?;
    if !s.model.is_empty() {
        set_model_in(c, to, &s.model, &s.by)?;
    }
    Ok(())
}

/// Where a fork came from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Origin {
    /// The session it was forked from (which may since have been deleted).
    pub session: String,
    /// The step it was forked at.
    pub step: i64,
    pub by: String,
}

/// Where session `id` was forked from, if it is a fork.
pub(crate) fn origin_in(c: &Connection, id: &str) -> Result<Option<Origin>, StoreError> {
    let body: Option<String> = c
        .prepare_cached(
            "SELECT body FROM session_events WHERE session_id=?1 AND kind='forked'
             ORDER BY seq LIMIT 1",
        )?
        .query_row([id], |r| r.get(0))
        .optional()?;
    match body.map(|b| serde_json::from_str::<SessionEvent>(&b)) {
        None => Ok(None),
        Some(Ok(SessionEvent::Forked { from, at, by, .. })) => {
            Ok(Some(Origin { session: from, step: at, by }))
        }
        Some(_) => Err(StoreError::Corrupt(format!("the origin of session `{id}` does not read"))),
    }
}
