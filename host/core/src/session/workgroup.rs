//! Workgroups: a main session and the sub-sessions it (and they) delegated to, and the durable
//! events between them. SessionEngine owns every row here.
//!
//! A delegation is a fact of the parent's call: the child's session, its `subsessions` row and
//! its first request are written in the transaction that journals the spawn's result. Every
//! event between two sessions is a `workgroup_events` row with an id derived from the fact it
//! reports, delivered into the receiver's inbox in the sender's transaction (the inbox row names
//! the event, unique): it exists exactly when its fact does, and writing the fact again writes
//! nothing. A child's request ends in exactly one terminal event (`result`, `failure`,
//! `interrupted`, `budget_exhausted`), written where its turn ends — [`turn_ended_in`], called
//! by the one function that ends turns — or where it is stopped while it waits ([`stop_in`]).

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::events::{self, SessionEvent};
use super::facts::{self, RuntimeState};
use crate::store::{StoreError, now_ms};

/// The delegation tools (the first-party control component's): loaded in main sessions and in
/// the sub-sessions of a workgroup above its depth limit, never in a standalone session.
pub const DELEGATION_TOOLS: &[&str] =
    &["session_spawn", "session_send", "session_status", "session_interrupt", "session_ask"];

/// Bytes of a child's answer, failure or reason kept with it and put in a notification.
pub const MAX_TEXT: usize = 16 * 1024;

crate::stored_enum! {
    /// What a session is for: a main session coordinates and routes; a sub-session works.
    pub enum Role: "session role" {
        Main = "main",
        Sub = "sub",
    }
}

crate::stored_enum! {
    /// The kind of an event between two sessions of a workgroup.
    pub enum Kind: "workgroup event kind" {
        /// Work for a child (parent → child): its input.
        Request = "request",
        /// The child's answer to its request (terminal).
        Result = "result",
        /// The child asks its parent something; the answer comes as the next request.
        Question = "question",
        /// The child's turn failed (terminal).
        Failure = "failure",
        /// The child waits for a person's decision on an approval unit.
        ApprovalNeeded = "approval_needed",
        /// The child was interrupted (terminal).
        Interrupted = "interrupted",
        /// The child was stopped by a limit: its deadline, or the workgroup's budget (terminal).
        BudgetExhausted = "budget_exhausted",
        /// A child is still working after the workgroup's wait notice (not terminal).
        WaitTimeout = "wait_timeout",
    }
}

impl Kind {
    /// Whether the event ends the child's request.
    pub fn terminal(self) -> bool {
        matches!(self, Self::Result | Self::Failure | Self::Interrupted | Self::BudgetExhausted)
    }
}

crate::stored_enum! {
    /// Where a child's current request stands.
    pub enum Delegation: "delegation status" {
        /// Its request has no terminal event yet.
        Live = "live",
        /// Its last request ended (its terminal event is written).
        Done = "done",
    }
}

/// The limits of a workgroup, stored with its main session and applied to every descendant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Children of one session whose request is live, at most (finished ones do not count).
    pub max_live_children: u32,
    /// How deep delegation goes: the main session is depth 0, its children 1.
    pub max_depth: u32,
    /// Seconds a child's request may take before it is stopped (`budget_exhausted`).
    pub child_deadline_secs: u64,
    /// Seconds after which a parent is told that a child is still working (and again after
    /// each such period); 0: never.
    pub wait_notice_secs: u64,
    /// Model steps of the whole workgroup, at most (`None`: no limit).
    pub max_steps: Option<i64>,
    /// Tokens (prompt and completion, as the server reported them) of the whole workgroup, at
    /// most (`None`: no limit).
    pub max_tokens: Option<i64>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_live_children: 8,
            max_depth: 2,
            child_deadline_secs: 1800,
            wait_notice_secs: 600,
            max_steps: None,
            max_tokens: None,
        }
    }
}

impl Limits {
    /// Refuses limits that cannot work.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=256).contains(&self.max_live_children) {
            return Err("the live-children limit must be between 1 and 256".into());
        }
        if !(1..=8).contains(&self.max_depth) {
            return Err("the depth limit must be between 1 and 8".into());
        }
        if self.child_deadline_secs == 0 {
            return Err("a child's deadline must be at least 1 second".into());
        }
        if self.max_steps.is_some_and(|n| n < 1) || self.max_tokens.is_some_and(|n| n < 1) {
            return Err("a workgroup budget must be at least 1".into());
        }
        Ok(())
    }
}

/// Where a session stands in its workgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub main_id: String,
    /// `None` for the main session.
    pub parent: Option<String>,
    pub depth: u32,
    pub limits: Limits,
}

