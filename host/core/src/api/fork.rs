//! The use case of forking a session: a new session whose history is another's up to a step,
//! to try another model, instruction or tool version from the same point. The original is
//! only read.

use super::*;
use crate::session::{ForkSettings, ModelChange, ModelShown};

/// How [`Harness::fork`] makes the fork.
#[derive(Debug, Clone, Default)]
pub struct ForkOptions {
    /// The fork's id (`None`: a new one).
    pub id: Option<String>,
    /// Another model (each part given replaces the original's).
    pub model: ModelChange,
    /// Every grant read-only.
    pub read_only: bool,
    /// Grants the fork does not get, by guest path.
    pub drop_grants: Vec<String>,
}

/// What [`Harness::fork`] made.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ForkReport {
    /// The fork's id.
    pub session_id: String,
    /// The session it was forked from, and at which step.
    pub from: String,
    pub at: i64,
    /// The messages of its history (the original's up to the step), and the turn it ends in.
    pub messages: i64,
    pub turn: i64,
    /// The fork's model.
    pub model: ModelShown,
    /// The fork's grants.
    pub grants: Vec<Grant>,
}

impl Harness {
    /// Makes a new session whose history is session `id`'s up to step `at` (0: before its
    /// first request): the same settings, grants (narrowed as `opts` asks), goals, plan,
    /// loaded capabilities, journal and request evidence up to the step, its origin recorded
    /// (a `forked` event). The files its grants reach are shared, not copied. Whoever may see
    /// the session may fork it (the fork works for the same user and owner); another model
    /// server needs an admin, as changing a session's does. A session of a workgroup is not
    /// forked.
    pub async fn fork(
        &self,
        caller: &Caller,
        id: &str,
        at: i64,
        opts: ForkOptions,
    ) -> Result<ForkReport, ApiError> {
        if opts.model.base_url.is_some() {
            caller.require_admin("forking a session to another model server")?;
        }
        let sid = self.checked(caller, id).await?;
        let cut = Assembly::of(&self.engine).cut_after(&sid, at).await?;
        let fork = opts.id.unwrap_or_else(crate::session::new_id);
        let settings = ForkSettings {
            id: fork.clone(),
            model: opts.model,
            read_only: opts.read_only,
            drop_grants: opts.drop_grants,
            by: super::callers::actor(caller),
        };
        self.engine.fork(&sid, cut, settings).await?;
        let config = self.engine.config(&SessionId::from(fork.as_str())).await?;
        Ok(ForkReport {
            session_id: fork,
            from: sid.to_string(),
            at,
            messages: cut.seq,
            turn: cut.turn,
            model: ModelShown::of(&config.model),
            grants: config.grants,
        })
    }
}
