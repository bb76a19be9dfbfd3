//! Creating a session: what a new session is made of ([`NewSession`]), the checks of what it
//! names, and the one transaction that stores it with its configuration, its tools' pins and
//! how each tool arrived.

use crate::ids::SessionId;
use crate::sql::{Connection, params};
use std::sync::Arc;

use super::{LoopGuards, SessionEngine};
use crate::model::ModelConfig;
use crate::policy::Policy;
use crate::sandbox::{Budget, Grant};
use crate::store::{StoreError, json, now_ms};

/// What a new session starts with.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// Chosen id (letters, digits, `-`, `_`), or a generated one.
    pub id: Option<String>,
    pub grants: Vec<Grant>,
    /// Where the session's tools may send HTTP requests, and the secrets bound there.
    pub net: crate::sandbox::net::NetGrants,
    /// Tools loaded into the session (the only ones its model sees and may call).
    pub tools: Vec<String>,
    pub policy: Policy,
    pub budget: Budget,
    pub model: ModelConfig,
    pub system_prompt: String,
    /// The session's loop guards; `None` uses those of the harness that runs each turn.
    pub guards: Option<LoopGuards>,
    /// Settings of the task-understanding call; `None` turns it off (`--no-preprocess`).
    pub preprocess: Option<crate::understand::PreprocessConfig>,
    /// The user the session works for (its long-term memory is theirs); `None`: the
    /// operating-system user.
    pub user: Option<String>,
    /// Whether `tools` were named (`--tools`) rather than every installed tool: recorded as
    /// how each arrived.
    pub named_tools: bool,
    /// Who created the session over the HTTP API (`None`: a local front-end did).
    pub owner: Option<crate::caller::Owner>,
    /// The versions its tools run (tool → component digest), stored with the session in its
    /// creation transaction; a pin for a tool not in `tools` is dropped.
    pub pins: crate::tools::ToolPins,
}

/// `id` if it is a valid session id (letters, digits, `-` and `_`, at most 64).
pub(super) fn valid_id(id: &str) -> Result<&str, StoreError> {
    if !id.is_empty()
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Ok(id);
    }
    Err(StoreError::Input(format!(
        "session id `{}` is not valid: use letters, digits, `-` and `_` (at most 64)",
        id.escape_debug()
    )))
}

/// Checks what `new` names (its user, policy patterns, chosen id) and returns its id: the
/// chosen one, or a new random one — so that sessions created at once (by concurrent API
/// requests on one worker thread, or parallel spawns) never collide.
pub(crate) fn checked_id(new: &NewSession) -> Result<String, StoreError> {
    if let Some(u) = &new.user
        && !crate::memory::valid_principal(&crate::memory::typed(u, crate::memory::Kind::Local))
    {
        return Err(StoreError::Input(format!(
            "the user name `{u}` is not valid: use {}",
            crate::memory::USER_NAME_RULE
        )));
    }
    new.policy.check_patterns().map_err(StoreError::Input)?;
    match &new.id {
        Some(id) => Ok(valid_id(id)?.to_string()),
        None => Ok(new_id()),
    }
}

/// Stores session `id` as `new` describes it, inside a caller's transaction (a sub-session is
/// created in the transaction that records its parent's spawn). Refuses an id in use.
pub(crate) fn create_in(c: &Connection, id: &str, new: &NewSession) -> Result<(), StoreError> {
    let pins: crate::tools::ToolPins = new
        .pins
        .iter()
        .filter(|(t, _)| new.tools.contains(t))
        .map(|(t, d)| (t.clone(), d.clone()))
        .collect();
    let exists: bool =
        c.query_row("SELECT EXISTS(SELECT 1 FROM sessions WHERE id=?1)", [id], |r| r.get(0))?;
    if exists {
        return Err(StoreError::Conflict(format!("session `{id}` already exists")));
    }
    c.execute(
        "INSERT INTO sessions (id, created_at, state, meta_version) VALUES (?1, ?2, 'idle', 1)",
        params![id, now_ms()],
    )?;
    c.execute(
        "INSERT INTO session_config (session_id, loaded_tools, policy, budget, model, system_prompt, guards, preprocess, \"user\", owner, net, tool_pins)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            id,
            json(&new.tools)?,
            json(&new.policy)?,
            json(&new.budget)?,
            json(&new.model)?,
            new.system_prompt,
            new.guards.as_ref().map(json).transpose()?,
            new.preprocess.as_ref().map(json).transpose()?,
            // Typed: a local user unless the creator typed it (`token:NAME` over the API).
            crate::memory::typed(
                &new.user.clone().unwrap_or_else(crate::memory::default_user),
                crate::memory::Kind::Local
            ),
            new.owner.as_ref().map(json).transpose()?,
            (!new.net.is_empty()).then(|| json(&new.net)).transpose()?,
            json(&pins)?
        ],
    )?;
    for g in &new.grants {
        let within = g
            .within
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| StoreError::Task(format!("cannot store a grant: {e}")))?;
        c.execute(
            "INSERT INTO session_grants (session_id, host, guest, access, dev, ino, within)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                id,
                g.host.display().to_string(),
                g.guest,
                g.access.to_string(),
                g.id.map(|d| d.dev as i64),
                g.id.map(|d| d.ino as i64),
                within
            ],
        )?;
    }
    (super::reactions::get().on_create)(c, id, new)
}

/// A new session id: `s-` and 12 random hex digits.
pub fn new_id() -> String {
    let mut seed = [0u8; 16];
    if getrandom::fill(&mut seed).is_err() {
        let fallback = format!("{}-{:?}", now_ms(), std::thread::current().id());
        seed.copy_from_slice(&blake3::hash(fallback.as_bytes()).as_bytes()[..16]);
    }
    format!("s-{}", &hex::encode(seed)[..12])
}

impl SessionEngine {
    /// Creates a session with its grants, tools, policy and model.
    pub async fn create(&self, new: NewSession) -> Result<String, StoreError> {
        let id = checked_id(&new)?;
        let new = Arc::new(new);
        let id2 = id.clone();
        self.db.run(move |c| create_in(c, &id2, &new)).await?;
        Ok(id)
    }

    /// Whether a session exists.
    pub async fn exists(&self, id: &SessionId) -> Result<bool, StoreError> {
        let id = id.clone();
        self.db
            .read_inline(move |c| {
                Ok(c.prepare_cached("SELECT EXISTS(SELECT 1 FROM sessions WHERE id=?1)")?
                    .query_row([&id], |r| r.get(0))?)
            })
            .await
    }
}
