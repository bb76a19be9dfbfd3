//! Supervising a workgroup: the sessions below one, stopping them (the interrupt cascade),
//! which sessions have work, the children past their deadline, and wait notices.

use super::*;

/// Every live session below `id` (children first, then theirs).
pub(crate) fn live_descendants_in(c: &Connection, id: &str) -> Result<Vec<String>, StoreError> {
    below_in(c, id, true)
}

/// Every session below `id`, live or done (children first, then theirs).
pub(crate) fn descendants_in(c: &Connection, id: &str) -> Result<Vec<String>, StoreError> {
    below_in(c, id, false)
}

fn below_in(c: &Connection, id: &str, live_only: bool) -> Result<Vec<String>, StoreError> {
    let mut out = Vec::new();
    let mut frontier = vec![id.to_string()];
    while let Some(p) = frontier.pop() {
        let children: Vec<String> = c
            .prepare_cached(
                "SELECT session_id FROM subsessions WHERE parent_id=?1 AND (status='live' OR NOT ?2)
                 ORDER BY created_at, session_id",
            )?
            .query_map(params![p, live_only], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        for ch in children {
            frontier.push(ch.clone());
            out.push(ch);
        }
    }
    Ok(out)
}

/// Stops session `id` and every live session below it: each is flagged for interruption
/// (`reason`, when given, makes a child's terminal event `budget_exhausted` with it). A
/// session without a turn under way ends its request here: a live child's terminal event is
/// written now, and a main session with live children becomes `interrupted` (the events they
/// send wait in its inbox for the user). Returns the sessions with a turn under way, whose
/// runner (or, with none, the caller) closes it.
pub(crate) fn stop_in(
    c: &Connection,
    id: &str,
    reason: Option<&str>,
) -> Result<Vec<String>, StoreError> {
    let mut turns = Vec::new();
    let mut all = vec![id.to_string()];
    all.extend(live_descendants_in(c, id)?);
    // Deepest first: a child's terminal event reaches a parent that is already stopping.
    for s in all.iter().rev() {
        c.execute("UPDATE sessions SET interrupt_requested=1 WHERE id=?1", [s])?;
        let child = child_in(c, s)?;
        if let (Some(r), Some(row)) = (reason, &child)
            && row.status == Delegation::Live
        {
            c.execute("UPDATE subsessions SET stop_reason=?2 WHERE session_id=?1", params![s, r])?;
        }
        let runtime = crate::session::runtime_in(c, s)?;
        let under_way = runtime.active_turn.is_some() || runtime.state == RuntimeState::Running;
        if under_way {
            turns.push(s.clone());
            continue;
        }
        let live = child.as_ref().is_some_and(|r| r.status == Delegation::Live);
        if let Some(row) = child.filter(|r| r.status == Delegation::Live) {
            match reason {
                Some(r) => finish_in(c, s, &row, Kind::BudgetExhausted, r)?,
                None => finish_in(c, s, &row, Kind::Interrupted, "interrupted while it waited")?,
            }
        }
        // Inputs that wait (a child's request not begun yet, events for a main session) stay
        // in the inbox: an interrupted session takes no input until a person sends one.
        if runtime.state != RuntimeState::Interrupted
            && (live || (s == id && all.len() > 1) || session::pending_inputs(c, s)? > 0)
        {
            let why = match reason {
                Some(r) => format!("stopped: {r}"),
                None => "interrupted by the user".to_string(),
            };
            session::set_state(c, s, RuntimeState::Interrupted, Some(&why))?;
        }
    }
    Ok(turns)
}

/// One session of a workgroup as its supervisor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runnable {
    pub id: String,
    pub state: RuntimeState,
    pub active_turn: bool,
    pub pending: i64,
    pub interrupt_requested: bool,
    /// Approval units of it still waiting for a decision.
    pub undecided: i64,
    /// Inputs waiting in its inbox that are notifications from other sessions.
    pub notifications: i64,
    /// A sub-session's parent and the parent's call that spawned it (`None`: the main
    /// session).
    pub spawned_by: Option<(String, String)>,
}

impl Runnable {
    /// Whether a runner has work here: a turn to resume (not one waiting for a decision), or
    /// inputs to take (not while the session is interrupted: they wait for the user).
    pub fn has_work(&self) -> bool {
        if self.active_turn {
            // A turn waiting for approval resumes once nothing of it waits for a decision.
            return !matches!(self.state, RuntimeState::WaitingApproval) || self.undecided == 0;
        }
        self.pending > 0 && !matches!(self.state, RuntimeState::Interrupted)
    }
}

