//! The use cases of what sessions can use: long-term memory, a session's loaded capabilities,
//! and its compaction.

use super::*;
use crate::compaction::Compaction;
use crate::ids::SessionId;
use crate::preparation::Preparation;

/// A session's capabilities: each loaded tool and skill with how it arrived, and the
/// orchestration of each turn that prepared capabilities.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionCapabilities {
    pub capabilities: Vec<crate::preparation::capabilities::Capability>,
    pub orchestrations: Vec<crate::preparation::orchestration::Orchestration>,
}

/// Long-term memory and a session's capabilities.
impl Harness {
    /// The memories of `user` (of every user when `None`), oldest first. A user named without
    /// a kind is a local one (`alice` is `local:alice`; `token:alice` names an API token's).
    pub async fn memories(
        &self,
        caller: &Caller,
        user: Option<&str>,
    ) -> Result<Vec<crate::memory::Memory>, ApiError> {
        caller.require_admin("reading long-term memory")?;
        let u = user.map(str::to_string);
        Ok(self.db.read(move |c| crate::memory::list_in(c, u.as_deref())).await?)
    }

    /// Remembers `text` (with `tags`) for `user`; returns its id.
    pub async fn add_memory(
        &self,
        caller: &Caller,
        user: &str,
        text: &str,
        tags: &[String],
    ) -> Result<i64, ApiError> {
        caller.require_admin("writing long-term memory")?;
        let (u, t, g) = (user.to_string(), text.to_string(), tags.to_vec());
        Ok(self.db.run(move |c| crate::memory::add_in(c, &u, &t, &g, None)).await?)
    }

    /// Removes memory `id` of `user`.
    pub async fn remove_memory(
        &self,
        caller: &Caller,
        user: &str,
        id: i64,
    ) -> Result<crate::memory::Memory, ApiError> {
        caller.require_admin("removing a memory")?;
        let u = user.to_string();
        Ok(self.db.run(move |c| crate::memory::remove_in(c, &u, id)).await?)
    }

    /// Session `id`'s capabilities, how each arrived, and its orchestrations.
    pub async fn capabilities(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<SessionCapabilities, ApiError> {
        let id = &self.checked(caller, id).await?;
        let (capabilities, orchestrations) = Preparation::of(&self.engine).capabilities(id).await?;
        Ok(SessionCapabilities { capabilities, orchestrations })
    }

    /// Unloads a tool or skill from session `id` (the explicit removal path: nothing else
    /// removes a capability).
    pub async fn unload(
        &self,
        caller: &Caller,
        id: &str,
        kind: crate::preparation::capabilities::Kind,
        name: &str,
    ) -> Result<(), ApiError> {
        let id = &SessionId::from(id);
        caller.require_admin("unloading a capability")?;
        Ok(Preparation::of(&self.engine).unload(id, kind, name).await?)
    }

    /// Compacts session `id` now (see [`Brain::compact`](crate::brain::Brain::compact)); inputs
    /// that arrived meanwhile are run afterwards.
    pub async fn compact(
        &self,
        caller: &Caller,
        id: &str,
        cancel: &CancelToken,
        events: &Events,
    ) -> Result<crate::agent::compact::Compaction, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(self.brain.compact(id, cancel, events).await?)
    }

    /// Session `id`'s checkpoints, oldest first.
    pub async fn checkpoints(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Vec<crate::compaction::CheckpointRecord>, ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Compaction::of(&self.engine).checkpoints(id).await?)
    }

    /// The exact request of checkpoint `n`'s summary call (the last checkpoint's if `None`).
    pub async fn compaction_evidence(
        &self,
        caller: &Caller,
        id: &str,
        n: Option<i64>,
    ) -> Result<(i64, Vec<u8>), ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Compaction::of(&self.engine).evidence(id, n).await?)
    }

    /// The last answer of checkpoint `n`'s summary call (the last checkpoint's if `None`), as
    /// the model wrote it: a refused one too.
    pub async fn compaction_reply(
        &self,
        caller: &Caller,
        id: &str,
        n: Option<i64>,
    ) -> Result<(i64, String), ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Compaction::of(&self.engine).reply(id, n).await?)
    }

    /// The exact request of turn `turn`'s orchestration call (the last one made if `None`).
    pub async fn orchestration_evidence(
        &self,
        caller: &Caller,
        id: &str,
        turn: Option<i64>,
    ) -> Result<(i64, Vec<u8>), ApiError> {
        let id = &self.checked(caller, id).await?;
        Ok(Preparation::of(&self.engine).orchestration_evidence(id, turn).await?)
    }
}
