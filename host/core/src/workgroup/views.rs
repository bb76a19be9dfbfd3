//! A workgroup as it is shown: its members, limits and use, and the events between its
//! sessions.

use super::*;

/// A session of a workgroup, as `keel workgroup show` and `session_status` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    pub session_id: String,
    pub role: Role,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    pub depth: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purpose: Option<String>,
    pub state: RuntimeState,
    /// `live` or `done` (a sub-session's request); `None` for the main session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delegation: Option<Delegation>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminal: Option<Kind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goal: Option<String>,
    pub approvals: Vec<String>,
    pub steps: i64,
    pub tokens: i64,
    pub created_at: i64,
}

/// A workgroup: its main session, limits, use and members (the main first, then by creation).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workgroup {
    pub main_id: String,
    pub limits: Limits,
    pub steps: i64,
    pub tokens: i64,
    pub members: Vec<Member>,
    /// Events written between its sessions.
    pub events: i64,
}

/// The workgroup of `main` (`None` when `main` is not a main session).
pub(crate) fn workgroup_in(c: &Connection, main: &str) -> Result<Option<Workgroup>, StoreError> {
    let limits: Option<String> = c
        .prepare_cached("SELECT limits FROM workgroups WHERE main_id=?1")?
        .query_row([main], |r| r.get(0))
        .optional()?;
    let Some(limits) = limits else { return Ok(None) };
    let mut members = c
        .prepare(
            "SELECT s.id, s.state, s.steps, s.created_at,
                    (SELECT COALESCE(k.phase_goal, k.session_goal) FROM session_config k WHERE k.session_id = s.id),
                    w.parent_id, w.depth, w.purpose, w.status, w.terminal, w.text, w.question,
                    (SELECT COALESCE(SUM(COALESCE(e.prompt_tokens, 0) + COALESCE(e.completion_tokens, 0)), 0)
                     FROM evidence e WHERE e.session_id = s.id)
             FROM sessions s LEFT JOIN subsessions w ON w.session_id = s.id
             WHERE s.id = ?1 OR w.main_id = ?1
             ORDER BY w.depth IS NOT NULL, s.created_at, s.id",
        )?
        .query_map([main], |r| {
            let state: String = r.get(1)?;
            Ok((
                Member {
                    session_id: r.get(0)?,
                    role: if r.get::<_, Option<String>>(5)?.is_some() { Role::Sub } else { Role::Main },
                    parent: r.get(5)?,
                    depth: r.get::<_, Option<u32>>(6)?.unwrap_or(0),
                    purpose: r.get(7)?,
                    state: RuntimeState::Idle,
                    delegation: r.get(8)?,
                    terminal: r.get(9)?,
                    text: r.get(10)?,
                    question: r.get(11)?,
                    goal: r.get(4)?,
                    approvals: Vec::new(),
                    steps: r.get(2)?,
                    tokens: r.get(12)?,
                    created_at: r.get(3)?,
                },
                state,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .map(|(mut m, state)| {
            m.state = state.parse()?;
            Ok(m)
        })
        .collect::<Result<Vec<Member>, StoreError>>()?;
    for m in &mut members {
        m.approvals = c
            .prepare_cached(
                "SELECT id FROM approvals WHERE session_id=?1 AND status='pending' ORDER BY id",
            )?
            .query_map([&m.session_id], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
    }
    let events: i64 = c
        .prepare_cached("SELECT COUNT(*) FROM workgroup_events WHERE main_id=?1")?
        .query_row([main], |r| r.get(0))?;
    Ok(Some(Workgroup {
        main_id: main.to_string(),
        limits: parse_limits(&limits)?,
        steps: members.iter().map(|m| m.steps).sum(),
        tokens: members.iter().map(|m| m.tokens).sum(),
        members,
        events,
    }))
}

/// Every workgroup's main session, newest first.
pub(crate) fn mains_in(c: &Connection) -> Result<Vec<String>, StoreError> {
    Ok(c.prepare("SELECT main_id FROM workgroups ORDER BY created_at DESC, main_id")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// One event between two sessions of a workgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventRecord {
    pub id: String,
    pub kind: Kind,
    pub from: String,
    pub to: String,
    pub at: i64,
    pub inbox_seq: i64,
    /// Whether the receiver took it from its inbox.
    pub consumed: bool,
}

/// The events of the workgroup of `main`, in the order they were written.
pub(crate) fn events_in(c: &Connection, main: &str) -> Result<Vec<EventRecord>, StoreError> {
    Ok(c.prepare(
        "SELECT e.id, e.kind, e.from_session, e.to_session, e.created_at, e.inbox_seq, i.consumed_at IS NOT NULL
         FROM workgroup_events e LEFT JOIN inbox i ON i.session_id = e.to_session AND i.seq = e.inbox_seq
         WHERE e.main_id=?1 ORDER BY e.rowid",
    )?
    .query_map([main], |r| {
        Ok(EventRecord {
            id: r.get(0)?,
            kind: r.get(1)?,
            from: r.get(2)?,
            to: r.get(3)?,
            at: r.get(4)?,
            inbox_seq: r.get(5)?,
            consumed: r.get(6)?,
        })
    })?
    .collect::<Result<_, _>>()?)
}
