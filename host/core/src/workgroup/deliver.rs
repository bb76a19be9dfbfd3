//! Events between the sessions of a workgroup, delivered in the sender's transaction: a
//! spawn's child and its request, more work for a child, a child's question, and the one
//! terminal event that ends each request (written where the child's turn ends).

use super::*;

/// The input a child receives for a request: the text, then the resource references.
fn request_text(input: &str, resources: &[String]) -> String {
    if resources.is_empty() {
        return input.to_string();
    }
    let mut text = format!("{input}\n\nResources:");
    for r in resources {
        text.push_str("\n- ");
        text.push_str(r);
    }
    text
}

/// Delivers event `event` (`kind`, from `from` to `to`) into `to`'s inbox, unless it was
/// delivered already. Returns whether this call delivered it.
#[allow(clippy::too_many_arguments)]
pub(super) fn deliver_in(
    c: &Connection,
    main: &str,
    event: &str,
    kind: Kind,
    from: &str,
    to: &str,
    text: &str,
    body: serde_json::Value,
) -> Result<bool, StoreError> {
    let done: bool = c
        .prepare_cached("SELECT EXISTS(SELECT 1 FROM workgroup_events WHERE id=?1)")?
        .query_row([event], |r| r.get(0))?;
    if done {
        return Ok(false);
    }
    let seq = crate::session::submit_event_in(c, to, text, event, kind == Kind::Request)?;
    c.prepare_cached(
        "INSERT INTO workgroup_events (id, main_id, from_session, to_session, kind, body, created_at, inbox_seq)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![event, main, from, to, kind.as_str(), body.to_string(), now_ms(), seq])?;
    let shadow = SessionEvent::Workgroup {
        event: event.to_string(),
        event_kind: kind.as_str().to_string(),
        from: from.to_string(),
        to: to.to_string(),
    };
    events::append(c, from, &shadow)?;
    events::append(c, to, &shadow)?;
    Ok(true)
}

/// Creates the child `spawn` names, in the transaction that journals call `call_id` of
/// `parent`: its session (the workgroup's tools and settings, the given grants, the
/// parent's model, policy, budget, guards, user and owner), its row, and its first request.
/// Writing it again (the same child) changes nothing.
pub(crate) fn spawn_in(
    c: &Connection,
    parent: &str,
    call_id: &str,
    spawn: &Spawn,
) -> Result<(), StoreError> {
    let exists: bool = c
        .prepare_cached("SELECT EXISTS(SELECT 1 FROM subsessions WHERE session_id=?1)")?
        .query_row([&spawn.child], |r| r.get(0))?;
    if exists {
        return Ok(());
    }
    let pos = position_in(c, parent)?
        .ok_or_else(|| StoreError::Input(format!("session `{parent}` is not in a workgroup")))?;
    let capabilities = crate::preparation::loaded_in(c, parent)?;
    let config = crate::session::config_in(c, parent)?;
    let (preprocess, tools): (Option<String>, String) = c
        .prepare_cached("SELECT preprocess, tools FROM workgroups WHERE main_id=?1")?
        .query_row([&pos.main_id], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let preprocess = preprocess.map(|p| serde_json::from_str(&p)).transpose().map_err(|e| {
        StoreError::Corrupt(format!("stored preprocess settings are unreadable: {e}"))
    })?;
    let mut tools: Vec<String> = serde_json::from_str(&tools)
        .map_err(|e| StoreError::Corrupt(format!("stored workgroup tools are unreadable: {e}")))?;
    let depth = pos.depth + 1;
    if depth >= pos.limits.max_depth {
        tools.retain(|t| !DELEGATION_TOOLS.contains(&t.as_str()));
    }
    let new = crate::session::NewSession {
        id: Some(spawn.child.clone()),
        grants: spawn.grants.clone(),
        // A child reaches what its parent may reach on the network, no more.
        net: config.net.clone(),
        tools: tools.clone(),
        policy: config.policy.clone(),
        budget: config.budget.clone(),
        model: config.model.clone(),
        system_prompt: config.system_prompt.clone(),
        guards: config.guards.clone(),
        preprocess,
        user: config.user.clone(),
        named_tools: false,
        owner: config.owner.clone(),
        // The child runs the versions its workgroup pinned.
        pins: capabilities.tool_pins.clone(),
    };
    crate::session::create_in(c, &spawn.child, &new)?;
    let now = now_ms();
    c.execute(
        "INSERT INTO subsessions (session_id, parent_id, main_id, depth, purpose, spawn_call, status, requests, deadline_at, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'live', 1, ?7, ?8)",
        params![
            spawn.child,
            parent,
            pos.main_id,
            depth,
            spawn.purpose,
            call_id,
            now + pos.limits.child_deadline_secs as i64 * 1000,
            now
        ],
    )?;
    deliver_in(
        c,
        &pos.main_id,
        &format!("{}:request:1", spawn.child),
        Kind::Request,
        parent,
        &spawn.child,
        &request_text(&spawn.input, &spawn.resources),
        serde_json::json!({"purpose": spawn.purpose, "input": spawn.input, "resources": spawn.resources}),
    )?;
    Ok(())
}

/// A child row as the delegation tools check it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildRow {
    pub parent: String,
    pub main_id: String,
    pub depth: u32,
    pub purpose: String,
    pub status: Delegation,
    pub requests: i64,
}

/// The row of sub-session `id`, if it is one.
pub(crate) fn child_in(c: &Connection, id: &str) -> Result<Option<ChildRow>, StoreError> {
    Ok(c.prepare_cached(
        "SELECT parent_id, main_id, depth, purpose, status, requests FROM subsessions WHERE session_id=?1",
    )?
    .query_row([id], |r| {
        Ok(ChildRow {
            parent: r.get(0)?,
            main_id: r.get(1)?,
            depth: r.get(2)?,
            purpose: r.get(3)?,
            status: r.get(4)?,
            requests: r.get(5)?,
        })
    })
    .optional()?)
}

/// Sends `input` to `child` of `parent` with call `call_id`'s result: to a live child it is
/// part of its current request (and answers its question); to a finished one it is a new
/// request, with a new deadline. Once per call id.
pub(crate) fn send_in(
    c: &Connection,
    parent: &str,
    call_id: &str,
    child: &str,
    input: &str,
) -> Result<(), StoreError> {
    let row = child_in(c, child)?.filter(|r| r.parent == parent).ok_or_else(|| {
        StoreError::Input(format!("`{child}` is not a sub-session of `{parent}`"))
    })?;
    let event = format!("{child}:send:{parent}:{call_id}");
    let sent: bool = c
        .prepare_cached("SELECT EXISTS(SELECT 1 FROM workgroup_events WHERE id=?1)")?
        .query_row([&event], |r| r.get(0))?;
    if sent {
        return Ok(());
    }
    let pos = position_in(c, parent)?
        .ok_or_else(|| StoreError::Input(format!("session `{parent}` is not in a workgroup")))?;
    let now = now_ms();
    if row.status == Delegation::Done {
        c.execute(
            "UPDATE subsessions SET status='live', requests=requests+1, deadline_at=?2, stop_reason=NULL,
             question=NULL, terminal=NULL, text=NULL, ended_at=NULL, created_at=created_at WHERE session_id=?1",
            params![child, now + pos.limits.child_deadline_secs as i64 * 1000],
        )?;
    } else {
        c.execute("UPDATE subsessions SET question=NULL WHERE session_id=?1", [child])?;
    }
    deliver_in(
        c,
        &row.main_id,
        &event,
        Kind::Request,
        parent,
        child,
        input,
        serde_json::json!({"input": input}),
    )?;
    Ok(())
}

/// Sub-session `child` asks its parent `question` with call `call_id`'s result: its request
/// stays live until the parent answers (a [`send_in`]).
pub(crate) fn ask_in(
    c: &Connection,
    child: &str,
    call_id: &str,
    question: &str,
) -> Result<(), StoreError> {
    let row = child_in(c, child)?
        .ok_or_else(|| StoreError::Input(format!("session `{child}` has no parent to ask")))?;
    c.execute("UPDATE subsessions SET question=?2 WHERE session_id=?1", params![child, question])?;
    let text = format!(
        "[keel: sub-session {child} ({}) asks]\n{question}\n\n(Answer it with session_send.)",
        row.purpose
    );
    deliver_in(
        c,
        &row.main_id,
        &format!("{child}:question:{call_id}"),
        Kind::Question,
        child,
        &row.parent,
        &text,
        serde_json::json!({"question": question}),
    )?;
    Ok(())
}

/// Ends `child`'s current request with a terminal event of `kind` carrying `text`.
pub(super) fn finish_in(
    c: &Connection,
    child: &str,
    row: &ChildRow,
    kind: Kind,
    text: &str,
) -> Result<(), StoreError> {
    let text = cut(text);
    c.execute(
        "UPDATE subsessions SET status='done', terminal=?2, text=?3, ended_at=?4, stop_reason=NULL, question=NULL
         WHERE session_id=?1",
        params![child, kind.as_str(), text, now_ms()],
    )?;
    let what = match kind {
        Kind::Result => "finished",
        Kind::Failure => "failed",
        Kind::Interrupted => "was interrupted",
        _ => "was stopped",
    };
    let note = format!("[keel: sub-session {child} ({}) {what}: {kind}]\n{text}", row.purpose);
    deliver_in(
        c,
        &row.main_id,
        &format!("{child}:terminal:{}", row.requests),
        kind,
        child,
        &row.parent,
        &note,
        serde_json::json!({"text": text}),
    )?;
    Ok(())
}

/// The content of the last assistant message of session `id`.
fn last_answer(c: &Connection, id: &str) -> Result<String, StoreError> {
    let body: Option<String> = c
        .prepare_cached(
            "SELECT body FROM messages WHERE session_id=?1 AND role='assistant' ORDER BY seq DESC LIMIT 1",
        )?
        .query_row([id], |r| r.get(0))
        .optional()?;
    Ok(body
        .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
        .and_then(|v| v["content"].as_str().map(str::to_string))
        .unwrap_or_default())
}

/// Called where session `id`'s turn ends (state `idle`, `failed` or `interrupted`, with
/// `detail`): a live sub-session whose work is over writes its terminal event. An idle child
/// with inputs waiting, live children of its own or a question open is not over yet: its
/// request ends when a later turn ends with none of those.
pub(crate) fn turn_ended_in(
    c: &Connection,
    id: &str,
    state: RuntimeState,
    detail: Option<&str>,
) -> Result<(), StoreError> {
    let row: Option<(Delegation, Option<String>, Option<String>)> = c
        .prepare_cached(
            "SELECT status, stop_reason, question FROM subsessions WHERE session_id=?1",
        )?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let Some((Delegation::Live, stop_reason, question)) = row else { return Ok(()) };
    let (kind, text) = match state {
        RuntimeState::Idle => {
            if question.is_some()
                || session::pending_inputs(c, id)? > 0
                || live_children_in(c, id)? > 0
            {
                return Ok(());
            }
            (Kind::Result, last_answer(c, id)?)
        }
        RuntimeState::Failed => (Kind::Failure, detail.unwrap_or("the turn failed").to_string()),
        RuntimeState::Interrupted => match stop_reason {
            Some(r) => (Kind::BudgetExhausted, r),
            None => (Kind::Interrupted, detail.unwrap_or("interrupted").to_string()),
        },
        _ => return Ok(()),
    };
    if kind != Kind::Result {
        // Nothing will read its children's answers: they stop too.
        for d in live_descendants_in(c, id)? {
            c.execute("UPDATE sessions SET interrupt_requested=1 WHERE id=?1", [&d])?;
        }
    }
    let row = child_in(c, id)?.ok_or_else(|| StoreError::Corrupt("a child row vanished".into()))?;
    finish_in(c, id, &row, kind, &text)
}

/// Called where session `id` starts waiting for approvals: a live sub-session tells its
/// parent about each pending unit, once per unit.
pub(crate) fn waiting_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    let Some(row) = child_in(c, id)?.filter(|r| r.status == Delegation::Live) else {
        return Ok(());
    };
    let units: Vec<(String, String)> = c
        .prepare_cached(
            "SELECT id, tool FROM approvals WHERE session_id=?1 AND status='pending' ORDER BY id",
        )?
        .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    for (unit, tool) in units {
        let text = format!(
            "[keel: sub-session {id} ({}) waits for approval]\nIts call of `{tool}` waits for a person's decision on approval unit {unit} \
             (`keel approve {unit}` or `keel reject {unit}`); it goes on after the decision.",
            row.purpose
        );
        deliver_in(
            c,
            &row.main_id,
            &format!("approval:{unit}"),
            Kind::ApprovalNeeded,
            id,
            &row.parent,
            &text,
            serde_json::json!({"unit": unit, "tool": tool}),
        )?;
    }
    Ok(())
}