pub use crate::control::Spawn;

/// A new session id: random, so that sessions created at once (by concurrent API requests,
/// or by parallel spawns) never collide; from the time and thread only when the operating
/// system gives no random bytes.
pub fn new_id() -> String {
    let mut seed = [0u8; 16];
    if getrandom::fill(&mut seed).is_err() {
        let fallback = format!("{}-{:?}", now_ms(), std::thread::current().id());
        seed.copy_from_slice(&blake3::hash(fallback.as_bytes()).as_bytes()[..16]);
    }
    format!("s-{}", &hex::encode(seed)[..12])
}

fn store_json<T: Serialize>(v: &T) -> Result<String, StoreError> {
    super::json(v)
}

fn parse_limits(text: &str) -> Result<Limits, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Corrupt(format!("stored workgroup limits are unreadable: {e}")))
}

fn cut(text: &str) -> String {
    if text.len() <= MAX_TEXT {
        return text.to_string();
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [cut at {MAX_TEXT} bytes]", &text[..end])
}

/// Makes session `id` (just created) the main session of a new workgroup: `tools` are what its
/// sub-sessions load (the delegation tools among them while they may delegate), `preprocess`
/// their task-understanding settings (a main session routes and has none of its own).
pub fn create_main_in(
    c: &Connection,
    id: &str,
    limits: &Limits,
    preprocess: Option<&crate::understand::PreprocessConfig>,
    tools: &[String],
) -> Result<(), StoreError> {
    limits.check().map_err(StoreError::Input)?;
    c.execute("UPDATE session_config SET role='main' WHERE session_id=?1", [id])?;
    c.execute(
        "INSERT INTO workgroups (main_id, limits, preprocess, tools, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            id,
            store_json(limits)?,
            preprocess.map(store_json).transpose()?,
            store_json(&tools)?,
            now_ms()
        ],
    )?;
    Ok(())
}

