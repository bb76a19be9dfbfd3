//! The session's configuration: what it was created with and keeps — grants, network grants,
//! policy, budget, model, system prompt, loop guards, task-understanding settings, the user it
//! works for and who owns it. Written by the creation transaction ([`super::create_in`]),
//! and changed in two ways after: a model server that refuses a request names its context
//! window, which becomes the session's ([`learn_window_in`]); and a person moves the session
//! to another model server, model or window ([`set_model_in`]); read here.

use crate::sql::{Connection, OptionalExtension};
use serde::Serialize;

use crate::grant::DirId;
use crate::model::ModelConfig;
use crate::policy::Policy;
use crate::sandbox::{Access, Budget, Grant};
use crate::store::StoreError;

use super::events::ModelShown;
use super::facts::{no_session, parse};

/// A session's configuration (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionConfig {
    /// The session's settings for task understanding (`None`: off).
    pub preprocess: Option<crate::understand::PreprocessConfig>,
    /// The user the session works for: its long-term memory is theirs (`None`: a session
    /// created before users were; see [`user`](Self::user)).
    pub user: Option<String>,
    /// Who created the session over the HTTP API (`None`: a local front-end did).
    pub owner: Option<crate::caller::Owner>,
    pub policy: Policy,
    pub budget: Budget,
    pub model: ModelConfig,
    pub system_prompt: String,
    /// The session's loop guards (`None`: those of the harness that runs its turns).
    pub guards: Option<super::LoopGuards>,
    pub grants: Vec<Grant>,
    /// Where the session's tools may send HTTP requests, and the secrets bound there (fixed at
    /// creation, like `grants`).
    pub net: crate::sandbox::net::NetGrants,
}

impl SessionConfig {
    /// The user the session works for (the operating-system user for a session created
    /// before sessions had users).
    pub fn user(&self) -> String {
        self.user.clone().unwrap_or_else(crate::memory::default_user)
    }
}

const CONFIG: &str = "SELECT policy, budget, model, system_prompt, guards, \"user\", owner, net, preprocess
     FROM session_config WHERE session_id=?1";
const GRANTS: &str =
    "SELECT host, guest, access, dev, ino, within FROM session_grants WHERE session_id=?1 ORDER BY guest";

/// Sends the reads of [`config_in`] ahead (see [`Connection::prefetch`]).
pub(crate) fn prefetch_config_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    c.prefetch(CONFIG, [id])?;
    c.prefetch(GRANTS, [id])?;
    Ok(())
}

/// The configuration of session `id`.
pub(crate) fn config_in(c: &Connection, id: &str) -> Result<SessionConfig, StoreError> {
    let ((policy, budget, model, system), (guards, user, owner, net, preprocess)) = c
        .prepare_cached(CONFIG)?
        .query_row([id], |r| {
            Ok((
                (
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ),
                (
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, Option<String>>(5)?,
                    r.get::<_, Option<String>>(6)?,
                    r.get::<_, Option<String>>(7)?,
                    r.get::<_, Option<String>>(8)?,
                ),
            ))
        })
        .optional()?
        .ok_or_else(|| no_session(id))?;
    Ok(SessionConfig {
        preprocess: preprocess.map(|p| parse(&p, "task understanding settings")).transpose()?,
        user,
        owner: owner.map(|o| parse(&o, "session owner")).transpose()?,
        policy: parse(&policy, "policy")?,
        budget: parse(&budget, "budget")?,
        model: parse(&model, "model config")?,
        system_prompt: system,
        guards: guards.map(|g| parse(&g, "loop guards")).transpose()?,
        grants: grants_in(c, id)?,
        net: net.map(|n| parse(&n, "network grants")).transpose()?.unwrap_or_default(),
    })
}