/// Every session of the workgroup of `main`.
pub(crate) fn sessions_in(c: &Connection, main: &str) -> Result<Vec<Runnable>, StoreError> {
    let rows = c
        .prepare_cached(
            "SELECT s.id, s.state, s.active_turn IS NOT NULL, s.interrupt_requested,
                    (SELECT COUNT(*) FROM inbox i WHERE i.session_id = s.id AND i.consumed_at IS NULL),
                    (SELECT COUNT(*) FROM approvals a WHERE a.session_id = s.id AND a.status = 'pending'),
                    (SELECT COUNT(*) FROM inbox i JOIN workgroup_events e ON e.id = i.event_id
                     WHERE i.session_id = s.id AND i.consumed_at IS NULL AND e.kind != 'request'),
                    sub.parent_id, sub.spawn_call
             FROM sessions s LEFT JOIN subsessions sub ON sub.session_id = s.id
             WHERE s.id = ?1 OR s.id IN (SELECT session_id FROM subsessions WHERE main_id = ?1)
             ORDER BY s.created_at, s.id",
        )?
        .query_map([main], |r| {
            Ok((
                (r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get(2)?, r.get(3)?),
                (r.get(4)?, r.get(5)?, r.get(6)?),
                (r.get::<_, Option<String>>(7)?, r.get::<_, Option<String>>(8)?),
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(
            |(
                (id, state, active_turn, interrupt_requested),
                (pending, undecided, notifications),
                (parent, call),
            )| {
                Ok(Runnable {
                    id,
                    state: state.parse()?,
                    active_turn,
                    pending,
                    interrupt_requested,
                    undecided,
                    notifications,
                    spawned_by: parent.zip(call),
                })
            },
        )
        .collect()
}

/// Live children whose deadline passed at `now`, with the deadline in seconds.
pub(crate) fn overdue_in(c: &Connection, main: &str, now: i64) -> Result<Vec<String>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT session_id FROM subsessions WHERE main_id=?1 AND status='live' AND stop_reason IS NULL AND deadline_at < ?2",
    )?
    .query_map(params![main, now], |r| r.get(0))?
    .collect::<Result<_, _>>()?)
}

/// A wait notice due: a live child that has worked past another wait-notice period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub child: String,
    /// Whole periods since its request began.
    pub periods: i64,
}

/// The wait notices due at `now` in the workgroup of `main` and not yet written (a read: the
/// supervisor asks for a write only when there is one).
pub(crate) fn notices_due_in(
    c: &Connection,
    main: &str,
    limits: &Limits,
    now: i64,
) -> Result<Vec<Notice>, StoreError> {
    if limits.wait_notice_secs == 0 {
        return Ok(Vec::new());
    }
    let period = limits.wait_notice_secs as i64 * 1000;
    let live: Vec<(String, i64, i64)> = c
        .prepare_cached(
            "SELECT session_id, deadline_at, requests FROM subsessions
             WHERE main_id=?1 AND status='live' AND deadline_at IS NOT NULL",
        )?
        .query_map([main], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    let mut due = Vec::new();
    for (child, deadline, requests) in live {
        let started = deadline - limits.child_deadline_secs as i64 * 1000;
        let periods = (now - started) / period;
        if periods < 1 {
            continue;
        }
        let written: bool = c
            .prepare_cached("SELECT EXISTS(SELECT 1 FROM workgroup_events WHERE id=?1)")?
            .query_row([notice_id(&child, requests, periods)], |r| r.get(0))?;
        if !written {
            due.push(Notice { child, periods });
        }
    }
    Ok(due)
}

fn notice_id(child: &str, requests: i64, periods: i64) -> String {
    format!("{child}:wait:{requests}:{periods}")
}

/// Tells each parent about its child in `due` that it still works; once per child, request
/// and period (a notice written already is not written again).
pub(crate) fn write_notices_in(
    c: &Connection,
    main: &str,
    limits: &Limits,
    due: &[Notice],
) -> Result<(), StoreError> {
    for n in due {
        let Some(row) = child_in(c, &n.child)?.filter(|r| r.status == Delegation::Live) else {
            continue;
        };
        let secs = n.periods * limits.wait_notice_secs as i64;
        let text = format!(
            "[keel: sub-session {} ({}) is still working after {secs} s]\nThis is not an answer: it goes on. \
             Wait again (end your turn), ask with session_status, or stop it with session_interrupt.",
            n.child, row.purpose
        );
        deliver_in(
            c,
            main,
            &notice_id(&n.child, row.requests, n.periods),
            Kind::WaitTimeout,
            &n.child,
            &row.parent,
            &text,
            serde_json::json!({"seconds": secs}),
        )?;
    }
    Ok(())
}