/// The role session `id` was created with.
pub fn role_in(c: &Connection, id: &str) -> Result<Role, StoreError> {
    let role: Option<String> = c
        .prepare_cached("SELECT role FROM session_config WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))
        .optional()?;
    let role = role.ok_or_else(|| StoreError::NotFound(format!("no session `{id}`")))?;
    role.parse().map_err(|e: crate::stored::UnknownName| StoreError::Corrupt(e.to_string()))
}

/// Where session `id` stands in its workgroup; `None` for a standalone session.
pub fn position_in(c: &Connection, id: &str) -> Result<Option<Position>, StoreError> {
    let sub: Option<(String, String, u32)> = c
        .prepare_cached("SELECT main_id, parent_id, depth FROM subsessions WHERE session_id=?1")?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    let (main_id, parent, depth) = match sub {
        Some((m, p, d)) => (m, Some(p), d),
        None => (id.to_string(), None, 0),
    };
    let limits: Option<String> = c
        .prepare_cached("SELECT limits FROM workgroups WHERE main_id=?1")?
        .query_row([&main_id], |r| r.get(0))
        .optional()?;
    let Some(limits) = limits else { return Ok(None) };
    Ok(Some(Position { main_id, parent, depth, limits: parse_limits(&limits)? }))
}

/// The children of `parent` whose request is live.
pub fn live_children_in(c: &Connection, parent: &str) -> Result<u32, StoreError> {
    Ok(c.prepare_cached("SELECT COUNT(*) FROM subsessions WHERE parent_id=?1 AND status='live'")?
        .query_row([parent], |r| r.get(0))?)
}

/// What the workgroup of `main` has used: model steps and reported tokens.
pub fn usage_in(c: &Connection, main: &str) -> Result<(i64, i64), StoreError> {
    Ok(c.prepare_cached(
        "SELECT COALESCE(SUM(s.steps), 0),
                COALESCE(SUM((SELECT COALESCE(SUM(COALESCE(e.prompt_tokens, 0) + COALESCE(e.completion_tokens, 0)), 0)
                              FROM evidence e WHERE e.session_id = s.id)), 0)
         FROM sessions s
         WHERE s.id = ?1 OR s.id IN (SELECT session_id FROM subsessions WHERE main_id = ?1)",
    )?
    .query_row([main], |r| Ok((r.get(0)?, r.get(1)?)))?)
}

/// Why the workgroup of `main` may not spend more, if it may not.
pub fn over_budget_in(
    c: &Connection,
    main: &str,
    limits: &Limits,
) -> Result<Option<String>, StoreError> {
    if limits.max_steps.is_none() && limits.max_tokens.is_none() {
        return Ok(None);
    }
    let (steps, tokens) = usage_in(c, main)?;
    if let Some(max) = limits.max_steps
        && steps >= max
    {
        return Ok(Some(format!("the workgroup used its {max} model steps")));
    }
    if let Some(max) = limits.max_tokens
        && tokens >= max
    {
        return Ok(Some(format!("the workgroup used {tokens} of its {max} tokens")));
    }
    Ok(None)
}

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
fn deliver_in(
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
    let seq = super::turns::submit_event_in(c, to, text, event, kind == Kind::Request)?;
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
pub fn spawn_in(
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
    let meta = facts::load_meta(c, parent)?;
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
    let new = super::NewSession {
        id: Some(spawn.child.clone()),
        grants: spawn.grants.clone(),
        // A child reaches what its parent may reach on the network, no more.
        net: meta.net.clone(),
        tools: tools.clone(),
        policy: meta.policy.clone(),
        budget: meta.budget.clone(),
        model: meta.model.clone(),
        system_prompt: meta.system_prompt.clone(),
        guards: meta.guards.clone(),
        preprocess,
        user: meta.user.clone(),
        named_tools: false,
        owner: meta.owner.clone(),
        // The child runs the versions its workgroup pinned.
        pins: meta.tool_pins.clone(),
    };
    super::create_in(c, &spawn.child, &new)?;
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
pub fn child_in(c: &Connection, id: &str) -> Result<Option<ChildRow>, StoreError> {
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
pub fn send_in(
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
pub fn ask_in(
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
fn finish_in(
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
pub fn turn_ended_in(
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
                || facts::pending_inputs(c, id)? > 0
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
pub fn waiting_in(c: &Connection, id: &str) -> Result<(), StoreError> {
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

/// Every live session below `id` (children first, then theirs).
pub fn live_descendants_in(c: &Connection, id: &str) -> Result<Vec<String>, StoreError> {
    below_in(c, id, true)
}

/// Every session below `id`, live or done (children first, then theirs).
pub fn descendants_in(c: &Connection, id: &str) -> Result<Vec<String>, StoreError> {
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
pub fn stop_in(c: &Connection, id: &str, reason: Option<&str>) -> Result<Vec<String>, StoreError> {
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
        let meta = facts::load_meta(c, s)?;
        let under_way = meta.active_turn.is_some() || meta.state == RuntimeState::Running;
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
        if meta.state != RuntimeState::Interrupted
            && (live || (s == id && all.len() > 1) || facts::pending_inputs(c, s)? > 0)
        {
            let why = match reason {
                Some(r) => format!("stopped: {r}"),
                None => "interrupted by the user".to_string(),
            };
            facts::set_state(c, s, RuntimeState::Interrupted, Some(&why))?;
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
pub fn sessions_in(c: &Connection, main: &str) -> Result<Vec<Runnable>, StoreError> {
    let rows = c
        .prepare_cached(
            "SELECT s.id, s.state, s.active_turn IS NOT NULL, s.interrupt_requested,
                    (SELECT COUNT(*) FROM inbox i WHERE i.session_id = s.id AND i.consumed_at IS NULL),
                    (SELECT COUNT(*) FROM approvals a WHERE a.session_id = s.id AND a.status = 'pending'),
                    (SELECT COUNT(*) FROM inbox i JOIN workgroup_events e ON e.id = i.event_id
                     WHERE i.session_id = s.id AND i.consumed_at IS NULL AND e.kind != 'request')
             FROM sessions s
             WHERE s.id = ?1 OR s.id IN (SELECT session_id FROM subsessions WHERE main_id = ?1)
             ORDER BY s.created_at, s.id",
        )?
        .query_map([main], |r| {
            Ok((
                (r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get(2)?, r.get(3)?),
                (r.get(4)?, r.get(5)?, r.get(6)?),
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    rows.into_iter()
        .map(
            |(
                (id, state, active_turn, interrupt_requested),
                (pending, undecided, notifications),
            )| {
                Ok(Runnable {
                    id,
                    state: state.parse()?,
                    active_turn,
                    pending,
                    interrupt_requested,
                    undecided,
                    notifications,
                })
            },
        )
        .collect()
}

/// Live children whose deadline passed at `now`, with the deadline in seconds.
pub fn overdue_in(c: &Connection, main: &str, now: i64) -> Result<Vec<String>, StoreError> {
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
pub fn notices_due_in(
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
pub fn write_notices_in(
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
pub fn workgroup_in(c: &Connection, main: &str) -> Result<Option<Workgroup>, StoreError> {
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
pub fn mains_in(c: &Connection) -> Result<Vec<String>, StoreError> {
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
pub fn events_in(c: &Connection, main: &str) -> Result<Vec<EventRecord>, StoreError> {
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