/// Who owns session `id` (`None`: a session created on this machine); a session that does not
/// exist is an error. One indexed read: what a use case checks its caller against.
pub(crate) fn owner_in(
    c: &Connection,
    id: &str,
) -> Result<Option<crate::caller::Owner>, StoreError> {
    let owner: Option<String> = c
        .prepare_cached("SELECT owner FROM session_config WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))
        .optional()?
        .ok_or_else(|| no_session(id))?;
    owner.map(|o| parse(&o, "session owner")).transpose()
}

/// Makes `window` (tokens) the context window of session `id`'s model, when the session has
/// none or a larger one: a server that refused a request as too long and named its context
/// is believed over a guess, so every later request is sized to it — not only the summary
/// call that followed the refusal. Returns whether the window changed.
pub(crate) fn learn_window_in(c: &Connection, id: &str, window: u64) -> Result<bool, StoreError> {
    learn_in(c, id, |model| {
        if model.context_window.is_some_and(|w| w <= window) || window == 0 {
            return false;
        }
        model.context_window = Some(window);
        true
    })
}

/// Makes session `id` send one system message from now on (its server refused a request
/// that held a second one). Returns whether the setting changed.
pub(crate) fn learn_one_system_message_in(c: &Connection, id: &str) -> Result<bool, StoreError> {
    learn_in(c, id, |model| std::mem::replace(&mut model.notes_message, false))
}

/// Changes session `id`'s model settings with `learn`, which says whether it changed them.
fn learn_in(
    c: &Connection,
    id: &str,
    learn: impl FnOnce(&mut ModelConfig) -> bool,
) -> Result<bool, StoreError> {
    let model: String = c
        .prepare_cached("SELECT model FROM session_config WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))
        .optional()?
        .ok_or_else(|| no_session(id))?;
    let mut model: ModelConfig = parse(&model, "model config")?;
    if !learn(&mut model) {
        return Ok(false);
    }
    let text = serde_json::to_string(&model)
        .map_err(|e| StoreError::Corrupt(format!("the model config of `{id}`: {e}")))?;
    c.prepare_cached("UPDATE session_config SET model=?2 WHERE session_id=?1")?
        .execute(crate::sql::params![id, text])?;
    Ok(true)
}

/// A change to a session's model: each part given replaces the session's (`None`: kept).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelChange {
    pub base_url: Option<String>,
    pub model: Option<String>,
    pub context_window: Option<u64>,
}

impl ModelChange {
    pub fn is_empty(&self) -> bool {
        self.base_url.is_none() && self.model.is_none() && self.context_window.is_none()
    }
}

/// Moves session `id` to the model `change` names, and records it (a `model_changed` event
/// naming `by`): the session's next request goes there. Refused while the session runs (a
/// turn's requests keep one model) and for settings that do not validate. Returns the model
/// before and after; no event when nothing changed.
pub(crate) fn set_model_in(
    c: &Connection,
    id: &str,
    change: &ModelChange,
    by: &str,
) -> Result<(ModelShown, ModelShown), StoreError> {
    let (state, model): (String, String) = c
        .prepare_cached(
            "SELECT s.state, c.model FROM sessions s JOIN session_config c ON c.session_id = s.id
             WHERE s.id=?1",
        )?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
        .ok_or_else(|| no_session(id))?;
    if state == super::state::RuntimeState::Running.as_str() {
        return Err(StoreError::Conflict(format!(
            "session `{}` is running a turn; change its model when the turn ends (or interrupt it)",
            id.escape_debug()
        )));
    }
    let mut model: ModelConfig = parse(&model, "model config")?;
    let before = ModelShown::of(&model);
    if let Some(url) = &change.base_url {
        model.base_url = url.trim_end_matches('/').to_string();
    }
    if let Some(name) = &change.model {
        if name.trim().is_empty() {
            return Err(StoreError::Input("the model name is empty".into()));
        }
        model.model = name.clone();
    }
    if let Some(window) = change.context_window {
        model.context_window = Some(window);
    }
    model.validate().map_err(|e| StoreError::Input(e.to_string()))?;
    let after = ModelShown::of(&model);
    if after == before {
        return Ok((before, after));
    }
    let text = serde_json::to_string(&model)
        .map_err(|e| StoreError::Corrupt(format!("the model config of `{id}`: {e}")))?;
    c.prepare_cached("UPDATE session_config SET model=?2 WHERE session_id=?1")?
        .execute(crate::sql::params![id, text])?;
    let event = super::events::SessionEvent::ModelChanged {
        from: before.clone(),
        to: after.clone(),
        by: by.to_string(),
    };
    super::events::append(c, id, &event)?;
    Ok((before, after))
}

/// Changes session `id`'s policy by `change`, recorded as `by`'s (a `policy_changed` event),
/// when it changes anything. Allowed while a turn runs: the policy is read at each call. Returns the
/// policy after.
pub(crate) fn change_policy_in(
    c: &Connection,
    id: &str,
    change: &crate::policy::PolicyChange,
    by: &str,
) -> Result<Policy, StoreError> {
    let policy: String = c
        .prepare_cached("SELECT policy FROM session_config WHERE session_id=?1")?
        .query_row([id], |r| r.get(0))
        .optional()?
        .ok_or_else(|| no_session(id))?;
    let mut policy: Policy = parse(&policy, "policy")?;
    if !policy.apply(change) {
        return Ok(policy);
    }
    let text = serde_json::to_string(&policy)
        .map_err(|e| StoreError::Corrupt(format!("the policy of `{id}`: {e}")))?;
    c.prepare_cached("UPDATE session_config SET policy=?2 WHERE session_id=?1")?
        .execute(crate::sql::params![id, text])?;
    let event = super::events::SessionEvent::PolicyChanged {
        change: change.to_string(),
        policy: policy.summary(),
        by: by.to_string(),
    };
    super::events::append(c, id, &event)?;
    Ok(policy)
}

/// Characters of a session's title, at most.
pub const MAX_TITLE_CHARS: usize = 200;

/// Gives session `id` the title `title` (`None`: none, so lists show its goal). A title is one
/// line of at most [`MAX_TITLE_CHARS`] characters, without control characters.
pub(crate) fn set_title_in(c: &Connection, id: &str, title: Option<&str>) -> Result<(), StoreError> {
    let title = title.map(str::trim).filter(|t| !t.is_empty());
    if let Some(t) = title {
        if t.chars().count() > MAX_TITLE_CHARS {
            return Err(StoreError::Input(format!(
                "a title is at most {MAX_TITLE_CHARS} characters, not {}",
                t.chars().count()
            )));
        }
        if t.chars().any(char::is_control) {
            return Err(StoreError::Input(
                "a title is one line without control characters".into(),
            ));
        }
    }
    let changed = c
        .prepare_cached("UPDATE session_config SET title=?2 WHERE session_id=?1")?
        .execute(crate::sql::params![id, title])?;
    if changed == 0 {
        return Err(no_session(id));
    }
    Ok(())
}

/// The directories granted to session `id`, by guest path.
fn grants_in(c: &Connection, id: &str) -> Result<Vec<Grant>, StoreError> {
    let mut stmt = c.prepare_cached(GRANTS)?;
    stmt.query_map([id], |r| {
        let (dev, ino) = (r.get::<_, Option<i64>>(3)?, r.get::<_, Option<i64>>(4)?);
        Ok((
            Grant {
                host: r.get::<_, String>(0)?.into(),
                guest: r.get(1)?,
                access: if r.get::<_, String>(2)? == "rw" { Access::Rw } else { Access::Ro },
                id: dev.zip(ino).map(|(dev, ino)| DirId { dev: dev as u64, ino: ino as u64 }),
                within: None,
            },
            r.get::<_, Option<String>>(5)?,
        ))
    })?
    .collect::<Result<Vec<_>, _>>()?
    .into_iter()
    .map(|(mut g, within)| {
        g.within = within.map(|w| parse(&w, "a grant's directory")).transpose()?;
        Ok(g)
    })
    .collect()
}

const PREPROCESS: &str = "SELECT preprocess IS NOT NULL FROM session_config WHERE session_id=?1";

/// Sends the read of [`preprocess_on`] ahead (see [`Connection::prefetch`]).
pub(crate) fn prefetch_preprocess_in(c: &Connection, id: &str) -> Result<(), StoreError> {
    Ok(c.prefetch(PREPROCESS, [id])?)
}

/// Whether session `id` has task understanding on (false for a session that does not exist).
pub fn preprocess_on(c: &Connection, id: &str) -> Result<bool, StoreError> {
    Ok(c.prepare_cached(PREPROCESS)?
        .query_row([id], |r| r.get(0))
        .optional()?
        .unwrap_or(false))
}
